"""Run the fuzz targets, or write their seed corpus.

python -m tests.fuzz run [--budget 30] [--out DIR] [TARGET ...]
    each target (default: all) for --budget seconds in its own process, starting from
    its committed corpus (tests/fuzz/corpus/<target>/; what it finds goes to a scratch
    directory, not there); prints executions per second, coverage (libFuzzer's cov and
    ft), and crashes (their inputs are kept under --out). Exit status 1 on any crash.
    Long runs: python -m tests.fuzz run --budget 600
python -m tests.fuzz seed
    write the seed inputs of tests/fuzz/seeds.py into the corpus (new files only)
python -m tests.fuzz list
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.fuzz._harness import CORPUS_DIR, FUZZ_DIR, ROOT

TARGETS = sorted(p.stem.removeprefix("fuzz_") for p in FUZZ_DIR.glob("fuzz_*.py"))
_STATS = re.compile(r"cov: (\d+) ft: (\d+) corp: (\d+)/\S+.*?exec/s: (\d+)")
_DONE = re.compile(r"Done (\d+) runs in (\d+) second")
_CRASH = re.compile(r"Test unit written to (\S+)")


@dataclass
class Result:
    target: str
    runs: int
    seconds: float
    cov: int
    ft: int
    corpus: int
    crashes: list[str]
    returncode: int
    output: str

    @property
    def execs_per_second(self) -> float:
        return self.runs / self.seconds if self.seconds else 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.crashes


def run_target(target: str, budget: float, out: Path) -> Result:
    """Fuzz one target for ``budget`` seconds in a subprocess."""
    out.mkdir(parents=True, exist_ok=True)
    corpus = CORPUS_DIR / target
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{target}-") as scratch:
        cmd = [
            sys.executable,
            str(FUZZ_DIR / f"fuzz_{target}.py"),
            scratch,
            *([str(corpus)] if corpus.is_dir() else []),
            f"-max_total_time={max(1, int(budget))}",
            "-timeout=20",
            "-rss_limit_mb=2048",
            "-max_len=4096",
            f"-artifact_prefix={out}/{target}-",
            "-print_final_stats=1",
        ]
        start = time.monotonic()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, errors="replace"
        )
        seconds = time.monotonic() - start
    text = proc.stdout + proc.stderr
    stats = _STATS.findall(text)
    cov, ft, corp, _ = (int(x) for x in stats[-1]) if stats else (0, 0, 0, 0)
    done = _DONE.search(text)
    runs = int(done.group(1)) if done else 0
    if done:
        seconds = max(1.0, float(done.group(2)))
    else:
        execs = re.findall(r"stat::number_of_executed_units: (\d+)", text)
        runs = int(execs[-1]) if execs else 0
    crashes = _CRASH.findall(text)
    return Result(target, runs, seconds, cov, ft, corp, crashes, proc.returncode, text)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fuzz",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="fuzz targets for a budget each")
    run.add_argument("--budget", type=float, default=30.0, help="seconds per target")
    run.add_argument("--out", type=Path, default=Path("fuzz-artifacts"))
    run.add_argument("targets", nargs="*", choices=[[], *TARGETS], metavar="TARGET")
    sub.add_parser("seed", help="write the seed corpus")
    sub.add_parser("list", help="list the targets")
    args = parser.parse_args(argv)
    if args.cmd == "list":
        print("\n".join(TARGETS))
        return 0
    if args.cmd == "seed":
        from tests.fuzz import seeds

        for name, make in seeds.TARGETS.items():
            print(f"{name}: {seeds.write(name, make())} new inputs")
        return 0
    failed = False
    print(f"{'target':16} {'runs':>9} {'exec/s':>8} {'cov':>6} {'ft':>6} {'corpus':>6}  crashes")
    for target in args.targets or TARGETS:
        r = run_target(target, args.budget, args.out)
        verdict = ", ".join(r.crashes) or ("-" if r.ok else f"exit {r.returncode}")
        print(
            f"{target:16} {r.runs:9d} {r.execs_per_second:8.0f} {r.cov:6d} {r.ft:6d} "
            f"{r.corpus:6d}  {verdict}",
            flush=True,
        )
        if not r.ok:
            failed = True
            sys.stderr.write(r.output[-4000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
