"""The fused path of ``apply_external`` (the usual update: map entries only, nothing to
register) gives what the general path gives: the same effects, document, provenance and
journal entries; updates it cannot take (registry writes, roots to register, list and text
items, unknown origins, refused bytes, policies) still go the general way.

Plain pycrdt ``Doc`` s with chosen client ids stand in for Yjs clients.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycrdt import Array, Doc, Map, Text, merge_updates

import crdtstore
from crdtstore import InvalidUpdate, PolicyViolation, Writer
from crdtstore.record._document import REGISTRY
from crdtstore.record._provenance import Meta
from crdtstore.record._replica import Replica

pytestmark = pytest.mark.anyio
CLIENTS = (7, 2**40, 123456789)


def meta(agent: str) -> Meta:
    return Meta(agent, "tool", 0.0, None)


def _update(doc: Doc[Any], edit: Any) -> bytes:
    state = doc.get_state()
    with doc.transaction():
        edit(doc)
    return doc.get_update(state)


EDITS = st.one_of(
    st.tuples(st.just("set"), st.sampled_from("mn"), st.sampled_from("abc"), st.integers(0, 9)),
    st.tuples(st.just("del"), st.sampled_from("mn"), st.sampled_from("abc")),
    st.tuples(st.just("nested"), st.sampled_from("abc")),
    st.tuples(st.just("list"), st.integers(0, 9)),
    st.tuples(st.just("text"), st.sampled_from(["x", "yz", "é"])),
    st.tuples(st.just("register"), st.sampled_from(["x", "m"])),
    st.tuples(st.just("two"), st.sampled_from("abc"), st.sampled_from("abc")),
)


def _edit(doc: Doc[Any], edit: tuple[Any, ...], n: int) -> None:
    kind = edit[0]
    if kind == "set":
        doc.get(edit[1], type=Map)[edit[2]] = f"v{edit[3]}-{n}"
    elif kind == "del":
        root = doc.get(edit[1], type=Map)
        if edit[2] in root:
            del root[edit[2]]
        else:
            root[edit[2]] = n
    elif kind == "nested":
        doc.get("m", type=Map)[edit[1]] = Map({"n": n})
    elif kind == "list":
        doc.get("l", type=Array).append(edit[1])
    elif kind == "text":
        doc.get("t", type=Text).insert(0, edit[1])
    elif kind == "register":
        doc.get(REGISTRY, type=Map)[edit[1]] = "map"
    else:  # two sets in one update
        root = doc.get("m", type=Map)
        root[edit[1]] = f"p{n}"
        root[edit[2]] = f"q{n}"


def _replicas() -> tuple[Replica, Replica, bytes]:
    seed: Doc[Any] = Doc(client_id=1)
    with seed.transaction():
        registry = seed.get(REGISTRY, type=Map)
        registry["m"], registry["l"], registry["t"] = "map", "list", "text"
        seed.get("m", type=Map)["a"] = "seed"
    update = seed.get_update()
    fused, general = Replica(), Replica()
    general.fused = False
    for r in (fused, general):
        r.apply_external(update, meta("seed"), register=True)
    return fused, general, update


@given(
    st.lists(st.tuples(st.integers(0, 2), EDITS, st.integers(0, 3)), min_size=1, max_size=25),
    st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_the_fused_path_gives_what_the_general_one_gives(
    steps: list[tuple[int, tuple[Any, ...], int]], register: bool
) -> None:
    """Clients edit concurrently (sometimes syncing with another first: LWW losers, deletes
    of entries an update does not name, unknown origins), their updates reach a fused and a
    general replica in the order made, some twice or merged: every effect, delta, document,
    provenance and item index is the same on both."""
    fused, general, seed = _replicas()
    clients = [Doc(client_id=c) for c in CLIENTS]
    for c in clients:
        c.apply_update(seed)
    made: list[bytes] = []
    for n, (who, edit, sync) in enumerate(steps):
        client = clients[who]
        if sync < len(clients) and sync != who:  # catch up with another client first
            client.apply_update(clients[sync].get_update(client.get_state()))
        made.append(_update(client, lambda d, edit=edit, n=n: _edit(d, edit, n)))
        deliveries = [made[-1]]
        if sync == 3 and len(made) > 1:  # a duplicate, or a merge of what came so far
            deliveries.append(made[n // 2] if who else merge_updates(*made))
        for update in deliveries:
            got = fused.apply_external(update, meta(f"c{who}"), register=register)
            want = general.apply_external(update, meta(f"c{who}"), register=register)
            assert got[0] == want[0]
            assert (got[1] is None) == (want[1] is None)
            if not fused.external_registered:  # (else its own transaction: its client id)
                assert got[1] == want[1]
            assert fused.external_registered == general.external_registered
            assert _content(fused) == _content(general)
            assert fused.index == general.index
            assert fused.items.export() == general.items.export()
            assert fused.collections() == general.collections()


def _content(replica: Replica) -> dict[str, Any]:
    """The collections' content (nested shared types as their plain content)."""
    out: dict[str, Any] = {}
    for name, kind in replica.collections().items():
        root = replica.root(name, kind)
        out[name] = str(root) if kind == "text" else root.to_py()
    return out


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    taken: list[bytes] = []
    real = Replica._apply_maps

    def spy(self: Replica, update: bytes, *args: Any) -> Any:
        taken.append(update)
        return real(self, update, *args)

    monkeypatch.setattr(Replica, "_apply_maps", spy)
    return taken


