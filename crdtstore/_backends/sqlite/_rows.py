"""The rows of the journal table: append a batch of entries in an open write transaction
(head, journal rows, the ``journal_keys`` index of map keys) and turn selected rows back into
:class:`~crdtstore._journal.Row`. The journal, its loop-connection path and its authority all
write and read through these.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Sequence
from typing import Any

from ..._errors import RunClosed, UnknownRun
from ..._journal import HistoryRow, NewEntry, Row
from ._schema import _effect

_parse = json.JSONDecoder().decode

_COLS = "seq, agent, source, client_id, wall_time, upd, effect, crc, origin, call"

# a read of a run's entries after a position (see SQLiteJournal.read); the skipped client's
# own entries come back light: no update bytes, no effect to parse
_READ = (
    "SELECT seq, agent, source, client_id, wall_time, upd, effect, crc, origin, call"
    " FROM journal WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?"
)
_READ_SKIPPING = (
    "SELECT seq, agent, source, client_id, wall_time,"
    " CASE WHEN client_id = ? THEN X'' ELSE upd END,"
    " CASE WHEN client_id = ? THEN '[]' ELSE effect END, crc, origin, call"
    " FROM journal WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?"
)


def _rows(raw: list[Any]) -> list[Row]:
    # agent, source and run names repeat on every row: share one string each (the
    # provenance index keeps them for every key; it does not keep call ids). Built with
    # tuple.__new__: a NamedTuple's own __new__ is a Python function (a resume builds a row
    # per journal entry).
    if not raw:
        return []
    intern, new = sys.intern, tuple.__new__
    effects = _effects([r[6] for r in raw])
    return [
        new(
            Row,
            (r[0], intern(r[1]), intern(r[2]), r[3], r[4], r[5], e, r[7], intern(r[8]), r[9]),
        )
        for r, e in zip(raw, effects, strict=True)
    ]


def _effects(texts: list[str]) -> list[Any]:
    """Stored effects, parsed in one decoder call: joined into one JSON array (a resume parses
    one effect per journal entry; one call per effect costs about twice as much). If that is
    not one value per effect (a malformed one), each is parsed alone, which raises as a read
    of it always did."""
    if len(texts) > 1:
        try:
            out: list[Any] = _parse("[" + ",".join(texts) + "]")
        except ValueError:
            out = []
        if len(out) == len(texts):
            return out
    return [_effect(t) for t in texts]


_MAX_SAFE_INT = 2**53
# what history reads of an entry, in HistoryRow's order (the effect last)
HISTORY_COLS = "j.seq, j.agent, j.source, j.wall_time, j.origin, j.call, j.effect"


def _number(text: str) -> float | int:
    """A JSON number with a fraction or exponent, as ``from_stored`` reads it back."""
    value = float(text)
    if value.is_integer() and -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT:
        return int(value)
    return value


_parse_normal = json.JSONDecoder(parse_float=_number).decode


def _history_rows(raw: list[Any]) -> list[HistoryRow]:
    """Rows of :data:`HISTORY_COLS` as :class:`HistoryRow`, their effects parsed with numbers
    normalised. The effects are parsed in one pass, joined into one JSON array: one decoder
    call instead of one per row; if that is not one value per row (a malformed effect), each
    is parsed alone, which raises as a read of it does."""
    try:
        effects = _parse_normal("[" + ",".join([r[6] for r in raw]) + "]")
    except ValueError:
        effects = []
    if len(effects) != len(raw):
        effects = [_parse_normal(r[6]) for r in raw]
    return [
        HistoryRow(r[0], r[1], r[2], r[3], r[4], r[5], e) for r, e in zip(raw, effects, strict=True)
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
    _insert_rows(db, rid, first, entries, effects)
    return list(range(first, first + n))


def _insert_rows(
    db: sqlite3.Connection, rid: int, first: int, entries: Sequence[NewEntry], effects: list[str]
) -> None:
    """The journal rows (and their keys) of ``entries`` at positions from ``first`` on (the
    run's head is moved by the caller)."""
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
