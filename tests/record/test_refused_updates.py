"""A refused update changes nothing, also when pycrdt refuses it half way.

pycrdt 0.14.13 integrates the items of an update one by one and refuses an item whose
parent id is not a shared type only when it reaches it ("block parent ... must be deleted or
shared ref type"), with the items before it already in the document. The replica tries an
update that names a nested type as a parent on a copy first (``Replica.apply_update``;
``sync``'s ``PycrdtDocument`` likewise); these tests mutate real updates of documents with
nested types and check every refusal against the document's bytes before and after.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pycrdt import Array, Doc, Map, Text

import crdtstore
from crdtstore import InvalidUpdate, Replica
from crdtstore.codec import names_nested_parent
from sync._document import PycrdtDocument


def _base() -> Doc[Any]:
    doc: Doc[Any] = Doc(client_id=5)
    doc.get("notes", type=Map)["seed"] = "v"
    doc.get("log", type=Array).append("x")
    doc.get("body", type=Text).insert(0, "hello")
    doc.get("nest", type=Map)["inner"] = Map({"a": 1})
    return doc


def _edits(base: bytes, client: int, kinds: list[int]) -> list[bytes]:
    doc: Doc[Any] = Doc(client_id=client)
    doc.apply_update(base)
    out = []
    for kind in kinds:
        state = doc.get_state()
        if kind == 0:
            doc.get("notes", type=Map)["k"] = kind
        elif kind == 1:
            doc.get("log", type=Array).insert(0, "y")
        elif kind == 2:
            doc.get("body", type=Text).insert(1, "zz")
        elif kind == 3:
            doc.get("nest", type=Map)["inner"]["b"] = 2
        else:
            doc.get("nest", type=Map)[f"p{len(out)}"] = Map({"c": 3})
        out.append(bytes(doc.get_update(state)))
    return out


@st.composite
def _cases(draw: Any) -> tuple[list[bytes], bytes]:
    base = bytes(_base().get_update())
    kinds = draw(st.lists(st.integers(0, 4), min_size=1, max_size=4))
    edits = _edits(base, draw(st.integers(6, 60)), kinds)
    applied = [u for u in edits if draw(st.booleans())]
    target = bytearray(draw(st.sampled_from(edits)))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(target) - 1))
        target[i] = draw(st.integers(0, 255))
    return [base, *applied], bytes(target)


def test_an_update_naming_a_nested_parent_is_told_apart() -> None:
    base = bytes(_base().get_update())
    plain, nested = _edits(base, 7, [0, 3])
    assert not names_nested_parent(plain)
    assert names_nested_parent(nested)
    assert names_nested_parent(b"\x01")  # undecodable: cannot be told


def _half_applied(client: int) -> bytes:
    """A nested map set ``nest["p0"] = Map({"c": 3})`` whose second item (``c``) names the
    base document's first item (``notes["seed"]``, id 5#0, a value) as its parent instead of
    the new map (the fuzzers' finding)."""
    (valid,) = _edits(bytes(_base().get_update()), client, [4])
    child = bytes([0x28, 0x00, client, 0x00])  # ContentAny with a key, parent id (client, 0)
    assert valid.count(child) == 1
    return valid.replace(child, bytes([0x28, 0x00, 5, 0x00]))


_CLIENTS = [37, 14, 6]


def test_the_half_applied_update_is_what_pycrdt_half_applies() -> None:
    doc = _base()
    before = bytes(doc.get_update())
    with pytest.raises(RuntimeError, match="must be deleted or shared ref type"):
        doc.apply_update(_half_applied(37))
    assert bytes(doc.get_update()) != before  # (pycrdt 0.14.13: if this fails, it no longer)


@pytest.mark.parametrize("client", _CLIENTS)
def test_a_half_applied_update_is_refused_and_changes_nothing(client: int) -> None:
    update = _half_applied(client).hex()
    replica = Replica()
    replica.apply_update(bytes(_base().get_update()))
    before = bytes(replica.doc.get_update())
    with pytest.raises(InvalidUpdate, match="must be deleted or shared ref type"):
        replica.apply_update(bytes.fromhex(update))
    assert bytes(replica.doc.get_update()) == before
    document = PycrdtDocument(Doc())
    document.apply_update(bytes(_base().get_update()))
    before = bytes(document.doc.get_update())
    with pytest.raises(InvalidUpdate):
        document.apply_update(bytes.fromhex(update))
    assert bytes(document.doc.get_update()) == before


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_a_refused_mutated_update_changes_nothing(case: tuple[list[bytes], bytes]) -> None:
    history, target = case
    replica = Replica()
    for update in history:
        replica.apply_update(update)
    before = bytes(replica.doc.get_update())
    try:
        replica.apply_update(target)
    except InvalidUpdate:
        assert bytes(replica.doc.get_update()) == before


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.parametrize("client", _CLIENTS)
async def test_a_half_applied_foreign_update_is_not_journaled(client: int) -> None:
    """The hub's path (``Record.apply_update(writer=...)``): refused, the document and the
    journal as they were."""
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a") as rec:
            await rec.apply_update(bytes(_base().get_update()))
            await rec.flush()
            before = bytes(rec.replica.doc.get_update())
            entries = len(await store.journal("r"))
            with pytest.raises(InvalidUpdate):
                await rec.apply_update(
                    _half_applied(client), writer=crdtstore.Writer("plain", "user")
                )
            await rec.flush()
            assert bytes(rec.replica.doc.get_update()) == before
            assert len(await store.journal("r")) == entries
