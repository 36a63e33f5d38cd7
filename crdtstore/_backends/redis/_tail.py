"""One blocking stream read per store: how other processes' writes wake this store's readers.

The tail holds one connection of its own, blocked in ``XREAD`` on the journal stream of every
run a record of this store has open (and on the lease wake-up streams of the tenants it
waits on), each from the last position it knows. When an entry arrives that this store did
not write, it keeps the entries (up to ``COUNT`` of them a read; the next read continues
after the last) and wakes the run's readers, whose journal read (``JournalBackend.read`` of a
record's tail) is then answered from the kept entries when they continue from where the
reader is (:meth:`Tail.cached`; a record's tail that waits takes them in at the wake-up
itself, through ``RedisJournal.kept``): one round trip per burst of other processes' writes,
not three. Entries are kept as the read brought them and parsed when a reader takes them
(this store's own, brought back, never are). A reader that needs everything the journal
holds now (``sync()``, a guarded write) reads from Redis.

A record opening a run changes the set of streams: the blocked read is interrupted with
``CLIENT UNBLOCK`` and sent again with the new set. A lost connection (Redis restarting) is
retried with a growing pause; once back, every reader is woken (it may have missed entries).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..._journal import NewEntry, Row
from ._client import RedisError, pack, send
from ._rows import client_of, may_redact, row_of, same_entry

log = logging.getLogger("crdtstore.redis")

BLOCK_MS = 2000  # the longest one XREAD blocks (then it is sent again: a cheap heartbeat)
COUNT = 128  # entries one XREAD brings per stream
KEEP = 512  # entries kept per run for the readers (the newest)
RETRY_FIRST, RETRY_MAX = 0.02, 1.0  # seconds between reconnection attempts (doubling)


@dataclass
class _Run:
    tenant: str
    run: str
    meta: str  # the run's hash (its head)
    users: int
    seen: int  # every position up to here was woken for, or written by this store
    # the newest entries, for readers: a Row, or the stream entry as XREAD brought it, read
    # into a Row when a reader takes it (the entries of this store's one reader never are)
    rows: dict[int, Any] = field(default_factory=dict)
    client: int | None = None  # the client id of its one reader here (None: several, unknown)
    # the last position this store wrote past a gap in `seen`: its reader's commit could not
    # take its position past them (entries of others before them unread), so the stream
    # read wakes it when it brings them, even though they are its own
    gap: int = 0

    def keep(self, rows: list[Row]) -> None:
        for row in rows:
            if any(len(op) > 2 and op[2] == "redact" for op in row.effect):
                # a redaction rewrote the entries before it: the copies kept here are stale
                # and may hold the redacted value (readers read them from Redis again)
                self.rows.clear()
            self.rows[row.seq] = row
        self.trim()

    def keep_read(self, entries: list[Any]) -> int:
        """Keep the entries of an ``XREAD`` reply unread (see :attr:`rows`); return the
        last position among them."""
        rows = self.rows
        seq = 0
        for e in entries:
            seq = int(e[0].split(b"-", 1)[0])
            kept = rows.get(seq)
            if type(kept) is Row and same_entry(kept, e):
                continue  # (this store wrote it, and its answer came first)
            if may_redact(e):  # (one that names a redaction: read it to know)
                self.keep([row_of(e)])
            else:
                rows[seq] = e
        self.trim()
        return seq

    def trim(self) -> None:
        # by a quarter at a time: finding the oldest costs a pass over all of them
        if len(self.rows) > KEEP + KEEP // 4:
            low = max(self.rows) - KEEP
            for seq in [s for s in self.rows if s <= low]:
                del self.rows[seq]

    def row(self, seq: int) -> Row | None:
        got = self.rows.get(seq)
        if got is None or type(got) is Row:
            return got
        row = self.rows[seq] = row_of(got)
        return row


def _xread_entries(reply: Any) -> dict[bytes, list[Any]]:
    """``{stream: its entries [id, fields]}`` of an ``XREAD`` reply (RESP2 list or RESP3
    map)."""
    if not reply:
        return {}
    items = reply.items() if isinstance(reply, dict) else ((r[0], r[1]) for r in reply)
    out: dict[bytes, list[Any]] = {}
    for key, entries in items:
        if (
            entries
            and isinstance(entries[0], list)
            and entries[0]
            and isinstance(entries[0][0], (list, tuple))
        ):  # RESP3: [[(id, fields), ...]]
            entries = entries[0]
        if entries:
            out[key if isinstance(key, bytes) else str(key).encode()] = list(entries)
    return out


class Tail:
    """The stream read loop of one store (started by :meth:`start`, ended by :meth:`aclose`)."""

    def __init__(
        self,
        connect: Callable[[], Any],
        control: Any,
        wake: Callable[[str, str], None],
        block_ms: int = BLOCK_MS,
    ) -> None:
        self._connect = connect  # makes the tail's own single-connection client
        self._control = control  # the store's client: sends CLIENT UNBLOCK
        self._wake = wake
        self._block_ms = block_ms
        self._runs: dict[bytes, _Run] = {}  # journal stream -> what is known of its run
        self._streams: dict[bytes, tuple[bytes, Callable[[], None]]] = {}  # other streams
        self._version = 0  # bumped when the set of streams changes
        self._reading = -1  # the version of the XREAD in flight (-1: none)
        self._changed = asyncio.Event()
        self._client: Any = None
        self._client_id: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._kicks: set[asyncio.Task[None]] = set()
        self._closing = False
        self.reconnects = 0  # times the connection came back after a failure
        self.healthy = False  # the last stream read succeeded (its positions are current)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="crdtstore-tail")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        self._closing = True
        for kick in list(self._kicks):
            kick.cancel()
        if task is not None:
            # redis-py can swallow a cancellation that lands while it sends a command (the
            # read then blocks on): cancel again until the task ends; the blocked read is
            # interrupted, and the loop stops at its next turn anyway
            cid = self._client_id
            if self._reading != -1 and cid is not None:
                with contextlib.suppress(Exception):
                    await self._control.execute_command("CLIENT", "UNBLOCK", cid)
            deadline = asyncio.get_running_loop().time() + self._block_ms / 1000 + 1
            while not task.done() and asyncio.get_running_loop().time() < deadline:
                task.cancel()
                await asyncio.wait([task], timeout=0.05)
            if not task.done():  # pragma: no cover - redis-py kept it
                log.warning("the redis stream read did not stop")
        await self._drop_client()

    # -- what is watched ------------------------------------------------------------------

    def watch_run(
        self, stream: str, meta: str, tenant: str, run: str, seen: int, client: object = None
    ) -> None:
        """Wake ``wake(tenant, run)`` for entries past ``seen`` that this store did not write
        (``client``: the client id of the reader, whose own entries wake nobody while it is
        the run's only reader here: it has them, and its commit announces them)."""
        key = stream.encode()
        got = self._runs.get(key)
        if got is not None:
            got.users += 1
            got.client = None  # several readers: each other's entries wake them
            if seen >= got.seen:
                return
            got.seen = seen  # the new reader may have missed a wake-up: read from there
        else:
            own = client if isinstance(client, int) else None
            self._runs[key] = _Run(tenant, run, meta, 1, seen, client=own)
        self._restart()

    def unwatch_run(self, stream: str) -> None:
        key = stream.encode()
        got = self._runs.get(key)
        if got is not None:
            got.users -= 1
            if got.users <= 0:
                del self._runs[key]
                self._version += 1  # the blocked read may keep it until it returns

    def wrote(self, stream: str, first: int, entries: Sequence[NewEntry]) -> None:
        """This store appended ``entries`` to ``stream`` from position ``first``: no wake-up
        for them; kept for the readers."""
        got = self._runs.get(stream.encode())
        if got is None or not entries:
            return
        last = first + len(entries) - 1
        got.keep([Row(first + i, *e) for i, e in enumerate(entries)])
        if first <= got.seen + 1 <= last + 1:
            got.seen = max(got.seen, last)
        elif first > got.seen + 1:
            got.gap = max(got.gap, last)

    def cached(self, stream: str, after: int, limit: int) -> list[Row] | None:
        """The entries after ``after`` up to the newest position this store knows of the
        stream, from those kept; None unless every one of them is kept (the reader then
        reads Redis). Entries appended since are announced by a later wake-up."""
        got = self._runs.get(stream.encode())
        if got is None or not self.healthy:
            return None
        if after >= got.seen:
            # nothing past `after` known: a wake-up for this store's own append (the stream
            # read saw it before the append's answer came); anything newer wakes again
            return []
        if (after + 1) not in got.rows:
            return None
        out: list[Row] = []
        row, seq = got.row, after + 1
        while seq <= got.seen and len(out) < limit:
            r = row(seq)
            if r is None:
                return None
            out.append(r)
            seq += 1
        return out

    def seen(self, streams: dict[str, str]) -> dict[str, int]:
        """``{run: the last position known}`` of the watched runs among ``streams``
        (``{stream key: run}``)."""
        out: dict[str, int] = {}
        for stream, run in streams.items():
            got = self._runs.get(stream.encode())
            if got is not None:
                out[run] = got.seen
        return out

    def watch_stream(self, stream: str, last_id: bytes, callback: Callable[[], None]) -> None:
        """Call ``callback()`` for every entry of ``stream`` after ``last_id`` (kept until the
        store closes)."""
        key = stream.encode()
        if key not in self._streams:
            self._streams[key] = (last_id, callback)
            self._restart()

    def watching_stream(self, stream: str) -> bool:
        return stream.encode() in self._streams

    def _restart(self) -> None:
        """The set of streams changed: make the loop send its read again."""
        self._version += 1
        self._changed.set()
        if self._reading != -1 and self._task is not None:
            kick = asyncio.get_running_loop().create_task(self._unblock(self._version))
            self._kicks.add(kick)
            kick.add_done_callback(self._kicks.discard)

    async def _unblock(self, version: int) -> None:
        """Interrupt a blocked read older than ``version`` (it may not have reached the server
        yet: then try again a few times; at worst it returns after ``BLOCK_MS``)."""
        for _ in range(100):
            reading, cid = self._reading, self._client_id
            if reading == -1 or reading >= version or cid is None:
                return
            try:
                if await self._control.execute_command("CLIENT", "UNBLOCK", cid):
                    return
            except (RedisError, OSError) as exc:
                log.debug("CLIENT UNBLOCK failed: %s", exc)
                return
            await asyncio.sleep(0.001)

    # -- the loop -------------------------------------------------------------------------

    async def _drop_client(self) -> None:
        client, self._client, self._client_id = self._client, None, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def _loop(self) -> None:
        delay = RETRY_FIRST
        failed = False
        while not self._closing:
            if not self._runs and not self._streams:
                self._changed.clear()
                await self._changed.wait()
                continue
            version = self._version
            keys = [*self._runs, *self._streams]
            ids = [
                f"{self._runs[k].seen}-0".encode() if k in self._runs else self._streams[k][0]
                for k in keys
            ]
            try:
                if self._client is None:
                    self._client = self._connect()
                    self._client_id = int(await self._client.client_id())
                self._reading = version
                if self._version == version:
                    self.healthy = True  # (set once the read is sent on a working client)
                args = (
                    b"XREAD",
                    b"COUNT",
                    COUNT,
                    b"BLOCK",
                    self._block_ms,
                    b"STREAMS",
                    *keys,
                    *ids,
                )
                conn = self._client.connection  # (the client's one connection: CLIENT ID's)
                if conn is None or pack is None:  # pragma: no cover - without hiredis
                    reply = await self._client.execute_command(*args)
                else:  # on the connection itself: no per-command machinery of redis-py
                    reply = await send(conn, args)
                self._reading = -1
                got = _xread_entries(reply)
                if got:
                    self._handle(got)
            except (RedisError, OSError) as exc:
                self._reading = -1
                self.healthy = False
                if not failed:
                    log.warning("redis stream read failed (%s); reconnecting", exc)
                failed = True
                await self._drop_client()
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                continue
            if failed:  # back: the readers may have missed entries meanwhile
                failed, delay = False, RETRY_FIRST
                self.reconnects += 1
                log.info("redis stream read reconnected")
                for r in list(self._runs.values()):
                    self._wake(r.tenant, r.run)
                for _, callback in list(self._streams.values()):
                    callback()

    def _handle(self, got: dict[bytes, list[Any]]) -> None:
        for key, entries in got.items():
            other = self._streams.get(key)
            if other is not None:
                self._streams[key] = (entries[-1][0], other[1])
                other[1]()
                continue
            r = self._runs.get(key)
            if r is None:
                continue
            last = r.keep_read(entries)
            if last > r.seen:
                # the next read continues after these; the readers take them from `rows`
                seen, r.seen = r.seen, last
                own = r.client
                if (
                    own is None
                    or r.gap > seen
                    or any(
                        client_of(e) != own for e in entries if int(e[0].split(b"-", 1)[0]) > seen
                    )
                ):
                    self._wake(r.tenant, r.run)
                # (else only the one reader's own appends, read before their answer came:
                # it has them, its commit takes its position past them)
