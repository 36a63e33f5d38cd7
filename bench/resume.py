"""Time to open (resume) a record whose run has 100k or 1M small journal entries, without and
with a snapshot, plus the compaction (``await store.compact(run)``) time itself.

    python bench/resume.py            # 100k (both workloads) and 1M (overwrite): ~3-4 min
    python bench/resume.py --quick    # 100k entries only: ~1 min
    python bench/resume.py --sizes 1000000 --workloads distinct   # 1M distinct keys: ~4 min

For each size and workload the journal is written through a record on ``sqlite:///``
(``batched``, one ``await rec.map("m").set(...)`` per entry, so every update is its own journal
entry), the record is closed, and then, each time with a fresh store object:

1. resume from the journal alone: ``open_store(url)`` + ``async with store.open_record(...)``;
2. ``await store.compact(run)`` (journal kept);
3. resume from the snapshot (plus nothing after it).

Workloads: ``distinct`` (every entry sets a new key: the map ends with N entries) and
``overwrite`` (N entries over 1,000 keys: the map ends with 1,000 entries and N tombstones).

Baselines in the same run: raw sqlite3 reading the journal's update blobs in order and applying
them one by one to a fresh pycrdt ``Doc`` (what any replayer must at least do), and raw sqlite3
reading the snapshot blob and applying it once.

Target: 1M entries resume in well under a second after compaction (we check < 0.5 s).
"""

from __future__ import annotations

import argparse
import gc
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from _common import Result, fmt, header, median, table
from pycrdt import Doc

import crdtstore

TARGET_S = 0.5
RUN = "resume"
OVERWRITE_KEYS = 1000


async def build(url: str, n: int, workload: str) -> float:
    """Write ``n`` journal entries; return the seconds it took (until flushed)."""
    async with (
        crdtstore.open_store(url, durability="batched") as store,
        store.open_record(RUN, "builder", "tool") as rec,
    ):
        m = rec.map("m")
        t0 = time.perf_counter()
        if workload == "distinct":
            for i in range(n):
                await m.set(f"k{i}", i)
        else:
            for i in range(n):
                await m.set(f"k{i % OVERWRITE_KEYS}", i)
        await rec.flush()
        seconds = time.perf_counter() - t0
        assert (await store.run_info(RUN)).head == n
    return seconds


async def resume(url: str, expect_keys: int, max_update: int | None = None) -> float:
    """Seconds from ``open_store`` to an open record (its document loaded)."""
    gc.collect()
    kw = {} if max_update is None else {"max_update": max_update}
    t0 = time.perf_counter()
    async with crdtstore.open_store(url, **kw) as store:  # type: ignore[arg-type]
        rec = store.open_record(RUN, "reader", "tool", create=False)
        await rec.start()
        seconds = time.perf_counter() - t0
        try:
            got = len(rec.map("m"))
            assert got == expect_keys, (got, expect_keys)
        finally:
            await rec.aclose()
    return seconds


def timed_resumes(url: str, keys: int, reps: int) -> tuple[float, str]:
    """Median resume time; if the record refuses its own snapshot as too large (seen with
    1M distinct keys: the snapshot exceeds the store's ``max_update``), say so and measure
    again with ``max_update`` raised, so the figure exists and the failure is reported."""
    try:
        return median([anyio.run(resume, url, keys) for _ in range(reps)]), ""
    except crdtstore.PayloadTooLarge as exc:
        note = f"FAILS with default max_update: {exc}; timed with max_update=256 MiB"
        print(f"   !! {note}", flush=True)
        t = median([anyio.run(resume, url, keys, 256 * 1024 * 1024) for _ in range(reps)])
        return t, note


async def compact(url: str) -> tuple[float, int]:
    async with crdtstore.open_store(url) as store:
        t0 = time.perf_counter()
        res = await store.compact(RUN)
        seconds = time.perf_counter() - t0
    return seconds, res.snapshot_bytes


def raw_replay(path: Path, expect_keys: int) -> float:
    """Seconds to read every update blob (raw sqlite3) and apply them one by one."""
    gc.collect()
    t0 = time.perf_counter()
    db = sqlite3.connect(path)
    doc: Doc[Any] = Doc()
    for (upd,) in db.execute("SELECT upd FROM journal ORDER BY run_id, seq"):
        doc.apply_update(upd)
    from pycrdt import Map

    seconds = time.perf_counter() - t0
    db.close()
    assert len(doc.get("m", type=Map)) == expect_keys
    return seconds


def raw_snapshot(path: Path, expect_keys: int) -> float:
    """Seconds to read the snapshot blob (raw sqlite3) and apply it once."""
    from pycrdt import Map

    gc.collect()
    t0 = time.perf_counter()
    db = sqlite3.connect(path)
    (upd,) = db.execute("SELECT upd FROM snapshots").fetchone()
    doc: Doc[Any] = Doc()
    doc.apply_update(upd)
    seconds = time.perf_counter() - t0
    db.close()
    assert len(doc.get("m", type=Map)) == expect_keys
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
    ap.add_argument("--workloads", default="distinct,overwrite")
    ap.add_argument("--repeats", type=int, default=3, help="resumes per case (1 at >= 1M)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in (args.sizes or "100000").split(",")]
    workloads = args.workloads.split(",")
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
            keys = n if workload == "distinct" else min(n, OVERWRITE_KEYS)
            reps = args.repeats if n < 1_000_000 else 1
            t_build = anyio.run(build, url, n, workload)
            print(
                f"   built {workload} x{n:,} in {t_build:.1f}s "
                f"({n / t_build:,.0f} entries/s, file {path.stat().st_size / 1e6:.0f} MB)",
                flush=True,
            )
            label = f"{n:,} {workload}"
            t_journal, note_j = timed_resumes(url, keys, reps)
            t_raw_journal = median([raw_replay(path, keys) for _ in range(reps)])
            print(
                f"   {label}: resume from journal {t_journal * 1000:,.0f} ms "
                f"(raw {t_raw_journal * 1000:,.0f} ms)",
                flush=True,
            )
            t_compact, snap_bytes = anyio.run(compact, url)
            print(
                f"   {label}: compaction {t_compact * 1000:,.0f} ms, snapshot "
                f"{snap_bytes / 1e6:.2f} MB",
                flush=True,
            )
            t_snap, note_s = timed_resumes(url, keys, max(reps, 3))
            t_raw_snap = median([raw_snapshot(path, keys) for _ in range(max(reps, 3))])
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
                    note_j,
                ]
            )
            rows.append(
                [
                    label,
                    "compaction",
                    fmt(t_compact * 1000, "ms"),
                    "",
                    "",
                    f"snapshot {snap_bytes / 1e6:.2f} MB",
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
            results.append(
                Result(
                    "resume",
                    f"resume from journal, {label}",
                    t_journal,
                    "s",
                    t_raw_journal,
                    t_journal / t_raw_journal,
                    "(informative)",
                    None,
                )
            )
            results.append(
                Result(
                    "resume",
                    f"compaction, {label}",
                    t_compact,
                    "s",
                    None,
                    None,
                    "(informative)",
                    None,
                )
            )
            path.unlink()
    print()
    table(["entries", "resume from", "crdtstore", "raw sqlite3 + pycrdt", "ratio", "notes"], rows)
    for r in results:
        r.emit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
