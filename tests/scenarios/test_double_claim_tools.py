"""Failure mode 1, double-claim, through the agent tools: two agents read the work list, both
take the first unclaimed item, and both do it. ``store_claim`` lets exactly one of them have
it; the other gets LEASE_HELD naming the holder, and a done item cannot be claimed again."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest

import crdtstore
from crdtstore.tools import Toolset

pytestmark = pytest.mark.anyio


async def _open(stack: AsyncExitStack, store: crdtstore.Store, agent: str) -> Toolset:
    rec = await stack.enter_async_context(store.open_record(run="r", agent=agent))
    return await stack.enter_async_context(Toolset(rec))


async def _together(*calls: tuple[Toolset, str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls at the same time, one task each."""
    results: list[dict[str, Any]] = [{} for _ in calls]

    async def one(n: int) -> None:
        tools, name, args = calls[n]
        results[n] = await tools.call(name, args)

    async with anyio.create_task_group() as tg:
        for n in range(len(calls)):
            tg.start_soon(one, n)
    return results


async def test_two_concurrent_claims_one_wins_the_other_is_told_who(tmp_path: Path) -> None:
    async with (
        crdtstore.open_store(f"sqlite:///{tmp_path}/store.db") as store,
        AsyncExitStack() as stack,
    ):
        a, b = await _open(stack, store, "agent-a"), await _open(stack, store, "agent-b")
        for n in range(8):  # the race, several times: never two winners, never none
            item = {"collection": "tasks", "item": f"t{n}", "ttl": 30}
            ra, rb = await _together((a, "store_claim", item), (b, "store_claim", item))
            oks = [r for r in (ra, rb) if r.get("ok")]
            assert len(oks) == 1, (ra, rb)
            winner, loser = (a, b) if ra.get("ok") else (b, a)
            refused = rb if ra.get("ok") else ra
            assert refused["error"]["code"] == "LEASE_HELD", refused
            assert refused["error"]["holder"] == winner.record.agent, refused
            assert refused["error"]["queue_position"] >= 1
            # while the winner holds it, the loser's retry is refused the same way
            again = await loser.call("store_claim", item)
            assert again["error"]["code"] == "LEASE_HELD", again
            done = await winner.call(
                "store_complete", {"collection": "tasks", "item": f"t{n}", "result": n}
            )
            assert done == {"ok": True, "collection": "tasks", "item": f"t{n}", "state": "done"}
            # done is done: nobody claims it again, the winner included
            for tools in (loser, winner):
                late = await tools.call("store_claim", item)
                assert late["error"]["code"] == "LEASE_HELD", late
                assert late["error"]["holder"] == winner.record.agent, late
            entry = await loser.call("store_get", {"collection": "claims", "key": f"tasks/t{n}"})
            assert entry["value"]["state"] == "done", entry
            assert entry["value"]["claimer"] == winner.record.agent
            assert entry["value"]["result"] == n


async def test_a_released_item_can_be_claimed_by_the_other() -> None:
    async with crdtstore.open_store("memory://") as store, AsyncExitStack() as stack:
        a, b = await _open(stack, store, "agent-a"), await _open(stack, store, "agent-b")
        item = {"collection": "tasks", "item": "t0"}
        assert (await a.call("store_claim", item))["ok"]
        assert (await b.call("store_claim", item))["error"]["code"] == "LEASE_HELD"
        # only the holder completes or releases; the other is told it holds nothing
        refused = await b.call("store_complete", {**item, "result": "mine"})
        assert refused["error"]["code"] == "LEASE_NOT_FOUND", refused
        assert (await a.call("store_release", item))["state"] == "released"
        got = await b.call("store_claim", item)
        assert got["ok"], got
        assert (await b.call("store_complete", {**item, "result": "b did it"}))["ok"]
        entry = await a.call("store_get", {"collection": "claims", "key": "tasks/t0"})
        assert entry["value"]["claimer"] == "agent-b"
        assert entry["value"]["result"] == "b did it"


async def test_every_item_is_done_exactly_once_through_the_tools(tmp_path: Path) -> None:
    items = [f"t{i}" for i in range(10)]
    done_by: dict[str, list[str]] = {i: [] for i in items}
    async with (
        crdtstore.open_store(f"sqlite:///{tmp_path}/store.db") as store,
        AsyncExitStack() as stack,
    ):
        planner = await _open(stack, store, "planner")
        for i in items:
            await planner.call("store_put", {"collection": "tasks", "key": i, "value": {"n": i}})

        async def agent(name: str) -> None:
            async with store.open_record(run="r", agent=name) as rec, Toolset(rec) as tools:
                while True:
                    tasks = await tools.call("store_get", {"collection": "tasks"})
                    claims = await tools.call("store_get", {"collection": "claims"})
                    taken = {
                        e["key"]
                        for e in claims["entries"]
                        if e["value"]["state"] in ("claimed", "done")
                    }
                    todo = sorted(
                        e["key"] for e in tasks["entries"] if f"tasks/{e['key']}" not in taken
                    )
                    if not todo:
                        return
                    # every agent goes for the first unclaimed item: the race in question
                    got = await tools.call("store_claim", {"collection": "tasks", "item": todo[0]})
                    if "error" in got:
                        assert got["error"]["code"] == "LEASE_HELD", got
                        continue
                    done_by[todo[0]].append(name)
                    result = {"collection": "tasks", "item": todo[0], "result": name}
                    assert (await tools.call("store_complete", result))["ok"]

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for n in range(4):
                    tg.start_soon(agent, f"agent{n}")
        claims = await planner.call("store_get", {"collection": "claims"})
        by_key = {e["key"]: e["value"] for e in claims["entries"]}
        for item in items:
            assert len(done_by[item]) == 1, (item, done_by[item])
            assert by_key[f"tasks/{item}"]["state"] == "done"
            assert by_key[f"tasks/{item}"]["result"] == done_by[item][0]


async def test_negative_control_marking_an_item_with_a_plain_put_is_a_double_claim() -> None:
    """Without store_claim: both agents read the list, see t0 free, mark it theirs with a
    plain put (never refused) and both go ahead."""
    async with crdtstore.open_store("memory://") as store, AsyncExitStack() as stack:
        a, b = await _open(stack, store, "agent-a"), await _open(stack, store, "agent-b")
        await a.call("store_put", {"collection": "tasks", "key": "t0", "value": {"owner": None}})
        views = [await t.call("store_get", {"collection": "tasks", "key": "t0"}) for t in (a, b)]
        assert all(v["value"]["owner"] is None for v in views)  # both see it free
        doing = []
        for tools in (a, b):
            mark = {"collection": "tasks", "key": "t0", "value": {"owner": tools.record.agent}}
            if (await tools.call("store_put", mark)).get("ok"):
                doing.append(tools.record.agent)
        assert doing == ["agent-a", "agent-b"], "the failure mode: both took the item"
