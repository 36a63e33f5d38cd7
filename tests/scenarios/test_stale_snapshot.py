"""Failure mode 4, stale-snapshot: an agent acts for twenty minutes on a snapshot that
stopped being true."""

from __future__ import annotations

from pathlib import Path

import pytest

import crdtstore
from crdtstore import StaleVersion

pytestmark = pytest.mark.anyio


async def test_acting_on_a_moved_view_is_refused_and_explained(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    async with crdtstore.open_store(url) as store:
        async with (
            store.open_record(run="r", agent="planner") as planner,
            store.open_record(run="r", agent="worker") as worker,
        ):
            await planner.map("plan").set("target", "service-a")
            await planner.flush()
            await worker.sync()
            snapshot = worker.view(["plan"]).data()  # the worker's long-lived snapshot
            version = worker.current_version("plan")
            # twenty minutes later the plan changed
            await planner.map("plan").set("target", "service-b")
            await planner.flush()
            assert snapshot["plan"]["target"]["value"] == "service-a"
            with pytest.raises(StaleVersion):
                await worker.map("results").set("deployed", "service-a", based_on=version)
            assert "deployed" not in worker.map("results")
            # the worker learns what moved, refreshes, and acts on the fresh view
            changes = await worker.changes_since(version)
            assert [(c.collection, c.keys, c.agent) for c in changes] == [
                ("plan", ("target",), "planner")
            ]
            fresh = worker.current_version("plan")
            await worker.map("results").set(
                "deployed", worker.map("plan")["target"], based_on=fresh
            )
            assert worker.map("results")["deployed"] == "service-b"
