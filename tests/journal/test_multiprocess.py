"""Real processes on one SQLite store: concurrent writers, ``kill -9``, a corrupted journal.

The agent processes run ``tests/_agent_proc.py`` and report on stdout (see its docstring).
Every wait here is a condition with a deadline (polled, with short sleeps); the other sleeps
are the random moments at which a writer is killed. Every process a test starts is killed
when the test ends, whatever the outcome (the ``spawn`` fixture).
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import sqlite3
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import crdtstore
from crdtstore import JournalCorrupt, blocking

HELPER = Path(__file__).resolve().parents[1] / "_agent_proc.py"
RUN = "run-1"
START_TIMEOUT = 60.0  # python start-up and import, 8 at a time on 2 cores


class Agent:
    """One agent process, its stdout read line by line by a thread."""

    def __init__(self, tmp_path: Path, name: str, args: tuple[str, ...]) -> None:
        self.name = name
        self.stderr_path = tmp_path / f"{name}.stderr"
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(HELPER), *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        self.lines: list[str] = []
        self.eof = False
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.endswith("\n"):
                break  # cut short by a kill: it was never acknowledged
            with self._cond:
                self.lines.append(line[:-1])
                self._cond.notify_all()
        with self._cond:
            self.eof = True
            self._cond.notify_all()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def wait_line(self, prefix: str, timeout: float) -> str:
        """The first line starting with ``prefix``; fails at EOF or after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
                left = deadline - time.monotonic()
                if self.eof or left <= 0:
                    what = "exited" if self.eof else f"no {prefix!r} line within {timeout}s"
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.proc.wait(5 if self.eof else 0.1)
                    pytest.fail(
                        f"agent {self.name} {what}; rc={self.proc.poll()}\n"
                        f"stdout tail: {self.lines[-5:]}\nstderr:\n{self.stderr()}"
                    )
                self._cond.wait(left)

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def wait_exit(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"agent {self.name} did not exit within {timeout}s\n{self.stderr()}")
        self._reader.join(timeout)
        return rc

    def kill9(self) -> list[str]:
        """SIGKILL the process; return every complete line it wrote before dying."""
        if self.proc.poll() is None:
            self.proc.kill()  # SIGKILL on POSIX
        self.wait_exit(30)
        assert self.eof
        return list(self.lines)

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        self._reader.join(30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                # closing stdin flushes its buffer, which fails if the child is gone
                with contextlib.suppress(BrokenPipeError):
                    pipe.close()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Agent]]:
    """Start agent processes: ``spawn(name, command, *args)``; all are killed at the end."""
    started: list[Agent] = []

    def make(name: str, *args: str) -> Agent:
        agent = Agent(tmp_path, name, args)
        started.append(agent)
        return agent

    try:
        yield make
    finally:
        for agent in started:
            agent.cleanup()


def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/store.db"


def read_back(url: str) -> dict[str, Any]:
    """The run's record as a fresh process-local reader sees it."""
    with blocking.open_store(url) as store:
        with store.open_record(run=RUN, agent="checker", source="system", create=False) as rec:
            return rec.to_dict()


def check_file(url: str) -> None:
    """The store file is sound: SQLite's integrity check passes and the run's journal
    positions are dense, 1..head, with a checksum that matches every entry."""
    path = url[len("sqlite:///") :]
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        (head,) = db.execute("SELECT head FROM runs WHERE run = ?", (RUN,)).fetchone()
        count, low, high = db.execute("SELECT count(*), min(seq), max(seq) FROM journal").fetchone()
        assert (count, low, high) == (head, 1, head)
        for seq, upd, crc in db.execute("SELECT seq, upd, crc FROM journal"):
            assert zlib.crc32(upd) == crc, f"entry {seq} fails its checksum"
    finally:
        db.close()


# -- 1. many writers ------------------------------------------------------------------------------


