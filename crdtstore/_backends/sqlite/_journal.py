"""The embedded journal backend behind ``sqlite:///path/store.db`` URLs.

Several processes on one machine share one store file. The design follows SQLite's strengths:

- WAL mode, so readers never block the writer and the writer never blocks readers;
- short ``BEGIN IMMEDIATE`` transactions (take the write lock up front, so two writers never
  deadlock upgrading a read lock), waiting up to :data:`BUSY_TIMEOUT` seconds for the lock;
- a connection per store object and process, never shared across ``fork`` (a store used in
  a forked child raises instead of corrupting the file);
- blocking driver calls run in worker threads, except the two hot paths of cross-process
  propagation, which are cheaper than a hop to a thread and run on the event loop on a
  connection of their own (busy timeout 0, see :mod:`._inline`): a tail's read of a few new
  rows (:data:`INLINE_ROWS`) and a ``batched`` append, which retries a busy lock in short
  steps (:data:`RETRY_FIRST` doubling to :data:`RETRY_MAX`) rather than SQLite's coarser
  busy handler, and never checkpoints on commit (a background thread does);
- ``secure_delete``, and a WAL checkpoint after deletes, so deleted runs leave no bytes behind.

Durable appends run with ``synchronous=FULL`` (the commit survives power loss); batched appends
with ``synchronous=NORMAL`` (survives the death of any process, which is what ``kill -9`` tests).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from ..._errors import BackendError, InvalidValue, UnknownRun
from ..._gc_pause import collector_paused
from ..._guarded_append import Guard
from ..._journal import (
    HistoryRow,
    JournalBackend,
    NewEntry,
    Row,
    RunRow,
    SnapshotRow,
)
from ._authority import AuthorityScope, SyncEstimate
from ._authority import _SQLiteAuthority as _SQLiteAuthority
from ._guarded import FenceCheck, guarded_tx
from ._inline import _LoopPath
from ._rows import _COLS, _READ, _READ_SKIPPING, HISTORY_COLS, _append_tx, _history_rows, _rows
from ._schema import _SCHEMA, _Conn, _dumps, _is_busy, _migrate
from ._schema import sqlite_path as sqlite_path

log = logging.getLogger("crdtstore.sqlite")

T = TypeVar("T")

INLINE_ROWS = 256  # reads of at most this many rows may run on the event loop thread (and see
# _inline.INLINE_BYTES)
RETRY_FIRST = 0.0002  # seconds before the first retry of a busy inline append (doubling)
RETRY_MAX = 0.002  # longest pause between two retries
BUSY_TIMEOUT = 30.0  # seconds a write waits for the write lock before BackendError


class SQLiteJournal(_LoopPath, JournalBackend):
    """A journal in one SQLite file, shared by the processes of one machine."""

    name = "sqlite"
    small_reads_inline = True  # reads of at most INLINE_ROWS rows run on the loop thread

    def __init__(self, url: str) -> None:
        self.path = sqlite_path(url)
        self._pid = os.getpid()
        self._w: _Conn | None = None
        self._r: _Conn | None = None
        self._l: _Conn | None = None  # the loop connection (see the module docstring)
        self._a: _Conn | None = None  # the authority connection (``_authority``)
        self._alock: anyio.Lock | None = None  # serialises this process's use of _a
        self.sync_estimate = SyncEstimate()  # how long a durable commit takes (_a's)
        self._inline_commits = 0  # commits on the loop connection since the last checkpoint
        self._checkpointer: threading.Thread | None = None
        self._run_ids: dict[tuple[str, str], int] = {}
        self._wlock: anyio.Lock | None = None  # serialises this process's use of _w
        self._lease_db: sqlite3.Connection | None = None  # see lease_connection()

    def notify_url(self) -> str:
        return os.path.realpath(self.path)

    # -- plumbing -----------------------------------------------------------------------------

    async def _call(
        self,
        conn: _Conn | None,
        fn: Callable[[sqlite3.Connection], T],
        *,
        in_authority: bool = False,
    ) -> T:
        if conn is None:
            raise BackendError("sqlite", "store is not open")
        if os.getpid() != self._pid:
            raise BackendError("sqlite", "store object used after fork; open the store again")

        def run() -> T:
            with conn.lock:
                try:
                    return fn(conn.db)
                except sqlite3.Error as exc:
                    if conn.db.in_transaction:
                        conn.db.execute("ROLLBACK")
                    raise BackendError("sqlite", f"{type(exc).__name__}: {exc}") from exc
                except BaseException:
                    # an error of the caller's function (a refused config update, ...) must
                    # not leave the connection inside a transaction
                    if conn.db.in_transaction and not in_authority:
                        conn.db.execute("ROLLBACK")
                    raise

        return await anyio.to_thread.run_sync(run)

    @staticmethod
    def _begin(conn: _Conn, db: sqlite3.Connection, durable: bool) -> None:
        want = "FULL" if durable else "NORMAL"
        if conn.synchronous != want:
            db.execute(f"PRAGMA synchronous={want}")
            conn.synchronous = want
        db.execute("BEGIN IMMEDIATE")

    async def _write(self, fn: Callable[[sqlite3.Connection], T], *, durable: bool = False) -> T:
        conn = self._w
        if conn is None or self._wlock is None:
            raise BackendError("sqlite", "store is not open")

        def tx(db: sqlite3.Connection) -> T:
            assert conn is not None
            self._begin(conn, db, durable)
            out = fn(db)
            db.execute("COMMIT")
            return out

        async with self._wlock:
            return await self._call(conn, tx)

    def authority(self, tenant: str, run: str, *, durable: bool) -> AuthorityScope:
        """The write transaction on the authority connection, on the loop thread but for a
        durable commit (``_authority``); this process's authorities take turns."""
        return AuthorityScope(self, tenant, run, durable, RETRY_FIRST, RETRY_MAX, BUSY_TIMEOUT)

    async def get_config(self, tenant: str, run: str) -> dict[str, Any]:
        rid = await self._run_id(tenant, run)
        row = await self._read(
            lambda db: db.execute("SELECT config FROM runs WHERE id = ?", (rid,)).fetchone()
        )
        if row is None:
            raise UnknownRun(tenant, run)
        return dict(json.loads(row[0]))

    async def update_config(
        self, tenant: str, run: str, update: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        rid = await self._run_id(tenant, run)

        def tx(db: sqlite3.Connection) -> dict[str, Any]:
            row = db.execute("SELECT config FROM runs WHERE id = ?", (rid,)).fetchone()
            if row is None:
                raise UnknownRun(tenant, run)
            new = update(json.loads(row[0]))
            db.execute("UPDATE runs SET config = ? WHERE id = ?", (_dumps(new), rid))
            return new

        return await self._write(tx, durable=True)

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self._call(self._r, fn)

    def lease_backend(self) -> Any:
        """The lease backend of this store (leases in the same file: a fenced write is checked
        in the transaction of its append)."""
        from ._leases import SQLiteLeases

        return SQLiteLeases(self)

    async def open(self) -> None:
        if self._w is not None:
            return

        def connect() -> tuple[_Conn, _Conn, _Conn, _Conn]:
            opened: list[_Conn] = []
            try:
                opened.append(_Conn(self.path))
                opened[0].db.executescript(_SCHEMA)
                _migrate(opened[0].db)
                opened.append(_Conn(self.path))
                opened.append(_Conn(self.path, loop=True))
                opened.append(_Conn(self.path, loop=True))  # the authority connection
                return opened[0], opened[1], opened[2], opened[3]
            except BaseException:
                for conn in opened:
                    conn.close()
                raise

        # Processes opening a new file together race to set WAL mode and create the schema:
        # a connection that holds a read lock and needs the write lock another one holds gets
        # SQLITE_BUSY at once (SQLite does not wait then: it could deadlock), so try again.
        deadline = time.monotonic() + BUSY_TIMEOUT
        delay = 0.005
        while True:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._w, self._r, self._l, self._a = await anyio.to_thread.run_sync(connect)
                break
            except sqlite3.Error as exc:
                if _is_busy(exc) and time.monotonic() < deadline:
                    log.debug("opening %s: %s; trying again", self.path, exc)
                    await anyio.sleep(delay)
                    delay = min(delay * 2, 0.25)
                    continue
                raise BackendError("sqlite", f"cannot open {self.path}: {exc}") from exc
            except OSError as exc:
                raise BackendError("sqlite", f"cannot open {self.path}: {exc}") from exc
        self._wlock = anyio.Lock()
        self._alock = anyio.Lock(fast_acquire=True)  # (no checkpoint when it is free)

    async def aclose(self) -> None:
        mine = os.getpid() == self._pid
        for conn in (self._w, self._r, self._l, self._a):
            if conn is not None and mine:
                conn.close()
        if self._lease_db is not None and mine:
            self._lease_db.close()
        self._w = self._r = self._l = self._a = self._lease_db = None
        checkpointer, self._checkpointer = self._checkpointer, None
        if checkpointer is not None and mine:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(checkpointer.join)

    def lease_connection(self) -> sqlite3.Connection:
        """The lease layer's own connection to the store file, opened on first use and closed
        with the store: busy timeout 0 (its caller retries without blocking its event loop),
        ``synchronous=NORMAL``, and its ``data_version`` tells it when anyone else wrote.

        Raises:
            BackendError: the store is not open, or this object was inherited through fork.
        """
        if self._w is None:
            raise BackendError("sqlite", "store is not open")
        if os.getpid() != self._pid:
            raise BackendError("sqlite", "store object used after fork; open the store again")
        if self._lease_db is None:
            try:
                db = sqlite3.connect(
                    self.path, isolation_level=None, check_same_thread=False, timeout=0
                )
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute("PRAGMA secure_delete=ON")
            except sqlite3.Error as exc:
                raise BackendError("sqlite", f"cannot open {self.path}: {exc}") from exc
            self._lease_db = db
        return self._lease_db

    # -- runs -----------------------------------------------------------------------------------

    _RUN_COLS = "tenant, run, created, head, snapshot_seq, parent, state, delete_after, id"

    @staticmethod
    def _run_row(row: Any) -> RunRow:
        return RunRow(*row[:8])

    async def ensure_run(
        self, tenant: str, run: str, *, create: bool, parent: str | None = None
    ) -> RunRow:
        got = await self.get_run(tenant, run)
        if got is not None:
            if parent is not None and got.parent != parent:
                raise InvalidValue(f"run {run!r} exists with parent {got.parent!r}, not {parent!r}")
            return got
        if not create:
            raise UnknownRun(tenant, run)
        if parent is not None and await self.get_run(tenant, parent) is None:
            raise UnknownRun(tenant, parent)
        now = time.time()
        await self._write(
            lambda db: db.execute(
                "INSERT OR IGNORE INTO runs (tenant, run, created, parent) VALUES (?, ?, ?, ?)",
                (tenant, run, now, parent),
            )
        )
        return await self.ensure_run(tenant, run, create=False, parent=parent)

    async def set_run(
        self,
        tenant: str,
        run: str,
        *,
        state: str | None = None,
        delete_after: float | Literal["keep"] | None = "keep",
    ) -> RunRow:
        rid = await self._run_id(tenant, run)

        def tx(db: sqlite3.Connection) -> None:
            if state is not None:
                db.execute("UPDATE runs SET state = ? WHERE id = ?", (state, rid))
            if delete_after != "keep":
                db.execute("UPDATE runs SET delete_after = ? WHERE id = ?", (delete_after, rid))

        await self._write(tx, durable=True)
        got = await self.get_run(tenant, run)
        if got is None:
            raise UnknownRun(tenant, run)
        return got

    async def get_run(self, tenant: str, run: str) -> RunRow | None:
        row = await self._read(
            lambda db: db.execute(
                f"SELECT {self._RUN_COLS} FROM runs WHERE tenant = ? AND run = ?",
                (tenant, run),
            ).fetchone()
        )
        if row is None:
            return None
        self._run_ids[(tenant, run)] = row[8]
        return self._run_row(row)

    async def tenants(self) -> list[str]:
        rows = await self._read(
            lambda db: db.execute("SELECT DISTINCT tenant FROM runs ORDER BY tenant").fetchall()
        )
        return [str(r[0]) for r in rows]

    async def list_runs(self, tenant: str) -> list[RunRow]:
        rows = await self._read(
            lambda db: db.execute(
                f"SELECT {self._RUN_COLS} FROM runs WHERE tenant = ? ORDER BY created, id",
                (tenant,),
            ).fetchall()
        )
        return [self._run_row(r) for r in rows]

    async def _run_id(self, tenant: str, run: str) -> int:
        rid = self._run_ids.get((tenant, run))
        if rid is None:
            if await self.get_run(tenant, run) is None:
                raise UnknownRun(tenant, run)
            rid = self._run_ids[(tenant, run)]
        return rid

    # -- journal --------------------------------------------------------------------------------

    async def append(
        self, tenant: str, run: str, entries: Sequence[NewEntry], *, durable: bool
    ) -> list[int]:
        if not entries:
            return []
        rid = await self._run_id(tenant, run)
        effects = [_dumps(e.effect) for e in entries]
        if durable:  # the commit syncs the log: milliseconds on a disk, in a worker thread

            def tx(db: sqlite3.Connection) -> list[int]:
                return _append_tx(db, tenant, run, rid, entries, effects)

            return await self._write(tx, durable=True)
        await anyio.lowlevel.checkpoint_if_cancelled()
        deadline = time.monotonic() + BUSY_TIMEOUT
        delay = RETRY_FIRST
        while True:
            seqs = self._append_inline(tenant, run, rid, entries, effects)
            if seqs is not None:
                return seqs
            if time.monotonic() >= deadline:
                raise BackendError(
                    "sqlite", f"database is locked (an append waited {BUSY_TIMEOUT:g} s)"
                )
            await anyio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)

    guard_in_append = False  # the authority is one transaction (see AtomicGuardedAppend)
    fence_check: FenceCheck | None = None  # set by the SQLite leases of this file

    def hosts_leases(self, leases: object) -> bool:
        """Whether fences of ``leases`` can be checked inside an append: leases in this file
        (see :class:`~crdtstore._guarded_append.AtomicGuardedAppend`)."""
        return self.fence_check is not None and getattr(leases, "journal", None) is self

    async def append_guarded_at(
        self,
        tenant: str,
        run: str,
        entries: Sequence[NewEntry],
        guard: Guard,
        *,
        durable: bool,
    ) -> list[int]:
        """Check ``guard`` and append in one write transaction (``_guarded.py``)."""
        rid = await self._run_id(tenant, run)
        effects = [_dumps(e.effect) for e in entries]

        def append(db: sqlite3.Connection) -> list[int]:
            return _append_tx(db, tenant, run, rid, entries, effects)

        tx = guarded_tx(tenant, run, rid, entries, guard, append, self.fence_check)
        return await self._write(tx, durable=durable)

    async def read(
        self, tenant: str, run: str, after: int, limit: int = 10_000, *, skip_client: int = -1
    ) -> list[Row]:
        rid = await self._run_id(tenant, run)
        sql: str
        params: tuple[Any, ...]
        if skip_client == -1:  # (no client id is -1: every entry whole, a load's read)
            sql, params = _READ, (rid, after, limit)
        else:
            sql, params = _READ_SKIPPING, (skip_client, skip_client, rid, after, limit)
        if limit <= INLINE_ROWS:  # (rows built with the collector paused: see _gc_pause)
            await anyio.lowlevel.checkpoint_if_cancelled()
            with collector_paused():
                raw = self._read_inline(sql, params)
                if raw is not None:
                    return _rows(raw)

        def read(db: sqlite3.Connection) -> list[Row]:
            with collector_paused():
                return _rows(db.execute(sql, params).fetchall())

        return await self._read(read)

    async def head(self, tenant: str, run: str) -> int:
        rid = await self._run_id(tenant, run)
        row = await self._read(
            lambda db: db.execute("SELECT head FROM runs WHERE id = ?", (rid,)).fetchone()
        )
        if row is None:
            raise UnknownRun(tenant, run)
        return int(row[0])

    async def load_snapshot(self, tenant: str, run: str) -> SnapshotRow | None:
        rid = await self._run_id(tenant, run)
        row = await self._read(
            lambda db: db.execute(
                "SELECT seq, upd, state, created FROM snapshots WHERE run_id = ?", (rid,)
            ).fetchone()
        )
        if row is None:
            return None
        return SnapshotRow(row[0], row[1], json.loads(row[2]), row[3])

    async def save_snapshot(
        self, tenant: str, run: str, snapshot: SnapshotRow, *, drop_journal: bool
    ) -> None:
        rid = await self._run_id(tenant, run)
        state = _dumps(snapshot.state)

        def tx(db: sqlite3.Connection) -> None:
            current = db.execute("SELECT seq FROM snapshots WHERE run_id = ?", (rid,)).fetchone()
            kept = snapshot.seq
            if current is not None and current[0] >= snapshot.seq:
                kept = current[0]  # a newer snapshot landed meanwhile; keep it
            else:
                db.execute(
                    "INSERT OR REPLACE INTO snapshots (run_id, seq, upd, state, created)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (rid, snapshot.seq, snapshot.update, state, snapshot.created),
                )
                db.execute("UPDATE runs SET snapshot_seq = ? WHERE id = ?", (snapshot.seq, rid))
            if drop_journal:
                db.execute("DELETE FROM journal WHERE run_id = ? AND seq <= ?", (rid, kept))
                db.execute("DELETE FROM journal_keys WHERE run_id = ? AND seq <= ?", (rid, kept))

        await self._write(tx, durable=True)

    async def history(self, tenant: str, run: str, collection: str, key: str) -> list[Row]:
        rid = await self._run_id(tenant, run)
        raw = await self._read(
            lambda db: db.execute(
                f"SELECT {_COLS} FROM journal WHERE run_id = ? AND seq IN"
                " (SELECT seq FROM journal_keys WHERE run_id = ? AND collection = ? AND key = ?)"
                " ORDER BY seq",
                (rid, rid, collection, key),
            ).fetchall()
        )
        return _rows(raw)

    async def history_rows(
        self, tenant: str, run: str, collection: str, key: str
    ) -> list[HistoryRow]:
        rid = await self._run_id(tenant, run)

        # from the key index to the entries (not "seq IN (subquery)": that builds a
        # temporary index of the subquery's rows first), without the update bytes
        def read(db: sqlite3.Connection) -> list[HistoryRow]:
            with collector_paused():  # thousands of rows, no cycle among them
                return _history_rows(
                    db.execute(
                        f"SELECT {HISTORY_COLS} FROM journal_keys k JOIN journal j"
                        " ON j.run_id = k.run_id AND j.seq = k.seq"
                        " WHERE k.run_id = ? AND k.collection = ? AND k.key = ? ORDER BY k.seq",
                        (rid, collection, key),
                    ).fetchall()
                )

        return await self._read(read)

    async def delete_run_if_due(self, tenant: str, run: str, now: float) -> bool:
        return await self._delete_run(tenant, run, now)

    async def rewrite_entries(self, tenant: str, run: str, rows: Sequence[Row]) -> None:
        rid = await self._run_id(tenant, run)
        params = [(r.update, _dumps(r.effect), r.checksum, rid, r.seq) for r in rows]

        def tx(db: sqlite3.Connection) -> None:
            db.executemany(
                "UPDATE journal SET upd = ?, effect = ?, crc = ? WHERE run_id = ? AND seq = ?",
                params,
            )

        await self._write(tx, durable=True)
        await self.checkpoint()  # the old pages were zeroed (secure_delete); empty the WAL

    async def delete_run(self, tenant: str, run: str) -> bool:
        return await self._delete_run(tenant, run, None)

    async def _delete_run(self, tenant: str, run: str, due_at: float | None) -> bool:
        """Delete the run's tree; with ``due_at``, only if its deadline is ``<= due_at``, read
        inside the same write transaction (``BEGIN IMMEDIATE``), so no ``set_retention`` or
        append of another process can land between the check and the delete."""

        def tx(db: sqlite3.Connection) -> bool:
            got = db.execute(
                "SELECT delete_after FROM runs WHERE tenant = ? AND run = ?", (tenant, run)
            ).fetchone()
            if got is None or (due_at is not None and (got[0] is None or got[0] > due_at)):
                return False
            # the run and every run nested in it, however deep
            ids = [
                r[0]
                for r in db.execute(
                    "WITH RECURSIVE tree(id, run) AS ("
                    " SELECT id, run FROM runs WHERE tenant = ? AND run = ?"
                    " UNION SELECT runs.id, runs.run FROM runs JOIN tree"
                    " ON runs.tenant = ? AND runs.parent = tree.run)"
                    " SELECT id FROM tree",
                    (tenant, run, tenant),
                )
            ]
            for rid in ids:
                for table in ("journal", "journal_keys", "snapshots"):
                    db.execute(f"DELETE FROM {table} WHERE run_id = ?", (rid,))
                db.execute("DELETE FROM runs WHERE id = ?", (rid,))
            self._run_ids.clear()
            return True

        if not await self._write(tx, durable=True):
            return False
        # Deleted pages were zeroed (secure_delete); the WAL may still hold the old pages
        # until a checkpoint copies the zeroed ones over them and truncates the log.
        await self.checkpoint()
        return True

    async def checkpoint(self) -> None:
        """Copy the WAL into the database file and truncate it."""
        await self._call(
            self._w, lambda db: db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        )

    async def vacuum(self) -> None:
        """Rebuild the database file without free pages (after deleting runs)."""
        await self._call(self._w, lambda db: db.execute("VACUUM"))
        await self.checkpoint()

    async def integrity_check(self) -> str:
        """``PRAGMA integrity_check`` of the store file ("ok" when healthy)."""
        row = await self._read(lambda db: db.execute("PRAGMA integrity_check").fetchone())
        return str(row[0])
