"""Run every benchmark (quick mode by default) and summarise the headline figures.

    python bench/run_all.py                 # all benchmarks, --quick (a few minutes)
    python bench/run_all.py --full          # full sizes (about 10 minutes)
    python bench/run_all.py --only local_write,memory
    python bench/run_all.py --wait-quiet 300   # first wait (up to 300 s) for load < 0.5

Each benchmark runs as its own process; its output is passed through, and its
``BENCH-RESULT`` lines are collected into the summary table at the end. Exit status: 1 if a
benchmark crashed, else 0 (2 with ``--strict`` when a target was missed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import RESULT_PREFIX, fmt, machine, table

HERE = Path(__file__).resolve().parent
_FIRST = ["local_write", "sqlite_journal", "propagation", "resume", "memory"]
# every other bench/*.py script (not private, not this one) runs after those
BENCHES = [n for n in _FIRST if (HERE / f"{n}.py").exists()] + sorted(
    p.stem
    for p in HERE.glob("*.py")
    if not p.stem.startswith("_") and p.stem != "run_all" and p.stem not in _FIRST
)


def wait_quiet(limit: float, threshold: float) -> None:
    deadline = time.monotonic() + limit
    while os.getloadavg()[0] >= threshold and time.monotonic() < deadline:
        print(f"   waiting for a quiet machine (load {os.getloadavg()[0]:.2f})", flush=True)
        time.sleep(15)


def run(name: str, extra: list[str]) -> tuple[int, list[dict[str, Any]], float]:
    cmd = [sys.executable, str(HERE / f"{name}.py"), *extra]
    print(f"\n$ {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)
    results = []
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        if line.startswith(RESULT_PREFIX):
            results.append(json.loads(line[len(RESULT_PREFIX) :]))
    return proc.wait(), results, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sizes = ap.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="quick sizes (the default)")
    sizes.add_argument("--full", action="store_true", help="full sizes instead of --quick")
    ap.add_argument("--only", default=",".join(BENCHES), help="comma-separated benchmarks")
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to SECONDS for the 1-minute load average to drop",
    )
    ap.add_argument("--quiet-load", type=float, default=0.5, help="load counted as quiet")
    ap.add_argument("--strict", action="store_true", help="exit 2 when a target is missed")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(BENCHES)
    if unknown:
        ap.error(f"unknown benchmarks: {sorted(unknown)}")
    extra = [] if args.full else ["--quick"]

    crashed: list[str] = []
    all_results: list[dict[str, Any]] = []
    durations: dict[str, float] = {}
    for name in names:
        if args.wait_quiet:
            wait_quiet(args.wait_quiet, args.quiet_load)
        code, results, seconds = run(name, extra)
        durations[name] = seconds
        if code != 0:
            crashed.append(name)
        all_results.extend(results)

    print("\n== summary", "(full)" if args.full else "(quick)")
    print(f"   {machine()}")
    rows = []
    for r in all_results:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        base = "" if r["baseline"] is None else fmt(r["baseline"], r["unit"])
        met = {True: "met", False: "MISSED", None: ""}[r["met"]]
        rows.append(
            [r["bench"], r["name"], fmt(r["value"], r["unit"]), base, ratio, r["target"], met]
        )
    table(["bench", "figure", "value", "baseline", "ratio", "target", ""], rows)
    print("   durations: " + ", ".join(f"{k} {v:.0f}s" for k, v in durations.items()))
    if crashed:
        print(f"   CRASHED: {', '.join(crashed)}")
        return 1
    if args.strict and any(r["met"] is False for r in all_results):
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
