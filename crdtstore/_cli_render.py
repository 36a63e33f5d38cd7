"""How a record and its journal entries print: the one-line summary of an effect, the JSON of
a journal entry and of a record (with the provenance of every map key), and the record as a
rich tree. ``inspect``, ``journal`` and ``demo`` all show records this way; what a record
shows (its cells and their provenance) comes from ``_render``, shared with ``crdtstore.sim``.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from . import JournalEntry, Record, RunInfo, Span
from ._cli_common import _clock, _fixed_but, _line, _short
from ._counter_rules import number
from ._render import Cell, Rows, record_rows


def _shown(value: Any) -> str:
    """A value as a summary shows it; a redacted one as who redacted it (and why)."""
    if type(value) is dict and len(value) == 1 and "$redacted" in value:
        note = value["$redacted"] if type(value["$redacted"]) is dict else {}
        why = f": {note['reason']}" if note.get("reason") else ""
        return f"<redacted by {note.get('agent', '?')}{why}>"
    return _short(value, 40)


def _op_summary(op: list[Any]) -> str:
    kind, name, what = op[0], op[1], op[2]
    if what == "redact":  # [kind, collection, "redact", key or index, reason]
        why = f" ({op[4]})" if len(op) > 4 and op[4] else ""
        return f"redact {name}[{op[3]!r}]{why}"
    if kind == "map":
        return (
            f"{name}[{op[3]!r}] = {_shown(op[4])}" if what == "set" else (f"del {name}[{op[3]!r}]")
        )
    if kind == "list":
        if what == "ins":
            return f"{name} +{len(op[4])} item{'s' if len(op[4]) != 1 else ''} @{op[3]}"
        return f"{name} -{op[4]} item{'s' if op[4] != 1 else ''} @{op[3]}"
    if kind == "text":
        if what == "ins":
            redacted = f" {_shown(op[5])}" if len(op) > 5 else ""
            return f"{name} +{len(op[4])} chars @{op[3]}{redacted}"
        return f"{name} -{op[4]} chars @{op[3]}"
    return _short(op, 40)  # pragma: no cover - an effect of a newer version


def effect_summary(effect: list[list[Any]], width: int = 120) -> str:
    """A one-line human summary of a journal entry's effect."""
    if not effect:
        return "(raw update)"
    text = "; ".join(_op_summary(op) for op in effect)
    return text if len(text) <= width else text[: width - 1] + "…"


def _entry_json(e: JournalEntry) -> dict[str, Any]:
    return {
        "seq": e.seq,
        "agent": e.agent,
        "source": e.source,
        "client_id": e.client_id,
        "wall_time": e.wall_time,
        "size": e.size,
        "effect": e.effect,
        "summary": effect_summary(e.effect),
        "call": e.call or None,
    }


def _prov_json(c: Cell | None) -> dict[str, Any] | None:
    """A cell's provenance as ``Provenance.model_dump(exclude={"run"})`` gives it."""
    if c is None or c.agent is None or c.wall_time is None:
        return None
    return {
        "agent": c.agent,
        "source": c.source,
        "wall_time": c.wall_time,
        "seq": c.seq,
        "call": None,
    }


def _span_json(s: Span) -> dict[str, Any]:
    p = s.provenance
    return {
        "start": s.start,
        "end": s.end,
        "provenance": None if p is None else p.model_dump(exclude={"run"}),
    }


def _entry_value(sibs: list[Cell]) -> Any:
    """A map entry's value: its one value, or a keep_all key's siblings as ``to_dict`` shows
    them (``{"__conflict__": [...]}``)."""
    if len(sibs) == 1:
        return sibs[0].value
    return {
        "__conflict__": [
            {
                "value": c.value,
                "agent": c.agent,
                "source": c.source,
                "wall_time": c.wall_time,
                "token": c.token,
            }
            for c in sibs
        ]
    }


def _by_key(rows: Rows) -> dict[str | None, list[Cell]]:
    out: dict[str | None, list[Cell]] = {}
    for c in rows.cells:
        out.setdefault(c.key, []).append(c)
    return out


