"""Time to open (resume) a record whose run has 100k or 1M small journal entries, without and
with a snapshot, plus the compaction (``await store.compact(run)``) time itself.

    python bench/resume.py            # 100k (distinct, overwrite) and 1M (overwrite): ~3-4 min
    python bench/resume.py --quick    # 100k entries only: ~1 min
    python bench/resume.py --sizes 1000000 --workloads distinct   # 1M distinct keys: ~4 min
    python bench/resume.py --sizes 1000000 --workloads log,text,mixed   # ~15 min

For each size and workload the journal is written through records on ``sqlite:///``
(``batched``, one awaited write per entry, so every update is its own journal entry;
automatic compaction off while building), the records are closed, and then, each time with a
fresh store object:

1. resume from the journal alone: ``open_store(url)`` + ``async with store.open_record(...)``;
2. ``await store.compact(run)`` (journal kept);
3. resume from the snapshot (plus nothing after it).

Workloads:

- ``distinct``: every entry sets a new key of map ``m`` (the map ends with N entries);
- ``overwrite``: N entries over 1,000 keys of ``m`` (1,000 entries and N tombstones);
- ``log``: 3 agents (records) take turns appending a small dict (a finding) to list ``log``;
- ``text``: 2 agents type into 200 text collections (``doc0``..): sessions of 50 keystrokes
  on one document, each an insert of 1-4 characters at the agent's cursor (85%) or a
  backspace of 1-2 characters (15%), the cursor sometimes jumping (2%). (200 documents, not
  one: a text edit reads the whole text, so one 2 MB text would make building quadratic);
- ``mixed``: 4 agents; 40% set a small dict under one of 1,000 task keys of map ``status``,
  30% append to ``log``, 30% text edits as above over 50 documents.

Every resume checks the record's shape (each collection's length) against the first one and
against the raw baselines.

Baselines in the same run: raw sqlite3 reading the journal's update blobs in order and applying
them one by one to a fresh pycrdt ``Doc`` (what any replayer must at least do), raw sqlite3
reading the snapshot blob and applying it once, and for compaction the raw replay plus
``get_update()`` of the whole document written as one blob (what any compactor must at least
do). Resume from the journal and compaction are timed in wall time and CPU time
(``process_time``, worker threads included): on a machine shared with other work the CPU
ratio is the steadier one.

Targets: 1M entries resume in well under a second after compaction (we check < 0.5 s); at
100k entries, resume from the journal at most 2x the raw replay and compaction at most 1 s.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from _common import Result, fmt, header, median, table
from pycrdt import Array, Doc, Map, Text

import crdtstore

TARGET_S = 0.5
JOURNAL_RATIO = 2.0  # resume from the journal vs the raw replay, at 100k entries
COMPACT_S = 1.0  # compaction of 100k entries
RUN = "resume"
OVERWRITE_KEYS = 1000
AGENTS = {"distinct": 1, "overwrite": 1, "log": 3, "text": 2, "mixed": 4}
WORKLOADS = tuple(AGENTS)

Shape = dict[str, int]  # collection -> its length (map entries, list items, characters)


class _Typist:
    """Typing-like edits of one agent over ``docs`` text collections."""

    def __init__(self, rec: Any, rnd: random.Random, docs: int) -> None:
        self.rec, self.rnd, self.docs = rec, rnd, docs
        self.cursor: dict[str, int] = {}
        self.edits = 0

    async def edit(self) -> None:
        rnd = self.rnd
        name = f"doc{(self.edits // 50) % self.docs}"
        self.edits += 1
        text = self.rec.text(name)
        size = len(text)
        at = min(self.cursor.get(name, size), size)
        if rnd.random() < 0.02:
            at = rnd.randint(0, size)
        if at > 0 and rnd.random() < 0.15:
            count = min(at, rnd.randint(1, 2))
            await text.delete(at - count, count)
            at -= count
        else:
            chunk = "".join(rnd.choice("etaoin shrdlu") for _ in range(rnd.randint(1, 4)))
            await text.insert(at, chunk)
            at += len(chunk)
        self.cursor[name] = at


async def build(url: str, n: int, workload: str) -> float:
    """Write ``n`` journal entries; return the seconds it took (until flushed)."""
    async with contextlib.AsyncExitStack() as stack:
        store = await stack.enter_async_context(
            crdtstore.open_store(url, durability="batched", auto_compact=None)
        )
        recs = [
            await stack.enter_async_context(store.open_record(RUN, f"agent{j}", "tool"))
            for j in range(AGENTS[workload])
        ]
        rnd = random.Random(n)
        t0 = time.perf_counter()
        if workload == "distinct":
            m = recs[0].map("m")
            for i in range(n):
                await m.set(f"k{i}", i)
        elif workload == "overwrite":
            m = recs[0].map("m")
            for i in range(n):
                await m.set(f"k{i % OVERWRITE_KEYS}", i)
        elif workload == "log":
            logs = [rec.list("log") for rec in recs]
            for i in range(n):
                finding = {"agent": i % 3, "n": i, "kind": "finding", "ok": i % 7 != 0}
                await logs[i % 3].append(finding)
        elif workload == "text":
            typists = [_Typist(rec, random.Random(j), 200) for j, rec in enumerate(recs)]
            for i in range(n):
                await typists[(i // 50) % 2].edit()
        else:  # mixed
            typists = [_Typist(rec, random.Random(j), 50) for j, rec in enumerate(recs)]
            for i in range(n):
                j, r = i % 4, rnd.random()
                if r < 0.4:
                    task = f"task{rnd.randrange(OVERWRITE_KEYS)}"
                    await recs[j].map("status").set(task, {"state": "running", "step": i})
                elif r < 0.7:
                    await recs[j].list("log").append({"agent": j, "n": i})
                else:
                    await typists[j].edit()
        for rec in recs:
            await rec.flush()
        seconds = time.perf_counter() - t0
        assert (await store.run_info(RUN)).head == n
    return seconds


def shape_of(values: dict[str, Any]) -> Shape:
    return {name: len(value) for name, value in sorted(values.items())}


def raw_shape(doc: Doc[Any]) -> Shape:
    """The shape of a raw document, from crdtstore's collection registry in it."""
    kinds = {"map": Map, "list": Array, "text": Text}
    registry = doc.get("__crdtstore_collections", type=Map)
    out: Shape = {}
    for name, kind in sorted(registry.items()):
        root = doc.get(name, type=kinds[kind])
        out[name] = len(str(root)) if kind == "text" else len(root)
    return out


