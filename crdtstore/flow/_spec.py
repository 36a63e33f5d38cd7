"""Workflow specs: pydantic models for Python, JSON and YAML alike, and the checks a spec
passes before anything runs.

A step is ``{id, executor: {kind, ...}, owned_files, retries, backoff, timeout, inputs,
needs, agent, view}``; a step may also be written flat, with its executor's fields beside its
own (``{id: lint, kind: script, run: "ruff check ."}``), as parallel branches usually are.
Unknown fields are refused; every error names the field (:class:`SpecInvalid`).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    StringConstraints,
    ValidationError,
    model_validator,
)

from .._errors import CrdtStoreError
from .._leases import canonical_resources
from .._names import check_name
from ._errors import SpecInvalid

__all__ = [
    "AgentExecutor",
    "AtLeast",
    "ParallelExecutor",
    "PythonExecutor",
    "ScriptExecutor",
    "Step",
    "Workflow",
    "WorkflowExecutor",
    "check_workflow",
    "load_spec",
    "parse_spec",
    "resolve_call",
    "spec_hash",
]

RESERVED_AGENT = "flow-kernel"  # the kernel's own agent (_state.KERNEL_AGENT)
STEP_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
StepId = Annotated[str, StringConstraints(pattern=STEP_ID_PATTERN)]
ToolsFormat = Literal["openai", "anthropic", "mcp"]
StepCall = str | Callable[..., Any]

_STEP_FIELDS = frozenset(
    {"id", "executor", "owned_files", "retries", "backoff", "timeout", "inputs", "needs",
     "agent", "view"}
)  # fmt: skip


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AtLeast(_Model):
    """``join: {at_least: K}``: done at K successes, failed once K cannot be reached."""

    at_least: PositiveInt


Join = Literal["all", "any"] | AtLeast


class PythonExecutor(_Model):
    """``{kind: python, call: "pkg.module:function"}``: an async callable receiving the
    :class:`StepContext`; what it returns (JSON-like) is the step's result."""

    kind: Literal["python"]
    call: StepCall


class AgentExecutor(_Model):
    """``{kind: agent, call: ..., tools: [...], tools_format: openai}``: a model loop. As
    ``python``, and its context carries the store tools' schemas in ``tools_format``.

    ``tools`` is the allowlist of the agent's *own* tools (``ctx.allowed_tools``); the store
    tools are added after it, whatever it says (seed 000: a restrictive agent configuration
    must not lose the store tools)."""

    kind: Literal["agent"]
    call: StepCall
    tools: list[str] | None = None
    tools_format: ToolsFormat = "openai"


class ScriptExecutor(_Model):
    """``{kind: script, run: "ruff check ."}``: a command (a shell line, or an argv list) run
    as a subprocess with the store in its environment (CRDTSTORE_STORE, CRDTSTORE_RUN,
    CRDTSTORE_STEP, CRDTSTORE_AGENT, CRDTSTORE_SOURCE, CRDTSTORE_CALL, CRDTSTORE_ATTEMPT,
    and CRDTSTORE_TOKEN for a ``ws://`` store). Exit status 0 is success; the result is the
    exit status, the duration and the tail of the output."""

    kind: Literal["script"]
    run: Annotated[str, StringConstraints(min_length=1)] | Annotated[list[str], Field(min_length=1)]
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    tail: PositiveInt = 20  # lines of stdout and of stderr kept in the result


class ParallelExecutor(_Model):
    """``{kind: parallel, branches: [...], join: all, max_concurrency: 4}``."""

    kind: Literal["parallel"]
    branches: Annotated[list[Step], Field(min_length=1)]
    join: Join = "all"
    max_concurrency: PositiveInt | None = None


class WorkflowExecutor(_Model):
    """``{kind: workflow, steps: [...]}``: a nested workflow. It runs as a nested run of the
    step's run (``<run>.<step id>``), sharing its record; its steps' paths are prefixed with
    the step's path."""

    kind: Literal["workflow"]
    steps: Annotated[list[Step], Field(min_length=1)]
    name: str | None = None


