"""The binary append frame (``journal.append`` without JSON, ``sync._frames.Append``).

The codec is checked without a server by hypothesis: random entries round trip, random bytes
after the frame's type bytes are either a frame that encodes back to exactly those bytes or a
``ProtocolError`` (never another exception), and the inline parser agrees with a reference
parser written on lib0's general ``Decoder``. Through a real hub: ``ws://`` records append by
frames and read each other's writes, an old client (JSON appends) and a new one share a run, a
hub without frames gets JSON, and bad frames are refused with the codes of the JSON form.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crdtstore import open_store
from crdtstore.codec import MAX_SAFE_INTEGER, CodecError, Decoder
from sync import ProtocolError, decode, encode
from sync._errors import CloseCode
from sync._frames import Append, Appended, AppendEntry
from sync._messages import Request, Response
from sync._ops import OPS, _Op
from tests.network.test_sync_client import (
    FAST,
    RUN,
    journal,
    running_hub,
    token,
    until,
)
from tests.network.test_sync_hub import running_hub as running_raw_hub
from tests.network.test_sync_hub import token as raw_token

pytestmark = pytest.mark.anyio

_ASYNCIO = pytest.mark.parametrize("anyio_backend", ["asyncio"])

_IDS = st.integers(0, MAX_SAFE_INTEGER)
_CALLS = st.one_of(st.just(""), st.text(st.characters(exclude_categories=["Cs"]), max_size=40))
_ENTRIES = st.lists(st.builds(AppendEntry, st.binary(max_size=300), _IDS, _CALLS), max_size=6).map(
    tuple
)


# -- the codec, without a server ----------------------------------------------------------


@given(_IDS, _ENTRIES, st.booleans())
def test_append_frames_round_trip(request_id: int, entries: Any, durable: bool) -> None:
    message = Append.of(request_id, entries, durable)
    frame = encode(message)
    got = decode(frame)
    assert type(got) is Append and isinstance(got, Request)
    assert got == message
    assert (got.id, got.op, got.entries, got.durable) == (request_id, "journal.append",
                                                          entries, durable)  # fmt: skip
    assert frame == _reference_append(got)


@given(st.lists(st.tuples(st.booleans(), _ENTRIES, st.booleans()), max_size=8))
def test_a_link_session_numbers_append_frames_with_its_requests(
    calls: list[tuple[bool, Any, bool]],
) -> None:
    """``_LinkSession.append_request`` (no JSON built): the frame of ``Append.of`` under the
    session's next request id, pending until its answer, in one id space with ``request``."""
    from pycrdt import Doc

    from sync import PycrdtDocument
    from sync._link import _LinkSession

    session = _LinkSession(PycrdtDocument(Doc()), max_pending_requests=4)
    ids: list[int | str] = []
    for framed, entries, durable in calls:
        if len(ids) == 4:
            with pytest.raises(ProtocolError) as refused:
                session.append_request(entries, durable)
            assert refused.value.close_code == CloseCode.TOO_MANY_REQUESTS
            session.receive(encode(Appended.of(ids.pop(0), [])))
        if framed:
            request, frame = session.append_request(entries, durable)
            assert frame == encode(Append.of(int(request.id), entries, durable))
        else:
            request, frame = session.request("whoami")
        assert all(request.id > i for i in ids)  # type: ignore[operator]
        ids.append(request.id)
    for i in ids:  # each answered once; an answer to no pending request is refused
        session.receive(encode(Appended.of(i, [1])))
        with pytest.raises(ProtocolError):
            session.receive(encode(Appended.of(i, [1])))


@given(_IDS, st.lists(_IDS, max_size=20))
def test_appended_frames_round_trip(request_id: int, seqs: list[int]) -> None:
    message = Appended.of(request_id, seqs)
    got = decode(encode(message))
    assert type(got) is Appended and isinstance(got, Response)
    assert got == message and got.ok and got.result == seqs


def _reference_append(message: Append) -> bytes:
    """The append frame by lib0's general ``Encoder`` (what the inline one must give)."""
    from crdtstore.codec import Encoder

    enc = Encoder()
    for v in (100, 3, message.id, int(message.durable), len(message.entries)):
        enc.write_var_uint(v)
    for e in message.entries:
        enc.write_var_uint(e.client_id)
        enc.write_var_string(e.call)
        enc.write_var_uint8array(e.update)
    return enc.to_bytes()


def _reference_decode(frame: bytes) -> Append | Appended:
    """Both frames by lib0's general ``Decoder``, as their classes' docstrings draw them."""
    dec = Decoder(frame)
    assert dec.read_var_uint() == 100
    kind = dec.read_var_uint()
    request_id = dec.read_var_uint()
    if kind == 4:
        count = dec.read_var_uint()
        seqs = [dec.read_var_uint() for _ in range(count)]
        dec.end()
        return Appended.of(request_id, seqs)
    flags = dec.read_var_uint()
    if flags not in (0, 1):
        raise CodecError("flags")
    entries = []
    for _ in range(dec.read_var_uint()):
        client_id = dec.read_var_uint()
        call = dec.read_var_string()
        entries.append(AppendEntry(dec.read_var_uint8array(), client_id, call))
    dec.end()
    return Append.of(request_id, tuple(entries), flags == 1)


