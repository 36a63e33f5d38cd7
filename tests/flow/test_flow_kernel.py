"""The kernel in one process: every executor kind, each join with successes, failures and
cancellations, max_concurrency counted inside the branches, retries, timeouts, nested
workflows, the state entries, resume of a finished or failed run, and spec changes."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

import crdtstore
from crdtstore.flow import (
    KERNEL_AGENT,
    STATE_COLLECTION,
    JoinFailed,
    KernelBusy,
    SpecChanged,
    StepContext,
    StepEntry,
    StepFailed,
    StepTimeout,
    flow_status,
    run_workflow,
)
from tests._wait import until

pytestmark = pytest.mark.anyio

PY = sys.executable


@pytest.fixture
async def store() -> AsyncIterator[crdtstore.Store]:
    async with crdtstore.open_store("memory://") as s:
        yield s


def wf(*steps: dict[str, Any], name: str = "w") -> dict[str, Any]:
    return {"name": name, "steps": list(steps)}


def py(id: str, fn: Any, **more: Any) -> dict[str, Any]:
    return {"id": id, "kind": "python", "call": fn, **more}


def par(id: str, branches: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"id": id, "kind": "parallel", "branches": branches, **more}


class Calls:
    """Counts the bodies that ran, by step path."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def count(self, path: str) -> int:
        return self.paths.count(path)


async def entries(store: crdtstore.Store, run: str) -> dict[str, StepEntry]:
    status = await flow_status(store, run)
    return {s.entry.path: s.entry for s in status.steps}


# -- python and agent steps ---------------------------------------------------------------------


async def test_python_step_context_writes_and_results(store: crdtstore.Store) -> None:
    seen: dict[str, Any] = {}

    async def first(ctx: StepContext) -> dict[str, int]:
        await ctx.map("findings").set("f1", {"by": ctx.step})
        await ctx.list("log").append(ctx.call_id)
        return {"n": 1}

    async def second(ctx: StepContext) -> str:
        seen.update(inputs=ctx.inputs, results=ctx.results, run=ctx.run, agent=ctx.agent,
                    attempt=ctx.attempt, tools=ctx.tool_schemas)  # fmt: skip
        return "ok"

    spec = wf(py("first", first), py("second", second, inputs={"k": [1, 2]}))
    result = await run_workflow(store, spec, "r1")
    assert result == {"first": {"n": 1}, "second": "ok"}
    assert seen == {"inputs": {"k": [1, 2]}, "results": {"first": {"n": 1}}, "run": "r1",
                    "agent": "w", "attempt": 1, "tools": []}  # fmt: skip
    async with store.open_record("r1", "reader") as rec:
        assert rec.list("log").to_list() == ["r1:first#1"]
        prov = rec.map("findings").provenance("f1")
        assert prov is not None and prov.agent == "w" and prov.source == "tool"
        hist = await rec.map("findings").history("f1")
        assert hist[0].provenance.call == "r1:first#1"
        # the kernel's state: one entry per step, owned by the kernel's agent
        assert rec.spec(STATE_COLLECTION) is not None
        assert rec.spec(STATE_COLLECTION).policy == "owner"  # type: ignore[union-attr]
        assert rec.map(STATE_COLLECTION).provenance("first").agent == KERNEL_AGENT  # type: ignore[union-attr]
        with pytest.raises(crdtstore.PolicyViolation):
            await rec.map(STATE_COLLECTION).set("first", {"state": "pending"})
    e = (await entries(store, "r1"))["first"]
    assert (e.state, e.attempt, e.call, e.run, e.kind) == ("done", 1, "r1:first#1", "r1", "python")
    assert e.started is not None and e.ended is not None and e.ended >= e.started


async def test_agent_step_gets_store_tools_under_a_restrictive_allowlist(
    store: crdtstore.Store,
) -> None:
    """Seed 000: store tools reach every agent, even one whose tool allowlist is empty."""
    got: dict[str, Any] = {}

    async def agent(ctx: StepContext) -> Any:
        names = {t["function"]["name"] for t in ctx.tool_schemas}
        got["names"], got["allowed"] = names, ctx.allowed_tools
        put = await ctx.call_tool("store_put", {"collection": "notes", "key": "k", "value": 7},
                                  call_id="tc1")  # fmt: skip
        back = await ctx.call_tool("store_get", {"collection": "notes", "key": "k"})
        return {"put": "error" not in put, "value": back.get("value")}

    spec = wf({"id": "a", "kind": "agent", "call": agent, "tools": []})
    result = await run_workflow(store, spec, "r1")
    assert {"store_put", "store_get", "store_append"} <= got["names"]
    assert got["allowed"] == []
    assert result["a"] == {"put": True, "value": 7}
    async with store.open_record("r1", "reader") as rec:
        hist = await rec.map("notes").history("k")
        assert hist[0].provenance.call == "r1:a#1/tc1"
        assert hist[0].provenance.source == "model"


