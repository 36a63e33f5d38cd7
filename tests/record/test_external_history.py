"""External updates' effects are read from the update bytes: every map set an update carries is
in its journaled effect (so in ``history``), the LWW losers included, while provenance names
only the value the document shows (issue 2 item 6, issue 5).

A bare pycrdt ``Doc`` with a chosen client id stands in for a Yjs client (concurrent sets of
one key are won by the higher client id, PYCRDT-NOTES hazard 5).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycrdt import Array, Doc, Map, Text, merge_updates

import crdtstore
from crdtstore import InvalidUpdate
from crdtstore.codec import CodecError as UpdateDecodeError
from crdtstore.codec import KeyIndex, decode_update
from crdtstore.record._document import REGISTRY
from crdtstore.record._provenance import Meta
from crdtstore.record._pycrdt import DirectTransaction
from crdtstore.record._replica import Replica
from tests.network.test_sync_hub import RUN, TENANT, running_hub, token

pytestmark = pytest.mark.anyio
DEADLINE = 10.0
HIGH, LOW = 2**40, 7  # client ids: HIGH wins a concurrent set of one key


def plain_set(client_id: int, key: str, value: Any, *, registry: bool = False) -> bytes:
    """The update of a fresh Yjs client setting ``m[key] = value`` (and registering ``m``)."""
    doc: Doc[Any] = Doc(client_id=client_id)
    with doc.transaction():
        if registry:
            doc.get(REGISTRY, type=Map)["m"] = "map"
        doc.get("m", type=Map)[key] = value
    return doc.get_update()


def meta(agent: str) -> Meta:
    return Meta(agent, "tool", 0.0, None)


# -- the bug: an LWW loser delivered last was missing from the effect --------------------------


async def test_an_lww_loser_applied_last_is_in_history_and_provenance_names_the_winner() -> None:
    winner, loser = plain_set(HIGH, "k", "W"), plain_set(LOW, "k", "L")
    async with crdtstore.open_store("memory://") as store:
        async with (
            store.open_record("r", "winner", "tool") as w,
            store.open_record("r", "loser", "tool") as lo,
        ):
            await w.apply_update(winner)
            await w.flush()
            await lo.sync()
            assert lo.map("m").get("k") == "W"
            await lo.apply_update(loser)  # loses LWW: the document still shows "W"
            await lo.flush()
            assert lo.map("m").get("k") == "W"
            prov = lo.map("m").provenance("k")
            assert prov is not None and prov.agent == "winner"
        history = await store.history("r", "m", "k")
        assert [(h.value, h.provenance.agent) for h in history] == [("W", "winner"), ("L", "loser")]
        replayed = await store.replay("r")
        assert replayed.to_dict() == {"m": {"k": "W"}}
        got = replayed.meta("m", "k")
        assert got is not None and got.agent == "winner"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the hub runs on websockets' asyncio
async def test_an_lww_loser_through_the_hub_is_in_history(tmp_path: Path) -> None:
    """The loser's write reaches the hub as its sync step 2 (an offline edit made before it
    connected), after the winner's: it is journaled with its effect, under its token's agent."""
    async with running_hub(tmp_path) as hub:
        async with hub.peer(token("winner"), Doc(client_id=HIGH)) as w:
            await w.set("k", "W")
            await w.flush()
        offline: Doc[Any] = Doc(client_id=LOW)
        with offline.transaction():
            offline.get(REGISTRY, type=Map)["notes"] = "map"
            offline.get("notes", type=Map)["k"] = "L"
        async with hub.peer(token("loser"), offline) as lo:
            await lo.flush()
            await lo.wait(lambda: lo.notes().get("k") == "W")
        await hub.wait_unloaded()
        async with crdtstore.open_store(hub.store_url, tenant=TENANT) as store:
            history = await store.history(RUN, "notes", "k")
            assert [(h.value, h.provenance.agent) for h in history] == [
                ("W", "winner"),
                ("L", "loser"),
            ]
            replayed = await store.replay(RUN)
            got = replayed.meta("notes", "k")
            assert got is not None and got.agent == "winner"


def test_replica_effect_lists_the_loser_and_index_keeps_the_winner() -> None:
    replica = Replica()
    ops, _ = replica.apply_external(plain_set(HIGH, "k", "W"), meta("w"), register=True)
    assert ops == [["map", "m", "set", "k", "W"]]
    ops, delta = replica.apply_external(plain_set(LOW, "k", "L"), meta("l"), register=True)
    assert ops == [["map", "m", "set", "k", "L"]]
    assert delta is not None
    assert replica.to_dict() == {"m": {"k": "W"}}
    got = replica.meta("m", "k")
    assert got is not None and got.agent == "w"
    # the same bytes again: nothing new, no effect, provenance unchanged
    assert replica.apply_external(plain_set(LOW, "k", "L"), meta("x"))[0] == []
    got = replica.meta("m", "k")
    assert got is not None and got.agent == "w"


# -- the decoder ---------------------------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(st.lists(st.tuples(st.sampled_from("abc"), JSON), min_size=1, max_size=6))
@settings(max_examples=200, deadline=None)
def test_decoded_values_are_what_pycrdt_shows(sets: list[tuple[str, Any]]) -> None:
    """A map entry's value read from the bytes equals the value pycrdt reads from a document
    (ints as floats, as pycrdt has them), whichever client wrote it."""
    doc: Doc[Any] = Doc()
    root = doc.get("m", type=Map)
    for key, value in sets:
        before = doc.get_state()
        root[key] = value
        update = doc.get_update(before)
        (entry,) = decode_update(update).entries
        assert entry.content == 8
        assert entry.value == root[key]
        assert type(entry.value) is type(root[key])


def lib0_update(content: bytes) -> bytes:
    """A v1 update of client 3 setting ``m["k"]`` to lib0 ``any`` content (one value)."""
    return bytes([1, 1, 3, 0, 0x28, 1, 1]) + b"m" + bytes([1]) + b"k" + bytes([1]) + content + b"\0"


@pytest.mark.parametrize(
    "content",
    [
        bytes([125, 5]),  # var-int 5 (a Yjs client's integer)
        bytes([125, 0x45]),  # -5
        bytes([125, 0xBF, 0x7F]),  # a two-byte var-int
        bytes([124, 0x3F, 0xC0, 0, 0]),  # float32 1.5
        bytes([122]) + (2**60).to_bytes(8, "big"),  # bigint
        bytes([127]),  # undefined
        bytes([126]),  # null
        bytes([121]),
        bytes([120]),
        bytes([119, 2]) + "é".encode(),
        bytes([118, 1, 1]) + b"a" + bytes([125, 3]),
        bytes([117, 2, 120, 126]),
        bytes([116, 2, 1, 2]),  # Uint8Array
    ],
)
def test_decoded_lib0_values_are_what_pycrdt_shows(content: bytes) -> None:
    update = lib0_update(content)
    doc: Doc[Any] = Doc()
    doc.apply_update(update)
    (entry,) = decode_update(update).entries
    shown = doc.get("m", type=Map)["k"]
    assert entry.value == shown and type(entry.value) is type(shown)


@given(st.binary(max_size=64))
def test_decode_update_raises_only_its_typed_error(data: bytes) -> None:
    with contextlib.suppress(UpdateDecodeError):
        decode_update(data)


def test_decode_update_refuses_truncated_updates() -> None:
    update = plain_set(HIGH, "k", {"v": [1, "x"]})
    for cut in range(1, len(update)):
        with pytest.raises(UpdateDecodeError):
            decode_update(update[:cut])


def test_key_index_adds_runs_once_and_finds_overlaps() -> None:
    keys = KeyIndex()
    a, b = ("m", "a"), ("m", "b")
    assert keys.add(1, 5, 1, a) and keys.add(1, 6, 1, a)  # merged into one run
    assert len(keys) == 1
    assert not keys.add(1, 5, 1, a)  # known
    assert keys.add(1, 0, 2, b)  # before the runs known
    assert keys.add(1, 3, 4, b)  # partly known: only 3..4 added
    assert keys.find(1, 4) == b and keys.find(1, 6) == a and keys.find(1, 2) is None
    assert keys.find(2, 0) is None
    assert [r[2] for r in keys.overlapping(1, 1, 5)] == [b, b, a]
    assert keys.copy().find(1, 0) == b


# -- effects ---------------------------------------------------------------------------------------


def test_deletes_duplicates_and_overwrites_by_origin() -> None:
    """An overwrite names only its origin (the key is not in its bytes) and a delete only the
    ids: both are read through the key index, also for entries this replica wrote itself."""
    client = Doc(client_id=HIGH)
    replica = Replica()
    m = client.get("m", type=Map)
    state = client.get_state()

    def since() -> bytes:
        nonlocal state
        update = client.get_update(state)
        state = client.get_state()
        return update

    m["a"] = 1
    first = since()
    assert replica.apply_external(first, meta("c"), register=True)[0] == [
        ["map", "m", "set", "a", 1.0]
    ]
    # a local write of this replica, then the client overwrites it (origin: our entry)
    meta_local = meta("local")
    replica.local(
        [["map", "m", "set", "b", "mine"]],
        lambda: replica.root("m", "map").__setitem__("b", "mine"),
        meta_local,
    )
    client.apply_update(replica.doc.get_update(client.get_state()))
    state = client.get_state()
    m["b"] = "theirs"
    m["a"] = 2
    ops, _ = replica.apply_external(since(), meta("c"))
    assert sorted(ops) == [["map", "m", "set", "a", 2.0], ["map", "m", "set", "b", "theirs"]]
    assert replica.meta("m", "b") == meta("c")
    del m["a"]
    ops, _ = replica.apply_external(since(), meta("d"))
    assert ops == [["map", "m", "del", "a"]]
    assert replica.meta("m", "a") == meta("d") and replica.to_dict() == {"m": {"b": "theirs"}}
    # duplicates, one by one and merged: nothing new
    assert replica.apply_external(first, meta("x"))[0] == []
    assert replica.apply_external(client.get_update(), meta("x"))[0] == []
    assert replica.meta("m", "b") == meta("c")


def test_a_set_and_delete_in_one_update_and_a_delete_that_lost() -> None:
    replica = Replica()
    replica.apply_external(plain_set(LOW, "k", "v"), meta("a"), register=True)
    # set then deleted in one transaction: the key was there, it is gone: one delete
    client: Doc[Any] = Doc(client_id=HIGH)
    client.apply_update(replica.doc.get_update())
    before = client.get_state()
    with client.transaction():
        client.get("m", type=Map)["k"] = "w"
        del client.get("m", type=Map)["k"]
    ops, _ = replica.apply_external(client.get_update(before), meta("b"))
    assert ops == [["map", "m", "del", "k"]] and replica.to_dict() == {"m": {}}
    # a delete of an entry that is no longer the visible one (a concurrent set won): no op
    r2 = Replica()
    r2.apply_external(plain_set(LOW, "k", "v"), meta("a"), register=True)
    deleter: Doc[Any] = Doc(client_id=5)
    deleter.apply_update(r2.doc.get_update())
    before = deleter.get_state()
    del deleter.get("m", type=Map)["k"]
    deletion = deleter.get_update(before)
    r2.apply_external(plain_set(HIGH, "k", "new"), meta("w"))
    assert r2.apply_external(deletion, meta("d"))[0] == []
    assert r2.to_dict() == {"m": {"k": "new"}} and r2.meta("m", "k") == meta("w")


def test_nested_values_won_are_read_and_lost_are_empty() -> None:
    replica = Replica()
    replica.apply_external(plain_set(HIGH, "k", "W"), meta("w"), register=True)
    ops, _ = replica.apply_external(plain_set(LOW, "k", Map({"x": 1})), meta("l"))
    assert ops == [["map", "m", "set", "k", {}]]  # lost: recorded empty
    ops, _ = replica.apply_external(plain_set(HIGH + 1, "n", Array([1, 2])), meta("n"))
    assert ops == [["map", "m", "set", "n", [1.0, 2.0]]]  # won: read from the document
    ops, _ = replica.apply_external(plain_set(HIGH + 2, "t", Text("hi")), meta("t"))
    assert ops == [["map", "m", "set", "t", "hi"]]


def test_text_and_list_edits_next_to_map_sets_keep_their_effects() -> None:
    client = Doc(client_id=HIGH)
    replica = Replica()
    state = client.get_state()
    with client.transaction():
        client.get("l", type=Array).extend([1, 2])
        client.get("t", type=Text).insert(0, "ab")
        client.get("m", type=Map)["k"] = 1
    replica.apply_external(client.get_update(state), meta("c"), register=True)
    state = client.get_state()
    with client.transaction():
        client.get("l", type=Array).append(3)  # (an append names no root: it has an origin)
        del client.get("t", type=Text)[0:1]
        client.get("m", type=Map)["k"] = 2
    ops, _ = replica.apply_external(client.get_update(state), meta("c"))
    assert sorted(ops, key=str) == sorted(
        [["list", "l", "ins", 2, [3.0]], ["text", "t", "del", 0, 1], ["map", "m", "set", "k", 2.0]],
        key=str,
    )


# -- the property ----------------------------------------------------------------------------------


class _Update(NamedTuple):
    source: int
    n: int  # its position among the source's updates
    update: bytes
    deps: tuple[int, ...]  # how many updates of each replica the source had applied


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_every_set_is_in_one_effect_and_the_index_names_the_visible_winner(
    data: st.DataObject,
) -> None:
    """Replicas (2-4) set and delete keys of one map concurrently; their updates reach every
    other replica through ``apply_external`` in a random causal order (a replica's updates in
    order, after what it had seen), with duplicates and merged re-deliveries. Each set a
    replica made is in exactly one effect derived at every other replica (LWW losers
    included), the keys an update made disappear are its delete ops, and the provenance index
    names the writer of the value each replica's document shows."""
    n = data.draw(st.integers(2, 4), label="replicas")
    replicas = [Replica() for _ in range(n)]
    for r in replicas:  # register "m" everywhere first (the registry is not under test)
        r.local(
            [["map", "m", "set", "_", "init"]],
            lambda r=r: r.root("m", "map").__setitem__("_", "init"),
            meta("init"),
        )
    seed = [r.doc.get_update() for r in replicas]
    for r in replicas:
        for u in seed:
            r.apply_update(u)
    outbox: list[list[_Update]] = [[] for _ in range(n)]
    applied = [[0] * n for _ in range(n)]  # applied[i][j]: updates of j that i applied
    writer: dict[str, str] = {"init": "init"}  # value -> agent that wrote it
    made: list[set[str]] = [set() for _ in range(n)]  # values each replica set
    seen: list[list[str]] = [[] for _ in range(n)]  # values in the effects derived at each
    counter = 0

    def check_index(i: int) -> None:
        replica = replicas[i]
        for key, value in replica.root("m", "map").items():
            got = replica.meta("m", key)
            assert got is not None and got.agent == writer[value], (key, value, got)

    def deliver(i: int, up: _Update) -> None:
        root = replicas[i].root("m", "map")
        had = set(root.keys())
        ops, _ = replicas[i].apply_external(up.update, meta(f"r{up.source}"), checked=False)
        deleted = []
        for op in ops:
            assert op[:2] == ["map", "m"]
            if op[2] == "set":
                seen[i].append(op[4])
            else:
                deleted.append(op[3])
        # a delete op for exactly the keys the update made disappear
        assert sorted(deleted) == sorted(had - set(root.keys()))
        check_index(i)

    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        i = data.draw(st.integers(0, n - 1))
        action = data.draw(st.sampled_from(["set", "set", "del", "deliver", "deliver", "dup"]))
        replica = replicas[i]
        root = replica.root("m", "map")
        if action in ("set", "del"):
            key = data.draw(st.sampled_from("abc"))
            if action == "set":
                counter += 1
                value = f"r{i}-{counter}"
                writer[value] = f"r{i}"
                made[i].add(value)
                ops = [["map", "m", "set", key, value]]
                update = replica.local(
                    ops,
                    lambda root=root, key=key, value=value: root.__setitem__(key, value),
                    meta(f"r{i}"),
                )
            elif key in root:
                ops = [["map", "m", "del", key]]
                update = replica.local(
                    ops, lambda root=root, key=key: root.__delitem__(key), meta(f"r{i}")
                )
            else:
                continue
            assert update is not None
            applied[i][i] += 1
            outbox[i].append(_Update(i, len(outbox[i]), update, tuple(applied[i])))
            check_index(i)
        elif action == "deliver":
            ready = [
                box[applied[i][j]]
                for j, box in enumerate(outbox)
                if j != i
                and applied[i][j] < len(box)
                and all(applied[i][k] >= box[applied[i][j]].deps[k] for k in range(n) if k != j)
            ]
            if ready:
                up = data.draw(st.sampled_from(ready))
                deliver(i, up)
                applied[i][up.source] += 1
        else:  # a duplicate: one update again, or the merge of all of a source's applied
            done = [(j, applied[i][j]) for j in range(n) if j != i and applied[i][j]]
            if done:
                j, count = data.draw(st.sampled_from(done))
                if data.draw(st.booleans()):
                    update = merge_updates(*(u.update for u in outbox[j][:count]))
                else:
                    update = outbox[j][data.draw(st.integers(0, count - 1))].update
                before = len(seen[i])
                deliver(i, _Update(j, -1, update, ()))
                assert len(seen[i]) == before
    # drain: everything, in a causal order
    moved = True
    while moved:
        moved = False
        for i in range(n):
            for j in range(n):
                while j != i and applied[i][j] < len(outbox[j]):
                    up = outbox[j][applied[i][j]]
                    if any(applied[i][k] < up.deps[k] for k in range(n) if k != j):
                        break
                    deliver(i, up)
                    applied[i][j] += 1
                    moved = True
    for i in range(n):
        expected = set().union(*(made[j] for j in range(n) if j != i))
        assert sorted(seen[i]) == sorted(expected)  # each exactly once
    docs = [r.to_dict() for r in replicas]
    assert all(d == docs[0] for d in docs)


