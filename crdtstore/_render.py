"""What a record shows to people, decided once: every value as a :class:`Cell` (collection,
kind, key, value and who wrote it), grouped by collection as :class:`Rows`.

Read from a live :class:`~crdtstore.Record` (its declared ``keep_all``, ``merge="fields"``
and counter collections, the provenance of map keys, list items and spans of text), a
:class:`~crdtstore.record._replica.Replica` (a journal position, as ``store.replay``
returns it: map provenance; ``keep_all`` and field maps recognised by their layout) or a
plain snapshot (``rec.to_dict()``, a simulator state: no provenance). The CLI
(``_cli_render``: a rich tree and ``inspect --json``) and the simulator's views
(``crdtstore.sim``: text and HTML tables) only format these rows, so both show the same
record the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ._counter_rules import agent_of_key
from ._models import Provenance, Span
from .record._fields import RS
from .record._maps import SEP
from .record._provenance import Meta
from .record._record import Record
from .record._replica import Replica

__all__ = ["Cell", "Rows", "Source", "cells", "record_rows", "rows", "short"]

Source = Record | Replica | Mapping[str, Any]


@dataclass(frozen=True)
class Cell:
    """One value of a record, with where it came from.

    ``kind`` is ``map``, ``keep_all`` (one cell per sibling: ``token`` tells them apart,
    ``siblings`` counts them), ``fields`` (one cell per entry of a ``merge="fields"`` map,
    its fields as a dict, unresolved ones as ``{"__conflict__": [...]}``), ``counter`` (one
    cell per contribution), ``list`` or ``text``; ``key`` is the map key, the list index
    (as text) or None for a text. Provenance fields are None when the source does not know
    them: ``seq`` is the journal position of the write, ``spans`` a text's authorship,
    ``tick`` and ``write`` the simulated time and write id (simulations only).
    """

    collection: str
    kind: str
    key: str | None
    value: Any
    agent: str | None = None
    source: str | None = None
    seq: int | None = None
    wall_time: float | None = None
    token: str | None = None
    siblings: int = 1
    tick: int | None = None
    write: int | None = None
    spans: tuple[Span, ...] = ()

    @property
    def conflicted(self) -> bool:
        return self.siblings > 1

    def provenance_text(self) -> str:
        parts = []
        if self.agent is not None:
            parts.append(self.agent if self.source is None else f"{self.agent} ({self.source})")
        if self.seq is not None:
            parts.append(f"seq {self.seq}")
        if self.tick is not None:
            parts.append(f"t={self.tick}")
        if self.write is not None:
            parts.append(f"write #{self.write}")
        if self.token is not None:
            parts.append(f"token {self.token}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Rows:
    """One collection as shown: ``kind`` as :meth:`Record.collections` names it (``map``,
    ``counter``, ``list``, ``text``), its cells in order, and a counter's value and budget."""

    name: str
    kind: str
    cells: tuple[Cell, ...]
    total: int | float | None = None
    max_value: float | None = None

    def keys(self) -> list[str | None]:
        """The distinct keys of the cells, in order (siblings share one)."""
        return list(dict.fromkeys(c.key for c in self.cells))


