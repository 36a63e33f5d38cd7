"""The binary append frame (types 100/3 and 100/4): ``journal.append`` without JSON. No I/O.

It carries the hot write of a ``ws://`` client, whose update bytes would otherwise travel
base64 in a JSON request and be validated twice. :class:`Append` is a
:class:`~sync._requests.Request` (op ``journal.append``, the same id space, handled in order
like any request) carrying its entries as raw bytes; its success is answered by
:class:`Appended` (a :class:`~sync._requests.Response` whose ``result`` is the journal
positions), its failure by the ordinary JSON error response, with the same codes as the JSON
form. The JSON form stays: a client sends the binary one only to a hub whose ``whoami`` lists
``journal.append`` in ``frames`` (see :mod:`sync._client_append`). A malformed append frame
is refused as every other frame is (a :class:`~sync.ProtocolError`, close 4400).

A module of its own because it is a codec of its own, written over bytes rather than lib0's
``Encoder`` (it is on the path of every update); :func:`sync._messages.encode` and
:func:`sync._messages.decode` call it for these two frames.
"""

from __future__ import annotations

import json
from typing import Any, Final, NamedTuple

import pydantic_core

from crdtstore.codec import MAX_SAFE_INTEGER, CodecError, read_var_uint_at

from ._errors import ProtocolError
from ._requests import Request, Response

__all__ = [
    "APPEND_OP",
    "Append",
    "AppendEntry",
    "Appended",
    "decode_append",
    "decode_appended",
    "decode_head_push",
    "encode_head_push",
    "encode_append",
    "encode_appended",
]

APPEND_OP: Final = "journal.append"  # the op an append frame performs
_DURABLE: Final = 1  # the append frame's flag bits


class AppendEntry(NamedTuple):
    """One entry of an :class:`Append`: the update, the writer's client id and its tool-call
    id (``""``: none)."""

    update: bytes
    client_id: int
    call: str = ""


_new = object.__new__
_set = object.__setattr__


class Append(Request):
    """``journal.append`` as a binary frame: ``entries`` and ``durable`` instead of JSON
    ``params``. Build it with :meth:`of` (no validation: ``encode`` checks every field).

    On the wire (``•`` concatenates; the primitives are lib0's, :mod:`crdtstore.codec`)::

        append(id, flags, entries) = varUint(100) • varUint(3) • varUint(id) • varUint(flags) •
                                     varUint(n) • n * (varUint(client_id) • varString(call) •
                                     varUint8Array(update))

    ``flags`` bit 0 is ``durable``; the other bits must be 0. ``call`` is ``""`` for none.
    """

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
    """The success of an :class:`Append`: ``result`` is the entries' journal positions.

    On the wire::

        appended(id, seqs) = varUint(100) • varUint(4) • varUint(id) • varUint(n) •
                             n * varUint(seq)
    """

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


def _var_uint(buf: bytearray, value: object) -> None:
    if type(value) is not int or not 0 <= value <= MAX_SAFE_INTEGER:
        raise ProtocolError(f"varUint out of range: {value!r}")
    while value > 0x7F:
        buf.append(0x80 | (value & 0x7F))
        value >>= 7
    buf.append(value)


def encode_append(message: Append) -> bytes:
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


def encode_appended(message: Appended) -> bytes:
    seqs = message.result
    if not isinstance(seqs, list) or message.error is not None:
        raise ProtocolError("an appended frame has a list of positions")
    buf = bytearray(b"\x64\x04")  # varUint(100) • varUint(APPENDED)
    _var_uint(buf, message.id)
    _var_uint(buf, len(seqs))
    for seq in seqs:
        _var_uint(buf, seq)
    return bytes(buf)


def decode_append(frame: bytes) -> Append:
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


def decode_appended(frame: bytes) -> Appended:
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


_PUSH_KEYS: Final = frozenset({"push", "seq", "rows"})


def decode_head_push(frame: bytes) -> tuple[int, list[Any] | None] | None:
    """The ``seq`` and ``rows`` (None: none) of a head push (type 100/2, the JSON
    ``{"push": "head", "seq": N, "rows": [...]}``), read without pydantic: it reaches every
    reader of a run on every update. None when ``frame`` is anything else, or not plainly a
    head push: :func:`sync._messages.decode` then reads it (and refuses what is malformed),
    so nothing the :class:`~sync._requests.Push` model refuses is taken here."""
    if len(frame) < 4 or frame[0] != 0x64 or frame[1] != 0x02:  # varUint(100) • varUint(PUSH)
        return None
    try:
        size, pos = read_var_uint_at(frame, 2)
        if pos + size != len(frame):
            return None
        data = pydantic_core.from_json(frame[pos:], allow_inf_nan=False)  # (as decode parses)
    except (CodecError, ValueError):
        return None
    if type(data) is not dict or data.get("push") != "head" or not data.keys() <= _PUSH_KEYS:
        return None
    seq, rows = data.get("seq", 0), data.get("rows")
    if type(seq) is not int or not 0 <= seq <= MAX_SAFE_INTEGER:
        return None
    if rows is not None and type(rows) is not list:
        return None
    return seq, rows


# (the JSON of journal.read's rows as the hub's store keeps it; NaN and Infinity refused)
_dumps: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def encode_head_push(seq: int, rows: list[Any] | None = None) -> bytes:
    """The frame of ``Push(push="head", seq=seq, rows=rows)`` built without pydantic: the
    hub sends one to every crdtstore connection of a run on every commit. ``rows``: JSON
    values (the rows as ``journal.read`` gives them), as the :class:`~sync._requests.Push`
    model takes them; :func:`sync._messages.decode` reads the frame as that push.

    Raises:
        ProtocolError: ``seq`` is not a safe int >= 0, or ``rows`` is not a list of JSON.
    """
    if type(seq) is not int or not 0 <= seq <= MAX_SAFE_INTEGER:
        raise ProtocolError(f"a head push's seq is a safe int >= 0, not {seq!r}")
    if rows is not None and type(rows) is not list:
        raise ProtocolError(f"a head push's rows are a list, not {type(rows).__name__}")
    body = {"push": "head", "seq": seq} if rows is None else {"push": "head", "seq": seq,
                                                              "rows": rows}  # fmt: skip
    try:
        text = _dumps(body).encode()
    except (TypeError, ValueError) as exc:  # not JSON, NaN, a cycle; lone surrogates
        raise ProtocolError(f"cannot encode a head push: {exc}") from None
    buf = bytearray(b"\x64\x02")  # varUint(100) • varUint(PUSH) • varString(JSON)
    _var_uint(buf, len(text))
    buf += text
    return bytes(buf)
