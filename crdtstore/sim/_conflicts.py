"""Conflicts over a simulated run: how many keys are contested and how many ``keep_all``
siblings exist after every step (:func:`conflict_counts`, :func:`plot_counts`), when the
agents converged (:func:`convergence_time`), and which last-writer-wins keys were written
concurrently, with who won (:func:`contests`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._check import WriteRec, lww_frontier
from ._config import SimResult
from ._timeline import TraceLike, _agent_names, _events, _figure
from ._trace import canon

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


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
