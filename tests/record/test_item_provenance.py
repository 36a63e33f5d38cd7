"""Provenance of list items and text spans through records (issue 19 part 3).

``ListCollection.provenance(i)`` / ``provenances()`` and ``TextCollection.authorship()`` on a
real SQLite store: per writer, before and after the journal, after resume and after a
compaction that drops the journal; the blocking facade; the tools (``store_get``) and
``crdtstore inspect``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import crdtstore
from crdtstore import Span
from crdtstore.blocking import open_store as open_blocking
from crdtstore.tools import Toolset

pytestmark = pytest.mark.anyio


def who(provs: list[crdtstore.Provenance | None]) -> list[tuple[str, str, int | None] | None]:
    return [None if p is None else (p.agent, p.source, p.seq) for p in provs]


def spans(text: crdtstore.TextCollection) -> list[tuple[str, str | None, int | None]]:
    return [
        (
            s.text,
            None if s.provenance is None else s.provenance.agent,
            s.provenance and s.provenance.seq,
        )
        for s in text.authorship()
    ]


async def write_two_agents(store: crdtstore.Store) -> None:
    async with (
        store.open_record("r", agent="alice") as a,
        store.open_record("r", agent="bob", source="tool") as b,
    ):
        await a.list("log").extend(["a1", "a2"])  # seq 1
        await a.text("notes").edit("hello world\nsecond line\n")  # seq 2
        await a.flush()
        await b.sync()
        await b.list("log").insert(1, "b1")  # seq 3
        await b.text("notes").insert(6, "big é😀 ")  # seq 4
        await b.flush()
        await a.sync()
        want = [("alice", "model", 1), ("bob", "tool", 3), ("alice", "model", 1)]
        assert who(a.list("log").provenances()) == want
        assert who(b.list("log").provenances()) == want
        assert a.list("log").provenance(-1) == a.list("log").provenances()[2]
        expected = [
            ("hello ", "alice", 2),
            ("big é😀 ", "bob", 4),
            ("world\nsecond line\n", "alice", 2),
        ]
        assert spans(a.text("notes")) == expected == spans(b.text("notes"))


async def test_items_and_spans_name_their_writer_through_resume_and_compaction(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with crdtstore.open_store(url) as store:
        await write_two_agents(store)
        async with store.open_record("r", agent="carol") as c:  # resume from the journal
            resumed = (who(c.list("log").provenances()), spans(c.text("notes")))
        await store.compact("r", drop_journal=True)
    async with crdtstore.open_store(url) as store:
        async with store.open_record("r", agent="dave") as d:  # from the snapshot alone
            assert (who(d.list("log").provenances()), spans(d.text("notes"))) == resumed
            await d.list("log").append("d1")  # after the snapshot
            await d.text("notes").append("by dave")
        await store.compact("r", drop_journal=True)
        async with store.open_record("r", agent="erin") as e:
            provs = who(e.list("log").provenances())
            assert provs[:3] == resumed[0] and provs[3] == ("dave", "model", 5)
            assert spans(e.text("notes")) == [*resumed[1], ("by dave", "dave", 6)]


async def test_an_unjournaled_write_has_no_position_yet() -> None:
    async with crdtstore.open_store("memory://", durability="batched") as store:
        async with store.open_record("r", agent="alice") as a:
            await a.list("log").append("x")
            await a.text("t").append("abc")
            assert who(a.list("log").provenances()) == [("alice", "model", None)]
            assert [s.provenance.seq for s in a.text("t").authorship() if s.provenance] == [None]
            await a.flush()
            assert who(a.list("log").provenances()) == [("alice", "model", 1)]
            (span,) = a.text("t").authorship()
            assert (span.start, span.end, span.text) == (0, 3, "abc")
            assert isinstance(span, Span) and span.provenance is not None
            assert (span.provenance.agent, span.provenance.seq) == ("alice", 2)


async def test_bad_index_is_refused() -> None:
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record("r", agent="alice") as a:
            with pytest.raises(IndexError):
                a.list("log").provenance(0)
            with pytest.raises(crdtstore.InvalidValue):
                a.list("log").provenance("0")  # type: ignore[arg-type]
            assert a.text("t").authorship() == []


def test_blocking_facade(tmp_path: Path) -> None:
    with open_blocking(f"sqlite:///{tmp_path / 'b.db'}") as store:
        with store.open_record("r", agent="alice") as rec:
            rec.list("log").append("x")
            rec.text("t").append("hi")
            assert rec.list("log").provenance(0).agent == "alice"
            assert [s.text for s in rec.text("t").authorship()] == ["hi"]


async def test_tools_return_item_and_span_provenance() -> None:
    async with crdtstore.open_store("memory://") as store:
        await write_two_agents(store)
        async with store.open_record("r", agent="reader") as rec, Toolset(rec) as tools:
            got = await tools.call("store_get", {"collection": "log"})
            assert [
                (i["value"], i["provenance"]["agent"], i["provenance"]["seq"]) for i in got["items"]
            ] == [
                ("a1", "alice", 1),
                ("b1", "bob", 3),
                ("a2", "alice", 1),
            ]
            got = await tools.call("store_get", {"collection": "notes"})
            text = got["text"]
            assert [
                (text[s["start"] : s["end"]], s["provenance"]["agent"], s["provenance"]["seq"])
                for s in got["authorship"]
            ] == [
                ("hello ", "alice", 2),
                ("big é😀 ", "bob", 4),
                ("world\nsecond line\n", "alice", 2),
            ]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "crdtstore"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "crdtstore.cli"]
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=120)


async def test_inspect_shows_who_wrote_items_and_lines(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'i.db'}"
    async with crdtstore.open_store(url) as store:
        await write_two_agents(store)
    out = _cli("inspect", url, "--run", "r", "--json")
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    log = data["collections"]["log"]
    assert [(p["agent"], p["seq"]) for p in log["item_provenance"]] == [
        ("alice", 1),
        ("bob", 3),
        ("alice", 1),
    ]
    notes = data["collections"]["notes"]
    assert [(s["start"], s["end"], s["provenance"]["agent"]) for s in notes["authorship"]] == [
        (0, 6, "alice"),
        (6, 13, "bob"),
        (13, 31, "alice"),
    ]
    assert {"alice", "bob"} <= set(data["agents"])
    tree = _cli("inspect", url, "--run", "r")
    assert tree.returncode == 0, tree.stderr
    assert '"b1"  (bob (tool) #3)' in tree.stdout
    assert "hello big é😀 world  (alice (model) #2, bob (tool) #4)" in tree.stdout
    assert "second line  (alice (model) #2)" in tree.stdout


async def test_authorship_of_part_of_a_text() -> None:
    async with crdtstore.open_store("memory://") as store:
        await write_two_agents(store)
        async with store.open_record("r", agent="reader") as rec:
            notes = rec.text("notes")
            whole = notes.authorship()
            part = notes.authorship(3, 16)
            assert [(s.start, s.end, s.text) for s in part] == [
                (3, 6, "lo "),
                (6, 13, "big é😀 "),
                (13, 16, "wor"),
            ]
            assert [s.provenance for s in part] == [s.provenance for s in whole[:3]]
            assert notes.authorship(40) == [] and notes.authorship(5, 5) == []
            with pytest.raises(crdtstore.InvalidValue):
                notes.authorship("0")  # type: ignore[arg-type]


async def test_spans_inside_one_block_of_non_ascii_text() -> None:
    """yrs merges one writer's consecutive typing into one block; pycrdt's sticky index
    counts UTF-8 bytes into it where clocks count UTF-16 units: each character's entry is
    still found (here the last one's bytes would point past the block, at a later entry)."""
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record("r", agent="alice") as a:
            notes = a.text("notes")
            await notes.append("é😀é")  # seq 1
            await notes.append("x")  # seq 2: typed after it, merged into its block
            await notes.insert(0, "yyyyyyyy")  # seq 3, 4, ...: later entries elsewhere
            await notes.insert(0, "zzzzzzzz")
            await a.flush()
            got = [(s.text, s.provenance and s.provenance.seq) for s in notes.authorship()]
            assert got == [("zzzzzzzz", 4), ("yyyyyyyy", 3), ("é😀é", 1), ("x", 2)]
        async with store.open_record("r", agent="bob") as b:  # the same on another replica
            assert [
                (s.text, s.provenance and s.provenance.seq) for s in b.text("notes").authorship()
            ] == got
