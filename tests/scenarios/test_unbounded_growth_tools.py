"""Failure mode 5, unbounded-growth, through the agent tools: the record grows until it no
longer fits the context of the agent that must summarise it. ``store_describe`` tells the
agent each collection's budgets, size and token estimate before it writes; a write past a
budget is refused (BUDGET_EXCEEDED) and writes nothing; a collection larger than one result
comes back in pages, each within ``max_result_tokens``, never cut silently."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from typing import Any

import pytest

import crdtstore
from crdtstore import CollectionSpec
from crdtstore.tools import Toolset

pytestmark = pytest.mark.anyio

CONTEXT_TOKENS = 200
SCHEMA = {
    "findings": CollectionSpec(kind="list", max_bytes=CONTEXT_TOKENS * 4),
    "facts": CollectionSpec(kind="map", max_entries=3, max_bytes=400),
}


async def _open(
    stack: AsyncExitStack, store: crdtstore.Store, agent: str, **options: Any
) -> Toolset:
    rec = await stack.enter_async_context(store.open_record(run="r", agent=agent, schema=SCHEMA))
    return await stack.enter_async_context(Toolset(rec, **options))


def _tokens(result: Any) -> float:
    return len(json.dumps(result, ensure_ascii=False, separators=(",", ":")).encode()) / 4


async def test_describe_tells_the_budget_and_a_write_past_it_is_refused() -> None:
    async with crdtstore.open_store("memory://") as store, AsyncExitStack() as stack:
        agent = await _open(stack, store, "agent")
        described = await agent.call("store_describe", {})
        info = described["collections"]["findings"]
        assert info["budgets"]["max_bytes"] == CONTEXT_TOKENS * 4
        assert info["size"] == {"entries": 0, "bytes": 0, "tokens": 0}
        summarised_at = None
        for i in range(1000):
            # the summariser is scheduled before the limit, from describe, not after it
            size = (await agent.call("store_describe", {}))["collections"]["findings"]["size"]
            if size["tokens"] > CONTEXT_TOKENS * 0.8:
                summarised_at = i
                break
            value = f"finding number {i}: something worth knowing"
            assert (await agent.call("store_append", {"collection": "findings", "value": value}))[
                "ok"
            ]
        assert summarised_at is not None
        # had nobody looked, the budget refuses the write that would overflow, and nothing
        # is written
        refused = None
        for j in range(100):
            head = (await store.run_info("r")).head
            value = f"finding number {summarised_at + j}: something worth knowing"
            got = await agent.call("store_append", {"collection": "findings", "value": value})
            if "error" in got:
                refused = got["error"]
                assert (await store.run_info("r")).head == head, "the refused append was journaled"
                break
        assert refused is not None
        assert refused["code"] == "BUDGET_EXCEEDED", refused
        assert (refused["budget"], refused["limit"]) == ("bytes", CONTEXT_TOKENS * 4)
        size = (await agent.call("store_describe", {}))["collections"]["findings"]["size"]
        assert size["bytes"] <= CONTEXT_TOKENS * 4
        page = await agent.call("store_get", {"collection": "findings"})
        assert page["total"] == size["entries"]


async def test_a_map_past_its_entries_or_bytes_budget_refuses_the_put() -> None:
    async with crdtstore.open_store("memory://") as store, AsyncExitStack() as stack:
        a, b = await _open(stack, store, "a"), await _open(stack, store, "b")
        for n, tools in enumerate((a, b, a)):  # two agents fill it together
            put = {"collection": "facts", "key": f"f{n}", "value": n}
            assert (await tools.call("store_put", put))["ok"]
        head = (await store.run_info("r")).head
        refused = await b.call("store_put", {"collection": "facts", "key": "f3", "value": 3})
        err = refused["error"]
        assert err["code"] == "BUDGET_EXCEEDED", refused
        assert (err["budget"], err["used"], err["limit"]) == ("entries", 3, 3)
        assert (await store.run_info("r")).head == head
        assert (await a.call("store_get", {"collection": "facts", "key": "f3"}))["exists"] is False
        # an entry that is there may still change; a value past the bytes budget may not
        assert (await b.call("store_put", {"collection": "facts", "key": "f0", "value": 10}))["ok"]
        big = await b.call("store_put", {"collection": "facts", "key": "f1", "value": "x" * 500})
        assert big["error"]["code"] == "BUDGET_EXCEEDED", big
        assert big["error"]["budget"] == "bytes"
        assert (await a.call("store_get", {"collection": "facts", "key": "f1"}))["value"] == 1
        # making room is a decision: delete, then the put goes in
        assert (await a.call("store_delete", {"collection": "facts", "key": "f2"}))["deleted"]
        assert (await b.call("store_put", {"collection": "facts", "key": "f3", "value": 3}))["ok"]
        described = await a.call("store_describe", {})
        assert described["collections"]["facts"]["size"]["entries"] == 3


async def test_a_large_collection_comes_back_in_pages_within_the_budget() -> None:
    async with crdtstore.open_store("memory://") as store, AsyncExitStack() as stack:
        writer = await _open(stack, store, "writer")
        reader = await _open(stack, store, "reader", max_result_tokens=300)
        log = [{"n": n, "note": f"step {n} of a long run"} for n in range(200)]
        for item in log:
            assert (await writer.call("store_append", {"collection": "log", "value": item}))["ok"]
        described = await reader.call("store_describe", {})
        assert described["collections"]["log"]["size"]["tokens"] > 300  # no single result
        got: list[Any] = []
        args: dict[str, Any] = {"collection": "log"}
        pages = 0
        while True:
            page = await reader.call("store_get", args)
            pages += 1
            assert _tokens(page) <= 300 + 16, _tokens(page)
            assert page["total"] == len(log)
            got += [item["value"] for item in page["items"]]
            if page["next_cursor"] is None:
                break
            assert len(got) < len(log), "a page was cut without a cursor to the rest"
            args["cursor"] = page["next_cursor"]
        assert got == log, "paging lost or repeated an item"
        assert pages > 1


async def test_negative_control_without_a_budget_the_record_outgrows_the_context() -> None:
    """The failure mode: no budget, nobody looks; every append goes in and the collection
    no longer fits the summariser's context."""
    async with crdtstore.open_store("memory://") as store, AsyncExitStack() as stack:
        agent = await _open(stack, store, "agent")
        for i in range(100):
            value = f"finding number {i}: something worth knowing"
            assert (await agent.call("store_append", {"collection": "notes", "value": value}))["ok"]
        size = (await agent.call("store_describe", {}))["collections"]["notes"]["size"]
        assert size["tokens"] > CONTEXT_TOKENS * 4, "the failure mode: it outgrew the context"