@settings(max_examples=500)
@given(st.sampled_from([b"\x64\x03", b"\x64\x04"]), st.binary(max_size=60))
def test_random_bytes_are_a_frame_or_refused_as_the_general_parser_does(
    prefix: bytes, body: bytes
) -> None:
    frame = prefix + body
    try:
        expected: Any = _reference_decode(frame)
    except (CodecError, ProtocolError):
        expected = None
    try:
        got: Any = decode(frame)
    except ProtocolError:
        got = None
    assert got == expected
    if got is not None:
        assert encode(got) == frame  # one encoding per message: nothing is read loosely


@given(_IDS, _ENTRIES.filter(bool), st.booleans(), st.data())
def test_truncated_frames_are_refused(
    request_id: int, entries: Any, durable: bool, data: st.DataObject
) -> None:
    frame = encode(Append.of(request_id, entries, durable))
    cut = data.draw(st.integers(2, len(frame) - 1))
    with pytest.raises(ProtocolError):
        decode(frame[:cut])
    with pytest.raises(ProtocolError):
        decode(frame + b"\x00")


@pytest.mark.parametrize(
    "bad",
    [
        Append.of(1, (AppendEntry("not bytes", 1, ""),), True),  # type: ignore[arg-type]
        Append.of(1, (AppendEntry(b"u", -1, ""),), True),
        Append.of(1, (AppendEntry(b"u", 1, "\ud800"),), True),  # a lone surrogate
        Append.of(1, ((b"u", 1),), True),  # type: ignore[arg-type]
        Append.of(-1, (), True),
        Append.of("id", (), True),  # type: ignore[arg-type]
        Append.of(1, (), 1),  # type: ignore[arg-type]
        Appended.of(1, [-1]),
        Appended.of(1, ["1"]),  # type: ignore[list-item]
    ],
)
def test_unencodable_frames_raise_protocol_error(bad: Any) -> None:
    with pytest.raises(ProtocolError):
        encode(bad)


# -- through a hub ------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def ws_store(hub: Any, agent: str, *, frames: bool = True) -> AsyncIterator[Any]:
    """A ``ws://`` store of ``agent``; ``frames`` False: it appends as clients before the
    append frame did (JSON)."""
    async with open_store(hub.url(), token=token(agent), **FAST) as store:
        store.backend.append_frames = frames
        yield store


async def test_records_append_by_frames_and_read_each_other(tmp_path: Path) -> None:
    async with (
        running_hub(tmp_path) as hub,
        ws_store(hub, "alice") as sa,
        ws_store(hub, "bob") as sb,
        sa.open_record(RUN, "x") as a,
        sb.open_record(RUN, "x") as b,
    ):
        for i in range(5):
            await a.map("notes").set(f"a{i}", i)
        with a.attributed(call="call-1"):
            await a.map("notes").set("c", "with a call id")
        await a.flush()
        await until(lambda: b.map("notes").get("c") == "with a call id", "bob to read alice")
        await b.map("notes").set("b", 1)
        await b.flush()
        await until(lambda: a.map("notes").get("b") == 1, "alice to read bob")
        assert sa.backend.appends_framed >= 1 and sb.backend.appends_framed >= 1
        rows = await journal(hub)
        assert [r.agent for r in rows] == ["alice"] * 6 + ["bob"]
        assert [r.call for r in rows] == [""] * 5 + ["call-1", ""]
        assert a.version("notes", "c") == b.version("notes", "c") is not None


async def test_an_old_client_and_a_new_one_share_a_run(tmp_path: Path) -> None:
    """A client sending JSON appends (as before the frame) and one sending frames, on one
    run: both journal, each reads the other, the journal is the same either way."""
    async with (
        running_hub(tmp_path) as hub,
        ws_store(hub, "old", frames=False) as so,
        ws_store(hub, "new") as sn,
        so.open_record(RUN, "x") as old,
        sn.open_record(RUN, "x") as new,
    ):
        for i in range(4):
            await old.map("notes").set(f"o{i}", i)
            await new.map("notes").set(f"n{i}", i)
        await old.flush()
        await new.flush()
        want = {**{f"o{i}": i for i in range(4)}, **{f"n{i}": i for i in range(4)}}
        for rec in (old, new):
            await until(lambda r=rec: dict(r.map("notes").items()) == want, "both writes")
        assert so.backend.appends_framed == 0 and sn.backend.appends_framed >= 1
        rows = await journal(hub)
        assert sorted(r.agent for r in rows) == ["new"] * 4 + ["old"] * 4
        assert old.version("notes", "o3") == new.version("notes", "o3") is not None