async def resume(
    url: str, shape: Shape | None, max_update: int | None = None
) -> tuple[float, float, Shape]:
    """Seconds (wall, CPU) from ``open_store`` to an open record (its document loaded), and
    its shape (checked against ``shape`` when given)."""
    gc.collect()
    kw = {} if max_update is None else {"max_update": max_update}
    t0, c0 = time.perf_counter(), time.process_time()
    async with crdtstore.open_store(url, auto_compact=None, **kw) as store:  # type: ignore[arg-type]
        rec = store.open_record(RUN, "reader", "tool", create=False)
        await rec.start()
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        try:
            got = shape_of(rec.to_dict())
            assert shape is None or got == shape, (got, shape)
        finally:
            await rec.aclose()
    return seconds, cpu, got


def timed_resumes(url: str, shape: Shape | None, reps: int) -> tuple[float, float, str, Shape]:
    """Median resume time (wall, CPU) and the shape; if the record refuses its own snapshot
    as too large (seen with 1M distinct keys before the fix), say so and measure again with
    ``max_update`` raised, so the figure exists and the failure is reported."""
    try:
        runs = [anyio.run(resume, url, shape) for _ in range(reps)]
        note = ""
    except crdtstore.PayloadTooLarge as exc:
        note = f"FAILS with default max_update: {exc}; timed with max_update=256 MiB"
        print(f"   !! {note}", flush=True)
        runs = [anyio.run(resume, url, shape, 256 * 1024 * 1024) for _ in range(reps)]
    shapes = {str(sorted(s.items())) for _, _, s in runs}
    assert len(shapes) == 1, shapes
    return median([t for t, _, _ in runs]), median([c for _, c, _ in runs]), note, runs[0][2]


async def compact(url: str) -> tuple[float, float, int]:
    """Seconds (wall, CPU) of ``store.compact(run)`` and the snapshot's size."""
    async with crdtstore.open_store(url) as store:
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        res = await store.compact(RUN)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return seconds, cpu, res.snapshot_bytes


def raw_replay(path: Path, shape: Shape) -> tuple[float, float]:
    """Seconds (wall, CPU) to read every update blob (raw sqlite3) and apply them one by
    one."""
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    db = sqlite3.connect(path)
    doc: Doc[Any] = Doc()
    for (upd,) in db.execute("SELECT upd FROM journal ORDER BY run_id, seq"):
        doc.apply_update(upd)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    db.close()
    assert raw_shape(doc) == shape, (raw_shape(doc), shape)
    return seconds, cpu


