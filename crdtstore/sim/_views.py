"""Views for people: a record as a table or tree with provenance (here); a diff between two
records or two journal positions (``_diffs``), a timeline of writes and deliveries
(``_timeline``), conflict and sibling counts over time (``_conflicts``).

Every view takes what you have at hand, a *source*:

- a live :class:`crdtstore.Record` (provenance: agent, source, journal position, time);
- a :class:`crdtstore.Replica`, as ``await store.replay(run, until=seq)`` returns it (time
  travel: the record as it was at journal position ``seq``, with the same provenance);
- a :class:`~crdtstore.sim.SimResult` (the final state of one agent, ``agent="a0"`` by
  default; provenance from the simulator's writes: author, tick and write id);
- a plain snapshot: ``rec.to_dict()`` or one of ``SimResult.states`` (no provenance).

Tables and diffs render as plain text (``str``) and as HTML in notebooks (``_repr_html_``),
without pandas or rich. Plots use matplotlib, imported only when a plot is drawn; they return
the ``Figure`` and leave showing it to the caller. The data behind each plot is available
separately (:func:`timeline_data`, :func:`conflict_counts`) to test or to plot otherwise.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..record._record import Record
from ..record._replica import Replica
from ._check import SEP, WriteRec
from ._config import SimResult
from ._trace import canon

if TYPE_CHECKING:
    pass

Source = Record | Replica | SimResult | Mapping[str, Any]


# -- normalising a source ---------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One value of a record, with where it came from.

    ``kind`` is ``map``, ``keep_all``, ``list`` or ``text``; ``key`` is the map key, the
    list index (as text) or None for a text. A ``keep_all`` key with several siblings gives
    one cell per sibling (``token`` tells them apart, ``siblings`` counts them). Provenance
    fields are None when the source does not know them: ``seq`` is the journal position of
    the write, ``tick`` and ``write`` the simulated time and write id (simulations only).
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


def _is_sibling_entry(value: Any) -> bool:
    return isinstance(value, dict) and "v" in value and set(value) <= {"v", "a", "s", "t"}


def _keep_all_physical(value: Mapping[str, Any]) -> bool:
    """A replica's raw map that is a keep_all register (``key<US>token -> {v, a, s, t}``)."""
    return bool(value) and all(SEP in k and _is_sibling_entry(v) for k, v in value.items())


def _cells_of_replica(replica: Replica, keep_all: Iterable[str]) -> list[Cell]:
    declared = set(keep_all)
    out: list[Cell] = []
    for name, kind in replica.collections().items():
        value = replica.read(name, kind)
        if kind == "map" and (name in declared or _keep_all_physical(value)):
            groups: dict[str, list[tuple[str, dict[str, Any]]]] = {}
            for pkey, entry in value.items():
                key, sep, token = pkey.rpartition(SEP)
                if sep and _is_sibling_entry(entry):
                    groups.setdefault(key, []).append((token, entry))
            for key in sorted(groups):
                sibs = sorted(groups[key], key=lambda te: (float(te[1].get("t", 0)), te[0]))
                for token, entry in sibs:
                    meta = replica.meta(name, f"{key}{SEP}{token}")
                    out.append(
                        Cell(
                            name,
                            "keep_all",
                            key,
                            entry.get("v"),
                            agent=str(entry.get("a")),
                            source=str(entry.get("s")),
                            seq=None if meta is None else meta.seq,
                            wall_time=float(entry.get("t", 0)),
                            token=token,
                            siblings=len(sibs),
                        )
                    )
        elif kind == "map":
            for key in sorted(value):
                meta = replica.meta(name, key)
                out.append(
                    Cell(
                        name,
                        "map",
                        key,
                        value[key],
                        agent=None if meta is None else meta.agent,
                        source=None if meta is None else meta.source,
                        seq=None if meta is None else meta.seq,
                        wall_time=None if meta is None else meta.wall_time,
                    )
                )
        elif kind == "list":
            out += [Cell(name, "list", str(i), v) for i, v in enumerate(value)]
        else:
            out.append(Cell(name, "text", None, value))
    return out


def _find_write(
    writes: Sequence[WriteRec], collection: str, key: str | None, value: Any
) -> WriteRec | None:
    want = canon(value)
    for w in reversed(writes):
        if w.collection == collection and w.key == key and not w.deleted and canon(w.value) == want:
            return w
    return None


