"""The SQLite journal's :class:`~crdtstore._journal.Authority`: one ``BEGIN IMMEDIATE``
transaction on the store's *authority connection*, held while a guarded write (or a group of
them, see ``crdtstore.record._guarded_group``) reads the journal and appends, so that no one
else writes in between.

It runs on the event loop thread, as the loop connection's appends do (``_inline``):
busy timeout 0, and a ``BEGIN`` that finds the write lock taken is tried again in short steps
(``RETRY_FIRST`` doubling to ``RETRY_MAX``, for at most ``BUSY_TIMEOUT`` seconds) instead of
blocking the loop (statements of tens of microseconds, less than a hop to a worker thread).
The run's head is read with the ``BEGIN``: a read past it is answered at once, and appends
get their positions from it and are written together before a read or the commit.

A durable commit syncs the log. It runs on the loop thread too while the syncs measured lately
(:class:`SyncEstimate`) took less than :data:`INLINE_SYNC`, less than the hop would add; once
they are slower (a busy disk) it goes to a worker thread, and the loop never waits for a slow
sync. The connection never checkpoints on commit; every :data:`CHECKPOINT_EVERY` commits one
checkpoint runs in a worker thread, so that the log is rewritten in place rather than grown.
On asyncio that thread is the journal's own (:class:`_Worker`, answering with
``call_soon_threadsafe``): a third of what ``anyio.to_thread`` costs in CPU per hop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import json.encoder
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread

from ..._errors import BackendError
from ..._journal import Authority, NewEntry, Row
from ._rows import _COLS, _append_tx, _insert_rows, _rows
from ._schema import _Conn, _dumps, _is_busy

if TYPE_CHECKING:
    from ._journal import SQLiteJournal


T = TypeVar("T")

WORKER_IDLE = 2.0  # seconds a journal's worker thread waits for work before it ends
INLINE_READ = 256  # an authority's read of at most this many rows runs on the loop thread
INLINE_SYNC = 0.0005  # seconds: a durable commit measured faster than this runs on the loop
CHECKPOINT_EVERY = 200  # commits that wrote between two checkpoints of the authority's log
# the longest pause between two tries of a taken write lock: a timed sleep costs ~50 us of CPU
# whatever its length (the timer's wake-up; asyncio sleeps at least 1 ms), more than a group
# of guarded writes per try would save, so a waiter backs off further than an append does
# (SQLite's own busy handler: 1 to 100 ms); the holder's group commits in a few ms
LOCK_WAIT_LONGEST = 0.008

log = logging.getLogger("crdtstore.sqlite")

_RESERVE = "UPDATE runs SET head = head + 1 WHERE id = ? AND state = 'open' RETURNING head"
_MOVE_HEAD = "UPDATE runs SET head = head + ? WHERE id = ? RETURNING head"


# the journal's JSON encoder (``_dumps``) made once: ``JSONEncoder.encode`` builds it per call,
# most of the time an entry's short effect takes (no circular check: what fails goes to _dumps)
_MAKE = getattr(json.encoder, "c_make_encoder", None)
_ENCODE: Callable[[Any, int], Any] | None = (
    None
    if _MAKE is None
    else _MAKE(None, None, json.encoder.encode_basestring, None, ":", ",", False, False, True)
)


def _text(effect: Any) -> str:
    """``_dumps(effect)``, the same text, faster."""
    if _ENCODE is None:
        return _dumps(effect)
    try:
        return "".join(_ENCODE(effect, 0))
    except Exception:  # (not JSON-like: _dumps says why; too deep: it says so too)
        return _dumps(effect)


def _translated(exc: sqlite3.Error) -> BackendError:
    return BackendError("sqlite", f"{type(exc).__name__}: {exc}")


class _SQLiteAuthority(Authority):
    """An open write transaction on the authority connection (see the module docstring);
    made by :meth:`begin`, ended by :meth:`commit` or :meth:`rollback`."""

    def __init__(
        self,
        journal: SQLiteJournal,
        conn: _Conn,
        tenant: str,
        run: str,
        rid: int,
        head: int | None = None,
        durable: bool = True,
    ) -> None:
        self._j = journal
        self._conn = conn
        self._tenant = tenant
        self._run = run
        self._rid = rid
        self._durable = durable
        self.committed = False  # append_last committed: leaving the context only ends it
        self._head = head  # the run's head while nothing was appended here (None: unknown)
        self._wrote = False  # something was appended or run_sync ran (the commit may sync)
        # appends are held back and written in one statement set before anything reads or
        # commits (the positions are known: no one else appends while the lock is held)
        self._next: int | None = None  # the next entry's position (None: write at once)
        self._held: list[NewEntry] = []
        self._reserved = 0  # positions the head was moved past at the BEGIN, not yet appended

    @classmethod
    async def begin(
        cls,
        journal: SQLiteJournal,
        conn: _Conn,
        tenant: str,
        run: str,
        rid: int,
        *,
        durable: bool,
        retry_first: float,
        retry_max: float,
        busy_timeout: float,
    ) -> _SQLiteAuthority:
        """``BEGIN IMMEDIATE`` on ``conn`` on the loop thread, tried again while the write
        lock is taken; the run's head read in the same step.

        Raises:
            BackendError: the lock stayed taken for ``busy_timeout`` seconds, or SQLite failed.
        """
        db = conn.db
        want = "FULL" if durable else "NORMAL"
        deadline = time.monotonic() + busy_timeout
        delay = retry_first
        while True:
            _check_owner(journal)
            try:
                if conn.synchronous != want:
                    db.execute(f"PRAGMA synchronous={want}")
                    conn.synchronous = want
                db.execute("BEGIN IMMEDIATE")
                # the head read by moving it past the position of one append (a guarded
                # write's usual one: no statement of its own); :meth:`_write_held` corrects
                # it for any other count, and a transaction that appends nothing rolls back
                row = db.execute(_RESERVE, (rid,)).fetchone()
                if row is not None:
                    auth = cls(journal, conn, tenant, run, rid, row[0] - 1, durable)
                    auth._next = row[0]
                    auth._reserved = 1
                    return auth
                row = db.execute("SELECT head FROM runs WHERE id = ?", (rid,)).fetchone()
                head = None if row is None else int(row[0])  # (not open: appends refused)
                return cls(journal, conn, tenant, run, rid, head, durable)
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                if not _is_busy(exc):
                    raise _translated(exc) from exc
            if time.monotonic() >= deadline:
                raise BackendError(
                    "sqlite", f"database is locked (a guarded write waited {busy_timeout:g} s)"
                )
            await anyio.sleep(delay)
            delay = min(delay * 2, max(retry_max, LOCK_WAIT_LONGEST))

    def _now(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(db)`` inside the transaction, on the loop thread."""
        try:
            return fn(self._conn.db)
        except sqlite3.Error as exc:
            raise _translated(exc) from exc

    async def _in_thread(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(db)`` inside the transaction, in a worker thread (the loop does not touch the
        connection meanwhile: its authority waits for this)."""
        db = self._conn.db

        def run() -> T:
            try:
                return fn(db)
            except sqlite3.Error as exc:
                raise _translated(exc) from exc

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio (trio)
            loop = None
        with anyio.CancelScope(shield=True):
            if loop is None:
                out = await anyio.to_thread.run_sync(run)
            else:
                out = await self._j.sync_estimate.worker.run(loop, run)
        return out

    async def read(self, after: int) -> list[Row]:
        if self._held:  # (the head's reservation may wait: a read does not look at it)
            self._write_held()
        head = self._head
        if head is not None and after >= head:
            return []  # nothing past the head, which no one else can move now
        rid = self._rid

        def fetch(db: sqlite3.Connection) -> list[Any]:
            return db.execute(
                f"SELECT {_COLS} FROM journal WHERE run_id = ? AND seq > ? ORDER BY seq",
                (rid, after),
            ).fetchall()

        if head is not None and head - after <= INLINE_READ:
            return _rows(self._now(fetch))
        return _rows(await self._in_thread(fetch))

    async def append(self, entries: Sequence[NewEntry]) -> list[int]:
        return self.append_now(entries)

    def append_now(self, entries: Sequence[NewEntry]) -> list[int]:
        """:meth:`append`, synchronous (it runs on the loop thread): a guarded write that
        joins a group under way appends in its own task, with no await in between. Held
        back until the transaction reads or commits (one statement set for a group)."""
        if not entries:
            return []
        first = self._next
        self._head = None
        self._wrote = True
        if first is not None:
            self._held += entries
            self._next = first + len(entries)
            return list(range(first, first + len(entries)))
        return self._append(entries)

    def _append(self, entries: Sequence[NewEntry]) -> list[int]:
        effects = [_dumps(e.effect) for e in entries]
        try:  # (what _now does, without a closure: once per guarded write)
            return _append_tx(self._conn.db, self._tenant, self._run, self._rid, entries, effects)
        except sqlite3.Error as exc:
            raise _translated(exc) from exc

    def _write_held(self) -> None:
        """Write the appends held back, at the positions they were given, and move the run's
        head to the last of them (unless the reservation made at the BEGIN did already)."""
        held, self._held = self._held, []
        n = len(held)
        delta, self._reserved = n - self._reserved, 0
        if self._next is None:  # (held appends always have positions)
            raise BackendError("sqlite", "appends held back without a position")
        db = self._conn.db
        try:
            if delta:
                row = db.execute(_MOVE_HEAD, (delta, self._rid)).fetchone()
                if row is None or row[0] != self._next - 1:  # (the lock says it cannot)
                    raise BackendError("sqlite", "the run's head moved under the write lock")
            if held:
                _insert_rows(db, self._rid, self._next - n, held, [_text(e.effect) for e in held])
        except sqlite3.Error as exc:
            raise _translated(exc) from exc

    async def append_last(self, entries: Sequence[NewEntry]) -> list[int]:
        seqs = await self.append(entries)
        if seqs:
            await self.commit()
        return seqs

    async def run_sync(self, fn: Callable[[Any], T]) -> T:
        if self._held or self._reserved:
            self._write_held()
        self._head = None  # (fn may write)
        self._next = None
        self._wrote = True
        return self._now(fn)

    async def commit(self) -> None:
        """Commit (see the module docstring: on the loop thread, unless it syncs the log and
        the syncs measured lately were slow, or it is a commit that checkpoints). Idempotent.
        """
        if self.committed:
            return
        if self._reserved and not self._held:  # nothing appended: undo the reservation
            self.rollback()
            self.committed = True
            return
        if self._held:
            try:
                self._write_held()
            except BaseException:
                self.rollback()
                raise
        estimate = self._j.sync_estimate
        durable = self._wrote and self._durable
        checkpoint = self._wrote and estimate.commit_checkpoints()
        try:
            if checkpoint or (durable and not estimate.inline()):
                await self._in_thread(lambda db: _commit(db, estimate if durable else None))
                if checkpoint:
                    await self._in_thread(_checkpoint)
            else:
                try:
                    _commit(self._conn.db, estimate if durable else None)
                except sqlite3.Error as exc:
                    raise _translated(exc) from exc
        except BaseException:
            self.rollback()
            raise
        self.committed = True

    def rollback(self) -> None:
        """Roll back what the transaction wrote (on the loop thread: nothing is synced)."""
        self._held = []
        db = self._conn.db
        if not self.committed and db.in_transaction:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error as exc:
                raise _translated(exc) from exc


class AuthorityScope:
    """``async with journal.authority(...)``: the authority connection's lock, a transaction
    begun on it (:meth:`_SQLiteAuthority.begin`), committed on leaving (rolled back on an
    error). A class rather than an ``asynccontextmanager``: an async generator costs a
    guarded write a fifth of what its authority does in Python (asyncio tracks each one)."""

    __slots__ = ("_args", "_auth", "_j", "_lock")

    def __init__(
        self,
        journal: SQLiteJournal,
        tenant: str,
        run: str,
        durable: bool,
        retry_first: float,
        retry_max: float,
        busy_timeout: float,
    ) -> None:
        self._j = journal
        self._args = (tenant, run, durable, retry_first, retry_max, busy_timeout)
        self._auth: _SQLiteAuthority | None = None
        self._lock: anyio.Lock | None = None

    async def __aenter__(self) -> _SQLiteAuthority:
        j = self._j
        tenant, run, durable, retry_first, retry_max, busy_timeout = self._args
        rid = await j._run_id(tenant, run)
        lock = j._alock
        if j._a is None or lock is None:
            raise BackendError("sqlite", "store is not open")
        await lock.acquire()
        try:
            conn = j._a
            if conn is None:
                raise BackendError("sqlite", "store is not open")
            auth = await _SQLiteAuthority.begin(
                j,
                conn,
                tenant,
                run,
                rid,
                durable=durable,
                retry_first=retry_first,
                retry_max=retry_max,
                busy_timeout=busy_timeout,
            )
        except BaseException:
            lock.release()
            raise
        self._auth, self._lock = auth, lock
        return auth

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        auth, lock = self._auth, self._lock
        assert auth is not None
        assert lock is not None
        self._auth = self._lock = None
        try:
            if exc_type is not None:
                auth.rollback()
            else:
                await auth.commit()
        finally:
            lock.release()


class SyncEstimate:
    """How long a durable commit of the authority connection takes (a moving average of the
    measured ones), and which commit checkpoints: every :data:`CHECKPOINT_EVERY` commits
    that wrote, the authority connection (which never checkpoints on commit) checkpoints
    the log in a worker thread, so that the log is rewritten in place instead of growing
    (a sync of a growing file also syncs its size: several times slower)."""

    def __init__(self) -> None:
        self.seconds = INLINE_SYNC  # (until measured: a worker thread)
        self._commits = 0
        self.worker = _Worker()  # the thread the slow commits of the journal run in

    def inline(self) -> bool:
        """Whether a durable commit now may run on the loop thread."""
        return self.seconds < INLINE_SYNC

    def add(self, seconds: float) -> None:
        self.seconds += (seconds - self.seconds) / 8

    def commit_checkpoints(self) -> bool:
        self._commits += 1
        return self._commits % CHECKPOINT_EVERY == 0


class _Worker:
    """A thread that runs calls for an asyncio loop, one at a time in the order given: started
    on the first call, ended after :data:`WORKER_IDLE` seconds without one (a closed store
    leaves no thread behind for long)."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Callable[..., None]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()  # (a call given while the thread decides to end)
        self._alive = False

    async def run(self, loop: asyncio.AbstractEventLoop, fn: Callable[[], T]) -> T:
        """``fn()`` in the thread. A cancellation waits for it to return (the connection it
        uses is not touched before), then propagates."""
        fut: asyncio.Future[T] = loop.create_future()

        def answer(value: Any, error: BaseException | None) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_settle, fut, value, error)

        with self._lock:
            self._calls.put((fn, answer))
            if not self._alive:
                self._alive = True
                threading.Thread(target=self._serve, name="crdtstore-sqlite", daemon=True).start()
        cancelled: BaseException | None = None
        while not fut.done():
            try:
                await asyncio.shield(fut)
            except asyncio.CancelledError as exc:
                cancelled = exc
        if cancelled is not None:
            fut.exception()  # (retrieved: the cancellation is what propagates)
            raise cancelled
        return fut.result()

    def _serve(self) -> None:
        calls = self._calls
        while True:
            try:
                fn, answer = calls.get(timeout=WORKER_IDLE)
            except queue.Empty:
                with self._lock:
                    if calls.empty():
                        self._alive = False
                        return
                continue
            value: Any = None
            error: BaseException | None = None
            try:
                value = fn()
            except BaseException as exc:  # raised in the caller, in the loop thread
                error = exc
            answer(value, error)
            del fn, answer, value, error


def _settle(fut: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


def _commit(db: sqlite3.Connection, estimate: SyncEstimate | None) -> None:
    """COMMIT, timed into ``estimate`` (a durable one)."""
    if estimate is None:
        db.execute("COMMIT")
        return
    t0 = time.perf_counter()
    db.execute("COMMIT")
    estimate.add(time.perf_counter() - t0)


def _checkpoint(db: sqlite3.Connection) -> None:
    """A passive checkpoint of the log, outside any transaction of this connection (a
    failure is left to the next one)."""
    try:
        db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    except sqlite3.Error as exc:
        log.debug("checkpoint after a guarded commit skipped: %s", exc)


def _check_owner(journal: SQLiteJournal) -> None:
    if os.getpid() != journal._pid:
        raise BackendError("sqlite", "store object used after fork; open the store again")
