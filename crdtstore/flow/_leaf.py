"""Leaf steps (``python``, ``agent``, ``script``): the records they write through, their context
and their environment."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import CrdtStoreError
from ..tools import Toolset
from ._context import StepContext
from ._script import run_script
from ._spec import AgentExecutor, PythonExecutor, ScriptExecutor, StepCall, resolve_call

if TYPE_CHECKING:
    from .._leases import Lease
    from .._store import Store
    from ..record import Record

__all__ = ["Records", "run_leaf"]

log = logging.getLogger("crdtstore.flow")


class Records:
    """The records steps write through: one per (run, agent), opened on first use and kept
    until the kernel ends. Opening a record reads the run's journal, so steps sharing an
    agent share its record (each attempt's writes are told apart by their call id)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.parents: dict[str, str] = {}  # nested run -> its parent run
        self._open: dict[tuple[str, str], Record] = {}
        self._lock = anyio.Lock()

    async def get(self, run: str, agent: str) -> Record:
        rec = self._open.get((run, agent))
        if rec is not None:
            return rec
        async with self._lock:  # one open per (run, agent), however many steps ask at once
            rec = self._open.get((run, agent))
            if rec is None:
                rec = self.store.open_record(run, agent, "tool", parent=self.parents.get(run))
                await rec.start()
                self._open[(run, agent)] = rec
        return rec

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            recs, self._open = list(self._open.values()), {}
            for rec in recs:
                await rec.aclose()


_resolved: dict[str, Callable[..., Any]] = {}


def _callable(call: StepCall) -> Callable[..., Any]:
    if not isinstance(call, str):
        return resolve_call(call)
    fn = _resolved.get(call)
    if fn is None:
        fn = _resolved[call] = resolve_call(call)
    return fn


async def run_leaf(
    executor: PythonExecutor | AgentExecutor | ScriptExecutor,
    *,
    records: Records,
    run: str,
    root_run: str,
    step: str,
    attempt: int,
    call_id: str,
    agent: str,
    inputs: Mapping[str, Any],
    results: Mapping[str, Any],
    lease: Lease | None,
    view: list[str] | None,
    token: str | None,
    started: Callable[[int, str], Awaitable[None]] | None = None,
) -> Any:
    """Run one attempt of a leaf step and return its result. The attempt's record writes are
    journaled (flushed) before this returns."""
    store = records.store
    if isinstance(executor, ScriptExecutor):
        env = {
            "CRDTSTORE_STORE": store.url,
            "CRDTSTORE_TENANT": store.tenant,
            "CRDTSTORE_RUN": run,
            "CRDTSTORE_STEP": step,
            "CRDTSTORE_AGENT": agent,
            "CRDTSTORE_SOURCE": "tool",  # a script is a tool, not a model
            "CRDTSTORE_CALL": call_id,
            "CRDTSTORE_ATTEMPT": str(attempt),
        }
        if token is not None:
            env["CRDTSTORE_TOKEN"] = token
        if lease is not None:
            env["CRDTSTORE_LEASE_ID"] = lease.lease_id
            env["CRDTSTORE_LEASE_TOKEN"] = str(lease.token)
        return await run_script(executor, env, step=step, attempt=attempt, on_start=started)

    fn = _callable(executor.call)
    rec = await records.get(run, agent)
    agent_ex = executor if isinstance(executor, AgentExecutor) else None
    scoped = rec.view(view) if view is not None else None
    source = "model" if agent_ex is not None else "tool"

    def make_tools() -> Toolset:
        tools = Toolset(rec, view=scoped, source=source)
        if lease is not None:
            # the tools' writes to the step's files are fenced by the step's lease (which the
            # kernel keeps owning: closing the toolset does not release it)
            tools.fence_with(lease)
        return tools

    ctx = StepContext(
        store=store,
        record=rec,
        run=run,
        root_run=root_run,
        step=step,
        attempt=attempt,
        call_id=call_id,
        agent=agent,
        inputs=inputs,
        results=results,
        lease=lease,
        view=scoped,
        tools=make_tools,
        allowed_tools=agent_ex.tools if agent_ex else None,
    )
    if agent_ex is not None:
        # every store tool, whatever the allowlist of the agent's own tools says (seed 000)
        ctx.tool_schemas = ctx.tools.schemas(agent_ex.tools_format)
    try:
        with rec.attributed(call=call_id, source=source if agent_ex is not None else None):
            result = await fn(ctx)
        await rec.flush()  # the attempt's writes are in the journal before it is done
    finally:
        tools = ctx._tools
        if tools is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await tools.aclose()  # leases and claims the step took through its tools
                except CrdtStoreError as exc:
                    log.warning("step %s: closing its tools failed: %s", call_id, exc)
    return result