async def test_agent_schemas_in_each_format(store: crdtstore.Store) -> None:
    got: dict[str, list[dict[str, Any]]] = {}

    async def agent(ctx: StepContext) -> None:
        got[ctx.step] = ctx.tool_schemas

    spec = wf(*({"id": f, "kind": "agent", "call": agent, "tools_format": f, "needs": []}
                for f in ("openai", "anthropic", "mcp")))  # fmt: skip
    await run_workflow(store, spec, "r1")
    assert "function" in got["openai"][0]
    assert "input_schema" in got["anthropic"][0]
    assert "inputSchema" in got["mcp"][0]
    assert len(got["openai"]) == len(got["anthropic"]) == len(got["mcp"]) >= 10


async def test_a_step_with_a_view_sees_only_its_slice(store: crdtstore.Store) -> None:
    async def scoped(ctx: StepContext) -> str:
        await ctx.map("findings").set("net/1", "x")
        with pytest.raises(crdtstore.PolicyViolation):
            await ctx.map("findings").set("disk/1", "y")
        out = await ctx.call_tool("store_put", {"collection": "other", "key": "k", "value": 1})
        return str(out["error"]["code"])

    result = await run_workflow(store, wf(py("s", scoped, view=["findings/net/*"])), "r1")
    assert result == {"s": "POLICY_VIOLATION"}


# -- script steps -------------------------------------------------------------------------------


async def test_script_step_environment_and_result(store: crdtstore.Store) -> None:
    code = ("import os; print(*[os.environ[k] for k in ('CRDTSTORE_STORE', 'CRDTSTORE_RUN', "
            "'CRDTSTORE_STEP', 'CRDTSTORE_AGENT', 'CRDTSTORE_CALL', 'CRDTSTORE_ATTEMPT')]);"
            "print('warn', file=__import__('sys').stderr)")  # fmt: skip
    spec = wf({"id": "s", "kind": "script", "run": [PY, "-c", code]})
    result = await run_workflow(store, spec, "r1")
    out = result["s"]
    assert out["exit_code"] == 0 and out["stderr"] == "warn" and out["duration"] > 0
    assert out["stdout"].split() == ["memory://", "r1", "s", "w", "r1:s#1", "1"]


async def test_script_failure_and_output_tail(store: crdtstore.Store) -> None:
    code = "import sys\nfor i in range(50): print(i)\nsys.exit(3)"
    spec = wf({"id": "s", "kind": "script", "run": [PY, "-c", code], "tail": 5})
    with pytest.raises(StepFailed) as info:
        await run_workflow(store, spec, "r1")
    assert info.value.step == "s" and info.value.error["code"] == "EXIT_STATUS"  # type: ignore[index]
    assert info.value.result["exit_code"] == 3
    assert info.value.result["stdout"].split() == ["45", "46", "47", "48", "49"]
    e = (await entries(store, "r1"))["s"]
    assert e.state == "failed" and e.error is not None and e.result["exit_code"] == 3
    st = (await flow_status(store, "r1")).run
    assert st is not None and st.state == "failed" and st.error["code"] == "STEP_FAILED"  # type: ignore[index]


async def test_script_timeout_kills_the_process_group(
    store: crdtstore.Store, tmp_path: Any
) -> None:
    marker = tmp_path / "child.pid"
    code = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
            f"'import time; time.sleep(60)']); open({str(marker)!r}, 'w').write(str(p.pid)); "
            f"time.sleep(60)")  # fmt: skip
    spec = wf({"id": "s", "kind": "script", "run": [PY, "-c", code], "timeout": 1.0})
    with pytest.raises(StepTimeout) as info:
        await run_workflow(store, spec, "r1")
    assert info.value.timeout == 1.0 and info.value.code == "STEP_TIMEOUT"
    child = int(marker.read_text())

    def gone() -> bool:
        try:
            with open(f"/proc/{child}/stat") as f:
                return f.read().split()[2] == "Z"
        except FileNotFoundError:
            return True

    await until(gone, "the script's child to be killed")


