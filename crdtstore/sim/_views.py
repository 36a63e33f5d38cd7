"""Views for people: a record as a table or tree with provenance, a diff between two records
or two journal positions, a timeline of writes and deliveries, conflict and sibling counts
over time.

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

import difflib
import html
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..record._record import Record
from ..record._replica import Replica
from ._check import SEP, WriteRec, lww_frontier
from ._sim import SimResult
from ._trace import Trace, canon

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from .._store import Store

Source = Record | Replica | SimResult | Mapping[str, Any]
TraceLike = SimResult | Trace | Sequence[Mapping[str, Any]]

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


# -- diffs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DiffEntry:
    """One difference between two records.

    ``op`` is ``added``, ``removed`` or ``changed`` (map keys, keep_all keys, whole
    collections when ``key`` is None) or ``inserted``, ``deleted``, ``replaced`` (list items
    and text runs, at position ``key`` of the *before* side).
    """

    collection: str
    kind: str
    op: str
    key: str | None
    before: Any = None
    after: Any = None

    def __str__(self) -> str:
        where = self.collection if self.key is None else f"{self.collection}[{self.key}]"
        if self.op in ("added", "inserted"):
            return f"+ {where}: {_short(self.after, 60)}"
        if self.op in ("removed", "deleted"):
            return f"- {where}: {_short(self.before, 60)}"
        return f"~ {where}: {_short(self.before, 60)} -> {_short(self.after, 60)}"


@dataclass(frozen=True)
class RecordDiff:
    """The differences between two records (empty, and false, when they are equal)."""

    entries: tuple[DiffEntry, ...]

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.entries) if self.entries else "(no difference)"

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        colour = {"+": "#e6ffec", "-": "#ffebe9", "~": "#fff8c5"}
        lines = [
            f'<div style="background:{colour[str(e)[0]]};font-family:monospace">'
            f"{html.escape(str(e))}</div>"
            for e in self.entries
        ]
        return "".join(lines) or "<i>(no difference)</i>"


def _shape(cs: Iterable[Cell]) -> dict[str, tuple[str, Any]]:
    """Per collection: (kind, comparable content) with ``keep_all`` siblings as sorted value
    lists (a single value when resolved)."""
    out: dict[str, tuple[str, Any]] = {}
    for c in cs:
        if c.kind == "text":
            out[c.collection] = ("text", c.value)
        elif c.kind == "list":
            out.setdefault(c.collection, ("list", []))[1].append(c.value)
        elif c.kind == "keep_all":
            _, keys = out.setdefault(c.collection, ("keep_all", {}))
            keys.setdefault(c.key, []).append(c.value)
        else:
            out.setdefault(c.collection, ("map", {}))[1][c.key] = c.value
    for _name, (kind, content) in out.items():
        if kind == "keep_all":
            for key, values in content.items():
                values.sort(key=canon)
                content[key] = values[0] if len(values) == 1 else values
    return out


_TOKEN = re.compile(r"<[^<>]*>|\w+|\s+|[^\w\s]")


def _seq_diff(name: str, kind: str, a: Any, b: Any) -> list[DiffEntry]:
    """List items, or text runs compared token by token (words, spaces, punctuation and
    ``<...>`` tokens); ``key`` is the index (the character offset for texts) in ``a``."""
    if kind == "text":
        ta: list[Any] = _TOKEN.findall(a)
        tb: list[Any] = _TOKEN.findall(b)
        ka, kb = ta, tb
        offsets = [0]
        for t in ta:
            offsets.append(offsets[-1] + len(t))
    else:
        ta, tb = list(a), list(b)
        ka, kb = [canon(v) for v in ta], [canon(v) for v in tb]
        offsets = list(range(len(ta) + 1))
    out = []
    matcher = difflib.SequenceMatcher(None, ka, kb, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        op = {"insert": "inserted", "delete": "deleted", "replace": "replaced"}[tag]
        if kind == "text":
            before: Any = "".join(ta[i1:i2]) if i2 > i1 else None
            after: Any = "".join(tb[j1:j2]) if j2 > j1 else None
        else:
            before = ta[i1:i2] if i2 > i1 else None
            after = tb[j1:j2] if j2 > j1 else None
        out.append(DiffEntry(name, kind, op, str(offsets[i1]), before, after))
    return out


def diff(
    before: Source,
    after: Source,
    *,
    agent: str | None = None,
    keep_all: Iterable[str] = (),
) -> RecordDiff:
    """What changed from ``before`` to ``after`` (any two sources: records, replicas of two
    journal positions, two agents' states of a simulation, snapshots). ``agent`` picks the
    agent of a :class:`SimResult` source; use ``result.states[name]`` with
    ``keep_all=result.config.keep_all`` to compare two agents of one simulation."""
    keep = tuple(keep_all)
    sa = _shape(cells(before, agent=agent, keep_all=keep))
    sb = _shape(cells(after, agent=agent, keep_all=keep))
    out: list[DiffEntry] = []
    for name in sorted(set(sa) | set(sb)):
        if name not in sb:
            out.append(DiffEntry(name, sa[name][0], "removed", None, sa[name][1], None))
            continue
        if name not in sa:
            out.append(DiffEntry(name, sb[name][0], "added", None, None, sb[name][1]))
            continue
        (ka, va), (kb, vb) = sa[name], sb[name]
        if ka != kb and not {ka, kb} <= {"map", "keep_all"}:
            out.append(DiffEntry(name, kb, "changed", None, va, vb))
        elif kb in ("list", "text"):
            out += _seq_diff(name, kb, va, vb)
        else:
            for key in sorted(set(va) | set(vb)):
                if key not in vb:
                    out.append(DiffEntry(name, kb, "removed", key, va[key], None))
                elif key not in va:
                    out.append(DiffEntry(name, kb, "added", key, None, vb[key]))
                elif canon(va[key]) != canon(vb[key]):
                    out.append(DiffEntry(name, kb, "changed", key, va[key], vb[key]))
    return RecordDiff(tuple(out))


async def journal_diff(
    store: Store, run: str, before: int, after: int | None = None, *, keep_all: Iterable[str] = ()
) -> RecordDiff:
    """What the journal of ``run`` changed between positions ``before`` and ``after``
    (inclusive; None: the head), by replaying both (:meth:`Store.replay`)."""
    keep = tuple(keep_all)
    old = await store.replay(run, until=before)
    new = await store.replay(run, until=after)
    return diff(old, new, keep_all=keep)


# -- timelines --------------------------------------------------------------------------------


def _events(trace: TraceLike) -> list[Mapping[str, Any]]:
    if isinstance(trace, SimResult):
        return list(trace.trace.events)
    if isinstance(trace, Trace):
        return list(trace.events)
    return list(trace)


def _agent_names(events: Sequence[Mapping[str, Any]]) -> list[str]:
    for e in events:
        if e["ev"] == "config":
            return [f"a{i}" for i in range(int(e["config"]["agents"]))]
    names = {e[k] for e in events for k in ("agent", "src", "dst") if isinstance(e.get(k), str)}
    return sorted(names)


@dataclass(frozen=True)
class WriteMark:
    """An acknowledged write: when, by whom, to what."""

    t: int
    agent: str
    write: int
    kind: str
    collection: str
    key: str | None


@dataclass(frozen=True)
class Delivery:
    """A write applied at another agent: written at ``sent`` by ``src``, applied at
    ``applied`` by ``dst`` (``duplicate``: a copy of a write already applied)."""

    write: int
    src: str
    dst: str
    sent: int
    applied: int
    duplicate: bool = False

    @property
    def latency(self) -> int:
        return self.applied - self.sent


@dataclass(frozen=True)
class Timeline:
    """The data of :func:`timeline`: agents (lanes), writes, deliveries, lost transmissions
    ``(t, src, dst, reason)``, partitions ``(start, end)`` (end None: healed at the end),
    refused writes ``(t, agent, error)`` and the tick the script ended."""

    agents: tuple[str, ...]
    writes: tuple[WriteMark, ...]
    deliveries: tuple[Delivery, ...]
    losses: tuple[tuple[int, str, str, str], ...]
    partitions: tuple[tuple[int, int | None], ...]
    refused: tuple[tuple[int, str, str], ...] = field(default=())
    end: int = 0

    def writes_per_agent(self) -> dict[str, int]:
        counts = dict.fromkeys(self.agents, 0)
        for w in self.writes:
            counts[w.agent] = counts.get(w.agent, 0) + 1
        return counts


def timeline_data(trace: TraceLike) -> Timeline:
    """The writes, deliveries, losses and partitions of a simulation trace."""
    events = _events(trace)
    writes: list[WriteMark] = []
    written: dict[int, int] = {}
    deliveries: list[Delivery] = []
    losses: list[tuple[int, str, str, str]] = []
    partitions: list[tuple[int, int | None]] = []
    refused: list[tuple[int, str, str]] = []
    start: int | None = None
    end = 0
    for e in events:
        ev = e["ev"]
        if ev == "write":
            w = e["write"]
            writes.append(
                WriteMark(e["t"], e["agent"], w["id"], w["kind"], w["collection"], w["key"])
            )
            written[w["id"]] = e["t"]
        elif ev == "apply":
            deliveries.append(
                Delivery(
                    e["write"], e["src"], e["dst"], written[e["write"]], e["t"], e["duplicate"]
                )
            )
        elif ev == "lost":
            losses.append((e["t"], e["src"], e["dst"], e["reason"]))
        elif ev == "partition":
            if start is not None:
                partitions.append((start, e["t"]))
            start = e["t"]
        elif ev == "heal" and start is not None:
            partitions.append((start, e["t"]))
            start = None
        elif ev == "refused":
            refused.append((e["t"], e["agent"], e["error"]))
        elif ev == "end_of_script":
            end = e["t"]
        end = max(end, int(e.get("t", 0)))
    if start is not None:
        partitions.append((start, None))
    return Timeline(
        tuple(_agent_names(events)),
        tuple(writes),
        tuple(deliveries),
        tuple(losses),
        tuple(partitions),
        tuple(refused),
        end,
    )


_KIND_COLOURS = {
    "map": "tab:blue",
    "keep_all": "tab:orange",
    "list": "tab:green",
    "text": "tab:purple",
}


def _figure(ax: Axes | None, size: tuple[float, float]) -> tuple[Figure, Axes]:
    if ax is not None:
        fig = ax.get_figure()
        assert fig is not None
        return fig, ax  # type: ignore[return-value]
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    return fig, fig.add_subplot()


def timeline(
    trace: TraceLike,
    *,
    ax: Axes | None = None,
    deliveries: bool = True,
    title: str | None = None,
) -> Figure:
    """A timeline of a simulation: one lane per agent, a dot per write (coloured by kind),
    an arrow per delivery from the writer's lane at write time to the receiver's lane at
    apply time, a cross per lost transmission, partitions shaded. Returns the Figure (drawn
    on ``ax`` when given); the data is :func:`timeline_data`."""
    data = timeline_data(trace)
    lanes = {a: i for i, a in enumerate(data.agents)}
    fig, ax = _figure(ax, (9, 1.2 + 0.7 * max(len(lanes), 1)))
    for start, stop in data.partitions:
        ax.axvspan(start, data.end if stop is None else stop, color="0.9", zorder=0)
    if deliveries:
        for d in data.deliveries:
            ax.annotate(
                "",
                xy=(d.applied, lanes[d.dst]),
                xytext=(d.sent, lanes[d.src]),
                arrowprops={
                    "arrowstyle": "->",
                    "color": "0.6" if d.duplicate else "0.35",
                    "lw": 0.6,
                    "ls": ":" if d.duplicate else "-",
                },
                zorder=1,
            )
    for kind, colour in _KIND_COLOURS.items():
        ws = [w for w in data.writes if w.kind == kind]
        if ws:
            ax.scatter(
                [w.t for w in ws],
                [lanes[w.agent] for w in ws],
                color=colour,
                label=kind,
                zorder=3,
                s=36,
            )
    if data.losses:
        ax.scatter(
            [t for t, *_ in data.losses],
            [lanes[src] + 0.15 for _, src, _, _ in data.losses],
            marker="x",
            color="tab:red",
            label="lost",
            s=16,
            zorder=2,
        )
    ax.set_yticks(range(len(lanes)), list(lanes))
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    ax.set_xlim(-0.5, max(data.end, 1) + 0.5)  # arrows do not widen the autoscaled limits
    ax.invert_yaxis()
    ax.set_xlabel("tick")
    ax.set_title(title or f"{len(data.writes)} writes, {len(data.deliveries)} deliveries")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return fig


# -- conflict and sibling counts --------------------------------------------------------------


@dataclass(frozen=True)
class CountPoint:
    """The state of one agent after one event of a trace: how many ``keep_all`` keys hold
    more than one sibling (``conflicts``), how many siblings there are in all, and how many
    different states the agents hold at that moment (``distinct_states``; 1: converged)."""

    t: int
    event: int
    agent: str
    conflicts: int
    siblings: int
    distinct_states: int


def _keep_all_counts(state: Mapping[str, Any], keep_all: Iterable[str]) -> tuple[int, int]:
    conflicts = siblings = 0
    for name in keep_all:
        for sibs in (state.get(name) or {}).values():
            siblings += len(sibs)
            conflicts += len(sibs) > 1
    return conflicts, siblings


def conflict_counts(trace: TraceLike) -> list[CountPoint]:
    """Conflict and sibling counts over time: one point per write or delivery of the trace
    (the agent whose state it changed), and one per agent for the final state."""
    events = _events(trace)
    keep_all: tuple[str, ...] = ()
    for e in events:
        if e["ev"] == "config":
            keep_all = tuple(e["config"]["keep_all"])
    agents = _agent_names(events)
    states: dict[str, str] = dict.fromkeys(agents, canon({}))
    out: list[CountPoint] = []
    for n, e in enumerate(events):
        if e["ev"] in ("write", "apply"):
            name = e["agent"] if e["ev"] == "write" else e["dst"]
            states[name] = canon(e["state"])
            c, s = _keep_all_counts(e["state"], keep_all)
            out.append(CountPoint(e["t"], n, name, c, s, len(set(states.values()))))
        elif e["ev"] == "final":
            for name, state in sorted(e["states"].items()):
                states[name] = canon(state)
            for name, state in sorted(e["states"].items()):
                c, s = _keep_all_counts(state, keep_all)
                out.append(CountPoint(e["t"], n, name, c, s, len(set(states.values()))))
    return out


def convergence_time(trace: TraceLike) -> int | None:
    """The tick from which every agent holds the same state for good (None: never, or not
    before the final state-vector exchange)."""
    since: int | None = None
    for p in conflict_counts(trace):
        if p.distinct_states == 1:
            if since is None:
                since = p.t
        else:
            since = None
    return since


def plot_counts(trace: TraceLike, *, ax: Axes | None = None, title: str | None = None) -> Figure:
    """Conflicted ``keep_all`` keys and siblings per agent over time (steps), with the
    number of distinct states across agents. Returns the Figure."""
    points = conflict_counts(trace)
    agents = _agent_names(_events(trace))
    fig, ax = _figure(ax, (9, 3.2))
    for agent in agents:
        ps = [p for p in points if p.agent == agent]
        if not ps:
            continue
        line = ax.step(
            [p.t for p in ps], [p.siblings for p in ps], where="post", label=f"{agent} siblings"
        )
        ax.step(
            [p.t for p in ps],
            [p.conflicts for p in ps],
            where="post",
            ls="--",
            color=line[0].get_color(),
            label=f"{agent} conflicted keys",
        )
    if points:
        ax.step(
            [p.t for p in points],
            [p.distinct_states for p in points],
            where="post",
            color="black",
            lw=2,
            alpha=0.4,
            label="distinct states",
        )
    ax.set_xlabel("tick")
    ax.set_ylabel("count")
    ax.set_title(title or "keep_all siblings and conflicts over time")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return fig


# -- contested last-writer-wins keys ----------------------------------------------------------


@dataclass(frozen=True)
class Contest:
    """A last-writer-wins key that concurrent writes contested: the writes none of the
    others superseded, and the value the record kept (``winner``: the write id, None when
    the key ended deleted)."""

    collection: str
    key: str
    writes: tuple[int, ...]
    agents: tuple[str, ...]
    values: tuple[Any, ...]
    kept: Any
    winner: int | None


def contests(result: SimResult, *, agent: str | None = None) -> list[Contest]:
    """The last-writer-wins keys of a simulation that concurrent writes contested, and what
    won at ``agent`` (default: the first agent; after convergence every agent agrees)."""
    state = result.states[agent or min(result.states)]
    by_key: dict[tuple[str, str], list[WriteRec]] = {}
    for w in result.writes:
        if w.kind == "map" and w.key is not None:
            by_key.setdefault((w.collection, w.key), []).append(w)
    out = []
    for (coll, key), ws in sorted(by_key.items()):
        frontier = sorted(lww_frontier(ws), key=lambda w: w.id)
        if len(frontier) < 2:
            continue
        kept = (state.get(coll) or {}).get(key)
        present = key in (state.get(coll) or {})
        winner = next(
            (w.id for w in frontier if present and not w.deleted and canon(w.value) == canon(kept)),
            None,
        )
        out.append(
            Contest(
                coll,
                key,
                tuple(w.id for w in frontier),
                tuple(f"a{w.agent}" for w in frontier),
                tuple(None if w.deleted else w.value for w in frontier),
                kept,
                winner,
            )
        )
    return out
