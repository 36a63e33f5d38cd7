"""The SQLite journal's loop-connection path: a ``batched`` append or a small read done at once
on the event loop thread, on a connection of its own (busy timeout 0), instead of a hop to a
worker thread (see the ``sqlite.py`` docstring), and the background checkpoint that keeps
that connection's log short. A mixin of :class:`~crdtstore._backends.sqlite.SQLiteJournal`.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..._errors import BackendError
from ..._journal import NewEntry
from ._rows import _append_tx
from ._schema import _Conn, _dumps, _is_busy

log = logging.getLogger("crdtstore.sqlite")

T = TypeVar("T")

INLINE_BYTES = 1 << 20  # a read on the loop finding more bytes of update and effect: a thread
CHECKPOINT_EVERY = 256  # inline commits between two background checkpoints
WAL_RESTART_FRAMES = 4000  # a log longer than this is emptied by the background checkpoint
# Rows read on the loop connection after which a read that reaches the end of what it asked
# for (a load or a replay caught up) gives SQLite's page cache of that connection back
# (``PRAGMA shrink_memory``): a load fills it (up to 2 MiB) with journal pages that are not
# read again, and it stays with the process (bench/memory.py's resumed record: 1.6 MiB).
SHRINK_AFTER_ROWS = 4096
# Rows appended on the loop connection after which its page cache is given back likewise: an
# append reads the pages it changes (the journal's last ones, some of its key index) and
# leaves them cached, a cache that appends alone keep full (bench/memory.py's written record:
# 1.9 MiB) though they hardly read a page twice.
SHRINK_AFTER_APPENDS = 4096


def _checkpoint_file(path: Path) -> None:
    """Checkpoint the store file on a connection of its own (a background thread: a checkpoint
    syncs the files, which may take milliseconds).

    A passive checkpoint never waits for a lock, but while writers keep committing it may never
    catch up with the end of the log, and the log only starts over from its beginning once a
    checkpoint did. So when the log holds more than :data:`WAL_RESTART_FRAMES` frames, a
    ``TRUNCATE`` checkpoint follows: it holds the write lock while it copies the rest (writers
    wait, they never block an event loop) and empties the log.
    """
    try:
        db = sqlite3.connect(path, isolation_level=None, timeout=0)
        try:
            _, frames, _ = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if frames > WAL_RESTART_FRAMES:
                db.execute("PRAGMA busy_timeout=1000")  # else skipped: the next one retries
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            db.close()
    except sqlite3.Error as exc:  # busy or gone: the next one catches up
        log.debug("background checkpoint of %s skipped: %s", path, exc)


def _shrink(db: sqlite3.Connection) -> None:
    """Give the page cache of ``db`` back (``PRAGMA shrink_memory``; a failure only logged:
    what was committed stays committed)."""
    try:
        db.execute("PRAGMA shrink_memory")
    except sqlite3.Error as exc:
        log.debug("shrink_memory skipped: %s", exc)


class _LoopPath:
    """The loop-connection methods of :class:`~crdtstore._backends.sqlite.SQLiteJournal`
    (which sets these attributes)."""

    path: Path
    _pid: int
    _l: _Conn | None
    _inline_commits: int
    _checkpointer: threading.Thread | None
    _run_ids: dict[tuple[str, str], int]
    _read_since_shrink = 0  # rows read on the loop connection since its cache was shrunk
    _appended_since_shrink = 0  # rows appended on it since then

    def append_now(self, tenant: str, run: str, entries: Sequence[NewEntry]) -> list[int] | None:
        """A ``batched`` :meth:`append` (``synchronous=NORMAL``: survives the death of any
        process) done now on the calling (event loop) thread in one transaction, without
        waiting: None, with nothing written, when it cannot be done at once (the write lock
        or the loop connection is taken, or the run's id is not known yet); then use
        :meth:`append`. For callers that journal on the loop without a task hop (the hub).

        Raises:
            BackendError: the store is not open, used after ``fork``, or the write failed
                (rolled back: nothing written).
            RunClosed, UnknownRun: the run is not open (nothing written).
        """
        if not entries:
            return []
        rid = self._run_ids.get((tenant, run))
        if rid is None:
            return None
        return self._append_inline(tenant, run, rid, entries, [_dumps(e.effect) for e in entries])

    def _append_inline(
        self, tenant: str, run: str, rid: int, entries: Sequence[NewEntry], effects: list[str]
    ) -> list[int] | None:
        """Append in one transaction on the loop connection now, or return None at once when
        the write lock (or the connection) is taken."""
        conn = self._loop_conn()
        if not conn.lock.acquire(blocking=False):
            return None
        db = conn.db
        try:
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                if _is_busy(exc):
                    return None
                raise BackendError("sqlite", f"{type(exc).__name__}: {exc}") from exc
            try:
                seqs = _append_tx(db, tenant, run, rid, entries, effects)
                db.execute("COMMIT")
            except BaseException as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise BackendError("sqlite", f"{type(exc).__name__}: {exc}") from exc
                raise
            self._appended_since_shrink += len(entries)
            if self._appended_since_shrink >= SHRINK_AFTER_APPENDS:
                self._appended_since_shrink = 0
                _shrink(db)
        finally:
            conn.lock.release()
        self._loop_committed()
        return seqs

    def _loop_committed(self) -> None:
        """Count a commit of a connection that never checkpoints (the loop connection's, the
        authority connection's); every :data:`CHECKPOINT_EVERY` of them, start a background
        checkpoint."""
        self._inline_commits += 1
        if self._inline_commits >= CHECKPOINT_EVERY and (
            self._checkpointer is None or not self._checkpointer.is_alive()
        ):
            self._inline_commits = 0
            self._checkpointer = threading.Thread(
                target=_checkpoint_file, args=(self.path,), name="crdtstore-checkpoint"
            )
            self._checkpointer.start()

    def _loop_conn(self) -> _Conn:
        if self._l is None:
            raise BackendError("sqlite", "store is not open")
        if os.getpid() != self._pid:
            raise BackendError("sqlite", "store object used after fork; open the store again")
        return self._l

    def _on_loop_now(self, fn: Callable[[sqlite3.Connection], T]) -> T | None:
        """``fn(db)`` on the loop connection if it is free at once; None when it is taken,
        busy or closed (or the call fails): for the store's poll, which never waits."""
        conn = self._l
        if conn is None or os.getpid() != self._pid or not conn.lock.acquire(blocking=False):
            return None
        try:
            return fn(conn.db)
        except sqlite3.Error:
            return None
        finally:
            conn.lock.release()

    def changes(self) -> int | None:
        """SQLite's ``PRAGMA data_version`` of the loop connection: it moves when another
        connection (of this process or another) commits, not for the loop connection's own
        commits, which wake their readers themselves. About 3 us and two ``fcntl`` calls, no
        read of the journal. None when the loop connection is not free at once."""
        return self._on_loop_now(lambda db: int(db.execute("PRAGMA data_version").fetchone()[0]))

    def heads(self, tenant: str, runs: Sequence[str]) -> dict[str, int] | None:
        """``runs.head`` of the given runs, on the loop connection (the ``(tenant, run)``
        index; 500 runs a query). None when the loop connection is not free at once."""

        def query(db: sqlite3.Connection) -> dict[str, int]:
            out: dict[str, int] = {}
            for i in range(0, len(runs), 500):
                chunk = list(runs[i : i + 500])
                marks = ", ".join("?" * len(chunk))
                sql = f"SELECT run, head FROM runs WHERE tenant = ? AND run IN ({marks})"
                for run, head in db.execute(sql, (tenant, *chunk)):
                    out[run] = int(head)
            return out

        return self._on_loop_now(query)

    def _read_inline(self, sql: str, params: tuple[Any, ...]) -> list[Any] | None:
        """Rows of a small read on the loop connection, or None when it is taken, busy, or
        the rows turn out bigger than :data:`INLINE_BYTES` (then read in a worker thread).
        ``params`` ends with the read's ``LIMIT`` (fewer rows: the read reached the end, see
        :data:`SHRINK_AFTER_ROWS`)."""
        conn = self._loop_conn()
        if not conn.lock.acquire(blocking=False):
            return None
        try:
            out: list[Any] = []
            size = 0
            cur = conn.db.execute(sql, params)
            try:
                for row in cur:
                    out.append(row)
                    size += len(row[5]) + len(row[6])
                    if size > INLINE_BYTES:
                        return None
            finally:
                cur.close()
            self._read_since_shrink += len(out)
            if self._read_since_shrink > SHRINK_AFTER_ROWS and len(out) < params[-1]:
                self._read_since_shrink = 0
                _shrink(conn.db)
            return out
        except sqlite3.Error as exc:
            if _is_busy(exc):
                return None
            raise BackendError("sqlite", f"{type(exc).__name__}: {exc}") from exc
        finally:
            conn.lock.release()
