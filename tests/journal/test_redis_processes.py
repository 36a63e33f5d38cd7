"""Real processes on one ``redis://`` store: guarded writes from several processes, two
writers converging, ``kill -9`` of the server mid-writes and of a writer.

Every process a test starts is killed when the test ends, whatever the outcome; every wait is
a condition with a deadline (tests/_wait.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
import redis

import crdtstore
from crdtstore._backends.redis import RedisJournal
from tests._redis import Child, RedisServer
from tests._wait import until

HERE = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's client is asyncio only


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Child]]:
    children: list[Child] = []

    def start(*args: str) -> Child:
        child = Child(*args, stderr=tmp_path / f"child{len(children)}.stderr")
        children.append(child)
        return child

    try:
        yield start
    finally:
        for child in children:
            child.kill()


pytestmark = pytest.mark.anyio


def test_guarded_increments_from_four_processes(server: RedisServer) -> None:
    """I9 across processes: read-increment-guarded-write from 4 processes loses no increment,
    and every refusal names a version that really was current."""
    url = server.url()
    seconds = 3.0
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "_guarded_proc.py"), url, "r", f"p{i}", str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    try:
        outs = [p.communicate(timeout=seconds + 60)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0] * 4
    results = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    ok = sum(int(r["ok"]) for r in results)
    refusals = [x for r in results for x in r["refusals"]]
    assert ok > 0 and refusals, "the processes never contended: the test proves nothing"

    async def check() -> None:
        async with crdtstore.open_store(url) as store:
            journal = await store.journal("r", limit=1_000_000)
            async with store.open_record(run="r", agent="checker") as rec:
                assert rec.map("counter")["n"] == ok
        values = {e.seq: e.effect[0][4] for e in journal}
        assert sorted(values.values()) == list(range(1, ok + 1)), "each increment once"
        assert len(journal) == ok
        for tried, reported, value in refusals:
            assert reported in values and values[reported] == value, (tried, reported)
            assert tried is None or reported > tried

    anyio.run(check)


async def test_two_processes_converge(server: RedisServer, spawn: Callable[..., Child]) -> None:
    """Two writers of one run, at once, on a map, a list and a text: each ends with all of
    both (brought by the store's stream read alone: no sync(), a 60 s poll), and the two
    replicas are equal."""
    url, n = server.url(), 300
    a = spawn("converge", url, "run", "a", "b", str(n))
    b = spawn("converge", url, "run", "b", "a", str(n))
    await until(lambda: a.said("READY") and b.said("READY"), "both processes to open")
    a.send("go")
    b.send("go")
    ra, rb = a.result(), b.result()
    assert ra == rb, "the replicas differ"
    assert len(ra["map"]) == 2 * n and len(ra["log"]) == 2 * (n // 10)
    async with crdtstore.open_store(url) as store, store.open_record(run="run", agent="c") as rec:
        assert rec.map("m").to_dict() == ra["map"]
        assert str(rec.text("notes")) == ra["text"], "the journal replays to the same text"


async def test_redis_killed_mid_writes_loses_nothing_acknowledged(
    tmp_path: Path, spawn: Callable[..., Child]
) -> None:
    """``kill -9`` of redis-server under a durable writer, restart on the same folder: every
    write acknowledged before the kill is there; while Redis is away writes fail with
    BackendError; after the restart the writer's retries succeed, and a reader's stream read
    reconnects by itself and brings the new writes (no sync()).

    (A record whose journal read failed tries again after ``poll_interval``: 1 s here.)"""
    srv = RedisServer(tmp_path / "redis").start()
    stop = tmp_path / "stop"
    try:
        url = srv.url()
        writer = spawn("durable", url, "run", "w", str(stop))
        await until(lambda: writer.said("READY"), "the writer to open", deadline=60)
        async with (
            crdtstore.open_store(url, poll_interval=1.0) as store,
            store.open_record(run="run", agent="reader") as rec,
        ):
            tail = store.backend.tail  # type: ignore[attr-defined]
            await until(lambda: len(writer.said("ACK")) >= 100, "100 acknowledged writes")
            srv.kill9()
            acked = [int(x) for x in writer.said("ACK")]
            await until(lambda: writer.said("ERR"), "a write to fail while Redis is away")
            srv.start()
            await until(lambda: len(writer.said("ACK")) >= len(acked) + 50, "writes to resume")
            await until(lambda: tail.reconnects >= 1, "the reader's stream read to reconnect")
            last = max(int(x) for x in writer.said("ACK"))
            await until(lambda: rec.map("m").get(f"w:{last}") == last, "the reader to catch up")
            stop.touch()
            writer.result()
        async with crdtstore.open_store(url) as fresh:
            async with fresh.open_record(run="run", agent="checker") as rec:
                m = rec.map("m")
                assert [i for i in acked if m.get(f"w:{i}") != i] == [], "acknowledged, lost"
                done = [int(x) for x in writer.said("ACK")]
                assert all(m.get(f"w:{i}") == i for i in done)
    finally:
        srv.stop()


async def test_a_killed_writer_loses_nothing_flushed(
    server: RedisServer, spawn: Callable[..., Child]
) -> None:
    """``kill -9`` of a batched writer: every key it flushed is in the journal, and the run
    stays writable (no lock left behind) for a guarded write of another store."""
    url = server.url()
    writer = spawn("batched", url, "run", "w")
    await until(lambda: len(writer.said("FLUSHED")) >= 20, "20 flushes", deadline=60)
    writer.kill9()
    flushed = max(int(x) for x in writer.said("FLUSHED"))
    async with crdtstore.open_store(url) as store, store.open_record(run="run", agent="c") as rec:
        m = rec.map("m")
        assert [i for i in range(flushed + 1) if m.get(f"w:{i}") != i] == []
        started = time.monotonic()
        _, version = m.get_versioned("w:0")
        await m.set("w:0", "again", expected_version=version)
        assert time.monotonic() - started < 5


def test_a_guarded_writer_killed_mid_write_blocks_nobody(server: RedisServer) -> None:
    """Guarded writes on Redis hold no lock (the check is in the append script): a guarded
    writer stopped and then killed at any point leaves nothing behind that the others wait
    for (the run's authority lock is never taken), and no increment is lost or doubled."""
    url = server.url()
    seconds = 4.0
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "_guarded_proc.py"), url, "r", f"p{i}", str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    try:
        lock = RedisJournal(url).keys.run_keys("default", "r").lock
        meta = RedisJournal(url).keys.run("default", "r")
        victim = procs[0]
        with server.client() as c:

            def written() -> bool:
                return int(c.hget(meta, "head") or 0) >= 20

            anyio.run(until, written, "the writers to get going")
            victim.send_signal(signal.SIGSTOP)
            head = int(c.hget(meta, "head") or 0)
            anyio.run(until, lambda: int(c.hget(meta, "head") or 0) > head + 20, "the others go on")
            victim.kill()
            assert c.get(lock) is None, "a guarded write took the authority lock"
        outs = [p.communicate(timeout=seconds + 60)[0] for p in procs[1:]]
    finally:
        for p in procs:
            p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()
    results = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    assert all(int(r["ok"]) > 0 for r in results), results

    async def check() -> None:
        async with crdtstore.open_store(url) as store:
            journal = await store.journal("r", limit=1_000_000)
        values = sorted(e.effect[0][4] for e in journal)
        assert values == list(range(1, len(values) + 1)), "an increment lost or doubled"

    anyio.run(check)


def test_guarded_writers_across_a_redis_kill9(tmp_path: Path) -> None:
    """``kill -9`` of redis-server under three guarded writer processes, restart on the same
    folder: the writers go on; every increment acknowledged is in the journal, none is
    doubled (the journal's values are 1, 2, 3, ...), and what is there beyond the
    acknowledged ones is at most the writes whose answer the outage took."""
    srv = RedisServer(tmp_path / "redis").start()
    seconds = 6.0
    procs: list[subprocess.Popen[str]] = []
    try:
        url = srv.url()
        meta = RedisJournal(url).keys.run("default", "r")
        script = str(HERE / "_guarded_proc.py")
        procs = [
            subprocess.Popen(
                [sys.executable, script, url, "r", f"p{i}", str(seconds), "--retry"],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(3)
        ]

        def head() -> int:
            try:
                with srv.client() as c:
                    return int(c.hget(meta, "head") or 0)
            except redis.RedisError:
                return -1

        stream = RedisJournal(url).keys.run_keys("default", "r").stream

        def all_writing() -> bool:  # (a process that opens while Redis is away fails)
            with srv.client() as c:
                agents = {f[b"a"] for _, f in c.xrange(stream)}
            return agents >= {b"p0", b"p1", b"p2"} and head() >= 30

        anyio.run(until, all_writing, "every writer to get going")
        srv.kill9()
        srv.start()
        at_restart = head()
        anyio.run(until, lambda: head() > at_restart + 30, "the writers to go on")
        outs = [p.communicate(timeout=seconds + 60)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0]
    finally:
        for p in procs:
            p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()
    try:
        results = [json.loads(out.strip().splitlines()[-1]) for out in outs]
        ok = sum(int(r["ok"]) for r in results)
        unknown = sum(int(r["unknown"]) for r in results)

        async def check() -> None:
            async with crdtstore.open_store(url) as store:
                journal = await store.journal("r", limit=1_000_000)
            values = sorted(e.effect[0][4] for e in journal)
            assert values == list(range(1, len(values) + 1)), "an increment lost or doubled"
            assert ok <= len(values) <= ok + unknown, (ok, unknown, len(values))

        anyio.run(check)
    finally:
        srv.stop()
