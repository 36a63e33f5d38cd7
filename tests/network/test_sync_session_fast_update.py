"""``ServerSession.receive_update`` (the hub's path for update frames) against ``receive``: the
same outcome on any frame, or None having changed nothing."""

from __future__ import annotations

from typing import Any

import pycrdt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crdtstore import Replica
from sync import (
    Awareness,
    CloseCode,
    ProtocolError,
    PycrdtDocument,
    ReplicaDocument,
    ServerSession,
    SyncStep1,
    SyncStep2,
    Update,
    encode,
)


def _updates() -> list[bytes]:
    """Updates of a map writer, from a few bytes to a two-byte and a three-byte length."""
    doc: pycrdt.Doc[Any] = pycrdt.Doc()
    m = doc.get("m", type=pycrdt.Map)
    out = []
    for i, size in enumerate((1, 10, 100, 200, 5000, 20000)):
        state = doc.get_state()
        m[f"k{i % 3}"] = "x" * size
        out.append(doc.get_update(state))
    state = doc.get_state()
    del m["k0"]
    out.append(doc.get_update(state))
    return out


UPDATES = _updates()


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    update = draw(st.sampled_from(UPDATES))
    how = draw(st.sampled_from(["update", "update", "step2", "other", "truncate", "flip", "long"]))
    frame = encode(Update(update))
    if how == "update":
        return frame
    if how == "step2":
        return encode(SyncStep2(update))
    if how == "other":
        return draw(
            st.sampled_from([encode(SyncStep1(b"\x00")), encode(Awareness(b"\x00")), b"\x00\x02"])
        )
    if how == "long":  # the length as a non-canonical varUint, or trailing bytes
        return draw(
            st.sampled_from(
                [
                    b"\x00\x02" + bytes([0x80 | len(update) & 0x7F, len(update) >> 7, 0]) + update,
                    frame + b"\x00",
                ]
            )
        )
    if how == "truncate":
        return frame[: draw(st.integers(0, len(frame) - 1))]
    at = draw(st.integers(0, len(frame) - 1))
    bit = draw(st.integers(0, 7))
    return frame[:at] + bytes([frame[at] ^ (1 << bit)]) + frame[at + 1 :]


def _document(kind: str) -> PycrdtDocument | ReplicaDocument:
    if kind == "replica":
        return ReplicaDocument(Replica())
    return PycrdtDocument()


def _state(session: ServerSession) -> tuple[Any, ...]:
    document = session.document
    doc = document.doc if isinstance(document, PycrdtDocument) else document.replica.doc
    return (
        doc.get_update(),
        session.frames_received,
        session.updates_applied,
        session.refused,
    )


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except ProtocolError as exc:
        return "error", (type(exc), exc.close_code, exc.reason)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(frames(), min_size=1, max_size=6),
    st.sampled_from(["replica", "pycrdt"]),
    st.booleans(),
    st.sampled_from([64, 4096, 1 << 20]),
)
def test_receive_update_matches_receive(
    sequence: list[bytes], kind: str, read_only: bool, max_size: int
) -> None:
    fast = ServerSession(_document(kind), read_only=read_only, max_message_size=max_size)
    general = ServerSession(_document(kind), read_only=read_only, max_message_size=max_size)
    for frame in sequence:
        before = _state(fast)
        got = _outcome(lambda frame=frame: fast.receive_update(frame))
        expected = _outcome(lambda frame=frame: general.receive(frame))
        if got == ("ok", None):  # not taken: nothing changed, the general way decides
            assert _state(fast) == before
            got = _outcome(lambda frame=frame: fast.receive(frame))
            if got[0] == "ok":
                got = ("ok", got[1])
        elif got[0] == "ok":  # taken: what receive applies, as an Update
            assert expected[0] == "ok"
            assert type(expected[1].message) is Update
            assert expected[1].replies == ()
            assert got[1] == expected[1].applied
            got = expected
        else:  # refused: the same error, nothing changed
            assert _state(fast) == before
        assert got == expected
        assert _state(fast) == _state(general)


@pytest.mark.parametrize("update", UPDATES[:-2] + UPDATES[-1:])
def test_receive_update_takes_every_update_frame_under_16_kib(update: bytes) -> None:
    session = ServerSession(ReplicaDocument(Replica()))
    assert session.receive_update(encode(Update(update))) == update
    assert (session.frames_received, session.updates_applied) == (1, 1)


def test_receive_update_leaves_other_frames_and_read_only_sessions_alone() -> None:
    update = UPDATES[0]
    read_only = ServerSession(ReplicaDocument(Replica()), read_only=True)
    assert read_only.receive_update(encode(Update(update))) is None
    assert (read_only.frames_received, read_only.refused) == (0, 0)
    session = ServerSession(ReplicaDocument(Replica()))
    assert session.receive_update(encode(Update(UPDATES[5]))) is None  # a three-byte length
    assert session.receive_update(encode(SyncStep2(update))) is None
    assert session.frames_received == 0


def test_receive_update_refuses_bad_bytes_with_invalid_update() -> None:
    document = ReplicaDocument(Replica())
    session = ServerSession(document)
    before = document.replica.doc.get_update()
    for bad in (b"\x01", b"\xff\xff\xff\x7f\x01", b"\x01\x01\x05\x00\x00"):
        with pytest.raises(ProtocolError) as info:
            session.receive_update(encode(Update(bad)))
        assert info.value.close_code == CloseCode.INVALID_UPDATE
    assert document.replica.doc.get_update() == before
    assert (session.frames_received, session.updates_applied) == (0, 0)
