"""The y-protocols messages, one per binary WebSocket frame, and crdtstore's extension. No I/O.

The wire format, frame by frame, is drawn next to :class:`MessageType`; the primitives are
lib0's (:mod:`crdtstore.codec`).

Type 100 is crdtstore's extension: requests the CRDT cannot answer (guarded writes, leases,
claims, run metadata, "has the hub journaled everything I sent"), each answered by exactly
one response with the same ``id``, carrying a result or an error with crdtstore's stable error
codes. y-websocket has handlers for types 0-3 only, so the hub sends type 100 only in answer
to a type 100 request (or, as a :class:`Push`, to a connection that chose the ``crdtstore``
subprotocol): a Yjs client that never asks never sees one. The hub processes a connection's
frames in order, so a response also acknowledges every update the client sent before it.

Decoding is strict: one message per frame, no trailing bytes, known types only, JSON payloads
validated by the pydantic models below. Every failure is a :class:`~sync.ProtocolError` (the
codec's :class:`~crdtstore.codec.CodecError` is translated here, at the protocol boundary).
``decode(encode(m)) == m`` for every message ``m``. The binary messages are frozen
dataclasses rather than pydantic models: they sit on the hot path of every update and hold
only bytes or a string, which ``encode`` checks.

**The append frame** (types 100/3 and 100/4) is ``journal.append`` without JSON: the hot write
of a ``ws://`` client, whose update bytes would otherwise travel base64 in a JSON request and
be validated twice. :class:`Append` is a :class:`Request` (op ``journal.append``, the same id
space, handled in order like any request) carrying its entries as raw bytes; its success is
answered by :class:`Appended` (a :class:`Response` whose ``result`` is the journal
positions), its failure by the ordinary JSON error response, with the same codes as the JSON
form. The JSON form stays: a client sends the binary one only to a hub whose ``whoami`` lists
``journal.append`` in ``frames`` (see ``sync._client``). A malformed append frame is refused
as every other frame is (a :class:`~sync.ProtocolError`, close 4400)::

    append(id, flags, entries) = varUint(100) • varUint(3) • varUint(id) • varUint(flags) •
                                 varUint(n) • n * (varUint(client_id) • varString(call) •
                                 varUint8Array(update))
    appended(id, seqs)         = varUint(100) • varUint(4) • varUint(id) • varUint(n) •
                                 n * varUint(seq)

``flags`` bit 0 is ``durable``; the other bits must be 0. ``call`` is ``""`` for none.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Annotated, Any, Final, NamedTuple

import pydantic_core
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from crdtstore import CrdtStoreError
from crdtstore.codec import MAX_SAFE_INTEGER, CodecError, Decoder, Encoder, read_var_uint_at
from crdtstore.codec import decode_state_vector as _decode_state_vector

from ._errors import MessageTooLarge, ProtocolError

__all__ = [
    "APPEND_OP",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "EXTENSION_MESSAGE_TYPE",
    "Append",
    "AppendEntry",
    "Appended",
    "Awareness",
    "AwarenessEntry",
    "ErrorInfo",
    "ExtensionType",
    "Message",
    "MessageType",
    "PermissionDenied",
    "Push",
    "QueryAwareness",
    "Request",
    "Response",
    "SyncStep1",
    "SyncStep2",
    "SyncType",
    "Update",
    "decode",
    "decode_awareness_update",
    "decode_state_vector",
    "encode",
    "encode_awareness_update",
]

DEFAULT_MAX_MESSAGE_SIZE: Final = 16 * 1024 * 1024
EXTENSION_MESSAGE_TYPE: Final = 100
APPEND_OP: Final = "journal.append"  # the op an append frame performs
_DURABLE: Final = 1  # the append frame's flag bits


# The wire format (``•`` concatenates; the primitives are lib0's, :mod:`crdtstore.codec`)::
#
#     syncStep1(sv)          = varUint(0) • varUint(0) • varUint8Array(state vector)
#     syncStep2(update)      = varUint(0) • varUint(1) • varUint8Array(update)
#     update(update)         = varUint(0) • varUint(2) • varUint8Array(update)
#     awareness(payload)     = varUint(1) • varUint8Array(awareness update)
#     permissionDenied(why)  = varUint(2) • varUint(0) • varString(why)
#     queryAwareness         = varUint(3)
#     request(json)          = varUint(100) • varUint(0) • varString(JSON of Request)
#     response(json)         = varUint(100) • varUint(1) • varString(JSON of Response)
#     push(json)             = varUint(100) • varUint(2) • varString(JSON of Push)
#     append(...), appended(...): varUint(100) • varUint(3 | 4) • ..., in the module docstring
#
# An awareness update is ``varUint(n) • n * (varUint(client) • varUint(clock) •
# varString(JSON state))``; a removed client's state is ``null``.
class MessageType(IntEnum):
    """The first varUint of a frame."""

    SYNC = 0
    AWARENESS = 1
    AUTH = 2
    QUERY_AWARENESS = 3
    CRDTSTORE = EXTENSION_MESSAGE_TYPE


class SyncType(IntEnum):
    """The second varUint of a sync frame."""

    STEP1 = 0
    STEP2 = 1
    UPDATE = 2


class AuthType(IntEnum):
    """The second varUint of an auth frame (y-protocols defines one)."""

    PERMISSION_DENIED = 0


class ExtensionType(IntEnum):
    """The second varUint of a crdtstore extension frame."""

    REQUEST = 0
    RESPONSE = 1
    PUSH = 2
    APPEND = 3
    APPENDED = 4


# -- binary messages ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SyncStep1:
    """Asks for what the sender misses, given its state vector. Answered by :class:`SyncStep2`."""

    state_vector: bytes


@dataclass(frozen=True, slots=True)
class SyncStep2:
    """The answer to :class:`SyncStep1`: the update the asker misses (may carry offline edits)."""

    update: bytes


@dataclass(frozen=True, slots=True)
class Update:
    """An incremental document update (v1 encoding)."""

    update: bytes


@dataclass(frozen=True, slots=True)
class Awareness:
    """An awareness update (presence); ``payload`` is kept as bytes so a hub relays it as is.

    See :func:`decode_awareness_update` for its entries.
    """

    payload: bytes


@dataclass(frozen=True, slots=True)
class PermissionDenied:
    """y-protocols' auth message: the peer refused what was sent (e.g. a read-only write)."""

    reason: str


