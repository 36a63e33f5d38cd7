"""The layers hold in the code: ``crdtstore`` never imports ``sync``, by any means (import
statements anywhere, ``importlib`` or ``__import__`` with a module name), and ``sync`` adds its
commands and backends through entry points; the codec is the one reader of lib0 bytes."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest
from typer.testing import CliRunner

from crdtstore import _cli_plugins
from crdtstore.cli import app

ROOT = pathlib.Path(__file__).resolve().parents[2]
_SYNC_MODULE = re.compile(r"^sync(\.\w+)*(:\w+)?$")


def _names_sync(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(_SYNC_MODULE.match(alias.name) for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and node.module is not None and bool(_SYNC_MODULE.match(node.module))
    if isinstance(node, ast.Call):
        # importlib.import_module("sync..."), __import__("sync"), find_spec, EntryPoint(...):
        # any call given a module path of sync as a string
        return any(
            isinstance(arg, ast.Constant)
            and isinstance(arg.value, str)
            and bool(_SYNC_MODULE.match(arg.value))
            for arg in [*node.args, *(k.value for k in node.keywords)]
        )
    return False


def test_crdtstore_source_never_imports_sync() -> None:
    offenders = []
    for path in sorted((ROOT / "crdtstore").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if _names_sync(node):
                offenders.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}")
    assert offenders == []


@pytest.mark.parametrize(
    "source",
    [
        "import sync",
        "import sync._cli as c",
        "from sync import Hub",
        "from sync._hub import Hub",
        "def f():\n    import sync._client",
        "import importlib\nimportlib.import_module('sync._cli')",
        "__import__('sync')",
        "import importlib\nimportlib.import_module(name='sync')",
    ],
)
def test_the_layering_check_sees_every_way(source: str) -> None:
    assert any(_names_sync(node) for node in ast.walk(ast.parse(source)))


def test_the_layering_check_leaves_other_names_alone() -> None:
    source = "from . import _sync_helpers\nimport asyncio\nx = 'sync step 1'\nf('synced')"
    assert not any(_names_sync(node) for node in ast.walk(ast.parse(source)))


def test_builtin_commands_run_without_loading_sync() -> None:
    code = (
        "import sys; from typer.testing import CliRunner; from crdtstore.cli import app;"
        "r = CliRunner().invoke(app, ['journal', '--help']); assert r.exit_code == 0, r.output;"
        "bad = [m for m in sys.modules if m == 'sync' or m.startswith('sync.')];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sync_registers_its_commands_and_backends_by_entry_points() -> None:
    registered = _cli_plugins._registered()
    assert {n: ep.value for n, ep in registered.items() if n in ("serve", "token")} == {
        "serve": "sync._cli:serve_command",
        "token": "sync._cli:token_app",
    }
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "serve" in result.output and "token" in result.output
    result = CliRunner().invoke(app, ["token", "revoke", "--help"])
    assert result.exit_code == 0 and "--jti" in result.output


def test_a_command_that_fails_to_load_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = EntryPoint("frobnicate", "no_such_module_xyz:cmd", _cli_plugins.COMMANDS_GROUP)
    shadow = EntryPoint("journal", "no_such_module_xyz:cmd", _cli_plugins.COMMANDS_GROUP)
    registered = {**_cli_plugins._registered(), "frobnicate": broken, "journal": shadow}
    monkeypatch.setattr(_cli_plugins, "_registered", lambda: registered)
    runner = CliRunner()
    result = runner.invoke(app, ["frobnicate", "--x", "1"])
    assert result.exit_code == 1
    assert "'frobnicate'" in result.output and "failed to load" in result.output
    assert "no_such_module_xyz" in result.output
    listing = runner.invoke(app, ["--help"])
    assert listing.exit_code == 0 and "frobnicate" in listing.output
    # a plugin cannot replace a built-in command
    assert runner.invoke(app, ["journal", "--help"]).exit_code == 0


# -- sync uses crdtstore only through its public and documented extension points -------------

_PUBLIC = {"crdtstore", "crdtstore.codec", "crdtstore.record", "crdtstore.backend"}
# names a record, store or replica is held by in sync (``rec._pending`` is a private reach;
# ``self.journal._wake_run`` on sync's own WsJournal is not)
_CRDTSTORE_HOLDERS = {"rec", "record", "store", "replica", "backend", "leases", "commit"}


def _holder(node: ast.AST) -> str | None:
    """The name ``node`` is held by (``rec`` of ``rec`` or of ``room.rec``), if any."""
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)


def _crdtstore_reaches(source: str) -> list[str]:
    """What ``source`` (a module of sync) takes from crdtstore that is not public: an import
    of a module outside :data:`_PUBLIC`, an underscore name imported from crdtstore, a
    private attribute of a name that holds a crdtstore object, or a class subclassing one."""
    out = []
    tree = ast.parse(source)
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("crdtstore") and alias.name not in _PUBLIC:
                    out.append(f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("crdtstore"):
                if node.module not in _PUBLIC:
                    out.append(f"from {node.module}")
                for alias in node.names:
                    imported.add(alias.asname or alias.name)
                    if alias.name.startswith("_"):
                        out.append(f"from {node.module} import {alias.name}")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            name = _holder(node.value)
            if name in _CRDTSTORE_HOLDERS and not node.attr.startswith("__"):
                out.append(f"{name}.{node.attr}")
        elif (  # getattr(rec, "_x"), setattr(commit, "_x", ...), hasattr(...)
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and node.args[1].value.startswith("_")
            and not node.args[1].value.startswith("__")
        ):
            name = _holder(node.args[0])
            if name in _CRDTSTORE_HOLDERS:
                out.append(f"{node.func.id}({name}, {node.args[1].value!r})")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for b in node.bases:
                if isinstance(b, ast.Name) and b.id in imported and b.id[:1].isupper():
                    try:
                        import crdtstore

                        obj = getattr(crdtstore, b.id, None)
                    except ImportError:  # pragma: no cover
                        obj = None
                    if obj in (crdtstore.Record, crdtstore.Store, crdtstore.Replica):
                        out.append(f"class {node.name}({b.id})")
    return out


def test_sync_reaches_crdtstore_only_through_public_extension_points() -> None:
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in sorted((ROOT / "sync").rglob("*.py"))
        if (found := _crdtstore_reaches(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}


@pytest.mark.parametrize(
    "source",
    [
        "from crdtstore._journal import Row",
        "import crdtstore._store",
        "from crdtstore import _errors",
        "def f(rec):\n    return rec._pending",
        "def f(room):\n    room.rec._urge()",
        "def f(ctx):\n    ctx.store._notifier.watch()",
        "from crdtstore import Record\nclass _HubRecord(Record):\n    pass",
        "def f(room, g):\n    room.commit._append_now = g",
        "def f(room):\n    return getattr(room.rec, '_jrun', None)",
        "def f(commit, g):\n    setattr(commit, '_append_now', g)",
    ],
)
def test_the_boundary_check_sees_private_reaches(source: str) -> None:
    assert _crdtstore_reaches(source)


def test_the_boundary_check_leaves_public_use_alone() -> None:
    source = (
        "from crdtstore import Record, Writer\nfrom crdtstore.backend import Row\n"
        "from crdtstore.record import LoopCommit\n"
        "def f(rec, self):\n    rec.apply_update(b'', writer=None)\n    self._x = rec.store\n"
    )
    assert _crdtstore_reaches(source) == []


# pycrdt's private attributes the record relies on: only crdtstore/record/_pycrdt.py may name them
_PYCRDT_PRIVATE = {
    "_integrated",
    "_txn",
    "_doc",
    "_maybe_as_type_or_doc",
    "_allow_multithreading",
    "_exceptions",
}


def _names_pycrdt_private(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in _PYCRDT_PRIVATE
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").startswith("pycrdt._")
    if isinstance(node, ast.Import):
        return any(a.name.startswith("pycrdt._") for a in node.names)
    return False


def _private_pycrdt_uses(source: str) -> list[int]:
    return [n.lineno for n in ast.walk(ast.parse(source)) if _names_pycrdt_private(n)]  # type: ignore[attr-defined]


def test_only_the_adapter_reaches_into_pycrdt() -> None:
    adapter = ROOT / "crdtstore" / "record" / "_pycrdt.py"
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for pkg in ("crdtstore", "sync")
        for path in sorted((ROOT / pkg).rglob("*.py"))
        if path != adapter
        for line in _private_pycrdt_uses(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
    assert _private_pycrdt_uses(adapter.read_text(encoding="utf-8"))  # (the check sees them)
    assert _private_pycrdt_uses("from pycrdt._base import BaseType\nx = root._integrated")
