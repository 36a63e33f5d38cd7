"""A guarded write refused inside the journal's authority transaction rolls back the append of
the record's pending writes made in that transaction. The record must not count the
positions that append took as read: the next entry of another writer gets one of them, and a
record that believed it had read past it would never apply it (its replica diverges for
good). Found by ``test_ws_and_embedded_writers_converge_with_equal_versions``."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from crdtstore import StaleVersion, open_store

pytestmark = pytest.mark.anyio


async def test_a_refused_guarded_write_does_not_skip_the_positions_its_rollback_frees(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    async with (
        open_store(url, tenant="t", poll_interval=0.05) as store,
        store.open_record("r", "a") as a,
        store.open_record("r", "b") as b,
    ):
        await a.map("m").set("k", 1)
        await a.flush()
        await b.sync()
        assert b.applied_seq == 1

        # a write of b still pending (not journaled), then a guarded write that is refused:
        # its authority transaction appends the pending write first, then rolls it back
        await b.map("m").set("x", 1)
        assert len(b._pending) == 1
        with pytest.raises(StaleVersion):
            await b.map("m").set("k", 2, expected_version=0)
        assert b.applied_seq == 1  # not the position the rolled-back append had taken

        # another writer's entry takes that position; b's pending write comes after it
        await a.map("m").set("y", 1)
        await a.flush()
        await b.flush()
        head = (await store.run_info("r")).head
        assert head == 3
        with anyio.fail_after(10):
            while a.applied_seq < head or b.applied_seq < head:
                await anyio.sleep(0.01)
        assert b.map("m").get("y") == 1
        assert a.to_dict() == b.to_dict() == (await store.replay("r")).to_dict()
