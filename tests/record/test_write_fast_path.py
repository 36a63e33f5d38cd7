"""The shortcuts of the local write path into pycrdt (``Replica.local_set``, ``do_set``,
``set_items``: values straight to yrs, a bare yrs transaction, the capture observer on the yrs
document) give exactly what pycrdt's public API gives: the same documents, one journal entry
per transaction, the same provenance, the same handling of a failing observer; and they step
aside (to the public API) whenever their preconditions do not hold."""

from __future__ import annotations

import math
import os
from enum import IntEnum
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pycrdt import Doc, Map

import crdtstore
from crdtstore import InvalidValue
from crdtstore.record import _pycrdt
from crdtstore.record._document import REGISTRY
from crdtstore.record._provenance import Meta
from crdtstore.record._replica import Replica

pytestmark = pytest.mark.anyio

# (lone surrogates are refused: see the last test)
_chars = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))
_keys = st.text(_chars, min_size=1, max_size=8)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(_chars, max_size=5)
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(_chars, max_size=3), inner),
    max_leaves=6,
)
# one write: a single set, a transaction of sets, or an update() of several keys
_writes = st.lists(
    st.tuples(
        st.sampled_from(["set", "txn", "update"]),
        st.lists(st.tuples(_keys, _values), min_size=1, max_size=4),
    ),
    min_size=1,
    max_size=12,
)


def test_the_pinned_pycrdt_takes_the_shortcuts() -> None:
    # if this fails, pycrdt's internals moved: the write path silently takes the slow,
    # public API (still correct, see the tests below) and the local_write bench drops
    assert _pycrdt._internals_work() is True
    # on, unless CI's second run of the record tests turned it off
    assert _pycrdt.INTERNALS is (os.environ.get(_pycrdt.ENV, "1") != "0")


async def _run(writes: list[tuple[str, list[tuple[str, Any]]]]) -> tuple[Any, ...]:
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record("r", "writer", "tool") as rec,
    ):
        m = rec.map("m")
        for kind, items in writes:
            if kind == "set":
                for key, value in items:
                    await m.set(key, value)
            elif kind == "txn":
                async with rec.transaction():
                    for key, value in items:
                        await m.set(key, value)
            else:
                await m.update(dict(items))
        await rec.flush()
        entries = await rec.journal(0, 10_000)
        # the journal alone rebuilds the document
        doc: Doc[Any] = Doc()
        for e in entries:
            doc.apply_update(e.update)
        rebuilt = {k: v for k, v in doc.get("m", type=Map).items()}
        provenance = {k: (p.agent, p.seq) for k in m if (p := m.provenance(k))}
        effects = [e.effect for e in entries]
        return m.to_dict(), rebuilt, effects, provenance


@given(writes=_writes)
def test_shortcuts_and_public_api_make_the_same_record(writes: Any) -> None:
    fast = anyio.run(_run, writes)
    saved = _pycrdt.INTERNALS
    _pycrdt.INTERNALS = False
    try:
        slow = anyio.run(_run, writes)
    finally:
        _pycrdt.INTERNALS = saved
    assert fast == slow
    data, rebuilt, effects, provenance = fast
    assert set(rebuilt) == set(data)
    # one entry per write call or transaction (an update of an equal value is still one)
    assert len(effects) == sum(len(items) if kind == "set" else 1 for kind, items in writes)
    assert all(agent == "writer" and type(seq) is int for agent, seq in provenance.values())


def test_local_set_captures_one_update_and_records_provenance() -> None:
    replica = Replica()
    root = replica.root("m", "map")
    meta = Meta("a", "tool", 1.0, None, "")
    # first write of a collection: registered in the same transaction (public path)
    first = replica.local_set(root, [["map", "m", "set", "x", 1]], meta)
    assert first is not None and replica.kind_of("m") == "map"
    meta2 = Meta("b", "tool", 2.0, None, "")
    update = replica.local_set(root, [["map", "m", "set", "y", {"v": [1, "z"]}]], meta2)
    assert update is not None and replica.doc._txn is None
    other = Replica()
    other.apply_update(first)
    other.apply_update(update)
    assert other.to_dict() == {"m": {"x": 1, "y": {"v": [1, "z"]}}}
    assert replica.meta("m", "y") is meta2 and replica.meta("m", "x") is meta
    # a transaction of the document is open: the public path (joins it, no update of its own)
    with replica.doc.transaction():
        assert replica.local_set(root, [["map", "m", "set", "z", 3]], meta) is None
    assert replica.to_dict()["m"]["z"] == 3


