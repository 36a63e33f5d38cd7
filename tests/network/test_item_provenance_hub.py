"""Provenance of list items and text spans written through the hub by a real JavaScript
Yjs client (``yjs`` + ``y-websocket``, ``tests/interop/client.mjs``): its items and
characters are attributed to its token's agent, on a Python record tailing the journal,
after a resume and after a compaction that drops the journal; a crdtstore writer's items in
the same list and text keep theirs. (The hub and the client as in tests/network/test_interop.py.)
And crdtstore writers through the hub (``ws://``, as in tests/network/test_sync_client.py): their
token's agent, on their own replica and the others'.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import crdtstore
from tests._wait import until
from tests.network.test_interop import RUN, TENANT, RunningHub, hub, js_client, py_record, token
from tests.network.test_sync_client import RUN as WS_RUN
from tests.network.test_sync_client import TENANT as WS_TENANT
from tests.network.test_sync_client import running_hub, ws_record
from tests.network.test_sync_client import token as ws_token

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


async def test_ws_writers_items_and_spans_are_their_tokens_agent(tmp_path: Path) -> None:
    """crdtstore writers through the hub (``ws://``): every replica, the writer's own
    included, names the token's agent; so does a resume from the hub's store."""
    async with (
        running_hub(tmp_path) as running,
        ws_record(running, ws_token("alice")) as alice,
        ws_record(running, ws_token("bob")) as bob,
    ):
        await alice.list("steps").extend(["a1", "a2"])
        await alice.text("notes").edit("alice wrote this.")
        await alice.flush()
        await until(lambda: bob.list("steps").to_list() == ["a1", "a2"])
        await until(lambda: bob.text("notes").read() == "alice wrote this.")
        await bob.list("steps").insert(1, "b1")
        await bob.text("notes").insert(6, "and bob ")
        await bob.flush()
        await until(lambda: alice.list("steps").to_list() == ["a1", "b1", "a2"])
        await until(lambda: alice.text("notes").read() == "alice and bob wrote this.")
        want = (
            ["alice", "bob", "alice"],
            [("alice ", "alice"), ("and bob ", "bob"), ("wrote this.", "alice")],
        )
        assert authors(alice) == want
        assert authors(bob) == want
        async with (
            crdtstore.open_store(running.store_url, tenant=WS_TENANT) as store,
            store.open_record(WS_RUN, "reader") as again,
        ):
            assert authors(again) == want
