"""Helpers shared by the benchmark scripts (timing, tables, the machine-readable result line).

Every benchmark prints a human-readable table and, last, one line per headline figure::

    BENCH-RESULT {"bench": "local_write", "name": ..., "value": ..., "unit": ..., "baseline": ...,
                  "ratio": ..., "target": ..., "met": true}

``run_all.py`` collects those lines into its summary.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

RESULT_PREFIX = "BENCH-RESULT "


def machine() -> str:
    """One line describing where the figures were measured."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{time.strftime('%Y-%m-%d %H:%M')} | {os.cpu_count()} cores, {cpu} | "
        f"Python {platform.python_version()} | {platform.system()} {platform.release()}"
    )


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for pkg in ("crdtstore", "pycrdt", "anyio", "pycrdt-store"):
        try:
            out.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            out.append(f"{pkg} -")
    out.append(f"sqlite {__import__('sqlite3').sqlite_version}")
    return ", ".join(out)


def code_revision() -> str:
    """Which crdtstore code is measured: its folder, and the git commit (``+dirty`` when the
    package differs from it) or the ``REVISION`` file beside a snapshot copy."""
    import subprocess

    import crdtstore

    pkg = Path(crdtstore.__file__).resolve().parent
    root = pkg.parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", pkg.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return f"crdtstore at {pkg}, commit {rev}{'+dirty' if dirty.strip() else ''}"
    except (OSError, subprocess.CalledProcessError):
        marker = root / "REVISION"
        note = marker.read_text().strip() if marker.exists() else "unknown revision"
        return f"crdtstore at {pkg}, {note}"


def header(title: str, args: object) -> None:
    print(f"== {title}")
    print(f"   {machine()}")
    print(f"   {versions()}")
    print(f"   {code_revision()}; load average {os.getloadavg()[0]:.2f}")
    print(f"   args: {vars(args) if hasattr(args, '__dict__') else args}")
    sys.stdout.flush()


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def percentile(xs: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) by the nearest-rank method."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, round(p / 100 * len(s) + 0.5) - 1))
    return s[k]


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def fmt(x: float, unit: str = "") -> str:
    if x != x:  # NaN
        return "-"
    if abs(x) >= 100:
        s = f"{x:,.0f}"
    elif abs(x) >= 10:
        s = f"{x:.1f}"
    else:
        s = f"{x:.3g}"
    return f"{s} {unit}".rstrip()


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a Markdown table (pastes straight into bench/README.md)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
    sys.stdout.flush()


@dataclass
class Result:
    """One headline figure, with its baseline and target."""

    bench: str
    name: str
    value: float
    unit: str
    baseline: float | None
    ratio: float | None
    target: str
    met: bool | None

    def emit(self) -> None:
        print(RESULT_PREFIX + json.dumps(asdict(self)), flush=True)


class Timer:
    """``with Timer() as t: ...`` then ``t.seconds``."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._t0 = 0.0

    def __enter__(self) -> Timer:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0


# -- child processes (bench/hub.py, bench/ws_propagation.py) ------------------------------------


def spawn(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``python ARGS`` in bench/, stdin and stdout piped (text)."""
    return subprocess.Popen(
        [sys.executable, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parent,
    )


def readline(proc: subprocess.Popen[str], expect: str) -> str:
    """The rest of the first line of ``proc``'s output starting with ``expect``."""
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{proc.args!r} exited (code {proc.wait()}) before {expect!r}")
        if line.startswith(expect):
            return line[len(expect) :].strip()


def tell(proc: subprocess.Popen[str], text: str = "GO") -> None:
    """Write a line to ``proc``'s stdin."""
    stdin: IO[str] | None = proc.stdin
    assert stdin is not None
    stdin.write(text + "\n")
    stdin.flush()


def stop(proc: subprocess.Popen[str]) -> None:
    """Terminate ``proc`` (kill it after 10 s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