def _cells_of_state(
    state: Mapping[str, Any], keep_all: Iterable[str], writes: Sequence[WriteRec] = ()
) -> list[Cell]:
    """Cells of a plain snapshot: ``rec.to_dict()`` or a simulator state (its ``keep_all``
    maps as ``{key: [{"token", "agent", "value"}, ...]}``)."""
    declared = set(keep_all)
    by_token = {(w.collection, w.pkey.rpartition(SEP)[2]): w for w in writes if w.pkey is not None}

    def sim_cell(cell: Cell, w: WriteRec | None) -> Cell:
        if w is None:
            return cell
        return Cell(
            cell.collection,
            cell.kind,
            cell.key,
            cell.value,
            agent=f"a{w.agent}",
            source=cell.source,
            seq=w.seqs[-1] if w.seqs else None,
            token=cell.token,
            siblings=cell.siblings,
            tick=w.tick,
            write=w.id,
        )

    out: list[Cell] = []
    for name in sorted(state):
        value = state[name]
        if isinstance(value, str):
            out.append(Cell(name, "text", None, value))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                cell = Cell(name, "list", str(i), v)
                out.append(sim_cell(cell, _find_write(writes, name, None, v)))
        elif isinstance(value, dict) and name in declared:
            for key in sorted(value):
                sibs = value[key]
                if not isinstance(sibs, list):  # a resolved key in to_dict() form
                    sibs = [{"value": sibs}]
                for s in sibs:
                    cell = Cell(
                        name,
                        "keep_all",
                        key,
                        s.get("value"),
                        agent=s.get("agent"),
                        token=s.get("token"),
                        siblings=len(sibs),
                    )
                    out.append(sim_cell(cell, by_token.get((name, str(s.get("token"))))))
        elif isinstance(value, dict):
            for key in sorted(value):
                v = value[key]
                if isinstance(v, dict) and list(v) == ["__conflict__"]:  # rec.to_dict() form
                    sibs = v["__conflict__"]
                    out += [
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
                    cell = Cell(name, "map", key, v)
                    out.append(sim_cell(cell, _find_write(writes, name, key, v)))
        else:
            out.append(Cell(name, "map", None, value))
    return out


def cells(source: Source, *, agent: str | None = None, keep_all: Iterable[str] = ()) -> list[Cell]:
    """Every value of ``source`` as :class:`Cell` rows, collections and keys sorted.

    ``agent`` picks the agent of a :class:`SimResult` (default: the first); ``keep_all`` names
    the ``keep_all`` maps of a plain snapshot or replica (a record and a simulation know
    theirs; a replica's are also recognised by their layout)."""
    if isinstance(source, SimResult):
        name = agent or min(source.states)
        keep = (*source.config.keep_all, *keep_all)
        return _cells_of_state(source.states[name], keep, source.writes)
    if isinstance(source, Record):
        declared = [
            n for n in source.collections() if (s := source.spec(n)) and s.conflict == "keep_all"
        ]
        return _cells_of_replica(source.replica, [*declared, *keep_all])
    if isinstance(source, Replica):
        return _cells_of_replica(source, keep_all)
    return _cells_of_state(source, keep_all)


# -- tables and trees -------------------------------------------------------------------------


def _short(value: Any, width: int) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= width else text[: width - 1] + "…"


@dataclass(frozen=True)
class RecordTable:
    """A record as rows of :class:`Cell`: ``str()`` is a plain-text table, a notebook shows
    an HTML table (conflicted ``keep_all`` keys highlighted); :meth:`tree` is a text tree."""

    cells: tuple[Cell, ...]
    width: int = 40

    HEADER = ("collection", "kind", "key", "value", "provenance")

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        out = []
        for c in self.cells:
            key = "" if c.key is None else c.key
            if c.conflicted:
                key = f"{key} [{c.siblings} siblings]"
            out.append(
                (c.collection, c.kind, key, _short(c.value, self.width), c.provenance_text())
            )
        return out

    def __str__(self) -> str:
        rows = [self.HEADER, *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.HEADER))]
        lines = [
            "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in self.HEADER)
        body = []
        for c, row in zip(self.cells, self.rows(), strict=True):
            style = ' style="background:#fff3cd"' if c.conflicted else ""
            tds = "".join(f"<td>{html.escape(v)}</td>" for v in row)
            body.append(f"<tr{style}>{tds}</tr>")
        return (
            '<table class="crdtstore-record"><thead><tr>'
            + head
            + "</tr></thead><tbody>"
            + "".join(body)
            + "</tbody></table>"
        )

    def tree(self) -> str:
        """The record as an indented text tree: collections, keys (siblings under their key),
        values and provenance."""
        lines: list[str] = []
        by_coll: dict[str, list[Cell]] = {}
        for c in self.cells:
            by_coll.setdefault(c.collection, []).append(c)
        for name, cs in by_coll.items():
            lines.append(f"{name} ({cs[0].kind})")
            if cs[0].kind == "text":
                for part in str(cs[0].value).splitlines() or [""]:
                    lines.append(f"  │ {part}")
                continue
            shown: set[str | None] = set()
            for i, c in enumerate(cs):
                branch = "└─" if i == len(cs) - 1 else "├─"
                prov = c.provenance_text()
                value = _short(c.value, self.width)
                if c.kind == "keep_all" and c.conflicted:
                    if c.key not in shown:
                        shown.add(c.key)
                        lines.append(f"  {branch} {c.key}: CONFLICT, {c.siblings} siblings")
                    lines.append(f"  │   • {value}  ← {prov}")
                    continue
                key = f"[{c.key}]" if c.kind == "list" else str(c.key)
                lines.append(f"  {branch} {key} = {value}" + (f"  ← {prov}" if prov else ""))
        return "\n".join(lines)


def record_table(
    source: Source, *, agent: str | None = None, keep_all: Iterable[str] = (), width: int = 40
) -> RecordTable:
    """The record of ``source`` as a table with provenance (see the module docstring for the
    sources); ``width`` caps how much of each value is shown."""
    return RecordTable(tuple(cells(source, agent=agent, keep_all=keep_all)), width)


def record_tree(
    source: Source, *, agent: str | None = None, keep_all: Iterable[str] = (), width: int = 40
) -> str:
    """The record of ``source`` as a plain-text tree with provenance."""
    return record_table(source, agent=agent, keep_all=keep_all, width=width).tree()
