"""A real ``redis-server`` for the Redis tests: started on a free port in a temporary folder,
with an append-only file synced on every write (``appendfsync always``: an acknowledged write
is on disk), killed and restarted on the same folder by the fault tests.

No server, no test: a missing ``redis-server`` fails the tests that need one (CI installs it
with apt-get), it never skips them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

START_TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server_binary() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
    )
    if found is None:
        pytest.fail(
            "redis-server is not installed: the Redis tests need a real server "
            "(apt-get install -y redis-server)",
            pytrace=False,
        )
    return found


class RedisServer:
    """One ``redis-server`` process on ``127.0.0.1:port`` with its data in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.binary = redis_server_binary()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = folder / "redis.log"
        self.extra: list[str] = []  # more redis-server arguments

    def url(self, *, prefix: str | None = None, db: int = 0, **query: object) -> str:
        """A ``redis://`` URL of this server, with a fresh key prefix unless given."""
        prefix = prefix or f"t{uuid.uuid4().hex[:12]}"
        extra = "".join(f"&{k}={v}" for k, v in query.items())
        return f"redis://127.0.0.1:{self.port}/{db}?prefix={prefix}{extra}"

    def start(self) -> RedisServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.folder),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--logfile", str(self.log),
            "--daemonize", "no",
            *self.extra,
        ]  # fmt: skip
        err = self.folder / "redis.stderr"
        with err.open("ab") as stderr:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.ping():
            if self.proc.poll() is not None:
                log = self.log.read_text() if self.log.exists() else ""
                raise RuntimeError(f"redis-server exited at start: {err.read_text()}{log[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not answer on port {self.port}")
            time.sleep(0.01)
        return self

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def client(self, **options: Any) -> redis.Redis:
        """A blocking redis-py client of this server, to look at its keys from a test."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10, **options)

    def keys(self, pattern: str = "*") -> list[bytes]:
        """Every key matching ``pattern`` (SCAN, as an operator would look)."""
        with self.client() as c:
            return sorted(c.scan_iter(match=pattern, count=1000))

    def kill9(self) -> None:
        """``kill -9`` the server (what a power cut or OOM kill does to it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server per test module (registered for every test by conftest.py)."""
    srv = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield srv
    finally:
        srv.stop()


class Child:
    """A helper process (``python tests/_redis.py COMMAND ...``) whose stdout lines a thread
    collects; killed when the test ends (:meth:`kill`)."""

    def __init__(self, *args: str, stderr: Path) -> None:
        self._err = stderr.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
        )
        self.stderr = stderr
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.endswith("\n"):  # a line cut short by a kill was never acknowledged
                self.lines.append(line.rstrip("\n"))

    def said(self, word: str) -> list[str]:
        """The arguments of every line starting with ``word``."""
        return [line[len(word) + 1 :] for line in list(self.lines) if line.split(" ")[0] == word]

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def result(self) -> dict[str, Any]:
        """The JSON of the ``OK`` line (the process has ended)."""
        self.proc.wait(timeout=60)
        self._reader.join(timeout=10)
        ok = self.said("OK")
        assert ok, f"no OK line; stderr: {self.stderr.read_text()[-3000:]}"
        return dict(json.loads(ok[-1]))

    def kill9(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def kill(self) -> None:
        self.kill9()
        self._reader.join(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self._err.close()


# -- the helper processes ----------------------------------------------------------------------


def _say(*parts: object) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")  # one write per line
    sys.stdout.flush()


async def _converge(url: str, run: str, me: str, peer: str, n: int) -> None:
    """Write ``n`` map entries, a list item every 10 and a text chunk every 10 (all at once
    with the peer, after ``go`` on stdin); flush; wait until the peer's are all here (only
    the store's tail brings them: no ``sync()``); report the state."""
    import anyio.to_thread

    import crdtstore

    async with (
        crdtstore.open_store(url, poll_interval=60.0) as store,
        store.open_record(run=run, agent=me, source="tool") as rec,
    ):
        m, log, text = rec.map("m"), rec.list("log"), rec.text("notes")
        _say("READY")
        await anyio.to_thread.run_sync(sys.stdin.readline)
        for i in range(n):
            await m.set(f"{me}:{i}", i)
            if i % 10 == 0:
                await log.append(f"{me}:{i}")
                await text.insert(0, f"[{me}:{i}]")
        await rec.flush()
        _say("FLUSHED")

        def complete() -> bool:
            s = str(text)
            return all(m.get(f"{peer}:{i}") == i for i in range(n)) and all(
                f"[{peer}:{i}]" in s and f"{peer}:{i}" in log.to_list() for i in range(0, n, 10)
            )

        with anyio.fail_after(30):
            while not complete():
                await anyio.sleep(0.005)
        await rec.flush()
        _say(
            "OK",
            json.dumps({"map": dict(m.items()), "log": sorted(log.to_list()), "text": str(text)}),
        )


async def _durable(url: str, run: str, me: str, stop: str) -> None:
    """Write ``me:0``, ``me:1``, ... in durable mode, saying ``ACK i`` once a write returned;
    a write refused while Redis is away (``BackendError``) says ``ERR i`` and is tried again
    until it returns. Ends when the file ``stop`` exists."""
    import anyio

    import crdtstore

    async with (
        crdtstore.open_store(url, durability="durable") as store,
        store.open_record(run=run, agent=me, source="tool") as rec,
    ):
        m = rec.map("m")
        _say("READY")
        i = 0
        while not Path(stop).exists():
            try:
                await m.set(f"{me}:{i}", i)
            except crdtstore.BackendError:
                _say("ERR", i)
                await anyio.sleep(0.02)
                continue
            _say("ACK", i)
            i += 1
            await anyio.sleep(0.002)
        _say("OK", json.dumps({"written": i}))


async def _batched(url: str, run: str, me: str) -> None:
    """Write ``me:0``, ``me:1``, ... in batched mode, ``flush()`` every 20 and say
    ``FLUSHED i`` (every key up to ``i`` is journaled), until killed."""
    import anyio

    import crdtstore

    async with (
        crdtstore.open_store(url) as store,
        store.open_record(run=run, agent=me, source="tool") as rec,
    ):
        m, log = rec.map("m"), rec.list("log")
        _say("READY")
        i = 0
        while True:
            await m.set(f"{me}:{i}", i)
            await log.append(i)
            if i % 20 == 19:
                await rec.flush()
                _say("FLUSHED", i)
                await anyio.sleep(0.001)
            i += 1


def _main(argv: list[str]) -> None:
    import anyio

    cmd, *args = argv
    if cmd == "converge":
        url, run, me, peer, n = args
        anyio.run(_converge, url, run, me, peer, int(n))
    elif cmd == "durable":
        anyio.run(_durable, *args)
    elif cmd == "batched":
        anyio.run(_batched, *args)
    else:
        raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    _main(sys.argv[1:])
