"""Property tests of the semantics: guarded writes against a sequential model, and
append-only logs under random delivery order."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import crdtstore
from crdtstore import CollectionSpec, PolicyViolation, StaleVersion, tree_merge

pytestmark = pytest.mark.anyio


@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 1),  # which record writes
            st.sampled_from(["a", "b"]),  # key
            st.sampled_from(["fresh", "stale", "zero", "sync-first"]),  # version it offers
        ),
        min_size=1,
        max_size=25,
    )
)
async def test_guarded_writes_match_a_sequential_model(steps: list[tuple[int, str, str]]) -> None:
    """Each guarded write succeeds exactly when the version it offers is the key's current
    version at the authority; the model is a dict of (version, value)."""
    schema = {"g": CollectionSpec(kind="map", policy="guarded")}
    model: dict[str, tuple[int, Any]] = {}
    async with crdtstore.open_store("memory://") as store:
        recs = [
            await store.open_record(run="r", agent=f"a{i}", schema=schema).start() for i in range(2)
        ]
        try:
            for n, (who, key, offer) in enumerate(steps):
                rec = recs[who]
                if offer == "sync-first":
                    await rec.sync()
                _, seen = rec.map("g").get_versioned(key)
                current = model.get(key, (0, None))[0]
                version = {
                    "fresh": current,
                    "stale": max(current - 1, 0) if current else 1,
                    "zero": 0,
                    "sync-first": seen or 0,
                }[offer]
                value = f"{who}:{n}"
                try:
                    await rec.map("g").set(key, value, expected_version=version)
                except StaleVersion as err:
                    assert version != current, "refused although current"
                    assert err.current_version == current, "refusal carries a stale version"
                    assert err.current_value == model.get(key, (0, None))[1]
                    continue
                assert version == current, "accepted although stale"
                _, new_version = rec.map("g").get_versioned(key)
                assert new_version is not None
                assert new_version > current
                model[key] = (new_version, value)
            for rec in recs:
                await rec.sync()
                assert {k: v for k, (_, v) in model.items()} == rec.to_dict().get("g", {})
        finally:
            for rec in recs:
                await rec.aclose()


@given(
    seed=st.integers(0, 2**32 - 1),
    ops=st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(["append", "insert", "delete", "sync"])),
        min_size=1,
        max_size=20,
    ),
)
async def test_append_only_survives_any_delivery_order(seed: int, ops: list[Any]) -> None:
    """Three replicas (separate stores) of an append_only log: non-append operations are
    refused before they touch anything, and whatever the order, batching and duplication of
    delivery, every appended entry ends up everywhere, each agent's in its own order."""
    rng = random.Random(seed)
    schema = {"log": CollectionSpec(kind="list", policy="append_only")}
    async with (
        crdtstore.open_store("memory://") as s0,
        crdtstore.open_store("memory://") as s1,
        crdtstore.open_store("memory://") as s2,
    ):
        stores = [s0, s1, s2]
        recs = [
            await s.open_record(run="r", agent=f"a{i}", schema=schema).start()
            for i, s in enumerate(stores)
        ]
        appended: list[str] = []

        async def deliver(src: int, dst: int) -> None:
            await recs[src].flush()
            updates = [e.update for e in await stores[src].journal("r", limit=100_000)]
            updates += rng.sample(updates, k=len(updates) // 3)
            rng.shuffle(updates)
            while updates:
                k = rng.randint(1, len(updates))
                await recs[dst].apply_update(tree_merge(updates[:k]))
                updates = updates[k:]

        try:
            for n, (who, op) in enumerate(ops):
                log = recs[who].list("log")
                if op == "append":
                    await log.append(f"a{who}:{n}")
                    appended.append(f"a{who}:{n}")
                elif op == "sync":
                    await deliver(rng.randrange(3), who)
                elif len(log):
                    refused = log.insert(0, "sneaked in") if op == "insert" else log.delete(0)
                    with pytest.raises(PolicyViolation):
                        await refused
            for src in range(3):
                for dst in range(3):
                    if src != dst:
                        await deliver(src, dst)
            views = [r.list("log").to_list() for r in recs]
            assert views[0] == views[1] == views[2]
            assert sorted(views[0]) == sorted(appended)
            for i in range(3):
                mine = [x for x in views[0] if x.startswith(f"a{i}:")]
                assert mine == [x for x in appended if x.startswith(f"a{i}:")]
        finally:
            for r in recs:
                await r.aclose()
