"""Failure mode 9, replay-clobber, for nested runs: the seed runtime keyed per-agent deltas by
call index, and a nested run restarting its index at 0 clobbered its parent's entries on
replay. Here a parent and its nested runs write in parallel, and a resume (in any order)
rebuilds every write of every run."""

from __future__ import annotations

import random
from pathlib import Path

import anyio
import pytest

import crdtstore
from crdtstore import tree_merge

pytestmark = pytest.mark.anyio


async def test_parallel_parent_and_nested_runs_resume_without_loss(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    async with crdtstore.open_store(url) as store:
        # the workflow creates its nested runs before they start in parallel
        async with store.open_record(run="wf", agent="root"):
            pass
        async with store.open_record(run="wf-nested1", agent="root", parent="wf"):
            pass
        async with store.open_record(run="wf-nested2", agent="root", parent="wf-nested1"):
            pass
        with anyio.fail_after(60):

            async def agent(run: str, parent: str | None, name: str) -> None:
                async with store.open_record(run=run, agent=name, parent=parent) as rec:
                    for i in range(20):  # every run counts its calls from 0
                        await rec.map("results").set(f"{run}:{i}", {"by": name, "i": i})
                        await rec.list("log").append(f"{run}:{i}")

            async with anyio.create_task_group() as tg:
                tg.start_soon(agent, "wf", None, "root-agent")
                tg.start_soon(agent, "wf-nested1", "wf", "child-1")
                tg.start_soon(agent, "wf-nested2", "wf-nested1", "grandchild")
        entries = await store.journal("wf", limit=100_000)
        seqs = [e.seq for e in entries]
        assert len(seqs) == len(set(seqs)) == 120  # no key collision across nested runs
        assert {e.origin_run for e in entries} == {"wf", "wf-nested1", "wf-nested2"}
        expected = {f"{run}:{i}" for run in ("wf", "wf-nested1", "wf-nested2") for i in range(20)}
        # resume from the journal
        async with store.open_record(run="wf", agent="resumer") as rec:
            assert set(rec.map("results").keys()) == expected
            assert set(rec.list("log").to_list()) == expected
            prov = rec.map("results").provenance("wf-nested2:7")
            assert prov is not None
            assert (prov.run, prov.agent) == ("wf-nested2", "grandchild")
        # and a replay in a shuffled, duplicated order merges to the same record
        updates = [e.update for e in entries] * 2
        random.Random(9).shuffle(updates)
        replica = crdtstore.Replica()
        replica.apply_update(tree_merge(updates))
        assert set(replica.read("results", "map")) == expected
        assert sorted(replica.read("log", "list")) == sorted(expected)
