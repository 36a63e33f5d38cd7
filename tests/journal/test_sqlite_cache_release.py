"""The SQLite backend gives the loop connection's page cache back once a long run of reads on
it reaches the end of what it asked for (a load or a replay caught up), and after every so
many rows appended on it: those pages of the journal are not read again, and a cache of up
to 2 MiB would stay with the process."""

from __future__ import annotations

from pathlib import Path

import pytest

from crdtstore._backends.sqlite import SQLiteJournal
from crdtstore._backends.sqlite import _inline as sqi
from crdtstore._journal import NewEntry

pytestmark = pytest.mark.anyio

SHRINK = "PRAGMA shrink_memory"


async def test_reads_that_reach_the_end_after_many_rows_shrink_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqi, "SHRINK_AFTER_ROWS", 20)
    j = SQLiteJournal(f"sqlite:///{tmp_path}/s.db")
    await j.open()
    try:
        await j.ensure_run("t", "r", create=True)
        entries = [NewEntry("a", "tool", 7, float(i), bytes([i]) * 8, [], 0) for i in range(50)]
        await j.append("t", "r", entries, durable=False)
        assert j._l is not None
        traced: list[str] = []
        j._l.db.set_trace_callback(traced.append)
        # a short read after few rows (a tail's): the cache stays
        assert len(await j.read("t", "r", 45, 16)) == 5
        after, reads = 0, []
        while True:  # a load: full reads, then one that reaches the end
            rows = await j.read("t", "r", after, 16)
            reads.append((len(rows), traced.count(SHRINK)))
            if not rows:
                break
            after = rows[-1].seq
        # (the full reads never shrink it; the one that finds the end, 55 rows on, does)
        assert reads == [(16, 0), (16, 0), (16, 0), (2, 1), (0, 1)]
    finally:
        await j.aclose()


async def test_appends_on_the_loop_connection_shrink_its_cache_every_so_many_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqi, "SHRINK_AFTER_APPENDS", 20)
    j = SQLiteJournal(f"sqlite:///{tmp_path}/s.db")
    await j.open()
    try:
        await j.ensure_run("t", "r", create=True)
        assert j._l is not None
        traced: list[str] = []
        j._l.db.set_trace_callback(traced.append)
        shrunk = []
        for n in range(6):  # batched appends of 8 rows: inline, on the loop connection
            entries = [
                NewEntry("a", "tool", 7, float(i), bytes([i]) * 8, [], 0)
                for i in range(8 * n, 8 * n + 8)
            ]
            assert await j.append("t", "r", entries, durable=False) == list(
                range(8 * n + 1, 8 * n + 9)
            )
            shrunk.append(traced.count(SHRINK))
        assert shrunk == [0, 0, 1, 1, 1, 2]  # (after 24 rows, then 24 more)
        assert [row.seq for row in await j.read("t", "r", 0, 100)] == list(range(1, 49))
    finally:
        await j.aclose()
