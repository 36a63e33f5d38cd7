"""Failure mode 9, replay-clobber (DESIGN.md): a resume replays whole-state snapshots in the
wrong order and silently drops writes of parallel agents.

The seed runtime journaled, per agent, the whole shared map as it stood when the agent
completed, and restored those snapshots by replacement on resume. Parallel agents complete in
any order, so one snapshot replaces the writes another agent made. The negative controls below
rebuild that with plain dicts and show the loss; the same runs on crdtstore lose nothing,
whether it restores whole-state updates in the same order or replays its journal in the wrong
order, duplicated, after a reopen of the store file or after compaction.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import crdtstore
from crdtstore import Replica, tree_merge
from crdtstore.record._provenance import Meta

pytestmark = pytest.mark.anyio

AGENTS = 4
ALL_ORDERS = list(itertools.permutations(range(AGENTS)))


def result_key(i: int) -> str:
    return f"result-{i}"


# -- negative controls: whole-state snapshots of a plain dict -----------------------------------


def dict_agents_on_own_views(completion_order: Sequence[int]) -> dict[str, Any]:
    """Parallel agents each load the shared state, write their result into their view and, on
    completion, journal their whole view. Resume restores the snapshots in completion order."""
    base = {"task": "find the slow query"}
    views = {i: dict(base) for i in range(AGENTS)}
    journal = []
    for i in completion_order:
        views[i][result_key(i)] = f"found by {i}"
        journal.append(dict(views[i]))  # the whole state, as the agent saw it
    resumed: dict[str, Any] = {}
    for snapshot in journal:  # restore = clear and replace
        resumed.clear()
        resumed.update(snapshot)
    return resumed


def dict_agents_on_shared_map(completion_order: Sequence[int]) -> dict[str, Any]:
    """The seed's exact bug: one live shared map; each agent writes its result and completes,
    journaling a snapshot of the whole map; resume restores the snapshots in call order."""
    shared: dict[str, Any] = {"task": "find the slow query"}
    snapshots: dict[int, dict[str, Any]] = {}
    for i in completion_order:
        shared[result_key(i)] = f"found by {i}"
        snapshots[i] = dict(shared)
    resumed: dict[str, Any] = {}
    for i in sorted(snapshots):  # replay by call index, not by completion
        resumed.clear()
        resumed.update(snapshots[i])
    return resumed


def lost_results(state: dict[str, Any]) -> list[str]:
    return [result_key(i) for i in range(AGENTS) if result_key(i) not in state]


def test_negative_control_dict_snapshots_restored_in_completion_order_lose_writes() -> None:
    for order in ALL_ORDERS:
        lost = lost_results(dict_agents_on_own_views(order))
        # only the last agent to complete keeps its result
        assert lost == sorted(result_key(i) for i in order[:-1]), order


def test_negative_control_seed_shared_map_replayed_by_call_index_loses_writes() -> None:
    losing = [order for order in ALL_ORDERS if lost_results(dict_agents_on_shared_map(order))]
    # the ordinary "write result, then finish" fan-out loses writes unless the agent with
    # the highest call index happens to finish last
    assert losing == [order for order in ALL_ORDERS if order[-1] != AGENTS - 1]
    assert lost_results(dict_agents_on_shared_map((3, 2, 1, 0))) == [
        "result-0",
        "result-1",
        "result-2",
    ]


# -- the same runs on crdtstore replicas -------------------------------------------------------


def replica_agents_on_own_views(completion_order: Sequence[int]) -> list[bytes]:
    """As dict_agents_on_own_views, but every view is a crdtstore replica and every snapshot
    the replica's whole state (``doc.get_update()``)."""
    origin = Replica()
    tasks = origin.root("tasks", "map")
    origin.local(
        [["map", "tasks", "set", "task", "q"]],
        lambda: tasks.__setitem__("task", "q"),
        Meta("lead", "user", 0.0, None),
    )
    base = origin.doc.get_update()
    journal = []
    for i in completion_order:
        view = Replica()
        view.apply_update(base)
        results, log = view.root("results", "map"), view.root("log", "list")

        def write(i: int = i, results: Any = results, log: Any = log) -> None:
            results[result_key(i)] = f"found by {i}"
            log.append(f"agent {i} done")

        view.local(
            [
                ["map", "results", "set", result_key(i), f"found by {i}"],
                ["list", "log", "ins", 0, [f"agent {i} done"]],
            ],
            write,
            Meta(f"agent{i}", "model", 0.0, None),
        )
        journal.append(view.doc.get_update())
    return journal


