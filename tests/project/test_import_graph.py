"""The import graph of crdtstore/ and sync/, read from the source: no circle, and crdtstore
never imports sync (DESIGN.md, "Layers"; issue 15).

Every import counts, at module level or inside a function, and so does a string given to
``importlib.import_module``; imports under ``if TYPE_CHECKING:`` do not (they never run).
Importing ``a.b.c`` runs the ``__init__`` of ``a.b`` too: that is an edge to ``a.b`` as well,
unless the importer is inside ``a.b`` (its package is being imported already).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("crdtstore", "sync")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(source: str, module: str, is_package: bool) -> Iterator[str]:
    """The dotted names ``source`` (the text of ``module``) imports at run time: for
    ``from x import y`` both ``x`` and ``x.y`` (``y`` may be a module)."""

    def absolute(level: int, name: str | None) -> str:
        if level == 0:
            return name or ""
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (level - 1)]
        return ".".join([*base, name] if name else base)

    def visit(nodes: list[ast.stmt] | list[ast.AST]) -> Iterator[str]:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                yield from visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                yield from (alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = absolute(node.level, node.module)
                yield base
                yield from (f"{base}.{alias.name}" for alias in node.names)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute | ast.Name)
                and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
                == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                yield node.args[0].value
            yield from visit(list(ast.iter_child_nodes(node)))

    yield from visit(ast.parse(source).body)


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of crdtstore/ and sync/ it imports (see the module docstring)."""
    files = {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        edges: set[str] = set()
        for name in imported_names(path.read_text(), module, path.name == "__init__.py"):
            while name and name not in files:  # (an attribute of a module: that module)
                name = name.rpartition(".")[0]
            while name:
                if name != module and not module.startswith(name + "."):
                    edges.add(name)
                name = name.rpartition(".")[0]  # its packages' __init__ run too
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(frozenset(component))
    return out


def test_the_parser_counts_what_runs() -> None:
    source = (
        "import importlib\n"
        "from typing import TYPE_CHECKING\n"
        "from . import _b\n"
        "from ._c import thing\n"
        "if TYPE_CHECKING:\n"
        "    from ._d import Type\n"
        "def f():\n"
        "    from .._e import g\n"
        "    return importlib.import_module('sync._cli')\n"
    )
    names = set(imported_names(source, "crdtstore.record._a", is_package=False))
    assert {"crdtstore.record._b", "crdtstore.record._c", "crdtstore._e", "sync._cli"} <= names
    assert not any(n.startswith("crdtstore.record._d") for n in names)


def test_the_graph_sees_the_package() -> None:
    graph = import_graph()
    assert "crdtstore.record._record" in graph["crdtstore._store"]
    assert "crdtstore.record" in graph["crdtstore._store"]  # its __init__ runs first
    # collections know their record only as a protocol (a TYPE_CHECKING import at most)
    assert not any(
        m.startswith("crdtstore.record._record") for m in graph["crdtstore.record._maps"]
    )


def test_no_import_circle() -> None:
    found = cycles(import_graph())
    assert [sorted(c) for c in found] == []


def test_crdtstore_never_imports_sync() -> None:
    bad = {
        (module, target)
        for module, targets in import_graph().items()
        if module.split(".")[0] == "crdtstore"
        for target in targets
        if target.split(".")[0] == "sync"
    }
    assert sorted(bad) == []


MAX_MODULE_LINES = 600


def test_modules_stay_small() -> None:
    # one concept per module (issue 15): no module of crdtstore/ or sync/ past ~600 lines;
    # split a bigger one by concept into private modules
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines())
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
    }
    assert len(sizes) > 100  # (the walk found the packages)
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


MAX_DOCSTRING_LINES = 20
# the record package's design drawing (the modules and which may import which) is longer
DOCSTRING_LINES_ALLOWED = {"crdtstore/record/__init__.py": 40}


def test_module_docstrings_stay_short() -> None:
    # a module docstring says what the module is for and why it is shaped so, in about 20
    # lines (issue 15); reference material (a wire format, an error table) goes to the class
    # or function it describes, figures to bench/
    lines = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(p.read_text()), clean=False)
            lines[str(p.relative_to(ROOT).as_posix())] = len(doc.splitlines()) if doc else 0
    assert len(lines) > 100  # (the walk found the packages)
    assert [name for name, n in lines.items() if n == 0] == []
    too_long = {
        name: n
        for name, n in lines.items()
        if n > DOCSTRING_LINES_ALLOWED.get(name, MAX_DOCSTRING_LINES)
    }
    assert too_long == {}


# crdtstore/record/__init__.py's drawing, top to bottom: a module imports only those below it
RECORD_LAYERS = [
    "_record",
    "_foreign",
    "_guarded",
    "_guarded_group",
    "_pipeline",
    "_journal_link",
    "_loop_commit",
    "_changes",
    "_policies",
    "_state",
    "_view",
    "_fields",
    "_counter",
    "_maps",
    "_collections",
    "_replica",
    "_external",
    "_effects",
    "_bulk_load",
    "_replay",
    "_document",
    "_item_provenance",
    "_text_ids",
    "_provenance",
    "_settled",
    "_pycrdt",
    "_textdiff",
]


def test_record_modules_import_only_those_below() -> None:
    graph = import_graph()
    modules = {p.stem for p in (ROOT / "crdtstore/record").glob("_*.py")} - {"__init__"}
    assert modules == set(RECORD_LAYERS)  # a new module takes its place in the drawing
    rank = {name: i for i, name in enumerate(RECORD_LAYERS)}
    upward = [
        (name, target)
        for name in RECORD_LAYERS
        for target in sorted(graph[f"crdtstore.record.{name}"])
        if target.startswith("crdtstore.record.") and rank[target.rpartition(".")[2]] <= rank[name]
    ]
    assert upward == []
