"""What the viewer's browser tests share: one hub (module scope) on 127.0.0.1 serving a SQLite
store, one headless Chromium (Debian's ``/usr/bin/chromium``, driven by Playwright, no
download) per test module, a fresh page per test that records what it must never do (dialogs,
script errors, CSP violations), Python agents writing through ``ws://``, and screenshots
saved into ``$CRDTSTORE_ARTIFACTS/viewer`` (default ``tests/artifacts/viewer``, gitignored).

A test module takes the fixtures by importing them (``anyio_backend``, ``served``, ``browser``,
``watched``).
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
from playwright.async_api import Browser, Dialog, Page, async_playwright

from crdtstore import CollectionSpec, Record, open_store
from sync import Hub, HubLimits, TokenClaims, mint
from tests._wait import until

SECRET = b"viewer-test-secret-0123456789"
TENANT = "acme"
CHROMIUM = "/usr/bin/chromium"
DEADLINE = 10_000  # ms, for Playwright's expect
ARTIFACTS = (
    Path(os.environ.get("CRDTSTORE_ARTIFACTS", Path(__file__).parent / "artifacts")) / "viewer"
)
FAST = {"min_backoff": 0.02, "max_backoff": 0.2, "connect_timeout": 5.0}


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


@contextlib.asynccontextmanager
async def serving(store_url: str, port: int = 0, **options: Any) -> AsyncIterator[Served]:
    hub = Hub(store_url, SECRET, limits=HubLimits(close_timeout=0.5), **options)
    async with anyio.create_task_group() as tg:
        yield Served(hub, await tg.start(hub.serve, "127.0.0.1", port))
        tg.cancel_scope.cancel()
