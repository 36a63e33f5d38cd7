"""Failure mode 4, stale-snapshot, through the agent tools: an agent acts for twenty minutes
on a snapshot that stopped being true. Every read returns a version; ``store_changes(v)``
tells the agent what moved since, and a put ``based_on`` the collection version it read is
refused (STALE_VERSION) once anything in the collection moved."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import pytest

import crdtstore
from crdtstore.tools import Toolset

pytestmark = pytest.mark.anyio

PLAN = {"collection": "plan"}


async def _open(stack: AsyncExitStack, store: crdtstore.Store, agent: str) -> Toolset:
    rec = await stack.enter_async_context(store.open_record(run="r", agent=agent))
    return await stack.enter_async_context(Toolset(rec))


async def test_an_agent_learns_what_moved_and_a_stale_decision_is_refused(tmp_path: Path) -> None:
    async with (
        crdtstore.open_store(f"sqlite:///{tmp_path}/store.db") as store,
        AsyncExitStack() as stack,
    ):
        planner, worker = await _open(stack, store, "planner"), await _open(stack, store, "worker")
        await planner.call("store_put", {**PLAN, "key": "target", "value": "service-a"})
        snapshot = await worker.call("store_get", PLAN)  # the worker's long-lived read
        described = await worker.call("store_describe", {})
        since = described["version"]
        assert {e["key"]: e["value"] for e in snapshot["entries"]} == {"target": "service-a"}
        nothing = await worker.call("store_changes", {"since_version": since})
        assert nothing["changes"] == [] and nothing["more"] is False, nothing
        # twenty minutes later the plan changed
        await planner.call("store_put", {**PLAN, "key": "target", "value": "service-b"})
        # acting on the snapshot's version is refused, and nothing is written
        head = (await store.run_info("r")).head
        decide = {**PLAN, "key": "deployed", "value": "service-a"}
        refused = await worker.call("store_put", {**decide, "based_on": snapshot["version"]})
        err = refused["error"]
        assert err["code"] == "STALE_VERSION", refused
        assert err["expected_version"] == snapshot["version"]
        assert err["current_version"] > snapshot["version"]
        assert (await store.run_info("r")).head == head, "the refused put was journaled"
        # the worker asks what moved since its read, compactly: who changed which key
        moved = await worker.call("store_changes", {"since_version": since})
        assert [(c["collection"], c["keys"], c["agent"]) for c in moved["changes"]] == [
            ("plan", ["target"], "planner")
        ]
        assert moved["version"] > since
        # re-read, decide on the fresh view, and the write goes through
        fresh = await worker.call("store_get", {**PLAN, "key": "target"})
        assert fresh["value"] == "service-b"
        ok = await worker.call(
            "store_put",
            {**PLAN, "key": "deployed", "value": fresh["value"],
             "based_on": fresh["collection_version"]},
        )  # fmt: skip
        assert ok["ok"], ok
        assert (await planner.call("store_get", {**PLAN, "key": "deployed"}))["value"] == (
            "service-b"
        )


async def test_a_later_page_says_the_collection_moved_since_the_first() -> None:
    """Paging a collection that changes meanwhile is no silent mix: the next page says
    ``changed_since_cursor`` and the agent can start over."""
    async with crdtstore.open_store("memory://") as store, AsyncExitStack() as stack:
        planner = await _open(stack, store, "planner")
        rec = await stack.enter_async_context(store.open_record(run="r", agent="worker"))
        worker = await stack.enter_async_context(Toolset(rec, page_size=2))
        for n in range(5):
            await planner.call("store_put", {**PLAN, "key": f"step{n}", "value": n})
        first = await worker.call("store_get", PLAN)
        assert first["next_cursor"] is not None, first
        steady = await worker.call("store_get", {**PLAN, "cursor": first["next_cursor"]})
        assert steady["changed_since_cursor"] is False
        await planner.call("store_put", {**PLAN, "key": "step0", "value": "moved"})
        moved = await worker.call("store_get", {**PLAN, "cursor": first["next_cursor"]})
        assert moved["changed_since_cursor"] is True, moved


async def test_negative_control_a_plain_read_misses_the_move() -> None:
    """The failure mode: the agent keeps its snapshot, asks nothing and writes without
    ``based_on``; the stale decision goes in while the plan says otherwise."""
    async with crdtstore.open_store("memory://") as store, AsyncExitStack() as stack:
        planner, worker = await _open(stack, store, "planner"), await _open(stack, store, "worker")
        await planner.call("store_put", {**PLAN, "key": "target", "value": "service-a"})
        snapshot = await worker.call("store_get", {**PLAN, "key": "target"})
        await planner.call("store_put", {**PLAN, "key": "target", "value": "service-b"})
        assert snapshot["value"] == "service-a"  # a read result does not change afterwards
        acted = await worker.call(
            "store_put", {**PLAN, "key": "deployed", "value": snapshot["value"]}
        )
        assert acted["ok"], acted
        plan = await planner.call("store_get", PLAN)
        values = {e["key"]: e["value"] for e in plan["entries"]}
        assert values == {"target": "service-b", "deployed": "service-a"}, "acted on stale view"
