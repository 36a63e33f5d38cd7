"""Waking readers when a run's journal grows, in this process and in others.

In-process, a :class:`Watch` per run holds an event that is set on every append.

Across processes (the SQLite store), every process that has the store open binds a Unix
datagram socket in a folder derived from the store file's real path; after each commit the
writer sends ``tenant NUL run`` to every socket in that folder. A datagram costs a few
microseconds, needs no server, and a dead listener is noticed (``ECONNREFUSED``) and its
socket removed. Notifications are only a hint: records also re-read the journal every
``poll_interval`` seconds, so a lost datagram delays a reader, it never loses data.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import socket
import tempfile
from pathlib import Path

import anyio
from anyio.abc import TaskStatus

log = logging.getLogger("crdtstore.notify")


class Watch:
    """Wakes the readers of one run."""

    __slots__ = ("event", "users")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.users = 0

    def fire(self) -> None:
        old, self.event = self.event, anyio.Event()
        old.set()


def _socket_dir(key: str) -> Path:
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    base = Path(tempfile.gettempdir()) / f"crdtstore-{os.getuid()}"
    return base / digest


class Notifier:
    """Per-store registry of watches, plus the cross-process datagram channel."""

    def __init__(self, key: str | None) -> None:
        self._watches: dict[tuple[str, str], Watch] = {}
        self._key = key
        self._dir: Path | None = None
        self._path: Path | None = None
        self._send: socket.socket | None = None

    def watch(self, tenant: str, run: str) -> Watch:
        w = self._watches.get((tenant, run))
        if w is None:
            w = self._watches[(tenant, run)] = Watch()
        w.users += 1
        return w

    def unwatch(self, tenant: str, run: str) -> None:
        w = self._watches.get((tenant, run))
        if w is not None:
            w.users -= 1
            if w.users <= 0:
                del self._watches[(tenant, run)]

    def _wake(self, tenant: str, run: str) -> None:
        w = self._watches.get((tenant, run))
        if w is not None:
            w.fire()

    def notify(self, tenant: str, run: str) -> None:
        """The journal of ``tenant/run`` grew: wake readers here and in other processes."""
        self._wake(tenant, run)
        if self._send is None or self._dir is None:
            return
        payload = f"{tenant}\x00{run}".encode()
        try:
            entries = list(os.scandir(self._dir))
        except OSError:
            return
        for entry in entries:
            if entry.path == str(self._path):
                continue
            try:
                self._send.sendto(payload, entry.path)
            except (ConnectionRefusedError, FileNotFoundError):
                # nobody is bound there any more: a process that died without cleaning up
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
            except OSError:
                # full buffer (the peer is busy and will read everything on its next wake-up)
                # or a file that is not a socket: a hint is allowed to get lost
                pass

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Receive notifications from other processes until cancelled."""
        if self._key is None:
            task_status.started()
            return
        try:
            self._dir = _socket_dir(self._key)
            self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._path = self._dir / f"{os.getpid()}-{secrets.token_hex(4)}"
            sock = await anyio.create_unix_datagram_socket(local_path=self._path)
            self._send = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._send.setblocking(False)
        except OSError as exc:
            log.warning("cross-process notification unavailable (%s); polling only", exc)
            self._dir = self._path = None
            task_status.started()
            return
        task_status.started()
        try:
            async with sock:
                while True:
                    data, _ = await sock.receive()
                    tenant, _, run = data.decode(errors="replace").partition("\x00")
                    self._wake(tenant, run)
        finally:
            self.close()

    def close(self) -> None:
        if self._send is not None:
            self._send.close()
            self._send = None
        if self._path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._path)
            self._path = None

    def __repr__(self) -> str:  # pragma: no cover
        return f"<Notifier {self._key!r} watches={len(self._watches)}>"
