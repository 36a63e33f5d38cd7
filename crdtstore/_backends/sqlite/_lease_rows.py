"""The rows of the SQLite lease table: its layout, reading it into a :class:`Table` and
writing back what a transition changed (prebuilt statements for the common rows), for
:mod:`._leases`."""

from __future__ import annotations

import functools
import json
import operator
import sqlite3
from collections.abc import Callable
from typing import Any

from ..._leases._clock import Proc
from ..._leases._engine import Req, Table

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

# The two statements of an uncontended acquire+release, each its own transaction, check the
# rows they rely on rather than data_version (whose pragma function prepares a statement of
# its own on every run, more than the rest costs). Ranks are never reused, a removal always
# writes row 0 with the counters of its time (save_table, both formats), and only MOVE_GRANT
# takes row 0 away. So with an empty table cached at counters (R, T): row 0 still (R, T), and
# no row R (else the UPDATE fails as not unique), means no request came since, and the grant
# of R moves row 0 there. With {R} cached: row R still there, no rank above it and no row 0
# (else not unique) means the same, and the release moves R back to row 0.
MOVE_GRANT = (
    f"UPDATE {TABLE} SET rank = ?1, id = ?2, tenant = ?7, owner = ?8, step = NULL,"
    " attempt = NULL, resources = ?9, state = 'granted', token = ?3, ttl = ?4, host = ?10,"
    " boot = ?11, pid = ?12, pstart = ?13, acked = 1, created = ?5, clock_boot = ?14,"
    " requested = ?6, granted_at = ?6, expires = ?6 + ?4, next_rank = ?1 + 1,"
    " next_token = ?3 + 1 WHERE rank = 0 AND next_rank = ?1 AND next_token = ?3"
)
MOVE_RETIRE = (
    f"UPDATE {TABLE} SET rank = 0, "
    + ", ".join(f"{c.strip()} = NULL" for c in _COLS.split(",")[1:])
    + f", next_rank = ?1, next_token = ?2 WHERE rank = ?3 AND (SELECT max(rank) FROM {TABLE}) = ?3"
)


def move_grant_args(r: Req) -> tuple[Any, ...] | None:
    """MOVE_GRANT's values for ``r``, the grant without a key that :meth:`Table.request_alone`
    made on an empty table; None for any other row."""
    p = r.proc
    if (
        p is None
        or r.step is not None
        or r.attempt is not None
        or r.granted_at != r.requested
        or r.expires != r.requested + r.ttl  # MOVE_GRANT adds them up the same way
    ):
        return None
    return (
        r.rank, r.id, r.token, r.ttl, r.created, r.requested, r.tenant, r.owner,
        _resources_json(r.resources), p.host, p.boot, p.pid, p.start, r.clock_boot,
    )  # fmt: skip


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
