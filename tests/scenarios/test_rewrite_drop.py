"""Failure mode 2, rewrite-drop: an agent "updates" a shared scratchpad by rewriting it and
silently drops facts it did not judge relevant (or had not seen)."""

from __future__ import annotations

from pathlib import Path

import pytest

import crdtstore
from crdtstore import CollectionSpec, PolicyViolation

pytestmark = pytest.mark.anyio


async def test_text_rewrite_keeps_a_concurrent_fact(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    async with crdtstore.open_store(url) as store:
        async with (
            store.open_record(run="r", agent="scribe") as scribe,
            store.open_record(run="r", agent="editor") as editor,
        ):
            notes = scribe.text("notes")
            await notes.edit("Fact A.\nFact B.\nFact C.\n")
            await scribe.flush()
            await editor.sync()
            base = str(editor.text("notes"))
            # concurrently: the scribe adds a fact the editor has not seen...
            await scribe.text("notes").edit(base.replace("Fact B.\n", "Fact B.\nFact D.\n"))
            # ...while the editor rewrites the whole text from its (now stale) copy,
            # tidying fact C away on purpose
            await editor.text("notes").edit(base.replace("Fact C.\n", "Fact C (checked).\n"))
            await scribe.flush()
            await editor.flush()
            await scribe.sync()
            await editor.sync()
            merged = str(scribe.text("notes"))
            assert merged == str(editor.text("notes"))
            assert "Fact D." in merged  # the fact the editor never saw survives
            assert "Fact C (checked)." in merged
            assert merged.count("Fact A.") == 1


async def test_append_only_log_cannot_be_rewritten() -> None:
    schema = {"facts": CollectionSpec(kind="list", policy="append_only")}
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a", schema=schema) as a:
            facts = a.list("facts")
            await facts.extend(["f1", "f2", "f3"])
            # the "rewrite" an agent would do: delete everything, then write its own version
            with pytest.raises(PolicyViolation):
                await facts.delete(0, 3)
            with pytest.raises(PolicyViolation):
                await facts.insert(1, "f1.5")
            await facts.append("f4")
            assert facts.to_list() == ["f1", "f2", "f3", "f4"]


async def _two_agents_rewrite_one_entry(
    tmp_path: Path, schema: dict[str, CollectionSpec]
) -> tuple[dict[str, object], list[object]]:
    """Two agents read finding ``f1``, then each writes the whole entry back with one field
    changed, concurrently: the triager sets ``status``, the reviewer adds ``notes``."""
    url = f"sqlite:///{tmp_path}/store.db"
    async with crdtstore.open_store(url) as store:
        async with (
            store.open_record(run="r", agent="triager", schema=schema) as triager,
            store.open_record(run="r", agent="reviewer", schema=schema) as reviewer,
        ):
            await triager.map("findings").set("f1", {"title": "leak", "status": "new"})
            await triager.flush()
            await reviewer.sync()
            base = dict(reviewer.map("findings")["f1"])
            await triager.map("findings").set("f1", {**base, "status": "confirmed"})
            await reviewer.map("findings").set("f1", {**base, "notes": ["seen in prod"]})
            for rec in (triager, reviewer):
                await rec.flush()
            for rec in (triager, reviewer):
                await rec.sync()
            entry = triager.map("findings")["f1"]
            assert entry == reviewer.map("findings")["f1"]
            history = [h.value for h in await triager.history("findings", "f1")]
            return dict(entry), history


async def test_whole_entry_rewrites_keep_both_fields_with_merge_fields(tmp_path: Path) -> None:
    schema = {"findings": CollectionSpec(kind="map", merge="fields")}
    entry, _ = await _two_agents_rewrite_one_entry(tmp_path, schema)
    assert entry == {"title": "leak", "status": "confirmed", "notes": ["seen in prod"]}


async def test_negative_control_an_atomic_entry_drops_one_rewrite(tmp_path: Path) -> None:
    """Without merge="fields" one of the two edits is gone from the live record (it survives
    only in history): the failure mode this scenario is about."""
    entry, history = await _two_agents_rewrite_one_entry(tmp_path, {})
    assert not ("notes" in entry and entry.get("status") == "confirmed")
    lost = {"title": "leak", "status": "new", "notes": ["seen in prod"]}
    if "notes" in entry:
        lost = {"title": "leak", "status": "confirmed"}
    assert lost in history


async def test_patch_of_a_plain_map_is_refused_rather_than_dropping_an_edit() -> None:
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a") as rec:
            await rec.map("findings").set("f1", {"title": "leak"})
            with pytest.raises(crdtstore.InvalidValue, match="merge='fields'"):
                await rec.map("findings").patch("f1", {"status": "confirmed"})
