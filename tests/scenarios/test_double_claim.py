"""Failure mode 1, double-claim: two agents read the work list, both take the first
unclaimed item, and both do it."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import crdtstore
from crdtstore import LeaseHeld

pytestmark = pytest.mark.anyio


async def test_every_item_is_done_exactly_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    items = [f"t{i}" for i in range(12)]
    done_by: dict[str, list[str]] = {i: [] for i in items}
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r", agent="planner") as planner:
            await planner.map("tasks").update({i: {"title": f"task {i}"} for i in items})

        async def agent(name: str) -> None:
            async with store.open_record(run="r", agent=name) as rec:
                while True:
                    claims = rec.map("claims")  # possibly stale: claim() must still be safe
                    todo = [i for i in rec.map("tasks") if f"tasks/{i}" not in claims]
                    if not todo:
                        return
                    # every agent goes for the first unclaimed item: the race in question
                    try:
                        claim = await rec.claim("tasks", sorted(todo)[0], ttl=30)
                    except LeaseHeld:
                        await rec.sync()  # someone has it, or did it: look again
                        continue
                    done_by[claim.item_id].append(name)
                    await claim.complete(result=name)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for n in range(4):
                    tg.start_soon(agent, f"agent{n}")
        async with store.open_record(run="r", agent="auditor") as rec:
            claims = rec.map("claims")
            for item in items:
                assert len(done_by[item]) == 1, (item, done_by[item])
                assert claims[f"tasks/{item}"]["state"] == "done"
                assert claims[f"tasks/{item}"]["result"] == done_by[item][0]
