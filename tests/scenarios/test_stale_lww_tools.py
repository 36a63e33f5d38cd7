"""Failure mode 3, stale-lww, through the agent tools: last-writer-wins keeps a stale value
because the writer with the stale value finished second. A guarded ``store_put`` (the
``version`` its read returned, echoed as ``expected_version``) is refused with STALE_VERSION
and the current version and value, and writes nothing; after a re-read the retry succeeds."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import pytest

import crdtstore
from crdtstore import CollectionSpec
from crdtstore.tools import Toolset

pytestmark = pytest.mark.anyio

POP = {"collection": "facts", "key": "population"}


async def _open(
    stack: AsyncExitStack,
    store: crdtstore.Store,
    agent: str,
    schema: dict[str, CollectionSpec] | None = None,
) -> Toolset:
    rec = await stack.enter_async_context(store.open_record(run="r", agent=agent, schema=schema))
    return await stack.enter_async_context(Toolset(rec))


async def test_a_guarded_put_on_an_old_version_is_refused_then_retried(tmp_path: Path) -> None:
    async with (
        crdtstore.open_store(f"sqlite:///{tmp_path}/store.db") as store,
        AsyncExitStack() as stack,
    ):
        checker, slow = await _open(stack, store, "checker"), await _open(stack, store, "slow")
        first = await checker.call("store_put", {**POP, "value": 7_900_000, "expected_version": 0})
        assert first["ok"], first
        seen = await slow.call("store_get", POP)  # the slow agent reads...
        assert seen["value"] == 7_900_000
        read = await checker.call("store_get", POP)
        fixed = await checker.call(
            "store_put", {**POP, "value": 8_100_000, "expected_version": read["version"]}
        )
        assert fixed["ok"], fixed
        head = (await store.run_info("r")).head
        # ...and finishes second, echoing the version it read
        stale = {**POP, "value": 7_900_000, "expected_version": seen["version"]}
        refused = await slow.call("store_put", stale)
        err = refused["error"]
        assert err["code"] == "STALE_VERSION", refused
        assert err["expected_version"] == seen["version"]
        assert err["current"] == {"version": fixed["version"], "value": 8_100_000}
        assert (await store.run_info("r")).head == head, "the refused put was journaled"
        assert (await checker.call("store_get", POP))["value"] == 8_100_000
        # what the error tells it to do: re-read, decide again, retry on the fresh version
        again = await slow.call("store_get", POP)
        assert again["version"] == err["current"]["version"]
        retry = await slow.call(
            "store_put", {**POP, "value": 8_100_001, "expected_version": again["version"]}
        )
        assert retry["ok"], retry
        assert (await checker.call("store_get", POP))["value"] == 8_100_001


async def test_a_guarded_delete_on_an_old_version_is_refused() -> None:
    async with crdtstore.open_store("memory://") as store, AsyncExitStack() as stack:
        a, b = await _open(stack, store, "a"), await _open(stack, store, "b")
        await a.call("store_put", {**POP, "value": 1})
        seen = await b.call("store_get", POP)
        await a.call("store_put", {**POP, "value": 2})
        refused = await b.call("store_delete", {**POP, "expected_version": seen["version"]})
        assert refused["error"]["code"] == "STALE_VERSION", refused
        assert refused["error"]["current"]["value"] == 2
        assert (await a.call("store_get", POP))["value"] == 2


async def test_a_guarded_collection_refuses_a_put_without_a_version() -> None:
    """Under the ``guarded`` policy an agent cannot forget the version: a plain put is
    refused (POLICY_VIOLATION) and writes nothing."""
    schema = {"facts": CollectionSpec(kind="map", policy="guarded")}
    async with crdtstore.open_store("memory://") as store, AsyncExitStack() as stack:
        a = await _open(stack, store, "a", schema)
        assert (await a.call("store_put", {**POP, "value": 1, "expected_version": 0}))["ok"]
        head = (await store.run_info("r")).head
        refused = await a.call("store_put", {**POP, "value": 2})
        assert refused["error"]["code"] == "POLICY_VIOLATION", refused
        assert refused["error"]["policy"] == "guarded"
        assert (await store.run_info("r")).head == head
        assert (await a.call("store_get", POP))["value"] == 1


async def test_negative_control_an_unguarded_put_clobbers_the_correction() -> None:
    """The failure mode: without ``expected_version`` the stale value wins; the correction
    survives only in store_history (I2 under lww)."""
    async with crdtstore.open_store("memory://") as store, AsyncExitStack() as stack:
        checker, slow = await _open(stack, store, "checker"), await _open(stack, store, "slow")
        await checker.call("store_put", {**POP, "value": 7_900_000})
        assert (await slow.call("store_get", POP))["value"] == 7_900_000
        await checker.call("store_put", {**POP, "value": 8_100_000})
        clobber = await slow.call("store_put", {**POP, "value": 7_900_000})
        assert clobber["ok"], clobber
        assert (await checker.call("store_get", POP))["value"] == 7_900_000, "stale value won"
        history = await checker.call("store_history", POP)
        assert [(e["agent"], e["value"]) for e in history["entries"]] == [
            ("checker", 7_900_000),
            ("checker", 8_100_000),
            ("slow", 7_900_000),
        ]
