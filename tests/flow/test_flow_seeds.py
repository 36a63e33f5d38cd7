"""Seed 000's regressions, through the kernel: parallel agents finishing out of order then a
resume (replay-clobber), a nested workflow whose agents write concurrently with the parent's
(no collision), agents under a restrictive tool allowlist still get the store tools, one
agent reads what another put, and two runs do not see each other's store."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import crdtstore
from crdtstore.flow import STATE_COLLECTION, JoinFailed, StepContext, flow_status, run_workflow
from tests._wait import until

pytestmark = pytest.mark.anyio

AGENTS = 4


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[crdtstore.Store]:
    async with crdtstore.open_store(f"sqlite:///{tmp_path}/store.db") as s:
        yield s


def _done(ctx: StepContext, path: str) -> bool:
    entry = ctx.record.map(STATE_COLLECTION).get(path)
    return entry is not None and entry["state"] == "done"


def agent_step(id: str, fn: Any, **more: Any) -> dict[str, Any]:
    return {"id": id, "kind": "agent", "call": fn, "tools": [], **more}


@pytest.mark.parametrize("order", list(itertools.permutations(range(3)))[::2])
async def test_parallel_agents_out_of_order_then_resume_lose_nothing(
    store: crdtstore.Store, order: tuple[int, ...]
) -> None:
    """Agents finish in ``order``; the last to finish fails once, so the run is resumed.
    After the resume every agent's write is there, each once, and the finished ones did not
    run again (the seed replayed whole-map snapshots by replacement and dropped writes)."""
    turn = [anyio.Event() for _ in range(AGENTS)]
    ran: list[str] = []
    fail_once = {f"p/a{order[-1]}"}

    async def agent(ctx: StepContext) -> str:
        i = int(ctx.step[-1])
        ran.append(ctx.step)
        put = {"collection": "shared", "key": f"result-{i}", "value": f"found by {i}"}
        out = await ctx.call_tool("store_put", put, call_id="c0")
        assert "error" not in out, out
        await ctx.call_tool("store_append", {"collection": "log", "value": ctx.call_id})
        await ctx.call_tool("store_put", {"collection": "shared", "key": "contested",
                                          "value": i})  # fmt: skip
        if ctx.step in fail_once:
            fail_once.clear()
            raise RuntimeError("the model gave up")
        return ctx.step

    async def finisher(ctx: StepContext) -> None:
        for i in order[:-1]:  # release the agents one by one, in `order`, each to its end
            turn[i].set()
            await until(lambda i=i: _done(ctx, f"p/a{i}"), f"a{i} to be done")
        turn[order[-1]].set()

    async def gated(ctx: StepContext) -> str:
        await turn[int(ctx.step[-1])].wait()
        return await agent(ctx)

    branches = [agent_step(f"a{i}", gated) for i in range(3)]
    branches.append({"id": "go", "kind": "python", "call": finisher})
    spec = {"name": "fanout", "steps": [{"id": "p", "kind": "parallel", "branches": branches}]}
    with pytest.raises(JoinFailed):
        await run_workflow(store, spec, "r1")
    for e in turn:
        e.set()
    await run_workflow(store, spec, "r1")
    # the finished agents were not run again; the failed one ran twice
    assert sorted(ran) == sorted([f"p/a{i}" for i in range(3)] + [f"p/a{order[-1]}"])
    async with store.open_record("r1", "reader") as rec:
        shared = rec.map("shared").to_dict()
        assert {k: v for k, v in shared.items() if k != "contested"} == {
            f"result-{i}": f"found by {i}" for i in range(3)
        }
        assert shared["contested"] in range(3)
        log = rec.list("log").to_list()
        # every attempt's append once: the failed attempt's is kept and marked #1
        last = order[-1]
        assert sorted(log) == sorted([f"r1:p/a{i}#1" for i in range(3)] + [f"r1:p/a{last}#2"])
        hist = await rec.map("shared").history(f"result-{last}")
        assert [h.provenance.call for h in hist] == [f"r1:p/a{last}#1/c0", f"r1:p/a{last}#2/c0"]


async def test_nested_workflow_agents_write_concurrently_with_the_parents(
    store: crdtstore.Store,
) -> None:
    """Seed 000 keyed deltas by call index, which a nested run restarted at 0, so a parent
    agent and a nested agent running at once clobbered each other. Here both are the first
    call of their run, write the same keys at the same time, and keep apart."""
    both = anyio.Event()
    arrived = 0

    async def agent(ctx: StepContext) -> str:
        nonlocal arrived
        arrived += 1
        if arrived == 2:
            both.set()
        with anyio.fail_after(10):
            await both.wait()  # the two write at the same time
        for k in range(5):
            await ctx.call_tool("store_put", {"collection": "deltas", "key": f"{ctx.run}:{k}",
                                              "value": ctx.step})  # fmt: skip
            await ctx.call_tool("store_append", {"collection": "log", "value": ctx.step})
        return ctx.call_id

    spec = {"name": "nest", "steps": [{"id": "p", "kind": "parallel", "branches": [
        agent_step("parent", agent),
        {"id": "sub", "kind": "workflow", "steps": [agent_step("child", agent)]}]}]}  # fmt: skip
    result = await run_workflow(store, spec, "r1")
    assert result["p"]["results"] == {"parent": "r1:p/parent#1",
                                      "sub": {"child": "r1:p/sub/child#1"}}  # fmt: skip
    async with store.open_record("r1", "reader") as rec:
        deltas = rec.map("deltas").to_dict()
        assert deltas == {**{f"r1:{k}": "p/parent" for k in range(5)},
                          **{f"r1.sub:{k}": "p/sub/child" for k in range(5)}}  # fmt: skip
        assert sorted(rec.list("log").to_list()) == sorted(["p/parent"] * 5 + ["p/sub/child"] * 5)
        prov = rec.map("deltas").provenance("r1.sub:0")
        assert prov is not None and prov.run == "r1.sub"
        assert rec.map("deltas").provenance("r1:0").run == "r1"  # type: ignore[union-attr]
    entries = await store.journal("r1")
    calls = {e.call for e in entries if e.effect and e.effect[0][1] == "deltas"}
    assert calls == {"r1:p/parent#1", "r1:p/sub/child#1"}


async def test_restrictive_agents_still_talk_through_the_store(store: crdtstore.Store) -> None:
    """Agent A puts a value with store_put; agent B, allowed no tools of its own, gets it
    with store_get; a missing key reads back as absent, not as an error."""
    seen: dict[str, Any] = {}

    async def a(ctx: StepContext) -> None:
        seen["a_tools"] = {t["function"]["name"] for t in ctx.tool_schemas}
        await ctx.call_tool("store_put", {"collection": "shared", "key": "plan", "value": "v1"})

    async def b(ctx: StepContext) -> Any:
        seen["b_allowed"] = ctx.allowed_tools
        got = await ctx.call_tool("store_get", {"collection": "shared", "key": "plan"})
        missing = await ctx.call_tool("store_get", {"collection": "shared", "key": "nope"})
        return {"value": got.get("value"), "missing": missing}

    spec = {"name": "talk", "steps": [agent_step("a", a), agent_step("b", b, tools=["web"])]}
    result = await run_workflow(store, spec, "r1")
    assert {"store_put", "store_get"} <= seen["a_tools"]
    assert seen["b_allowed"] == ["web"]
    assert result["b"]["value"] == "v1"
    missing = result["b"]["missing"]
    assert "error" not in missing and missing["exists"] is False and missing["value"] is None
    # another run does not see it
    out = await run_workflow(store, {"name": "talk", "steps": [agent_step("b", b)]}, "r2")
    assert out["b"]["value"] is None
    assert (await flow_status(store, "r2")).run.state == "done"  # type: ignore[union-attr]