def _collection_json(r: Rows) -> dict[str, Any]:
    if r.kind == "counter":
        parts: dict[str, int | float] = {}
        for c in r.cells:
            parts[str(c.agent)] = parts.get(str(c.agent), 0) + c.value
        return {
            "kind": r.kind,
            "value": r.total,
            "contributions": {a: number(v) for a, v in sorted(parts.items())},
            "max_value": r.max_value,
        }
    if r.kind == "list":
        return {
            "kind": r.kind,
            "items": [c.value for c in r.cells],
            "item_provenance": [_prov_json(c) for c in r.cells],
        }
    if r.kind == "text":
        (c,) = r.cells
        return {"kind": r.kind, "text": c.value, "authorship": [_span_json(s) for s in c.spans]}
    entries = {
        str(key): {"value": _entry_value(sibs), "provenance": _prov_json(sibs[-1])}
        for key, sibs in _by_key(r).items()
    }
    return {"kind": r.kind, "entries": entries}


def record_json(rec: Record, info: RunInfo) -> dict[str, Any]:
    """The record as JSON: every collection, with the provenance of every map key, list
    item and span of text."""
    shown = record_rows(rec)
    agents = {c.agent for r in shown for c in r.cells if c.agent is not None and c.kind != "text"}
    agents.update(
        s.provenance.agent
        for r in shown
        for c in r.cells
        for s in c.spans
        if s.provenance is not None
    )
    return {
        "tenant": info.tenant,
        "run": info.run,
        "head": info.head,
        "snapshot_seq": info.snapshot_seq,
        "applied_seq": rec.applied_seq,
        "agents": sorted(agents),
        "collections": {r.name: _collection_json(r) for r in shown},
    }


def _by(agent: str | None, source: str | None, seq: int | None) -> str:
    """Who wrote a list item or a span of text, in a few characters."""
    if agent is None:
        return "?"
    return f"{agent} ({source}) #{'-' if seq is None else seq}"


def _span_by(s: Span) -> str:
    p = s.provenance
    return _by(None, None, None) if p is None else _by(p.agent, p.source, p.seq)


def _map_table(cs: list[Cell]) -> Table:
    table = Table(
        "key",
        "value",
        "written by",
        "seq",
        "at",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        header_style="dim",
    )
    _fixed_but(table, 1)
    for c in cs:
        key = Text(str(c.key), style="green")
        if c.conflicted:
            key.append(f" [{c.siblings} siblings]", style="yellow")
        table.add_row(
            key,
            _line(_short(c.value, 200)),
            "?" if c.agent is None else f"{c.agent} ({c.source})",
            "-" if c.seq is None else str(c.seq),
            "-" if c.wall_time is None else _clock(c.wall_time),
        )
    return table


def record_tree(rec: Record, title: str, max_items: int = 20) -> Tree:
    """The record as a rich tree: collections, values, and who wrote each of them."""
    tree = Tree(Text(title, style="bold"))

    def more(node: Tree, shown: int, total: int, what: str) -> None:
        if total > shown:
            node.add(Text(f"… {total - shown} more {what}", style="dim"))

    limit = max_items if max_items > 0 else None
    for r in record_rows(rec):
        name = r.name
        if r.kind == "map":
            keys = r.keys()
            node = tree.add(Text.assemble((name, "bold cyan"), f"  map, {len(keys)} keys"))
            kept = set(keys[:limit])
            if keys:
                node.add(_map_table([c for c in r.cells if c.key in kept]))
            more(node, len(kept), len(keys), "keys")
        elif r.kind == "counter":
            budget = "" if r.max_value is None else f" of {r.max_value}"
            node = tree.add(Text.assemble((name, "bold cyan"), f"  counter = {r.total}{budget}"))
            for agent, part in _collection_json(r)["contributions"].items():
                node.add(_line((f"{agent}: ", "dim"), str(part)))
        elif r.kind == "list":
            items = r.cells
            node = tree.add(Text.assemble((name, "bold cyan"), f"  list, {len(items)} items"))
            for c in items[:limit]:
                by = _by(c.agent, c.source, c.seq)
                node.add(_line((f"[{c.key}] ", "dim"), _short(c.value, 200), (f"  ({by})", "dim")))
            more(node, len(items[:limit]), len(items), "items")
        else:
            (c,) = r.cells
            lines = str(c.value).splitlines(keepends=True)
            node = tree.add(Text.assemble((name, "bold cyan"), f"  text, {len(lines)} lines"))
            at = 0
            for line in lines[:limit]:
                end = at + len(line)
                who = dict.fromkeys(_span_by(s) for s in c.spans if s.end > at and s.start < end)
                node.add(_line(line.rstrip("\r\n"), (f"  ({', '.join(who)})", "dim")))
                at = end
            more(node, len(lines[:limit]), len(lines), "lines")
    return tree
