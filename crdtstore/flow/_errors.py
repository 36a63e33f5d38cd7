"""The errors of the workflow kernel, under crdtstore's root :class:`CrdtStoreError`::

    CrdtStoreError
    └── FlowError                                FLOW_ERROR
        ├── SpecInvalid (ValueError)             SPEC_INVALID
        ├── SpecChanged                          SPEC_CHANGED
        ├── KernelBusy                           FLOW_RUNNING
        └── StepFailed                           STEP_FAILED
            ├── StepTimeout (TimeoutError)       STEP_TIMEOUT
            └── JoinFailed                       JOIN_FAILED

Each carries its fields (``SpecInvalid.field``, ``StepFailed.step``, ``JoinFailed.outcomes``,
...) and composes its own message; ``to_dict()`` is what the kernel records in a failed
step's entry and what ``flow status --json`` prints.
"""

from __future__ import annotations

from typing import Any

from .._errors import CrdtStoreError

__all__ = [
    "FlowError",
    "JoinFailed",
    "KernelBusy",
    "SpecChanged",
    "SpecInvalid",
    "StepFailed",
    "StepTimeout",
]


class FlowError(CrdtStoreError):
    """Root of the workflow kernel's errors."""

    code = "FLOW_ERROR"


class SpecInvalid(FlowError, ValueError):
    """A workflow spec is malformed; nothing ran.

    ``field`` is where (``steps[1].executor.branches[0].kind``), ``errors`` pydantic's list
    when the error comes from validation (else empty).
    """

    code = "SPEC_INVALID"

    def __init__(self, field: str, reason: str, errors: list[dict[str, Any]] | None = None):
        self.field = field
        self.reason = reason
        self.errors = errors or []
        super().__init__(f"invalid workflow spec at {field or '<root>'}: {reason}")

    def to_dict(self) -> dict[str, object]:
        out = super().to_dict()
        out["errors"] = self.errors
        return out


class SpecChanged(FlowError):
    """The run was started with another spec (its hash is recorded); resuming it with this one
    is refused unless asked for (``allow_changed``, ``--allow-changed``)."""

    code = "SPEC_CHANGED"

    def __init__(self, run: str, recorded: str, given: str) -> None:
        self.run = run
        self.recorded_hash = recorded
        self.spec_hash = given
        super().__init__(
            f"run {run!r} was started with spec {recorded}, not {given}: "
            "pass allow_changed (--allow-changed) to resume it with this spec"
        )


class KernelBusy(FlowError):
    """Another kernel is running this run's workflow (it holds the run's kernel lease)."""

    code = "FLOW_RUNNING"

    def __init__(self, run: str, holder: str) -> None:
        self.run = run
        self.holder = holder
        super().__init__(f"a kernel is already running run {run!r} ({holder})")


class StepFailed(FlowError):
    """A step failed (after its retries). ``error`` is the last attempt's error as a dict
    (``{"code": ..., "message": ...}``), ``result`` what it returned if anything (a script's
    exit status and output tail)."""

    code = "STEP_FAILED"

    def __init__(
        self,
        step: str,
        attempt: int,
        message: str,
        *,
        error: dict[str, Any] | None = None,
        result: Any = None,
    ) -> None:
        self.step = step
        self.attempt = attempt
        self.reason = message
        self.error = error
        self.result = result
        super().__init__(f"step {step!r} failed (attempt {attempt}): {message}")

    def to_dict(self) -> dict[str, object]:
        out = super().to_dict()
        out["error"] = self.error
        out["result"] = self.result
        return out


class StepTimeout(StepFailed, TimeoutError):
    """An attempt of a step ran longer than its ``timeout`` and was cancelled."""

    code = "STEP_TIMEOUT"

    def __init__(self, step: str, attempt: int, timeout: float) -> None:
        self.timeout = timeout
        super().__init__(step, attempt, f"timed out after {timeout:g} s")


class JoinFailed(StepFailed):
    """A parallel step's join cannot be met. ``outcomes`` holds every branch's outcome:
    ``{branch_id: {"state": ..., "result": ..., "error": ...}}``."""

    code = "JOIN_FAILED"

    def __init__(
        self, step: str, attempt: int, join: str, outcomes: dict[str, dict[str, Any]]
    ) -> None:
        self.join = join
        self.outcomes = outcomes
        done = sum(1 for o in outcomes.values() if o.get("state") == "done")
        super().__init__(
            step,
            attempt,
            f"join {join} not met ({done} of {len(outcomes)} branches done: "
            + ", ".join(f"{b} {o.get('state')}" for b, o in outcomes.items())
            + ")",
        )

    def to_dict(self) -> dict[str, object]:
        out = super().to_dict()
        out["outcomes"] = self.outcomes
        return out
