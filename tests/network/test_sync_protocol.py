"""The pure sync protocol: y-protocols messages and the session machines (lib0 itself:
tests/record/test_codec.py).

Golden bytes are derived by hand from y-protocols' PROTOCOL.md and lib0's encoding (and, for
sync frames, checked against pycrdt's own encoder, which is yrs's).
"""

from __future__ import annotations

import json
import pathlib
import re
from collections import deque
from typing import Any

import pycrdt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import crdtstore
import sync
from crdtstore.codec import MAX_SAFE_INTEGER, Encoder, encode_var_uint
from sync import (
    Awareness,
    AwarenessEntry,
    ClientSession,
    CloseCode,
    ErrorInfo,
    MessageTooLarge,
    PermissionDenied,
    ProtocolError,
    PycrdtDocument,
    QueryAwareness,
    ReplicaDocument,
    Request,
    Response,
    ServerSession,
    SyncStep1,
    SyncStep2,
    Update,
    decode,
    decode_awareness_update,
    decode_state_vector,
    encode,
    encode_awareness_update,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]

# -- strategies ----------------------------------------------------------------------------

# text of every UTF-8 length (1 to 4 bytes), no lone surrogates (they have no UTF-8 form)
texts = st.text(st.characters(codec="utf-8"), max_size=40)
var_uints = st.one_of(
    st.integers(0, 300), st.integers(0, MAX_SAFE_INTEGER), st.just(MAX_SAFE_INTEGER)
)
blobs = st.binary(max_size=300)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=10,
)
request_ids = st.one_of(st.integers(0, MAX_SAFE_INTEGER), st.text(min_size=1, max_size=20))
ops = st.from_regex(r"\A[a-z][a-z0-9_]{0,10}(\.[a-z][a-z0-9_]{0,10}){0,2}\Z")
requests = st.builds(
    Request, id=request_ids, op=ops, params=st.dictionaries(texts, json_values, max_size=4)
)
error_infos = st.builds(
    lambda code, message, extra: ErrorInfo(code=code, message=message, **extra),
    st.sampled_from(["STALE_VERSION", "LEASE_HELD", "PROTOCOL_ERROR", "X1"]),
    texts,
    st.dictionaries(
        st.text(st.characters(codec="ascii", categories=["Ll"]), min_size=1, max_size=8).filter(
            lambda k: k not in ("code", "message")
        ),
        json_values,
        max_size=3,
    ),
)
responses = st.one_of(
    st.builds(Response.success, request_ids, json_values),
    st.builds(Response.failure, request_ids, error_infos),
)
awareness_entries = st.builds(
    AwarenessEntry,
    var_uints,
    var_uints,
    st.one_of(st.just("null"), json_values.map(lambda v: json.dumps(v, ensure_ascii=False))),
)
messages = st.one_of(
    st.builds(SyncStep1, blobs),
    st.builds(SyncStep2, blobs),
    st.builds(Update, blobs),
    st.builds(Awareness, blobs),
    st.builds(PermissionDenied, texts),
    st.just(QueryAwareness()),
    requests,
    responses,
)


# -- lib0 at the protocol boundary (the codec itself: tests/record/test_codec.py) ---------------


def test_codec_errors_become_protocol_errors() -> None:
    with pytest.raises(ProtocolError):
        encode(PermissionDenied("a\udfffb"))
    with pytest.raises(ProtocolError):
        encode(Request(id=1, op="x", params={"a": "\ud800"}))
    with pytest.raises(ProtocolError):
        encode(Update("not bytes"))  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="over-long varUint"):
        decode(b"\x80\x00")
    with pytest.raises(ProtocolError, match="twice"):
        decode_state_vector(b"\x02\x01\x01\x01\x02")
    with pytest.raises(ProtocolError):
        decode_awareness_update(b"\x01\x01\x01\x05ab")


# -- messages: golden bytes --------------------------------------------------------------------


