"""Failure mode 6, no-provenance (DESIGN.md): nobody can tell whether a tool, a model or a user
wrote a statement.

Every value of a map can be asked who wrote it (agent, source kind, wall time, run, journal
position) with ``provenance(key)``, and every write to a key, overwritten ones included, with
``history``; the answers agree with the journal, in every replica, after a resume from the
journal (reopening the store file) and after compaction. So can every list item
(``list.provenance(i)``) and every span of a text (``text.authorship()``), including those
that arrive as raw update bytes.
"""

from __future__ import annotations

import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from pycrdt import Array, Doc, Map, Text

import crdtstore
from crdtstore import JournalEntry, Provenance
from crdtstore._values import from_stored

pytestmark = pytest.mark.anyio

RUN = "incident-42"
WRITERS = {"fetcher": "tool", "planner": "model", "alice": "user"}


def check_against_journal(
    prov: Provenance | None,
    key: str,
    value: Any,
    journal: dict[int, JournalEntry],
    *,
    agent: str,
    window: tuple[float, float],
) -> None:
    """``prov`` names ``agent`` and its source kind, a time inside ``window``, and a journal
    entry made by that agent, at that time, that set ``key`` to ``value``."""
    assert prov is not None, f"no provenance for {key!r}"
    assert (prov.run, prov.agent, prov.source) == (RUN, agent, WRITERS[agent]), key
    assert window[0] <= prov.wall_time <= window[1], key
    assert prov.seq is not None and prov.seq in journal, key
    entry = journal[prov.seq]
    assert (entry.agent, entry.source, entry.wall_time) == (agent, prov.source, prov.wall_time)
    sets = [from_stored(op[4]) for op in entry.effect if op[:4] == ["map", "facts", "set", key]]
    assert sets == [value], f"entry {prov.seq} did not write {key}={value!r}"


async def journal_of(store: crdtstore.Store) -> dict[int, JournalEntry]:
    return {e.seq: e for e in await store.journal(RUN, limit=1_000_000)}


