"""Guarded writers in several real processes on one SQLite store, in random interleavings
(issue 20: the guarded writes a record has waiting at the same time are decided in one
authority transaction, ``crdtstore.record._guarded_group``).

Hypothesis draws, for each of three processes, a few writer tasks (so that writes wait for
one group together) and their ops: a key of two, which version to name (the one just read,
an older one, or the one a refusal reported: a retry that joins the group under way) and
checkpoints before the write. Processes start together; their interleaving is the
machine's. Checked against the journal:

- every success was decided on the current version: the version it named is the position
  of the last entry before it that wrote the key (0: none);
- every refusal carries the true current version: an entry that wrote the key, with the
  value reported, and newer than a version the writer had read;
- the journal holds the successes and nothing else, and the final state (of every process
  and of a fresh reader) is the successes applied in journal order.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import crdtstore

HERE = Path(__file__).resolve().parents[1]
PROCESSES = 3
KEYS = ("a", "b")


class Fleet:
    """Processes of tests/_guarded_group_proc.py on one store, fed one schedule at a time."""

    def __init__(self, url: str, n: int) -> None:
        self.url = url
        self.procs = [
            subprocess.Popen(
                [sys.executable, str(HERE / "_guarded_group_proc.py"), url, f"p{i}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(n)
        ]

    def run(self, run: str, schedule: list[list[list[list[Any]]]]) -> list[dict[str, Any]]:
        for proc, writers in zip(self.procs, schedule, strict=True):
            self._send(proc, json.dumps({"run": run, "writers": writers}))
        for proc in self.procs:
            assert self._line(proc) == "ready"
        for proc in self.procs:  # every process starts its writers at once
            self._send(proc, "go")
        for proc in self.procs:  # (its attempts)
            json.loads(self._line(proc))
        for proc in self.procs:  # every process is done: each reads the final state
            self._send(proc, "sync")
        return [json.loads(self._line(proc)) for proc in self.procs]

    @staticmethod
    def _send(proc: subprocess.Popen[str], line: str) -> None:
        assert proc.stdin is not None
        proc.stdin.write(line + "\n")
        proc.stdin.flush()

    @staticmethod
    def _line(proc: subprocess.Popen[str]) -> str:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"{proc.args} ended (exit {proc.wait()})")
        return line.strip()

    def close(self) -> None:
        for proc in self.procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        assert [p.returncode for p in self.procs] == [0] * len(self.procs)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    path = tmp_path_factory.mktemp("interleavings") / "store.db"
    f = Fleet(f"sqlite:///{path}", PROCESSES)
    try:
        yield f
    finally:
        f.close()


def schedules(max_ops: int) -> st.SearchStrategy[list[list[list[list[Any]]]]]:
    op = st.tuples(
        st.sampled_from(KEYS),
        st.sampled_from(["read", "read", "retry", "stale"]),
        st.integers(0, 2),
    ).map(list)
    writer = st.lists(op, min_size=1, max_size=max_ops)
    process = st.lists(writer, min_size=1, max_size=4)
    return st.lists(process, min_size=PROCESSES, max_size=PROCESSES)


async def _journal_and_state(url: str, run: str) -> tuple[list[crdtstore.JournalEntry], Any]:
    async with crdtstore.open_store(url) as store:
        journal = await store.journal(run, limit=1_000_000)
        async with store.open_record(run=run, agent="checker", create=False) as rec:
            return journal, rec.map("m").to_dict()


def check(url: str, run: str, results: list[dict[str, Any]]) -> None:
    journal, state = anyio.run(_journal_and_state, url, run)
    attempts = [a for r in results for a in r["attempts"]]
    assert attempts, "no write was tried"
    wrote: dict[int, tuple[str, Any]] = {}  # seq -> (key, value) of every journal entry
    for e in journal:
        assert len(e.effect) == 1 and e.effect[0][:3] == ["map", "m", "set"], e.effect
        wrote[e.seq] = (e.effect[0][3], e.effect[0][4])
    seq_of = {value: seq for seq, (_, value) in wrote.items()}
    oks = [a for a in attempts if a[3] == "ok"]
    refused = [a for a in attempts if a[3] == "stale"]
    # the journal holds the successes and nothing else
    assert sorted(seq_of) == sorted(a[1] for a in oks), "a refused write was journaled, or lost"
    assert len(seq_of) == len(wrote)

    def version_before(key: str, seq: int) -> int:
        return max((s for s, (k, _) in wrote.items() if k == key and s < seq), default=0)

    for key, value, named, _ in oks:  # decided on the current version
        assert version_before(key, seq_of[value]) == named, (key, value, named)
    for key, value, named, _, current, current_value in refused:  # told the true version
        assert current != named, (key, value, named, current)
        if current == 0:
            assert current_value is None
        else:
            assert wrote[current] == (key, current_value), (key, named, current)
        if named:  # a version the writer had seen: the current one is newer
            assert current > named, (key, named, current)
    # the final state: the successes applied in journal order
    expected: dict[str, Any] = {}
    for seq in sorted(wrote):
        key, value = wrote[seq]
        expected[key] = value
    assert state == expected
    for r in results:
        assert r["state"] == expected, "a process ended with another state"


def interleavings(fleet: Fleet, schedule: list[list[list[list[Any]]]]) -> list[dict[str, Any]]:
    run = f"r{uuid.uuid4().hex[:12]}"
    results = fleet.run(run, schedule)
    check(fleet.url, run, results)
    return results


# every writer reads again after each write at once: a success's next write joins the group
# under way (a chain of successes per transaction), and the refused ones retry into it
CHAINS = [[[["a", "read", 0]] * 6] * 4] * PROCESSES


def test_guarded_writers_chain_in_one_transaction(fleet: Fleet) -> None:
    """The schedule that makes chains, checked as every other one is, and shown to chain: a
    process decided at least two successes per transaction it opened (without chains, the
    writers of a process that read together refuse each other: about one)."""
    results = interleavings(fleet, CHAINS)
    per = [(sum(a[3] == "ok" for a in r["attempts"]), r["transactions"]) for r in results]
    assert any(ok >= 2 * opened for ok, opened in per), per


@settings(max_examples=25)
@example(schedule=CHAINS)
@given(schedule=schedules(max_ops=6))
def test_guarded_writers_in_processes_decide_on_the_current_version(
    fleet: Fleet, schedule: list[list[list[list[Any]]]]
) -> None:
    interleavings(fleet, schedule)


@pytest.mark.slow
@settings(max_examples=300)
@given(schedule=schedules(max_ops=20))
def test_guarded_writers_in_processes_soak(
    fleet: Fleet, schedule: list[list[list[list[Any]]]]
) -> None:
    interleavings(fleet, schedule)
