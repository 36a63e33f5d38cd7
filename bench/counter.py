"""A counter ``add`` against a plain map ``set``, side by side in one run (issue 19 part 2).

    python bench/counter.py            # 20k operations per variant, best of 5 runs
    python bench/counter.py --quick    # 5k operations, best of 3 runs

Variants (fresh ``memory://`` store per run, the two sides interleaved run by run; a run's
time ends when ``await rec.flush()`` returns, every entry journaled):

- ``await rec.map("m").set("k", i)``: the baseline, one journal entry per write;
- ``await rec.counter("c").add(1)``: one journal entry per add (a map set of the replica's
  own key, its running total), through the same write path plus the counter's checks;
- ``add(1)`` on a counter with ``max_value``: decided at the store's authority (a guarded
  write), shown for what a budget costs; it has no target.

Target: ``add`` takes at most 1.5x the time of ``set`` (CPU time, best runs).
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from _common import Result, fmt, header, table

import crdtstore
from crdtstore import CollectionSpec

TARGET = 1.5


async def _timed(
    n: int, write: Callable[[crdtstore.Record, int], Awaitable[Any]], schema: Any = None
) -> tuple[float, float]:
    async with crdtstore.open_store(f"memory://bench-counter-{time.monotonic_ns()}") as store:
        async with store.open_record(run="r", agent="bench", schema=schema) as rec:
            await write(rec, 0)  # declare, create the root, warm the caches
            await rec.flush()
            gc.collect()
            c0, t0 = time.process_time(), time.perf_counter()
            for i in range(1, n + 1):
                await write(rec, i)
            await rec.flush()
            return time.perf_counter() - t0, time.process_time() - c0


async def map_set(rec: crdtstore.Record, i: int) -> None:
    await rec.map("m").set("k", i)


async def counter_add(rec: crdtstore.Record, i: int) -> None:
    await rec.counter("c").add(1)


BUDGET = {"b": CollectionSpec(kind="counter", max_value=10**12)}


async def budget_add(rec: crdtstore.Record, i: int) -> None:
    await rec.counter("b").add(1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="5,000 operations, best of 3 runs")
    ap.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    args = ap.parse_args(argv)
    n = 5_000 if args.quick else 20_000
    repeats = 3 if args.quick else 5
    header("counter: counter add vs map set, memory://", args)
    variants: dict[str, tuple[Callable[..., Awaitable[Any]], Any, int]] = {
        "map set": (map_set, None, n),
        "counter add": (counter_add, None, n),
        "counter add, max_value": (budget_add, BUDGET, max(500, n // 10)),
    }
    best: dict[str, tuple[float, float]] = {}
    for _ in range(repeats):  # interleaved, so drift hits every variant alike
        for name, (fn, schema, count) in variants.items():
            wall, cpu = anyio.run(_timed, count, fn, schema, backend=args.backend)
            per = (wall / count, cpu / count)
            old = best.get(name)
            best[name] = per if old is None else (min(old[0], per[0]), min(old[1], per[1]))
    base_cpu = best["map set"][1]
    rows = []
    for name, (wall, cpu) in best.items():
        rows.append([name, fmt(1 / wall, "ops/s"), f"{wall * 1e6:.1f} us", f"{cpu * 1e6:.1f} us",
                     f"{cpu / base_cpu:.2f}x"])  # fmt: skip
    print()
    print(f"{n:,} operations per run ({variants['counter add, max_value'][2]:,} with max_value),"
          f" best of {repeats} runs, anyio backend {args.backend}")  # fmt: skip
    table(["variant", "rate", "wall per op", "CPU per op", "CPU vs map set"], rows)
    ratio = best["counter add"][1] / base_cpu
    Result("counter", "counter add vs map set (CPU time)", 1 / best["counter add"][1], "ops/s",
           1 / base_cpu, ratio, f"<= {TARGET}x map set", ratio <= TARGET).emit()  # fmt: skip
    budget = best["counter add, max_value"][1] / base_cpu
    Result("counter", "budgeted counter add vs map set (CPU time)",
           1 / best["counter add, max_value"][1], "ops/s", 1 / base_cpu, budget, "-",
           None).emit()  # fmt: skip
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
