"""Guarded and fenced appends on SQLite (:class:`~crdtstore._guarded_append.AtomicGuardedAppend`):
the guard checked inside the ``BEGIN IMMEDIATE`` transaction that appends, so no other
writer and no lease transition (the leases live in the same file) can come in between."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence

from ..._errors import LeaseLost, UnknownRun
from ..._guarded_append import Guard, GuardMoved, touches
from ..._journal import NewEntry

FenceCheck = Callable[..., None]
"""``check_fence(db, lease_id, resource, token, *, tenant, clock)`` of the SQLite leases,
given to the journal by the lease backend that lives in its file (``SQLiteLeases``): the
journal module does not import the leases (they import it)."""


def check_guard(
    db: sqlite3.Connection,
    tenant: str,
    run: str,
    rid: int,
    guard: Guard,
    check_fence: FenceCheck | None,
) -> None:
    """Raise :class:`GuardMoved` when an entry after ``guard.seen`` touches a guarded key or
    scope (or was compacted away), ``LeaseLost`` when the fence does not hold; inside the
    caller's write transaction."""
    row = db.execute("SELECT head FROM runs WHERE id = ?", (rid,)).fetchone()
    if row is None:
        raise UnknownRun(tenant, run)
    head = int(row[0])
    if head > guard.seen:
        if "*" in guard.scopes:
            raise GuardMoved(head)
        effects = db.execute(
            "SELECT effect FROM journal WHERE run_id = ? AND seq > ?", (rid, guard.seen)
        ).fetchall()
        if len(effects) != head - guard.seen:
            raise GuardMoved(head)  # compacted away: the writer reads the snapshot
        for (text,) in effects:
            if touches(json.loads(text) if text else [], guard):
                raise GuardMoved(head)
    if guard.fence is not None:
        f = guard.fence
        if check_fence is None:
            raise LeaseLost(f.resource, "no lease backend in this store file", f.token)
        check_fence(db, f.lease_id, f.resource, f.token, tenant=tenant, clock=f.clock)


def guarded_tx(
    tenant: str,
    run: str,
    rid: int,
    entries: Sequence[NewEntry],
    guard: Guard,
    append: Callable[[sqlite3.Connection], list[int]],
    check_fence: FenceCheck | None,
) -> Callable[[sqlite3.Connection], list[int]]:
    """The transaction body of a guarded append: the check, then ``append``."""

    def tx(db: sqlite3.Connection) -> list[int]:
        check_guard(db, tenant, run, rid, guard, check_fence)
        return append(db) if entries else []

    return tx
