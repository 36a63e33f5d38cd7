"""The SQLite store file: its URL, its schema and the migrations of older files, the connection
settings (WAL, ``secure_delete``, the loop connection's busy timeout 0), and how stored effects
are written and parsed. Shared by the journal (``sqlite.py``) and its fast paths.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..._errors import UnsupportedURL

_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:  # pragma: no cover - Python < 3.11
        return "locked" in str(exc) or "busy" in str(exc)
    return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    tenant TEXT NOT NULL,
    run TEXT NOT NULL,
    created REAL NOT NULL,
    head INTEGER NOT NULL DEFAULT 0,
    snapshot_seq INTEGER NOT NULL DEFAULT 0,
    config TEXT NOT NULL DEFAULT '{}',
    parent TEXT,
    state TEXT NOT NULL DEFAULT 'open',
    delete_after REAL,
    UNIQUE (tenant, run)
);
CREATE TABLE IF NOT EXISTS journal (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    agent TEXT NOT NULL,
    source TEXT NOT NULL,
    client_id INTEGER NOT NULL,
    wall_time REAL NOT NULL,
    upd BLOB NOT NULL,
    effect TEXT NOT NULL,
    crc INTEGER NOT NULL,
    origin TEXT NOT NULL DEFAULT '',
    call TEXT NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX IF NOT EXISTS journal_run_seq ON journal (run_id, seq);
CREATE TABLE IF NOT EXISTS journal_keys (
    run_id INTEGER NOT NULL,
    collection TEXT NOT NULL,
    key TEXT NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (run_id, collection, key, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS snapshots (
    run_id INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL,
    upd BLOB NOT NULL,
    state TEXT NOT NULL,
    created REAL NOT NULL
);
"""

# Columns added after the first release of the schema: (table, column, declaration).
_MIGRATIONS = [
    ("runs", "config", "TEXT NOT NULL DEFAULT '{}'"),
    ("runs", "parent", "TEXT"),
    ("runs", "state", "TEXT NOT NULL DEFAULT 'open'"),
    ("runs", "delete_after", "REAL"),
    ("journal", "origin", "TEXT NOT NULL DEFAULT ''"),
    ("journal", "call", "TEXT NOT NULL DEFAULT ''"),  # the tool-call id (Record.attributed)
]


def _migrate(db: sqlite3.Connection) -> None:
    for table, column, decl in _MIGRATIONS:
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _effect(text: str) -> Any:
    """A stored effect, parsed. The decoder's scanner, called directly, parses a small effect
    in about a third of the time ``json.loads`` takes (its calls through ``decode`` and
    ``raw_decode`` cost more than the parse); anything it does not take whole (bad JSON,
    trailing text) goes through ``json.loads``, which parses it or raises as before."""
    try:
        value, end = _scan(text, 0)
    except (StopIteration, ValueError):
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def sqlite_path(url: str) -> Path:
    """The file path of a ``sqlite:///...`` URL (``sqlite:///rel.db`` or ``sqlite:////abs.db``).

    Raises:
        UnsupportedURL: not a sqlite URL, or no path.
    """
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise UnsupportedURL(url, "expected sqlite:///relative/path.db or sqlite:////abs/path.db")
    path = url[len(prefix) :].split("?", 1)[0]
    if "\x00" in path:
        raise UnsupportedURL(url, "NUL in path")
    return Path(path)


class _Conn:
    """One sqlite3 connection, used by one thread at a time.

    ``loop=True`` makes the loop connection: busy timeout 0 (its callers retry without
    blocking the event loop) and no checkpoint on commit.
    """

    def __init__(self, path: Path, *, loop: bool = False) -> None:
        self.lock = threading.Lock()
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA secure_delete=ON")
        self.db.execute("PRAGMA foreign_keys=ON")
        if loop:
            self.db.execute("PRAGMA wal_autocheckpoint=0")
            self.db.execute("PRAGMA busy_timeout=0")
        self.synchronous = "NORMAL"

    def close(self) -> None:
        with self.lock:
            self.db.close()


def _rollback(db: sqlite3.Connection) -> None:
    if db.in_transaction:
        db.execute("ROLLBACK")
