"""The workflow kernel: steps and workflows over one run's record, with owned files as leases,
durable ``waiting_on_lock``, joins, and resume that never re-runs finished work.

::

    from crdtstore.flow import run_workflow

    spec = {"name": "checks", "steps": [
        {"id": "edit", "executor": {"kind": "python", "call": "mypkg.agents:apply_patch"},
         "owned_files": ["src/auth.rs"]},
        {"id": "verify", "kind": "script", "run": "pytest -q", "needs": ["edit"]},
    ]}
    async with crdtstore.open_store("sqlite:///runs/store.db") as store:
        result = await run_workflow(store, spec, run="r1")

The kernel keeps all its state in the run's record (the map ``flow``), so a restarted kernel
resumes from the record alone. Resume is *kept and marked*, not staged: an unfinished
attempt's writes stay in the record under its call id, because staging them would forbid the
fenced writes a step makes and hide them from the parallel agents meanwhile. The rules are
in :func:`run_workflow`'s docstring; ``crdtstore flow run`` / ``flow status`` are the shell's.
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