Executor = Annotated[
    PythonExecutor | AgentExecutor | ScriptExecutor | ParallelExecutor | WorkflowExecutor,
    Field(discriminator="kind"),
]


class Step(_Model):
    """One step: an executor plus what the kernel does around it.

    Args:
        id: unique among its siblings; letters, digits, ``_`` and ``-`` (the step's path is
            its ids from the root joined by ``/``: ``verify/lint``).
        executor: what runs.
        owned_files: repo-relative paths taken as one all-or-nothing lease before the step
            runs (``waiting_on_lock`` while others hold them), released when it ends.
        retries: further attempts after a failure (each after ``backoff * 2**(n-1)`` s).
        timeout: seconds one attempt may run (the lock wait not included).
        inputs: JSON-like values handed to the step (``ctx.inputs``).
        needs: ids of sibling steps it depends on (default: the previous step; ``[]`` for
            none); their results are ``ctx.results``.
        agent: the agent id its writes carry (default: the workflow's ``agent``).
        view: the slice of the record it sees (``["findings/*", "log"]``; default: all).

    **Owned files.** A step's ``owned_files`` are one all-or-nothing lease (owner
    ``flow:<run>``, key ``(path, attempt)``), taken before it runs and released when it ends,
    fails or is cancelled. If they are held, the step is recorded ``waiting_on_lock`` *before*
    it queues, so a kernel restarted within the lease TTL asks again with the same key and keeps
    its FIFO place (branches started together queue in the order they ask). Writes to keys
    naming those files, through :meth:`StepContext.put` or the step's tools, are fenced with the
    lease's token.
    """

    id: StepId
    executor: Executor
    owned_files: list[str] = Field(default_factory=list)
    retries: NonNegativeInt = 0
    backoff: NonNegativeFloat = 0.5
    timeout: PositiveFloat | None = None
    inputs: dict[str, Any] = Field(default_factory=dict)
    needs: list[StepId] | None = None
    agent: str | None = None
    view: list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "executor" not in data and "kind" in data:
            data = dict(data)
            executor = {k: data.pop(k) for k in list(data) if k not in _STEP_FIELDS}
            data["executor"] = executor
        return data


class Workflow(_Model):
    """A workflow: ``name``, its ``steps`` (run in order unless ``needs`` says otherwise),
    and the default ``agent`` of its steps (default: ``name``).

    **Executors** (``kind``): ``python`` and ``agent`` (an async callable receiving a
    :class:`StepContext`; an agent's carries every store tool's schema, whatever its ``tools``
    allowlist says), ``script`` (a subprocess; environment in ``crdtstore.flow._script``),
    ``parallel`` (``branches``, ``join``: ``all`` | ``any`` | ``{at_least: K}``,
    ``max_concurrency``: branches running at once, a lock wait included) and ``workflow`` (a
    nested workflow, run as the nested run ``<run>.<step id>`` sharing the record: its writes
    and journal keys never collide with the parent's). A workflow's steps run in order;
    ``needs`` makes a step depend on named siblings instead (``[]``: on none).
    """

    name: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    steps: Annotated[list[Step], Field(min_length=1)]
    agent: str | None = None


ParallelExecutor.model_rebuild()
WorkflowExecutor.model_rebuild()
Step.model_rebuild()
Workflow.model_rebuild()


# -- loading ------------------------------------------------------------------------------------


