"""Journaled writes on ``sqlite:///`` (``batched`` and ``durable``) against raw sqlite3 inserts of
the same update bytes and against pycrdt-store's ``SQLiteYStore`` writing the same updates.

    python bench/sqlite_journal.py            # 100k batched, 2k durable, 2k SQLiteYStore
    python bench/sqlite_journal.py --quick    # 20k batched, 500 durable, 500 SQLiteYStore

Each record write is one ``await rec.map("m").set(f"k{i}", i)`` (one transaction, one journal
entry). ``batched`` time runs until ``await rec.flush()`` returns; ``durable`` writes each wait
for their own commit (``synchronous=FULL``), one writer task, and then 32 concurrent writer
tasks (group commit).

Baselines, in the same run, on a fresh file in a temp dir:

- raw sqlite3, minimal table ``(id INTEGER PRIMARY KEY, upd BLOB)``, WAL: one transaction per
  batch (batch = the record's measured mean group-commit size, and 1,000) with
  ``synchronous=NORMAL``; one commit per row with ``synchronous=FULL`` for ``durable``;
- raw sqlite3 with crdtstore's own schema and rows (journal + journal_keys, effect JSON), same
  batches: what the SQL alone costs, without the record around it;
- ``pycrdt.store.SQLiteYStore`` (0.1.5, default settings: a checkpoint every 100 updates, one
  commit per ``write``), the peer a user would otherwise pick.

Target: >= 20,000 updates/s batched.
"""

from __future__ import annotations

import argparse
import gc
import json
import sqlite3
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
from _common import Result, fmt, header, table
from pycrdt import Doc, Map

import crdtstore

TARGET = 20_000.0
TARGET_SAME_SCHEMA = 0.3  # batched / raw sqlite3 with the same schema (issue 20)
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def make_updates(n: int) -> list[bytes]:
    """The update bytes of ``n`` one-set transactions, as raw pycrdt captures them."""
    doc: Doc[Any] = Doc()
    m = doc.get("m", type=Map)
    out: list[bytes] = []
    doc.observe(lambda event: out.append(event.update))
    for i in range(n):
        with doc.transaction():
            m[f"k{i}"] = i
    return out


# -- crdtstore ------------------------------------------------------------------------------------


async def record_writes(
    url: str, n: int, durability: str, concurrency: int = 1
) -> dict[str, float]:
    """Write ``n`` keys through a record; return timings and the group-commit count."""
    async with crdtstore.open_store(url, durability=durability) as store:  # type: ignore[arg-type]
        backend = store.backend
        commits = [0]
        real_append = backend.append

        async def counting_append(*a: Any, **kw: Any) -> list[int]:
            commits[0] += 1
            return await real_append(*a, **kw)

        backend.append = counting_append  # type: ignore[method-assign]
        async with store.open_record("bench", "writer", "tool") as rec:
            m = rec.map("m")
            await m.set("warmup", 0)
            await rec.flush()
            commits[0] = 0
            gc.collect()
            t0 = time.perf_counter()
            if concurrency == 1:
                for i in range(n):
                    await m.set(f"k{i}", i)
            else:

                async def writer(w: int) -> None:
                    for i in range(w, n, concurrency):
                        await m.set(f"k{i}", i)

                async with anyio.create_task_group() as tg:
                    for w in range(concurrency):
                        tg.start_soon(writer, w)
            t_local = time.perf_counter() - t0
            await rec.flush()
            t_total = time.perf_counter() - t0
            head = (await store.run_info("bench")).head
            assert head == n + 1, (head, n)
    return {"local": t_local, "total": t_total, "commits": float(commits[0])}


# -- raw sqlite3 ----------------------------------------------------------------------------------


def _connect(path: Path, synchronous: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    return db


def raw_minimal(path: Path, updates: Sequence[bytes], batch: int, synchronous: str) -> float:
    """Seconds to insert ``updates`` into a two-column table, ``batch`` rows per commit."""
    db = _connect(path, synchronous)
    db.execute("CREATE TABLE j (id INTEGER PRIMARY KEY, upd BLOB NOT NULL)")
    t0 = time.perf_counter()
    for start in range(0, len(updates), batch):
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT INTO j (upd) VALUES (?)", [(u,) for u in updates[start : start + batch]]
        )
        db.execute("COMMIT")
    seconds = time.perf_counter() - t0
    db.close()
    return seconds