@dataclass(frozen=True, slots=True)
class QueryAwareness:
    """Asks "send me every awareness state you know". Answered by :class:`Awareness`."""


@dataclass(frozen=True, slots=True)
class AwarenessEntry:
    """One client's entry in an awareness update; ``state`` is its raw JSON (``"null"``
    when the client is gone)."""

    client_id: int
    clock: int
    state: str

    @property
    def removed(self) -> bool:
        return self.state == "null"


# -- extension messages (JSON) --------------------------------------------------------------

_MODEL_CONFIG = ConfigDict(frozen=True, strict=True, extra="forbid", allow_inf_nan=False)

RequestId = (
    Annotated[StrictInt, Field(ge=0, le=MAX_SAFE_INTEGER)]
    | Annotated[StrictStr, Field(min_length=1, max_length=128)]
)
"""A request id: a safe non-negative integer or a short string, chosen by the client."""

OP_PATTERN: Final = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$"
ERROR_CODE_PATTERN: Final = r"^[A-Z][A-Z0-9_]*$"


class Request(BaseModel):
    """A request to the hub: ``op`` names what to do (``"lease.acquire"``, ``"put_guarded"``,
    ``"flush"``, ...), ``params`` its JSON arguments. The set of ops is the hub's."""

    model_config = _MODEL_CONFIG

    id: RequestId
    op: Annotated[str, Field(max_length=64, pattern=OP_PATTERN)]
    params: dict[str, JsonValue] = Field(default_factory=dict)