# -- joins and concurrency ----------------------------------------------------------------------


Plan = dict[str, tuple[str | None, str]]


def branch_fns(calls: Calls, plan: Plan) -> list[dict[str, Any]]:
    """A branch per entry: (the branch whose end it waits for, in the kernel's state as every
    agent sees it, or None; then ``ok``, ``fail`` or ``hang``). Orders are conditions, not
    delays, so that a loaded machine cannot reorder them."""

    async def body(ctx: StepContext) -> str:
        calls.paths.append(ctx.step)
        after, then = plan[ctx.step.rsplit("/", 1)[1]]
        if after is not None:

            def ended(after: str = after) -> bool:
                entry = ctx.record.map(STATE_COLLECTION).get(f"p/{after}")
                return entry is not None and entry["state"] in ("done", "failed")

            await until(ended, f"{after} to end")
        if then == "hang":
            await anyio.sleep(60)
        if then == "fail":
            raise ValueError(f"{ctx.step} fails")
        return ctx.step

    return [py(b, body) for b in plan]


async def test_join_all_done(store: crdtstore.Store) -> None:
    calls = Calls()
    plan: Plan = {"a": ("b", "ok"), "b": (None, "ok"), "c": ("b", "ok")}
    result = await run_workflow(store, wf(par("p", branch_fns(calls, plan))), "r1")
    assert result["p"] == {"join": "all", "results": {"a": "p/a", "b": "p/b", "c": "p/c"},
                           "outcomes": {"a": "done", "b": "done", "c": "done"}}  # fmt: skip


async def test_join_all_fails_at_the_first_failure_and_cancels_the_rest(
    store: crdtstore.Store,
) -> None:
    calls = Calls()
    plan: Plan = {"a": (None, "ok"), "b": ("a", "fail"), "c": (None, "hang")}
    with anyio.fail_after(20):
        with pytest.raises(StepFailed) as info:
            await run_workflow(store, wf(par("p", branch_fns(calls, plan))), "r1")
    err = info.value
    assert isinstance(err, JoinFailed)
    assert err.outcomes["a"]["state"] == "done"
    assert (
        err.outcomes["b"]["state"] == "failed" and "fails" in err.outcomes["b"]["error"]["message"]
    )
    assert err.outcomes["c"] == {"state": "cancelled"}
    e = await entries(store, "r1")
    assert (e["p/a"].state, e["p/b"].state, e["p/c"].state, e["p"].state) == (
        "done", "failed", "cancelled", "failed")  # fmt: skip
    assert e["p"].error is not None and e["p"].error["code"] == "JOIN_FAILED"


async def test_join_any_done_at_the_first_success(store: crdtstore.Store) -> None:
    calls = Calls()
    plan: Plan = {"slow": (None, "hang"), "bad": (None, "fail"), "fast": ("bad", "ok")}
    spec = wf(par("p", branch_fns(calls, plan), join="any"))
    with anyio.fail_after(20):
        result = await run_workflow(store, spec, "r1")
    assert result["p"]["results"] == {"fast": "p/fast"}
    assert result["p"]["outcomes"] == {"slow": "cancelled", "bad": "failed", "fast": "done"}


async def test_join_any_fails_when_every_branch_failed(store: crdtstore.Store) -> None:
    calls = Calls()
    plan: Plan = {"a": (None, "fail"), "b": ("a", "fail")}
    with pytest.raises(JoinFailed) as info:
        await run_workflow(store, wf(par("p", branch_fns(calls, plan), join="any")), "r1")
    assert info.value.join == "any" and set(info.value.outcomes) == {"a", "b"}
    assert {o["state"] for o in info.value.outcomes.values()} == {"failed"}


