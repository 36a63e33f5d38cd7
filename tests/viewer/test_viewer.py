"""The record viewer in a real headless Chromium (see tests/_viewer_page.py): a hub on
127.0.0.1 serves the page, Python agents write through ``ws://`` while it is open, and the page
must show what they wrote, who wrote it and where in the journal (maps, lists, texts by author,
keep_all siblings, a real workflow's steps), the leases and their queue, the record at an
earlier journal position, and follow the run across a compaction and a hub restart.

Waits are Playwright's ``expect`` (polls under a deadline) or ``until``, never a sleep.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from playwright.async_api import expect
from pycrdt import Doc, Map
from websockets.asyncio.client import connect

from crdtstore import CollectionSpec, open_store, tree_merge
from crdtstore.flow import StepContext, run_workflow
from crdtstore.flow._state import StepEntry
from sync import Awareness, AwarenessEntry, Update, encode, encode_awareness_update
from tests import _viewer_page as shared
from tests._viewer_page import (
    DEADLINE,
    FAST,
    TENANT,
    Served,
    Watched,
    agent,
    row,
    seq_of,
    serving,
    token,
)
from tests._wait import elapsed, until

pytestmark = pytest.mark.anyio

# the shared fixtures (one hub and one browser for the module, a page per test)
anyio_backend = shared.anyio_backend
served = shared.served
browser = shared.browser
watched = shared.watched


async def test_a_write_shows_its_value_agent_and_journal_position(
    served: Served, watched: Watched
) -> None:
    run = "live"
    page = watched.page
    async with agent(served, "alice", run) as alice:
        await alice.map("notes").set("status", "drafting")
        await alice.flush()
        await page.goto(served.page_url(run, token("viewer", run)))
        await expect(row(page, "notes", "status").locator(".value")).to_have_text("drafting")
        # the page is open; a write now must appear, with its agent and position
        await alice.map("notes").set("plan", {"steps": 3, "owner": "alice"})
        took = await elapsed(
            lambda: row(page, "notes", "plan").locator(".seq").count(), "the write to show"
        )
        seq = await seq_of(alice, "notes", "plan")
        plan = row(page, "notes", "plan")
        await expect(plan.locator(".value")).to_have_text('{"owner":"alice","steps":3}')
        await expect(plan.locator(".who")).to_have_text("alice")
        await expect(plan.locator(".seq")).to_have_text(f"#{seq}", timeout=DEADLINE)
        print(f"a write showed in the page after {took:.3f} s")
        assert took < 1.0, f"the write took {took:.2f} s to show"
        async with agent(served, "bob", run) as bob:
            await bob.list("log").append("bob joined")
            await bob.text("draft").insert(0, "Hello from bob. ")
            await bob.flush()
            await until(lambda: alice.text("draft").read() != "", "bob's text at alice")
            await alice.text("draft").insert(len(alice.text("draft").read()), "And alice.")
            await alice.flush()
            spans = page.locator('pre.text[data-collection="draft"] span')
            await expect(spans).to_have_count(2, timeout=DEADLINE)
            await expect(spans.nth(0)).to_have_attribute("data-agent", "bob")
            await expect(spans.nth(1)).to_have_attribute("data-agent", "alice")
            log = page.locator('tr[data-collection="log"][data-index="0"]')
            await expect(log.locator(".who")).to_have_text("bob")
            await expect(page.locator("#presence")).to_contain_text("bob", timeout=DEADLINE)
            # a Yjs client's awareness state (presence) shows too, and goes when it leaves
            editor = f"{served.ws}/{run}?token={token('carol', run, mode='rw')}"
            async with connect(editor) as carol:
                state = '{"user":{"name":"carol (editor)"}}'
                entry = AwarenessEntry(client_id=4242, clock=1, state=state)
                await carol.send(encode(Awareness(encode_awareness_update([entry]))))
                await expect(page.locator("#presence")).to_contain_text("carol (editor)")
                await watched.shot("1-live")
    assert watched.dialogs == [] and watched.errors == [], watched.errors


async def test_conflicts_and_kernel_steps(served: Served, watched: Watched) -> None:
    run = "steps"
    page = watched.page
    schema = {"facts": CollectionSpec(kind="map", conflict="keep_all")}
    async with agent(served, "alice", run, schema) as alice:
        # a concurrent write made elsewhere (never saw alice's), then delivered to the run
        async with (
            open_store("memory://") as elsewhere,
            elsewhere.open_record(run=run, agent="bob", source="tool", schema=schema) as bob,
        ):
            await alice.map("facts").set("capital", "Sydney")
            await bob.map("facts").set("capital", "Canberra")
            await bob.flush()
            updates = [e.update for e in await elsewhere.journal(run, limit=1000)]
            await alice.apply_update(tree_merge(updates))
        flow = alice.map("flow")
        now = time.time()
        for entry in (
            StepEntry(
                path="plan",
                kind="agent",
                state="done",
                attempt=1,
                run=run,
                agent="planner",
                started=now - 5,
                ended=now - 3,
            ),
            StepEntry(
                path="build",
                kind="script",
                state="running",
                attempt=2,
                run=run,
                files=["src/a.py"],
                started=now - 2,
                index=1,
            ),
            StepEntry(
                path="build/lint",
                parent="build",
                kind="script",
                state="failed",
                attempt=1,
                run=run,
                error={"code": "SCRIPT_FAILED", "message": "exit 1"},
            ),
        ):
            await flow.set(entry.path, entry.model_dump(mode="json"))
        await alice.flush()
        await page.goto(served.page_url(run, token("viewer", run)))
        conflict = row(page, "facts", "capital")
        await expect(conflict.locator(".sibling")).to_have_count(2, timeout=DEADLINE)
        await expect(conflict).to_contain_text("Sydney")
        await expect(conflict).to_contain_text("Canberra")
        await expect(conflict.locator('.sibling[data-agent="bob"]')).to_contain_text("Canberra")
        steps = page.locator("#steps")
        await expect(steps.locator('tr[data-step="build"]')).to_contain_text("running")
        await expect(steps.locator('tr[data-step="build/lint"]')).to_contain_text("SCRIPT_FAILED")
        await watched.shot("2-conflict-and-steps")
    assert watched.dialogs == [] and watched.errors == []


async def test_a_lease_shows_its_holder_and_a_waiter_in_the_queue(
    served: Served, watched: Watched
) -> None:
    run = "leases"
    page = watched.page
    async with (
        open_store(served.ws, token=token("alice", run, mode="rw"), **FAST) as a_store,
        open_store(served.ws, token=token("bob", run, mode="rw"), **FAST) as b_store,
        a_store.open_record(run, "alice"),  # (creates the run: a read-only token cannot)
        b_store.open_record(run, "bob"),  # (leases travel on a record's connection)
        anyio.create_task_group() as tg,
    ):
        await page.goto(served.page_url(run, token("viewer", run)))
        await expect(page.locator("#leases")).to_contain_text("no leases", timeout=DEADLINE)
        held = await a_store.leases.lease(["src/viewer.py"], ttl=30).acquire()
        waiting = b_store.leases.lease(["src/viewer.py"], ttl=30)
        tg.start_soon(waiting.acquire)
        res = page.locator('tr[data-resource="src/viewer.py"]')
        await expect(res.locator(".holder")).to_contain_text("alice", timeout=DEADLINE)
        await expect(res.locator(".holder")).to_contain_text(f"token {held.token}")
        await expect(res.locator('.queue li[data-owner="bob"]')).to_have_count(1)
        await watched.shot("3-leases")
        await held.release()
        await expect(res.locator(".holder")).to_contain_text("bob", timeout=DEADLINE)
        await expect(res.locator(".queue li")).to_have_count(0)
        await until(lambda: waiting.granted, "bob's grant")
        await waiting.release()
        tg.cancel_scope.cancel()
    assert watched.dialogs == [] and watched.errors == []


async def test_the_scrubber_shows_the_record_at_an_earlier_position(
    served: Served, watched: Watched
) -> None:
    run = "scrub"
    page = watched.page
    async with agent(served, "alice", run) as alice:
        notes = alice.map("notes")
        await notes.set("verdict", "first draft")
        first = await seq_of(alice, "notes", "verdict")
        await notes.set("verdict", "second draft")
        await alice.list("log").append("rewrote it")
        await notes.set("verdict", "final")
        last = await seq_of(alice, "notes", "verdict")
        await page.goto(served.page_url(run, token("viewer", run)))
        verdict = row(page, "notes", "verdict")
        await expect(verdict.locator(".value")).to_have_text("final", timeout=DEADLINE)
        await expect(page.locator("body")).to_have_attribute("data-head", str(last))
        await page.locator("#scrubber").fill(str(first))
        await expect(page.locator("body")).to_have_attribute("data-mode", "past")
        await expect(verdict.locator(".value")).to_have_text("first draft")
        await expect(verdict.locator(".seq")).to_have_text(f"#{first}")
        await expect(page.locator('tr[data-collection="log"]')).to_have_count(0)
        await expect(page.locator("#entry")).to_contain_text(f"#{first}")
        await expect(page.locator("#entry")).to_contain_text("first draft")
        await watched.shot("4-scrubbed-back")
        await page.locator("#scrubber").fill(str(last))
        await expect(page.locator("body")).to_have_attribute("data-mode", "live")
        await expect(verdict.locator(".value")).to_have_text("final")
        await expect(page.locator('tr[data-collection="log"]')).to_have_count(1)
        # back in the past, then "back to live"
        await page.locator("#scrubber").fill(str(first))
        await expect(verdict.locator(".value")).to_have_text("first draft")
        await page.locator("#live").click()
        await expect(verdict.locator(".value")).to_have_text("final")
    assert watched.dialogs == [] and watched.errors == []


async def test_a_compacted_journal_starts_at_its_snapshot(served: Served, watched: Watched) -> None:
    run = "compacted"
    page = watched.page
    async with agent(served, "alice", run) as alice:
        for i in range(3):
            await alice.map("notes").set("n", i)
        await alice.flush()
        async with open_store(served.hub.store_url, tenant=TENANT) as store:
            result = await store.compact(run, drop_journal=True)
        await alice.map("notes").set("after", "compaction")
        seq = await seq_of(alice, "notes", "after")
        await page.goto(served.page_url(run, token("viewer", run)))
        await expect(row(page, "notes", "after").locator(".seq")).to_have_text(f"#{seq}")
        await expect(row(page, "notes", "n").locator(".value")).to_have_text("2")
        await expect(row(page, "notes", "n").locator(".who")).to_have_text("snapshot")
        assert await page.locator("#scrubber").get_attribute("min") == str(result.seq)
        await page.locator("#scrubber").fill(str(result.seq))
        await expect(row(page, "notes", "n").locator(".value")).to_have_text("2")
        await expect(row(page, "notes", "after")).to_have_count(0)
        await watched.shot("8-compacted")
    assert watched.dialogs == [] and watched.errors == []


async def test_the_page_follows_the_run_across_a_hub_restart(
    tmp_path: Path, watched: Watched
) -> None:
    page = watched.page
    run = "restart"
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    async with serving(store_url) as first:
        async with agent(first, "alice", run) as alice:
            await alice.map("notes").set("before", "restart")
            await alice.flush()
        await page.goto(first.page_url(run, token("viewer", run)))
        await expect(row(page, "notes", "before").locator(".seq")).to_have_text("#1")
    await expect(page.locator("#status-journal")).to_have_attribute("data-status", "disconnected")
    async with serving(store_url, first.port) as second, agent(second, "bob", run) as bob:
        await bob.map("notes").set("after", "restart")
        seq = await seq_of(bob, "notes", "after")
        after = row(page, "notes", "after")
        await expect(after.locator(".seq")).to_have_text(f"#{seq}", timeout=DEADLINE)
        await expect(after.locator(".who")).to_have_text("bob")
        await expect(row(page, "notes", "before").locator(".who")).to_have_text("alice")
    assert watched.dialogs == []


async def test_the_scrubber_over_a_longer_journal(served: Served, watched: Watched) -> None:
    run = "long"
    page = watched.page
    entries = 1100  # past two of the page's saved states (one every 500 positions)
    async with open_store(served.hub.store_url, tenant=TENANT) as store:
        async with store.open_record(run, "writer") as rec:
            for i in range(entries):
                await rec.map("counter").set("n", i)
            await rec.flush()
    await page.goto(served.page_url(run, token("viewer", run)))
    n = row(page, "counter", "n")
    await expect(n.locator(".seq")).to_have_text(f"#{entries}", timeout=DEADLINE)
    for at in (1050, 10, 777, 501, 500, 499, 1099):
        took = time.monotonic()
        await page.locator("#scrubber").fill(str(at))
        await expect(n.locator(".value")).to_have_text(str(at - 1))
        await expect(n.locator(".seq")).to_have_text(f"#{at}")
        took = time.monotonic() - took
        assert took < 2.0, f"position {at} took {took:.2f} s"
    assert watched.dialogs == [] and watched.errors == []


async def test_a_real_workflow_shows_its_steps_and_the_lease_a_step_waits_for(
    served: Served, watched: Watched
) -> None:
    run = "workflow"
    page = watched.page
    gate = anyio.Event()

    async def slow(ctx: StepContext) -> str:
        await gate.wait()
        return "linted"

    async def quick(ctx: StepContext) -> str:
        await ctx.map("out").set(ctx.step, "written")
        return "ok"

    spec = {
        "name": "checks",
        "steps": [
            {"id": "plan", "kind": "python", "call": quick},
            {
                "id": "verify",
                "kind": "parallel",
                "branches": [
                    {"id": "lint", "kind": "python", "call": slow},
                    {"id": "edit", "kind": "python", "call": quick, "owned_files": ["src/w.py"]},
                ],
            },
        ],
    }
    async with (
        open_store(served.hub.store_url, tenant=TENANT) as store,
        anyio.create_task_group() as tg,
    ):
        blocker = await store.leases.lease(["src/w.py"], owner="alice", ttl=30).acquire()
        done = anyio.Event()

        async def kernel() -> None:
            await run_workflow(store, spec, run=run)
            done.set()

        tg.start_soon(kernel)

        async def started() -> bool:
            return any(r.run == run for r in await store.runs())

        await until(started, "the workflow's run")
        await page.goto(served.page_url(run, token("viewer", run)))
        steps = page.locator("#steps")
        await expect(steps.locator('tr[data-step="plan"]')).to_contain_text("done")
        await expect(steps.locator('tr[data-step="verify/lint"]')).to_contain_text("running")
        edit = steps.locator('tr[data-step="verify/edit"]')
        await expect(edit).to_contain_text("waiting_on_lock")
        await expect(edit).to_contain_text("alice")  # who is ahead of it
        lease = page.locator('tr[data-resource="src/w.py"]')
        await expect(lease.locator(".holder")).to_contain_text("alice")
        await expect(lease.locator(".queue li")).to_contain_text(f"flow:{run}")
        await watched.shot("9-workflow-waiting")
        await blocker.release()
        gate.set()
        with anyio.fail_after(DEADLINE / 1000):
            await done.wait()
        await expect(steps.locator('tr[data-step="verify/edit"]')).to_contain_text("done")
        await expect(page.locator(".run-line")).to_contain_text("done")
        await expect(row(page, "out", "verify/edit").locator(".value")).to_have_text("written")
        await watched.shot("10-workflow-done")
    assert watched.dialogs == [] and watched.errors == []


async def test_a_shared_type_nested_by_a_plain_yjs_client_shows_as_json(
    served: Served, watched: Watched
) -> None:
    run = "plain-yjs"
    page = watched.page
    async with agent(served, "alice", run) as alice:
        await alice.map("notes").set("plain", "value")
        await alice.flush()
        await page.goto(served.page_url(run, token("viewer", run)))
        await expect(row(page, "notes", "plain").locator(".value")).to_have_text("value")
        # a Yjs client (pycrdt over a raw WebSocket) nests a shared type (not binary: the
        # hub's group commit fails on a bytes value's effect, which is not JSON)
        doc: Doc[Any] = Doc()
        notes = doc.get("notes", type=Map)
        with doc.transaction():
            notes["nested"] = Map({"b": 2, "a": 1})
        editor = f"{served.ws}/{run}?token={token('carol', run, mode='rw')}"
        async with connect(editor) as carol:
            await carol.send(encode(Update(doc.get_update())))
            await expect(row(page, "notes", "nested").locator(".value")).to_have_text(
                '{"a":1,"b":2}', timeout=DEADLINE
            )
            await expect(row(page, "notes", "nested").locator(".who")).to_have_text("carol")
    assert watched.dialogs == [] and watched.errors == []
