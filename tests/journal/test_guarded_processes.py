"""Guarded writes from real processes on one SQLite store (and on Redis:
tests/journal/test_guarded_append.py): no lost increment, and every refused write is told the
version that was current at the store's authority."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

import crdtstore

HERE = Path(__file__).resolve().parents[1]


def run_counters(url: str, processes: int, seconds: float) -> list[dict[str, object]]:
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "_guarded_proc.py"), url, "r", f"p{i}", str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    try:
        outs = [p.communicate(timeout=seconds + 60)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0] * processes
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


@pytest.mark.parametrize(("processes", "seconds"), [(4, 3.0)])
def test_guarded_counter_across_processes(tmp_path: Path, processes: int, seconds: float) -> None:
    check_counters(f"sqlite:///{tmp_path}/store.db", processes, seconds)


def check_counters(url: str, processes: int, seconds: float) -> None:
    """``processes`` processes increment one counter by guarded writes for ``seconds``: every
    success is in the journal once, in order, and every refusal names a real version."""
    results = run_counters(url, processes, seconds)
    ok = sum(int(r["ok"]) for r in results)  # type: ignore[call-overload]
    refusals = [x for r in results for x in r["refusals"]]  # type: ignore[attr-defined]
    assert ok > 0
    assert len(refusals) > 0, "the processes never contended: the test proves nothing"

    async def check() -> None:
        async with crdtstore.open_store(url) as store:
            journal = await store.journal("r", limit=1_000_000)
            async with store.open_record(run="r", agent="checker") as rec:
                assert rec.map("counter")["n"] == ok
        # every journal entry is one successful increment, in order: 1, 2, 3, ...
        values = {e.seq: e.effect[0][4] for e in journal}
        assert sorted(values.values()) == list(range(1, ok + 1))
        assert len(journal) == ok
        for tried, reported, value in refusals:
            # the refusal reported a version that really was current at some point (a journal
            # position that wrote exactly the reported value), newer than the one tried
            assert reported in values, (tried, reported)
            assert values[reported] == value
            assert tried is None or reported > tried

    anyio.run(check)


@pytest.mark.slow
def test_guarded_counter_soak(tmp_path: Path) -> None:
    test_guarded_counter_across_processes(tmp_path, 8, 30.0)