async def test_every_value_says_who_wrote_it_also_after_resume_and_compaction(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    t0 = time.time()
    async with crdtstore.open_store(url) as store, AsyncExitStack() as stack:
        recs = {
            a: await stack.enter_async_context(store.open_record(run=RUN, agent=a, source=s))
            for a, s in WRITERS.items()
        }
        tool, model, user = recs["fetcher"], recs["planner"], recs["alice"]
        await tool.map("facts").set("p99_ms", 2000)  # a measurement, by a tool
        # a batched write is attributed at once; its journal position comes with the flush
        prov = tool.map("facts").provenance("p99_ms")
        assert prov is not None and prov.agent == "fetcher" and prov.seq is None
        await model.map("facts").set("cause", "the cache is cold")  # an inference
        await user.map("facts").set("priority", "high")  # a human decision
        await model.map("facts").set("owner", "team-a")
        await model.flush()
        await user.sync()
        await user.map("facts").set("owner", "team-b")  # the user corrects the model
        for rec in recs.values():
            await rec.flush()
        for rec in recs.values():
            await rec.sync()
        window = (t0, time.time())
        journal = await journal_of(store)
        writer_of = {"p99_ms": "fetcher", "cause": "planner", "priority": "alice", "owner": "alice"}
        for rec in recs.values():  # the writer's own replica and the others agree
            facts = rec.map("facts")
            assert sorted(facts.keys()) == sorted(writer_of)
            for key, agent in writer_of.items():
                check_against_journal(
                    facts.provenance(key), key, facts[key], journal, agent=agent, window=window
                )
        history = await model.history("facts", "owner")
        assert [(h.value, h.deleted, h.provenance.agent, h.provenance.source) for h in history] == [
            ("team-a", False, "planner", "model"),
            ("team-b", False, "alice", "user"),
        ]
        assert history[1].provenance == user.map("facts").provenance("owner")
        assert history == await tool.map("facts").history("owner")
        provs = {k: tool.map("facts").provenance(k) for k in writer_of}
        histories = {k: await tool.map("facts").history(k) for k in writer_of}

    async def same_answers(store: crdtstore.Store, *, history: bool = True) -> None:
        async with store.open_record(
            run=RUN, agent="auditor", source="system", create=False
        ) as rec:
            assert {k: rec.map("facts").provenance(k) for k in writer_of} == provs
            if history:
                assert {k: await rec.map("facts").history(k) for k in writer_of} == histories

    async with crdtstore.open_store(url) as store:  # resume from the journal
        await same_answers(store)
        await store.compact(RUN)  # resume from a snapshot, the journal kept as audit trail
    async with crdtstore.open_store(url) as store:
        assert (await store.run_info(RUN)).snapshot_seq == max(journal)
        await same_answers(store)
        # after compaction, a new write is attributed like any other
        async with store.open_record(run=RUN, agent="fetcher", source="tool") as tool:
            await tool.map("facts").set("p99_ms", 350)
            await tool.flush()
        window = (t0, time.time())
        async with store.open_record(run=RUN, agent="auditor", source="system") as rec:
            check_against_journal(
                rec.map("facts").provenance("p99_ms"),
                "p99_ms",
                350,
                await journal_of(store),
                agent="fetcher",
                window=window,
            )
            assert [h.value for h in await rec.map("facts").history("p99_ms")] == [2000, 350]
        provs["p99_ms"] = rec.map("facts").provenance("p99_ms")
        # dropping the journal prefix drops the audit trail (history), not provenance
        await store.compact(RUN, drop_journal=True)
    async with crdtstore.open_store(url) as store:
        assert await store.journal(RUN) == []
        await same_answers(store, history=False)


async def test_concurrent_writes_to_one_key_provenance_names_the_winner(tmp_path: Path) -> None:
    """Under lww the current value's provenance is its writer's, in every replica and after
    resume; the loser stays in history (I2)."""
    url = f"sqlite:///{tmp_path}/store.db"
    t0 = time.time()
    async with crdtstore.open_store(url) as store:
        async with (
            store.open_record(run=RUN, agent="planner", source="model") as model,
            store.open_record(run=RUN, agent="alice", source="user") as user,
        ):
            async with user.transaction():  # holds back user's tail: the writes are concurrent
                await model.map("facts").set("status", "investigating")
                await model.flush()
                await user.map("facts").set("status", "resolved")
            await user.flush()
            await model.sync()
            await user.sync()
            window = (t0, time.time())
            journal = await journal_of(store)
            value = model.map("facts")["status"]
            assert user.map("facts")["status"] == value
            winner = {"investigating": "planner", "resolved": "alice"}[value]
            for rec in (model, user):
                check_against_journal(
                    rec.map("facts").provenance("status"),
                    "status",
                    value,
                    journal,
                    agent=winner,
                    window=window,
                )
            history = await model.map("facts").history("status")
            assert sorted((h.value, h.provenance.agent) for h in history) == [
                ("investigating", "planner"),
                ("resolved", "alice"),
            ]
            live = model.map("facts").provenance("status")
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run=RUN, agent="auditor", source="system") as rec:
            assert rec.map("facts").provenance("status") == live
        await store.compact(RUN, drop_journal=True)
        async with store.open_record(run=RUN, agent="auditor2", source="system") as rec:
            assert rec.map("facts").provenance("status") == live


async def test_value_merged_through_apply_update_is_attributed_to_its_applier() -> None:
    """A write that arrives as raw update bytes (a Yjs client, an import) is journaled as a
    write of the record that applied it; provenance and history must say so.

    Fails today: the entry's effect is empty, so the applier's replica and the replicas that
    tail the journal keep the *previous* writer as provenance of the new value, history does
    not list the write, and only a replica rebuilt from the whole journal attributes it.
    """
    async with crdtstore.open_store("memory://") as store:
        async with (
            store.open_record(run=RUN, agent="planner", source="model") as model,
            store.open_record(run=RUN, agent="alice", source="user") as user,
        ):
            await model.map("facts").set("owner", "team-a")
            await model.flush()
            await user.sync()
            # alice edits in a Yjs editor; its update reaches the record as bytes
            editor = Doc()
            editor.apply_update(user.replica.doc.get_update())
            editor.get("facts", type=Map)["owner"] = "team-b"
            await user.apply_update(editor.get_update(user.replica.doc.get_state()))
            await user.flush()
            await model.sync()
            answers: dict[str, Any] = {}
            for rec in (model, user):
                assert rec.map("facts")["owner"] == "team-b"
                prov = rec.map("facts").provenance("owner")
                answers[rec.agent] = prov and (prov.agent, prov.source)
            history = await model.map("facts").history("owner")
            answers["history"] = [(h.value, h.provenance.agent) for h in history]
            async with store.open_record(run=RUN, agent="auditor", source="system") as rec:
                prov = rec.map("facts").provenance("owner")
                answers["resumed"] = prov and (prov.agent, prov.source)
    assert answers == {
        "planner": ("alice", "user"),
        "alice": ("alice", "user"),
        "history": [("team-a", "planner"), ("team-b", "alice")],
        "resumed": ("alice", "user"),
    }


