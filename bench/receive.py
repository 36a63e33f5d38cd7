"""Receiving side of propagation: CPU per remote journal entry, against raw pycrdt.

    python bench/receive.py                 # 2,000 entries, both modes
    python bench/receive.py --quick         # 500 entries
    python bench/receive.py --n 500 --profile   # and a cProfile of the receiver

A writer process (``multiprocessing`` spawn) opens its own store on one ``sqlite:///`` file and
writes ``--n`` entries, each one ``map("m").set("k{i}", i)`` (batched durability); the measuring
process holds a second record of the same run, subscribed with ``rec.changes(local=False)``, and
counts the CPU time (``time.process_time``, so the writer's work is not counted) until it has
observed every entry. Two modes:

- ``paced``: the writer writes one entry every ``--interval`` seconds, so the receiver takes
  them one wake-up at a time, as in ``propagation.py`` (datagram, tail read, apply, changes);
- ``catch-up``: the receiver's event loop is held (it joins the writer process) while the
  writer writes everything; then it takes the backlog in the tail's chunks.

Baseline in the same run: the same rows read back with raw ``sqlite3`` and applied with
``Doc.apply_update`` to a fresh pycrdt doc, per row (one ``SELECT`` per entry, as a reader woken
for each entry) for ``paced``, and in one ``SELECT`` for ``catch-up``. The ratio is crdtstore's
CPU per entry over the baseline's (lower is better).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import Result, fmt, header, median, table

RUN = "recv"


def writer(url: str, n: int, interval: float, go: Any) -> None:
    import anyio

    import crdtstore

    async def main() -> None:
        async with (
            crdtstore.open_store(url) as store,
            store.open_record(RUN, "writer", "tool") as rec,
        ):
            m = rec.map("m")
            go.wait()
            for i in range(n):
                await m.set(f"k{i}", i)
                if interval:
                    await anyio.sleep(interval)
            await rec.flush()

    anyio.run(main)


def receive(url: str, n: int, interval: float, profile: bool) -> tuple[float, int]:
    """CPU seconds the receiving process spent taking in ``n`` entries, and the number of
    changes it observed."""
    import anyio

    import crdtstore

    ctx = mp.get_context("spawn")
    go = ctx.Event()
    proc = ctx.Process(target=writer, args=(url, n, interval, go))
    proc.start()

    async def main() -> tuple[float, int]:
        async with (
            crdtstore.open_store(url) as store,
            store.open_record(RUN, "reader", "tool") as rec,
        ):
            stream = rec.changes(local=False, buffer=n + 16)
            seen = changes = 0
            prof: Any = None
            go.set()
            if not interval:
                proc.join()  # hold the loop: the backlog is taken in after the writer is done
            if profile:
                import cProfile

                prof = cProfile.Profile()
                prof.enable()
            c0 = time.process_time()
            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:

                    async def watch_writer() -> None:
                        while proc.is_alive():
                            await anyio.sleep(0.1)
                        if proc.exitcode:
                            raise SystemExit(f"the writer process failed ({proc.exitcode})")

                    tg.start_soon(watch_writer)
                    async for change in stream:
                        changes += 1
                        seen += sum(1 for op in change.ops if op[2] == "set")
                        if seen >= n:
                            break
                    tg.cancel_scope.cancel()
            cpu = time.process_time() - c0
            if prof is not None:
                import pstats

                prof.disable()
                pstats.Stats(prof).sort_stats("tottime" if interval else "cumulative").print_stats(
                    30
                )
            if stream.lost:
                raise SystemExit(f"lost {stream.lost} changes")
            return cpu, changes

    try:
        return anyio.run(main)
    finally:
        proc.join()


def raw_baseline(path: Path, per_row: bool) -> tuple[float, int]:
    """CPU seconds to read the run's entries with sqlite3 and apply them to a fresh Doc."""
    from pycrdt import Doc

    db = sqlite3.connect(path)
    rid = db.execute("SELECT id FROM runs WHERE run = ?", (RUN,)).fetchone()[0]
    doc: Doc[Any] = Doc()
    c0 = time.process_time()
    count = 0
    if per_row:
        seq = 0
        while True:
            row = db.execute(
                "SELECT seq, upd FROM journal WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT 1",
                (rid, seq),
            ).fetchone()
            if row is None:
                break
            seq = row[0]
            doc.apply_update(row[1])
            count += 1
    else:
        for (upd,) in db.execute(
            "SELECT upd FROM journal WHERE run_id = ? ORDER BY seq", (rid,)
        ).fetchall():
            doc.apply_update(upd)
            count += 1
    cpu = time.process_time() - c0
    db.close()
    return cpu, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="entries written")
    ap.add_argument("--quick", action="store_true", help="500 entries (for run_all.py)")
    ap.add_argument("--interval", type=float, default=0.002, help="paced mode: seconds apart")
    ap.add_argument("--modes", default="paced,catch-up")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the receiver")
    args = ap.parse_args()
    if args.quick:
        args.n = min(args.n, 500)
    header("receive: CPU per received remote entry (single receiving process)", args)
    rows = []
    for mode in args.modes.split(","):
        ours, raws = [], []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "store.db"
                url = f"sqlite:///{path}"
                interval = args.interval if mode == "paced" else 0.0
                cpu, _changes = receive(url, args.n, interval, args.profile)
                raw, count = raw_baseline(path, per_row=mode == "paced")
                if count < args.n:
                    raise SystemExit(f"journal holds {count} entries, expected {args.n}")
                ours.append(cpu / args.n * 1e6)
                raws.append(raw / count * 1e6)
        us, base = median(ours), median(raws)
        rows.append([mode, args.n, fmt(us, "us"), fmt(base, "us"), f"{us / base:.1f}x"])
        Result(
            "receive",
            f"cpu_per_entry_{mode}",
            round(us, 1),
            "us",
            round(base, 1),
            round(us / base, 2),
            "lower is better",
            None,
        ).emit()
        print(f"   {mode}: runs {[round(x) for x in ours]} us, raw {[round(x) for x in raws]} us")
    table(["mode", "entries", "crdtstore CPU/entry", "raw sqlite3+pycrdt", "ratio"], rows)


if __name__ == "__main__":
    main()
