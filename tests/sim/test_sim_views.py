"""Views of crdtstore.sim for people: tables and trees with provenance, diffs (of snapshots,
replicas and journal positions), timelines and conflict counts. Asserts on data, not pixels."""

from __future__ import annotations

from typing import Any

import matplotlib
import pytest

import crdtstore
from crdtstore import sim

matplotlib.use("Agg")

# a0 alone on one side of a partition, a1 and a2 on the other; all three contest keys
SCRIPT: list[sim.Step] = [
    sim.Partition(((0,), (1, 2))),
    sim.Set(0, "m", "x", "from a0"),
    sim.Wait(1),
    sim.Set(1, "m", "x", "from a1"),
    sim.Wait(1),
    sim.Set(0, "k", "y", "k from a0"),
    sim.Wait(1),
    sim.Set(2, "k", "y", "k from a2"),
    sim.Append(0, "l", "item a0"),
    sim.Append(1, "l", "item a1"),
    sim.InsertText(2, "t", "<a2>"),
    sim.Wait(4),
    sim.Heal(),
    sim.Drain(),
]


@pytest.fixture(scope="module")
def result() -> sim.SimResult:
    res = sim.simulate(sim.SimConfig(agents=3, seed=1), SCRIPT)
    assert res.ok, res.violations
    assert res.converged
    return res


def test_record_table_of_a_simulation_has_provenance_and_siblings(result: sim.SimResult) -> None:
    table = sim.record_table(result)
    by = {(c.collection, c.key, str(c.value)): c for c in table.cells}
    x = by["m", "x", result.states["a0"]["m"]["x"]]
    assert x.kind == "map" and x.agent in ("a0", "a1") and x.write in (0, 1)
    siblings = [c for c in table.cells if c.collection == "k"]
    assert sorted(c.value for c in siblings) == ["k from a0", "k from a2"]
    assert all(c.conflicted and c.siblings == 2 and c.token for c in siblings)
    assert {c.agent for c in siblings} == {"a0", "a2"}
    items = [c for c in table.cells if c.collection == "l"]
    assert sorted(c.value for c in items) == ["item a0", "item a1"]
    assert {c.agent for c in items} == {"a0", "a1"}
    text = str(table)
    assert "2 siblings" in text and "k from a2" in text and "provenance" in text.splitlines()[0]
    html = table._repr_html_()
    assert html.startswith("<table") and html.count("<tr") == len(table.cells) + 1
    tree = sim.record_tree(result)
    assert "CONFLICT, 2 siblings" in tree and "<a2>" in tree


def test_every_agent_of_a_converged_run_shows_the_same_values(result: sim.SimResult) -> None:
    values = {
        name: [(c.collection, c.key, c.value) for c in sim.cells(result, agent=name)]
        for name in result.states
    }
    assert values["a0"] == values["a1"] == values["a2"]


def test_contests_name_the_concurrent_writes_and_the_winner(result: sim.SimResult) -> None:
    (contest,) = sim.contests(result)
    assert (contest.collection, contest.key) == ("m", "x")
    assert contest.writes == (0, 1) and contest.agents == ("a0", "a1")
    assert contest.kept == result.states["a0"]["m"]["x"]
    assert contest.winner in contest.writes
    assert contest.values[contest.writes.index(contest.winner)] == contest.kept


def test_diff_of_snapshots() -> None:
    before = {"m": {"a": 1, "b": 2}, "l": [1, 2, 3], "t": "hello world", "gone": {"z": 0}}
    after = {"m": {"a": 1, "b": 3, "c": 4}, "l": [1, 3, 4], "t": "hello brave world", "new": []}
    d = sim.diff(before, after)
    got = {(e.collection, e.op, e.key): (e.before, e.after) for e in d.entries}
    assert got == {
        ("gone", "removed", None): ({"z": 0}, None),
        ("l", "deleted", "1"): ([2], None),
        ("l", "inserted", "3"): (None, [4]),
        ("m", "changed", "b"): (2, 3),
        ("m", "added", "c"): (None, 4),
        ("t", "inserted", "6"): (None, "brave "),
    }
    assert "~ m[b]: 2 -> 3" in str(d)
    assert not sim.diff(after, after) and str(sim.diff(after, after)) == "(no difference)"


def test_diff_of_two_agents_during_a_partition() -> None:
    script = [sim.Partition(((0,), (1,))), sim.Set(0, "m", "x", 1), sim.Set(1, "m", "y", 2)]
    res = sim.simulate(sim.SimConfig(agents=2, seed=0, final_exchange=False), script)
    states = [e["state"] for e in res.trace.of("write")]
    d = sim.diff(states[0], states[1])
    assert {(e.op, e.key) for e in d.entries} == {("removed", "x"), ("added", "y")}