async def test_join_at_least(store: crdtstore.Store) -> None:
    calls = Calls()
    plan: Plan = {"a": (None, "ok"), "b": ("a", "ok"), "c": (None, "hang"), "d": (None, "fail")}
    spec = wf(par("p", branch_fns(calls, plan), join={"at_least": 2}))
    with anyio.fail_after(20):
        result = await run_workflow(store, spec, "r2")
    assert set(result["p"]["results"]) == {"a", "b"}
    assert result["p"]["outcomes"]["c"] == "cancelled"
    # failed as soon as 2 successes became impossible, without waiting for the slow one
    plan = {"a": (None, "fail"), "b": ("a", "fail"), "c": (None, "hang")}
    spec = wf(par("p", branch_fns(calls, plan), join={"at_least": 2}))
    with anyio.fail_after(20), pytest.raises(JoinFailed) as info:
        await run_workflow(store, spec, "r3")
    assert info.value.join == "at_least 2"
    assert info.value.outcomes["c"]["state"] == "cancelled"


async def test_max_concurrency_is_never_exceeded(store: crdtstore.Store) -> None:
    now = peak = 0
    done = 0

    async def body(ctx: StepContext) -> None:
        nonlocal now, peak, done
        now += 1
        peak = max(peak, now)
        # a full wave meets before anyone leaves (the limit is reached, not just respected)
        await until(lambda: now >= 3 or done + now >= 24, "a full wave")
        await anyio.sleep(0.001 * (hash(ctx.step) % 3))
        now -= 1
        done += 1

    spec = wf(par("p", [py(f"b{i}", body) for i in range(24)], max_concurrency=3))
    await run_workflow(store, spec, "r1")
    assert peak == 3 and done == 24


async def test_branch_order_with_max_concurrency_one(store: crdtstore.Store) -> None:
    order: list[str] = []

    async def body(ctx: StepContext) -> None:
        order.append(ctx.step)

    spec = wf(par("p", [py(f"b{i}", body) for i in range(6)], max_concurrency=1))
    await run_workflow(store, spec, "r1")
    assert order == [f"p/b{i}" for i in range(6)]


# -- retries, timeouts, dependencies, nesting ---------------------------------------------------


async def test_retries_are_new_attempts(store: crdtstore.Store) -> None:
    attempts: list[tuple[int, str]] = []

    async def flaky(ctx: StepContext) -> int:
        attempts.append((ctx.attempt, ctx.call_id))
        await ctx.list("log").append(ctx.attempt)
        if ctx.attempt < 3:
            raise RuntimeError("not yet")
        return ctx.attempt

    result = await run_workflow(store, wf(py("s", flaky, retries=2, backoff=0.001)), "r1")
    assert result == {"s": 3}
    assert attempts == [(1, "r1:s#1"), (2, "r1:s#2"), (3, "r1:s#3")]
    async with store.open_record("r1", "reader") as rec:
        # kept and marked: every attempt's writes stay, each with its call id
        assert rec.list("log").to_list() == [1, 2, 3]
        calls = [e.call for e in await rec.journal() if e.effect and e.effect[0][1] == "log"]
        assert calls == ["r1:s#1", "r1:s#2", "r1:s#3"]


async def test_retries_exhausted(store: crdtstore.Store) -> None:
    async def bad(ctx: StepContext) -> None:
        raise RuntimeError(f"attempt {ctx.attempt}")

    with pytest.raises(StepFailed) as info:
        await run_workflow(store, wf(py("s", bad, retries=1, backoff=0)), "r1")
    assert info.value.attempt == 2 and "attempt 2" in str(info.value)
    assert info.value.error == {"code": "EXCEPTION", "type": "RuntimeError", "message": "attempt 2"}


async def test_python_timeout(store: crdtstore.Store) -> None:
    async def slow(ctx: StepContext) -> None:
        await anyio.sleep(30)

    with anyio.fail_after(10), pytest.raises(StepTimeout):
        await run_workflow(store, wf(py("s", slow, timeout=0.05)), "r1")
    assert (await entries(store, "r1"))["s"].error["code"] == "STEP_TIMEOUT"  # type: ignore[index]


async def test_a_result_that_is_not_json_fails_the_step(store: crdtstore.Store) -> None:
    async def odd(ctx: StepContext) -> object:
        return object()

    with pytest.raises(StepFailed) as info:
        await run_workflow(store, wf(py("s", odd)), "r1")
    assert info.value.error["code"] == "INVALID_VALUE"  # type: ignore[index]