def test_only_map_entries_with_nothing_to_register_take_the_fused_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = _spy(monkeypatch)
    replica, _, seed = _replicas()
    client: Doc[Any] = Doc(client_id=CLIENTS[0])
    client.apply_update(seed)
    plain = [
        _update(client, lambda d: d.get("m", type=Map).__setitem__("a", "x")),  # overwrite
        _update(client, lambda d: d.get("m", type=Map).__setitem__("z", 1)),  # a new key
        _update(client, lambda d: d.get("m", type=Map).__delitem__("z")),
    ]
    general = [
        _update(client, lambda d: d.get(REGISTRY, type=Map).__setitem__("x", "map")),
        _update(client, lambda d: d.get("l", type=Array).append(1)),
        _update(client, lambda d: d.get("t", type=Text).insert(0, "hi")),
        _update(client, lambda d: d.get("u", type=Map).__setitem__("k", 1)),  # to register
    ]
    other: Doc[Any] = Doc(client_id=CLIENTS[1])
    other.apply_update(client.get_update())
    unseen = _update(other, lambda d: d.get("m", type=Map).__setitem__("q", 1))
    after_unseen = _update(other, lambda d: d.get("m", type=Map).__setitem__("q", 2))
    for update in plain + general:
        replica.apply_external(update, meta("c"), register=True)
    # an origin the document does not hold yet (its update comes later): the general path;
    # the update it waits for is a plain set (yrs integrates both in its transaction)
    replica.apply_external(after_unseen, meta("o"), register=True)
    replica.apply_external(unseen, meta("o"), register=True)
    assert taken == [*plain, unseen]
    assert replica.to_dict()["m"] == {"a": "x", "q": 2.0}
    assert replica.to_dict()["u"] == {"k": 1.0}


def test_bytes_refused_on_the_fused_path_leave_the_document_and_index_as_they_were() -> None:
    replica, _, seed = _replicas()
    client: Doc[Any] = Doc(client_id=CLIENTS[0])
    client.apply_update(seed)
    good = _update(client, lambda d: d.get("m", type=Map).__setitem__("a", "x"))
    with pytest.raises(InvalidUpdate):
        replica.apply_external(good[:-1] + b"\xff", meta("c"))
    before = replica.to_dict()
    assert replica.apply_external(good, meta("c"))[0] == [["map", "m", "set", "a", "x"]]
    assert replica.to_dict() != before and replica.meta("m", "a") == meta("c")


@pytest.mark.parametrize("fused", [True, False])
async def test_hub_writes_journal_the_same_entries_either_way(
    fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through ``Record.apply_update`` as a hub calls it (a writer per connection, the bytes
    checked first): the journal entries (agent, source, bytes, effect), provenance and
    history; an update a policy refuses is refused (nothing journaled)."""
    monkeypatch.setattr(Replica, "fused", fused)
    client: Doc[Any] = Doc(client_id=CLIENTS[0])
    updates = [
        _update(client, lambda d: d.get(REGISTRY, type=Map).__setitem__("m", "map")),
        _update(client, lambda d: d.get("m", type=Map).__setitem__("a", "x")),
        _update(client, lambda d: d.get("m", type=Map).__setitem__("a", "y")),
        _update(client, lambda d: d.get("m", type=Map).__delitem__("a")),
        _update(client, lambda d: d.get("m", type=Map).__setitem__("b", 2)),
    ]
    writer = Writer("w", "user")
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record("r", "hub", "system") as rec:
            for update in updates:
                rec.replica.check_update(update)
                await rec.apply_update(update, writer=writer, checked=True)
            await rec.flush()
            prov = rec.map("m").provenance("b")
            assert prov is not None and (prov.agent, prov.source) == ("w", "user")
        entries = await store.journal("r")
        got = [(e.agent, e.source, e.update, e.effect) for e in entries]
        assert got == [
            ("w", "user", updates[0], []),
            ("w", "user", updates[1], [["map", "m", "set", "a", "x"]]),
            ("w", "user", updates[2], [["map", "m", "set", "a", "y"]]),
            ("w", "user", updates[3], [["map", "m", "del", "a"]]),
            ("w", "user", updates[4], [["map", "m", "set", "b", 2.0]]),
        ]
        history = await store.history("r", "m", "a")
        assert [h.value for h in history][:2] == ["x", "y"]
        # a policy (append_only: no overwrite) is checked before the fused apply
        schema = {"m": crdtstore.CollectionSpec(kind="map", policy="append_only")}
        async with store.open_record(run="p", agent="hub", schema=schema) as rec:
            await rec.map("m").set("a", "first")
            await rec.flush()
            client = Doc(client_id=CLIENTS[1])
            client.apply_update(rec.replica.doc.get_update())
            overwrite = _update(client, lambda d: d.get("m", type=Map).__setitem__("a", "no"))
            with pytest.raises(PolicyViolation):
                await rec.apply_update(overwrite, writer=writer)
            assert rec.map("m").get("a") == "first"
