"""The y-protocols messages, one per binary WebSocket frame, and crdtstore's extension. No I/O.

The wire format, frame by frame, is drawn next to :class:`MessageType`; the primitives are
lib0's (:mod:`crdtstore.codec`). The extension's JSON messages are :mod:`sync._requests`,
its binary append frame :mod:`sync._frames`; all are encoded and decoded here.

Type 100 is crdtstore's extension: requests the CRDT cannot answer (guarded writes, leases,
claims, run metadata, "has the hub journaled everything I sent"), each answered by exactly
one response with the same ``id``, carrying a result or an error with crdtstore's stable error
codes. y-websocket has handlers for types 0-3 only, so the hub sends type 100 only in answer
to a type 100 request (or, as a :class:`Push`, to a connection that chose the ``crdtstore``
subprotocol): a Yjs client that never asks never sees one. The hub processes a connection's
frames in order, so a response also acknowledges every update the client sent before it.

Decoding is strict: one message per frame, no trailing bytes, known types only, JSON payloads
validated by the pydantic models. Every failure is a :class:`~sync.ProtocolError` (the
codec's :class:`~crdtstore.codec.CodecError` is translated here, at the protocol boundary).
``decode(encode(m)) == m`` for every message ``m``. The binary messages are frozen
dataclasses rather than pydantic models: they sit on the hot path of every update and hold
only bytes or a string, which ``encode`` checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

import pydantic_core
from pydantic import BaseModel, ValidationError

from crdtstore.codec import CodecError, Decoder, Encoder
from crdtstore.codec import decode_state_vector as _decode_state_vector

from ._errors import MessageTooLarge, ProtocolError
from ._frames import (
    APPEND_OP,
    Append,
    Appended,
    AppendEntry,
    decode_append,
    decode_appended,
    encode_append,
    encode_appended,
)
from ._requests import ErrorInfo, Push, Request, Response

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
#     append(...), appended(...): varUint(100) • varUint(3 | 4) • ..., see sync._frames.Append
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
        return encode_append(message)
    if type(message) is Appended:
        return encode_appended(message)
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
                return decode_append(frame)
            if frame[1] == ExtensionType.APPENDED:
                return decode_appended(frame)
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
