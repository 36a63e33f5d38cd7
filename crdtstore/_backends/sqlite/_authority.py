"""The SQLite journal's :class:`~crdtstore._journal.Authority`: reads and appends inside the
one write transaction that ``SQLiteJournal.authority`` holds open on the write connection (a
guarded write reads the journal and appends without anyone else writing in between). The
run's head is read with the ``BEGIN``: a read past it is answered without a worker-thread hop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..._journal import Authority, NewEntry, Row
from ._rows import _COLS, _append_tx, _rows
from ._schema import _Conn, _dumps

if TYPE_CHECKING:
    from ._journal import SQLiteJournal


T = TypeVar("T")


class _SQLiteAuthority(Authority):
    def __init__(
        self,
        journal: SQLiteJournal,
        conn: _Conn,
        tenant: str,
        run: str,
        rid: int,
        head: int | None = None,
    ) -> None:
        self._j = journal
        self._conn = conn
        self._tenant = tenant
        self._run = run
        self._rid = rid
        self.committed = False  # append_last committed: leaving the context only ends it
        self._head = head  # the run's head while nothing was appended here (None: unknown)

    async def read(self, after: int) -> list[Row]:
        if self._head is not None and after >= self._head:
            return []  # nothing past the head, which no one else can move now
        rid = self._rid
        raw = await self._j._call(
            self._conn,
            lambda db: db.execute(
                f"SELECT {_COLS} FROM journal WHERE run_id = ? AND seq > ? ORDER BY seq",
                (rid, after),
            ).fetchall(),
            in_authority=True,
        )
        return _rows(raw)

    async def append(self, entries: Sequence[NewEntry]) -> list[int]:
        if not entries:
            return []
        effects = [_dumps(e.effect) for e in entries]
        self._head = None
        return await self._j._call(
            self._conn,
            lambda db: _append_tx(db, self._tenant, self._run, self._rid, entries, effects),
            in_authority=True,
        )

    async def append_last(self, entries: Sequence[NewEntry]) -> list[int]:
        if not entries:
            return []
        effects = [_dumps(e.effect) for e in entries]
        self._head = None

        def tx(db: Any) -> list[int]:
            seqs = _append_tx(db, self._tenant, self._run, self._rid, entries, effects)
            db.execute("COMMIT")
            self.committed = True
            return seqs

        return await self._j._call(self._conn, tx, in_authority=True)

    async def run_sync(self, fn: Callable[[Any], T]) -> T:
        self._head = None  # (fn may write)
        return await self._j._call(self._conn, fn, in_authority=True)