_CRDTSTORE_SCHEMA = """
CREATE TABLE runs (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, run TEXT NOT NULL,
    created REAL NOT NULL, head INTEGER NOT NULL DEFAULT 0,
    snapshot_seq INTEGER NOT NULL DEFAULT 0, UNIQUE (tenant, run));
CREATE TABLE journal (id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL, seq INTEGER NOT NULL,
    agent TEXT NOT NULL, source TEXT NOT NULL, client_id INTEGER NOT NULL,
    wall_time REAL NOT NULL, upd BLOB NOT NULL, effect TEXT NOT NULL, crc INTEGER NOT NULL);
CREATE UNIQUE INDEX journal_run_seq ON journal (run_id, seq);
CREATE TABLE journal_keys (run_id INTEGER NOT NULL, collection TEXT NOT NULL,
    key TEXT NOT NULL, seq INTEGER NOT NULL,
    PRIMARY KEY (run_id, collection, key, seq)) WITHOUT ROWID;
INSERT INTO runs (tenant, run, created) VALUES ('default', 'bench', 0);
"""


def raw_crdtstore_schema(
    path: Path, updates: Sequence[bytes], batch: int, synchronous: str
) -> float:
    """Seconds to insert the same rows crdtstore writes, with its SQL, ``batch`` per commit
    (includes building the row tuples and effect JSON, as the backend does)."""
    db = _connect(path, synchronous)
    db.executescript(_CRDTSTORE_SCHEMA)
    t0 = time.perf_counter()
    for start in range(0, len(updates), batch):
        chunk = updates[start : start + batch]
        effects = [[["map", "m", "set", f"k{start + i}", start + i]] for i in range(len(chunk))]
        db.execute("BEGIN IMMEDIATE")
        first = (
            db.execute(
                "UPDATE runs SET head = head + ? WHERE id = 1 RETURNING head", (len(chunk),)
            ).fetchone()[0]
            - len(chunk)
            + 1
        )
        wall = time.time()
        db.executemany(
            "INSERT INTO journal (run_id, seq, agent, source, client_id, wall_time, upd, effect,"
            " crc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (1, first + i, "writer", "tool", 12345, wall, u, _dumps(effects[i]), zlib.crc32(u))
                for i, u in enumerate(chunk)
            ],
        )
        db.executemany(
            "INSERT OR IGNORE INTO journal_keys (run_id, collection, key, seq) VALUES (?,?,?,?)",
            [(1, op[1], op[3], first + i) for i, e in enumerate(effects) for op in e],
        )
        db.execute("COMMIT")
    seconds = time.perf_counter() - t0
    db.close()
    return seconds


# -- pycrdt-store ---------------------------------------------------------------------------------