def short(value: Any, width: int = 60) -> str:
    """``value`` as compact JSON, cut with an ellipsis past ``width`` characters."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= width else text[: width - 1] + "…"


# -- maps in the document's layout --------------------------------------------------------------


def _is_sibling(value: Any) -> bool:
    return isinstance(value, dict) and "v" in value and set(value) <= {"v", "a", "s", "t"}


def _keep_all_layout(value: Mapping[str, Any]) -> bool:
    """A raw map that is a keep_all register (``key<US>token -> {v, a, s, t}``)."""
    return bool(value) and all(SEP in k and _is_sibling(v) for k, v in value.items())


def _fields_layout(value: Mapping[str, Any]) -> bool:
    """A raw map whose entries merge field by field (``key<RS>field[<US>token]``)."""
    return bool(value) and all(RS in k and not k.startswith(RS) for k in value)


def _sibling_order(token_entry: tuple[str, Any]) -> tuple[float, str]:
    """Siblings oldest first, ties by token (``(token or physical key, entry)`` pairs)."""
    return float(token_entry[1].get("t", 0)), token_entry[0].rpartition(SEP)[2]


def _keep_all_cells(
    name: str, value: Mapping[str, Any], meta: Callable[[str], Meta | None]
) -> list[Cell]:
    groups: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for pkey, entry in value.items():
        key, sep, token = pkey.rpartition(SEP)
        if sep and _is_sibling(entry):
            groups.setdefault(key, []).append((token, entry))
    out = []
    for key in sorted(groups):
        sibs = sorted(groups[key], key=_sibling_order)
        for token, entry in sibs:
            m = meta(f"{key}{SEP}{token}")
            out.append(
                Cell(
                    name,
                    "keep_all",
                    key,
                    entry.get("v"),
                    agent=str(entry.get("a")),
                    source=str(entry.get("s")),
                    seq=None if m is None else m.seq,
                    wall_time=float(entry.get("t", 0)),  # (the sibling's, as Conflict shows)
                    token=token,
                    siblings=len(sibs),
                )
            )
    return out


def _fields_cells(
    name: str, value: Mapping[str, Any], meta: Callable[[str], Meta | None], keep_all: bool
) -> list[Cell]:
    """One cell per entry; its provenance is the newest write of any of its fields."""
    entries: dict[str, dict[str, list[tuple[str, Any]]]] = {}  # key -> field -> siblings
    for pkey, stored in value.items():
        key, rs, rest = pkey.partition(RS)
        if not rs or not key:
            continue
        field, us, _ = rest.partition(SEP)
        if bool(us) != (keep_all and bool(rest)):
            continue  # not of this layout (a plain client's key)
        entries.setdefault(key, {}).setdefault(field, []).append((pkey, stored))
    out = []
    for key in sorted(entries):
        shown: dict[str, Any] = {}
        for field in sorted(f for f in entries[key] if f):  # (the document's order varies)
            sibs = entries[key][field]
            if not keep_all:
                shown[field] = sibs[0][1]
                continue
            sibs.sort(key=_sibling_order)
            if len(sibs) == 1:
                shown[field] = sibs[0][1].get("v")
            else:
                shown[field] = {
                    "__conflict__": [
                        {
                            "value": e.get("v"),
                            "agent": str(e.get("a")),
                            "source": str(e.get("s")),
                            "wall_time": float(e.get("t", 0)),
                            "token": p.rpartition(SEP)[2],
                        }
                        for p, e in sibs
                    ]
                }
        pkeys = [p for sibs in entries[key].values() for p, _ in sibs]
        metas = [m for p in pkeys if (m := meta(p)) is not None]
        best = max(metas, key=lambda m: (m.seq or 0, m.wall_time), default=None)
        out.append(Cell(name, "fields", key, shown, **_prov_kw(best)))
    return out


def _prov_kw(m: Meta | None) -> dict[str, Any]:
    if m is None:
        return {}
    return {"agent": m.agent, "source": m.source, "seq": m.seq, "wall_time": m.wall_time}


def _map_cells(
    name: str, value: Mapping[str, Any], meta: Callable[[str], Meta | None]
) -> list[Cell]:
    return [Cell(name, "map", key, value[key], **_prov_kw(meta(key))) for key in sorted(value)]


# -- sources --------------------------------------------------------------------------------------


def _replica_rows(replica: Replica, keep_all: Iterable[str]) -> list[Rows]:
    declared = set(keep_all)
    out = []
    for name, kind in replica.collections().items():
        value = replica.read(name, kind)
        if kind == "map":

            def meta(key: str, name: str = name) -> Meta | None:
                return replica.meta(name, key)

            if _fields_layout(value):  # (before keep_all: its keep_all layout has \x1f too)
                keep = name in declared or any(SEP in k for k in value)
                cs = _fields_cells(name, value, meta, keep)
            elif name in declared or _keep_all_layout(value):
                cs = _keep_all_cells(name, value, meta)
            else:
                cs = _map_cells(name, value, meta)
        elif kind == "list":
            cs = [Cell(name, "list", str(i), v) for i, v in enumerate(value)]
        else:
            cs = [Cell(name, "text", None, value)]
        out.append(Rows(name, kind, tuple(cs)))
    return out


def record_rows(rec: Record, keep_all: Iterable[str] = ()) -> list[Rows]:
    """Every collection of a live record, with what the record knows of who wrote what:
    its declared policies, and the provenance of map keys, list items and text spans."""
    declared = set(keep_all)
    replica = rec.replica
    out = []
    for name, kind in rec.collections().items():
        spec = rec.spec(name)

        def meta(key: str, name: str = name) -> Meta | None:
            return replica.meta(name, key)

        if kind == "counter":
            c = rec.counter(name)
            cs = [
                Cell(
                    name,
                    "counter",
                    key,
                    part,
                    **{**_prov_kw(meta(key)), "agent": agent_of_key(key)},
                )
                for key, part in c.entries().items()
            ]
            out.append(Rows(name, kind, tuple(cs), c.value, c.max_value))
            continue
        value = replica.read(name, kind)
        keeps = name in declared or (spec is not None and spec.conflict == "keep_all")
        if kind == "map" and spec is not None and spec.merge == "fields":
            cs = _fields_cells(name, value, meta, keeps)
        elif kind == "map" and keeps:
            cs = _keep_all_cells(name, value, meta)
        elif kind == "map":
            cs = _map_cells(name, value, meta)
        elif kind == "list":
            provs = rec.list(name).provenances()
            cs = [
                Cell(name, "list", str(i), v, **({} if p is None else _from_prov(p)))
                for i, (v, p) in enumerate(zip(value, provs, strict=True))
            ]
        else:
            spans = tuple(rec.text(name).authorship())
            cs = [Cell(name, "text", None, value, spans=spans)]
        out.append(Rows(name, kind, tuple(cs)))
    return out


def _from_prov(p: Provenance) -> dict[str, Any]:
    return {"agent": p.agent, "source": p.source, "seq": p.seq, "wall_time": p.wall_time}


def _state_rows(state: Mapping[str, Any], keep_all: Iterable[str]) -> list[Rows]:
    """A plain snapshot: ``rec.to_dict()`` (``keep_all`` conflicts as ``{"__conflict__":
    [siblings]}``) or a state whose declared ``keep_all`` maps hold lists of siblings
    ``{"token", "agent", "value"}`` (the simulator's)."""
    declared = set(keep_all)
    out = []
    for name in sorted(state):
        value = state[name]
        cs: list[Cell] = []
        if isinstance(value, str):
            kind, cs = "text", [Cell(name, "text", None, value)]
        elif isinstance(value, list):
            kind, cs = "list", [Cell(name, "list", str(i), v) for i, v in enumerate(value)]
        elif isinstance(value, dict):
            kind = "map"
            for key in sorted(value):
                v = value[key]
                if name in declared:
                    sibs = v if isinstance(v, list) else [{"value": v}]
                elif isinstance(v, dict) and list(v) == ["__conflict__"]:
                    sibs = v["__conflict__"]
                else:
                    cs.append(Cell(name, "map", key, v))
                    continue
                cs += [
                    Cell(
                        name,
                        "keep_all",
                        key,
                        s.get("value"),
                        agent=s.get("agent"),
                        source=s.get("source"),
                        wall_time=s.get("wall_time"),
                        token=s.get("token"),
                        siblings=len(sibs),
                    )
                    for s in sibs
                ]
        else:
            kind, cs = "map", [Cell(name, "map", None, value)]
        out.append(Rows(name, kind, tuple(cs)))
    return out


def rows(source: Source, keep_all: Iterable[str] = ()) -> list[Rows]:
    """Every collection of ``source`` (a record, a replica or a plain snapshot), sorted by
    name; ``keep_all`` names ``keep_all`` maps the source cannot tell by itself."""
    if isinstance(source, Record):
        return record_rows(source, keep_all)
    if isinstance(source, Replica):
        return _replica_rows(source, keep_all)
    return _state_rows(source, keep_all)


def cells(source: Source, keep_all: Iterable[str] = ()) -> list[Cell]:
    """The cells of every collection of ``source``, in order (see :func:`rows`)."""
    return [c for r in rows(source, keep_all) for c in r.cells]
