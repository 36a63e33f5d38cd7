"""Operations on ``redis://`` stores (issue 16, item 4): ``crdtstore journal``, ``inspect``,
``history``, ``compact`` and ``leases`` given a Redis URL (the CLI as a user runs it, in a
subprocess); ``crdtstore serve`` logs the Redis it uses and refuses one without persistence
unless ``--allow-volatile``."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

import crdtstore
from crdtstore._backends.redis import persistence
from tests._redis import RedisServer
from tests.cli.test_cli import _command, cli, cli_json

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_the_store_commands_take_a_redis_url(redis_server: RedisServer) -> None:
    url = redis_server.url()
    async with (
        crdtstore.open_store(url) as store,
        store.open_record(run="r", agent="a", source="tool") as a,
        store.open_record(run="r", agent="b", source="tool") as b,
    ):
        for i in range(5):
            await a.map("m").set(f"k{i}", i)
        await a.flush()
        await b.sync()
        await b.map("m").set("k0", "b's")
        await b.flush()
        lease = store.lease(["item:tasks/t1"], ttl=300, owner="a")
        await lease.acquire()

        journal = cli_json("journal", url, "--run", "r")
        assert [e["seq"] for e in journal["entries"]] == list(range(1, 7))
        assert cli_json("journal", url)[0]["run"] == "r"
        entries = cli_json("inspect", url, "--run", "r")["collections"]["m"]["entries"]
        assert entries["k0"]["value"] == "b's" and entries["k0"]["provenance"]["agent"] == "b"
        history = cli_json("history", url, "--run", "r", "--collection", "m", "--key", "k0")
        assert [w["agent"] for w in history["entries"]] == ["a", "b"]
        leases = cli_json("leases", "--store", url)
        assert [(h["owner"], h["token"]) for h in leases["holders"]] == [("a", lease.token)]
        compacted = cli_json("compact", url, "--run", "r", "--drop-journal")
        assert (compacted["seq"], compacted["journal_dropped"]) == (6, True)
        assert cli_json("journal", url, "--run", "r")["entries"] == []
        after = cli_json("inspect", url, "--run", "r")["collections"]["m"]["entries"]
        assert {k: e["value"] for k, e in after.items()} == {
            "k0": "b's",
            **{f"k{i}": i for i in range(1, 5)},
        }
        await lease.release()
        bad = cli("journal", url.replace("127.0.0.1", "127.0.0.1:1"), "--run", "r")
        assert bad.returncode == 1 and "error:" in bad.stderr and "Traceback" not in bad.stderr


def _serve(url: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "CRDTSTORE_SECRET": "redis-cli-test-secret-0123456789", "NO_COLOR": "1"}
    argv = [*_command(), "serve", "--store", url, "--port", "0", *extra]
    return subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _until_listening(proc: subprocess.Popen[str]) -> str:
    """The hub's stderr up to its 'listening' line (read line by line: it blocks on a line,
    never sleeps)."""
    assert proc.stderr is not None
    seen = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
        if "crdtstore hub listening on" in line:
            return seen
    raise AssertionError(f"the hub did not start: {seen}")


def test_serve_logs_the_redis_and_refuses_one_without_persistence(tmp_path: Path) -> None:
    volatile = RedisServer(tmp_path / "volatile")
    volatile.extra = ["--appendonly", "no", "--save", ""]
    volatile.start()
    try:
        url = volatile.url()
        refused = _serve(url)
        _, err = refused.communicate(timeout=60)
        assert refused.returncode == 1, err
        assert "NO persistence" in err and "--allow-volatile" in err

        allowed = _serve(url, "--allow-volatile")
        try:
            log = _until_listening(allowed)
        finally:
            allowed.terminate()
            allowed.communicate(timeout=30)
        assert f"Redis {volatile_version(url)}" in log and "without persistence" in log
    finally:
        volatile.stop()


def volatile_version(url: str) -> str:
    import anyio

    return anyio.run(persistence, url).version


def test_serve_logs_a_persistent_redis(redis_server: RedisServer) -> None:
    hub = _serve(redis_server.url())
    try:
        log = _until_listening(hub)
    finally:
        hub.terminate()
        hub.communicate(timeout=30)
    assert "append-only file (appendfsync always)" in log, log
    assert "WARNING" not in log.split("crdtstore hub listening")[0], log