class ErrorInfo(BaseModel):
    """A failed request's error: crdtstore's stable ``code``, a message, and the error's
    fields (``current_version``, ``holder``, ...) as extra JSON keys (see
    ``CrdtStoreError.to_dict``)."""

    model_config = ConfigDict(frozen=True, strict=True, extra="allow", allow_inf_nan=False)
    __pydantic_extra__: dict[str, JsonValue] = Field(init=False)

    code: Annotated[str, Field(max_length=64, pattern=ERROR_CODE_PATTERN)]
    message: Annotated[str, Field(max_length=4096)]

    @classmethod
    def from_exception(cls, exc: CrdtStoreError) -> ErrorInfo:
        """The error info of a crdtstore error (its fields that are JSON, else code and message)."""
        data = exc.to_dict()
        data["message"] = str(data.get("message", ""))[:4096]
        try:
            return cls.model_validate(data)
        except ValidationError:
            return cls(code=exc.code, message=str(data["message"]))

    @property
    def details(self) -> dict[str, JsonValue]:
        """The fields besides ``code`` and ``message``."""
        return dict(self.__pydantic_extra__ or {})


class Response(BaseModel):
    """The answer to the request with the same ``id``: a ``result`` or an ``error``, not both.

    On the wire a success is ``{"id": .., "result": ..}`` and a failure
    ``{"id": .., "error": {"code": .., "message": .., ...}}``.
    """

    model_config = _MODEL_CONFIG

    id: RequestId
    result: JsonValue = None
    error: ErrorInfo | None = None

    @model_validator(mode="before")
    @classmethod
    def _result_xor_error(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("error") is not None and "result" in data:
            raise ValueError("a response carries a result or an error, not both")
        return data

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def success(cls, request_id: int | str, result: JsonValue = None) -> Response:
        return cls(id=request_id, result=result)

    @classmethod
    def failure(cls, request_id: int | str, exc: CrdtStoreError | ErrorInfo) -> Response:
        info = exc if isinstance(exc, ErrorInfo) else ErrorInfo.from_exception(exc)
        return cls(id=request_id, error=info)


class Push(BaseModel):
    """An unasked notice from the hub to a crdtstore client: ``push`` says what (``head``:
    the run's journal head moved to ``seq``; ``leases``: the tenant's leases changed).

    A head push may carry ``rows``: the newest journal entries up to ``seq``, contiguous,
    each as ``journal.read`` gives it (see ``sync._ops_journal``); left out of the JSON when
    absent."""

    model_config = _MODEL_CONFIG

    push: Annotated[str, Field(max_length=64, pattern=OP_PATTERN)]
    seq: Annotated[StrictInt, Field(ge=0, le=MAX_SAFE_INTEGER)] = 0
    rows: list[JsonValue] | None = Field(default=None, exclude_if=lambda v: v is None)


class AppendEntry(NamedTuple):
    """One entry of an :class:`Append`: the update, the writer's client id and its tool-call
    id (``""``: none)."""

    update: bytes
    client_id: int
    call: str = ""


_new = object.__new__
_set = object.__setattr__


class Append(Request):
    """``journal.append`` as a binary frame (see the module docstring): ``entries`` and
    ``durable`` instead of JSON ``params``. Build it with :meth:`of` (no validation: ``encode``
    checks every field)."""

    entries: tuple[AppendEntry, ...] = ()
    durable: bool = True

    @classmethod
    def of(cls, request_id: int, entries: tuple[AppendEntry, ...], durable: bool) -> Append:
        # what model_construct does, without its per-field loop: on the path of every update
        m = _new(cls)
        _set(m, "__dict__", {"id": request_id, "op": APPEND_OP, "params": {},
                             "entries": entries, "durable": durable})  # fmt: skip
        _set(m, "__pydantic_fields_set__", _APPEND_FIELDS)
        _set(m, "__pydantic_extra__", None)
        _set(m, "__pydantic_private__", None)
        return m


class Appended(Response):
    """The success of an :class:`Append`: ``result`` is the entries' journal positions."""

    @classmethod
    def of(cls, request_id: int | str, seqs: list[int]) -> Appended:
        m = _new(cls)
        _set(m, "__dict__", {"id": request_id, "result": seqs, "error": None})
        _set(m, "__pydantic_fields_set__", _APPENDED_FIELDS)
        _set(m, "__pydantic_extra__", None)
        _set(m, "__pydantic_private__", None)
        return m


_APPEND_FIELDS: Final = frozenset(Append.model_fields)
_APPENDED_FIELDS: Final = frozenset({"id", "result"})


Message = (
    SyncStep1
    | SyncStep2
    | Update
    | Awareness
    | PermissionDenied
    | QueryAwareness
    | Request
    | Response
    | Push
    | Append
    | Appended
)
"""Every message a frame can hold."""


# -- encoding -------------------------------------------------------------------------------


def _dump_json(model: BaseModel) -> str:
    if isinstance(model, Response):
        exclude = {"result"} if model.error is not None else {"error"}
        return model.model_dump_json(exclude=exclude)
    return model.model_dump_json()


def encode(message: Message) -> bytes:
    """The frame that carries ``message``.

    Raises:
        ProtocolError: a field cannot be encoded (not bytes, a lone surrogate, ...).
    """
    if type(message) is Append:
        return _encode_append(message)
    if type(message) is Appended:
        return _encode_appended(message)
    try:
        enc = Encoder()
        if isinstance(message, Update):
            enc.write_var_uint(MessageType.SYNC)
            enc.write_var_uint(SyncType.UPDATE)
            enc.write_var_uint8array(message.update)
        elif isinstance(message, SyncStep1):
            enc.write_var_uint(MessageType.SYNC)
            enc.write_var_uint(SyncType.STEP1)
            enc.write_var_uint8array(message.state_vector)
        elif isinstance(message, SyncStep2):
            enc.write_var_uint(MessageType.SYNC)
            enc.write_var_uint(SyncType.STEP2)
            enc.write_var_uint8array(message.update)
        elif isinstance(message, Awareness):
            enc.write_var_uint(MessageType.AWARENESS)
            enc.write_var_uint8array(message.payload)
        elif isinstance(message, PermissionDenied):
            enc.write_var_uint(MessageType.AUTH)
            enc.write_var_uint(AuthType.PERMISSION_DENIED)
            enc.write_var_string(message.reason)
        elif isinstance(message, QueryAwareness):
            enc.write_var_uint(MessageType.QUERY_AWARENESS)
        elif isinstance(message, (Request, Response, Push)):
            enc.write_var_uint(MessageType.CRDTSTORE)
            kind = (
                ExtensionType.REQUEST
                if isinstance(message, Request)
                else ExtensionType.RESPONSE
                if isinstance(message, Response)
                else ExtensionType.PUSH
            )
            enc.write_var_uint(kind)
            try:
                text = _dump_json(message)
            except pydantic_core.PydanticSerializationError as exc:
                raise ProtocolError(f"cannot encode {type(message).__name__}: {exc}") from None
            enc.write_var_string(text)
        else:
            raise ProtocolError(f"not a message: {type(message).__name__}")
        return enc.to_bytes()
    except CodecError as exc:
        raise ProtocolError(exc.reason) from None


def _var_uint(buf: bytearray, value: object) -> None:
    if type(value) is not int or not 0 <= value <= MAX_SAFE_INTEGER:
        raise ProtocolError(f"varUint out of range: {value!r}")
    while value > 0x7F:
        buf.append(0x80 | (value & 0x7F))
        value >>= 7
    buf.append(value)


def _encode_append(message: Append) -> bytes:
    if type(message.durable) is not bool or message.op != APPEND_OP or message.params:
        raise ProtocolError(f"an append frame is {APPEND_OP} with a bool durable, no params")
    entries = message.entries
    buf = bytearray(b"\x64\x03")  # varUint(100) • varUint(APPEND)
    _var_uint(buf, message.id)
    buf.append(_DURABLE if message.durable is True else 0)
    _var_uint(buf, len(entries))
    for entry in entries:
        if not isinstance(entry, tuple) or len(entry) != 3:
            raise ProtocolError(f"not an append entry: {type(entry).__name__}")
        update, client_id, call = entry
        if not isinstance(update, bytes) or type(call) is not str:
            raise ProtocolError("an append entry holds bytes and a str call id")
        _var_uint(buf, client_id)
        if call:
            try:
                text = call.encode()
            except UnicodeEncodeError:
                raise ProtocolError("a call id is not encodable as UTF-8") from None
            _var_uint(buf, len(text))
            buf += text
        else:
            buf.append(0)
        _var_uint(buf, len(update))
        buf += update
    return bytes(buf)


def _encode_appended(message: Appended) -> bytes:
    seqs = message.result
    if not isinstance(seqs, list) or message.error is not None:
        raise ProtocolError("an appended frame has a list of positions")
    buf = bytearray(b"\x64\x04")  # varUint(100) • varUint(APPENDED)
    _var_uint(buf, message.id)
    _var_uint(buf, len(seqs))
    for seq in seqs:
        _var_uint(buf, seq)
    return bytes(buf)


def _decode_append(frame: bytes) -> Append:
    """The append frame ``frame`` (after its two type bytes, ``100 • 3``)."""
    data = bytes(frame)
    request_id, pos = read_var_uint_at(data, 2)
    flags, pos = read_var_uint_at(data, pos)
    if flags & ~_DURABLE:
        raise ProtocolError(f"unknown append flags {flags:#x}")
    count, pos = read_var_uint_at(data, pos)
    end = len(data)
    # each entry takes at least 3 bytes: refuse a count the frame cannot hold before looping
    if count > (end - pos) // 3:
        raise ProtocolError(f"append frame claims {count} entries in {end - pos} bytes")
    entries = []
    for _ in range(count):
        client_id, pos = read_var_uint_at(data, pos)
        n, pos = read_var_uint_at(data, pos)
        call = ""
        if n:
            if pos + n > end:
                raise ProtocolError("a call id runs past the end of the frame")
            try:
                call = data[pos : pos + n].decode()
            except UnicodeDecodeError:
                raise ProtocolError("a call id is not valid UTF-8") from None
            pos += n
        n, pos = read_var_uint_at(data, pos)
        if pos + n > end:
            raise ProtocolError(f"an update of {n} bytes runs past the end of the frame")
        entries.append(AppendEntry(data[pos : pos + n], client_id, call))
        pos += n
    if pos != end:
        raise ProtocolError(f"{end - pos} trailing bytes after the Append")
    return Append.of(request_id, tuple(entries), flags == _DURABLE)


def _decode_appended(frame: bytes) -> Appended:
    """The appended frame ``frame`` (after its two type bytes, ``100 • 4``)."""
    data = bytes(frame)
    request_id, pos = read_var_uint_at(data, 2)
    count, pos = read_var_uint_at(data, pos)
    end = len(data)
    if count > end - pos:  # (a position takes at least one byte)
        raise ProtocolError(f"appended frame claims {count} positions in {end - pos} bytes")
    seqs = []
    for _ in range(count):
        seq, pos = read_var_uint_at(data, pos)
        seqs.append(seq)
    if pos != end:
        raise ProtocolError(f"{end - pos} trailing bytes after the Appended")
    return Appended.of(request_id, seqs)


def _parse_json(text: str, what: str) -> Any:
    # pydantic-core's parser bounds nesting depth (no RecursionError) and, unlike json.loads,
    # can refuse NaN/Infinity, which JSON (and JavaScript's JSON.parse) does not have.
    try:
        return pydantic_core.from_json(text, allow_inf_nan=False)
    except ValueError as exc:
        raise ProtocolError(f"{what} is not valid JSON: {exc}") from None


def _validate(
    model: type[Request] | type[Response] | type[Push], text: str
) -> Request | Response | Push:
    data = _parse_json(text, model.__name__.lower())
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "body"
        raise ProtocolError(f"invalid {model.__name__.lower()}: {loc}: {first['msg']}") from None


def decode(frame: bytes, *, max_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> Message:
    """The message that ``frame`` carries.

    Raises:
        MessageTooLarge: ``frame`` is longer than ``max_size``.
        ProtocolError: the frame is truncated, malformed, of an unknown type, has trailing
            bytes, or its JSON does not validate.
    """
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"a frame is bytes, not {type(frame).__name__}")
    size = len(frame)
    if size > max_size:
        raise MessageTooLarge("message", size, max_size)
    if size > 3 and frame[0] == MessageType.SYNC and frame[1] == SyncType.UPDATE:
        # the hub's most frequent frame, read inline: an update whose length takes one or
        # two bytes (up to 16 KiB); anything else (a bad length too) takes the general way
        first = frame[2]
        if first < 0x80:
            if size == 3 + first:
                return Update(bytes(frame[3:]))
        elif frame[3] and frame[3] < 0x80 and size == 4 + ((first & 0x7F) | (frame[3] << 7)):
            return Update(bytes(frame[4:]))
    if size > 1 and frame[0] == MessageType.CRDTSTORE:
        try:
            if frame[1] == ExtensionType.APPEND:
                return _decode_append(frame)
            if frame[1] == ExtensionType.APPENDED:
                return _decode_appended(frame)
        except CodecError as exc:
            raise ProtocolError(exc.reason) from None
    try:
        dec = Decoder(frame)
        kind = dec.read_var_uint()
        message: Message
        if kind == MessageType.SYNC:
            sub = dec.read_var_uint()
            if sub == SyncType.UPDATE:
                message = Update(dec.read_var_uint8array())
            elif sub == SyncType.STEP1:
                message = SyncStep1(dec.read_var_uint8array())
            elif sub == SyncType.STEP2:
                message = SyncStep2(dec.read_var_uint8array())
            else:
                raise ProtocolError(f"unknown sync message type {sub}")
        elif kind == MessageType.AWARENESS:
            message = Awareness(dec.read_var_uint8array())
        elif kind == MessageType.AUTH:
            sub = dec.read_var_uint()
            if sub != AuthType.PERMISSION_DENIED:
                raise ProtocolError(f"unknown auth message type {sub}")
            message = PermissionDenied(dec.read_var_string())
        elif kind == MessageType.QUERY_AWARENESS:
            message = QueryAwareness()
        elif kind == MessageType.CRDTSTORE:
            sub = dec.read_var_uint()
            if sub == ExtensionType.REQUEST:
                message = _validate(Request, dec.read_var_string())
            elif sub == ExtensionType.RESPONSE:
                message = _validate(Response, dec.read_var_string())
            elif sub == ExtensionType.PUSH:
                message = _validate(Push, dec.read_var_string())
            else:
                raise ProtocolError(f"unknown crdtstore message type {sub}")
        else:
            raise ProtocolError(f"unknown message type {kind}")
        dec.end(type(message).__name__)
        return message
    except CodecError as exc:
        raise ProtocolError(exc.reason) from None


# -- payloads inside messages ---------------------------------------------------------------


def decode_awareness_update(payload: bytes) -> tuple[AwarenessEntry, ...]:
    """The entries of an awareness update, each state checked to be JSON.

    Raises:
        ProtocolError: truncated, trailing bytes, or a state that is not JSON.
    """
    try:
        dec = Decoder(payload)
        count = dec.read_var_uint()
        # each entry takes at least 3 bytes: refuse a count the payload cannot hold before
        # looping over it
        if count > dec.remaining // 3:
            raise ProtocolError(f"awareness update claims {count} entries in {len(payload)} bytes")
        entries = []
        for _ in range(count):
            client_id = dec.read_var_uint()
            clock = dec.read_var_uint()
            state = dec.read_var_string()
            _parse_json(state, "awareness state")
            entries.append(AwarenessEntry(client_id, clock, state))
        dec.end("awareness update")
        return tuple(entries)
    except CodecError as exc:
        raise ProtocolError(exc.reason) from None


def encode_awareness_update(entries: tuple[AwarenessEntry, ...] | list[AwarenessEntry]) -> bytes:
    """The awareness update payload holding ``entries``.

    Raises:
        ProtocolError: an entry's fields cannot be encoded.
    """
    try:
        enc = Encoder()
        enc.write_var_uint(len(entries))
        for entry in entries:
            enc.write_var_uint(entry.client_id)
            enc.write_var_uint(entry.clock)
            enc.write_var_string(entry.state)
        return enc.to_bytes()
    except CodecError as exc:
        raise ProtocolError(exc.reason) from None


def decode_state_vector(state_vector: bytes) -> dict[int, int]:
    """A v1 state vector (``varUint(n) • n * (varUint(client) • varUint(clock))``) as a dict
    (:func:`crdtstore.codec.decode_state_vector`, with the protocol's error).

    Raises:
        ProtocolError: truncated, trailing bytes, or a client listed twice.
    """
    try:
        return _decode_state_vector(state_vector)
    except CodecError as exc:
        raise ProtocolError(exc.reason) from None
