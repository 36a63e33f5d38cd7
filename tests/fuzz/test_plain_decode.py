"""One parse for the usual update: ``check_update`` skips pycrdt's trial parse only when
crdtstore's decoder read every byte as yrs does (``Decoded.plain``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycrdt import Array, Doc, Map, Text, get_state

import crdtstore.record._document as document
from crdtstore import InvalidUpdate
from crdtstore.codec import CodecError, decode_update
from crdtstore.record import Replica


def _updates(edit: Any) -> list[bytes]:
    doc: Doc[Any] = Doc()
    got: list[bytes] = []
    doc.observe(lambda event: got.append(bytes(event.update)))
    edit(doc)
    return got


def _map_sets(doc: Doc[Any]) -> None:
    m = doc.get("m", type=Map)
    for i in range(4):
        m[f"k{i % 2}"] = f"v{i}"
    del m["k0"]


def _text_edits(doc: Doc[Any]) -> None:
    t = doc.get("t", type=Text)
    t += "héllo 😀"
    del t[0:2]


def _list_inserts(doc: Doc[Any]) -> None:
    doc.get("a", type=Array).extend([1, "x", {"n": 2}])


def _parses(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    calls: list[bytes] = []

    def spy(update: bytes) -> bytes:
        calls.append(update)
        return get_state(update)

    monkeypatch.setattr(document, "get_state", spy)
    return calls


@pytest.mark.parametrize("edit", [_map_sets, _text_edits])
def test_map_sets_and_text_are_parsed_once(edit: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _parses(monkeypatch)
    replica = Replica()
    for update in _updates(edit):
        decoded = replica.check_update(update)
        assert decoded is not None and decoded.plain
        replica.apply_update(update, trial_decode=False)
    assert calls == []


def test_skipped_content_still_gets_pycrdts_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _parses(monkeypatch)
    (update,) = _updates(_list_inserts)
    decoded = Replica().check_update(update)
    assert decoded is not None and not decoded.plain
    assert calls == [update]


def test_a_clock_past_u32_is_not_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    # one client (id 1) at clock 2**32 with one map entry: past what the decoder vouches for
    clock = [0x80, 0x80, 0x80, 0x80, 0x10]  # varUint 2**32
    body = bytes([1, 1, 1, *clock, 0x28, 1, 1, ord("m"), 1, ord("k"), 1, 0x7E, 0])
    decoded = decode_update(body)
    assert not decoded.plain
    calls = _parses(monkeypatch)
    Replica().check_update(body)
    assert calls == [body]


def test_bytes_pycrdt_refuses_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    (update,) = _updates(_list_inserts)

    def refuse(update: bytes) -> bytes:
        raise ValueError("refused")

    monkeypatch.setattr(document, "get_state", refuse)
    replica = Replica()
    before = replica.doc.get_state()
    with pytest.raises(InvalidUpdate):
        replica.check_update(update)
    assert replica.doc.get_state() == before


def _mutate(update: bytes, ops: list[tuple[int, int, int]]) -> bytes:
    data = bytearray(update)
    for kind, at, value in ops:
        if not data:
            break
        i = at % len(data)
        if kind == 0:
            data[i] = value
        elif kind == 1:
            data.insert(i, value)
        else:
            del data[i]
    return bytes(data)


_SEEDS = [u for edit in (_map_sets, _text_edits) for u in _updates(edit)]


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(_SEEDS),
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 255), st.integers(0, 255)),
        min_size=1,
        max_size=4,
    ),
)
def test_what_decodes_as_plain_pycrdt_takes(seed: bytes, ops: list[tuple[int, int, int]]) -> None:
    update = _mutate(seed, ops)
    try:
        decoded = decode_update(update)
    except CodecError:
        return
    if not decoded.plain:
        return
    get_state(update)  # (raises if pycrdt refuses what was taken as plain)
    doc: Doc[Any] = Doc()
    doc.apply_update(update)
    doc.get_update()
