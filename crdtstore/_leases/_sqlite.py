"""The SQLite lease backend: lease tables in the store file, next to the journal.

Living in the same file is the point: a write to the record that carries a lease runs
:func:`check_fence` inside the same ``BEGIN IMMEDIATE`` transaction as the journal append, so
no grant can change between the check and the write.

Each transition loads the lease rows (a handful: holders and waiters, never history), applies
the :mod:`._engine` transition and writes back only what changed, all in one transaction on
the journal's writer connection. The tables are created on first use.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.lowlevel

from .._backends.sqlite import SQLiteJournal
from .._errors import BackendError, LeaseLost
from ._backend import TableBackend
from ._clock import Clock, Proc, ProcessProbe, SystemClock
from ._engine import Req, Table, fence_error

T = TypeVar("T")
_BUSY = object()
_BUSY_TIMEOUT_MS = 30_000  # the journal's connections use timeout=30.0

_TABLES = (
    """CREATE TABLE IF NOT EXISTS lease_requests (
        rank INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        owner TEXT NOT NULL,
        step TEXT,
        attempt INTEGER,
        resources TEXT NOT NULL,
        state TEXT NOT NULL,
        token INTEGER,
        ttl REAL NOT NULL,
        host TEXT,
        boot TEXT,
        pid INTEGER,
        pstart INTEGER,
        acked INTEGER NOT NULL,
        created REAL NOT NULL,
        clock_boot TEXT NOT NULL,
        requested REAL NOT NULL,
        granted_at REAL,
        expires REAL NOT NULL
    )""",
    "CREATE UNIQUE INDEX IF NOT EXISTS lease_requests_key"
    " ON lease_requests (tenant, owner, step, attempt)",
    "CREATE TABLE IF NOT EXISTS lease_counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
)
_COLS = (
    "rank, id, tenant, owner, step, attempt, resources, state, token, ttl, host, boot, pid,"
    " pstart, acked, created, clock_boot, requested, granted_at, expires"
)
_INSERT = f"INSERT OR REPLACE INTO lease_requests ({_COLS}) VALUES ({', '.join('?' * 20)})"


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


def _row(r: Req) -> tuple[Any, ...]:
    p = r.proc
    return (
        r.rank, r.id, r.tenant, r.owner, r.step, r.attempt,
        json.dumps(r.resources, separators=(",", ":")), r.state, r.token, r.ttl,
        p.host if p else None, p.boot if p else None, p.pid if p else None,
        p.start if p else None, int(r.acked), r.created, r.clock_boot, r.requested,
        r.granted_at, r.expires,
    )  # fmt: skip


def create_tables(db: sqlite3.Connection) -> None:
    """Create the lease tables if missing (inside the caller's transaction: DDL is
    transactional in SQLite)."""
    for stmt in _TABLES:
        db.execute(stmt)


def load_table(db: sqlite3.Connection) -> Table:
    t = Table()
    for row in db.execute(f"SELECT {_COLS} FROM lease_requests"):
        r = _req(row)
        t.reqs[r.rank] = r
    counters = dict(db.execute("SELECT name, value FROM lease_counters").fetchall())
    t.next_rank = counters.get("rank", 1)
    t.next_token = counters.get("token", 1)
    return t


def save_table(db: sqlite3.Connection, t: Table) -> None:
    if t.removed:
        db.executemany("DELETE FROM lease_requests WHERE rank = ?", [(k,) for k in t.removed])
    if t.dirty:
        db.executemany(_INSERT, [_row(t.reqs[k]) for k in sorted(t.dirty)])
    if t.meta_dirty:
        db.executemany(
            "INSERT OR REPLACE INTO lease_counters (name, value) VALUES (?, ?)",
            [("rank", t.next_rank), ("token", t.next_token)],
        )
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
        row = db.execute(f"SELECT {_COLS} FROM lease_requests WHERE id = ?", (lease_id,)).fetchone()
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


class SQLiteLeases(TableBackend):
    """Leases in the SQLite store file of ``journal``, on its connections."""

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
        self._ready = False

    async def open(self) -> None:
        await self.journal.open()
        await self._ensure()

    async def aclose(self) -> None:
        self._ready = False

    async def _ensure(self) -> None:
        if not self._ready:
            await self.journal._write(create_tables)
            self._ready = True

    async def _transact(self, fn: Callable[[Table], T]) -> T:
        await self._ensure()

        def tx(db: sqlite3.Connection) -> T:
            t = load_table(db)
            out = fn(t)
            save_table(db, t)
            return out

        await anyio.lowlevel.checkpoint()  # cancellation lands before the commit, never after
        fast = self._try_inline(tx)
        if fast is not _BUSY:
            return fast  # type: ignore[return-value]
        return await self.journal._write(tx)

    def _try_inline(self, tx: Callable[[sqlite3.Connection], T]) -> T | object:
        """Run ``tx`` on the event loop thread when the write lock is free right now.

        A lease transition is a few rows and a commit without fsync (WAL, synchronous=NORMAL):
        tens of microseconds, less than the hop to a worker thread. Only when the connection
        is idle here and SQLite grants the write lock without waiting (busy timeout 0) does it
        run inline; otherwise ``_BUSY`` sends it the usual way, to wait in a worker thread.
        """
        j = self.journal
        conn = j._w
        if conn is None or os.getpid() != j._pid or conn.synchronous != "NORMAL":
            return _BUSY
        if not conn.lock.acquire(blocking=False):
            return _BUSY
        db = conn.db
        try:
            db.execute("PRAGMA busy_timeout = 0")
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                return _BUSY  # another process holds the write lock
            finally:
                db.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            try:
                out = tx(db)
                db.execute("COMMIT")
                return out
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise BackendError("sqlite", f"{type(exc).__name__}: {exc}") from exc
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        finally:
            conn.lock.release()

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
