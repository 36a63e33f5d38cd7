"""The SQLite lease backend: the lease table in the store file, next to the journal.

Living in the same file is the point: a write to the record that carries a lease runs
:func:`check_fence` inside the same ``BEGIN IMMEDIATE`` transaction as the journal append, so
no grant can change between the check and the write.

Every transition applies the :mod:`._engine` transition to the lease rows atomically and
writes back only what changed, at little more than the cost of the bare write:

- inline on the event loop on the lease connection (busy timeout 0); a busy write lock is
  retried after a short growing sleep that does not block the loop, up to :data:`BUSY_TIMEOUT`;
- on rows cached between transitions: a transition that writes one row is one statement that
  writes only if nobody committed since (``data_version``, or for an uncontended grant and
  its release the rows it relies on, :data:`._lease_rows.MOVE_GRANT`); any other runs in
  ``BEGIN IMMEDIATE`` and checks ``data_version`` there; when stale, the rows are read again;
- the counters (next rank and token) ride in every row written and in row 0, where a removed
  row retires to: no statement for them alone (see :func:`._lease_rows.save_table`).

Created on first use; earlier layouts are migrated (processes of an earlier version must not
share the store: row -1 makes the one before fail instead of reading stale counters).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread

from ..._errors import BackendError, LeaseLost
from ..._leases._backend import Granted, Outcome, ReleaseArgs, RequestArgs, TableBackend
from ..._leases._clock import Clock, Proc, ProcessProbe, SystemClock
from ..._leases._engine import Table, fence_error, granted_state
from ..._leases._models import LeaseState
from ._lease_rows import (
    _RETIRE_IF_DV,
    _SELECT_ID,
    MOVE_GRANT,
    MOVE_RETIRE,
    _insert_args,
    _req,
    _resources_json,
    create_tables,
    load_table,
    move_grant_args,
    save_table,
)

if TYPE_CHECKING:
    from ._journal import SQLiteJournal

T = TypeVar("T")
A = TypeVar("A")
_BUSY: Any = object()
BUSY_TIMEOUT = 30.0  # seconds, as the journal's connections (timeout=30.0)
_FIRST_RETRY = 0.0001  # seconds before the first retry of a busy transition (doubling)
_MAX_RETRY = 0.004
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6

_SYSTEM_CLOCK = SystemClock()


def check_fence(
    db: sqlite3.Connection,
    lease_id: str,
    resource: str,
    token: int,
    *,
    tenant: str | None = None,
    clock: Clock | None = None,
) -> None:
    """The fencing check, inside the caller's already open write transaction.

    Run it in the same ``BEGIN IMMEDIATE`` transaction as the write it guards: the write lock
    then keeps every lease transition out until ``COMMIT``. The caller must roll back when it
    raises.

    Raises:
        LeaseLost: the lease is not granted, does not cover ``resource`` (canonical form), is
            not holding token ``token``, or its TTL passed.
    """
    clock = clock if clock is not None else _SYSTEM_CLOCK
    try:
        row = db.execute(_SELECT_ID, (lease_id,)).fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
        row = None  # no lease was ever taken in this store
    r = _req(row) if row is not None else None
    if r is not None and tenant is not None and r.tenant != tenant:
        r = None
    err = fence_error(r, resource, token, clock.now(), clock.boot_id())
    if err is not None:
        raise err


_INSTANCES: weakref.WeakSet[SQLiteLeases] = weakref.WeakSet()


def _forget_connections() -> None:
    # A forked child must not use the parent's connection: it goes through
    # journal.lease_connection() again, which refuses.
    for leases in list(_INSTANCES):
        leases._db = None
        leases._cached = leases._cached_db = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_connections)


def _apply(t: Table, fn: Callable[[Table], T]) -> T:
    return fn(t)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:  # pragma: no cover - Python < 3.11
        return "locked" in str(exc) or "busy" in str(exc)
    return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)


class SQLiteLeases(TableBackend):
    """Leases in the SQLite store file of ``journal``, on its lease connection."""

    name = "sqlite"

    def __init__(
        self,
        journal: SQLiteJournal,
        *,
        clock: Clock | None = None,
        probe: ProcessProbe | None = None,
    ) -> None:
        super().__init__(clock=clock, probe=probe)
        self.journal = journal
        journal.fence_check = check_fence  # guarded appends check fences in their transaction
        self._ready = False
        # the rows as of the last transition on connection _cached_db, valid while that
        # connection's data_version is still _cached_dv
        self._cached: Table | None = None
        self._cached_db: sqlite3.Connection | None = None
        self._cached_dv = -1
        self._lock = threading.Lock()  # one transition at a time on the lease connection
        self._cursor: sqlite3.Cursor | None = None  # reused: a cursor per statement costs
        self._cursor_db: sqlite3.Connection | None = None
        # the lease connection as last checked by journal.lease_connection() (open, not
        # inherited through fork: a getpid per call), dropped in a forked child
        self._db: sqlite3.Connection | None = None
        _INSTANCES.add(self)
        self._one_statement = True  # see _attempt
        # the rank that MOVE_GRANT moved row 0 to, while it holds (0: row 0 is in place, or
        # unknown): only its release can be MOVE_RETIRE (see _lease_rows.MOVE_GRANT)
        self._moved = 0

    async def open(self) -> None:
        await self.journal.open()
        await self._ensure()

    async def aclose(self) -> None:
        self._ready = False
        self._cached = self._cached_db = None
        self._cursor = self._cursor_db = None
        self._db = None

    async def _ensure(self) -> sqlite3.Connection:
        """The lease connection (checked: open, not inherited through fork), tables made."""
        if not self._ready:
            await self.journal._write(create_tables)
            self._ready = True
        if self.journal._lease_db is None:
            db = await anyio.to_thread.run_sync(self.journal.lease_connection)
        else:
            db = self.journal.lease_connection()
        self._db = db
        return db

    async def _connection(self) -> sqlite3.Connection:
        db = self._db
        # the journal drops its lease connection when it closes
        if db is None or db is not self.journal._lease_db:
            db = await self._ensure()
        return db

    async def _run(self, fn: Callable[[Table, A], T], arg: A, shield: bool) -> T:
        db = await self._connection()
        # No checkpoint on the fast path: the transaction runs to its commit without
        # suspending, so cancellation can only land before it starts or after the caller
        # got its result (in its next checkpoint), never between commit and caller.
        out = self._attempt(db, fn, arg)
        if out is _BUSY:
            with anyio.CancelScope(shield=shield):
                out = await self._retry(fn, arg)
        return out

    async def _transact(self, fn: Callable[[Table], T], *, shield: bool = False) -> T:
        return await self._run(_apply, fn, shield)

    # request and release: as the base class has them, minus two coroutines and a closure per
    # transition when the lease connection is ready and the write lock free

    def _lock_at_once(self) -> bool:
        """Take the write lock without waiting, if the cached table is of this connection,
        still open (a forked child has no cache); True with the lock held."""
        db = self._cached_db
        if db is not self.journal._lease_db or self._cursor_db is not db:
            return False
        return self._lock.acquire(blocking=False)

    def request_now(
        self, tenant: str, owner: str, resources: tuple[str, ...], ttl: float, proc: Proc
    ) -> Granted | None:
        t = self._cached
        if t is None or t.reqs or not self._lock_at_once():
            return None
        try:
            clock = self.clock
            now, boot, wall = clock.now(), clock.boot_id(), time.time()
            r = t.request_alone(tenant, owner, resources, ttl, None, proc, now, boot, wall)
            args = (r.rank, r.id, r.token, ttl, wall, now, tenant, owner,
                    _resources_json(resources), *proc, boot)  # fmt: skip
            try:
                done = self._cursor.execute(MOVE_GRANT, args).rowcount == 1  # type: ignore[union-attr]
            except sqlite3.Error:
                done = False  # busy, or stale (see MOVE_GRANT): request() sorts it out
            if not done:
                self._cached = None
                return None
            self._moved = r.rank
            return r.id, r.rank, r.token, r.expires - now  # type: ignore[return-value]
        except BaseException:
            self._cached = None  # changed, and maybe not as written
            raise
        finally:
            self._lock.release()

    def release_now(self, tenant: str, lease_id: str, owner: str, token: int | None) -> bool:
        t = self._cached
        rank = self._moved
        if t is None or not rank or not self._lock_at_once():
            return False
        try:
            clock = self.clock
            r = t.release_only(
                tenant, lease_id, owner, token, clock.now(), clock.boot_id(), self.probe
            )
            if r is None:
                return False
            try:
                done = r.rank == rank and self._cursor.execute(  # type: ignore[union-attr]
                    MOVE_RETIRE, (t.next_rank, t.next_token, rank)
                ).rowcount == 1  # fmt: skip
            except sqlite3.Error:
                done = False  # busy, or stale (see MOVE_GRANT): release() sorts it out
            if not done:
                self._cached = None
                return False
            self._moved = 0
            return True
        except BaseException:
            self._cached = None  # changed, and maybe not as written
            raise
        finally:
            self._lock.release()

    async def request(
        self,
        tenant: str,
        owner: str,
        resources: tuple[str, ...],
        *,
        ttl: float,
        key: tuple[str, int] | None,
        proc: Proc,
        wait: bool,
    ) -> LeaseState:
        args = (tenant, owner, resources, ttl, key, proc, wait, time.time())
        db = self._db
        out = _BUSY
        if db is not None and db is self.journal._lease_db:
            out = self._attempt(db, self._request_tx, args)
        if out is _BUSY:
            out = await self._run(self._request_tx, args, False)
        state, error, wake = out
        if wake and self.on_change is not None:
            self.on_change()
        if error is not None:
            raise error
        return state  # type: ignore[no-any-return]

    async def release(self, tenant: str, lease_id: str, owner: str, token: int | None) -> None:
        if self.release_now(tenant, lease_id, owner, token):
            return
        args = (tenant, lease_id, owner, token)
        db = self._db
        out = _BUSY
        if db is not None and db is self.journal._lease_db:
            out = self._attempt(db, self._release_tx, args)
        if out is _BUSY:
            out = await self._run(self._release_tx, args, True)
        _, error, wake = out
        if wake and self.on_change is not None:
            self.on_change()
        if error is not None:
            raise error

    # the two transitions of an uncontended acquire+release take the table's fast paths

    def _request_tx(self, t: Table, args: RequestArgs) -> Outcome:
        if t.reqs:
            return TableBackend._request_tx(self, t, args)
        now, boot = self.clock.now(), self.clock.boot_id()
        r = t.request_alone(*args[:6], now, boot, args[7])
        t.dirty.add(r.rank)
        t.meta_dirty = True
        state = granted_state(
            r.id, r.rank, r.owner, r.resources, r.token, r.ttl, r.expires - now, r.key
        )
        return state, None, False  # wakes nobody

    def _release_tx(self, t: Table, args: ReleaseArgs) -> Outcome:
        r = t.release_only(*args, self.clock.now(), self.clock.boot_id(), self.probe)
        if r is not None:
            t.dirty.discard(r.rank)
            t.removed.add(r.rank)
            return None, None, False
        return TableBackend._release_tx(self, t, args)

    async def _retry(self, fn: Callable[[Table, A], T], arg: A) -> T:
        """Retry while another connection holds the write lock, sleeping between attempts."""
        deadline = time.monotonic() + BUSY_TIMEOUT
        delay = _FIRST_RETRY
        while True:
            await anyio.sleep(delay)
            delay = min(delay * 2, _MAX_RETRY)
            out = self._attempt(self.journal.lease_connection(), fn, arg)
            if out is not _BUSY:
                return out
            if time.monotonic() >= deadline:
                raise BackendError(
                    "sqlite", f"database is locked (a lease transition waited {BUSY_TIMEOUT} s)"
                )

    def _attempt(self, db: sqlite3.Connection, fn: Callable[[Table, A], T], arg: A) -> T | Any:
        """Run ``fn(table, arg)`` in one transaction now, or return ``_BUSY`` without waiting.

        With cached rows, ``fn`` runs on them first. A transition that then writes one row
        (a request, a heartbeat, a release that hands nothing off) is one statement in its own
        transaction that writes only while data_version is the one the cache was read at; any
        other is checked against data_version inside ``BEGIN IMMEDIATE``. Either way, when
        another connection committed meanwhile, ``fn`` runs again on the rows read afresh.
        """
        lock = self._lock
        if not lock.acquire(blocking=False):
            return _BUSY
        try:
            cur = self._cursor
            if cur is None or self._cursor_db is not db:
                cur = self._cursor = db.cursor()
                self._cursor_db = db
            t = self._cached if self._cached_db is db else None
            if t is not None:
                empty = not t.reqs
                try:
                    out = fn(t, arg)
                except BaseException:
                    self._cached = None
                    raise
                dirty, removed = t.dirty, t.removed
                if len(dirty) + len(removed) == 1:
                    moved = self._moved
                    args = None
                    if dirty:
                        if empty and len(t.reqs) == 1:
                            r = t.reqs[next(iter(dirty))]
                            if r.rank == t.next_rank - 1 and r.token == t.next_token - 1:
                                args = move_grant_args(r)
                        if args is not None:
                            sql, moved = MOVE_GRANT, r.rank
                        elif self._one_statement:
                            sql, args = _insert_args(t.reqs[next(iter(dirty))], t, self._cached_dv)
                    else:
                        rank = next(iter(removed))
                        if rank == moved and not t.reqs:
                            sql, args, moved = MOVE_RETIRE, (t.next_rank, t.next_token, rank), 0
                        elif self._one_statement:
                            sql = _RETIRE_IF_DV
                            args = (t.next_rank, t.next_token, rank, self._cached_dv)
                            moved = 0
                    done = False
                    if args is not None:
                        try:
                            done = cur.execute(sql, args).rowcount == 1
                        except sqlite3.IntegrityError:
                            pass  # a MOVE_ statement found another row in its place: stale
                        except sqlite3.OperationalError as exc:
                            self._cached = None
                            if _is_busy(exc):
                                return _BUSY
                            if "pragma_data_version" not in str(exc):
                                raise BackendError(
                                    "sqlite", f"{type(exc).__name__}: {exc}"
                                ) from exc
                            self._one_statement = False  # an SQLite without pragma functions
                    if done:
                        t.clean()
                        self._moved = moved
                        return out
                    t = self._cached = None  # stale, or never written: the general way
            try:
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                self._cached = None
                if _is_busy(exc):
                    return _BUSY
                raise BackendError("sqlite", f"{type(exc).__name__}: {exc}") from exc
            try:
                dv = cur.execute("PRAGMA data_version").fetchone()[0]
                if t is None or self._cached_dv != dv:
                    self._cached = None
                    t = load_table(cur)
                    out = fn(t, arg)
                if t.dirty or t.removed or t.meta_dirty:
                    save_table(cur, t)
                cur.execute("COMMIT")
            except BaseException as exc:
                self._cached = None
                if db.in_transaction:
                    db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise BackendError("sqlite", f"{type(exc).__name__}: {exc}") from exc
                raise
            self._cached, self._cached_db, self._cached_dv = t, db, dv
            self._moved = 0
            return out
        finally:
            lock.release()

    async def _view(self, fn: Callable[[Table], T]) -> T:
        await self._ensure()

        def read(db: sqlite3.Connection) -> T:
            # one read transaction, so the rows and the counters agree
            db.execute("BEGIN")
            try:
                return fn(load_table(db))
            finally:
                db.execute("COMMIT")

        return await self.journal._read(read)

    async def reap(self) -> int:
        db = await self._connection()
        if self._cached_empty(db):
            return 0  # nothing to reap: spare the write transaction
        return await super().reap()

    def _cached_empty(self, db: sqlite3.Connection) -> bool:
        """True when the cached rows are current (nobody committed since) and hold nothing."""
        t = self._cached
        if t is None or t.reqs or self._cached_db is not db:
            return False
        if not self._lock.acquire(blocking=False):
            return False
        try:
            dv = db.execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error:
            return False
        finally:
            self._lock.release()
        return bool(dv == self._cached_dv)

    async def check(self, tenant: str, lease_id: str, resource: str, token: int) -> None:
        await self._ensure()
        clock = self.clock

        def tx(db: sqlite3.Connection) -> LeaseLost | None:
            try:
                check_fence(db, lease_id, resource, token, tenant=tenant, clock=clock)
            except LeaseLost as exc:
                return exc
            return None

        err = await self.journal._read(tx)
        if err is not None:
            raise err

    async def check_within(
        self, auth: Any, tenant: str, lease_id: str, resource: str, token: int
    ) -> None:
        """The fencing check in the authority's open ``BEGIN IMMEDIATE`` transaction on this
        same file: its write lock keeps every lease transition out until the write commits."""
        clock = self.clock
        await auth.run_sync(
            lambda db: check_fence(db, lease_id, resource, token, tenant=tenant, clock=clock)
        )