async def test_needs_runs_independent_steps_together(store: crdtstore.Store) -> None:
    both = anyio.Event()
    started: list[str] = []

    async def a(ctx: StepContext) -> str:
        started.append(ctx.step)
        if len(started) == 2:
            both.set()
        with anyio.fail_after(10):
            await both.wait()  # only returns if b runs at the same time
        return ctx.step

    async def join(ctx: StepContext) -> Any:
        return ctx.results

    spec = wf(py("a", a), py("b", a, needs=[]), py("c", join, needs=["a", "b"]))
    result = await run_workflow(store, spec, "r1")
    assert result["c"] == {"a": "a", "b": "b"}


async def test_a_failed_step_fails_the_workflow_and_later_steps_stay_pending(
    store: crdtstore.Store,
) -> None:
    async def bad(ctx: StepContext) -> None:
        raise ValueError("no")

    async def never(ctx: StepContext) -> None:
        raise AssertionError("must not run")

    with pytest.raises(StepFailed) as info:
        await run_workflow(store, wf(py("a", bad), py("b", never)), "r1")
    assert info.value.step == "a"
    e = await entries(store, "r1")
    assert (e["a"].state, e["b"].state) == ("failed", "pending")


async def test_nested_workflow_runs_as_a_nested_run(store: crdtstore.Store) -> None:
    async def write(ctx: StepContext) -> str:
        await ctx.map("m").set(ctx.step, ctx.run)
        return ctx.run

    spec = wf(py("top", write),
              {"id": "sub", "kind": "workflow", "steps": [py("inner", write),
               {"id": "deeper", "kind": "workflow", "steps": [py("x", write)]}]})  # fmt: skip
    result = await run_workflow(store, spec, "r1")
    assert result == {"top": "r1", "sub": {"inner": "r1.sub", "deeper": {"x": "r1.sub.deeper"}}}
    async with store.open_record("r1", "reader") as rec:
        prov = rec.map("m").provenance("sub/inner")
        assert prov is not None and prov.run == "r1.sub"
        assert rec.map("m").provenance("sub/deeper/x").run == "r1.sub.deeper"  # type: ignore[union-attr]
    assert (await store.run_info("r1.sub.deeper")).parent == "r1.sub"
    e = await entries(store, "r1")
    assert e["sub/deeper/x"].run == "r1.sub.deeper" and e["sub/deeper/x"].parent == "sub/deeper"


# -- the run as a whole -------------------------------------------------------------------------


async def test_a_finished_run_is_not_run_again(store: crdtstore.Store) -> None:
    calls = Calls()

    async def body(ctx: StepContext) -> int:
        calls.paths.append(ctx.step)
        return 1

    spec = wf(py("a", body), par("p", [py("x", body), py("y", body)]))
    first = await run_workflow(store, spec, "r1")
    again = await run_workflow(store, spec, "r1")
    assert first == again and calls.paths.count("a") == 1 and len(calls.paths) == 3
    run = (await flow_status(store, "r1")).run
    assert run is not None and run.state == "done" and run.starts == 1


async def test_resume_after_a_failure_reruns_only_what_did_not_finish(
    store: crdtstore.Store,
) -> None:
    calls = Calls()
    broken = {"p/y"}

    async def body(ctx: StepContext) -> str:
        calls.paths.append(ctx.step)
        if ctx.step in broken:
            raise RuntimeError("broken")
        return ctx.step

    spec = wf(py("a", body), par("p", [py("x", body), py("y", body)]), py("z", body))
    with pytest.raises(JoinFailed):
        await run_workflow(store, spec, "r1")
    broken.clear()
    result = await run_workflow(store, spec, "r1")
    assert result["z"] == "z"
    assert [calls.count(p) for p in ("a", "p/x", "p/y", "z")] == [1, 1, 2, 1]
    e = await entries(store, "r1")
    assert (e["p/y"].attempt, e["p/y"].call, e["p"].attempt) == (2, "r1:p/y#2", 2)
    run = (await flow_status(store, "r1")).run
    assert run is not None and run.starts == 2 and run.state == "done"


async def test_a_changed_spec_is_refused_unless_allowed(store: crdtstore.Store) -> None:
    async def body(ctx: StepContext) -> int:
        return 1

    async def fail(ctx: StepContext) -> int:
        raise RuntimeError("x")

    with pytest.raises(StepFailed):
        await run_workflow(store, wf(py("a", body), py("b", fail)), "r1")
    changed = wf(py("a", body), py("b", body))
    with pytest.raises(SpecChanged) as info:
        await run_workflow(store, changed, "r1")
    assert info.value.code == "SPEC_CHANGED" and info.value.recorded_hash != info.value.spec_hash
    assert await run_workflow(store, changed, "r1", allow_changed=True) == {"a": 1, "b": 1}


