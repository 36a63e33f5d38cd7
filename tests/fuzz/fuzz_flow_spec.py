"""Fuzz target: the workflow spec loader (crdtstore.flow, its spec module).

The first byte picks the format (even: YAML, odd: JSON); the rest is the spec's text. Only
``SpecInvalid`` may escape ``parse_spec``; a spec that loads dumps to a mapping that loads
again to an equal workflow with the same ``spec_hash``, and passes ``check_workflow`` again.

A spec names its callables by module; the loader imports them. So that fuzzed names import
nothing, only modules already imported can be found while the target runs (others are
"cannot import", which the loader reports as ``SpecInvalid``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.fuzz._harness import instrumented, main

with instrumented():
    from crdtstore.flow._errors import SpecInvalid
    from crdtstore.flow._spec import check_workflow, parse_spec, spec_hash


class _LoadedOnly:
    """A meta path finder that finds nothing: an import of a module not loaded yet fails."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        raise ModuleNotFoundError(f"fuzzing: {name!r} is not imported", name=name)


_GUARD: list[bool] = []  # [True] once the finder is to be armed (when run as a script)


def check(data: bytes) -> None:
    if _GUARD and _LoadedOnly not in sys.meta_path:
        sys.meta_path.insert(0, _LoadedOnly)  # type: ignore[arg-type]
    if not data:
        return
    fmt = "json" if data[0] & 1 else "yaml"
    text = data[1:].decode("utf-8", "replace")
    try:
        wf = parse_spec(text, format=fmt)
    except SpecInvalid as exc:
        assert exc.code == "SPEC_INVALID", exc.code
        return
    digest = spec_hash(wf)
    again = parse_spec(wf.model_dump(mode="python", exclude_unset=True))
    assert again == wf, (again, wf)
    assert spec_hash(again) == digest
    check_workflow(again)


WARM_UP = (
    b"\x00name: w\nsteps:\n- {id: a, kind: python, call: 'asyncio:sleep'}\n",
    b'\x01{"name": "w", "steps": [{"id": "a", "kind": "script", "run": "true"}]}',
)

if __name__ == "__main__":
    for seed in WARM_UP:  # (what parsing imports lazily is imported before the finder)
        check(seed)
    _GUARD.append(True)
    main(check)
