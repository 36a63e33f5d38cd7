"""The SQLite lease rows: counters carried by the rows, the format marker, older files.

A transition writes the counters (next rank, next token) into every row it writes, and a
removal turns a removed row into row 0 with them, so no transition writes a row for the
counters alone. These tests hold that to what matters:

- after every transition, what a fresh reader loads from the file (rows and counters) is what
  the backend holds in memory, across removals of every row, withdrawn requests and reaping;
- a file of the row format before (counters in row 0 only, no marker) opens: its grants stay
  granted and its counters go on;
- the loader of the format before fails on an upgraded file instead of reading row 0's stale
  counters (the negative control shows that row 0 alone would hand out a token again).
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import crdtstore
from crdtstore import BackendError, InvalidResource, LeaseHeld, LeaseLost, LeaseNotFound
from crdtstore._backends.sqlite import SQLiteJournal, SQLiteLeases
from crdtstore._backends.sqlite._lease_rows import _CREATE as CREATE
from crdtstore._backends.sqlite._lease_rows import FORMAT_ROW, TABLE, load_table
from crdtstore._leases import FakeClock, Proc, SystemClock, this_proc
from crdtstore._leases._conformance import FakeProbe
from crdtstore._leases._engine import Table

pytestmark = pytest.mark.anyio

T = "t"
FILES = ("a", "b", "c")


def stored(path: Path) -> tuple[int, int, list[tuple[Any, ...]]]:
    """(next_rank, next_token, rows) as a reader with its own connection loads them."""
    db = sqlite3.connect(path)
    try:
        db.execute("BEGIN")
        t = load_table(db)
        db.execute("COMMIT")
    finally:
        db.close()
    return t.next_rank, t.next_token, rows_of(t)


def rows_of(t: Table) -> list[tuple[Any, ...]]:
    return sorted(
        (r.rank, r.id, r.owner, r.resources, r.state, r.token, r.expires, r.acked, r.proc)
        for r in t.reqs.values()
    )


# -- after every transition, the file holds what the backend holds -----------------------------

op = st.one_of(
    st.tuples(
        st.just("request"),
        st.lists(st.sampled_from(FILES), min_size=1, max_size=2, unique=True),
        st.booleans(),  # wait
        st.sampled_from([None, ("s", 1), ("s", 2)]),  # key
    ),
    st.tuples(st.just("release"), st.integers(0, 7), st.booleans()),  # (lease, forged token)
    st.tuples(st.just("cancel"), st.integers(0, 7)),
    st.tuples(st.just("heartbeat"), st.integers(0, 7)),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 1.5, 3.0])),
    st.tuples(st.just("kill"), st.integers(1, 2)),
    st.tuples(st.just("reap")),
)


async def run_ops(path: Path, ops: list[tuple[Any, ...]]) -> None:
    clock, probe = FakeClock(), FakeProbe()
    journal = SQLiteJournal(f"sqlite:///{path}")
    await journal.open()
    b = SQLiteLeases(journal, clock=clock, probe=probe)
    await b.open()
    ids: list[tuple[str, str, int | None]] = []  # (lease id, owner, token)
    last_counters = (1, 1)
    try:
        for i, o in enumerate(ops):
            kind = o[0]
            try:
                if kind == "request":
                    owner = f"o{i % 3}"
                    st_ = await b.request(
                        T, owner, tuple(sorted(o[1])), ttl=2.0, key=o[3],
                        proc=Proc("h", "boot-0", 1 + i % 2, 1), wait=o[2],
                    )  # fmt: skip
                    ids.append((st_.lease_id, owner, st_.token))
                elif kind in ("release", "cancel", "heartbeat") and ids:
                    lease_id, owner, token = ids[o[1] % len(ids)]
                    if kind == "release":
                        forged = token + 1 if o[2] and token is not None else token
                        await b.release(T, lease_id, owner, forged)
                    elif kind == "cancel":
                        await b.cancel(T, lease_id, owner)
                    else:
                        await b.heartbeat(T, lease_id, owner, Proc("h", "boot-0", 1, 1))
                elif kind == "advance":
                    clock.advance(o[1])
                elif kind == "kill":
                    probe.dead.add(o[1])
                elif kind == "reap":
                    await b.reap()
            except (LeaseHeld, LeaseLost, LeaseNotFound, InvalidResource):  # (refused)
                pass
            cached = b._cached
            if cached is None:  # no transition yet (a reap of nothing only reads)
                continue
            next_rank, next_token, rows = stored(path)
            assert (next_rank, next_token) == (cached.next_rank, cached.next_token), (i, o)
            assert rows == rows_of(cached), (i, o)
            assert next_rank >= last_counters[0] and next_token >= last_counters[1]
            last_counters = (next_rank, next_token)
    finally:
        await b.aclose()
        await journal.aclose()


@settings(deadline=None)
@given(ops=st.lists(op, min_size=1, max_size=25))
def test_the_file_holds_the_rows_and_counters_after_every_transition(
    ops: list[tuple[Any, ...]],
) -> None:
    with tempfile.TemporaryDirectory(prefix="lease-rows-") as tmp:
        anyio.run(run_ops, Path(tmp) / "s.db", ops)


async def test_counters_survive_when_every_row_is_gone(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    tokens = []
    for _ in range(2):  # the second store object reads only what the first one wrote
        async with crdtstore.open_store(url) as store:
            async with store.lease(["a"], owner="A") as first:
                tokens.append(first.token)
                with pytest.raises(LeaseHeld):  # asked and withdrawn in one transition
                    await store.lease(["a"], owner="B", wait=False).acquire()
            async with store.lease(["a", "b"], owner="C") as second:
                tokens.append(second.token)
            assert (await store.leases.status()).holders == ()
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens
    next_rank, next_token, rows = stored(tmp_path / "s.db")
    assert rows == [] and next_token == tokens[-1] + 1 and next_rank == 7  # 6 requests


# -- files of the format before -----------------------------------------------------------------


def write_format_before(
    path: Path, *, next_rank: int, next_token: int, rows: list[dict[str, Any]]
) -> None:
    """Rewrite the lease table as the version before wrote it: the same columns, counters in
    row 0 only, request rows with NULL counters, no format marker."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute(CREATE)  # the same columns in both formats
        db.execute(f"DELETE FROM {TABLE}")
        db.execute(
            f"INSERT INTO {TABLE} (rank, next_rank, next_token) VALUES (0, ?, ?)",
            (next_rank, next_token),
        )
        for r in rows:
            cols = ", ".join(r)
            db.execute(
                f"INSERT INTO {TABLE} ({cols}) VALUES ({', '.join('?' * len(r))})",
                tuple(r.values()),
            )
        db.execute("COMMIT")
    finally:
        db.close()


