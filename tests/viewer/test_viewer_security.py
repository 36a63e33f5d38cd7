"""The viewer's security in a real headless Chromium (see tests/_viewer_page.py): values holding
markup show as text and run nothing, a token for another run or tenant gets no data (whether
the hub refuses after the upgrade or at it), a read-write token is never used, and the index
lists only the runs the token covers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect

from tests import _viewer_page as shared
from tests._viewer_page import (
    DEADLINE,
    TENANT,
    Served,
    Watched,
    agent,
    row,
    serving,
    token,
)

pytestmark = pytest.mark.anyio

# the shared fixtures (one hub and one browser for the module, a page per test)
anyio_backend = shared.anyio_backend
served = shared.served
browser = shared.browser
watched = shared.watched

MARKUP = "<img src=x onerror=alert(1)>"


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
