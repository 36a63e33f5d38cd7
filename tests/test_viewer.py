"""The record viewer in a real headless Chromium (Debian's ``/usr/bin/chromium``, driven by
Playwright): a hub on 127.0.0.1 serves the page, Python agents write through ``ws://`` while it
is open, and the page must show what they wrote, who wrote it and where in the journal; the
leases and their queue; the record at an earlier journal position; values holding markup as
text; nothing at all for a token of another run.

One browser and one hub for the module, a fresh page per test. A screenshot of each state is
saved into ``$CRDTSTORE_ARTIFACTS/viewer`` (default ``tests/artifacts/viewer``, gitignored).
Waits are Playwright's ``expect`` (polls under a deadline) or ``until``, never a sleep.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from playwright.async_api import Browser, Dialog, Page, async_playwright, expect
from pycrdt import Doc, Map
from websockets.asyncio.client import connect

from crdtstore import CollectionSpec, Record, open_store, tree_merge
from crdtstore.flow import StepContext, run_workflow
from crdtstore.flow._state import StepEntry
from sync import (
    Awareness,
    AwarenessEntry,
    Hub,
    HubLimits,
    TokenClaims,
    Update,
    encode,
    encode_awareness_update,
    mint,
)
from tests._wait import elapsed, until

pytestmark = pytest.mark.anyio

SECRET = b"viewer-test-secret-0123456789"
TENANT = "acme"
CHROMIUM = "/usr/bin/chromium"
DEADLINE = 10_000  # ms, for Playwright's expect
ARTIFACTS = (
    Path(os.environ.get("CRDTSTORE_ARTIFACTS", Path(__file__).parent / "artifacts")) / "viewer"
)
FAST = {"min_backoff": 0.02, "max_backoff": 0.2, "connect_timeout": 5.0}
MARKUP = "<img src=x onerror=alert(1)>"


def token(agent: str, run: str, *, mode: str = "ro", tenant: str = TENANT) -> str:
    claims = TokenClaims(
        tenant=tenant,
        run=run,
        agent=agent,
        mode=mode,
        exp=int(time.time() + 3600),  # type: ignore[arg-type]
    )
    return mint(SECRET, claims)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # the hub runs on websockets' asyncio implementation; so does Playwright


@dataclass
class Served:
    hub: Hub
    port: int

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/{TENANT}"

    def page_url(self, run: str, tok: str, tenant: str = TENANT) -> str:
        return f"http://127.0.0.1:{self.port}/-/view/{tenant}/{run}#token={tok}"


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    path = tmp_path_factory.mktemp("viewer") / "store.db"
    hub = Hub(f"sqlite:///{path}", SECRET, limits=HubLimits(close_timeout=0.5))
    async with anyio.create_task_group() as tg:
        port = await tg.start(hub.serve, "127.0.0.1", 0)
        yield Served(hub, port)
        tg.cancel_scope.cancel()


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install chromium"
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield launched
        finally:
            await launched.close()


@dataclass
class Watched:
    """A page and what it did that it must not: dialogs, script errors, CSP violations."""

    page: Page
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sockets: list[str] = field(default_factory=list)

    async def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        out = ARTIFACTS / f"{name}.png"
        await self.page.screenshot(path=str(out), full_page=True)
        return out


@pytest.fixture
async def watched(browser: Browser) -> AsyncIterator[Watched]:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    w = Watched(page)

    async def dismiss(dialog: Dialog) -> None:
        w.dialogs.append(dialog.message)
        await dialog.dismiss()

    page.on("dialog", dismiss)
    page.on("pageerror", lambda exc: w.errors.append(str(exc)))
    page.on(
        "console",
        lambda msg: w.errors.append(msg.text) if msg.type == "error" else None,
    )
    page.on("websocket", lambda ws: w.sockets.append(ws.url))
    try:
        yield w
    finally:
        await context.close()


@contextlib.asynccontextmanager
async def agent(
    served: Served, name: str, run: str, schema: dict[str, CollectionSpec] | None = None
) -> AsyncIterator[Record]:
    async with (
        open_store(served.ws, token=token(name, run, mode="rw"), **FAST) as store,
        store.open_record(run, name, schema=schema) as rec,
    ):
        yield rec


def row(page: Page, collection: str, key: str) -> Any:
    return page.locator(f'tr[data-collection="{collection}"][data-key="{key}"]')


async def seq_of(rec: Record, collection: str, key: str) -> int:
    await rec.flush()
    prov = await until(lambda: rec.provenance(collection, key), f"provenance of {key}")
    assert prov.seq is not None
    return int(prov.seq)


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


async def test_markup_in_values_shows_as_text_and_runs_nothing(
    served: Served, watched: Watched
) -> None:
    run = "markup"
    page = watched.page
    script = "<script>window.pwned = 1</script>"
    async with agent(served, "alice", run) as alice:
        await alice.map("notes").set("img", MARKUP)
        await alice.map("notes").set(MARKUP, script)
        await alice.list("log").append(MARKUP)
        await alice.text("draft").insert(0, f"{MARKUP} {script}")
        await alice.flush()
        await page.goto(served.page_url(run, token("viewer", run)))
        await expect(row(page, "notes", "img").locator(".value")).to_have_text(MARKUP)
        await expect(row(page, "notes", MARKUP).locator(".key")).to_have_text(MARKUP)
        await expect(row(page, "notes", MARKUP).locator(".value")).to_have_text(script)
        await expect(page.locator('pre.text[data-collection="draft"]')).to_have_text(
            f"{MARKUP} {script}"
        )
        await page.locator("#scrubber").fill("1")  # the past is built the same way
        await expect(page.locator("#entry")).to_contain_text("#1")
        await page.locator("#live").click()
        await expect(page.locator('tr[data-collection="log"] .value')).to_have_text(MARKUP)
        await watched.shot("5-markup-as-text")
    assert await page.locator("img").count() == 0
    assert await page.locator("#collections script").count() == 0
    assert await page.evaluate("window.pwned") is None
    assert watched.dialogs == [], watched.dialogs
    assert watched.errors == [], watched.errors


async def test_a_token_for_another_run_gets_no_data(served: Served, watched: Watched) -> None:
    run = "secret"
    page = watched.page
    async with agent(served, "alice", run) as alice:
        await alice.map("notes").set("password", "hunter2")
        await alice.flush()
        received: list[Any] = []
        page.on("websocket", lambda ws: ws.on("framereceived", lambda f: received.append(f)))
        await page.goto(served.page_url(run, token("viewer", "another-run")))
        await expect(page.locator("#error")).to_contain_text("FORBIDDEN", timeout=DEADLINE)
        await expect(page.locator("#run")).to_be_hidden()
        await watched.shot("6-refused-other-run")
        assert received == [], "the hub sent frames to a refused connection"
        assert "hunter2" not in await page.content()
        assert await page.evaluate("window.crdtstoreViewer.journal.head") == 0
        # a read-write token is never used: no connection is even opened
        watched.sockets.clear()
        await page.goto("about:blank")
        await page.goto(served.page_url(run, token("alice", run, mode="rw")))
        await expect(page.locator("#error")).to_contain_text("read-write")
        assert watched.sockets == []
        assert await page.evaluate("sessionStorage.length") == 0
        # a run that does not exist: said so (a read-only token cannot create it)
        await page.goto("about:blank")
        await page.goto(served.page_url("nowhere", token("viewer", "nowhere")))
        await expect(page.locator("#error")).to_contain_text("There is no run nowhere")
        # another tenant's token: refused too
        await page.goto("about:blank")
        await page.goto(served.page_url(run, token("viewer", run, tenant="other")))
        await expect(page.locator("#error")).to_contain_text("FORBIDDEN", timeout=DEADLINE)
        assert "hunter2" not in await page.content()
    assert watched.dialogs == []


async def test_the_index_lists_only_the_runs_the_token_may_see(
    served: Served, watched: Watched
) -> None:
    page = watched.page
    for run in ("team-a", "team-b", "private"):
        async with agent(served, "alice", run) as rec:
            await rec.map("notes").set("x", run)
            await rec.flush()
    await page.goto(
        f"http://127.0.0.1:{served.port}/-/view/{TENANT}/#token={token('viewer', 'team-*')}"
    )
    await expect(page.locator("#runs tr[data-run]")).to_have_count(2, timeout=DEADLINE)
    await expect(page.locator("#runs")).not_to_contain_text("private")
    await watched.shot("7-index")
    await page.locator('#runs tr[data-run="team-b"] a').click()
    await expect(row(page, "notes", "x").locator(".value")).to_have_text("team-b")
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


@contextlib.asynccontextmanager
async def serving(store_url: str, port: int = 0, **options: Any) -> AsyncIterator[Served]:
    hub = Hub(store_url, SECRET, limits=HubLimits(close_timeout=0.5), **options)
    async with anyio.create_task_group() as tg:
        yield Served(hub, await tg.start(hub.serve, "127.0.0.1", port))
        tg.cancel_scope.cancel()


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


async def test_a_hub_refusing_at_the_upgrade_is_asked_why(tmp_path: Path, watched: Watched) -> None:
    page = watched.page
    run = "http-refusals"
    async with serving(f"sqlite:///{tmp_path / 's.db'}", refuse_with="http") as hub:
        async with agent(hub, "alice", run) as alice:
            await alice.map("notes").set("password", "hunter2")
            await alice.flush()
        for tok, said in (
            (token("viewer", "another-run"), "FORBIDDEN"),
            (token("viewer", "team-*"), "FORBIDDEN"),
            (token("viewer", "http-*", tenant="other"), "FORBIDDEN"),
            (token("viewer", "nowhere"), "There is no run"),
        ):
            await page.goto("about:blank")
            run_shown = "nowhere" if said.startswith("There") else run
            await page.goto(hub.page_url(run_shown, tok))
            await expect(page.locator("#error")).to_contain_text(said, timeout=DEADLINE)
            assert "hunter2" not in await page.content()
        await page.goto("about:blank")
        await page.goto(hub.page_url(run, token("viewer", "http-*")))  # a prefix covering it
        await expect(row(page, "notes", "password").locator(".value")).to_have_text("hunter2")
    assert watched.dialogs == []
