"""Starting and watching ``tests/_lease_proc.py`` processes (lease scenarios and stress)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

HELPER = Path(__file__).with_name("_lease_proc.py")
START_TIMEOUT = 60.0  # python start-up and imports, several at a time on 2 cores


class LeaseProc:
    """One helper process; its stdout lines are collected (with arrival times) by a thread."""

    def __init__(self, tmp_path: Path, name: str, *args: str) -> None:
        self.name = name
        self.stderr_path = tmp_path / f"{name}.stderr"
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(HELPER), *args],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
            )  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        self.eof = False
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.endswith("\n"):
                break  # cut short by a kill
            with self._cond:
                self.lines.append((time.monotonic(), line[:-1]))
                self._cond.notify_all()
        with self._cond:
            self.eof = True
            self._cond.notify_all()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def wait_line(self, prefix: str, timeout: float = START_TIMEOUT) -> tuple[float, str]:
        """(arrival time, line) of the first line starting with ``prefix``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for t, line in self.lines:
                    if line.startswith(prefix):
                        return t, line
                left = deadline - time.monotonic()
                if self.eof or left <= 0:
                    what = "exited" if self.eof else f"no {prefix!r} line within {timeout}s"
                    raise AssertionError(
                        f"{self.name} {what}; rc={self.proc.poll()}\n{self.stderr()}"
                    )
                self._cond.wait(left)

    def has_line(self, prefix: str) -> bool:
        with self._cond:
            return any(line.startswith(prefix) for _, line in self.lines)

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.write(text)
            self.proc.stdin.flush()

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()

    def kill(self) -> None:
        """``kill -9`` (the process stays a zombie until :meth:`reap`)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)

    def reap(self) -> None:
        self.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.wait(timeout=30)
        self._reader.join(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


@contextlib.contextmanager
def processes() -> Iterator[list[LeaseProc]]:
    """A list to put started processes in; every one is killed when the block ends."""
    started: list[LeaseProc] = []
    try:
        yield started
    finally:
        for p in started:
            p.reap()