async def test_one_kernel_per_run(store: crdtstore.Store) -> None:
    gate = anyio.Event()

    async def wait(ctx: StepContext) -> None:
        await gate.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_workflow, store, wf(py("a", wait)), "r1")
        await until(lambda: step_state(store, "r1", "a", "running"), "the first kernel")
        with pytest.raises(KernelBusy) as info:
            await run_workflow(store, wf(py("a", wait)), "r1")
        assert info.value.run == "r1" and "flow:r1" in info.value.holder
        gate.set()


async def step_state(store: crdtstore.Store, run: str, path: str, state: str) -> bool:
    try:
        e = (await entries(store, run)).get(path)
    except crdtstore.UnknownRun:
        return False
    return e is not None and e.state == state


async def test_cancelling_the_kernel_records_cancelled_and_releases_leases(
    store: crdtstore.Store,
) -> None:
    started = anyio.Event()

    async def hang(ctx: StepContext) -> None:
        started.set()
        await anyio.sleep(60)

    spec = wf(par("p", [py("a", hang, owned_files=["src/a.py"]), py("b", hang)]))
    async with anyio.create_task_group() as tg:
        tg.start_soon(run_workflow, store, spec, "r1")
        await started.wait()
        tg.cancel_scope.cancel()
    e = await entries(store, "r1")
    assert e["p/a"].state == e["p/b"].state == e["p"].state == "cancelled"
    assert (await flow_status(store, "r1")).run.state == "cancelled"  # type: ignore[union-attr]
    status = await store.leases.status()
    assert not status.holders and not status.waiters


async def test_a_retried_parallel_step_reruns_only_its_unfinished_branches(
    store: crdtstore.Store,
) -> None:
    calls = Calls()

    async def body(ctx: StepContext) -> str:
        calls.paths.append(ctx.step)
        if ctx.step == "p/b" and calls.count("p/b") == 1:
            raise RuntimeError("once")
        return ctx.step

    spec = wf(par("p", [py("a", body), py("b", body)], retries=1, backoff=0))
    result = await run_workflow(store, spec, "r1")
    assert result["p"]["outcomes"] == {"a": "done", "b": "done"}
    assert (calls.count("p/a"), calls.count("p/b")) == (1, 2)
    e = await entries(store, "r1")
    assert (e["p"].attempt, e["p/a"].attempt, e["p/b"].attempt) == (2, 1, 2)


async def test_a_parallel_step_times_out_as_a_whole(store: crdtstore.Store) -> None:
    async def slow(ctx: StepContext) -> None:
        await anyio.sleep(30)

    spec = wf(par("p", [py("a", slow), py("b", slow)], timeout=0.1))
    with anyio.fail_after(10), pytest.raises(StepTimeout) as info:
        await run_workflow(store, spec, "r1")
    assert info.value.step == "p"
    e = await entries(store, "r1")
    assert (e["p"].state, e["p/a"].state, e["p/b"].state) == ("failed", "cancelled", "cancelled")


async def test_state_entries_follow_their_documented_schema(store: crdtstore.Store) -> None:
    async def body(ctx: StepContext) -> int:
        return 1

    await run_workflow(store, wf(py("a", body), par("p", [py("x", body)], join="any")), "r1")
    async with store.open_record("r1", "reader") as rec:
        raw = rec.map(STATE_COLLECTION).to_dict()
    assert set(raw) == {"@run", "a", "p", "p/x"}
    for key, value in raw.items():
        if key != "@run":
            entry = StepEntry.model_validate(value)
            assert entry.path == key and entry.state == "done" and entry.attempt == 1
    assert StepEntry.model_validate(raw["p"]).join == "any"
    assert StepEntry.model_validate(raw["p/x"]).parent == "p"
    assert set(StepEntry.model_json_schema()["properties"]) >= {
        "path", "state", "attempt", "call", "lease", "waiting", "started", "ended", "result",
        "error", "files", "run", "agent", "process",
    }  # fmt: skip