def check_item(prov: Provenance | None, wrote: Any, journal: dict[int, JournalEntry]) -> str:
    """``prov`` names a journal entry, by that agent at that time, whose effect inserted
    ``wrote`` (a list value, or characters of a text); return its agent."""
    assert prov is not None and prov.seq in journal, wrote
    entry = journal[prov.seq]
    assert (entry.agent, entry.source, entry.wall_time) == (prov.agent, prov.source, prov.wall_time)
    inserted = [op[4] for op in entry.effect if op[2] == "ins"]
    assert any(wrote in (x if isinstance(x, str) else map(from_stored, x)) for x in inserted), (
        f"entry {prov.seq} did not insert {wrote!r}"
    )
    return prov.agent


async def test_every_list_item_and_text_span_says_who_wrote_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    async with crdtstore.open_store(url) as store, AsyncExitStack() as stack:
        recs = {
            a: await stack.enter_async_context(store.open_record(run=RUN, agent=a, source=s))
            for a, s in WRITERS.items()
        }
        tool, model, user = recs["fetcher"], recs["planner"], recs["alice"]
        await tool.list("log").append("p99 is 2000 ms")  # a measurement
        await tool.text("report").edit("Latency: p99 2000 ms.\n")
        await tool.flush()
        await model.sync()
        await model.list("log").insert(0, "the cache is cold")  # an inference, before it
        await model.text("report").insert(0, "Cause: cold cache.\n")
        await model.flush()
        await user.sync()
        # alice edits in a Yjs editor; its update reaches the record as bytes
        editor = Doc()
        editor.apply_update(user.replica.doc.get_update())
        editor.get("log", type=Array).append("priority: high")
        editor.get("report", type=Text).insert(0, "Decision: page team-a.\n")
        await user.apply_update(editor.get_update(user.replica.doc.get_state()))
        for rec in recs.values():
            await rec.flush()
        for rec in recs.values():
            await rec.sync()
        journal = await journal_of(store)
        want_items = ["the cache is cold", "p99 is 2000 ms", "priority: high"]
        want_lines = {
            "Decision: page team-a.\n": "alice",
            "Cause: cold cache.\n": "planner",
            "Latency: p99 2000 ms.\n": "fetcher",
        }
        answers = []
        for rec in recs.values():  # every replica: the writer's own and the others
            log, report = rec.list("log"), rec.text("report")
            assert log.to_list() == want_items
            agents = [check_item(log.provenance(i), log[i], journal) for i in range(len(log))]
            assert agents == ["planner", "fetcher", "alice"]
            spans = report.authorship()
            assert "".join(s.text for s in spans) == report.read()
            for span in spans:
                check_item(span.provenance, span.text, journal)
            assert {s.text: s.provenance and s.provenance.agent for s in spans} == want_lines
            answers.append((log.provenances(), spans))
        assert all(a == answers[0] for a in answers)

        # negative control: the journal's per-entry effect does not answer it by position:
        # the tool's entry says it inserted at index 0, where the model's item is now
        (tool_entry,) = [e for e in journal.values() if e.effect[0][:2] == ["list", "log"]][:1]
        assert tool_entry.effect[0][3] == 0 and tool.list("log")[0] != tool_entry.effect[0][4][0]

    async def same(store: crdtstore.Store) -> None:
        async with store.open_record(run=RUN, agent="auditor", source="system") as rec:
            assert (rec.list("log").provenances(), rec.text("report").authorship()) == answers[0]

    async with crdtstore.open_store(url) as store:  # resume from the journal
        await same(store)
        await store.compact(RUN, drop_journal=True)  # and from a snapshot alone
    async with crdtstore.open_store(url) as store:
        assert await store.journal(RUN) == []
        await same(store)
