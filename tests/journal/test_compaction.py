"""Compaction: the bulk loader behind ``store.compact``/``store.replay``, and automatic
compaction (``open_store(..., auto_compact=N)``).

- :class:`BulkLoad` (merged applies, provenance resolved once) must give the document and the
  provenance that applying the same journal entry by entry gives, for journals written by
  concurrent writers that see each other's entries late, with damaged entries among them;
- a record that writes past ``auto_compact`` entries after the snapshot makes a snapshot
  without anyone calling ``compact``; records tailing the run (also in other processes, also
  compacting themselves) keep working across it; opening the run starts from it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

import crdtstore
from crdtstore import InvalidValue
from crdtstore._journal import Row, checksum
from crdtstore._store import DEFAULT_AUTO_COMPACT
from crdtstore.record._bulk_load import BulkLoad
from crdtstore.record._provenance import Meta
from crdtstore.record._replica import Replica
from tests._wait import until

AGENTS = ("alice", "bob", "carol")
KEYS = ("a", "b", "c", "d")


# -- the bulk loader agrees with entry-by-entry application -------------------------------------


def _journal(steps: list[tuple[int, int, str, int, bool]], corrupt: set[int]) -> list[Row]:
    """Rows written by three replicas that see each other's entries only when a step syncs
    them: ``(writer, sync_upto_percent, collection, key_index, delete)``. Every set writes a
    value no other write has, so the value names its write. Rows whose position is in
    ``corrupt`` get a wrong checksum (the writers themselves had them intact)."""
    writers = [Replica() for _ in AGENTS]
    seen = [0] * len(writers)  # journal rows each writer has applied (or written)
    rows: list[Row] = []
    for n, (w, sync, coll, k, delete) in enumerate(steps):
        rep = writers[w]
        upto = len(rows) * sync // 100
        for row in rows[seen[w] : upto]:
            if row.client_id != rep.client_id:
                rep.apply_update(row.update)
        seen[w] = max(seen[w], upto)
        root = rep.root(coll, "map")
        key = KEYS[k]
        if delete and key not in root:
            continue
        op: list[Any] = ["map", coll, "del", key] if delete else ["map", coll, "set", key, n]
        meta = Meta(AGENTS[w], "tool", 1000.0 + n, None)

        def apply(root: Any = root, key: str = key, delete: bool = delete, n: int = n) -> None:
            if delete:
                del root[key]
            else:
                root[key] = n

        update = rep.local([op], apply, meta)
        assert update is not None
        seq = len(rows) + 1
        crc = checksum(update) ^ (1 if seq in corrupt else 0)
        rows.append(Row(seq, AGENTS[w], "tool", rep.client_id, meta.wall_time, update, [op], crc))
        if seen[w] == seq - 1:
            seen[w] = seq
    return rows


def _state(rep: Replica) -> tuple[Any, ...]:
    provenance = {(coll, key): rep.meta(coll, key) for coll in ("m", "n") for key in KEYS}
    return (
        rep.to_dict(),
        provenance,
        [e.seq for e in rep.skipped],
        rep.head,
        dict(rep.coll_seq),
    )


steps_st = st.lists(
    st.tuples(
        st.integers(0, len(AGENTS) - 1),
        st.integers(0, 100),
        st.sampled_from(("m", "n")),
        st.integers(0, len(KEYS) - 1),
        st.booleans(),
    ),
    min_size=1,
    max_size=60,
)


@given(
    steps=steps_st,
    chunk=st.integers(1, 25),
    corrupt=st.sets(st.integers(1, 60), max_size=3),
    flush_every=st.booleans(),
)
def test_bulk_load_equals_entry_by_entry(
    steps: list[tuple[int, int, str, int, bool]], chunk: int, corrupt: set[int], flush_every: bool
) -> None:
    rows = _journal(steps, corrupt)
    reference = Replica()
    for row in rows:  # the exact per-entry semantics: one entry per batch
        reference.apply_rows([row], "r")
    bulk_replica = Replica()
    bulk = BulkLoad(bulk_replica, "r")
    for i in range(0, len(rows), chunk):
        bulk.feed(rows[i : i + chunk])
        if flush_every:  # resolving after every chunk (as a big load does) changes nothing
            bulk.finish()
    bulk.finish()
    assert _state(bulk_replica) == _state(reference)


def test_bulk_load_after_a_snapshot_keeps_older_provenance() -> None:
    """Keys the loaded entries do not write keep the provenance the snapshot gave them."""
    rows = _journal(
        [(0, 0, "m", 0, False), (1, 100, "m", 1, False), (2, 100, "m", 0, False)], set()
    )
    first = Replica()
    first.apply_rows(rows[:2], "r")
    snap, state = first.doc.get_update(), first.export_state()
    rep = Replica()
    rep.apply_update(snap)
    rep.import_state(state)
    bulk = BulkLoad(rep, "r")
    bulk.feed(rows[2:])
    bulk.finish()
    b, a = rep.meta("m", "b"), rep.meta("m", "a")
    assert b is not None and (b.seq, b.agent) == (2, "bob")
    assert a is not None and (a.seq, a.agent) == (3, "carol")


# -- automatic compaction ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_writing_past_auto_compact_makes_a_snapshot(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with (
        crdtstore.open_store(url, auto_compact=50) as writer,
        crdtstore.open_store(url, auto_compact=None) as reader,
        writer.open_record("r", "w", "tool") as w,
        reader.open_record("r", "t", "tool") as t,
    ):
        for i in range(130):
            await w.map("m").set(f"k{i % 20}", i)
            if i % 10 == 9:
                await w.flush()
        await w.flush()

        async def snapshotted() -> bool:
            return (await writer.run_info("r")).snapshot_seq > 50

        await until(snapshotted)
        # the tailing record (another store object: its own connection) saw every write
        expected = {f"k{i % 20}": i for i in range(130)}

        async def caught_up() -> bool:
            return t.map("m").to_dict() == expected

        await until(caught_up)
        # and writing on after the snapshot works for both
        await t.map("m").set("after", 1)
        await t.flush()

        async def after_seen() -> bool:
            return w.map("m").get("after") == 1

        await until(after_seen)
        snapshot_seq = (await writer.run_info("r")).snapshot_seq
    # a fresh store opening the run starts from the snapshot: its first journal read is after it
    async with crdtstore.open_store(url, auto_compact=None) as store:
        reads: list[int] = []
        read = store.backend.read

        async def counting_read(tenant: str, run: str, after: int, *a: Any, **kw: Any) -> Any:
            reads.append(after)
            return await read(tenant, run, after, *a, **kw)

        store.backend.read = counting_read  # type: ignore[method-assign]
        async with store.open_record("r", "x", "tool", create=False) as rec:
            assert rec.map("m").to_dict() == {**expected, "after": 1}
            prov = rec.map("m").provenance("k19")
            assert prov is not None and (prov.agent, prov.seq) == ("w", 120)  # k19 = 119
        assert reads and reads[0] == snapshot_seq


@pytest.mark.anyio
async def test_auto_compact_below_the_limit_does_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with (
        crdtstore.open_store(url, auto_compact=100) as store,
        store.open_record("r", "w", "tool") as rec,
    ):
        for i in range(100):
            await rec.map("m").set(f"k{i}", i)
        await rec.flush()
        assert not store._compacting
        assert (await store.run_info("r")).snapshot_seq == 0


@pytest.mark.anyio
async def test_a_second_compactor_finding_a_fresh_snapshot_does_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with (
        crdtstore.open_store(url, auto_compact=None) as first,
        crdtstore.open_store(url, auto_compact=10) as second,
        first.open_record("r", "w", "tool") as rec,
    ):
        for i in range(30):
            await rec.map("m").set(f"k{i}", i)
        await rec.flush()
        await first.compact("r")
        before = await first.backend.load_snapshot("default", "r")
        assert before is not None and before.seq == 30
        # the second store has not seen that snapshot: it checks, finds it fresh, does nothing
        second._after_commit("r", 30)
        assert "r" in second._compacting

        async def done() -> bool:
            return "r" not in second._compacting

        await until(done)
        after = await second.backend.load_snapshot("default", "r")
        assert after is not None and (after.seq, after.created) == (30, before.created)
        assert second._snapshot_at["r"] == 30


def test_auto_compact_option_is_checked(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    for bad in (0, -5, 2.5, True, "often"):
        with pytest.raises(InvalidValue) as info:
            crdtstore.open_store(url, auto_compact=bad)  # type: ignore[arg-type]
        assert info.value.code == "INVALID_VALUE"
    assert crdtstore.open_store(url).auto_compact == DEFAULT_AUTO_COMPACT
    assert crdtstore.open_store("memory://x").auto_compact is None
    assert crdtstore.open_store(url, auto_compact=None).auto_compact is None


# -- real processes: writers compacting while others tail ----------------------------------------

_CHILD = textwrap.dedent(
    """
    import sys, anyio, crdtstore

    async def main(url, agent, n, limit):
        async with crdtstore.open_store(url, auto_compact=limit) as store:
            async with store.open_record("r", agent, "tool") as rec:
                for i in range(n):
                    await rec.map("m").set(f"{agent}:{i % 25}", i)
                    await rec.list("log").append(f"{agent}:{i}")
                    if i % 50 == 49:
                        await rec.flush()
                await rec.flush()
                # wait (deadline) until every writer's last entry is visible here too
                with anyio.fail_after(60):
                    while not all(
                        rec.map("m").get(f"w{j}:{(n - 1) % 25}") == n - 1 for j in range(2)
                    ):
                        await anyio.sleep(0.02)
                while store._compacting:  # let a running compaction finish before closing
                    await anyio.sleep(0.02)
        print("OK", flush=True)

    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    """
)


def test_processes_compacting_while_others_tail(tmp_path: Path) -> None:
    """Two writer processes, each auto-compacting every 150 entries, and this process tailing
    with a record that does not compact: everyone sees every write, the last snapshot is at
    most 150 entries behind the head, and a fresh open from it has the same state."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    n = 400  # entries per writer: 2 x 2 x 400 = 1,600 entries, several snapshots
    expected = {f"w{j}:{i % 25}": i for j in range(2) for i in range(n - 25, n)}

    async def tail() -> dict[str, Any]:
        async with (
            crdtstore.open_store(url, auto_compact=None) as store,
            store.open_record("r", "t", "tool") as rec,
        ):
            procs = [
                subprocess.Popen(  # noqa: ASYNC220 (started once, read from a worker thread)
                    [sys.executable, "-c", _CHILD, url, f"w{j}", str(n), "150"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for j in range(2)
            ]
            try:
                with anyio.fail_after(120):
                    while rec.map("m").to_dict() != expected or len(rec.list("log")) != 2 * n:
                        await anyio.sleep(0.02)
                    for p in procs:
                        out, err = await anyio.to_thread.run_sync(p.communicate)
                        assert p.returncode == 0, err
                        assert out.strip() == "OK"
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
            info = await store.run_info("r")
            # the writer that committed last compacted (again) once its compaction was done:
            # at most ``auto_compact`` entries are left after the snapshot
            assert info.head == 4 * n and info.snapshot_seq >= 4 * n - 150, info
            return rec.to_dict()

    seen = anyio.run(tail)

    async def reopen() -> dict[str, Any]:
        async with (
            crdtstore.open_store(url, auto_compact=None) as store,
            store.open_record("r", "x", "tool", create=False) as rec,
        ):
            return rec.to_dict()

    started = time.perf_counter()
    assert anyio.run(reopen) == seen
    assert time.perf_counter() - started < 30


@pytest.mark.anyio
async def test_replay_restarts_when_the_journal_is_dropped_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction dropping the journal prefix (after a delete) while another compaction
    reads the journal: the reader starts again from the new snapshot instead of saving a
    newer snapshot with a hole in it, which would also bring the deleted value back."""
    import crdtstore._store_compaction as store_module

    monkeypatch.setattr(store_module, "READ_CHUNK", 10)
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with (
        crdtstore.open_store(url, auto_compact=None) as reader,
        crdtstore.open_store(url, auto_compact=None) as dropper,
    ):
        async with dropper.open_record("r", "w", "tool") as rec:
            for i in range(40):
                await rec.map("m").set(f"k{i}", "secret-five" if i == 5 else i)
        read = reader.backend.read
        calls = 0

        async def read_then_redact(tenant: str, run: str, after: int, *a: Any, **kw: Any) -> Any:
            nonlocal calls
            calls += 1
            rows = await read(tenant, run, after, *a, **kw)
            if calls == 1:  # the reader holds entries 1-10 (k5 among them)
                async with dropper.open_record("r", "w", "tool") as rec2:
                    await rec2.map("m").delete("k5")  # 41
                await dropper.compact("r", drop_journal=True)  # snapshot at 41, 1-41 dropped
                async with dropper.open_record("r", "w", "tool") as rec2:
                    await rec2.map("m").set("z", "mark")  # 42
            return rows

        reader.backend.read = read_then_redact  # type: ignore[method-assign]
        result = await reader.compact("r")
        assert calls == 3  # 1-10, then a gap (42 only), then again from the new snapshot (41)
        assert result.seq == 42
        snap = await reader.backend.load_snapshot("default", "r")
        assert snap is not None and snap.seq == 42
        assert b"secret-five" not in snap.update
        async with reader.open_record("r", "x", "tool", create=False) as again:
            expected: dict[str, Any] = {f"k{i}": i for i in range(40) if i != 5}
            assert again.map("m").to_dict() == {**expected, "z": "mark"}


@pytest.mark.anyio
async def test_a_big_snapshot_spaces_automatic_compactions_out(tmp_path: Path) -> None:
    """Past ``auto_compact`` KB of snapshot, one entry per KB of it must follow before the
    next automatic compaction (compacting is about as costly as the snapshot is big)."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with (
        crdtstore.open_store(url, auto_compact=5) as store,
        store.open_record("r", "w", "tool") as rec,
    ):
        for i in range(10):
            await rec.map("m").set(f"k{i}", i)
        await rec.flush()

        async def compacted() -> bool:
            return not store._compacting and (await store.run_info("r")).snapshot_seq > 5

        await until(compacted)
        first = (await store.run_info("r")).snapshot_seq
        store._snapshot_bytes["r"] = 40_000  # as if that snapshot were 40 KB: wait 40 entries
        store._after_commit("r", first + 30)
        assert not store._compacting
        store._after_commit("r", first + 41)
        assert store._compacting == {"r"}
        with anyio.fail_after(30):
            while store._compacting:
                await anyio.sleep(0.02)


def test_freed_pages_can_be_given_back_on_this_platform() -> None:
    """Opening a snapshot and compacting give the allocator's free pages back
    (``crdtstore._heap``); on glibc Linux (CI) the call must be found, not silently absent."""
    import platform

    from crdtstore._heap import release_free_memory

    expected = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert release_free_memory() is expected
