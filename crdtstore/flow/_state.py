"""The kernel's state in the run's record: one map collection, ``flow``, that only the kernel's
agent writes (policy ``owner``), one entry per step path plus ``@run`` for the run itself.

Every entry is JSON (the models below, ``model_dump(mode="json")``); readers (``flow
status``, the viewer) validate them with the same models and ignore fields they do not know.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .._semantics import CollectionSpec
from ._logic import StepState
from ._spec import RESERVED_AGENT

__all__ = [
    "KERNEL_AGENT",
    "RUN_KEY",
    "STATE_COLLECTION",
    "STATE_SCHEMA",
    "LeaseRef",
    "ProcessRef",
    "RunEntry",
    "StepEntry",
    "Waiter",
    "Waiting",
]

STATE_COLLECTION = "flow"
RUN_KEY = "@run"  # (a step id cannot start with "@")
KERNEL_AGENT = RESERVED_AGENT
STATE_SCHEMA = {STATE_COLLECTION: CollectionSpec(kind="map", policy="owner")}

RunState = Literal["running", "done", "failed", "cancelled"]


class _Entry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class LeaseRef(_Entry):
    """The lease a running step holds: its id and fencing token."""

    id: str
    token: int


class ProcessRef(_Entry):
    """The process a ``script`` step runs (its process group): how a restarted kernel finds
    and stops a command that a killed kernel left running, before retrying the step."""

    host: str
    pid: int
    start: str  # the process's start time (/proc/<pid>/stat), against pid reuse


class Waiter(_Entry):
    """A request ahead of a waiting step on one of its files."""

    rank: int
    owner: str
    key: list[Any] | None = None  # [step path, attempt] for a kernel's step
    state: str  # granted | waiting_on_lock
    resources: list[str]


class Waiting(_Entry):
    """Why a step is ``waiting_on_lock``: its files and who was ahead when it queued (``flow
    status`` asks the lease table for the live queue)."""

    files: list[str]
    ahead: list[Waiter] = Field(default_factory=list)
    since: float


class StepEntry(_Entry):
    """The entry of one step, under its path (``verify/lint``; nested workflows' steps under
    their step's path: ``sub/inner``).

    ``attempt`` counts the attempts ever started (0: none yet), across kernel restarts;
    ``call`` is the current attempt's call id, ``<root run>:<path>#<attempt>``, which every
    journal entry the attempt writes carries. ``run`` is the run the step's writes are
    attributed to (a nested workflow's steps: the nested run). ``started``/``ended`` are wall
    times of the current attempt; ``result`` is set once ``done``, ``error`` once ``failed``
    (``{"code", "message", ...}``, see ``crdtstore.flow`` errors).

    **State.** The kernel's state is the map ``flow`` of the run's record, declared with policy
    ``owner`` and written only by the agent ``flow-kernel``: the entry ``@run``
    (:class:`RunEntry`: name, spec hash, state, kernel starts) and one :class:`StepEntry` per
    step path (``verify/lint``; a nested workflow's steps under its step's path): state
    (``pending``, ``waiting_on_lock``, ``running``, ``done``, ``failed``, ``cancelled``),
    attempt, call id, lease id and fencing token, files, who was ahead when it queued, start and
    end times, result or error. The journal of that map is the kernel's history.

    **Resume: kept and marked.** Every write an attempt makes is journaled with its call id
    ``<run>:<path>#<attempt>`` (``Record.attributed``); the attempt is recorded ``running``, and
    journaled, before its body runs, so no two attempts share a call id; its writes are flushed
    before it is recorded ``done``. On restart (same spec, same run): ``done`` steps are not run
    again (their results come from the record); ``waiting_on_lock`` ones re-attach with the same
    attempt; ``running``, ``failed``, ``cancelled`` and ``pending`` ones run as a new attempt. A
    ``script`` step's process group is recorded while it runs; a kernel restarted on the same
    host kills a command the killed kernel left running (pid and start time must match) before
    retrying the step, so two attempts of it never run at once. The writes of an attempt that
    did not complete **stay in the record**, marked with that attempt's call id (visible in
    ``history`` and ``journal``); the writes of each attempt recorded ``done`` are in the record
    exactly once. Map writes that a re-run repeats converge to the same value; a list append of
    a crashed attempt stays next to the retry's, told apart by its call id. Stage-and-commit (an
    attempt's writes journaled together with its completion) was not chosen:
    ``rec.transaction()`` refuses guarded and fenced writes inside it (so a step could not fence
    its files), holds back the other writes of the record while open, and keeps an attempt's
    writes invisible to the parallel agents that talk through the store until the step ends.
    """

    path: str
    parent: str = ""  # the parent step's path ("" at the top)
    index: int = 0  # position among its siblings
    kind: str
    state: StepState
    attempt: int = 0
    run: str
    agent: str | None = None
    call: str | None = None
    files: list[str] = Field(default_factory=list)
    lease: LeaseRef | None = None
    waiting: Waiting | None = None
    process: ProcessRef | None = None  # script steps while running
    join: str | None = None  # parallel steps: all | any | at_least K
    started: float | None = None
    ended: float | None = None
    result: Any = None
    error: dict[str, Any] | None = None

    @property
    def duration(self) -> float | None:
        if self.started is None:
            return None
        return None if self.ended is None else max(0.0, self.ended - self.started)


class RunEntry(_Entry):
    """The ``@run`` entry: the workflow's name, the hash of the spec it was started with, its
    state, and the kernel (``host:pid``) that last ran it. ``starts`` counts kernel starts."""

    name: str
    spec_hash: str
    state: RunState
    started: float
    ended: float | None = None
    starts: int = 1
    kernel: str = ""
    result: Any = None
    error: dict[str, Any] | None = None
