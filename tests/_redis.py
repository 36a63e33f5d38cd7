"""A real ``redis-server`` for the Redis tests: started on a free port in a temporary folder,
with an append-only file synced on every write (``appendfsync always``: an acknowledged write
is on disk), killed and restarted on the same folder by the fault tests.

No server, no test: a missing ``redis-server`` fails the tests that need one (CI installs it
with apt-get), it never skips them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

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
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.ping():
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                log = self.log.read_text() if self.log.exists() else ""
                raise RuntimeError(f"redis-server exited at start: {err}{log[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not answer on port {self.port}")
            time.sleep(0.01)
        return self

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def client(self) -> redis.Redis:
        """A blocking redis-py client of this server, to look at its keys from a test."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10)

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
            if self.proc.stderr is not None:
                self.proc.stderr.close()
            self.proc = None
