"""The local write hot path: the memory journal keeps its rows out of the cyclic GC, the owner
lookup without a provenance record, and the synchronous fast path of ``MapCollection.set``."""

from __future__ import annotations

import gc

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

import crdtstore
from crdtstore import BudgetExceeded, CollectionSpec, PolicyViolation
from crdtstore._backends.memory._journal import _BLOCK, _RECENT, MemoryJournal
from crdtstore._journal import NewEntry, SnapshotRow
from crdtstore._semantics import (
    Budget,
    apply_budgets,
    apply_set,
    check_budget,
    check_map_set,
    set_as_budget_delta,
    value_size,
)


def _entry(i: int, client: int = 7) -> NewEntry:
    value = {"text": f"v{i}", "n": [i, 1.5, None, True], "nested": {"k": "ü"}}
    effect = [["map", "m", "set", f"k{i}", value], ["list", "log", "ins", i, [f"e{i}"]]]
    return NewEntry("agent", "tool", client, 1.0 + i, b"u%d" % i, effect, i, "")


@pytest.mark.anyio
async def test_memory_rows_are_untracked_and_read_back_exactly() -> None:
    journal = MemoryJournal("memory://")
    await journal.ensure_run("t", "r", create=True)
    n = 3 * _RECENT
    entries = [_entry(i, client=7 if i % 2 else 8) for i in range(n)]
    for at in range(0, n, 100):
        await journal.append("t", "r", entries[at : at + 100], durable=False)
    gc.collect()
    run = journal._data.runs[("t", "r")]
    assert run.blocks and len(run.recent) < _RECENT + _BLOCK  # the newest rows, bounded
    # the older rows: a few untracked objects, nothing for a full collection to scan
    assert not any(gc.is_tracked(b) or gc.is_tracked(b[2]) for b in run.blocks)
    # every row reads back as appended, from the old (packed) part and the recent part
    for after in (0, 5, n - _RECENT - 3, n - 10):
        rows = await journal.read("t", "r", after, limit=50)
        assert [r.seq for r in rows] == list(range(after + 1, min(after + 51, n + 1)))
        for row in rows:
            e = entries[row.seq - 1]
            assert tuple(row[1:]) == tuple(e)
    # reading an old part returns fresh copies: mutating one does not change the journal
    old = (await journal.read("t", "r", 0, limit=1))[0]
    old.effect[0][4]["text"] = "mutated"
    assert (await journal.read("t", "r", 0, limit=1))[0].effect == entries[0].effect
    # a reader's own entries may come back without update and effect, never others'
    for after in (0, n - 20):
        for row in await journal.read("t", "r", after, limit=20, skip_client=7):
            e = entries[row.seq - 1]
            if row.client_id == 7 and not row.update:
                assert row.effect == []
            else:
                assert (row.update, row.effect) == (e.update, e.effect)
    history = await journal.history("t", "r", "m", "k5")
    assert [r.seq for r in history] == [6]


@pytest.mark.anyio
async def test_owner_lookup_follows_provenance() -> None:
    """``Record.owner`` (``Replica.agent_of``) names the writer of the current value, pending or
    journaled, the same as ``provenance``; the owner policy refuses another agent on both."""
    spec = CollectionSpec(policy="owner")
    async with crdtstore.open_store("memory://") as store:
        async with (
            store.open_record(run="r", agent="alice", schema={"m": spec}) as a,
            store.open_record(run="r", agent="bob", schema={"m": spec}) as b,
        ):
            await a.map("m").set("x", 1)
            assert a.owner("m", "x") == "alice"  # not journaled yet: a pending entry
            assert a.owner("m", "nope") is None
            await a.flush()
            assert a.owner("m", "x") == "alice" == a.replica.meta("m", "x").agent  # type: ignore[union-attr]
            with anyio.fail_after(10):
                while b.map("m").get("x") != 1:
                    await b.flush()
                    await anyio.lowlevel.checkpoint()
            assert b.owner("m", "x") == "alice"
            with pytest.raises(PolicyViolation):
                await b.map("m").set("x", 2)
            await a.map("m").set("x", 3)  # the owner may
            assert a.map("m").get("x") == 3


