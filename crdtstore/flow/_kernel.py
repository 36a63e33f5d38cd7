"""The kernel: a thin anyio driver of the pure rules in ``_logic.py`` over the run's record.

One task per running step; a task group per composite step (``parallel``, ``workflow``)
whose cancel scope ends the branches a decided join no longer needs; ``max_concurrency``
by :func:`plan_starts`. Every state change is one write to the kernel's state map.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import CrdtStoreError, LeaseHeld, LeaseLost
from .._leases import canonical_resources, item_resource
from .._names import check_name
from .._values import to_stored
from ._errors import JoinFailed, KernelBusy, SpecChanged, SpecInvalid, StepFailed, StepTimeout
from ._leaf import Records, run_leaf
from ._logic import (
    Launcher,
    Tally,
    backoff_delay,
    dependents,
    join_label,
    ready_steps,
    resume_action,
)
from ._script import stop_left_over
from ._spec import (
    ParallelExecutor,
    Step,
    Workflow,
    WorkflowExecutor,
    check_workflow,
    dependencies,
    spec_hash,
)
from ._state import (
    KERNEL_AGENT,
    RUN_KEY,
    STATE_COLLECTION,
    STATE_SCHEMA,
    LeaseRef,
    ProcessRef,
    RunEntry,
    StepEntry,
    Waiter,
    Waiting,
)

if TYPE_CHECKING:
    from .._leases import Lease
    from .._store import Store
    from ..record import MapCollection, Record

__all__ = ["Kernel", "run_workflow"]

log = logging.getLogger("crdtstore.flow")

LEAVES = frozenset({"python", "agent", "script"})
MAX_KEY = 256  # a lease key's step part


@dataclass(frozen=True)
class _Scope:
    """Where a list of sibling steps runs."""

    prefix: str  # "" or "<parent path>/"
    parent: str  # the parent step's path ("" at the top)
    run: str  # the run the steps write under
    agent: str  # their default agent


@dataclass
class _Outcome:
    state: str  # done | failed | cancelled
    result: Any = None
    exc: StepFailed | None = None

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state}
        if self.state == "done":
            out["result"] = self.result
        if self.exc is not None:
            out["error"] = self.exc.to_dict()
        return out


def _owner(run: str) -> str:
    return f"flow:{run}"


def _kernel_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Kernel:
    """Runs (or resumes) one workflow over one run's record. See :func:`run_workflow`."""

    def __init__(
        self,
        store: Store,
        workflow: Workflow,
        run: str,
        *,
        allow_changed: bool = False,
        lease_ttl: float = 30.0,
        token: str | None = None,
    ) -> None:
        self.store = store
        self.workflow = workflow
        self.run = check_name("run", run)
        self.allow_changed = allow_changed
        self.lease_ttl = lease_ttl
        self.token = token
        self.owner = _owner(self.run)
        self.records = Records(store)
        self.entries: dict[str, StepEntry] = {}
        self._map: MapCollection | None = None
        self._krec: Record | None = None

    # -- the run ------------------------------------------------------------------------------

    async def execute(self) -> Any:
        """Run the workflow to its end and return its result (``{step id: result}``).

        Raises:
            SpecInvalid, SpecChanged, KernelBusy: before any step runs.
            StepFailed: a step failed after its retries (``JoinFailed``, ``StepTimeout``).
        """
        wf = self.workflow
        check_workflow(wf)
        self._check_names(wf.steps, "", self.run, "steps")
        digest = spec_hash(wf)
        kernel_lease = self.store.lease(
            [item_resource(STATE_COLLECTION, self.run)],
            ttl=self.lease_ttl, owner=self.owner, wait=False,
        )  # fmt: skip
        try:
            await kernel_lease.acquire()
        except LeaseHeld as exc:
            raise KernelBusy(self.run, exc.holder) from None
        try:
            async with self.store.open_record(
                self.run, KERNEL_AGENT, "system", schema=STATE_SCHEMA
            ) as krec:
                self._krec = krec
                self._map = krec.map(STATE_COLLECTION)
                try:
                    return await self._run(wf, digest)
                finally:
                    await self.records.aclose()
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(LeaseLost):
                await kernel_lease.release()

    def _check_names(self, steps: Sequence[Step], prefix: str, run: str, field: str) -> None:
        """Lease keys and nested run names this run will use (they depend on the run name)."""
        for i, step in enumerate(steps):
            path = prefix + step.id
            if len(path) > MAX_KEY:
                raise SpecInvalid(f"{field}[{i}].id", f"step path longer than {MAX_KEY}")
            ex = step.executor
            if isinstance(ex, ParallelExecutor):
                self._check_names(ex.branches, path + "/", run, f"{field}[{i}].executor.branches")
            elif isinstance(ex, WorkflowExecutor):
                nested = f"{run}.{step.id}"
                try:
                    check_name("run", nested)
                except CrdtStoreError as exc:
                    raise SpecInvalid(f"{field}[{i}].id", f"nested run: {exc}") from None
                self._check_names(ex.steps, path + "/", nested, f"{field}[{i}].executor.steps")

    async def _run(self, wf: Workflow, digest: str) -> Any:
        assert self._map is not None
        for key, value in self._map.items():
            if key != RUN_KEY:
                try:
                    self.entries[key] = StepEntry.model_validate(value)
                except ValueError:
                    log.warning("run %s: ignoring a malformed step entry %r", self.run, key)
        raw = self._map.get(RUN_KEY)
        prev = RunEntry.model_validate(raw) if raw is not None else None
        if prev is not None and prev.spec_hash != digest and not self.allow_changed:
            raise SpecChanged(self.run, prev.spec_hash, digest)
        if prev is not None and prev.state == "done" and prev.spec_hash == digest:
            return prev.result  # finished already: nothing runs again
        entry = RunEntry(
            name=wf.name, spec_hash=digest, state="running",
            started=prev.started if prev is not None else time.time(),
            starts=prev.starts + 1 if prev is not None else 1, kernel=_kernel_id(),
        )  # fmt: skip
        await self._put_run(entry)
        top = _Scope("", "", self.run, wf.agent or wf.name)
        try:
            result = await self._sequence(wf.steps, top, {})
        except StepFailed as exc:
            await self._put_run(
                entry.model_copy(update={"state": "failed", "ended": time.time(),
                                         "error": exc.to_dict()})
            )  # fmt: skip
            await self._flush()
            raise
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._put_run(
                    entry.model_copy(update={"state": "cancelled", "ended": time.time()})
                )
                await self._flush()
            raise
        await self._put_run(
            entry.model_copy(update={"state": "done", "ended": time.time(), "result": result})
        )
        await self._flush()
        return result

    # -- state --------------------------------------------------------------------------------

    async def _put(self, entry: StepEntry) -> None:
        assert self._map is not None
        self.entries[entry.path] = entry
        await self._map.set(entry.path, entry.model_dump(mode="json", exclude_defaults=True))

    async def _put_run(self, entry: RunEntry) -> None:
        assert self._map is not None
        await self._map.set(RUN_KEY, entry.model_dump(mode="json"))

    async def _flush(self) -> None:
        assert self._krec is not None
        await self._krec.flush()

    def _base(self, step: Step, scope: _Scope, index: int) -> dict[str, Any]:
        ex = step.executor
        return {
            "path": scope.prefix + step.id,
            "parent": scope.parent,
            "index": index,
            "kind": ex.kind,
            "run": scope.run,
            "agent": (step.agent or scope.agent) if ex.kind in LEAVES else None,
            "files": list(canonical_resources(step.owned_files)) if step.owned_files else [],
            "join": join_label(ex.join) if isinstance(ex, ParallelExecutor) else None,
        }

    async def _declare(self, steps: Sequence[Step], scope: _Scope) -> None:
        """``pending`` entries for the steps that have none yet (one journal entry)."""
        missing = [(i, s) for i, s in enumerate(steps) if scope.prefix + s.id not in self.entries]
        if not missing:
            return
        assert self._krec is not None
        async with self._krec.transaction():
            for i, step in missing:
                await self._put(StepEntry(**self._base(step, scope, i), state="pending"))

    # -- composites ---------------------------------------------------------------------------

    def _recorded(self, steps: Sequence[Step], scope: _Scope) -> list[_Outcome | None]:
        out: list[_Outcome | None] = []
        for step in steps:
            e = self.entries.get(scope.prefix + step.id)
            out.append(_Outcome("done", e.result) if e is not None and e.state == "done" else None)
        return out

    async def _sequence(
        self, steps: Sequence[Step], scope: _Scope, results: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A workflow's steps, each once its dependencies are done; the first failure cancels
        the others and is raised."""
        await self._declare(steps, scope)
        deps = dependencies(steps)
        after = dependents(deps)
        outcomes = self._recorded(steps, scope)
        states: list[str | None] = [o.state if o is not None else None for o in outcomes]
        started = [o is not None for o in outcomes]
        tally = Tally("all", len(steps))  # (a workflow's steps: sequence_decision)
        for o in outcomes:
            if o is not None:
                tally.add(o.state)
        failure: StepFailed | None = None
        if tally.decision() == "pending":
            send, recv = anyio.create_memory_object_stream[tuple[int, _Outcome]](len(steps))
            with send, recv:
                async with anyio.create_task_group() as tg:

                    async def one(i: int) -> None:
                        given = {steps[j].id: outcomes[j].result for j in deps[i]}  # type: ignore[union-attr]
                        send.send_nowait((i, await self._run_step(steps[i], scope, i, given)))

                    ready = ready_steps(deps, started, states)
                    while True:
                        for i in ready:
                            started[i] = True
                            tg.start_soon(one, i)
                        i, out = await recv.receive()
                        outcomes[i], states[i] = out, out.state
                        decision = tally.add(out.state)
                        if decision == "failed":
                            failure = out.exc
                            tg.cancel_scope.cancel()
                            break
                        if decision == "done":
                            break
                        ready = ready_steps(deps, started, states, after[i])
        if failure is not None:
            raise failure
        return {s.id: o.result for s, o in zip(steps, outcomes, strict=True) if o is not None}

    async def _parallel(
        self, step: Step, ex: ParallelExecutor, path: str, attempt: int, scope: _Scope,
        results: Mapping[str, Any],
    ) -> dict[str, Any]:  # fmt: skip
        branches = ex.branches
        inner = _Scope(path + "/", path, scope.run, step.agent or scope.agent)
        await self._declare(branches, inner)
        outcomes = self._recorded(branches, inner)
        started = [o is not None for o in outcomes]
        tally = Tally(ex.join, len(branches))
        for o in outcomes:
            if o is not None:
                tally.add(o.state)
        decision = tally.decision()
        if decision == "pending":
            send, recv = anyio.create_memory_object_stream[tuple[int, _Outcome]](len(branches))
            launcher = Launcher(started, ex.max_concurrency)  # (plan_starts, incrementally)
            with send, recv:
                async with anyio.create_task_group() as tg:

                    async def one(i: int) -> None:
                        send.send_nowait((i, await self._run_step(branches[i], inner, i, results)))

                    while decision == "pending":
                        for i in launcher.starts():
                            tg.start_soon(one, i)
                        i, out = await recv.receive()
                        launcher.finished()
                        outcomes[i] = out
                        decision = tally.add(out.state)
                    tg.cancel_scope.cancel()
        report: dict[str, dict[str, Any]] = {}
        with anyio.CancelScope(shield=True):
            for i, branch in enumerate(branches):
                got = outcomes[i]
                if got is None:  # cancelled by the join, or never started
                    got = outcomes[i] = _Outcome("cancelled")
                    if not started[i]:
                        base = self._base(branch, inner, i)
                        prev = self.entries.get(base["path"])
                        await self._put(StepEntry(
                            **base, state="cancelled", ended=time.time(),
                            attempt=prev.attempt if prev is not None else 0,
                        ))  # fmt: skip
                report[branch.id] = got.report()
        if decision == "done":
            return {
                "join": join_label(ex.join),
                "results": {b: r["result"] for b, r in report.items() if r["state"] == "done"},
                "outcomes": {b: r["state"] for b, r in report.items()},
            }
        raise JoinFailed(path, attempt, join_label(ex.join), report)

    # -- one step -----------------------------------------------------------------------------

    async def _run_step(
        self, step: Step, scope: _Scope, index: int, results: Mapping[str, Any]
    ) -> _Outcome:
        """A step to its outcome, with its retries; ``done`` ones are not run again. Only
        cancellation propagates (after the step is recorded ``cancelled``)."""
        path = scope.prefix + step.id
        prev = self.entries.get(path)
        action = resume_action(prev.state if prev else None, prev.attempt if prev else 0)
        if action.skip:
            assert prev is not None
            return _Outcome("done", prev.result)
        attempt, reattach, retry = action.attempt, action.reattach, 0
        proc = prev.process if prev is not None and prev.state == "running" else None
        local = proc is not None and proc.host == socket.gethostname() and bool(proc.start)
        if local and proc is not None and stop_left_over(proc.pid, proc.start):
            log.warning("step %s: stopped the command (pid %d) a killed kernel left running",
                        path, proc.pid)  # fmt: skip
        try:
            while True:
                out = await self._attempt(step, scope, index, attempt, reattach, results)
                if out.state != "failed" or retry >= step.retries:
                    return out
                retry += 1
                await anyio.sleep(backoff_delay(step.backoff, retry))
                attempt, reattach = attempt + 1, False
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                last = self.entries.get(path)
                if last is not None and last.state != "cancelled":
                    await self._put(last.model_copy(update={
                        "state": "cancelled", "ended": time.time(), "lease": None,
                        "process": None,
                    }))  # fmt: skip
            raise

    async def _attempt(
        self, step: Step, scope: _Scope, index: int, attempt: int, reattach: bool,
        results: Mapping[str, Any],
    ) -> _Outcome:  # fmt: skip
        base = self._base(step, scope, index)
        path: str = base["path"]
        call = f"{self.run}:{path}#{attempt}"
        base.update(attempt=attempt, call=call)
        ex = step.executor
        lease: Lease | None = None
        try:
            if step.owned_files:
                lease = await self._take(base, reattach)
            running = StepEntry(
                **base, state="running", started=time.time(),
                lease=LeaseRef(id=lease.lease_id, token=lease.token) if lease else None,
            )  # fmt: skip
            await self._put(running)
            if ex.kind in LEAVES:
                # write-ahead: the attempt is in the journal before it can write anything,
                # so a restart never gives the same call id to a second attempt
                await self._flush()
            got: list[Any] = []
            with anyio.move_on_after(step.timeout) as limit:
                got.append(await self._execute(step, path, attempt, call, scope, lease, results))
            if limit.cancelled_caught and not got:
                assert step.timeout is not None
                raise StepTimeout(path, attempt, step.timeout)
            (result,) = got
            to_stored(result)  # InvalidValue: a result the record cannot hold
            if lease is not None:
                held: Lease = lease
                lease = None
                await held.release()  # LeaseLost: the work was not exclusive after all
            await self._put(running.model_copy(update={
                "state": "done", "ended": time.time(), "result": result, "lease": None,
            }))  # fmt: skip
            return _Outcome("done", result)
        except StepFailed as exc:
            return await self._failed(base, exc)
        except CrdtStoreError as exc:
            error = StepFailed(path, attempt, str(exc), error=exc.to_dict())
            return await self._failed(base, error)
        except Exception as exc:  # a step's own failure is its outcome, recorded
            error = StepFailed(
                path, attempt, f"{type(exc).__name__}: {exc}",
                error={"code": "EXCEPTION", "type": type(exc).__qualname__, "message": str(exc)},
            )  # fmt: skip
            return await self._failed(base, error)
        finally:
            if lease is not None:
                with anyio.CancelScope(shield=True), contextlib.suppress(LeaseLost):
                    await lease.release()

    async def _failed(self, base: dict[str, Any], exc: StepFailed) -> _Outcome:
        prev = self.entries.get(base["path"])
        started = prev.started if prev is not None and prev.attempt == base["attempt"] else None
        await self._put(StepEntry(
            **base, state="failed", started=started, ended=time.time(), error=exc.to_dict(),
            result=exc.result,
        ))  # fmt: skip
        return _Outcome("failed", exc.result, exc)

    async def _take(self, base: dict[str, Any], reattach: bool) -> Lease:
        """The step's files as one lease: at once, or after ``waiting_on_lock`` (recorded and
        journaled before the request is queued, so a restarted kernel asks with the same key
        and keeps the place)."""
        files: list[str] = base["files"]
        key = (base["path"], base["attempt"])
        prev = self.entries.get(base["path"])
        if reattach and prev is not None and prev.waiting is not None:
            waiting = prev.waiting
        else:
            try:
                return await self.store.lease(
                    files, ttl=self.lease_ttl, owner=self.owner, wait=False, key=key
                ).acquire()
            except LeaseHeld:
                pass
            waiting = Waiting(files=files, ahead=await self._ahead(files), since=time.time())
        await self._put(StepEntry(**base, state="waiting_on_lock", waiting=waiting))
        await self._flush()
        return await self.store.lease(
            files, ttl=self.lease_ttl, owner=self.owner, wait=True, key=key
        ).acquire()

    async def _ahead(self, files: Sequence[str]) -> list[Waiter]:
        status = await self.store.leases.status(reap=False)
        mine = set(files)
        out = []
        for info in sorted((*status.holders, *status.waiters), key=lambda i: i.rank):
            common = mine.intersection(info.resources)
            if common:
                out.append(Waiter(
                    rank=info.rank, owner=info.owner, state=info.state,
                    key=list(info.key) if info.key is not None else None,
                    resources=sorted(common),
                ))  # fmt: skip
        return out

    async def _execute(
        self, step: Step, path: str, attempt: int, call: str, scope: _Scope,
        lease: Lease | None, results: Mapping[str, Any],
    ) -> Any:  # fmt: skip
        ex = step.executor
        if isinstance(ex, ParallelExecutor):
            return await self._parallel(step, ex, path, attempt, scope, results)
        if isinstance(ex, WorkflowExecutor):
            nested = f"{scope.run}.{step.id}"
            await self.store.backend.ensure_run(
                self.store.tenant, nested, create=True, parent=scope.run
            )
            self.records.parents[nested] = scope.run
            inner = _Scope(path + "/", path, nested, step.agent or scope.agent)
            try:
                return await self._sequence(ex.steps, inner, results)
            except StepFailed as exc:
                raise StepFailed(
                    path, attempt, f"step {exc.step!r} failed: {exc.reason}", error=exc.to_dict()
                ) from exc
        return await run_leaf(
            ex,
            records=self.records,
            run=scope.run,
            root_run=self.run,
            step=path,
            attempt=attempt,
            call_id=call,
            agent=step.agent or scope.agent,
            inputs=step.inputs,
            results=results,
            lease=lease,
            view=step.view,
            token=self.token,
            started=lambda pid, start: self._script_started(path, pid, start),
        )

    async def _script_started(self, path: str, pid: int, start: str) -> None:
        """Record the process of a running script (journaled: a kernel restarted after a
        ``kill -9`` stops it before retrying the step, so two attempts never run at once)."""
        entry = self.entries[path]
        ref = ProcessRef(host=socket.gethostname(), pid=pid, start=start)
        await self._put(entry.model_copy(update={"process": ref}))
        await self._flush()


async def run_workflow(
    store: Store,
    spec: Workflow | Mapping[str, Any] | str,
    run: str,
    *,
    allow_changed: bool = False,
    lease_ttl: float = 30.0,
    token: str | None = None,
) -> Any:
    """Run, or resume, the workflow ``spec`` (a :class:`Workflow`, a mapping, or the path of a
    JSON/YAML spec file) over the record of ``run``; return its result (``{step id:
    result}``). Steps recorded ``done`` are not run again.

    The kernel's state is the map ``flow`` of the run's record (:class:`RunEntry`,
    :class:`StepEntry`: the states and how resume treats each); the executors are drawn in
    :class:`Workflow`'s docstring, owned files in :class:`Step`'s. A spec whose hash differs
    from the one the run was started with is refused (``SpecChanged``) unless
    ``allow_changed``. One kernel per run: it holds the lease ``item:flow/<run>``
    (``KernelBusy``); a killed kernel's is reaped at once. The errors (:class:`FlowError` and
    below, with their codes) are drawn in ``crdtstore.flow._errors``.

    Args:
        store: the open store; the run's record and the steps' leases are its.
        allow_changed: resume even though the run was started with another spec (steps are
            matched by path; ``done`` ones are kept).
        lease_ttl: TTL of the steps' leases (a restarted kernel keeps a waiting step's place
            if it comes back within it).
        token: handed to ``script`` steps as ``CRDTSTORE_TOKEN`` (``ws://`` stores).

    Raises:
        SpecInvalid: a bad spec (nothing ran).
        SpecChanged: the run was started with another spec and ``allow_changed`` is False.
        KernelBusy: another kernel runs this run.
        StepFailed: a step failed after its retries (``JoinFailed``, ``StepTimeout``).
    """
    from ._spec import load_spec

    wf = load_spec(spec)
    kernel = Kernel(store, wf, run, allow_changed=allow_changed, lease_ttl=lease_ttl, token=token)
    return await kernel.execute()