def _loc(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("python", "agent", "script", "parallel", "workflow", "function-after"):
            continue  # the discriminator's tag, pydantic's validator names: not fields
        elif part[:1].isupper() or part.startswith(
            ("function-", "literal[", "str", "list[", "is-instance", "tagged", "callable")
        ):
            continue  # a union member's name
        else:
            out += f".{part}" if out else part
    return out


def _from_validation(exc: ValidationError) -> SpecInvalid:
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    first = errors[0]
    field = _loc(first["loc"])
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    return SpecInvalid(field, msg, [{**e, "loc": list(e["loc"])} for e in errors])


def parse_spec(data: Mapping[str, Any] | str, *, format: str = "yaml") -> Workflow:
    """A workflow from a mapping, or from JSON or YAML text, validated and checked
    (:func:`check_workflow`).

    Raises:
        SpecInvalid: malformed text, an unknown or bad field, or a failed check.
    """
    if isinstance(data, str):
        try:
            if format == "json":
                data = json.loads(data)
            else:
                import yaml  # type: ignore[import-untyped]

                data = yaml.safe_load(data)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            raise SpecInvalid("", f"not valid JSON: {exc}") from None
        except Exception as exc:  # yaml.YAMLError and its subclasses
            raise SpecInvalid("", f"not valid YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise SpecInvalid("", f"a workflow is a mapping, not {type(data).__name__}")
    try:
        wf = Workflow.model_validate(dict(data))
    except ValidationError as exc:
        raise _from_validation(exc) from None
    check_workflow(wf)
    return wf


def load_spec(source: str | os.PathLike[str] | Mapping[str, Any] | Workflow) -> Workflow:
    """The workflow of a spec file (``.json``, else YAML), a mapping or a :class:`Workflow`,
    checked (:func:`check_workflow`).

    Raises:
        SpecInvalid: the file cannot be read or parsed, or the spec is invalid.
    """
    if isinstance(source, Workflow):
        check_workflow(source)
        return source
    if isinstance(source, Mapping):
        return parse_spec(source)
    path = Path(source)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecInvalid("", f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_spec(text, format="json" if path.suffix.lower() == ".json" else "yaml")


# -- checks -------------------------------------------------------------------------------------


def resolve_call(call: StepCall, field: str = "call") -> Callable[..., Any]:
    """The async callable ``call`` names (``"pkg.module:attr.path"``) or is.

    Raises:
        SpecInvalid: it cannot be imported, is missing, or is not an async callable.
    """
    if isinstance(call, str):
        module, sep, attr = call.partition(":")
        if not sep or not module or not attr:
            raise SpecInvalid(field, f"expected 'module:function', not {call!r}")
        if module.startswith("."):
            raise SpecInvalid(field, f"{module!r} is a relative module name: give it in full")
        try:
            obj: Any = importlib.import_module(module)
        except (ImportError, ValueError) as exc:  # (ValueError: a name it cannot look up)
            raise SpecInvalid(field, f"cannot import {module!r}: {exc}") from None
        for part in attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise SpecInvalid(field, f"{module!r} has no {attr!r}") from None
    else:
        obj = call
    if not callable(obj):
        raise SpecInvalid(field, f"{call!r} is not callable")
    if not (
        inspect.iscoroutinefunction(obj)
        or inspect.iscoroutinefunction(getattr(obj, "__call__", None))  # noqa: B004
    ):
        raise SpecInvalid(field, f"{call_name(call)} is not an async function")
    return obj  # type: ignore[no-any-return]


def call_name(call: StepCall) -> str:
    """How a callable appears in the spec hash and in the kernel's state."""
    if isinstance(call, str):
        return call
    module = getattr(call, "__module__", None) or "?"
    name = getattr(call, "__qualname__", None) or type(call).__qualname__
    return f"{module}:{name}"


def check_workflow(wf: Workflow) -> None:
    """Everything that can be checked before a workflow runs: ids unique among siblings,
    ``needs`` naming earlier-or-later siblings without a cycle, ``at_least`` within the
    branch count, callables that import and are async, owned files, agents and views.

    Raises:
        SpecInvalid: naming the first bad field.
    """
    if wf.agent is not None:
        _check_agent(wf.agent, "agent")
    _check_agent(wf.agent or wf.name, "name")
    _check_steps(wf.steps, "steps")


def _check_agent(agent: str, field: str) -> None:
    try:
        check_name("agent", agent)
    except CrdtStoreError as exc:
        raise SpecInvalid(field, str(exc)) from None
    if agent == RESERVED_AGENT:
        raise SpecInvalid(field, f"{agent!r} is reserved for the kernel (it owns the state)")


def _check_steps(steps: Sequence[Step], field: str, *, branches: bool = False) -> None:
    ids: dict[str, int] = {}
    for i, step in enumerate(steps):
        if step.id in ids:
            raise SpecInvalid(f"{field}[{i}].id", f"duplicate id {step.id!r} (also {field}"
                              f"[{ids[step.id]}])")  # fmt: skip
        ids[step.id] = i
    deps = dependencies(steps)
    for i, step in enumerate(steps):
        where = f"{field}[{i}]"
        if branches and step.needs is not None:
            raise SpecInvalid(f"{where}.needs", "branches run side by side: no needs")
        for need in step.needs or ():
            if need not in ids:
                raise SpecInvalid(f"{where}.needs", f"no sibling step {need!r}")
            if need == step.id:
                raise SpecInvalid(f"{where}.needs", f"step {step.id!r} needs itself")
        _check_step(step, where)
    cycle = find_cycle(deps)
    if cycle is not None:
        names = " -> ".join(steps[i].id for i in cycle)
        raise SpecInvalid(f"{field}[{cycle[0]}].needs", f"dependency cycle {names}")


def _check_step(step: Step, where: str) -> None:
    if step.owned_files:
        try:
            canonical_resources(step.owned_files)
        except CrdtStoreError as exc:
            raise SpecInvalid(f"{where}.owned_files", str(exc)) from None
    if step.agent is not None:
        _check_agent(step.agent, f"{where}.agent")
    if step.view is not None:
        for j, path in enumerate(step.view):
            try:
                check_name("collection", path.partition("/")[0])
            except CrdtStoreError as exc:
                raise SpecInvalid(f"{where}.view[{j}]", str(exc)) from None
    ex = step.executor
    if isinstance(ex, (PythonExecutor, AgentExecutor)):
        resolve_call(ex.call, f"{where}.executor.call")
    elif isinstance(ex, ParallelExecutor):
        _check_steps(ex.branches, f"{where}.executor.branches", branches=True)
        if isinstance(ex.join, AtLeast) and ex.join.at_least > len(ex.branches):
            raise SpecInvalid(
                f"{where}.executor.join.at_least",
                f"at_least {ex.join.at_least} is more than the {len(ex.branches)} branches",
            )
    elif isinstance(ex, WorkflowExecutor):
        _check_steps(ex.steps, f"{where}.executor.steps")


def dependencies(steps: Sequence[Step]) -> list[tuple[int, ...]]:
    """Each step's dependencies as sibling indices: its ``needs``, or the previous step."""
    index = {s.id: i for i, s in enumerate(steps)}
    out: list[tuple[int, ...]] = []
    for i, step in enumerate(steps):
        if step.needs is None:
            out.append((i - 1,) if i > 0 else ())
        else:
            out.append(tuple(index[n] for n in step.needs if n in index))
    return out


def find_cycle(deps: Sequence[Sequence[int]]) -> list[int] | None:
    """A dependency cycle (indices, the first repeated at the end), or None. Iterative: a
    chain of thousands of steps must not hit the recursion limit."""
    color = [0] * len(deps)  # 0 new, 1 on the current path, 2 done
    for root in range(len(deps)):
        if color[root]:
            continue
        path: list[int] = [root]
        todo: list[list[int]] = [list(deps[root])]
        color[root] = 1
        while path:
            if not todo[-1]:
                color[path.pop()] = 2
                todo.pop()
                continue
            j = todo[-1].pop()
            if color[j] == 1:
                return [*path[path.index(j) :], j]
            if color[j] == 0:
                color[j] = 1
                path.append(j)
                todo.append(list(deps[j]))
    return None


def spec_hash(wf: Workflow) -> str:
    """A short stable hash of the spec (callables by name), recorded with the run."""

    def plain(value: Any) -> Any:
        if isinstance(value, BaseModel):
            return {k: plain(getattr(value, k)) for k in type(value).model_fields}
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if callable(value):
            return call_name(value)
        return value

    text = json.dumps(plain(wf), sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
