"""The public surface: __all__ is exact, errors carry stable codes, layering holds."""

from __future__ import annotations

import subprocess
import sys

import crdtstore
from crdtstore import _errors


def test_all_matches_importable_names() -> None:
    public = {n for n in dir(crdtstore) if not n.startswith("_")}
    modules = {"blocking", "testing", "cli", "sim", "record", "codec", "flow", "tools", "backend"}
    assert set(crdtstore.__all__) == public - modules
    assert crdtstore.__all__ == sorted(crdtstore.__all__)
    for name in crdtstore.__all__:
        assert getattr(crdtstore, name) is not None


def test_every_error_has_a_unique_stable_code() -> None:
    errors = [getattr(_errors, n) for n in _errors.__all__]
    codes = [e.code for e in errors]
    assert len(codes) == len(set(codes))
    assert all(issubclass(e, crdtstore.CrdtStoreError) for e in errors)
    err = crdtstore.UnknownRun("t", "r")
    assert isinstance(err, LookupError)
    assert err.to_dict() == {
        "code": "UNKNOWN_RUN",
        "message": "unknown run 'r' in tenant 't'",
        "tenant": "t",
        "run": "r",
    }


def test_crdtstore_never_imports_sync() -> None:
    code = (
        "import sys, crdtstore, crdtstore.blocking, crdtstore.testing, crdtstore.cli;"
        "import crdtstore.sim, crdtstore.tools, crdtstore.tools._mcp, crdtstore.flow;"
        "bad = [m for m in sys.modules if m == 'sync' or m.startswith('sync.')];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_readme_lists_every_error_code() -> None:
    """README.md's error table names every stable code (a new error is documented)."""
    import inspect
    import pathlib

    import crdtstore._errors
    import crdtstore.flow._errors
    import sync._errors
    import sync._tokens

    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    codes = {
        obj.code
        for mod in (crdtstore._errors, crdtstore.flow._errors, sync._errors, sync._tokens)
        for obj in vars(mod).values()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and "code" in vars(obj)
    }
    assert len(codes) > 30
    assert sorted(c for c in codes if f"| `{c}` |" not in readme) == []
