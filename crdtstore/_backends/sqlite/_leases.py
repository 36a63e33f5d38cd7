"""The SQLite lease backend: the lease table in the store file, next to the journal.

Living in the same file is the point: a write to the record that carries a lease runs
:func:`check_fence` inside the same ``BEGIN IMMEDIATE`` transaction as the journal append, so
no grant can change between the check and the write.

Every transition applies the :mod:`._engine` transition to the lease rows (holders and
waiters, never history) atomically and writes back only what changed, at little more than
the cost of the bare write:

- inline on the event loop on the lease connection (busy timeout 0); a busy write lock is
  retried after a short growing sleep that does not block the loop, up to :data:`BUSY_TIMEOUT`;
- on rows cached between transitions, valid while ``data_version`` has not moved: a transition
  that writes one row is one statement that writes only if it has not; any other runs in
  ``BEGIN IMMEDIATE`` and checks it there; when it moved, the rows are read again;
- the counters (next rank and token) ride in every row written and in row 0, where a removed
  row retires to: no statement for them alone (see :func:`save_table`).

Created on first use; earlier layouts are migrated (processes of an earlier version must not
share the store: row -1 makes the one before fail instead of reading stale counters).
"""

from __future__ import annotations

import functools
import json
import operator
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
from ..._leases._backend import Outcome, ReleaseArgs, RequestArgs, TableBackend
from ..._leases._clock import Clock, Proc, ProcessProbe, SystemClock
from ..._leases._engine import Req, Table, fence_error
from ..._leases._models import LeaseState

if TYPE_CHECKING:
    from ._journal import SQLiteJournal

T = TypeVar("T")
A = TypeVar("A")
_BUSY: Any = object()
BUSY_TIMEOUT = 30.0  # seconds, as the journal's connections (timeout=30.0)
_FIRST_RETRY = 0.0001  # seconds before the first retry of a busy transition (doubling)
_MAX_RETRY = 0.004
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6

TABLE = "lease_table"
_CREATE = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    rank INTEGER PRIMARY KEY,  -- 0: the counters row (next_rank, next_token); else a request
    id TEXT,
    tenant TEXT,
    owner TEXT,
    step TEXT,
    attempt INTEGER,
    resources TEXT,
    state TEXT,
    token INTEGER,
    ttl REAL,
    host TEXT,
    boot TEXT,
    pid INTEGER,
    pstart INTEGER,
    acked INTEGER,
    created REAL,
    clock_boot TEXT,
    requested REAL,
    granted_at REAL,
    expires REAL,
    next_rank INTEGER,
    next_token INTEGER
)"""
_COLS = (
    "rank, id, tenant, owner, step, attempt, resources, state, token, ttl, host, boot, pid,"
    " pstart, acked, created, clock_boot, requested, granted_at, expires"
)
_SELECT = f"SELECT {_COLS}, next_rank, next_token FROM {TABLE}"
_SELECT_ID = f"SELECT {_COLS} FROM {TABLE} WHERE id = ?"
_INSERT = (
    f"INSERT OR REPLACE INTO {TABLE} ({_COLS}, next_rank, next_token)"
    f" VALUES ({', '.join('?' * 22)})"
)
_DELETE = f"DELETE FROM {TABLE} WHERE rank = ?"
# A removed request's row becomes row 0, the counters row, replacing the one before: the
# removal and the counters in one statement (rank is the rowid; OR REPLACE drops old row 0).
_RETIRE = (
    f"UPDATE OR REPLACE {TABLE} SET rank = 0, "
    + ", ".join(f"{c.strip()} = NULL" for c in _COLS.split(",")[1:])
    + ", next_rank = ?, next_token = ? WHERE rank = ?"
)
_RETIRE_IF_DV = _RETIRE + " AND (SELECT data_version FROM pragma_data_version()) = ?"
_COUNTERS = f"INSERT OR REPLACE INTO {TABLE} (rank, next_rank, next_token) VALUES (0, ?, ?)"
# Row -1 marks the row format of this version (counters in every written row, not only in
# row 0): the version before read the counters from row 0 alone and would hand out a rank or
# token again. Its NULL resources make that version's row parser raise instead.
FORMAT_ROW = -1
FORMAT = "lease rows v2: counters in every row"
_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _req(row: Any) -> Req:
    proc = None if row[10] is None else Proc(row[10], row[11], row[12], row[13])
    return Req(
        rank=row[0],
        id=row[1],
        tenant=row[2],
        owner=row[3],
        step=row[4],
        attempt=row[5],
        resources=tuple(json.loads(row[6])),
        state=row[7],
        token=row[8],
        ttl=row[9],
        proc=proc,
        acked=bool(row[14]),
        created=row[15],
        clock_boot=row[16],
        requested=row[17],
        granted_at=row[18],
        expires=row[19],
    )


@functools.lru_cache(maxsize=256)
def _resources_json(resources: tuple[str, ...]) -> str:
    return _dumps(resources)


def create_tables(db: sqlite3.Connection) -> None:
    """Create the lease table if missing, migrating the tables of earlier versions (inside the
    caller's transaction: DDL is transactional in SQLite)."""
    db.execute(_CREATE)
    old = {
        row[0]
        for row in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"
            " AND name IN ('lease_requests', 'lease_counters')"
        )
    }
    counters: dict[str, int] = {}
    if "lease_requests" in old:
        db.execute(f"INSERT OR IGNORE INTO {TABLE} ({_COLS}) SELECT {_COLS} FROM lease_requests")
        db.execute("DROP TABLE lease_requests")
    if "lease_counters" in old:
        counters = dict(db.execute("SELECT name, value FROM lease_counters").fetchall())
        db.execute("DROP TABLE lease_counters")
    db.execute(
        f"INSERT OR IGNORE INTO {TABLE} (rank, next_rank, next_token) VALUES (0, ?, ?)",
        (counters.get("rank", 1), counters.get("token", 1)),
    )
    if counters:
        # the counters never go back, not even below a request that a bug left behind
        db.execute(
            f"UPDATE {TABLE} SET next_rank = max(next_rank, ?, (SELECT max(rank) + 1 FROM"
            f" {TABLE})), next_token = max(next_token, ?, (SELECT coalesce(max(token), 0) + 1"
            f" FROM {TABLE})) WHERE rank = 0",
            (counters.get("rank", 1), counters.get("token", 1)),
        )
    # Rows of the format before carry no counters of their own (NULL): load_table then takes
    # row 0's, as that format did. Nothing to rewrite, only the marker to add.
    db.execute(f"INSERT OR IGNORE INTO {TABLE} (rank, state) VALUES (?, ?)", (FORMAT_ROW, FORMAT))


