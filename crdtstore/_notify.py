"""Waking readers when a run's journal grows, in this process and in others.

In-process, a :class:`Watch` per run holds an event that is set on every append.

Across processes (the SQLite store), every store object binds a Unix datagram socket in a
folder derived from the store file's real path and the store's tenant; after each commit the
writer sends ``tenant NUL run`` to every socket in that folder, followed by ``NUL seq`` when
it knows the journal position it committed. A datagram needs no server, and a dead listener
is noticed (``ECONNREFUSED``) and its socket removed.

Notifications are only a hint: a lost datagram delays a reader, it never loses data. Every
``poll_interval`` seconds the store asks its backend whether the journal may have changed
behind its back (:meth:`JournalBackend.changes`) and, when it did, for the heads of the runs
it reads (:meth:`JournalBackend.heads`), and wakes the readers of the runs that moved (every
reader when the backend cannot tell: :meth:`Notifier.poll`). One check per store and
interval, not one read per record, so a hub with many idle runs loaded stays idle.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio
from anyio.abc import SocketAttribute, TaskStatus

from ._events import event_factory

log = logging.getLogger("crdtstore.notify")

# A listing of the socket folder is reused while the folder's mtime stays what it was, if the
# folder had been quiet this long (ns) when it was listed (mtimes are coarse: a few ms).
_QUIET_NS = 50_000_000


class Watch:
    """Wakes the readers of one run.

    A wake-up that names its position lets a reader skip the read when it has already taken
    that position in (a reader woken by one datagram often reads the entries of the next few
    writes before their datagrams arrive); a wake-up that names none always means "read".

    Attributes:
        event: set (and replaced) on every wake-up; take it before reading.
        head: the highest journal position a wake-up announced.
        blind: how many wake-ups announced no position.
        direct: set by the one reader while it waits: a wake-up calls it first, and sets
            no event when it returns True (it took in what was announced, at once).
    """

    __slots__ = ("_new", "blind", "direct", "event", "head", "polled", "users")

    def __init__(self, polled: bool = True) -> None:
        self._new = event_factory()
        self.event = self._new()
        self.users = 0
        self.head = 0
        self.blind = 0
        self.polled = polled  # woken by Notifier.poll (journal readers; not lease hand-offs)
        self.direct: Callable[[], bool] | None = None

    def fire(self, seq: int | None = None) -> None:
        if seq is None:
            self.blind += 1
        elif seq > self.head:
            self.head = seq
        direct = self.direct
        if direct is not None and self.users == 1 and direct():
            return
        old, self.event = self.event, self._new()
        old.set()


def _socket_dir(key: str) -> Path:
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    base = Path(tempfile.gettempdir()) / f"crdtstore-{os.getuid()}"
    return base / digest


def _asyncio_loop() -> object | None:
    """The running asyncio loop, or None (trio)."""
    try:
        import asyncio

        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _parse(data: bytes) -> tuple[str, str, int | None]:
    """``tenant NUL run [NUL seq]`` -> (tenant, run, seq or None); names hold no NUL."""
    tenant, _, rest = data.decode(errors="replace").partition("\x00")
    run, _, seq = rest.partition("\x00")
    return tenant, run, int(seq) if seq.isascii() and seq.isdigit() and len(seq) < 20 else None


class Notifier:
    """Per-store registry of watches, plus the cross-process datagram channel."""

    def __init__(self, key: str | None) -> None:
        self._watches: dict[tuple[str, str], Watch] = {}
        self._key = key
        self._dir: Path | None = None
        self._path: Path | None = None
        self._send: socket.socket | None = None
        self._own = ""  # the path of this process's socket
        self._listed: list[str] = []  # the other processes' sockets (see _listeners)
        self._listed_at: int | None = None  # the folder's mtime (ns) when listed
        self._dir_fd: int | None = None  # the folder, open: fstat, no path walk per commit
        self.polls = 0  # polls made (tests, metrics)

    def watch(self, tenant: str, run: str, *, polled: bool = True) -> Watch:
        """The watch of ``tenant/run`` (one per key, counted by users: :meth:`unwatch` each
        time). ``polled``: :meth:`poll` wakes it (a journal's readers); lease hand-offs pass
        False (their waiters have their own deadlines)."""
        w = self._watches.get((tenant, run))
        if w is None:
            w = self._watches[(tenant, run)] = Watch(polled)
        w.users += 1
        return w

    def unwatch(self, tenant: str, run: str) -> None:
        w = self._watches.get((tenant, run))
        if w is not None:
            w.users -= 1
            if w.users <= 0:
                del self._watches[(tenant, run)]

    def _wake(
        self, tenant: str, run: str, seq: int | None = None, own: Watch | None = None
    ) -> None:
        w = self._watches.get((tenant, run))
        if w is None:
            return
        if w is own and w.users == 1 and seq is not None:
            # the writer's own watch, and nobody else here reads the run: the writer has
            # the entries already, so the position is noted without a wake-up
            if seq > w.head:
                w.head = seq
            return
        w.fire(seq)

    def notify(
        self, tenant: str, run: str, seq: int | None = None, *, own: Watch | None = None
    ) -> None:
        """The journal of ``tenant/run`` grew (up to position ``seq``, when given): wake
        readers here and in other processes. ``own``: the watch of the writer, which has
        taken in everything up to ``seq`` (it is not woken when no other reader shares it)."""
        self._wake(tenant, run, seq, own)
        if self._send is None or self._dir is None:
            return
        listeners = self._listeners()
        if not listeners:  # (the usual case in a hub: nobody else has the store open)
            return
        payload = (f"{tenant}\x00{run}" if seq is None else f"{tenant}\x00{run}\x00{seq}").encode()
        for path in listeners:
            try:
                self._send.sendto(payload, path)
            except (ConnectionRefusedError, FileNotFoundError):
                # nobody is bound there any more: a process that died without cleaning up
                with contextlib.suppress(OSError):
                    os.unlink(path)
            except OSError:
                # full buffer (the peer is busy and will read everything on its next wake-up)
                # or a file that is not a socket: a hint is allowed to get lost
                pass

    async def poll(
        self,
        interval: float,
        changes: Callable[[], int | None],
        heads: Callable[[str, list[str]], dict[str, int] | None],
    ) -> None:
        """Until cancelled, every ``interval`` seconds: when ``changes()`` (the backend's
        :meth:`~crdtstore._journal.JournalBackend.changes`) moved since the last call or is
        None, ask ``heads(tenant, runs)`` for the heads of the polled watches' runs and wake
        each watch whose run's head is past the position it was told (:attr:`Watch.head`);
        when ``heads`` cannot tell (None), wake every polled watch without a position (a
        blind wake-up: its readers read the journal again). Nothing is read while no watch
        is held."""
        seen: int | None = None
        while True:
            await anyio.sleep(interval)
            self.polls += 1
            if not self._watches:
                continue
            try:
                now = changes()
            except Exception:  # a closing backend: wake the readers, they report errors
                now = None
            if now is not None and now == seen:
                continue
            seen = now
            by_tenant: dict[str, list[tuple[str, Watch]]] = {}
            for (tenant, run), w in list(self._watches.items()):
                if w.polled:
                    by_tenant.setdefault(tenant, []).append((run, w))
            for tenant, watched in by_tenant.items():
                try:
                    got = heads(tenant, [run for run, _ in watched])
                except Exception:
                    got = None
                for run, w in watched:
                    if got is None:
                        w.fire()
                    else:
                        head = got.get(run)
                        if head is not None and head > w.head:
                            w.fire(head)

    def others_listening(self) -> bool:
        """Whether other processes have the store open (their sockets are in the folder, as
        last listed: see :meth:`_listeners`); False without the datagram channel."""
        return self._dir is not None and self._send is not None and bool(self._listeners())

    def _listeners(self) -> list[str]:
        """The sockets of the other processes (the folder's entries but this one's): listed
        again only when the folder changed (its mtime: one ``stat`` rather than a listing per
        commit). A listing is kept only if the folder had not changed for
        :data:`_QUIET_NS` before it was made, so that a socket bound right after it, within
        the file system's timestamp granularity, still changes the mtime seen next."""
        assert self._dir is not None
        try:
            fd = self._dir_fd
            st = os.stat(self._dir) if fd is None else os.fstat(fd)
            if not st.st_nlink:  # the folder was removed (and maybe made again): by its path
                st = os.stat(self._dir)
            stamp = st.st_mtime_ns
            if stamp == self._listed_at:
                return self._listed
            listed = [e.path for e in os.scandir(self._dir) if e.path != self._own]
        except OSError:
            return []
        self._listed = listed
        self._listed_at = stamp if time.time_ns() - stamp >= _QUIET_NS else None
        return listed

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Receive notifications from other processes until cancelled."""
        if self._key is None:
            task_status.started()
            return
        try:
            self._dir = _socket_dir(self._key)
            self._path = self._dir / f"{os.getpid()}-{secrets.token_hex(4)}"
            self._own = str(self._path)
            for attempt in range(5):
                self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                try:
                    sock = await anyio.create_unix_datagram_socket(local_path=self._path)
                    break
                except FileNotFoundError:  # the last other store removed the folder meanwhile
                    if attempt == 4:
                        raise
            self._send = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._send.setblocking(False)
            with contextlib.suppress(OSError):  # (else stat by path)
                self._dir_fd = os.open(self._dir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            log.warning("cross-process notification unavailable (%s); polling only", exc)
            self._dir = self._path = None
            task_status.started()
            return
        task_status.started()
        try:
            async with sock:
                raw = sock.extra(SocketAttribute.raw_socket)
                if _asyncio_loop() is None or not await self._receive_asyncio(raw):
                    while True:
                        data, _ = await sock.receive()
                        self._wake(*_parse(data))
                        self._drain(raw)
        finally:
            self.close()

    def _drain(self, raw: socket.socket) -> None:
        """Take the datagrams already queued in one pass (one wake-up of the readers for a
        burst, not one event-loop round trip per datagram)."""
        while True:
            try:
                data = raw.recv(512)
            except OSError:  # nothing more (or closing: the receive loop says so)
                return
            self._wake(*_parse(data))

    async def _receive_asyncio(self, raw: socket.socket) -> bool:
        """On asyncio: a reader callback registered once, instead of anyio's ``receive()``,
        which registers and unregisters the socket with the selector for every datagram
        (measured: the receiving side's CPU per journal entry fell by a third without it,
        with one writer 2 ms apart). The callback only takes
        the datagrams off the socket; this task wakes the readers (anyio events are made in
        a task). Returns False at once when the loop has no ``add_reader`` (then the caller
        uses ``receive()``)."""
        import asyncio

        loop = asyncio.get_running_loop()
        queue: list[bytes] = []
        ready: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            while True:
                try:
                    queue.append(raw.recv(512))
                except OSError:
                    break
            if queue and not ready.done():
                ready.set_result(None)

        try:
            loop.add_reader(raw.fileno(), readable)
        except NotImplementedError:  # e.g. a proactor loop
            return False
        try:
            while True:
                await ready
                ready = loop.create_future()
                batch = queue[:]
                queue.clear()
                for data in batch:
                    self._wake(*_parse(data))
        finally:
            loop.remove_reader(raw.fileno())

    def close(self) -> None:
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None
        if self._send is not None:
            self._send.close()
            self._send = None
        if self._path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._path)
            self._path = None
            if self._dir is not None:
                # the folder goes with its last socket (one per file and tenant: they would
                # pile up in the temporary directory); fails, harmlessly, while others remain
                with contextlib.suppress(OSError):
                    os.rmdir(self._dir)

    def __repr__(self) -> str:  # pragma: no cover
        return f"<Notifier {self._key!r} watches={len(self._watches)}>"
