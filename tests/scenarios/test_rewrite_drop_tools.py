"""Failure mode 2, rewrite-drop, through the agent tools: an agent "updates" a shared
scratchpad by rewriting it and drops facts it had not seen. There is no tool that rewrites a
text: ``store_text_edit`` takes small edits, resolved against the text as it is when the call
runs, so concurrent edits elsewhere survive; a ``find`` that is gone or ambiguous is refused
(EDIT_REFUSED) and nothing changes."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest

import crdtstore
from crdtstore.tools import Toolset

pytestmark = pytest.mark.anyio

BASE = "Fact A.\nFact B.\nFact C.\n"


async def _open(stack: AsyncExitStack, store: crdtstore.Store, agent: str) -> Toolset:
    rec = await stack.enter_async_context(store.open_record(run="r", agent=agent))
    return await stack.enter_async_context(Toolset(rec))


def _edit(*edits: dict[str, Any]) -> dict[str, Any]:
    return {"collection": "notes", "edits": list(edits)}


async def _text(tools: Toolset) -> str:
    page = await tools.call("store_get", {"collection": "notes"})
    assert page["next_cursor"] is None, page
    return str(page["text"])


async def test_no_tool_rewrites_a_whole_text() -> None:
    """The edit tool takes edits only (find/replace, splice), and a text is no map value."""
    async with crdtstore.open_store("memory://") as store, AsyncExitStack() as stack:
        tools = await _open(stack, store, "editor")
        schemas = {s["name"]: s for s in tools.schemas("mcp")}
        edit = schemas["store_text_edit"]["inputSchema"]
        assert set(edit["properties"]) == {"collection", "edits"}
        assert edit["properties"]["edits"]["type"] == "array"
        await tools.call("store_text_edit", _edit({"at": 0, "insert": BASE}))
        put = await tools.call("store_put", {"collection": "notes", "key": "all", "value": ""})
        assert put["error"]["code"] == "COLLECTION_KIND", put
        assert await _text(tools) == BASE


async def test_concurrent_edits_of_different_parts_both_survive(tmp_path: Path) -> None:
    async with (
        crdtstore.open_store(f"sqlite:///{tmp_path}/store.db") as store,
        AsyncExitStack() as stack,
    ):
        scribe, editor = await _open(stack, store, "scribe"), await _open(stack, store, "editor")
        assert (await scribe.call("store_text_edit", _edit({"at": 0, "insert": BASE})))["ok"]
        assert await _text(editor) == BASE  # both start from the same text
        results: dict[str, dict[str, Any]] = {}

        async def add_fact() -> None:  # the scribe adds a fact the editor has not seen
            results["scribe"] = await scribe.call(
                "store_text_edit", _edit({"find": "Fact B.\n", "replace": "Fact B.\nFact D.\n"})
            )

        async def check_fact() -> None:  # while the editor marks another one checked
            results["editor"] = await editor.call(
                "store_text_edit", _edit({"find": "Fact C.", "replace": "Fact C (checked)."})
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(add_fact)
            tg.start_soon(check_fact)
        assert results["scribe"].get("ok") and results["editor"].get("ok"), results
        want = "Fact A.\nFact B.\nFact D.\nFact C (checked).\n"
        assert await _text(scribe) == await _text(editor) == want


async def test_an_edit_planned_on_a_stale_read_lands_where_its_text_is_now() -> None:
    """The editor read the text, the scribe then inserted a line before the part the editor
    edits: the find is resolved against the current text, so the editor's edit lands on its
    sentence and the scribe's line stays."""
    async with crdtstore.open_store("memory://") as store, AsyncExitStack() as stack:
        scribe, editor = await _open(stack, store, "scribe"), await _open(stack, store, "editor")
        await scribe.call("store_text_edit", _edit({"at": 0, "insert": BASE}))
        stale = await _text(editor)
        assert (await scribe.call("store_text_edit", _edit({"at": 0, "insert": "Fact 0.\n"})))["ok"]
        at = stale.index("Fact C.")  # where the editor saw it: the splice would be off now
        got = await editor.call(
            "store_text_edit", _edit({"find": "Fact C.", "replace": "Fact C (checked)."})
        )
        assert got["ok"], got
        assert await _text(editor) == "Fact 0.\nFact A.\nFact B.\nFact C (checked).\n"
        assert at != (await _text(editor)).index("Fact C")


async def test_a_find_that_is_gone_or_ambiguous_is_refused_and_changes_nothing() -> None:
    async with crdtstore.open_store("memory://") as store, AsyncExitStack() as stack:
        scribe, editor = await _open(stack, store, "scribe"), await _open(stack, store, "editor")
        await scribe.call("store_text_edit", _edit({"at": 0, "insert": BASE}))
        await _text(editor)
        # the scribe rewords fact B after the editor read it
        await scribe.call("store_text_edit", _edit({"find": "Fact B.", "replace": "Fact B2."}))
        head = (await store.run_info("r")).head
        cases = [
            (_edit({"find": "Fact B.", "replace": "Fact B (checked)."}), "not_found", 0),
            (_edit({"find": "Fact", "replace": "Claim"}), "ambiguous", 0),
            # the whole call is refused, the good first edit too
            (
                _edit(
                    {"find": "Fact A.", "replace": "Fact A (checked)."},
                    {"find": "Fact B.", "replace": "x"},
                ),
                "not_found",
                1,
            ),
            (_edit({"at": 100, "delete": 1}), "out_of_range", 0),
        ]
        for args, reason, index in cases:
            refused = await editor.call("store_text_edit", args)
            err = refused["error"]
            assert err["code"] == "EDIT_REFUSED", refused
            assert (err["reason"], err["edit"]) == (reason, index), refused
            if index == 0:
                assert err["current"]["length"] == len("Fact A.\nFact B2.\nFact C.\n"), refused
            assert (await store.run_info("r")).head == head, "a refused edit was journaled"
            assert await _text(editor) == "Fact A.\nFact B2.\nFact C.\n"
        # re-read and retry, as the message says
        got = await editor.call(
            "store_text_edit", _edit({"find": "Fact B2.", "replace": "Fact B2 (checked)."})
        )
        assert got["ok"], got


async def test_negative_control_a_scratchpad_rewritten_whole_drops_a_fact() -> None:
    """The failure mode, with the scratchpad kept as one map value that agents put whole:
    the editor's rewrite from its stale copy wins and fact D is gone from the pad."""
    async with crdtstore.open_store("memory://") as store, AsyncExitStack() as stack:
        scribe, editor = await _open(stack, store, "scribe"), await _open(stack, store, "editor")
        pad = {"collection": "pads", "key": "notes"}
        await scribe.call("store_put", {**pad, "value": BASE})
        stale = (await editor.call("store_get", pad))["value"]
        fresh = (await scribe.call("store_get", pad))["value"]
        await scribe.call("store_put", {**pad, "value": fresh.replace("B.\n", "B.\nFact D.\n")})
        rewrite = stale.replace("Fact C.", "Fact C (checked).")
        assert (await editor.call("store_put", {**pad, "value": rewrite}))["ok"]
        now = (await scribe.call("store_get", pad))["value"]
        assert "Fact D." not in now, "the failure mode: the rewrite dropped fact D"
        history = await scribe.call("store_history", pad)
        assert any("Fact D." in e["value"] for e in history["entries"])  # only there