def test_local_set_follows_a_swapped_document() -> None:
    # the simulator gives a replica a fresh document of a chosen client id
    replica = Replica()
    root = replica.root("m", "map")
    meta = Meta("a", "tool", 1.0, None, "")
    replica.local_set(root, [["map", "m", "set", "x", 1]], meta)
    replica.local_set(root, [["map", "m", "set", "x", 2]], meta)
    replica.doc = Doc(client_id=42)
    replica.registry = replica.doc.get(REGISTRY, type=Map)
    replica._capture = replica.capture_transactions()
    replica._roots.clear()
    replica._kinds.clear()
    root = replica.root("m", "map")
    replica.local_set(root, [["map", "m", "set", "y", 1]], meta)
    update = replica.local_set(root, [["map", "m", "set", "y", 2]], meta)
    assert update is not None and replica.to_dict() == {"m": {"y": 2}}
    assert replica._direct is not None and replica._direct.doc is replica.doc


@pytest.mark.parametrize("direct", [True, False])
def test_a_failing_observer_fails_the_write_but_its_update_is_kept(direct: bool) -> None:
    saved = _pycrdt.INTERNALS
    _pycrdt.INTERNALS = direct
    try:
        replica = Replica()
        root = replica.root("m", "map")
        meta = Meta("a", "tool", 1.0, None, "")
        replica.local_set(root, [["map", "m", "set", "x", 1]], meta)

        def boom(event: Any) -> None:
            raise RuntimeError("observer")

        sub = replica.doc.observe(boom)
        with pytest.raises(ExceptionGroup) as info:
            replica.local_set(root, [["map", "m", "set", "x", 2]], meta)
        assert isinstance(info.value.exceptions[0], RuntimeError)
        # applied (no rollback) and its update left for the caller to journal
        partial, replica.partial_update = replica.partial_update, None
        assert partial is not None and replica.doc._txn is None
        assert replica.to_dict() == {"m": {"x": 2}}
        replica.doc.unobserve(sub)
        assert replica.local_set(root, [["map", "m", "set", "x", 3]], meta) is not None
        assert replica.doc._exceptions == []
    finally:
        _pycrdt.INTERNALS = saved


async def test_a_set_waits_for_another_tasks_transaction(anyio_backend: str) -> None:
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record("r", "writer", "tool") as rec,
    ):
        m = rec.map("m")
        inside = anyio.Event()
        started = anyio.Event()

        async def other() -> None:
            await inside.wait()
            started.set()
            await m.set("b", 2)  # another task's transaction is open: waits for it

        async with anyio.create_task_group() as tg:
            tg.start_soon(other)
            async with rec.transaction():
                await m.set("a", 1)
                inside.set()
                with anyio.fail_after(5):
                    await started.wait()
                for _ in range(5):  # (the other task is in its set now, waiting)
                    await anyio.lowlevel.checkpoint()
                assert "b" not in m
                await m.set("c", 3)
        await rec.flush()
        effects = [e.effect for e in await rec.journal()]
        assert effects == [
            [["map", "m", "set", "a", 1], ["map", "m", "set", "c", 3]],
            [["map", "m", "set", "b", 2]],
        ]


async def test_a_budget_refuses_a_set_inside_a_transaction(anyio_backend: str) -> None:
    spec = crdtstore.CollectionSpec(kind="map", max_entries=2)
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record("r", "writer", "tool", schema={"m": spec}) as rec,
    ):
        m = rec.map("m")
        async with rec.transaction():
            await m.set("a", 1)
            await m.set("b", 2)
            with pytest.raises(crdtstore.BudgetExceeded):
                await m.set("c", 3)
            await m.set("a", 4)  # an overwrite stays within the budget
        await rec.flush()
        assert m.to_dict() == {"a": 4, "b": 2}
        (entry,) = await rec.journal()
        assert [op[3] for op in entry.effect] == ["a", "b", "a"]


