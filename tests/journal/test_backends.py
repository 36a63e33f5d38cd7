"""Every journal backend passes the public conformance suite; SQLite specifics."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import crdtstore
from crdtstore._backends.memory import MemoryJournal
from crdtstore._backends.sqlite import SQLiteJournal
from crdtstore.testing import check_journal_backend

pytestmark = pytest.mark.anyio


async def test_memory_backend_conforms() -> None:
    await check_journal_backend(lambda: MemoryJournal("memory://"))


async def test_sqlite_backend_conforms(tmp_path: Path) -> None:
    counter = iter(range(1000))
    await check_journal_backend(lambda: SQLiteJournal(f"sqlite:///{tmp_path}/s{next(counter)}.db"))


async def test_conformance_suite_can_fail() -> None:
    """A backend that forgets to isolate runs is caught (the checker is not vacuous)."""

    class Leaky(MemoryJournal):
        async def read(self, tenant: str, run: str, after: int, limit: int = 10_000):  # type: ignore[no-untyped-def]
            rows = []
            for (_, _), r in self._data.runs.items():
                rows.extend(x for x in r.rows if x.seq > after)
            return rows[:limit]

    with pytest.raises(AssertionError, match="isolated"):
        await check_journal_backend(lambda: Leaky("memory://"))


async def test_sqlite_store_is_wal_and_deletes_securely(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "store.db"
    async with crdtstore.open_store(f"sqlite:///{path}") as store:
        async with store.open_record(run="r", agent="a") as rec:
            await rec.map("pii").set("email", "someone@example.org-UNIQUE-MARKER")
        assert path.exists()
        await store.delete_run("r")
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    for f in tmp_path.rglob("store.db*"):
        assert b"UNIQUE-MARKER" not in f.read_bytes(), f"deleted data still in {f.name}"


async def test_named_memory_stores_are_shared_in_process() -> None:
    async with crdtstore.open_store("memory://shared-test") as s1:
        async with s1.open_record(run="r", agent="a") as rec:
            await rec.map("m").set("k", 1)
    async with crdtstore.open_store("memory://shared-test") as s2:
        async with s2.open_record(run="r", agent="b") as rec:
            assert rec.map("m")["k"] == 1
        await s2.delete_run("r")
    async with crdtstore.open_store("memory://") as private:
        assert await private.runs() == []


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_append_last_ends_the_authority_transaction(backend: str, tmp_path: Path) -> None:
    """Issue 20: ``Authority.append_last`` appends as the transaction's last step (SQLite:
    with its commit in the same worker-thread hop); leaving the context then only ends it,
    and on SQLite an error raised after it does not take the appended entries back."""
    import time as _time

    from crdtstore._journal import NewEntry, checksum

    def entry(i: int) -> NewEntry:
        update = f"u{i}".encode()
        return NewEntry("a", "tool", 7, _time.time(), update, [], checksum(update))

    b = (
        MemoryJournal("memory://")
        if backend == "memory"
        else SQLiteJournal(f"sqlite:///{tmp_path}/s.db")
    )
    await b.open()
    try:
        await b.ensure_run("t", "r", create=True)
        async with b.authority("t", "r", durable=True) as auth:
            assert await auth.read(0) == []
            assert await auth.append_last([entry(1), entry(2)]) == [1, 2]
        assert await b.head("t", "r") == 2
        try:
            async with b.authority("t", "r", durable=True) as auth:
                assert await auth.read(2) == []  # (SQLite: answered from the head it read)
                assert [r.seq for r in await auth.read(1)] == [2]
                assert await auth.append_last([entry(3)]) == [3]
                raise RuntimeError("after the last step")
        except RuntimeError:
            pass
        kept = [b"u1", b"u2", b"u3"] if backend == "sqlite" else [b"u1", b"u2"]
        assert [r.update for r in await b.read("t", "r", 0)] == kept
        async with b.authority("t", "r", durable=True) as auth:
            assert await auth.append_last([]) == []
        await b.append("t", "r", [entry(4)], durable=False)  # the write lock is free again
        assert await b.head("t", "r") == len(kept) + 1
    finally:
        await b.aclose()
