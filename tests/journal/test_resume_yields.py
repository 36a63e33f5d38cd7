"""Opening a record from a long journal leaves the event loop to other tasks between chunks.

The SQLite backend serves a read of at most ``INLINE_ROWS`` rows on the event loop thread,
which does not yield; opening reads the journal in chunks of ``LOAD_CHUNK`` rows (no more than
that, so the reads stay on the loop) and checkpoints after each, so a hub or another record
on the same loop keeps running while a big run is resumed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import crdtstore
from crdtstore._backends.sqlite._journal import INLINE_ROWS
from crdtstore.record._journal_link import LOAD_CHUNK

ENTRIES = 5 * LOAD_CHUNK


def test_load_chunks_are_served_on_the_loop() -> None:
    assert LOAD_CHUNK <= INLINE_ROWS


@pytest.mark.anyio
async def test_other_tasks_run_while_a_long_journal_is_loaded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with (
        crdtstore.open_store(url, auto_compact=None) as store,
        store.open_record("r", "w", "tool", durability="batched") as rec,
    ):
        for i in range(ENTRIES):
            await rec.map("m").set(f"k{i}", i)
        await rec.flush()
    async with crdtstore.open_store(url, auto_compact=None) as store:
        ticks = 0
        loaded = False
        at_read: list[int] = []  # ticks when each journal read was asked for
        read = store.backend.read

        async def counting_read(*args: Any, **kwargs: Any) -> Any:
            at_read.append(ticks)
            return await read(*args, **kwargs)

        store.backend.read = counting_read  # type: ignore[method-assign]

        async def ticker() -> None:
            nonlocal ticks
            while not loaded:
                ticks += 1
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            reader = store.open_record("r", "reader", "tool", create=False)
            await reader.start()
            loaded = True
        try:
            assert len(reader.map("m")) == ENTRIES
            # the load's reads: ENTRIES // LOAD_CHUNK full chunks and the empty one that ends
            # it (the tail's reads may follow). Served on the loop, they never yield: the
            # ticker ran between them only because the load checkpoints after each chunk
            # (about once per chunk: trio may run the two tasks in either order each round)
            loads = at_read[: ENTRIES // LOAD_CHUNK + 1]
            assert len(loads) == ENTRIES // LOAD_CHUNK + 1, at_read
            assert loads == sorted(loads), at_read
            assert loads[-1] - loads[0] >= len(loads) - 2, at_read
        finally:
            await reader.aclose()
