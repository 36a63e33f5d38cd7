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

What a source shows (its cells) is read by ``crdtstore._render``, which the CLI shares;
this module adds a simulation's provenance and formats the cells.

Tables and diffs render as plain text (``str``) and as HTML in notebooks (``_repr_html_``),
without pandas or rich. Plots use matplotlib, imported only when a plot is drawn; they return
the ``Figure`` and leave showing it to the caller. The data behind each plot is available
separately (:func:`timeline_data`, :func:`conflict_counts`) to test or to plot otherwise.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._render import Cell
from .._render import cells as _cells
from .._render import short as _short
from ..record._record import Record
from ..record._replica import Replica
from ._check import SEP, WriteRec
from ._config import SimResult
from ._trace import canon

__all__ = ["Cell", "RecordTable", "Source", "cells", "record_table", "record_tree"]

Source = Record | Replica | SimResult | Mapping[str, Any]


# -- a simulation's provenance --------------------------------------------------------------------


def _find_write(
    writes: Sequence[WriteRec], collection: str, key: str | None, value: Any
) -> WriteRec | None:
    want = canon(value)
    for w in reversed(writes):
        if w.collection == collection and w.key == key and not w.deleted and canon(w.value) == want:
            return w
    return None


def _with_writes(cs: list[Cell], writes: Sequence[WriteRec]) -> list[Cell]:
    """The cells of a simulator state, with the simulated write that put each value there:
    its author, tick, write id and journal position (``keep_all`` siblings by token, other
    values by collection, key and value)."""
    by_token = {(w.collection, w.pkey.rpartition(SEP)[2]): w for w in writes if w.pkey is not None}
    out = []
    for c in cs:
        if c.kind == "keep_all":
            w = by_token.get((c.collection, str(c.token)))
        elif c.kind in ("map", "list") and (c.kind == "list" or c.key is not None):
            w = _find_write(writes, c.collection, None if c.kind == "list" else c.key, c.value)
        else:
            w = None
        if w is not None:
            c = dataclasses.replace(
                c,
                agent=f"a{w.agent}",
                seq=w.seqs[-1] if w.seqs else None,
                wall_time=None,
                tick=w.tick,
                write=w.id,
            )
        out.append(c)
    return out


def cells(source: Source, *, agent: str | None = None, keep_all: Iterable[str] = ()) -> list[Cell]:
    """Every value of ``source`` as :class:`Cell` rows, collections and keys sorted.

    ``agent`` picks the agent of a :class:`SimResult` (default: the first); ``keep_all`` names
    the ``keep_all`` maps of a plain snapshot or replica (a record and a simulation know
    theirs; a replica's are also recognised by their layout)."""
    if isinstance(source, SimResult):
        name = agent or min(source.states)
        keep = (*source.config.keep_all, *keep_all)
        return _with_writes(_cells(source.states[name], keep), source.writes)
    return _cells(source, keep_all)


# -- tables and trees -------------------------------------------------------------------------


def _key_text(c: Cell) -> str:
    """A cell's key as a table shows it (a counter's contribution key ``agent<US>client``
    as ``agent #client``)."""
    if c.key is None:
        return ""
    return c.key.replace(SEP, " #") if c.kind == "counter" else c.key


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
            key = _key_text(c)
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
                key = f"[{c.key}]" if c.kind == "list" else _key_text(c) or str(c.key)
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