def raw_compact(path: Path, shape: Shape) -> tuple[float, float]:
    """Seconds (wall, CPU) of a raw compaction: read every update blob (raw sqlite3), apply
    them one by one, and write the document's ``get_update()`` as one blob in one
    transaction (a table of its own, dropped after)."""
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    db = sqlite3.connect(path, isolation_level=None)
    doc: Doc[Any] = Doc()
    for (upd,) in db.execute("SELECT upd FROM journal ORDER BY run_id, seq"):
        doc.apply_update(upd)
    snapshot = doc.get_update()
    db.execute("CREATE TABLE IF NOT EXISTS raw_snapshot (upd BLOB)")
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO raw_snapshot VALUES (?)", (snapshot,))
    db.execute("COMMIT")
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    db.execute("DROP TABLE raw_snapshot")
    db.close()
    assert raw_shape(doc) == shape, (raw_shape(doc), shape)
    return seconds, cpu


def raw_snapshot(path: Path, shape: Shape) -> float:
    """Seconds to read the snapshot blob (raw sqlite3) and apply it once."""
    gc.collect()
    t0 = time.perf_counter()
    db = sqlite3.connect(path)
    (upd,) = db.execute("SELECT upd FROM snapshots").fetchone()
    doc: Doc[Any] = Doc()
    doc.apply_update(upd)
    seconds = time.perf_counter() - t0
    db.close()
    assert raw_shape(doc) == shape, (raw_shape(doc), shape)
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k entries only")
    ap.add_argument(
        "--sizes",
        default=None,
        help="comma-separated entry counts (default: 100000, plus 1000000 overwrite unless "
        "--quick)",
    )
    ap.add_argument(
        "--workloads", default="distinct,overwrite", help=f"comma-separated: {','.join(WORKLOADS)}"
    )
    ap.add_argument("--repeats", type=int, default=3, help="resumes per case (1 at >= 1M)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in (args.sizes or "100000").split(",")]
    workloads = args.workloads.split(",")
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        ap.error(f"unknown workloads {sorted(unknown)}; known: {', '.join(WORKLOADS)}")
    cases = [(n, w) for n in sizes for w in workloads]
    if not args.quick and args.sizes is None:
        cases.append((1_000_000, "overwrite"))  # the 1M distinct-key case is opt-in (slow)
    header("resume: open a record with N journal entries, without and with a snapshot", args)

    rows: list[list[Any]] = []
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="crdtstore-bench-") as tmp:
        for n, workload in cases:
            path = Path(tmp) / f"{workload}-{n}.db"
            url = f"sqlite:///{path}"
            reps = args.repeats if n < 1_000_000 else 1
            t_build = anyio.run(build, url, n, workload)
            print(
                f"   built {workload} x{n:,} in {t_build:.1f}s "
                f"({n / t_build:,.0f} entries/s, file {path.stat().st_size / 1e6:.0f} MB)",
                flush=True,
            )
            label = f"{n:,} {workload}"
            t_journal, c_journal, note_j, shape = timed_resumes(url, None, reps)
            if workload == "distinct":
                assert shape == {"m": n}, shape
            elif workload == "overwrite":
                assert shape == {"m": min(n, OVERWRITE_KEYS)}, shape
            elif workload == "log":
                assert shape == {"log": n}, shape
            raws = [raw_replay(path, shape) for _ in range(reps)]
            t_raw_journal, c_raw_journal = (
                median([w for w, _ in raws]),
                median([c for _, c in raws]),
            )
            print(
                f"   {label} ({len(shape)} collections, total length {sum(shape.values()):,}): "
                f"resume from journal {t_journal * 1000:,.0f} ms, CPU {c_journal * 1000:,.0f} ms "
                f"(raw {t_raw_journal * 1000:,.0f} ms, CPU {c_raw_journal * 1000:,.0f} ms)",
                flush=True,
            )
            c_raw_compact = t_raw_compact = 0.0
            if n < 1_000_000:  # (the raw compaction is the raw replay and one write: 1M skipped)
                t_raw_compact, c_raw_compact = raw_compact(path, shape)
            t_compact, c_compact, snap_bytes = anyio.run(compact, url)
            print(
                f"   {label}: compaction {t_compact * 1000:,.0f} ms, CPU {c_compact * 1000:,.0f} ms"
                f" (raw {t_raw_compact * 1000:,.0f} ms, CPU {c_raw_compact * 1000:,.0f} ms), "
                f"snapshot {snap_bytes / 1e6:.2f} MB",
                flush=True,
            )
            t_snap, _, note_s, _ = timed_resumes(url, shape, max(reps, 3))
            t_raw_snap = median([raw_snapshot(path, shape) for _ in range(max(reps, 3))])
            print(
                f"   {label}: resume from snapshot {t_snap * 1000:,.0f} ms "
                f"(raw {t_raw_snap * 1000:,.0f} ms)",
                flush=True,
            )
            rows.append(
                [
                    label,
                    "journal only",
                    fmt(t_journal * 1000, "ms"),
                    fmt(t_raw_journal * 1000, "ms"),
                    f"{t_journal / t_raw_journal:.2f}x",
                    f"CPU {c_journal * 1000:,.0f} / {c_raw_journal * 1000:,.0f} ms = "
                    f"{c_journal / c_raw_journal:.2f}x" + (f"; {note_j}" if note_j else ""),
                ]
            )
            rows.append(
                [
                    label,
                    "compaction",
                    fmt(t_compact * 1000, "ms"),
                    fmt(t_raw_compact * 1000, "ms") if c_raw_compact else "",
                    f"{t_compact / t_raw_compact:.2f}x" if c_raw_compact else "",
                    (
                        f"CPU {c_compact * 1000:,.0f} / {c_raw_compact * 1000:,.0f} ms = "
                        f"{c_compact / c_raw_compact:.2f}x; "
                        if c_raw_compact
                        else f"CPU {c_compact * 1000:,.0f} ms; "
                    )
                    + f"snapshot {snap_bytes / 1e6:.2f} MB",
                ]
            )
            rows.append(
                [
                    label,
                    "snapshot",
                    fmt(t_snap * 1000, "ms"),
                    fmt(t_raw_snap * 1000, "ms"),
                    f"{t_snap / t_raw_snap:.2f}x",
                    (
                        f"target < {TARGET_S * 1000:.0f} ms at 1M: "
                        + ("met" if t_snap < TARGET_S and not note_s else "MISSED")
                        if n >= 1_000_000
                        else ""
                    )
                    + (f"; {note_s}" if note_s else ""),
                ]
            )
            target = f"< {TARGET_S:g} s at 1M entries" if n >= 1_000_000 else "(1M only)"
            results.append(
                Result(
                    "resume",
                    f"resume after compaction, {label}"
                    + (" (default max_update refuses the snapshot)" if note_s else ""),
                    t_snap,
                    "s",
                    t_raw_snap,
                    t_snap / t_raw_snap,
                    target,
                    (t_snap < TARGET_S and not note_s) if n >= 1_000_000 else None,
                )
            )
            at_100k = n == 100_000
            results.append(
                Result(
                    "resume",
                    f"resume from journal, {label}",
                    t_journal,
                    "s",
                    t_raw_journal,
                    t_journal / t_raw_journal,
                    f"<= {JOURNAL_RATIO:g}x raw" if at_100k else "(informative)",
                    (t_journal / t_raw_journal <= JOURNAL_RATIO) if at_100k else None,
                )
            )
            results.append(
                Result(
                    "resume",
                    f"resume from journal (CPU), {label}",
                    c_journal,
                    "s",
                    c_raw_journal,
                    c_journal / c_raw_journal,
                    f"<= {JOURNAL_RATIO:g}x raw" if at_100k else "(informative)",
                    (c_journal / c_raw_journal <= JOURNAL_RATIO) if at_100k else None,
                )
            )
            results.append(
                Result(
                    "resume",
                    f"compaction, {label}",
                    t_compact,
                    "s",
                    t_raw_compact or None,
                    t_compact / t_raw_compact if c_raw_compact else None,
                    f"<= {COMPACT_S:g} s" if at_100k else "(informative)",
                    (t_compact <= COMPACT_S) if at_100k else None,
                )
            )
            results.append(
                Result(
                    "resume",
                    f"compaction (CPU), {label}",
                    c_compact,
                    "s",
                    c_raw_compact or None,
                    c_compact / c_raw_compact if c_raw_compact else None,
                    f"<= {COMPACT_S:g} s" if at_100k else "(informative)",
                    (c_compact <= COMPACT_S) if at_100k else None,
                )
            )
            path.unlink()
    load = os.getloadavg()
    print(f"   load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    print()
    table(["entries", "resume from", "crdtstore", "raw sqlite3 + pycrdt", "ratio", "notes"], rows)
    for r in results:
        r.emit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