def load_table(db: sqlite3.Connection | sqlite3.Cursor) -> Table:
    """The lease rows and counters (inside the caller's transaction).

    The counters are the largest that any row carries: a request's row has them as of its
    last write, row 0 as of the last removal (see :func:`save_table`); and never less than
    one past the largest rank and token present.
    """
    t = Table()
    next_rank = next_token = 1
    for row in db.execute(_SELECT):
        rank = row[0]
        if rank < 0:
            continue  # the format marker
        if rank > 0:
            r = _req(row)
            t.reqs[rank] = r
            if rank >= next_rank:
                next_rank = rank + 1
            if r.token is not None and r.token >= next_token:
                next_token = r.token + 1
        if row[20] is not None and row[20] > next_rank:
            next_rank = row[20]
        if row[21] is not None and row[21] > next_token:
            next_token = row[21]
    t.next_rank, t.next_token = next_rank, next_token
    return t


# Columns that may hold None, by index in _INSERT's values: step, attempt, token, host, boot,
# pid, pstart, granted_at. sqlite3 binds None through its adapter lookup (a failed attribute
# lookup and an exception per None, more than the rest of the row costs), so an INSERT writes
# them as NULL literals.
_NULLABLE = (4, 5, 8, 10, 11, 12, 13, 18)
_INSERTS: dict[tuple[int, bool], tuple[str, Callable[[tuple[Any, ...]], tuple[Any, ...]]]] = {}
# data_version as a statement can read it: the one-statement transitions commit only if it is
# still what this connection last saw, i.e. nobody else committed since
_DV = "(SELECT data_version FROM pragma_data_version())"


def _insert_for(
    nulls: int, if_dv: bool
) -> tuple[str, Callable[[tuple[Any, ...]], tuple[Any, ...]]]:
    """The INSERT for rows whose None values are the set bits of ``nulls`` (``if_dv``: only
    while data_version is the last parameter), and what picks the other values out of the
    row."""
    got = _INSERTS.get((nulls, if_dv))
    if got is None:
        values = ", ".join("NULL" if nulls >> i & 1 else "?" for i in range(22))
        into = f"INSERT OR REPLACE INTO {TABLE} ({_COLS}, next_rank, next_token)"
        got = _INSERTS[nulls, if_dv] = (
            f"{into} SELECT {values} WHERE {_DV} = ?" if if_dv else f"{into} VALUES ({values})",
            # at least 14 values: it returns a tuple
            operator.itemgetter(*[i for i in range(22) if not nulls >> i & 1]),
        )
    return got


