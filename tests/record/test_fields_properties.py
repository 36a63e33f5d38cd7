"""Properties of merge="fields" maps: random concurrent patches from 2 to 6 replicas, random
delivery (shuffled, duplicated, merged in random batches, partial syncs as partitions):
replicas converge, no field is lost, per-field provenance is the same on every replica and
after resume and compaction."""

from __future__ import annotations

import random
from contextlib import AsyncExitStack
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import crdtstore
from crdtstore import CollectionSpec, FieldMap, tree_merge

pytestmark = pytest.mark.anyio

SCHEMA = {"m": CollectionSpec(kind="map", merge="fields")}
KEYS = ("e1", "e2", "e3")
FIELDS = ("status", "notes", "owner", "score")
# a fraction of the profile's examples: each one opens up to six stores
SETTINGS = settings(
    max_examples=max(8, settings.default.max_examples // 6),
    suppress_health_check=[HealthCheck.too_slow],
    deadline=None,
)

# (replica, key, field, value, remove?, sync after?)
PATCHES = st.lists(
    st.tuples(
        st.integers(0, 5),
        st.sampled_from(KEYS),
        st.sampled_from(FIELDS),
        st.integers(0, 99),
        st.integers(0, 9).map(lambda n: n == 0),
        st.booleans(),
    ),
    min_size=1,
    max_size=16,
)


async def deliver(src: crdtstore.Store, dst: crdtstore.Record, rng: random.Random) -> None:
    """``src``'s journal into ``dst``: shuffled, duplicated, in merged random batches, then
    (as every reconnect does, PYCRDT-NOTES hazard 1) the full state once, which repairs what
    an out-of-causal-order batch dropped."""
    everything = [e.update for e in await src.journal("r", limit=100_000)]
    updates = everything + rng.sample(everything, k=len(everything) // 2)
    rng.shuffle(updates)
    while updates:
        n = rng.randint(1, len(updates))
        batch, updates = updates[:n], updates[n:]
        await dst.apply_update(tree_merge(batch))
    if everything:
        await dst.apply_update(tree_merge(everything))


def fields_of(rec: crdtstore.Record) -> dict[str, Any]:
    return rec.map("m").to_json()


@SETTINGS
@given(n=st.integers(2, 6), seed=st.integers(0, 2**32 - 1), patches=PATCHES)
async def test_random_delivery_converges_and_loses_no_field(
    n: int, seed: int, patches: list[Any]
) -> None:
    """Separate stores, one per replica, joined only by shipping journal updates in random
    order: every field that was written and never removed is present on every replica,
    with a value some replica wrote to it."""
    rng = random.Random(seed)
    async with AsyncExitStack() as stack:
        stores = [
            await stack.enter_async_context(crdtstore.open_store("memory://")) for _ in range(n)
        ]
        recs = [
            await stack.enter_async_context(s.open_record(run="r", agent=f"a{i}", schema=SCHEMA))
            for i, s in enumerate(stores)
        ]
        written: dict[tuple[str, str], set[int]] = {}
        removed: set[tuple[str, str]] = set()
        for who, key, field, value, remove, sync_after in patches:
            m = recs[who % n].map("m")
            if remove:
                await m.patch(key, {}, remove=[field])
                removed.add((key, field))
            else:
                await m.patch(key, {field: value})
                written.setdefault((key, field), set()).add(value)
            if sync_after:  # a partial sync between one random pair: the rest is partitioned
                src, dst = rng.sample(range(n), 2)
                await recs[src].flush()
                await deliver(stores[src], recs[dst], rng)
        for r in recs:
            await r.flush()
        for src in range(n):
            for dst in range(n):
                if src != dst:
                    await deliver(stores[src], recs[dst], rng)
        views = [fields_of(r) for r in recs]
        assert all(v == views[0] for v in views), "replicas diverged"
        for (key, field), values in written.items():
            if (key, field) in removed:
                continue
            assert field in views[0].get(key, {}), f"field {key}.{field} lost"
            assert views[0][key][field] in values


def provenances(rec: crdtstore.Record) -> dict[tuple[str, str], Any]:
    m = rec.map("m")
    assert isinstance(m, FieldMap)
    out = {}
    for key in m:
        for field in m.fields(key):
            prov = m.provenance(key, field)
            assert prov is not None
            out[key, field] = (prov.agent, prov.seq, prov.wall_time)
    return out


@SETTINGS
@given(n=st.integers(2, 6), patches=PATCHES, compact_drop=st.booleans())
async def test_per_field_provenance_is_the_same_everywhere_and_after_resume_and_compaction(
    n: int, patches: list[Any], compact_drop: bool
) -> None:
    """Records of one store write concurrently (each syncs only when the schedule says so);
    afterwards every record, a freshly opened one, and one opened after compaction agree on
    the entries and on who wrote each field."""
    async with crdtstore.open_store("memory://") as store:
        recs = [
            await store.open_record(run="r", agent=f"a{i}", schema=SCHEMA).start() for i in range(n)
        ]
        try:
            alive: set[tuple[str, str]] = set()
            for who, key, field, value, remove, sync_after in patches:
                rec = recs[who % n]
                if remove:
                    await rec.map("m").patch(key, {}, remove=[field])
                else:
                    # values differ by writer: equal concurrent values are the known
                    # divergence pinned below
                    await rec.map("m").patch(key, {field: f"{who % n}:{value}"})
                    alive.add((key, field))
                if sync_after:
                    await rec.flush()
                    await rec.sync()
            for r in recs:
                await r.flush()
            for r in recs:
                await r.sync()
            views = [fields_of(r) for r in recs]
            assert all(v == views[0] for v in views), "replicas diverged"
            provs = [provenances(r) for r in recs]
            assert all(p == provs[0] for p in provs), "provenance diverged"
            for key, field in alive:
                hist = await recs[0].map("m").history(key, field)
                assert hist, f"no history of {key}.{field}"
            async with store.open_record(run="r", agent="late", schema=SCHEMA) as late:
                assert fields_of(late) == views[0]
                assert provenances(late) == provs[0]
            await store.compact("r", drop_journal=compact_drop)
            async with store.open_record(run="r", agent="later", schema=SCHEMA) as later:
                assert fields_of(later) == views[0]
                assert provenances(later) == provs[0]
        finally:
            for r in recs:
                await r.aclose()


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 6))
async def test_agents_creating_the_same_entry_at_once_never_lose_a_field(seed: int, n: int) -> None:
    """Every replica creates entry ``e`` at once with its own field and a shared one (by
    ``set`` of a whole dict, the way an agent would): every own field survives."""
    rng = random.Random(seed)
    async with AsyncExitStack() as stack:
        stores = [
            await stack.enter_async_context(crdtstore.open_store("memory://")) for _ in range(n)
        ]
        recs = [
            await stack.enter_async_context(s.open_record(run="r", agent=f"a{i}", schema=SCHEMA))
            for i, s in enumerate(stores)
        ]
        for i, r in enumerate(recs):
            await r.map("m").set("e", {f"f{i}": i, "title": f"by {i}"})
            await r.flush()
        order = [(s, d) for s in range(n) for d in range(n) if s != d]
        rng.shuffle(order)
        for src, dst in order:
            await deliver(stores[src], recs[dst], rng)
        for src, dst in order:  # a second round: what was relayed reaches everyone
            await deliver(stores[src], recs[dst], rng)
        views = [r.map("m")["e"] for r in recs]
        assert all(v == views[0] for v in views)
        assert {f"f{i}" for i in range(n)} <= set(views[0])
        assert views[0]["title"] in {f"by {i}" for i in range(n)}


async def test_concurrent_equal_values_name_the_same_writer_everywhere() -> None:
    """Two concurrent sets of one key to an equal value: every replica names the one latest
    in the journal (each named the other's entry: the replica that wrote the later one took
    the earlier as the batch's last equal write). Plain maps too, not only merge='fields'."""
    async with crdtstore.open_store("memory://") as store:
        async with (
            store.open_record(run="r", agent="a0") as a,
            store.open_record(run="r", agent="a1") as b,
        ):
            await a.map("m").set("k", 0)
            await b.map("m").set("k", 0)
            for r in (a, b):
                await r.flush()
            for r in (a, b):
                await r.sync()
            pa, pb = a.provenance("m", "k"), b.provenance("m", "k")
            assert pa is not None and pb is not None
            assert (pa.agent, pa.seq) == (pb.agent, pb.seq)