def _var_string(text: str) -> bytes:
    data = text.encode()
    return encode_var_uint(len(data)) + data


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        # sync step 1 of an empty document: state vector = varUint(0 clients)
        (SyncStep1(b"\x00"), b"\x00\x00\x01\x00"),
        # step 2 / update with the empty update (0 structs, 0 delete sets)
        (SyncStep2(b"\x00\x00"), b"\x00\x01\x02\x00\x00"),
        (Update(b"\x00\x00"), b"\x00\x02\x02\x00\x00"),
        (Update(b"\xaa" * 200), b"\x00\x02\xc8\x01" + b"\xaa" * 200),
        # awareness: type 1, then the payload as a varUint8Array
        (Awareness(b"\x00"), b"\x01\x01\x00"),
        # auth: type 2, permission denied 0, the reason as UTF-8 with a byte-length prefix
        (PermissionDenied("é"), b"\x02\x00\x02\xc3\xa9"),
        (PermissionDenied(""), b"\x02\x00\x00"),
        (QueryAwareness(), b"\x03"),
        # the extension: type 100 (0x64), request 0 / response 1, then the JSON as varString
        (
            Request(id=1, op="flush"),
            b"\x64\x00" + _var_string('{"id":1,"op":"flush","params":{}}'),
        ),
        (Response(id=1, result=None), b"\x64\x01" + _var_string('{"id":1,"result":null}')),
        (
            Response.failure("a", ErrorInfo(code="LEASE_HELD", message="held", holder="bö")),
            b"\x64\x01"
            + _var_string(
                '{"id":"a","error":{"code":"LEASE_HELD","message":"held","holder":"bö"}}'
            ),
        ),
    ],
)
def test_message_golden(message: sync.Message, expected: bytes) -> None:
    assert encode(message) == expected
    assert decode(expected) == message


def test_awareness_payload_golden() -> None:
    state = '{"user":{"name":"Zoë"}}'  # 23 characters, 24 bytes
    entries = (AwarenessEntry(1, 2, state), AwarenessEntry(300, 0, "null"))
    payload = encode_awareness_update(entries)
    assert payload == (b"\x02" + b"\x01\x02\x18" + state.encode() + b"\xac\x02\x00\x04null")
    assert decode_awareness_update(payload) == entries
    assert entries[1].removed and not entries[0].removed
    assert encode(Awareness(payload)) == b"\x01" + encode_var_uint(len(payload)) + payload


def test_sync_frames_match_pycrdt_encoder() -> None:
    doc: pycrdt.Doc[Any] = pycrdt.Doc()
    m: pycrdt.Map[Any] = pycrdt.Map()
    doc["m"] = m
    m["k"] = "välue 🙂"
    assert encode(SyncStep1(doc.get_state())) == pycrdt.create_sync_message(doc)
    update = doc.get_update()
    assert encode(Update(update)) == pycrdt.create_update_message(update)
    assert decode_state_vector(doc.get_state()) == {doc.client_id: 1}


# -- messages: round trips and strictness ------------------------------------------------------


@given(messages)
def test_message_round_trip(message: sync.Message) -> None:
    frame = encode(message)
    assert decode(frame) == message
    assert encode(decode(frame)) == frame


@given(st.lists(awareness_entries, max_size=5))
def test_awareness_round_trip(entries: list[AwarenessEntry]) -> None:
    payload = encode_awareness_update(entries)
    assert decode_awareness_update(payload) == tuple(entries)


@given(st.dictionaries(var_uints, var_uints, max_size=6))
def test_state_vector_round_trip(sv: dict[int, int]) -> None:
    enc = Encoder()
    enc.write_var_uint(len(sv))
    for client, clock in sv.items():
        enc.write_var_uint(client)
        enc.write_var_uint(clock)
    assert decode_state_vector(enc.to_bytes()) == sv


@given(messages, st.data())
def test_truncated_frames_are_refused(message: sync.Message, data: st.DataObject) -> None:
    frame = encode(message)
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(ProtocolError):
        decode(frame[:cut])