async def test_lone_surrogates_are_refused_with_a_typed_error(anyio_backend: str) -> None:
    # yrs cannot encode them (UnicodeEncodeError from inside the transaction, before)
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record("r", "writer", "tool") as rec,
    ):
        m, log, text = rec.map("m"), rec.list("log"), rec.text("t")
        await m.set("ok", "é")
        await rec.flush()
        before = (rec.to_dict(), len(await rec.journal()))
        with pytest.raises(crdtstore.InvalidName):
            await m.set("\ud800", 1)
        with pytest.raises(crdtstore.InvalidName):
            await m.update({"é\udfff": 1})
        for bad in ("\ud800", ["a", "\udc00"], {"k\ud800": 1}, {"k": {"x": "\ud801"}}):
            with pytest.raises(crdtstore.InvalidValue):
                await m.set("k", bad)
            with pytest.raises(crdtstore.InvalidValue):
                await log.append(bad)
        with pytest.raises(crdtstore.InvalidValue):
            await text.edit("a\ud800")
        with pytest.raises(crdtstore.InvalidValue):
            await text.insert(0, "\udfff")
        with pytest.raises(crdtstore.InvalidName):
            rec.map("coll\ud800")
        await rec.flush()
        assert (rec.to_dict(), len(await rec.journal())) == before


async def test_memory_journal_positions_survive_rollback_and_compaction(
    anyio_backend: str,
) -> None:
    # the memory journal keeps its newest entries as appended and numbers them by position
    from crdtstore._backends.memory._journal import _BLOCK, _RECENT, MemoryJournal
    from crdtstore._journal import NewEntry, SnapshotRow

    def entry(i: int) -> NewEntry:
        return NewEntry("a", "tool", 7, float(i), b"u%d" % i, [["map", "m", "set", f"k{i}", i]], i)

    journal = MemoryJournal("memory://")
    await journal.ensure_run("t", "r", create=True)
    model: dict[int, NewEntry] = {}

    async def check() -> None:
        head = await journal.head("t", "r")
        for after in sorted({0, 1, head // 2, max(0, head - _RECENT - 5), max(0, head - 3)}):
            rows = await journal.read("t", "r", after, limit=10_000)
            want = [s for s in sorted(model) if s > after]
            assert [r.seq for r in rows] == want
            assert all(tuple(r[1:]) == tuple(model[r.seq]) for r in rows)

    n = 0
    for size in (5, _RECENT, _BLOCK + 3, 1, 2 * _BLOCK):
        batch = [entry(n + i) for i in range(size)]
        seqs = await journal.append("t", "r", batch, durable=False)
        assert seqs == list(range(n + 1, n + size + 1))
        model.update(zip(seqs, batch, strict=True))
        n += size
        await check()

    # an authority transaction that fails rolls back what it appended, packed or not
    async def append_and_fail(size: int) -> None:
        async with journal.authority("t", "r", durable=False) as auth:
            await auth.append([entry(1000 + i) for i in range(size)])
            raise RuntimeError

    for size in (3, 2 * _BLOCK + _RECENT):
        with pytest.raises(RuntimeError):
            await append_and_fail(size)
        assert await journal.head("t", "r") == n
        await check()
    # compaction that drops the journal prefix keeps the positions of the rest
    cut = n - _RECENT // 2
    await journal.save_snapshot("t", "r", SnapshotRow(cut, b"", {}, 0.0), drop_journal=True)
    model = {s: e for s, e in model.items() if s > cut}
    await check()
    seqs = await journal.append("t", "r", [entry(5000)], durable=False)
    assert seqs == [n + 1]
    model[n + 1] = entry(5000)
    await check()


async def test_map_set_checks_scalars_as_to_stored_does() -> None:
    """MapCollection.set takes an ASCII string or a safe int as it is (to_stored's check,
    inlined); everything else still goes through to_stored: beyond ±2**53, lone surrogates,
    non-finite floats and int subclasses are refused or converted, and nothing is written."""

    class Level(IntEnum):
        high = 3

    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record(run="r", agent="a") as rec,
    ):
        m = rec.map("m")
        good = {
            "s": "ascii",
            "u": "é日🙂",
            "max": 2**53,
            "min": -(2**53),
            "b": True,
            "e": Level.high,
        }
        for k, v in good.items():
            await m.set(k, v)
        got = m.to_dict()
        assert got == {**good, "e": 3} and type(got["e"]) is int and type(got["b"]) is bool
        for bad in (2**53 + 1, -(2**53) - 1, "a\ud800", math.nan, math.inf):
            with pytest.raises(InvalidValue):
                await m.set("bad", bad)
        assert "bad" not in m
        await rec.flush()
        entries = await rec.journal()
        assert len(entries) == len(good)