@pytest.mark.anyio
async def test_set_outside_a_transaction_is_journaled_and_durable_waits() -> None:
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a", durability="durable") as rec:
            await rec.map("m").set("k", {"v": 1})
            # durable: set returned only after the entry was committed
            assert rec.version("m", "k") == 1
        async with store.open_record(run="r", agent="a") as rec:
            for i in range(5):
                await rec.map("m").set(f"k{i}", i)
            async with rec.transaction():
                await rec.map("m").set("t1", 1)
                await rec.map("m").set("t2", 2)
            await rec.flush()
            entries = await store.journal("r")
            assert len(entries) == 1 + 5 + 1  # one entry per write, one per transaction


@given(
    sizes=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(1, 40), max_size=3),
    key=st.sampled_from(["a", "b", "c", "d"]),
    value=st.text(max_size=30),
    max_entries=st.none() | st.integers(0, 5),
    max_bytes=st.none() | st.integers(0, 120),
    max_value_bytes=st.none() | st.integers(0, 30),
)
def test_single_set_budget_check_matches_the_general_one(
    sizes: dict[str, int],
    key: str,
    value: str,
    max_entries: int | None,
    max_bytes: int | None,
    max_value_bytes: int | None,
) -> None:
    """``check_map_set`` (the fast path of ``Record._enforce``), with the value's size
    computed or given by the caller, decides and accounts exactly as ``check_budget`` does for
    a one-set effect (its delta applied by ``apply_set``, or by ``apply_budgets`` once
    converted)."""
    spec = CollectionSpec(
        max_entries=max_entries, max_bytes=max_bytes, max_value_bytes=max_value_bytes
    )
    outcomes = []
    for check, account in (
        (lambda u: check_budget(spec, "m", u, [["map", "m", "set", key, value]]), None),
        (lambda u: check_map_set(spec, "m", u, key, value), apply_set),
        (lambda u: check_map_set(spec, "m", u, key, value, value_size(value)), apply_set),
        (lambda u: set_as_budget_delta(check_map_set(spec, "m", u, key, value)), None),
    ):
        usage = Budget(len(sizes), sum(sizes.values()), dict(sizes))
        try:
            delta = check(usage)
        except BudgetExceeded as exc:
            outcomes.append(("refused", str(exc)))
            continue
        if account is None:
            apply_budgets([delta])
        else:
            account(delta)
        outcomes.append(("ok", (usage.entries, usage.bytes, usage.sizes)))
    assert outcomes[1:] == [outcomes[0]] * 3


@pytest.mark.anyio
async def test_memory_rollback_and_drop_across_blocks() -> None:
    journal = MemoryJournal("memory://")
    await journal.ensure_run("t", "r", create=True)
    await journal.append("t", "r", [_entry(i) for i in range(10)], durable=False)

    async def refused() -> None:
        async with journal.authority("t", "r", durable=True) as auth:
            await auth.append([_entry(i) for i in range(10, 3 * _RECENT)])  # packs blocks
            raise RuntimeError("refused")

    with pytest.raises(RuntimeError):
        await refused()
    assert await journal.head("t", "r") == 10
    rows = await journal.read("t", "r", 0)
    assert [r.seq for r in rows] == list(range(1, 11))
    await journal.append("t", "r", [_entry(i) for i in range(10, 3 * _RECENT)], durable=False)
    snap = SnapshotRow(2 * _RECENT, b"", {}, 0.0)
    await journal.save_snapshot("t", "r", snap, drop_journal=True)
    rows = await journal.read("t", "r", 0)
    assert [r.seq for r in rows] == list(range(2 * _RECENT + 1, 3 * _RECENT + 1))
    assert rows[0].effect == _entry(2 * _RECENT).effect
