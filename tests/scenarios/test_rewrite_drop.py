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