def _insert_args(r: Req, t: Table, dv: int | None) -> tuple[str, tuple[Any, ...]]:
    """The INSERT of ``r``'s row and its values (with ``dv``: written only while data_version
    is ``dv``, the last value)."""
    p = r.proc
    if (
        dv is not None
        and p is not None
        and r.step is None
        and r.attempt is None
        and r.token is not None
        and r.granted_at is not None
    ):
        # the row of every uncontended acquire, a grant without a key, held by a process
        return _INSERT_GRANT, (
            r.rank, r.id, r.tenant, r.owner, _resources_json(r.resources), r.state, r.token,
            r.ttl, p.host, p.boot, p.pid, p.start, int(r.acked), r.created, r.clock_boot,
            r.requested, r.granted_at, r.expires, t.next_rank, t.next_token, dv,
        )  # fmt: skip
    row = (
        r.rank, r.id, r.tenant, r.owner, r.step, r.attempt, _resources_json(r.resources), r.state,
        r.token, r.ttl, p.host if p else None, p.boot if p else None, p.pid if p else None,
        p.start if p else None, int(r.acked), r.created, r.clock_boot, r.requested,
        r.granted_at, r.expires, t.next_rank, t.next_token,
    )  # fmt: skip
    nulls = 0
    for i in _NULLABLE:
        if row[i] is None:
            nulls |= 1 << i
    if not nulls and dv is None:
        return _INSERT, row
    sql, pick = _insert_for(nulls, dv is not None)
    return sql, pick(row) if dv is None else (*pick(row), dv)


# step and attempt NULL (see _insert_args)
_INSERT_GRANT = _insert_for(1 << 4 | 1 << 5, True)[0]


def _insert(db: sqlite3.Connection | sqlite3.Cursor, r: Req, t: Table) -> None:
    db.execute(*_insert_args(r, t, None))


def save_table(db: sqlite3.Connection | sqlite3.Cursor, t: Table) -> None:
    """Write what changed since the table was loaded or last saved.

    Every row written carries the counters as they are now, and a removal turns one removed
    row into row 0 with them: so the largest counters that any row carries never go back,
    and a transition writes no row for the counters alone.
    """
    dirty, removed = t.dirty, t.removed
    if dirty:
        for k in dirty if len(dirty) == 1 else sorted(dirty):
            _insert(db, t.reqs[k], t)
    if removed:
        ranks = iter(removed) if len(removed) == 1 else iter(sorted(removed))
        cur = db.execute(_RETIRE, (t.next_rank, t.next_token, next(ranks)))
        if cur.rowcount != 1:  # never written: asked and withdrawn in this one transition
            db.execute(_COUNTERS, (t.next_rank, t.next_token))
        for k in ranks:
            db.execute(_DELETE, (k,))
    elif t.meta_dirty and not dirty:  # pragma: no cover - counters move with a written row
        db.execute(_COUNTERS, (t.next_rank, t.next_token))
    t.clean()


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
        return t.request_alone(*args[:6], now, boot, args[7]), None, False  # wakes nobody

    def _release_tx(self, t: Table, args: ReleaseArgs) -> Outcome:
        if t.release_only(*args, self.clock.now(), self.clock.boot_id(), self.probe):
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
                try:
                    out = fn(t, arg)
                except BaseException:
                    self._cached = None
                    raise
                dirty, removed = t.dirty, t.removed
                if self._one_statement and len(dirty) + len(removed) == 1:
                    if dirty:
                        sql, args = _insert_args(t.reqs[next(iter(dirty))], t, self._cached_dv)
                    else:
                        sql = _RETIRE_IF_DV
                        args = (t.next_rank, t.next_token, next(iter(removed)), self._cached_dv)
                    try:
                        done = cur.execute(sql, args).rowcount == 1
                    except sqlite3.OperationalError as exc:
                        self._cached = None
                        if _is_busy(exc):
                            return _BUSY
                        if "pragma_data_version" not in str(exc):
                            raise BackendError("sqlite", f"{type(exc).__name__}: {exc}") from exc
                        self._one_statement = False  # an SQLite without pragma functions
                        done = False
                    if done:
                        t.clean()
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