async def test_a_hub_without_frames_gets_json_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub whose ``whoami`` does not list the frame (one before it) is sent JSON."""
    whoami = OPS["whoami"]

    async def old_whoami(ctx: Any, params: Any) -> Any:
        got = dict(await whoami.handler(ctx, params))  # type: ignore[arg-type]
        got.pop("frames")
        return got

    monkeypatch.setitem(OPS, "whoami", _Op(old_whoami, whoami.write))
    async with running_hub(tmp_path) as hub, ws_store(hub, "alice") as store:
        async with store.open_record(RUN, "x") as rec:
            await rec.map("notes").set("a", 1)
            await rec.flush()
        assert store.backend.appends_framed == 0
        assert [r.agent for r in await journal(hub)] == ["alice"]


def _frame_with(peer: Any, entries: tuple[AppendEntry, ...]) -> tuple[int, bytes]:
    request, _ = peer.session.request("journal.append")  # (an id the peer waits for)
    return request.id, encode(Append.of(request.id, entries, True))


async def _answer(peer: Any, request_id: int, frame: bytes) -> Response:
    await peer.ws.send(frame)
    await peer.wait(lambda: request_id in peer.responses or peer.closed)
    return peer.responses[request_id]  # type: ignore[no-any-return]


@_ASYNCIO  # (the raw hub runs in the test's loop: websockets' asyncio server)
async def test_bad_append_frames_are_refused_with_stable_codes(tmp_path: Path) -> None:
    """Malformed frames close the connection with 4400 (as any malformed frame); well-formed
    frames of bad entries get the JSON form's error codes; the others go on."""
    malformed = [
        ("truncated", b"\x64\x03\x01\x01\x01\x05"),
        ("unknown flags", b"\x64\x03\x01\x02\x00"),
        ("trailing bytes", encode(Append.of(1, (), True)) + b"\x00"),
        ("a count the frame cannot hold", b"\x64\x03\x01\x01\x7f\x00\x00\x00"),
        ("a call id not UTF-8", b"\x64\x03\x01\x01\x01\x05\x01\xff\x00"),
        ("an appended frame from a client", encode(Appended.of(1, [1]))),
    ]
    async with running_raw_hub(tmp_path) as hub:
        async with hub.peer(raw_token("alice")) as alice:
            await alice.set("a", 1)
            await alice.flush()
            before = await hub.journal()
            for name, frame in malformed:
                async with hub.peer(raw_token("mallory")) as mallory:
                    await mallory.ws.send(frame)
                    await mallory.wait(lambda m=mallory: m.closed)
                    assert mallory.close_code == CloseCode.MALFORMED, name
            async with hub.peer(raw_token("mallory")) as mallory:
                refused = {
                    "a call id with NUL": (AppendEntry(b"\x00\x00", 1, "a\x00b"),),
                    "update bytes that are no update": (AppendEntry(b"\x05\x01\x02", 1, ""),),
                }
                codes = {}
                for name, entries in refused.items():
                    response = await _answer(mallory, *_frame_with(mallory, entries))
                    assert response.error is not None, name
                    codes[name] = response.error.code
                    # the same entries as JSON get the same error
                    request, frame = mallory.session.request(
                        "journal.append", {"entries": [_json_entry(e) for e in entries]}
                    )
                    json_response = await _answer(mallory, request.id, frame)
                    assert json_response.error is not None
                    assert json_response.error.code == codes[name], name
                assert codes == {
                    "a call id with NUL": "INVALID_VALUE",
                    "update bytes that are no update": "INVALID_UPDATE",
                }
                assert not mallory.closed
            async with hub.peer(raw_token("reader", mode="ro"), read_only=True) as reader:
                response = await _answer(
                    reader, *_frame_with(reader, (AppendEntry(b"\x00\x00", 1, ""),))
                )
                assert response.error is not None and response.error.code == "READ_ONLY"
            await alice.set("b", 2)
            await alice.flush()
            after = await hub.journal()
            assert after[: len(before)] == before
            assert [e.agent for e in after[len(before) :]] == ["alice"]


def _json_entry(entry: AppendEntry) -> dict[str, Any]:
    import base64

    out: dict[str, Any] = {
        "update": base64.b64encode(entry.update).decode(),
        "client_id": entry.client_id,
    }
    if entry.call:
        out["call"] = entry.call
    return out


@_ASYNCIO  # (the raw hub runs in the test's loop: websockets' asyncio server)
async def test_a_good_frame_from_a_plain_connection_is_journaled(tmp_path: Path) -> None:
    """A frame carrying a real update, sent on a plain connection: answered with its journal
    position in an :class:`Appended`, journaled as the token's agent."""
    from pycrdt import Doc, Map

    doc: Doc[Any] = Doc()
    state = doc.get_state()
    with doc.transaction():
        doc.get("__crdtstore_collections", type=Map)["notes"] = "map"
        doc.get("notes", type=Map)["k"] = "v"
    update = doc.get_update(state)
    async with running_raw_hub(tmp_path) as hub, hub.peer(raw_token("alice")) as alice:
        response = await _answer(
            alice, *_frame_with(alice, (AppendEntry(update, doc.client_id, "c9"),))
        )
        assert type(response) is Appended and response.ok
        rows = await hub.journal()
        assert response.result == [rows[-1].seq]
        assert (rows[-1].agent, rows[-1].call, rows[-1].client_id) == ("alice", "c9",
                                                                       doc.client_id)  # fmt: skip
