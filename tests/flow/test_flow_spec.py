"""Workflow specs: the YAML of the issue, JSON, flat and nested steps, and bad specs refused
before anything runs with an error naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import crdtstore
from crdtstore.flow import (
    FlowError,
    JoinFailed,
    KernelBusy,
    ParallelExecutor,
    ScriptExecutor,
    SpecChanged,
    SpecInvalid,
    StepFailed,
    StepTimeout,
    Workflow,
    flow_status,
    load_spec,
    parse_spec,
    run_workflow,
    spec_hash,
)


async def apply_patch(ctx: Any) -> dict[str, bool]:
    return {"ok": True}


def not_async(ctx: Any) -> None:
    return None


ISSUE_YAML = """
name: checks
steps:
  - id: edit
    executor: {kind: python, call: "tests.flow.test_flow_spec:apply_patch"}
    owned_files: ["src/auth.rs", "src/session.rs"]
  - id: verify
    executor:
      kind: parallel
      join: all            # any | {at_least: 2}
      max_concurrency: 4
      branches:
        - {id: lint, kind: script, run: "ruff check ."}
        - {id: unit, kind: script, run: "pytest -q"}
        - {id: audit, kind: script, run: "pip-audit"}
"""


def test_the_issue_yaml_parses(tmp_path: Path) -> None:
    wf = parse_spec(ISSUE_YAML)
    assert wf.name == "checks" and [s.id for s in wf.steps] == ["edit", "verify"]
    verify = wf.steps[1].executor
    assert isinstance(verify, ParallelExecutor)
    assert verify.join == "all" and verify.max_concurrency == 4
    assert [b.id for b in verify.branches] == ["lint", "unit", "audit"]
    assert isinstance(verify.branches[0].executor, ScriptExecutor)
    # the same as a file, YAML or JSON, and the same hash
    (tmp_path / "a.yaml").write_text(ISSUE_YAML)
    (tmp_path / "a.json").write_text(json.dumps(__import__("yaml").safe_load(ISSUE_YAML)))
    assert spec_hash(load_spec(tmp_path / "a.yaml")) == spec_hash(wf)
    assert spec_hash(load_spec(str(tmp_path / "a.json"))) == spec_hash(wf)


def test_join_forms_and_hash_changes() -> None:
    base: dict[str, Any] = {"name": "w", "steps": [{"id": "p", "kind": "parallel", "branches": [
        {"id": "a", "kind": "script", "run": "true"},
        {"id": "b", "kind": "script", "run": ["true"]}]}]}  # fmt: skip
    h = spec_hash(parse_spec(base))
    for join in ("any", {"at_least": 2}):
        base["steps"][0]["join"] = join
        wf = parse_spec(base)
        assert spec_hash(wf) != h
    assert spec_hash(parse_spec(base)) == spec_hash(parse_spec(json.loads(json.dumps(base))))


def test_callables_in_python_specs_hash_by_name() -> None:
    a = parse_spec({"name": "w", "steps": [{"id": "s", "kind": "python", "call": apply_patch}]})
    b = parse_spec({"name": "w", "steps": [
        {"id": "s", "kind": "python", "call": f"{__name__}:apply_patch"}]})  # fmt: skip
    assert spec_hash(a) == spec_hash(b)


BAD = [
    ({"name": "w", "steps": [{"id": "s", "kind": "nope"}]}, "steps[0].executor", "tag"),
    ({"name": "w", "steps": [{"id": "s", "executor": {"kind": "script", "run": "x", "shell": 1}}]},
     "steps[0].executor.shell", "unknown field"),
    ({"name": "w", "steps": [{"id": "s", "kind": "script", "run": "x", "retry": 2}]},
     "steps[0].executor.retry", "unknown field"),
    ({"name": "w", "steps": [{"id": "s", "kind": "script", "run": "x"}], "extra": 1},
     "extra", "unknown field"),
    ({"name": "w", "steps": [{"id": "a", "kind": "script", "run": "x"},
                             {"id": "a", "kind": "script", "run": "y"}]},
     "steps[1].id", "duplicate id"),
    ({"name": "w", "steps": [{"id": "a", "kind": "script", "run": "x", "needs": ["b"]},
                             {"id": "b", "kind": "script", "run": "y", "needs": ["a"]}]},
     "steps[0].needs", "cycle"),
    ({"name": "w", "steps": [{"id": "a", "kind": "script", "run": "x", "needs": ["zz"]}]},
     "steps[0].needs", "no sibling"),
    ({"name": "w", "steps": [{"id": "p", "kind": "parallel", "join": {"at_least": 3},
                              "branches": [{"id": "a", "kind": "script", "run": "x"},
                                           {"id": "b", "kind": "script", "run": "y"}]}]},
     "steps[0].executor.join.at_least", "more than the 2 branches"),
    ({"name": "w", "steps": [{"id": "s", "kind": "python", "call": "tests.nowhere:f"}]},
     "steps[0].executor.call", "cannot import"),
    ({"name": "w", "steps": [{"id": "s", "kind": "python", "call": f"{__name__}:zz"}]},
     "steps[0].executor.call", "has no"),
    ({"name": "w", "steps": [{"id": "s", "kind": "python",
                              "call": f"{__name__}:not_async"}]},
     "steps[0].executor.call", "not an async"),
    ({"name": "w", "steps": [{"id": "s", "kind": "python", "call": "no-colon"}]},
     "steps[0].executor.call", "module:function"),
    ({"name": "w", "steps": [{"id": "s", "kind": "script", "run": "x",
                              "owned_files": ["/etc/passwd"]}]},
     "steps[0].owned_files", "absolute"),
    ({"name": "w", "steps": [{"id": "bad/id", "kind": "script", "run": "x"}]}, "steps[0].id", ""),
    ({"name": "w", "steps": []}, "steps", ""),
    ({"name": "w", "steps": [{"id": "p", "kind": "parallel", "branches": [
        {"id": "a", "kind": "workflow", "steps": [{"id": "x", "kind": "agent", "call": "m:f"}]}]}]},
     "steps[0].executor.branches[0].executor.steps[0].executor.call", "cannot import"),
    ({"name": "w", "steps": [{"id": "s", "kind": "script", "run": "x", "agent": "flow-kernel"}]},
     "steps[0].agent", "reserved"),
    ({"name": "w", "steps": [{"id": "s", "kind": "script", "run": "x", "timeout": 0}]},
     "steps[0].timeout", ""),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "field", "words"), BAD)
def test_bad_specs_name_the_field(spec: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecInvalid) as info:
        parse_spec(spec)
    assert info.value.field == field, str(info.value)
    assert words in str(info.value)
    assert info.value.to_dict()["code"] == "SPEC_INVALID"


def test_malformed_text_and_files(tmp_path: Path) -> None:
    with pytest.raises(SpecInvalid, match="YAML"):
        parse_spec("name: [unclosed")
    with pytest.raises(SpecInvalid, match="JSON"):
        parse_spec("{", format="json")
    with pytest.raises(SpecInvalid, match="mapping"):
        parse_spec("- a list")
    with pytest.raises(SpecInvalid, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")


async def test_a_bad_spec_runs_nothing(anyio_backend: str) -> None:
    spec = {"name": "w", "steps": [
        {"id": "a", "kind": "python", "call": apply_patch},
        {"id": "b", "kind": "parallel", "join": {"at_least": 5},
         "branches": [{"id": "x", "kind": "script", "run": "true"}]}]}  # fmt: skip
    async with crdtstore.open_store("memory://") as store:
        with pytest.raises(SpecInvalid):
            await run_workflow(store, spec, "r1")
        with pytest.raises(crdtstore.UnknownRun):
            await flow_status(store, "r1")  # not even the run was created


def test_errors_are_one_tree_with_stable_codes() -> None:
    classes = [FlowError, SpecInvalid, SpecChanged, KernelBusy, StepFailed, StepTimeout, JoinFailed]
    codes = [c.code for c in classes]
    assert codes == ["FLOW_ERROR", "SPEC_INVALID", "SPEC_CHANGED", "FLOW_RUNNING", "STEP_FAILED",
                     "STEP_TIMEOUT", "JOIN_FAILED"]  # fmt: skip
    assert all(issubclass(c, crdtstore.CrdtStoreError) for c in classes)
    assert issubclass(SpecInvalid, ValueError) and issubclass(StepTimeout, TimeoutError)
    err = JoinFailed("p", 1, "all", {"a": {"state": "done", "result": 1}, "b": {"state": "failed"}})
    d = err.to_dict()
    assert d["code"] == "JOIN_FAILED" and d["outcomes"]["b"]["state"] == "failed"
    assert "1 of 2" in str(err)
    assert crdtstore._errors.error_from_dict(d).code == "JOIN_FAILED"


def test_flow_public_names() -> None:
    import crdtstore.flow as flow

    public = {n for n in dir(flow) if not n.startswith("_")}
    assert flow.__all__ == sorted(flow.__all__)
    assert set(flow.__all__) == public
    assert Workflow is flow.Workflow
