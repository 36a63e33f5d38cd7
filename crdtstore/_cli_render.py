"""How a record and its journal entries print: the one-line summary of an effect, the JSON of
a journal entry and of a record (with the provenance of every map key), and the record as a
rich tree. ``inspect``, ``journal`` and ``demo`` all show records this way.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from . import JournalEntry, Provenance, Record, RunInfo
from ._cli_common import _clock, _fixed_but, _line, _short


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


def record_json(rec: Record, info: RunInfo) -> dict[str, Any]:
    """The record as JSON: every collection, with the provenance of every map key."""
    collections: dict[str, Any] = {}
    agents: set[str] = set()
    for name, kind in rec.collections().items():
        if kind == "map":
            m = rec.map(name)
            entries: dict[str, Any] = {}
            for key, value in sorted(m.items()):
                prov = m.provenance(key)
                if prov is not None:
                    agents.add(prov.agent)
                entries[key] = {
                    "value": value,
                    "provenance": None if prov is None else prov.model_dump(exclude={"run"}),
                }
            collections[name] = {"kind": kind, "entries": entries}
        elif kind == "counter":
            c = rec.counter(name)
            collections[name] = {
                "kind": kind,
                "value": c.value,
                "contributions": c.contributions(),
                "max_value": c.max_value,
            }
        elif kind == "list":
            lst = rec.list(name)
            provs = lst.provenances()
            agents.update(p.agent for p in provs if p is not None)
            collections[name] = {
                "kind": kind,
                "items": lst.to_list(),
                "item_provenance": [_prov_json(p) for p in provs],
            }
        else:
            txt = rec.text(name)
            spans = txt.authorship()
            agents.update(s.provenance.agent for s in spans if s.provenance is not None)
            collections[name] = {
                "kind": kind,
                "text": txt.read(),
                "authorship": [
                    {"start": s.start, "end": s.end, "provenance": _prov_json(s.provenance)}
                    for s in spans
                ],
            }
    return {
        "tenant": info.tenant,
        "run": info.run,
        "head": info.head,
        "snapshot_seq": info.snapshot_seq,
        "applied_seq": rec.applied_seq,
        "agents": sorted(agents),
        "collections": collections,
    }


def _prov_json(p: Provenance | None) -> dict[str, Any] | None:
    return None if p is None else p.model_dump(exclude={"run"})


def _by(p: Provenance | None) -> str:
    """Who wrote a list item or a span of text, in a few characters."""
    if p is None:
        return "?"
    return f"{p.agent} ({p.source}) #{'-' if p.seq is None else p.seq}"


def _map_table(rec: Record, name: str, keys: list[str]) -> Table:
    m = rec.map(name)
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
    for key in keys:
        prov = m.provenance(key)
        table.add_row(
            Text(key, style="green"),
            _line(_short(m[key], 200)),
            "?" if prov is None else f"{prov.agent} ({prov.source})",
            "-" if prov is None or prov.seq is None else str(prov.seq),
            "-" if prov is None else _clock(prov.wall_time),
        )
    return table


def record_tree(rec: Record, title: str, max_items: int = 20) -> Tree:
    """The record as a rich tree: collections, values, and who wrote each map value."""
    tree = Tree(Text(title, style="bold"))

    def more(node: Tree, shown: int, total: int, what: str) -> None:
        if total > shown:
            node.add(Text(f"… {total - shown} more {what}", style="dim"))

    limit = max_items if max_items > 0 else None
    for name, kind in rec.collections().items():
        if kind == "map":
            keys = sorted(rec.map(name).keys())
            node = tree.add(Text.assemble((name, "bold cyan"), f"  map, {len(keys)} keys"))
            if keys:
                node.add(_map_table(rec, name, keys[:limit]))
            more(node, len(keys[:limit]), len(keys), "keys")
        elif kind == "counter":
            c = rec.counter(name)
            budget = "" if c.max_value is None else f" of {c.max_value}"
            node = tree.add(Text.assemble((name, "bold cyan"), f"  counter = {c.value}{budget}"))
            for agent, part in c.contributions().items():
                node.add(_line((f"{agent}: ", "dim"), str(part)))
        elif kind == "list":
            lst = rec.list(name)
            items = lst.to_list()
            node = tree.add(Text.assemble((name, "bold cyan"), f"  list, {len(items)} items"))
            for i, item in enumerate(items[:limit]):
                by = _by(lst.provenance(i))
                node.add(_line((f"[{i}] ", "dim"), _short(item, 200), (f"  ({by})", "dim")))
            more(node, len(items[:limit]), len(items), "items")
        else:
            txt = rec.text(name)
            text, spans = txt.read(), txt.authorship()
            lines = text.splitlines(keepends=True)
            node = tree.add(Text.assemble((name, "bold cyan"), f"  text, {len(lines)} lines"))
            at = 0
            for line in lines[:limit]:
                end = at + len(line)
                who = dict.fromkeys(
                    _by(sp.provenance) for sp in spans if sp.end > at and sp.start < end
                )
                node.add(_line(line.rstrip("\r\n"), (f"  ({', '.join(who)})", "dim")))
                at = end
            more(node, len(lines[:limit]), len(lines), "lines")
    return tree
