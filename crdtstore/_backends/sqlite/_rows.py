"""The rows of the journal table: append a batch of entries in an open write transaction
(head, journal rows, the ``journal_keys`` index of map keys) and turn selected rows back into
:class:`~crdtstore._journal.Row`. The journal, its loop-connection path and its authority all
write and read through these.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Sequence
from typing import Any

from ..._errors import RunClosed, UnknownRun
from ..._journal import NewEntry, Row
from ._schema import _effect

_COLS = "seq, agent, source, client_id, wall_time, upd, effect, crc, origin, call"


def _rows(raw: list[Any]) -> list[Row]:
    # agent, source and run names repeat on every row: share one string each (the
    # provenance index keeps them for every key; it does not keep call ids). Built with
    # tuple.__new__: a NamedTuple's own __new__ is a Python function (a resume builds a row
    # per journal entry).
    intern, parse, new = sys.intern, _effect, tuple.__new__
    return [
        new(
            Row,
            (
                r[0],
                intern(r[1]),
                intern(r[2]),
                r[3],
                r[4],
                r[5],
                parse(r[6]),
                r[7],
                intern(r[8]),
                r[9],
            ),
        )
        for r in raw
    ]


def _append_tx(
    db: sqlite3.Connection,
    tenant: str,
    run: str,
    rid: int,
    entries: Sequence[NewEntry],
    effects: list[str],
) -> list[int]:
    n = len(entries)
    row = db.execute(
        "UPDATE runs SET head = head + ? WHERE id = ? AND state = 'open' RETURNING head", (n, rid)
    ).fetchone()
    if row is None:
        state = db.execute("SELECT state FROM runs WHERE id = ?", (rid,)).fetchone()
        if state is None:
            raise UnknownRun(tenant, run)
        raise RunClosed(tenant, run, state[0])
    first = row[0] - n + 1
    db.executemany(
        "INSERT INTO journal (run_id, seq, agent, source, client_id, wall_time, upd,"
        " effect, crc, origin, call) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                rid,
                first + i,
                e.agent,
                e.source,
                e.client_id,
                e.wall_time,
                e.update,
                effects[i],
                e.checksum,
                e.origin,
                e.call,
            )
            for i, e in enumerate(entries)
        ],
    )
    keys = [
        (rid, op[1], op[3], first + i)
        for i, e in enumerate(entries)
        for op in e.effect
        if op[0] == "map"
    ]
    if keys:
        db.executemany(
            "INSERT OR IGNORE INTO journal_keys (run_id, collection, key, seq) VALUES (?, ?, ?, ?)",
            keys,
        )
    return list(range(first, first + n))