def test_conflict_counts_and_convergence_time(result: sim.SimResult) -> None:
    points = sim.conflict_counts(result)
    assert points, "one point per write or delivery"
    final = [p for p in points if p.event == points[-1].event]
    assert {p.agent for p in final} == {"a0", "a1", "a2"}
    assert all(p.conflicts == 1 and p.siblings == 2 and p.distinct_states == 1 for p in final)
    # during the partition the two sides differ, and a0 never sees a conflict alone
    assert max(p.distinct_states for p in points) >= 2
    heal = result.trace.of("heal")[0]["t"]
    assert all(p.conflicts == 0 for p in points if p.t < heal)
    converged = sim.convergence_time(result)
    assert converged is not None and converged >= heal
    assert all(p.distinct_states == 1 for p in points if p.t > converged)


def test_timeline_data_counts_writes_deliveries_losses_and_partitions(
    result: sim.SimResult,
) -> None:
    data = sim.timeline_data(result)
    assert data.agents == ("a0", "a1", "a2")
    assert data.writes_per_agent() == {"a0": 3, "a1": 2, "a2": 2}
    fresh = [d for d in data.deliveries if not d.duplicate]
    assert len(fresh) == 7 * 2  # every write reaches both other agents once
    assert all(d.latency >= 0 and d.src != d.dst for d in data.deliveries)
    assert data.partitions == ((0, result.trace.of("heal")[0]["t"]),)
    assert any(reason == "partition" for _, _, _, reason in data.losses)
    # a0's writes reach a1 only after the heal
    heal = data.partitions[0][1]
    assert heal is not None
    assert all(d.applied >= heal for d in fresh if {d.src, d.dst} == {"a0", "a1"})
    assert sim.timeline_data(result.trace) == sim.timeline_data(result.trace.events) == data


def test_plots_return_figures_with_the_data(result: sim.SimResult) -> None:
    from matplotlib.figure import Figure

    fig = sim.timeline(result)
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a0", "a1", "a2"]
    data = sim.timeline_data(result)
    assert len(ax.texts) == len(data.deliveries)  # one arrow per delivery
    plotted = sum(len(c.get_offsets()) for c in ax.collections)
    assert plotted == len(data.writes) + len(data.losses)
    labels = ax.get_legend_handles_labels()[1]
    assert {"map", "keep_all", "list", "text", "lost"} <= set(labels)

    fig = sim.plot_counts(result)
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert "distinct states" in lines
    assert list(lines["a0 siblings"].get_ydata())[-1] == 2

    from matplotlib.figure import Figure as F

    own = F()
    target = own.add_subplot()
    assert sim.timeline(result, ax=target) is own


@pytest.mark.anyio
async def test_table_of_a_record_and_of_a_replay_and_journal_diff() -> None:
    schema = {"k": crdtstore.CollectionSpec(kind="map", conflict="keep_all")}
    async with crdtstore.open_store("memory://") as store:
        async with (
            store.open_record("r", "alice", schema=schema, durability="durable") as a,
            store.open_record("r", "bob", "tool", durability="durable") as b,
        ):
            await a.map("m").set("x", 1)  # seq 1 (after the schema)
            await a.map("k").set("q", "alice's")
            await b.list("l").append("b1")
            await a.text("t").insert(0, "abc")
            await b.sync()
            await b.map("m").set("x", 2)
            await b.text("t").insert(1, "ZZ")
            await a.sync()
            head = (await store.run_info("r")).head

            table = sim.record_table(a)
            by = {(c.collection, c.key): c for c in table.cells}
            assert by["m", "x"].value == 2 and by["m", "x"].agent == "bob"
            assert by["m", "x"].source == "tool" and by["m", "x"].seq == head - 1
            assert by["k", "q"].kind == "keep_all" and by["k", "q"].agent == "alice"
            assert by["t", None].value == "aZZbc"
            assert "bob (tool)" in sim.record_tree(a)

            first_x = next(
                e.seq
                for e in await store.journal("r")
                if any(op[0] == "map" and op[1] == "m" for op in e.effect)
            )
            past = await store.replay("r", until=first_x)
            cells_then = {(c.collection, c.key): c for c in sim.cells(past)}
            assert cells_then["m", "x"].value == 1 and cells_then["m", "x"].agent == "alice"
            assert ("t", None) not in cells_then

            d = await sim.journal_diff(store, "r", first_x)
            got = {(e.collection, e.op, e.key) for e in d.entries}
            assert ("m", "changed", "x") in got
            assert ("t", "added", None) in got and ("l", "added", None) in got
            assert not await sim.journal_diff(store, "r", head)
            assert not sim.diff(a, b)  # both records hold the same
            assert not sim.diff(a.to_dict(), await store.replay("r"))


def test_keep_all_conflict_in_to_dict_form_is_read_as_siblings() -> None:
    snapshot: dict[str, Any] = {
        "k": {
            "q": {
                "__conflict__": [
                    {"value": 1, "agent": "a", "source": "model", "wall_time": 1.0, "token": "1"},
                    {"value": 2, "agent": "b", "source": "model", "wall_time": 2.0, "token": "2"},
                ]
            },
            "r": 3,
        }
    }
    cs = sim.cells(snapshot)
    assert [(c.kind, c.key, c.value, c.siblings) for c in cs] == [
        ("keep_all", "q", 1, 2),
        ("keep_all", "q", 2, 2),
        ("map", "r", 3, 1),
    ]
