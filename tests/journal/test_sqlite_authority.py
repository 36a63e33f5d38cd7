"""The SQLite authority transaction (``crdtstore._backends.sqlite._authority``): on the event
loop thread, a durable commit in a worker thread only while measured syncs are slow, and the
authority connection's log checkpointed so that it is rewritten in place, not grown."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import crdtstore
from crdtstore._backends.sqlite import SQLiteJournal
from crdtstore._backends.sqlite import _authority as sqa

pytestmark = pytest.mark.anyio


def count_hops(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    hops = [0]
    in_thread = sqa._SQLiteAuthority._in_thread

    async def counted(self: sqa._SQLiteAuthority, fn: Any) -> Any:
        hops[0] += 1
        return await in_thread(self, fn)

    monkeypatch.setattr(sqa._SQLiteAuthority, "_in_thread", counted)
    return hops


async def test_a_durable_commit_hops_to_a_thread_only_while_syncs_are_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqa, "CHECKPOINT_EVERY", 10_000)  # (no checkpoint hop here)
    async with (
        crdtstore.open_store(f"sqlite:///{tmp_path}/s.db") as store,
        store.open_record("r", "a") as rec,
    ):
        journal = store.backend
        assert isinstance(journal, SQLiteJournal)
        m = rec.map("m")
        hops = count_hops(monkeypatch)
        estimate = journal.sync_estimate
        estimate.seconds = 1.0
        monkeypatch.setattr(sqa, "INLINE_SYNC", 0.5)  # slow syncs: in a worker thread
        await m.set("k", 1, expected_version=0)
        assert hops == [1]
        assert estimate.seconds < 1.0, "the commit was timed"
        monkeypatch.setattr(sqa, "INLINE_SYNC", 1e9)  # fast syncs: on the loop thread
        for i in range(3):
            await m.set("k", i + 2, expected_version=m.get_versioned("k")[1])
        assert hops == [1]
        assert m.get("k") == 4
        # a refused write writes nothing: its (empty) commit never hops either
        monkeypatch.setattr(sqa, "INLINE_SYNC", 0.0)
        with pytest.raises(crdtstore.StaleVersion):
            await m.set("k", 0, expected_version=0)
        assert hops == [1]
        assert [e.effect[0][4] for e in await rec.journal()] == [1, 2, 3, 4]


async def test_the_authority_log_is_rewritten_in_place(tmp_path: Path) -> None:
    """Guarded writes checkpoint the log every ``CHECKPOINT_EVERY`` commits, so it stops
    growing once it holds that many (it grew to 4,000 frames before, each sync of it also
    syncing a new file size)."""
    path = tmp_path / "s.db"
    sizes = []
    async with (
        crdtstore.open_store(f"sqlite:///{path}") as store,
        store.open_record("r", "a") as rec,
    ):
        m = rec.map("m")
        for i in range(4 * sqa.CHECKPOINT_EVERY):
            await m.set("k", i, expected_version=m.get_versioned("k")[1] or 0)
            if i % sqa.CHECKPOINT_EVERY == sqa.CHECKPOINT_EVERY - 1:
                sizes.append(os.path.getsize(f"{path}-wal"))
        assert m.get("k") == 4 * sqa.CHECKPOINT_EVERY - 1
    assert sizes[-1] < 1.2 * sizes[0], f"the log grew: {sizes}"
