"""The workflow kernel: steps and workflows over one run's record, with owned files as leases,
durable ``waiting_on_lock``, joins, and resume that never re-runs finished work.

::

    from crdtstore.flow import run_workflow

    spec = {"name": "checks", "steps": [
        {"id": "edit", "executor": {"kind": "python", "call": "mypkg.agents:apply_patch"},
         "owned_files": ["src/auth.rs"]},
        {"id": "verify", "executor": {"kind": "parallel", "join": "all", "max_concurrency": 4,
         "branches": [{"id": "lint", "kind": "script", "run": "ruff check ."},
                      {"id": "unit", "kind": "script", "run": "pytest -q"}]}},
    ]}
    async with crdtstore.open_store("sqlite:///runs/store.db") as store:
        result = await run_workflow(store, spec, run="r1")

``crdtstore flow run SPEC --store URL --run R`` and ``crdtstore flow status --store URL
--run R [--json] [--watch]`` do the same from a shell.

**Executors** (``kind``): ``python`` and ``agent`` (an async callable receiving a
:class:`StepContext`; an agent's carries every store tool's schema, whatever its ``tools``
allowlist says), ``script`` (a subprocess; environment in ``crdtstore.flow._script``),
``parallel`` (``branches``, ``join``: ``all`` | ``any`` | ``{at_least: K}``,
``max_concurrency``: branches running at once, a lock wait included) and ``workflow`` (a
nested workflow, run as the nested run ``<run>.<step id>`` sharing the record: its writes
and journal keys never collide with the parent's). A workflow's steps run in order; ``needs``
makes a step depend on named siblings instead (``[]``: on none).

**State.** The kernel's state is the map ``flow`` of the run's record, declared with policy
``owner`` and written only by the agent ``flow-kernel``: the entry ``@run``
(:class:`RunEntry`: name, spec hash, state, kernel starts) and one :class:`StepEntry` per
step path (``verify/lint``; a nested workflow's steps under its step's path): state
(``pending``, ``waiting_on_lock``, ``running``, ``done``, ``failed``, ``cancelled``),
attempt, call id, lease id and fencing token, files, who was ahead when it queued, start
and end times, result or error. The journal of that map is the kernel's history.

**Owned files.** A step's ``owned_files`` are one all-or-nothing lease (owner
``flow:<run>``, key ``(path, attempt)``), taken before it runs and released when it ends,
fails or is cancelled. If they are held, the step is recorded ``waiting_on_lock`` *before*
it queues, so a kernel restarted within the lease TTL asks again with the same key and keeps
its FIFO place (branches started together queue in the order they ask). Writes to keys naming
those files, through :meth:`StepContext.put` or the step's tools, are fenced with the lease's
token.

**Records.** Steps write through one record per (run, agent), opened on first use and shared
by the steps of that agent (default: the workflow's ``agent``, else its ``name``); a step
that needs an identity of its own names its ``agent``.

**Resume: kept and marked.** Every write an attempt makes is journaled with its call id
``<run>:<path>#<attempt>`` (``Record.attributed``); the attempt is recorded ``running``, and
journaled, before its body runs, so no two attempts share a call id; its writes are flushed
before it is recorded ``done``. On restart (same spec, same run): ``done`` steps are not run
again (their results come from the record); ``waiting_on_lock`` ones re-attach with the same
attempt; ``running``, ``failed``, ``cancelled`` and ``pending`` ones run as a new attempt.
A ``script`` step's process group is recorded while it runs; a kernel restarted on the same
host kills a command the killed kernel left running (pid and start time must match) before
retrying the step, so two attempts of it never run at once. The writes of an attempt that did
not complete **stay in the record**, marked with that attempt's call id (visible in
``history`` and ``journal``); the writes of each attempt recorded ``done`` are in the record
exactly once. Map writes that a re-run repeats converge
to the same value; a list append of a crashed attempt stays next to the retry's, told apart
by its call id. Stage-and-commit (an attempt's writes journaled together with its completion)
was not chosen: ``rec.transaction()`` refuses guarded and fenced writes inside it (so a step
could not fence its files), holds back the other writes of the record while open, and keeps
an attempt's writes invisible to the parallel agents that seed 000 lets talk through the
store until the step ends.

A spec whose hash differs from the one the run was started with is refused (``SpecChanged``)
unless ``allow_changed``. One kernel per run: it holds the lease ``item:flow/<run>``
(``KernelBusy``); a killed kernel's is reaped at once.

Errors (:class:`FlowError` under ``CrdtStoreError``): ``SpecInvalid`` (SPEC_INVALID, naming
the field), ``SpecChanged`` (SPEC_CHANGED), ``KernelBusy`` (FLOW_RUNNING), ``StepFailed``
(STEP_FAILED), ``StepTimeout`` (STEP_TIMEOUT), ``JoinFailed`` (JOIN_FAILED, with every
branch's outcome).
"""

from ._context import StepContext as StepContext
from ._errors import FlowError as FlowError
from ._errors import JoinFailed as JoinFailed
from ._errors import KernelBusy as KernelBusy
from ._errors import SpecChanged as SpecChanged
from ._errors import SpecInvalid as SpecInvalid
from ._errors import StepFailed as StepFailed
from ._errors import StepTimeout as StepTimeout
from ._kernel import Kernel as Kernel
from ._kernel import run_workflow as run_workflow
from ._spec import AgentExecutor as AgentExecutor
from ._spec import AtLeast as AtLeast
from ._spec import ParallelExecutor as ParallelExecutor
from ._spec import PythonExecutor as PythonExecutor
from ._spec import ScriptExecutor as ScriptExecutor
from ._spec import Step as Step
from ._spec import Workflow as Workflow
from ._spec import WorkflowExecutor as WorkflowExecutor
from ._spec import load_spec as load_spec
from ._spec import parse_spec as parse_spec
from ._spec import spec_hash as spec_hash
from ._state import KERNEL_AGENT as KERNEL_AGENT
from ._state import STATE_COLLECTION as STATE_COLLECTION
from ._state import RunEntry as RunEntry
from ._state import StepEntry as StepEntry
from ._status import FlowStatus as FlowStatus
from ._status import StepStatus as StepStatus
from ._status import flow_status as flow_status

__all__ = [
    "AgentExecutor",
    "AtLeast",
    "FlowError",
    "FlowStatus",
    "JoinFailed",
    "KERNEL_AGENT",
    "Kernel",
    "KernelBusy",
    "ParallelExecutor",
    "PythonExecutor",
    "RunEntry",
    "STATE_COLLECTION",
    "ScriptExecutor",
    "SpecChanged",
    "SpecInvalid",
    "Step",
    "StepContext",
    "StepEntry",
    "StepFailed",
    "StepStatus",
    "StepTimeout",
    "Workflow",
    "WorkflowExecutor",
    "flow_status",
    "load_spec",
    "parse_spec",
    "run_workflow",
    "spec_hash",
]
