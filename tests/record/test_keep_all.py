"""The keep_all conflict policy: a multi-value register over flat composite keys."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import crdtstore
from crdtstore import CollectionSpec, Conflict, tree_merge

pytestmark = pytest.mark.anyio

SCHEMA = {"facts": CollectionSpec(kind="map", conflict="keep_all")}


async def deliver(src: crdtstore.Store, dst: crdtstore.Record, rng: random.Random) -> None:
    """Everything in ``src``'s journal to ``dst``: shuffled, duplicated, in random batches,
    each batch merged then applied once; finished by a state-vector style full exchange."""
    updates = [e.update for e in await src.journal("r", limit=100_000)]
    updates = updates + rng.sample(updates, k=len(updates) // 2)  # duplicates
    rng.shuffle(updates)
    while updates:
        n = rng.randint(1, len(updates))
        batch, updates = updates[:n], updates[n:]
        await dst.apply_update(tree_merge(batch))


async def test_concurrent_writes_become_siblings_and_a_later_write_resolves() -> None:
    async with (
        crdtstore.open_store("memory://") as s1,
        crdtstore.open_store("memory://") as s2,
        s1.open_record(run="r", agent="alice", schema=SCHEMA) as a,
        s2.open_record(run="r", agent="bob", source="tool", schema=SCHEMA) as b,
    ):
        await a.map("facts").set("capital", "Sydney")
        await b.map("facts").set("capital", "Canberra")  # concurrent: neither saw the other
        await a.flush()
        await b.flush()
        rng = random.Random(1)
        await deliver(s2, a, rng)
        await deliver(s1, b, rng)
        for rec in (a, b):
            got = rec.map("facts").get("capital")
            assert isinstance(got, Conflict)
            assert sorted(got.values) == ["Canberra", "Sydney"]
            assert {(s.agent, s.source) for s in got.siblings} == {
                ("alice", "model"),
                ("bob", "tool"),
            }
        assert a.to_dict() == b.to_dict()
        assert "__conflict__" in a.to_dict()["facts"]["capital"]
        # a write that has seen both resolves them
        await b.map("facts").resolve("capital", "Canberra")
        await b.flush()
        await deliver(s2, a, rng)
        assert a.map("facts").get("capital") == "Canberra"
        assert b.map("facts").get("capital") == "Canberra"
        assert a.map("facts").keys() == ["capital"]


@given(
    seed=st.integers(0, 2**32 - 1),
    writes=st.lists(
        st.tuples(
            st.integers(0, 2), st.sampled_from(["k1", "k2"]), st.integers(0, 99), st.booleans()
        ),
        min_size=1,
        max_size=12,
    ),
)
async def test_no_concurrent_value_is_ever_lost(seed: int, writes: list[Any]) -> None:
    """Three replicas (separate stores) write keep_all keys, with partial syncs in between;
    whatever the delivery order, a value disappears only if a write that had seen it
    superseded it."""
    rng = random.Random(seed)
    async with (
        crdtstore.open_store("memory://") as s0,
        crdtstore.open_store("memory://") as s1,
        crdtstore.open_store("memory://") as s2,
    ):
        stores = [s0, s1, s2]
        recs = [
            await s.open_record(run="r", agent=f"a{i}", schema=SCHEMA).start()
            for i, s in enumerate(stores)
        ]
        try:
            written: dict[str, set[str]] = {"k1": set(), "k2": set()}  # tokens written
            superseded: set[str] = set()
            for who, key, value, sync_after in writes:
                m = recs[who].map("facts")
                superseded |= {s.token for s in m.siblings(key)}
                await m.set(key, f"{who}:{value}")
                written[key] |= {s.token for s in m.siblings(key)}
                if sync_after:  # a partial sync: one random pair
                    src, dst = rng.sample(range(3), 2)
                    await recs[src].flush()
                    await deliver(stores[src], recs[dst], rng)
            for r in recs:
                await r.flush()
            for src in range(3):
                for dst in range(3):
                    if src != dst:
                        await deliver(stores[src], recs[dst], rng)
            views = [r.to_dict() for r in recs]
            assert views[0] == views[1] == views[2], "replicas diverged"
            for key in ("k1", "k2"):
                alive = {s.token for s in recs[0].map("facts").siblings(key)}
                assert alive == written[key] - superseded, key
        finally:
            for r in recs:
                await r.aclose()


async def test_keep_all_is_only_for_plain_maps() -> None:
    async with crdtstore.open_store("memory://") as store:
        for spec in [
            CollectionSpec(kind="list", conflict="keep_all"),
            CollectionSpec(kind="map", conflict="keep_all", policy="guarded"),
        ]:
            with pytest.raises(crdtstore.InvalidValue):
                async with store.open_record(run="r", agent="a", schema={"x": spec}):
                    pass


def _fresh(facts: Any) -> Any:
    """A fresh handle of the same collection: its sibling groups built from the document."""
    from crdtstore.record._maps import KeepAllMap

    return KeepAllMap(facts._rec, facts.name, facts._root, facts._model)


@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["set_a", "set_b", "del_a", "deliver", "dict_a"]),
            st.sampled_from(["k0", "k1", "k2"]),
            st.integers(0, 3),
        ),
        max_size=25,
    ),
    seed=st.integers(0, 1000),
)
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_incremental_sibling_groups_match_a_rebuild(
    anyio_backend: str, steps: list[tuple[str, str, int]], seed: int
) -> None:
    """Issue 20: the groups follow the root map's events (local writes, deletes, remote
    updates); after every step, every read equals that of groups rebuilt from the document,
    and a cached read is never handed out for a key whose siblings changed."""
    rng = random.Random(seed)
    async with (
        crdtstore.open_store("memory://") as s1,
        crdtstore.open_store("memory://") as s2,
        s1.open_record(run="r", agent="alice", schema=SCHEMA) as a,
        s2.open_record(run="r", agent="bob", schema=SCHEMA) as b,
    ):
        fa, fb = a.map("facts"), b.map("facts")
        for op, key, v in steps:
            if op == "set_a":
                await fa.set(key, v)
            elif op == "dict_a":
                await fa.set(key, {"v": v})
            elif op == "set_b":
                await fb.set(key, f"b{v}")
            elif op == "del_a":
                await fa.delete(key)
            else:
                await b.flush()
                await deliver(s2, a, rng)
            fresh = _fresh(fa)
            assert {k: fa.get(k) for k in fa} == {k: fresh.get(k) for k in fresh}
            assert len(fa) == len(fresh)
            for k in ("k0", "k1", "k2"):
                assert fa.siblings(k) == fresh.siblings(k)


async def test_a_read_of_mutable_siblings_is_a_fresh_copy() -> None:
    """Reads of plain values may be cached (issue 20); a sibling holding a dict is built
    again for every read, so that changing what one read returned changes no other."""
    async with (
        crdtstore.open_store("memory://") as s1,
        crdtstore.open_store("memory://") as s2,
        s1.open_record(run="r", agent="alice", schema=SCHEMA) as a,
        s2.open_record(run="r", agent="bob", schema=SCHEMA) as b,
    ):
        await a.map("facts").set("k", {"n": 1})
        await b.map("facts").set("k", "plain")
        await b.flush()
        await deliver(s2, a, random.Random(3))
        got = a.map("facts").get("k")
        assert isinstance(got, Conflict)
        for s in got.siblings:
            if isinstance(s.value, dict):
                s.value["n"] = 99
        again = a.map("facts").get("k")
        assert {"n": 1} in again.values


async def test_reads_inside_a_transaction_see_its_writes() -> None:
    """The root map's events come when a transaction ends; the groups see a write inside
    one at once (a second write of the key resolves the first, a read shows the latest)."""
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record(run="r", agent="alice", schema=SCHEMA) as rec,
    ):
        facts = rec.map("facts")
        async with rec.transaction():
            await facts.set("k", 1)
            assert facts.get("k") == 1
            await facts.set("k", 2)
            assert facts.get("k") == 2
            assert await facts.delete("k")
            assert "k" not in facts
            await facts.set("k", 3)
        assert facts.get("k") == 3
        assert len(facts.siblings("k")) == 1
