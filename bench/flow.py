"""The workflow kernel on SQLite: its overhead per empty step against the same awaitables in a
plain anyio task group, and a 1,000-branch fan-out with max_concurrency 16, side by side.

    python bench/flow.py            # 300 sequential steps, 1,000 branches, 3 repeats
    python bench/flow.py --quick    # 100 steps, 300 branches, 2 repeats

- **empty step, sequential**: a workflow of N ``python`` steps whose body is ``async def
  step(ctx): return None``, run by ``run_workflow`` on a fresh SQLite store, against the
  baseline of the same N awaitables each run in its own ``anyio`` task group one after the
  other. The figure is the kernel's marginal cost per step, ``(T(N) - T(1)) / (N - 1)``
  (the kernel's start, its record and lease, not counted), on wall time. Target: <= 1 ms.
  What a step costs: its ``pending``, ``running`` (journaled before the body runs: the
  write-ahead of the attempt) and ``done`` entries in the state map, a step context and a
  toolset, and the attributed block around the body.
- **fan-out**: one ``parallel`` step of B empty branches, ``max_concurrency`` 16, against a
  task group of B awaitables under an ``anyio.CapacityLimiter(16)``. Reported per branch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from _common import Result, header, table

import crdtstore
from crdtstore.flow import StepContext, run_workflow

TARGET_MS = 1.0
LIMIT = 16


async def empty(ctx: StepContext | None) -> None:
    return None


def sequential_spec(n: int) -> dict[str, Any]:
    return {"name": "bench", "steps": [{"id": f"s{i}", "kind": "python", "call": empty}
                                       for i in range(n)]}  # fmt: skip


def fanout_spec(n: int) -> dict[str, Any]:
    branches = [{"id": f"b{i}", "kind": "python", "call": empty} for i in range(n)]
    return {"name": "bench", "steps": [{"id": "p", "kind": "parallel", "branches": branches,
                                        "max_concurrency": LIMIT}]}  # fmt: skip


async def kernel_seconds(tmp: Path, spec: dict[str, Any]) -> float:
    with tempfile.TemporaryDirectory(dir=tmp) as d:
        async with crdtstore.open_store(f"sqlite:///{d}/store.db") as store:
            t0 = time.perf_counter()
            await run_workflow(store, spec, "r1")
            return time.perf_counter() - t0


async def plain_sequential(n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        async with anyio.create_task_group() as tg:
            tg.start_soon(empty, None)
    return time.perf_counter() - t0


async def plain_fanout(n: int) -> float:
    limiter = anyio.CapacityLimiter(LIMIT)

    async def one() -> None:
        async with limiter:
            await empty(None)

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)
    return time.perf_counter() - t0


async def measure(args: argparse.Namespace, tmp: Path) -> list[Result]:
    n, b, repeats = args.steps, args.branches, args.repeats
    one, seq, base_seq, fan, base_fan = [], [], [], [], []
    for _ in range(repeats):  # interleaved, so that drifting load hits both sides alike
        one.append(await kernel_seconds(tmp, sequential_spec(1)))
        seq.append(await kernel_seconds(tmp, sequential_spec(n)))
        base_seq.append(await plain_sequential(n))
        fan.append(await kernel_seconds(tmp, fanout_spec(b)))
        base_fan.append(await plain_fanout(b))
    med = statistics.median
    per_step = (med(seq) - med(one)) / (n - 1) * 1000
    base_step = med(base_seq) / n * 1000
    per_branch = med(fan) / b * 1000
    base_branch = med(base_fan) / b * 1000
    print()
    print(f"SQLite, anyio backend {args.backend}, medians of {repeats} runs; kernel start "
          f"(1-step workflow) {med(one) * 1000:.1f} ms")  # fmt: skip
    table(
        ["figure", "kernel", "plain anyio (same run)", "kernel - plain", "ratio", "target"],
        [
            [f"empty step, {n} sequential (marginal, per step)", f"{per_step:.3f} ms",
             f"{base_step * 1000:.1f} us", f"{per_step - base_step:.3f} ms",
             f"{per_step / base_step:,.0f}x", f"<= {TARGET_MS} ms "
             + ("met" if per_step <= TARGET_MS else "MISSED")],
            [f"{b}-branch fan-out, max_concurrency {LIMIT} (per branch)",
             f"{per_branch:.3f} ms", f"{base_branch * 1000:.1f} us",
             f"{per_branch - base_branch:.3f} ms", f"{per_branch / base_branch:,.0f}x", "-"],
            [f"{b}-branch fan-out, whole", f"{med(fan) * 1000:.0f} ms",
             f"{med(base_fan) * 1000:.1f} ms", "", "", ""],
        ],
    )  # fmt: skip
    return [
        Result("flow", "empty step overhead (sequential)", per_step, "ms", base_step,
               per_step / base_step, f"<= {TARGET_MS} ms", per_step <= TARGET_MS),
        Result("flow", f"fan-out {b} branches, max_concurrency {LIMIT}, per branch",
               per_branch, "ms", base_branch, per_branch / base_branch, "-", None),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--branches", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    args = ap.parse_args(argv)
    args.steps = args.steps or (100 if args.quick else 300)
    args.branches = args.branches or (300 if args.quick else 1000)
    args.repeats = args.repeats or (2 if args.quick else 3)
    header("flow: kernel overhead per step, fan-out", args)
    with tempfile.TemporaryDirectory() as d:
        results = anyio.run(measure, args, Path(d), backend=args.backend)
    for res in results:
        res.emit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