def test_eight_writers_converge(tmp_path: Path, spawn: Callable[..., Agent]) -> None:
    """8 processes each write 2,000 own keys (and 100 list appends) at the same time; each
    waits until it sees all 16,000 keys; the store then holds them all and is sound."""
    url = store_url(tmp_path)
    n, writers, every = 2000, 8, 20
    agents = [
        spawn(
            f"w{i}",
            "fill",
            url,
            RUN,
            f"w{i}",
            "--n",
            str(n),
            "--agents",
            str(writers),
            "--every",
            str(every),
            "--deadline",
            "120",
        )
        for i in range(writers)
    ]
    for a in agents:
        a.wait_line("READY", START_TIMEOUT)
    for a in agents:
        a.send("go")
    reports = [json.loads(a.wait_line("OK", 150).split(" ", 1)[1]) for a in agents]
    for a in agents:
        assert a.wait_exit(30) == 0, a.stderr()
    for rep in reports:
        assert rep["entries"] == n * writers
        assert rep["missing"] == []
        assert rep["log"] == writers * (n // every) and rep["log_ok"]
        assert rep["synced"] == writers * (n + n // every)

    data = read_back(url)
    assert data["m"] == {f"w{w}:{i}": i for w in range(writers) for i in range(n)}
    assert sorted(data["log"]) == sorted(
        f"w{w}:{i}" for w in range(writers) for i in range(0, n, every)
    )
    check_file(url)


# -- 2. kill -9 -----------------------------------------------------------------------------------


def _prefix_count(keys: dict[str, Any], prefix: str) -> int:
    """How many keys ``prefix:0``, ``prefix:1``, ... are present, checking they form a
    prefix of the write order (the journal is appended in order, so no hole can exist)."""
    got = sorted(int(k.rsplit(":", 1)[1]) for k in keys if k.rsplit(":", 1)[0] == prefix)
    assert got == list(range(len(got))), f"{prefix}: a hole in the written keys: {got[:20]}..."
    for i in got:
        assert keys[f"{prefix}:{i}"] == i
    return len(got)


def kill_loop(
    tmp_path: Path, spawn: Callable[..., Agent], *, mode: str, rounds: int, seed: int
) -> None:
    """Restart a writer ``rounds`` times, SIGKILLing it at a random moment each time, while a
    durable writer runs beside it all along; then check what was acknowledged survived."""
    rng = random.Random(seed)
    url = store_url(tmp_path)
    stop = tmp_path / "stop"
    survivor = spawn(
        "survivor",
        "durable",
        url,
        RUN,
        "survivor",
        "--prefix",
        "s",
        "--stop",
        str(stop),
        "--pause",
        "0.01",
    )
    survivor.wait_line("READY", START_TIMEOUT)
    acked: dict[str, int] = {}  # round prefix -> number of keys acknowledged (0..n-1)
    for r in range(rounds):
        prefix = f"k{r}"
        if mode == "durable":
            args: tuple[str, ...] = ("durable", url, RUN, "victim", "--prefix", prefix)
        else:
            args = ("batched", url, RUN, "victim", "--prefix", prefix, "--seed", str(seed + r))
        victim = spawn(f"victim{r}", *args)
        if rng.random() < 0.2:
            # any moment, opening the store and loading the record included
            time.sleep(rng.uniform(0.0, 1.0))
        else:
            victim.wait_line("READY", START_TIMEOUT)
            time.sleep(rng.uniform(0.0, 0.4))
        lines = victim.kill9()
        assert not any(line.startswith("OK") for line in lines), "victim finished before the kill"
        if mode == "durable":
            keys = [line.split()[1] for line in lines if line.startswith("ACK ")]
            assert keys == [f"{prefix}:{i}" for i in range(len(keys))]
            acked[prefix] = len(keys)
        else:
            last = [int(line.split()[2]) for line in lines if line.startswith("FLUSHED ")]
            acked[prefix] = last[-1] + 1 if last else 0
    stop.touch()
    survivor_report = json.loads(survivor.wait_line("OK", 60).split(" ", 1)[1])
    assert survivor.wait_exit(30) == 0, survivor.stderr()
    survivor_acks = [line for line in survivor.lines if line.startswith("ACK ")]
    assert len(survivor_acks) == survivor_report["written"]

    data = read_back(url)
    keys = data["m"]
    # the survivor closed cleanly: exactly what it acknowledged, nothing lost, nothing more
    assert _prefix_count(keys, "s") == survivor_report["written"]
    for prefix, n in acked.items():
        present = _prefix_count(keys, prefix)
        if mode == "durable":
            # one write at a time: at most the one in flight at the kill is there unacknowledged
            assert n <= present <= n + 1, (prefix, n, present)
        else:
            assert present >= n, (prefix, n, present)
            # list appends follow the same order: those of every present key but maybe the last
            logged = sorted(
                int(v.rsplit(":", 1)[1]) for v in data.get("log", []) if v.startswith(f"{prefix}:")
            )
            expected = list(range(0, present, 10))
            assert logged in (expected, expected[:-1]), (prefix, present, logged[-3:])
    assert sum(acked.values()) > 0, "no round acknowledged anything: the test tested nothing"
    check_file(url)


def test_kill9_durable_writer_loses_no_acknowledged_write(
    tmp_path: Path, spawn: Callable[..., Agent]
) -> None:
    kill_loop(tmp_path, spawn, mode="durable", rounds=10, seed=1)


def test_kill9_batched_writer_keeps_everything_flushed(
    tmp_path: Path, spawn: Callable[..., Agent]
) -> None:
    kill_loop(tmp_path, spawn, mode="batched", rounds=10, seed=2)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 100 process starts; minutes on a busy 2-core machine
@pytest.mark.parametrize("mode", ["durable", "batched"])
def test_kill9_soak(tmp_path: Path, spawn: Callable[..., Agent], mode: str) -> None:
    kill_loop(tmp_path, spawn, mode=mode, rounds=100, seed=int(time.time()))


# -- 3. corrupt journal entries -------------------------------------------------------------------


async def _write_entries(url: str, n: int) -> None:
    async with crdtstore.open_store(url) as store, store.open_record(RUN, "writer") as rec:
        for i in range(n):
            await rec.map("m").set(f"k{i}", i)


def _sql(url: str, statement: str, *params: Any) -> None:
    db = sqlite3.connect(url[len("sqlite:///") :])
    try:
        with db:
            db.execute(statement, params)
    finally:
        db.close()


@pytest.mark.anyio
@pytest.mark.parametrize("damage", ["torn", "garbage-with-valid-crc"])
async def test_corrupt_tail_entry_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    """DESIGN I4: a torn tail is skipped (reported, never applied) and never corrupts the
    entries before it; the record stays usable."""
    url = store_url(tmp_path)
    await _write_entries(url, 5)
    if damage == "torn":
        # the last entry loses all but 3 bytes; its checksum no longer matches
        _sql(url, "UPDATE journal SET upd = substr(upd, 1, 3) WHERE seq = 5")
    else:
        # bytes that pass the checksum but do not decode as an update
        bad = b"\xff\xff\xff\xff"
        _sql(url, "UPDATE journal SET upd = ?, crc = ? WHERE seq = 5", bad, zlib.crc32(bad))
    caplog.set_level(logging.ERROR, logger="crdtstore")
    async with crdtstore.open_store(url) as store:
        async with store.open_record(RUN, "reader") as rec:
            assert rec.to_dict() == {"m": {f"k{i}": i for i in range(4)}}
            assert [(e.seq, e.code) for e in rec.skipped] == [(5, "JOURNAL_CORRUPT")]
            assert all(isinstance(e, JournalCorrupt) for e in rec.skipped)
            if damage == "torn":
                assert "checksum mismatch" in str(rec.skipped[0])
            # the record goes on: its writes land after the damaged entry and are read back
            await rec.map("m").set("k5", 5)
            await rec.flush()
        assert any("entry 5" in r.getMessage() for r in caplog.records)
        replica = await store.replay(RUN)
        assert replica.to_dict() == {"m": {**{f"k{i}": i for i in range(4)}, "k5": 5}}
        assert [e.seq for e in replica.skipped] == [5]


@pytest.mark.anyio
async def test_entry_corrupted_while_tailing_is_skipped(tmp_path: Path) -> None:
    """A reader that is open while a damaged entry lands skips it and keeps following."""
    url = store_url(tmp_path)
    await _write_entries(url, 2)
    # every entry stored from now on with seq 4 is torn on its way in
    _sql(
        url,
        "CREATE TRIGGER tear AFTER INSERT ON journal WHEN NEW.seq = 4 BEGIN"
        " UPDATE journal SET upd = substr(upd, 1, 3) WHERE id = NEW.id; END",
    )
    async with (
        crdtstore.open_store(url) as rstore,
        rstore.open_record(RUN, "reader") as reader,
        crdtstore.open_store(url) as wstore,
        wstore.open_record(RUN, "writer") as writer,
    ):
        for i in range(2, 7):
            await writer.map("m").set(f"k{i}", i)
        await writer.flush()
        with anyio.fail_after(10):
            while reader.applied_seq < 7:
                await anyio.sleep(0.01)
        assert [e.seq for e in reader.skipped] == [4]
        assert reader.map("m").to_dict() == {f"k{i}": i for i in range(7) if i != 3}
        # the writer's own document never read its entry back: it still has k3
        assert writer.map("m").get("k3") == 3


@pytest.mark.anyio
async def test_corrupt_middle_entry_refuses_to_open_unless_salvaged(tmp_path: Path) -> None:
    """A damaged entry followed by others may be the left origin of later items, which yrs
    then keeps pending and invisible: the record refuses to open rather than show a silently
    partial state; ``salvage=True`` opens what can be read and reports the damaged entry."""
    url = store_url(tmp_path)
    async with crdtstore.open_store(url) as store, store.open_record(RUN, "writer") as rec:
        for i in range(6):
            await rec.list("log").append(i)  # entry i + 1
    # entry 3 is the append of 2; the appends of 3, 4, 5 are placed after its item
    _sql(url, "UPDATE journal SET crc = crc + 1 WHERE seq = 3")
    async with crdtstore.open_store(url) as store:
        with pytest.raises(JournalCorrupt) as err:
            async with store.open_record(RUN, "reader"):
                pass
        assert err.value.seq == 3
        assert err.value.code == "JOURNAL_CORRUPT"
        async with store.open_record(RUN, "salvager", salvage=True) as rec:
            assert [e.seq for e in rec.skipped] == [3]
            assert rec.list("log").to_list()[:2] == [0, 1]  # what precedes it is intact


# -- 4. two processes see each other --------------------------------------------------------------


@pytest.mark.parametrize("loops", [("asyncio", "asyncio"), ("asyncio", "trio")])
def test_two_processes_see_each_other_without_polling(
    tmp_path: Path, spawn: Callable[..., Agent], loops: tuple[str, str]
) -> None:
    """Two processes alternate 20 writes, each waiting (5 s deadline) for the other's. Their
    journal poll interval is 60 s, so only the cross-process wake-up can bring a write in
    within the deadline."""
    url = store_url(tmp_path)
    common = ["--rounds", "20", "--poll", "60", "--deadline", "5"]
    a = spawn(
        "a", "pingpong", url, RUN, "a", "--peer", "b", "--leader", "--backend", loops[0], *common
    )
    b = spawn("b", "pingpong", url, RUN, "b", "--peer", "a", "--backend", loops[1], *common)
    for agent in (a, b):
        agent.wait_line("READY", START_TIMEOUT)
    for agent in (a, b):
        agent.send("go")
    reports = [json.loads(agent.wait_line("OK", 120).split(" ", 1)[1]) for agent in (a, b)]
    for agent in (a, b):
        assert agent.wait_exit(30) == 0, agent.stderr()
    assert [r["rounds"] for r in reports] == [20, 20]
    data = read_back(url)
    assert data["m"] == {f"{x}:{r}": r for x in "ab" for r in range(20)}
    check_file(url)
