"""Pipelined appends: a record's committer sends its next batch while the one before is in
flight, instead of waiting a round trip for its answer.

The batches of a store go on one connection of their own (:class:`OrderedPipe`), so Redis
runs them in the order they were sent; each one after the first names the last entry of
the one before it, and the append script refuses it (``behind``, nothing written) unless that
entry is in the journal. So a batch is never appended after a later one: when an append is
refused or fails, the ones sent behind it are refused too, and the committer appends them
again, in order, once it knows. Positions stay dense (the script assigns them) and a write
is acknowledged only once its batch's answer came.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..._errors import BackendError
from ..._journal import NewEntry
from ._client import ConnectionLost, NoScriptError, RedisError, pack  # type: ignore[attr-defined]
from ._rows import entry_args

if TYPE_CHECKING:
    from ._journal import RedisJournal

log = logging.getLogger("crdtstore.redis")


def mark(entry: NewEntry) -> str:
    """The fields that name ``entry`` to the append script of the batch sent after it
    (client id, wall time and checksum, as the append writes them: see ``entry_args``)."""
    return f">{entry.client_id} {float(entry.wall_time)!r} {entry.checksum}"


class OrderedPipe:
    """One connection of the client's pool, kept: commands written at once, in the order
    of the calls, their replies read by one task and handed out in that order."""

    def __init__(self, client: Any) -> None:
        self._pool = client.connection_pool
        self._conn: Any = None
        self._connecting: asyncio.Task[None] | None = None
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._reader: asyncio.Task[None] | None = None
        self._more: asyncio.Future[None] | None = None  # set when the reader waits for work
        self._closed = False

    def send(self, args: Sequence[Any]) -> asyncio.Future[Any] | None:
        """Write one command now and return the future of its reply (a redis-py error
        reply is its exception); None when the connection is not ready (it is connected in
        the background meanwhile: send the usual way)."""
        conn = self._conn
        writer = None if conn is None else getattr(conn, "_writer", None)
        if writer is None or not conn.is_connected or pack is None:
            self._connect()
            return None
        writer.write(pack(tuple(args)))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        more, self._more = self._more, None
        if more is not None and not more.done():
            more.set_result(None)
        return fut

    def _connect(self) -> None:
        if self._closed or pack is None:
            return
        if self._connecting is None or self._connecting.done():
            loop = asyncio.get_running_loop()
            self._connecting = loop.create_task(self._open(), name="crdtstore-pipe-connect")

    async def _open(self) -> None:
        try:
            conn = self._conn
            if conn is None:
                conn = await self._pool.get_connection()
            if not conn.is_connected:
                await conn.connect()
        except (RedisError, OSError) as exc:
            log.debug("the pipelined connection could not connect: %s", exc)
            return
        if self._closed:
            await self._pool.release(conn)
            return
        self._conn = conn
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(
                self._read(conn), name="crdtstore-pipe"
            )

    async def _read(self, conn: Any) -> None:
        waiting = self._waiting
        try:
            while True:
                if not waiting:
                    self._more = asyncio.get_running_loop().create_future()
                    await self._more
                    continue
                try:
                    reply = await conn.read_response()
                except (NoScriptError, RedisError) as exc:
                    if not conn.is_connected:  # the connection failed: every reply is lost
                        raise
                    waiting.popleft().set_exception(exc)  # an error reply (a script's)
                    continue
                fut = waiting.popleft()
                if not fut.done():
                    fut.set_result(reply)
        except BaseException as exc:
            # the replies still awaited are lost with the connection (or the store closes): a
            # lost connection is appended again the usual way, as Direct sends again; after
            # a timeout the append may have run
            lost = isinstance(exc, (ConnectionLost, OSError))
            while waiting:
                fut = waiting.popleft()
                if not fut.done():
                    fut.set_exception(
                        ConnectionLost(str(exc))
                        if lost
                        else BackendError("redis", f"append: {type(exc).__name__}: {exc}")
                    )
            with contextlib.suppress(Exception):
                await conn.disconnect()
            if not isinstance(exc, (RedisError, OSError)):
                raise

    async def aclose(self) -> None:
        self._closed = True
        for task in (self._connecting, self._reader):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.disconnect()
            with contextlib.suppress(Exception):
                await self._pool.release(conn)


class SentAppend:
    """A pipelined append in flight (see :meth:`RedisJournal.append_pipelined`)."""

    __slots__ = ("_done", "_future", "_lost", "mark")

    def __init__(
        self,
        future: asyncio.Future[Any],
        mark: str,
        done: Callable[[Any], list[int] | None],
        lost: Callable[[], None],
    ) -> None:
        self._future = future
        self._done = done
        self._lost = lost  # called when the append may have run unanswered
        self.mark = mark

    def done(self) -> bool:
        return self._future.done()

    def on_done(self, callback: Callable[[], None]) -> None:
        self._future.add_done_callback(lambda _: callback())

    async def wait(self) -> None:
        with contextlib.suppress(Exception):
            await self._future

    def positions(self) -> list[int] | None:
        """The positions of the batch's entries; None when it was not appended and may be
        appended again (refused: ``behind`` or the run's authority held; the server lost
        the script, which the usual append loads; or the connection was lost before the
        answer, and the usual append sends it again, as it does its own).

        Raises:
            BackendError, RunClosed, UnknownRun: as ``append`` does.
        """
        fut = self._future
        exc = fut.exception()
        if exc is not None:
            if not isinstance(exc, NoScriptError):  # (it may have run: looked for first)
                self._lost()
            if isinstance(exc, (NoScriptError, ConnectionLost)):
                return None
            if isinstance(exc, BackendError):
                raise exc
            raise BackendError("redis", f"append: {type(exc).__name__}: {exc}") from exc
        return self._done(fut.result())


def send_append(
    journal: RedisJournal,
    pipe: OrderedPipe,
    tenant: str,
    run: str,
    entries: Sequence[NewEntry],
    after: SentAppend | None,
) -> SentAppend | None:
    """The append script's call for ``entries`` written on ``pipe`` now (behind ``after``);
    None when the pipe is not connected."""
    keys = journal.keys.run_keys(tenant, run)
    akeys = journal._append_keys(keys)
    expect = "" if after is None else after.mark
    args = ["", expect, len(entries), "", *entry_args(entries)]
    fut = pipe.send((b"EVALSHA", journal.scripts.append.sha, len(akeys), *akeys, *args))
    if fut is None:
        return None

    def done(got: Any) -> list[int] | None:
        if got[0] in (b"behind", b"locked"):
            return None
        first = journal._appended(tenant, run, keys, got)
        tail = journal.tail
        if tail is not None:
            tail.wrote(keys.stream, first, entries)
        return list(range(first, first + len(entries)))

    return SentAppend(fut, mark(entries[-1]), done, lambda: journal.uncertain(entries[0]))