@given(messages, st.binary(min_size=1, max_size=4))
def test_trailing_bytes_are_refused(message: sync.Message, tail: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode(encode(message) + tail)


@pytest.mark.parametrize(
    "frame",
    [
        b"\x04",  # unknown message type
        b"\x00\x03\x00",  # unknown sync type
        b"\x02\x01\x00",  # unknown auth type
        b"\x64\x02\x02{}",  # unknown extension type
        b"\x64\x00" + _var_string('{"id":1,"op":"x","params":{},"extra":1}'),
        b"\x64\x00" + _var_string('{"id":"1","op":"Bad Op"}'),
        b"\x64\x00" + _var_string('{"id":-1,"op":"x"}'),
        b"\x64\x00" + _var_string('{"id":1.0,"op":"x"}'),
        b"\x64\x00" + _var_string('{"id":1,"op":"x","params":{"a":NaN}}'),
        b"\x64\x00" + _var_string('{"id":1,"op":"x","params":{"a":1e400}}'),
        b"\x64\x00" + _var_string('{"id":1,"op":"x","params":' + "[" * 5000 + "]" * 5000 + "}"),
        b"\x64\x00" + _var_string("not json"),
        b"\x64\x01" + _var_string('{"id":1,"result":1,"error":{"code":"X","message":""}}'),
        b"\x64\x01" + _var_string('{"id":1,"error":{"code":"lower","message":""}}'),
    ],
)
def test_malformed_frames_are_refused(frame: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(frame)
    assert info.value.close_code == CloseCode.MALFORMED
    assert info.value.to_dict()["code"] == "PROTOCOL_ERROR"


def test_oversize_frame_is_refused_before_decoding() -> None:
    frame = encode(Update(b"\x00" * 100))
    with pytest.raises(MessageTooLarge) as info:
        decode(frame, max_size=50)
    assert info.value.to_dict() == {
        "code": "MESSAGE_TOO_LARGE",
        "message": str(info.value),
        "reason": info.value.reason,
        "close_code": 4413,
        "what": "message",
        "size": len(frame),
        "limit": 50,
    }


@pytest.mark.parametrize(
    "payload",
    [
        b"\x05\x01",  # claims more entries than the bytes can hold
        b"\x01\x01\x01\x03{a}",  # state not JSON
        b"\x01\x01\x01\x03NaN",
        b"\x01\x01\x01\x04null\x00",  # trailing byte
    ],
)
def test_bad_awareness_payloads(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_awareness_update(payload)


def test_response_from_crdtstore_error_keeps_code_and_fields() -> None:
    exc = crdtstore.StaleVersion("tasks", "t1", 3, 4, {"v": 1})
    response = Response.failure(7, exc)
    assert not response.ok and response.error is not None
    assert response.error.code == "STALE_VERSION"
    assert response.error.details["current_version"] == 4
    assert response.error.details["current_value"] == {"v": 1}
    assert decode(encode(response)) == response
    # fields that are not JSON fall back to code and message
    odd = crdtstore.StaleVersion("tasks", "t1", 3, 4, object())
    assert ErrorInfo.from_exception(odd).details == {}


# -- sessions ---------------------------------------------------------------------------------


def _doc_with(**items: Any) -> PycrdtDocument:
    doc: pycrdt.Doc[Any] = pycrdt.Doc()
    m: pycrdt.Map[Any] = pycrdt.Map()
    doc["m"] = m
    for key, value in items.items():
        m[key] = value
    return PycrdtDocument(doc)


def _content(document: PycrdtDocument) -> dict[str, Any]:
    return dict(document.doc.get("m", type=pycrdt.Map).to_py() or {})


def _exchange(client: ClientSession, server: ServerSession) -> list[sync.Received]:
    """Run both ends until no frame is in flight; return everything received."""
    to_server: deque[bytes] = deque(client.start())
    to_client: deque[bytes] = deque(server.start())
    seen = []
    while to_server or to_client:
        if to_server:
            received = server.receive(to_server.popleft())
            to_client.extend(received.reply_frames())
            seen.append(received)
        if to_client:
            received = client.receive(to_client.popleft())
            to_server.extend(received.reply_frames())
            seen.append(received)
    return seen


def test_client_and_server_converge() -> None:
    client_doc, server_doc = _doc_with(a=1, shared="client"), _doc_with(b="日本", shared="hub")
    client, server = ClientSession(client_doc), ServerSession(server_doc)
    seen = _exchange(client, server)
    assert client.synced
    assert sum(r.synced for r in seen) == 1
    assert _content(client_doc) == _content(server_doc)
    assert {"a", "b", "shared"} <= set(_content(server_doc))
    # the server learnt the client's (offline) edits through the client's step 2
    assert any(isinstance(r.message, SyncStep2) and r.applied for r in seen if r is not None)

    # live updates, both ways
    updates: list[bytes] = []
    client_doc.doc.observe(lambda event: updates.append(event.update))
    client_doc.doc.get("m", type=pycrdt.Map)["c"] = "🙂"
    received = server.receive(client.update_frame(updates.pop()))
    assert received.applied is not None
    server_updates: list[bytes] = []
    server_doc.doc.observe(lambda event: server_updates.append(event.update))
    server_doc.doc.get("m", type=pycrdt.Map)["d"] = [1, 2]
    client.receive(encode(Update(server_updates.pop())))
    assert _content(client_doc) == _content(server_doc)
    assert _content(client_doc)["c"] == "🙂"


def test_replica_document_converges_with_pycrdt_document() -> None:
    replica = crdtstore.Replica()
    replica.doc["m"] = pycrdt.Map()
    replica.doc.get("m", type=pycrdt.Map)["r"] = "replica"
    hub_doc = ReplicaDocument(replica)
    client_doc = _doc_with(x="client")
    _exchange(ClientSession(client_doc), ServerSession(hub_doc))
    assert replica.doc.get("m", type=pycrdt.Map).to_py() == _content(client_doc)


def test_read_only_session_refuses_writes() -> None:
    server_doc = _doc_with(b=2)
    server = ServerSession(server_doc, read_only=True)
    assert server.start() == []  # no step 1: it would invite a step 2
    client_doc = _doc_with(a=1)
    client = ClientSession(client_doc)
    _exchange(client, server)
    assert _content(client_doc) == {"a": 1, "b": 2}  # reading works
    before = server_doc.doc.get_update()
    for message in (SyncStep2(client_doc.doc.get_update()), Update(client_doc.doc.get_update())):
        received = server.receive(encode(message))
        assert received.applied is None
        assert received.refused
        assert received.replies == (PermissionDenied(received.refused),)
        client_received = client.receive(received.reply_frames()[0])
        assert client_received.refused == received.refused
    assert server_doc.doc.get_update() == before
    assert _content(server_doc) == {"b": 2}
    assert server.refused == 2 and client.refused == 2


def test_requests_and_responses() -> None:
    client = ClientSession(_doc_with(), max_pending_requests=2)
    server = ServerSession(_doc_with(), max_pending_requests=2)
    request, frame = client.request("lease.acquire", {"resources": ["src/a.py"], "ttl": 30})
    received = server.receive(frame)
    assert received.message == request and server.pending == {request.id}
    with pytest.raises(ProtocolError):  # the same id again while in flight
        server.receive(frame)
    answer = server.respond(Response.failure(request.id, crdtstore.LeaseHeld("src/a.py", "bob")))
    assert server.pending == frozenset()
    with pytest.raises(ValueError, match="no pending request"):
        server.respond(Response.success(request.id))
    got = client.receive(answer)
    assert isinstance(got.message, Response) and got.message.error is not None
    assert got.message.error.code == "LEASE_HELD"
    assert got.message.error.details["holder"] == "bob"
    with pytest.raises(ProtocolError):  # answered already: unknown id now
        client.receive(answer)
    client.request("flush")
    client.request("flush")
    with pytest.raises(ProtocolError) as info:
        client.request("flush")
    assert info.value.close_code == CloseCode.TOO_MANY_REQUESTS
    with pytest.raises(ProtocolError):
        client.request("Not An Op")


def test_unexpected_direction_is_refused() -> None:
    server = ServerSession(_doc_with())
    client = ClientSession(_doc_with())
    for frame in (encode(PermissionDenied("x")), encode(Response(id=1))):
        with pytest.raises(ProtocolError):
            server.receive(frame)
    with pytest.raises(ProtocolError):
        client.receive(encode(Request(id=1, op="x")))


def test_awareness_tracking_and_removal() -> None:
    server = ServerSession(_doc_with())
    payload = encode_awareness_update([AwarenessEntry(7, 3, '{"name":"ä"}')])
    received = server.receive(encode(Awareness(payload)))
    assert received.awareness == (AwarenessEntry(7, 3, '{"name":"ä"}'),)
    assert server.awareness_clients == {7: 3}
    removal = server.awareness_removal()
    assert removal is not None
    assert decode_awareness_update(removal.payload) == (AwarenessEntry(7, 4, "null"),)
    server.receive(encode(Awareness(encode_awareness_update([AwarenessEntry(7, 4, "null")]))))
    assert server.awareness_clients == {} and server.awareness_removal() is None
    assert isinstance(server.receive(b"\x03").message, QueryAwareness)


def test_session_size_limits() -> None:
    server = ServerSession(_doc_with(), max_message_size=64)
    with pytest.raises(MessageTooLarge) as info:
        server.receive(encode(Update(b"\x00" * 100)))
    assert info.value.close_code == CloseCode.MESSAGE_TOO_LARGE
    small = PycrdtDocument(max_update=4)
    with pytest.raises(ProtocolError) as info2:
        ServerSession(small).receive(encode(Update(_doc_with(a="x" * 10).doc.get_update())))
    assert info2.value.close_code == CloseCode.MESSAGE_TOO_LARGE


def test_invalid_update_bytes_close_with_invalid_update() -> None:
    document = _doc_with(a=1)
    server = ServerSession(document)
    before = document.doc.get_update()
    for update in (b"\x01", b"\xff\xff\xff\x7f\x01", b"\x01\x01\x05\x00\x00"):
        with pytest.raises(ProtocolError) as info:
            server.receive(encode(Update(update)))
        assert info.value.close_code == CloseCode.INVALID_UPDATE
    assert document.doc.get_update() == before


# -- fuzz: random and mangled frames into the sessions ------------------------------------------


def _session_state(session: ServerSession | ClientSession) -> tuple[Any, ...]:
    document = session.document
    assert isinstance(document, PycrdtDocument)
    common = (
        document.get_state(),
        document.doc.get_update(),
        session.frames_received,
        session.updates_applied,
        session.pending,
    )
    if isinstance(session, ServerSession):
        return (*common, session.awareness_clients, session.refused)
    return (*common, session.synced, session.refused, session.last_denied)


def _valid_frames() -> list[bytes]:
    source = _doc_with(k="v", n=1.5, t="日本語")
    update = source.doc.get_update()
    awareness = encode_awareness_update([AwarenessEntry(1, 1, '{"a":1}')])
    return [
        encode(SyncStep1(source.get_state())),
        encode(SyncStep1(b"\x00")),
        encode(SyncStep2(update)),
        encode(Update(update)),
        encode(Awareness(awareness)),
        encode(QueryAwareness()),
        encode(PermissionDenied("no")),
        encode(Request(id=1, op="flush")),
        encode(Response(id=1, result={"ok": True})),
    ]


VALID_FRAMES = _valid_frames()


@st.composite
def fuzz_frames(draw: st.DrawFn) -> bytes:
    how = draw(st.sampled_from(["random", "truncate", "flip", "prefix"]))
    if how == "random":
        return draw(st.binary(max_size=64))
    frame = draw(st.sampled_from(VALID_FRAMES))
    if how == "truncate":
        return frame[: draw(st.integers(0, len(frame)))]
    if how == "prefix":  # a valid message header, then garbage
        return frame[:2] + draw(st.binary(max_size=64))
    at = draw(st.integers(0, len(frame) - 1))
    bit = draw(st.integers(0, 7))
    return frame[:at] + bytes([frame[at] ^ (1 << bit)]) + frame[at + 1 :]


@settings(max_examples=300)
@given(st.lists(fuzz_frames(), min_size=1, max_size=8), st.sampled_from(["rw", "ro", "client"]))
def test_fuzzed_frames_only_raise_protocol_error(frames: list[bytes], kind: str) -> None:
    document = _doc_with(base="x")
    session: ServerSession | ClientSession
    if kind == "client":
        session = ClientSession(document, max_message_size=256)
        session.request("flush")  # so that a response with id 1 is expected
    else:
        session = ServerSession(document, read_only=kind == "ro", max_message_size=256)
    for frame in frames:
        before = _session_state(session)
        error: ProtocolError | None = None
        try:
            received = session.receive(frame)
        except ProtocolError as exc:
            error = exc
        if error is not None:
            assert 4400 <= error.close_code < 4500
            assert _session_state(session) == before
            continue
        if received.applied is None:
            # nothing applied: the document is as it was
            assert _session_state(session)[:2] == before[:2]
        for reply in received.reply_frames():
            decode(reply)


# -- layering ---------------------------------------------------------------------------------


def test_crdtstore_never_imports_sync() -> None:
    pattern = re.compile(r"^\s*(import sync\b|from sync\b)", re.MULTILINE)
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "crdtstore").rglob("*.py")
        if pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_sync_all_is_sorted_and_importable() -> None:
    assert sorted(sync.__all__, key=str) == sorted(set(sync.__all__), key=str)
    for name in sync.__all__:
        assert hasattr(sync, name), name
