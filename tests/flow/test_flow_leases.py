"""Owned files: one lease per step, fenced writes, ``waiting_on_lock`` in the state and in
``crdtstore flow status``, release on failure and cancellation, FIFO between steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import crdtstore
from crdtstore.flow import StepContext, StepFailed, flow_status, run_workflow
from tests._wait import until

pytestmark = pytest.mark.anyio

CLI = [sys.executable, "-m", "crdtstore.cli"]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[crdtstore.Store]:
    async with crdtstore.open_store(f"sqlite:///{tmp_path}/store.db") as s:
        yield s


def wf(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"name": "w", "steps": list(steps)}


async def state_of(store: crdtstore.Store, path: str, run: str = "r1") -> str | None:
    try:
        s = (await flow_status(store, run)).step(path)
    except crdtstore.UnknownRun:
        return None
    return s.entry.state if s is not None else None


async def test_owned_files_are_one_lease_with_its_token_in_the_state(
    store: crdtstore.Store,
) -> None:
    seen: dict[str, Any] = {}

    async def edit(ctx: StepContext) -> None:
        assert ctx.lease is not None
        seen.update(files=ctx.files, token=ctx.lease.token, id=ctx.lease.lease_id)
        st = (await flow_status(ctx.store, ctx.root_run)).step(ctx.step)
        assert st is not None
        seen["entry"] = st.entry
        holders = (await ctx.store.leases.status()).holders
        seen["holders"] = [(h.owner, h.key, h.resources) for h in holders]
        await ctx.put("files", "src/auth.rs", {"lines": 1})  # fenced
        await ctx.put("notes", "free", 1)  # not a file of the lease: a plain write

    spec = wf({"id": "edit", "kind": "python", "call": edit,
               "owned_files": ["src/session.rs", "./src/auth.rs"]})  # fmt: skip
    await run_workflow(store, spec, "r1")
    assert seen["files"] == ("src/auth.rs", "src/session.rs")
    e = seen["entry"]
    assert e.state == "running" and e.lease.token == seen["token"] and e.lease.id == seen["id"]
    assert e.files == ["src/auth.rs", "src/session.rs"]
    assert seen["holders"] == [
        ("flow:r1", None, ("item:flow/r1",)),  # the kernel's own: one kernel per run
        ("flow:r1", ("edit", 1), ("src/auth.rs", "src/session.rs")),
    ]
    done = (await flow_status(store, "r1")).step("edit")
    assert done is not None and done.entry.lease is None and done.entry.state == "done"
    assert not (await store.leases.status()).holders  # released when it ended


async def test_writes_to_the_files_are_fenced(store: crdtstore.Store) -> None:
    got: dict[str, Any] = {}

    async def edit(ctx: StepContext) -> None:
        assert ctx.lease is not None
        await ctx.put("files", "src/a.py", 1)
        out = await ctx.call_tool("store_put", {"collection": "files", "key": "src/a.py",
                                                "value": 2})  # fmt: skip
        got["tool_ok"] = "error" not in out
        await ctx.lease.release()  # lost, as if reaped: fenced writes must now be refused
        out = await ctx.call_tool("store_put", {"collection": "files", "key": "src/a.py",
                                                "value": 3})  # fmt: skip
        got["tool_after"] = out["error"]["code"]
        await ctx.put("files", "src/a.py", 4)  # raises LeaseLost

    with pytest.raises(StepFailed) as info:
        await run_workflow(store, wf({"id": "e", "kind": "python", "call": edit,
                                      "owned_files": ["src/a.py"]}), "r1")  # fmt: skip
    assert info.value.error["code"] == "LEASE_LOST"  # type: ignore[index]
    assert got == {"tool_ok": True, "tool_after": "LEASE_LOST"}
    async with store.open_record("r1", "reader") as rec:
        assert rec.map("files").get("src/a.py") == 2


async def test_waiting_on_lock_is_visible_in_the_state_and_in_flow_status(
    store: crdtstore.Store, tmp_path: Path
) -> None:
    ran = anyio.Event()

    async def edit(ctx: StepContext) -> None:
        ran.set()

    spec = wf({"id": "edit", "kind": "python", "call": edit, "owned_files": ["src/a.py"]})
    holder = await store.lease(["src/a.py"], owner="someone-else").acquire()
    async with anyio.create_task_group() as tg:
        tg.start_soon(run_workflow, store, spec, "r1")
        await until(lambda: _is(state_of(store, "edit"), "waiting_on_lock"), "the step to wait")
        st = (await flow_status(store, "r1")).step("edit")
        assert st is not None and st.entry.waiting is not None
        assert st.entry.waiting.files == ["src/a.py"]
        assert [a.owner for a in st.entry.waiting.ahead] == ["someone-else"]
        assert [(a.owner, a.state) for a in st.ahead or []] == [("someone-else", "granted")]
        # the same through the command line, from another process
        url = f"sqlite:///{tmp_path}/store.db"
        out = await anyio.to_thread.run_sync(
            lambda: subprocess.run([*CLI, "flow", "status", "--store", url, "--run", "r1",
                                    "--json"], capture_output=True, text=True, check=True)
        )  # fmt: skip
        data = json.loads(out.stdout)
        (step,) = data["steps"]
        assert step["entry"]["state"] == "waiting_on_lock"
        assert step["ahead"][0]["owner"] == "someone-else"
        out = await anyio.to_thread.run_sync(
            lambda: subprocess.run([*CLI, "flow", "status", "--store", url, "--run", "r1"],
                                   capture_output=True, text=True, check=True,
                                   env={**os.environ, "COLUMNS": "200"})
        )  # fmt: skip
        assert "waiting_on_lock" in out.stdout and "someone-else" in out.stdout
        assert "src/a.py" in out.stdout
        assert not ran.is_set()
        await holder.release()
        with anyio.fail_after(20):
            await ran.wait()
    assert await state_of(store, "edit") == "done"


async def _is(value: Any, want: str) -> bool:
    return (await value) == want


async def test_overlapping_branches_never_hold_a_file_together(store: crdtstore.Store) -> None:
    holding: dict[str, int] = {}
    peak: dict[str, int] = {}
    ran: list[str] = []

    async def edit(ctx: StepContext) -> None:
        for f in ctx.files:
            holding[f] = holding.get(f, 0) + 1
            peak[f] = max(peak.get(f, 0), holding[f])
        ran.append(ctx.step)
        await anyio.sleep(0.01)
        for f in ctx.files:
            holding[f] -= 1

    files = [["a", "b"], ["b"], ["c"], ["a"], ["b", "c"], ["a", "c"]]
    branches = [{"id": f"s{i}", "kind": "python", "call": edit, "owned_files": f}
                for i, f in enumerate(files)]  # fmt: skip
    spec = wf({"id": "p", "kind": "parallel", "branches": branches})
    await run_workflow(store, spec, "r1")
    assert sorted(ran) == [f"p/s{i}" for i in range(len(files))]
    assert peak == {"a": 1, "b": 1, "c": 1}


async def test_kernels_queue_for_a_file_in_fifo_order(store: crdtstore.Store) -> None:
    """Steps of two runs wait behind a holder and each other; released, they go in the
    order they queued."""
    order: list[str] = []

    async def edit(ctx: StepContext) -> None:
        order.append(ctx.root_run)

    holder = await store.lease(["src/a.py"], owner="human").acquire()
    async with anyio.create_task_group() as tg:
        for run in ("r1", "r2", "r3"):
            spec = wf({"id": "edit", "kind": "python", "call": edit, "owned_files": ["src/a.py"]})
            tg.start_soon(run_workflow, store, spec, run)
            await until(lambda run=run: _is(state_of(store, "edit", run), "waiting_on_lock"),
                        f"{run} to wait")  # fmt: skip
        st = (await flow_status(store, "r3")).step("edit")
        assert st is not None and [a.owner for a in st.ahead or []] == ["human", "flow:r1",
                                                                        "flow:r2"]  # fmt: skip
        await holder.release()
    assert order == ["r1", "r2", "r3"]


async def test_leases_are_released_on_failure_and_on_cancellation(
    store: crdtstore.Store,
) -> None:
    async def bad(ctx: StepContext) -> None:
        raise RuntimeError("no")

    async def slow(ctx: StepContext) -> None:
        await anyio.sleep(60)

    async def fast(ctx: StepContext) -> None:
        def bad_failed() -> bool:  # the kernel's own record of it, as every agent sees it
            entry = ctx.record.map("flow").get("p/bad")
            return entry is not None and entry["state"] == "failed"

        await until(bad_failed, "bad to fail first")

    spec = wf({"id": "p", "kind": "parallel", "join": "any", "branches": [
        {"id": "bad", "kind": "python", "call": bad, "owned_files": ["x"]},
        {"id": "slow", "kind": "python", "call": slow, "owned_files": ["y"]},
        {"id": "waits", "kind": "python", "call": slow, "owned_files": ["y", "z"]},
        {"id": "fast", "kind": "python", "call": fast}]})  # fmt: skip
    with anyio.fail_after(20):
        result = await run_workflow(store, spec, "r1")
    assert result["p"]["outcomes"] == {"bad": "failed", "slow": "cancelled",
                                       "waits": "cancelled", "fast": "done"}  # fmt: skip
    status = await store.leases.status()
    assert not status.holders and not status.waiters