@pytest.mark.parametrize("order", ALL_ORDERS[:: len(ALL_ORDERS) // 6])
def test_crdtstore_whole_state_snapshots_restored_in_any_order_keep_every_write(
    order: tuple[int, ...],
) -> None:
    journal = replica_agents_on_own_views(order)
    expected_log = Counter(f"agent {i} done" for i in range(AGENTS))
    rnd = random.Random(repr(order))
    restores = {
        "completion order": journal,
        "call order": [journal[order.index(i)] for i in range(AGENTS)],
        "reversed, duplicated": [*journal[::-1], *journal],
        "shuffled": rnd.sample(journal, len(journal)),
    }
    for how, snapshots in restores.items():
        one_by_one = Replica()
        for snapshot in snapshots:  # each is a whole state: no causal gap in any order
            one_by_one.apply_update(snapshot)
        merged = Replica()
        merged.apply_update(tree_merge(snapshots))
        for resumed in (one_by_one, merged):
            state = resumed.to_dict()
            assert lost_results(state.get("results", {})) == [], how
            assert Counter(state["log"]) == expected_log, how
            assert state["tasks"] == {"task": "q"}, how
        assert one_by_one.to_dict() == merged.to_dict()


# -- parallel live records, and a resume that replays their journal badly -------------------------


async def parallel_agents(store: crdtstore.Store, run: str, writes: int) -> list[int]:
    """AGENTS records write in parallel tasks, interleaved; agent i completes only after agent
    i + 1 did, so they complete in reverse call order. Returns the completion order."""
    done = [anyio.Event() for _ in range(AGENTS)]
    completed: list[int] = []

    async def agent(i: int) -> None:
        source = ("model", "tool", "user", "system")[i]
        async with store.open_record(run=run, agent=f"agent{i}", source=source) as rec:
            for j in range(writes):
                await rec.map("results").set(f"{i}-{j}", {"agent": i, "n": j})
                await rec.list("log").append(f"{i}-{j}")
                await rec.map("shared").set("status", f"agent {i} at {j}")  # contested
                await anyio.lowlevel.checkpoint()
            await rec.text("notes").append(f"agent {i} finished.\n")
            if i + 1 < AGENTS:
                await done[i + 1].wait()
            await rec.flush()
            completed.append(i)
            done[i].set()

    async with anyio.create_task_group() as tg:
        for i in range(AGENTS):
            tg.start_soon(agent, i)
    return completed


def assert_nothing_dropped(state: dict[str, Any], writes: int, *later: str) -> None:
    keys = {f"{i}-{j}" for i in range(AGENTS) for j in range(writes)}
    assert set(state["results"]) == keys
    assert Counter(state["log"]) == Counter([*keys, *later]), "an append was dropped or doubled"
    assert sorted(state["notes"].splitlines()) == [f"agent {i} finished." for i in range(AGENTS)]
    assert state["shared"]["status"].startswith("agent ")


async def test_resume_replays_the_journal_in_any_order_and_drops_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    writes = 12
    async with crdtstore.open_store(url) as store:
        completed = await parallel_agents(store, "fanout", writes)
        assert completed == list(range(AGENTS))[::-1]
        async with store.open_record(run="fanout", agent="lead", source="user") as lead:
            await lead.sync()
            live = lead.to_dict()
        entries = await store.journal("fanout", limit=1_000_000)
    assert_nothing_dropped(live, writes)
    assert len(entries) >= AGENTS * writes

    # the journal replayed in orders no writer ever saw, and with duplicates
    updates = [e.update for e in entries]
    rnd = random.Random(9)
    replays = {
        "reversed": updates[::-1],
        "agent by agent, highest call index first": [
            e.update for e in sorted(entries, key=lambda e: (e.agent, -e.seq), reverse=True)
        ],
        "shuffled": rnd.sample(updates, len(updates)),
        "duplicated and shuffled": rnd.sample(updates * 2, 2 * len(updates)),
        "completion order of the agents": [
            e.update for i in completed for e in entries if e.agent == f"agent{i}"
        ],
    }
    for how, order in replays.items():
        resumed = Replica()
        resumed.apply_update(tree_merge(order))
        assert resumed.to_dict() == live, how

    # a real resume: reopen the store file (a new process would do the same)
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="fanout", agent="resumer", create=False) as rec:
            assert rec.to_dict() == live
        assert (await store.replay("fanout")).to_dict() == live
        # ... and after compaction, from the snapshot alone
        await store.compact("fanout", drop_journal=True)
        assert await store.journal("fanout") == []
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="fanout", agent="resumer2", create=False) as rec:
            assert rec.to_dict() == live
            await rec.list("log").append("after resume")
            await rec.flush()
        async with store.open_record(run="fanout", agent="resumer3", create=False) as rec:
            assert rec.list("log").to_list()[-1] == "after resume"
            assert_nothing_dropped(rec.to_dict(), writes, "after resume")


async def test_two_resumes_of_one_run_see_the_same_state(tmp_path: Path) -> None:
    """The seed's caveat "which parallel writer wins can flip across a resume" does not
    apply: the winner of a contested key is a property of the updates, not of replay order."""
    url = f"sqlite:///{tmp_path}/store.db"
    async with crdtstore.open_store(url) as store:
        await parallel_agents(store, "fanout", 3)
        entries = await store.journal("fanout", limit=1_000_000)
    states = []
    for seed in range(5):
        order = random.Random(seed).sample(entries, len(entries))
        resumed = Replica()
        resumed.apply_update(tree_merge([e.update for e in order]))
        states.append(resumed.to_dict())
    assert all(s == states[0] for s in states)
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="fanout", agent="r", create=False) as rec:
            assert rec.to_dict() == states[0]