def test_an_update_the_decoder_cannot_read_takes_the_observed_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bytes pycrdt reads but this decoder does not (a content type it does not know) still
    apply, with the effect the document's events show; the next readable update finds its
    keys again (the key index catches up with the document)."""
    import crdtstore.record._external as replica_module

    def refuse(update: bytes) -> Any:
        raise UpdateDecodeError("unknown content ref 11")

    replica = Replica()
    replica.apply_external(plain_set(LOW, "k", "v"), meta("a"), register=True)
    client: Doc[Any] = Doc(client_id=HIGH)
    client.apply_update(replica.doc.get_update())
    state = client.get_state()
    client.get("m", type=Map)["k"] = "w"
    overwrite = client.get_update(state)
    with monkeypatch.context() as patch:
        patch.setattr(replica_module, "decode_update", refuse)
        ops, _ = replica.apply_external(overwrite, meta("b"))
    assert ops == [["map", "m", "set", "k", "w"]] and replica.meta("m", "k") == meta("b")
    state = client.get_state()
    del client.get("m", type=Map)["k"]
    ops, _ = replica.apply_external(client.get_update(state), meta("c"))
    assert ops == [["map", "m", "del", "k"]] and replica.meta("m", "k") == meta("c")


def test_bytes_the_document_refuses_leave_no_entry_known(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key index reads an update's entries before pycrdt applies it: when pycrdt refuses
    the bytes, the same entries arriving again are still new (and have their effect)."""
    replica = Replica()
    replica.apply_external(plain_set(LOW, "k", "v"), meta("a"), register=True)
    update = plain_set(HIGH, "k", "w")
    with monkeypatch.context() as patch:
        refuse = lambda *a, **k: (_ for _ in ()).throw(InvalidUpdate("no"))  # noqa: E731
        patch.setattr(Replica, "apply_update", refuse)
        patch.setattr(DirectTransaction, "apply", refuse)  # (the fused path's apply)
        with pytest.raises(InvalidUpdate):
            replica.apply_external(update, meta("b"))
    ops, _ = replica.apply_external(update, meta("b"))
    assert ops == [["map", "m", "set", "k", "w"]] and replica.meta("m", "k") == meta("b")


@pytest.mark.parametrize("text", ["abc", "a🙂é日"])
def test_clocks_after_text_count_utf16_units(text: str) -> None:
    """A string item's length (its clocks) is in UTF-16 units, as Yjs counts: the map entry
    the same client writes next has the clock right after it, and its overwrite (named by
    that id) is found."""
    client: Doc[Any] = Doc(client_id=HIGH)
    with client.transaction():
        client.get("t", type=Text).insert(0, text)
        client.get("m", type=Map)["k"] = 1
    (entry,) = decode_update(client.get_update()).entries
    assert entry.clock == len(text.encode("utf-16-le")) // 2
    replica = Replica()
    replica.apply_external(client.get_update(), meta("a"), register=True)
    state = client.get_state()
    client.get("m", type=Map)["k"] = 2
    assert replica.apply_external(client.get_update(state), meta("b"))[0] == [
        ["map", "m", "set", "k", 2.0]
    ]
