"""Provenance of list items and text spans written through the hub by a real JavaScript
Yjs client (``yjs`` + ``y-websocket``, ``tests/interop/client.mjs``): its items and
characters are attributed to its token's agent, on a Python record tailing the journal,
after a resume and after a compaction that drops the journal; a crdtstore writer's items in
the same list and text keep theirs. (The hub and the client as in tests/test_interop.py.)
"""

from __future__ import annotations

import pytest

import crdtstore
from tests._wait import until
from tests.test_interop import RUN, TENANT, RunningHub, hub, js_client, py_record, token

__all__ = ["hub"]  # (the fixture, imported for pytest)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def authors(rec: crdtstore.Record) -> tuple[list[str | None], list[tuple[str, str | None]]]:
    items = [None if p is None else p.agent for p in rec.list("steps").provenances()]
    spans = [
        (s.text, None if s.provenance is None else s.provenance.agent)
        for s in rec.text("notes").authorship()
    ]
    return items, spans


async def test_js_items_and_text_are_its_tokens_agent(hub: RunningHub) -> None:
    async with py_record(hub) as rec, js_client(hub, token("js-agent")) as js:
        await rec.list("steps").append("py-1")
        await rec.text("notes").edit("python wrote this. ")
        await rec.flush()
        await js.cmd("wait-for", state={"steps": ["py-1"], "notes": "python wrote this. "})
        await js.cmd("array.push", name="steps", values=["js-1", "js-2"])
        await js.cmd("array.insert", name="steps", index=0, values=["js-0"])
        await js.cmd("text.insert", name="notes", index=7, text="and 🌍 JS ")
        await js.cmd("text.insert", name="notes", index=0, text="Yjs: ")
        await js.cmd("flush")
        await until(lambda: rec.list("steps").to_list() == ["js-0", "py-1", "js-1", "js-2"])
        await until(lambda: rec.text("notes").read() == "Yjs: python and 🌍 JS wrote this. ")
        want = (
            ["js-agent", "py", "js-agent", "js-agent"],
            [
                ("Yjs: ", "js-agent"),
                ("python ", "py"),
                ("and 🌍 JS ", "js-agent"),
                ("wrote this. ", "py"),
            ],
        )
        assert authors(rec) == want
        seqs = [p.seq for p in rec.list("steps").provenances() if p is not None]
        assert all(isinstance(s, int) for s in seqs)
        assert {p.source for p in rec.list("steps").provenances() if p is not None} >= {"tool"}

    async with crdtstore.open_store(hub.store_url, tenant=TENANT) as store:
        async with store.open_record(RUN, "reader") as again:  # resume from the journal
            assert authors(again) == want
        await store.compact(RUN, drop_journal=True)
        async with store.open_record(RUN, "reader") as again:  # from the snapshot
            assert authors(again) == want
