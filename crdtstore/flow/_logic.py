"""The kernel's decisions as pure functions (no I/O, no event loop): the join rule, which
children to start next, and what to do with a step found in the record on (re)start.

The anyio driver (``_kernel.py``) only feeds them outcomes and carries out their answers, so
hypothesis tests them on random workflows without a store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ._spec import AtLeast, Join

__all__ = [
    "FINISHED",
    "STATES",
    "Decision",
    "Launcher",
    "Resume",
    "Tally",
    "backoff_delay",
    "dependents",
    "join_decision",
    "join_label",
    "plan_starts",
    "ready_steps",
    "resume_action",
    "sequence_decision",
]

StepState = Literal["pending", "waiting_on_lock", "running", "done", "failed", "cancelled"]
STATES: tuple[StepState, ...] = (
    "pending", "waiting_on_lock", "running", "done", "failed", "cancelled"
)  # fmt: skip
FINISHED = frozenset({"done", "failed", "cancelled"})
Decision = Literal["pending", "done", "failed"]
MAX_BACKOFF = 60.0


def join_label(join: Join) -> str:
    """``all``, ``any`` or ``at_least K``."""
    return f"at_least {join.at_least}" if isinstance(join, AtLeast) else join


def join_decision(join: Join, outcomes: Sequence[str | None]) -> Decision:
    """Whether a parallel step is decided by its branches' outcomes (None: not finished;
    else ``done``, ``failed`` or ``cancelled``, which counts as not done).

    - ``all``: failed as soon as one branch did not succeed, done when all did;
    - ``any``: done at the first success, failed when every branch finished without one;
    - ``at_least K``: done at K successes, failed as soon as K cannot be reached.

    Once every outcome is known the answer is never ``pending``.
    """
    n = len(outcomes)
    done = sum(1 for o in outcomes if o == "done")
    open_ = sum(1 for o in outcomes if o is None)
    if join == "all":
        need = n
    elif join == "any":
        need = min(1, n)
    else:
        need = join.at_least
    if done >= need:
        return "done"
    if done + open_ < need:
        return "failed"
    return "pending"


def sequence_decision(outcomes: Sequence[str | None]) -> Decision:
    """A workflow's steps: failed as soon as one did not succeed, done when all did."""
    if any(o is not None and o != "done" for o in outcomes):
        return "failed"
    if all(o == "done" for o in outcomes):
        return "done"
    return "pending"


def plan_starts(started: Sequence[bool], finished: Sequence[bool], limit: int | None) -> list[int]:
    """The branches to start now, in branch order: those not started yet, as many as keep the
    running ones (started, not finished) at most ``limit`` (None: no limit)."""
    running = sum(1 for s, f in zip(started, finished, strict=True) if s and not f)
    room = len(started) if limit is None else limit - running
    out: list[int] = []
    for i, s in enumerate(started):
        if room <= 0:
            break
        if not s:
            out.append(i)
            room -= 1
    return out


def ready_steps(
    deps: Sequence[Sequence[int]],
    started: Sequence[bool],
    outcomes: Sequence[str | None],
    candidates: Sequence[int] | None = None,
) -> list[int]:
    """The steps of a workflow to start now: not started, every dependency done (among
    ``candidates`` only, if given: the dependents of the step that just finished)."""
    return [
        i
        for i in (range(len(deps)) if candidates is None else candidates)
        if not started[i] and all(outcomes[j] == "done" for j in deps[i])
    ]


def dependents(deps: Sequence[Sequence[int]]) -> list[list[int]]:
    """For each step, the steps that depend on it."""
    out: list[list[int]] = [[] for _ in deps]
    for i, d in enumerate(deps):
        for j in d:
            out[j].append(i)
    return out


class Tally:
    """:func:`join_decision` kept up to date one outcome at a time, in O(1) per outcome (a
    1,000-branch fan-out decides 1,000 times). A workflow's steps use ``all``, which is
    :func:`sequence_decision`."""

    __slots__ = ("done", "need", "open")

    def __init__(self, join: Join, n: int) -> None:
        self.need = n if join == "all" else min(1, n) if join == "any" else join.at_least
        self.open = n
        self.done = 0

    def add(self, outcome: str) -> Decision:
        """One more branch finished with ``outcome``; the decision so far."""
        self.open -= 1
        if outcome == "done":
            self.done += 1
        return self.decision()

    def decision(self) -> Decision:
        if self.done >= self.need:
            return "done"
        if self.done + self.open < self.need:
            return "failed"
        return "pending"


class Launcher:
    """:func:`plan_starts` kept up to date: which branches to start, in branch order, so that
    at most ``limit`` run at once; O(1) amortised per branch."""

    __slots__ = ("_next", "limit", "running", "started")

    def __init__(self, started: list[bool], limit: int | None) -> None:
        self.started = started
        self.limit = limit
        self.running = 0
        self._next = 0

    def starts(self) -> list[int]:
        """Mark and return the branches to start now."""
        out: list[int] = []
        n = len(self.started)
        while self._next < n and (self.limit is None or self.running < self.limit):
            i = self._next
            self._next += 1
            if not self.started[i]:
                self.started[i] = True
                self.running += 1
                out.append(i)
        return out

    def finished(self) -> None:
        """One running branch finished."""
        self.running -= 1


@dataclass(frozen=True)
class Resume:
    """What to do with a step on (re)start: ``skip`` it (done: its result is in the record),
    or run ``attempt`` (``reattach``: ask for its lease with the same key, keeping its place
    in the queue)."""

    skip: bool
    attempt: int
    reattach: bool = False


def resume_action(state: str | None, attempt: int) -> Resume:
    """The resume rule, from the step's recorded state and attempt (None, 0: no entry).

    - ``done``: never run again;
    - ``waiting_on_lock``: the same attempt (its body never ran), re-attaching to its lease
      request, so it keeps its FIFO place;
    - ``running``: that attempt did not complete (the kernel died): a new attempt;
    - ``failed``, ``cancelled``, ``pending`` or no entry: a new attempt.
    """
    if state == "done":
        return Resume(True, attempt)
    if state == "waiting_on_lock" and attempt > 0:
        return Resume(False, attempt, reattach=True)
    return Resume(False, attempt + 1)


def backoff_delay(backoff: float, retry: int) -> float:
    """Seconds before retry ``retry`` (1, 2, ...): ``backoff * 2**(retry-1)``, at most 60."""
    if retry < 1 or backoff <= 0:
        return 0.0
    return float(min(MAX_BACKOFF, backoff * 2 ** (retry - 1)))
