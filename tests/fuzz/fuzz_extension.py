"""Fuzz target: the extension-message decoder (message type 100: JSON requests, responses
and pushes; sync._messages, sync._ops).

The first byte picks the kind (request, response, push: its value mod 3); the rest is the
JSON text, framed as ``varUint(100) • varUint(kind) • varString(text)`` (the bytes as given,
invalid UTF-8 included). Properties: only ``ProtocolError`` escapes ``decode``; a decoded
message decodes back from its encoding; a request is taken by a server session (pending
until answered, a second one with the same id refused) and its answer, a success or an
error, decodes to a response with its id; a request for an op the hub does not have is
answered ``UNSUPPORTED_OP`` by ``dispatch`` (without running anything).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.fuzz._harness import instrumented, main

with instrumented():
    from pycrdt import Doc

    from crdtstore import InvalidValue
    from crdtstore.codec import Encoder
    from sync._document import PycrdtDocument
    from sync._errors import ProtocolError
    from sync._messages import ErrorInfo, Request, Response, decode, encode
    from sync._ops import OPS, dispatch
    from sync._session import ServerSession


def _frame(kind: int, text: bytes) -> bytes:
    enc = Encoder()
    enc.write_var_uint(100)
    enc.write_var_uint(kind)
    enc.write_var_uint8array(text)
    return enc.to_bytes()


def check(data: bytes) -> None:
    if not data:
        return
    frame = _frame(data[0] % 3, data[1:])
    try:
        message = decode(frame)
    except ProtocolError as exc:
        assert exc.code in ("PROTOCOL_ERROR", "MESSAGE_TOO_LARGE"), exc.code
        return
    assert decode(encode(message)) == message, message
    if not isinstance(message, Request):
        return
    session = ServerSession(PycrdtDocument(Doc()))
    received = session.receive(frame)
    assert received.message == message and session.pending == {message.id}
    try:
        session.receive(frame)
    except ProtocolError:
        pass
    else:
        raise AssertionError("a second request with the same id was taken")
    if message.op not in OPS:
        coro = dispatch(None, message)  # type: ignore[arg-type]  # (unknown ops need no ctx)
        try:
            coro.send(None)
        except StopIteration as stop:
            response = stop.value
        else:
            raise AssertionError("dispatch of an unknown op awaited something")
        assert response.error is not None and response.error.code == "UNSUPPORTED_OP"
    else:
        exc = InvalidValue(f"fuzz: {message.params!r}"[:200])
        response = Response.failure(message.id, exc)
    wire = session.respond(response)
    answer = decode(wire)
    assert isinstance(answer, Response) and answer.id == message.id, answer
    assert isinstance(answer.error, ErrorInfo)
    assert not session.pending


if __name__ == "__main__":
    main(check)
