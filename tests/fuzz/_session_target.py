"""The session targets' common check (fuzz_session_server.py, fuzz_session_client.py): one
input is a sequence of frames (see ``_harness.frames``) received by one session.

Properties, frame by frame: ``receive`` returns, or raises ``ProtocolError`` (with a close
code of the hub's) having changed nothing (the document's update and state vector, the
session's counters, pending requests, awareness clients, sync flag); its replies encode
and decode back to themselves; a binary message re-encodes to the frame it came in (the
decoder is canonical); a JSON message decodes back from its encoding; a read-only server
session never changes its document; an applied update leaves the document holding it.

Two findings of these targets are fixed (``tests/fuzz/test_fuzz_regressions.py``): pycrdt
integrating part of an update it then refuses (an item naming a value as its parent: such
updates are now tried on a copy first), and a GC struct of length 0 after a clock gap that
made every later ``get_update`` panic (refused by the strict decode). Both are checked
again, like everything else.
"""

from __future__ import annotations

from typing import Any

from crdtstore import Replica
from sync._document import ReplicaDocument
from sync._errors import CloseCode, ProtocolError
from sync._messages import Push, Request, Response, decode, encode
from sync._session import ClientSession, ServerSession
from tests.fuzz._harness import frames

_CODES = {int(c) for c in CloseCode}
_BASE: list[bytes] = []


def _base() -> bytes:
    if not _BASE:
        replica = Replica()
        replica.doc.get("notes", type=__import__("pycrdt").Map)["seed"] = "v"
        _BASE.append(bytes(replica.doc.get_update()))
    return _BASE[0]


def _snapshot(session: ServerSession | ClientSession, replica: Replica) -> tuple[Any, ...]:
    extra = (
        (session.refused, session.awareness_clients)
        if isinstance(session, ServerSession)
        else (session.refused, session.synced, session.last_denied)
    )
    return (
        bytes(replica.doc.get_update()),
        bytes(replica.doc.get_state()),
        session.frames_received,
        session.updates_applied,
        session.pending,
        extra,
    )


def check_session(data: bytes, server: bool) -> None:
    if not data:
        return
    replica = Replica()
    replica.apply_update(_base())
    document = ReplicaDocument(replica)
    session: ServerSession | ClientSession
    read_only = bool(data[0] & 2) and server
    if server:
        session = ServerSession(document, read_only=read_only, max_pending_requests=4,
                                max_awareness_clients=8)  # fmt: skip
    else:
        session = ClientSession(document, max_pending_requests=4, max_awareness_clients=8)
        for op in ("flush", "whoami"):
            session.request(op)
    for frame in session.start():
        assert decode(frame) is not None
    initial = bytes(replica.doc.get_update())
    for i, frame in enumerate(frames(data[1:])):
        before = _snapshot(session, replica)
        try:
            received = session.receive(frame)
        except ProtocolError as exc:
            assert exc.close_code in _CODES, exc.close_code
            assert _snapshot(session, replica) == before, "a refused frame changed something"
            continue
        message = received.message
        if isinstance(message, (Request, Response, Push)):
            assert decode(encode(message)) == message
        else:
            assert encode(message) == frame, (message, frame)
        for reply, wire in zip(received.replies, received.reply_frames(), strict=True):
            assert decode(wire) == reply
        if received.applied is not None:
            state = bytes(replica.doc.get_state())
            replica.doc.apply_update(received.applied)
            assert bytes(replica.doc.get_state()) == state, "the applied update was not held"
        if isinstance(session, ServerSession) and isinstance(message, Request) and i % 2:
            wire = session.respond(Response.success(message.id, None))
            assert decode(wire) == Response(id=message.id, result=None)
            assert message.id not in session.pending
    if read_only:
        assert bytes(replica.doc.get_update()) == initial, "a read-only session wrote"
