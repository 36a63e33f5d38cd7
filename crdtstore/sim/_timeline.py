"""A timeline of a simulated run: who wrote what when, and when each write reached each other
agent (:func:`timeline_data`, the data, to test or plot otherwise), and its matplotlib plot
(:func:`timeline`; matplotlib is imported only when a plot is drawn).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._config import SimResult
from ._trace import Trace

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


TraceLike = SimResult | Trace | Sequence[Mapping[str, Any]]


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