async def ystore_writes(path: Path, updates: Sequence[bytes]) -> tuple[float, int]:
    """Seconds for ``SQLiteYStore.write`` of every update (defaults), and the entries a fresh
    doc loaded from the store afterwards has (a correctness check)."""
    from pycrdt.store import SQLiteYStore

    class Store(SQLiteYStore):
        db_path = str(path)

    async with Store("bench") as ystore:
        t0 = time.perf_counter()
        for u in updates:
            await ystore.write(u)
        seconds = time.perf_counter() - t0
        doc: Doc[Any] = Doc()
        await ystore.apply_updates(doc)
        loaded = len(doc.get("m", type=Map))
    return seconds, loaded


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="20k batched, 500 durable/ystore")
    ap.add_argument("-n", type=int, default=None, help="batched writes (default 100k)")
    ap.add_argument("--durable-n", type=int, default=None, help="durable writes (default 2k)")
    ap.add_argument("--ystore-n", type=int, default=None, help="SQLiteYStore writes (2k)")
    ap.add_argument("--concurrency", type=int, default=32, help="writer tasks, durable group")
    ap.add_argument(
        "--dir",
        default=None,
        help="where to put the databases (default: a temp "
        "dir; it must be a real disk for durable figures to mean anything)",
    )
    args = ap.parse_args(argv)
    n = args.n or (20_000 if args.quick else 100_000)
    dn = args.durable_n or (500 if args.quick else 2_000)
    yn = args.ystore_n or (500 if args.quick else 2_000)
    header("sqlite_journal: journaled writes on sqlite:/// vs raw sqlite3 and SQLiteYStore", args)

    updates = make_updates(max(n, dn, yn))
    print(f"   update size: {sum(map(len, updates[:n])) / n:.1f} bytes mean")
    rows: list[list[Any]] = []
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="crdtstore-bench-", dir=args.dir) as tmp:
        d = Path(tmp)

        def url(name: str) -> str:
            return f"sqlite:///{d / name}"

        # batched
        b = anyio.run(record_writes, url("batched.db"), n, "batched")
        batch = max(1, round(n / max(1.0, b["commits"])))
        rate_b = n / b["total"]
        rows.append(
            [
                f"crdtstore batched, {n:,} sets, until flush",
                fmt(rate_b, "/s"),
                f"{b['commits']:.0f} commits, mean {batch} entries; sets returned after "
                f"{b['local']:.2f}s, flush after {b['total']:.2f}s",
            ]
        )
        raw_b = n / raw_minimal(d / "raw_b.db", updates[:n], batch, "NORMAL")
        raw_b1k = n / raw_minimal(d / "raw_b1k.db", updates[:n], 1000, "NORMAL")
        raw_bs = n / raw_crdtstore_schema(d / "raw_bs.db", updates[:n], batch, "NORMAL")
        rows.append(
            [
                f"raw sqlite3 2-col, {batch}/commit, NORMAL",
                fmt(raw_b, "/s"),
                f"crdtstore = {rate_b / raw_b:.2f}x",
            ]
        )
        rows.append(
            [
                "raw sqlite3 2-col, 1000/commit, NORMAL",
                fmt(raw_b1k, "/s"),
                f"crdtstore = {rate_b / raw_b1k:.2f}x",
            ]
        )
        rows.append(
            [
                f"raw sqlite3 crdtstore schema, {batch}/commit, NORMAL",
                fmt(raw_bs, "/s"),
                f"crdtstore = {rate_b / raw_bs:.2f}x",
            ]
        )
        results.append(
            Result(
                "sqlite_journal",
                "batched writes until flush",
                rate_b,
                "updates/s",
                raw_b,
                rate_b / raw_b,
                f">= {TARGET:,.0f}/s",
                rate_b >= TARGET,
            )
        )
        results.append(  # issue 20's row: against raw sqlite3 writing the same schema
            Result(
                "sqlite_journal",
                "batched writes until flush vs raw, same schema",
                rate_b,
                "updates/s",
                raw_bs,
                rate_b / raw_bs,
                f">= {TARGET_SAME_SCHEMA}x raw",
                rate_b / raw_bs >= TARGET_SAME_SCHEMA,
            )
        )

        # durable, one writer
        dr = anyio.run(record_writes, url("durable.db"), dn, "durable")
        rate_d = dn / dr["total"]
        raw_d = dn / raw_minimal(d / "raw_d.db", updates[:dn], 1, "FULL")
        raw_ds = dn / raw_crdtstore_schema(d / "raw_ds.db", updates[:dn], 1, "FULL")
        rows.append(
            [
                f"crdtstore durable, 1 writer, {dn:,} sets",
                fmt(rate_d, "/s"),
                f"{dr['commits']:.0f} commits",
            ]
        )
        rows.append(
            [
                "raw sqlite3 2-col, 1/commit, FULL",
                fmt(raw_d, "/s"),
                f"crdtstore = {rate_d / raw_d:.2f}x",
            ]
        )
        rows.append(
            [
                "raw sqlite3 crdtstore schema, 1/commit, FULL",
                fmt(raw_ds, "/s"),
                f"crdtstore = {rate_d / raw_ds:.2f}x",
            ]
        )
        results.append(
            Result(
                "sqlite_journal",
                "durable writes, 1 writer",
                rate_d,
                "updates/s",
                raw_d,
                rate_d / raw_d,
                "(no target; vs raw per-row FULL commit)",
                None,
            )
        )

        # durable, concurrent writers (group commit)
        dc = anyio.run(record_writes, url("durable_c.db"), dn, "durable", args.concurrency)
        rate_dc = dn / dc["total"]
        rows.append(
            [
                f"crdtstore durable, {args.concurrency} writer tasks, {dn:,} sets",
                fmt(rate_dc, "/s"),
                f"{dc['commits']:.0f} commits (group commit); = {rate_dc / raw_d:.2f}x "
                "raw per-row FULL",
            ]
        )

        # pycrdt-store
        ys, loaded = anyio.run(ystore_writes, d / "ystore.db", updates[:yn])
        rate_y = yn / ys
        rows.append(
            [
                f"pycrdt-store SQLiteYStore.write, {yn:,} updates",
                fmt(rate_y, "/s"),
                f"reload has {loaded:,} of {yn:,} keys; crdtstore batched = "
                f"{rate_b / rate_y:.0f}x, durable = {rate_d / rate_y:.1f}x",
            ]
        )
        results.append(
            Result(
                "sqlite_journal",
                "SQLiteYStore (peer) vs crdtstore batched",
                rate_b,
                "updates/s",
                rate_y,
                rate_b / rate_y,
                "(informative)",
                None,
            )
        )

    print()
    table(["variant", "updates/s", "notes"], rows)
    print(
        f"\nTarget: batched >= {TARGET:,.0f} updates/s -> "
        f"{'met' if rate_b >= TARGET else 'MISSED'} ({rate_b:,.0f}/s)"
    )
    for r in results:
        r.emit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