async def test_a_file_of_the_format_before_opens_with_its_grant_and_counters(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    url = f"sqlite:///{path}"
    async with crdtstore.open_store(url):
        pass  # the store file with its tables
    clock = SystemClock()
    now = clock.now()
    held = {
        "rank": 7, "id": "00000000000000aa", "tenant": "default", "owner": "old", "step": None,
        "attempt": None, "resources": json.dumps(["src/a.py"]), "state": "granted",
        "token": 41, "ttl": 60.0, "host": "another-host", "boot": "another-boot", "pid": 1,
        "pstart": 1, "acked": 1, "created": 0.0, "clock_boot": clock.boot_id(),
        "requested": now, "granted_at": now, "expires": now + 60.0,
    }  # fmt: skip
    write_format_before(path, next_rank=8, next_token=42, rows=[held])
    async with crdtstore.open_store(url) as store:
        (holder,) = (await store.leases.status()).holders
        assert (holder.rank, holder.token, holder.owner) == (7, 41, "old")
        with pytest.raises(LeaseHeld):
            await store.lease(["src/a.py"], owner="new", wait=False).acquire()
        async with store.lease(["src/b.py"], owner="new") as lease:
            assert (lease.rank, lease.token) == (9, 42)  # rank 8 went to the refused request
        await store.leases.backend.release(store.tenant, held["id"], "old", 41)
        async with store.lease(["src/a.py"], owner="new") as lease:
            assert lease.token == 43
    async with crdtstore.open_store(url) as store:  # what the file says, read afresh
        async with store.lease(["src/a.py"], owner="new") as lease:
            assert (lease.rank, lease.token) == (11, 44)
    db = sqlite3.connect(path)
    assert (
        db.execute(f"SELECT count(*) FROM {TABLE} WHERE rank = ?", (FORMAT_ROW,)).fetchone()[0] == 1
    )
    db.close()


def load_table_format_before(db: sqlite3.Connection) -> tuple[int, int, list[int]]:
    """How the version before read the table (frozen here): counters from row 0 alone, every
    other row parsed as a request."""
    next_rank = next_token = 0
    ranks = []
    for row in db.execute(f"SELECT rank, resources, next_rank, next_token FROM {TABLE}"):
        if row[0] == 0:
            next_rank, next_token = row[2], row[3]
        else:
            tuple(json.loads(row[1]))  # raises on the format marker (NULL resources)
            ranks.append(row[0])
    return next_rank, next_token, ranks


async def test_the_loader_of_the_format_before_fails_on_an_upgraded_file(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with crdtstore.open_store(f"sqlite:///{path}") as store:
        async with store.lease(["a"], owner="A"):
            async with store.lease(["b"], owner="B") as b:
                db = sqlite3.connect(path)
                try:
                    with pytest.raises(TypeError):
                        load_table_format_before(db)
                    # Negative control: without the marker, row 0 alone says a token that is
                    # already held is the next one to hand out.
                    db.execute(f"DELETE FROM {TABLE} WHERE rank = ?", (FORMAT_ROW,))
                    _, next_token, ranks = load_table_format_before(db)
                    assert next_token <= b.token and ranks == [1, 2]
                finally:
                    db.rollback()
                    db.close()


# -- a forked child --------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
async def test_a_forked_child_cannot_use_the_parents_lease_connection(tmp_path: Path) -> None:
    async with crdtstore.open_store(f"sqlite:///{tmp_path}/s.db") as store:
        backend = store.leases.backend
        async with store.lease(["a"], owner="parent"):
            pass  # the lease connection is open and cached
        parent = this_proc()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            import asyncio

            code = 0 if this_proc().pid == os.getpid() != parent.pid else 4
            for call in (
                lambda: backend.request(
                    store.tenant, "child", ("b",), ttl=5.0, key=None, proc=this_proc(), wait=True
                ),
                lambda: backend.release(store.tenant, "0" * 16, "child", 1),
            ):
                try:
                    asyncio.run(call())
                    code = code or 1
                except BackendError as exc:
                    if "fork" not in str(exc):
                        code = code or 2
                except BaseException:
                    code = code or 3
            os._exit(code)
        _, status = await anyio.to_thread.run_sync(os.waitpid, pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        async with store.lease(["b"], owner="parent") as lease:  # the parent goes on
            assert lease.token == 2
