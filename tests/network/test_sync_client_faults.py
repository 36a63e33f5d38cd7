"""The ``ws://`` store when the network fails: a drop while a record opens, and closing while
the hub is gone.

A TCP relay between the client and the hub (the idea of ``tests/network/test_sync_processes.py``'s
relay, cut deterministically) cuts the first connection right after relaying the client's
n-th chunk (1: the HTTP upgrade, then one request frame each), so the answer to that request
is lost; ``down`` refuses every later connection (the hub never comes back); ``frozen`` keeps
the connections open but relays nothing (a silent network, a stalled hub). The hub is
``tests/network/test_sync_client.py``'s (an asyncio loop in a thread), so the clients run on both
anyio backends. No sleep waits for sync: every wait is on a condition under a deadline.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import ByteStream, SocketAttribute, TaskStatus

from crdtstore import BackendError, open_store
from tests.network.test_sync_client import (
    DEADLINE,
    FAST,
    RUN,
    TENANT,
    journal,
    running_hub,
    token,
    ws_record,
)

pytestmark = pytest.mark.anyio


class CuttingRelay:
    """A TCP relay to the hub that cuts its first connection right after relaying the
    client's ``cut_at``-th chunk (never, if None), refuses new connections (accepted and
    closed at once) while ``down``, and drops every byte while ``frozen``."""

    def __init__(self, target_port: int, cut_at: int | None = None) -> None:
        self.target_port = target_port
        self.cut_at = cut_at
        self.down = False
        self.down_after_cut = False
        self.frozen = False
        self.connections = 0
        self.cuts = 0
        self.refused = 0
        self.port = 0
        self._scopes: set[anyio.CancelScope] = set()

    async def serve(self, *, task_status: TaskStatus[int]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        async with listener:
            self.port = listener.extra(SocketAttribute.local_port)
            task_status.started(self.port)
            await listener.serve(self._relay)

    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/{TENANT}"

    def cut(self) -> None:
        """Close every relayed connection now."""
        scopes, self._scopes = self._scopes, set()
        for scope in scopes:
            scope.cancel()
        self.cuts += 1
        if self.down_after_cut:
            self.down = True

    async def _relay(self, client: ByteStream) -> None:
        async with client:
            if self.down:
                self.refused += 1
                return
            try:
                upstream = await anyio.connect_tcp("127.0.0.1", self.target_port)
            except OSError:
                return
            self.connections += 1
            cut_at = self.cut_at if self.connections == 1 else None
            async with upstream, anyio.create_task_group() as tg:
                self._scopes.add(tg.cancel_scope)
                tg.start_soon(self._pump, client, upstream, tg.cancel_scope, cut_at)
                tg.start_soon(self._pump, upstream, client, tg.cancel_scope, None)
            self._scopes.discard(tg.cancel_scope)

    async def _pump(
        self, src: ByteStream, dst: ByteStream, scope: anyio.CancelScope, cut_at: int | None
    ) -> None:
        chunks = 0
        try:
            async for chunk in src:
                if self.frozen:  # a silent network: nothing arrives, nothing is closed
                    continue
                await dst.send(chunk)
                chunks += 1
                if chunks == cut_at:
                    self.cut()  # the request went through; its answer never comes back
                    return
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        scope.cancel()  # one side gone: close both


@contextlib.asynccontextmanager
async def relay_to(port: int, cut_at: int | None = None) -> AsyncIterator[CuttingRelay]:
    relay = CuttingRelay(port, cut_at)
    async with anyio.create_task_group() as tg:
        await tg.start(relay.serve)
        try:
            yield relay
        finally:
            relay.cut()
            tg.cancel_scope.cancel()


async def _seed(hub: Any) -> None:
    async with ws_record(hub, token("alice")) as rec:
        await rec.map("notes").set("a", 1)
        await rec.flush()


# -- a drop while a record opens ----------------------------------------------------------


# the request cut: 2 run.ensure, 3 whoami, 4 run.info, 5 config.get, 6 journal.snapshot,
# 7 the first journal.read (chunk 1 is the HTTP upgrade)
@pytest.mark.parametrize("cut_at", [2, 3, 4, 5, 6, 7])
async def test_opening_a_record_waits_out_a_drop(tmp_path: Path, cut_at: int) -> None:
    async with running_hub(tmp_path) as hub:
        await _seed(hub)
        async with relay_to(hub.port, cut_at) as relay:
            with anyio.fail_after(DEADLINE):
                async with (
                    open_store(relay.url(), token=token("bob"), **FAST) as store,
                    store.open_record(RUN, "x") as rec,
                ):
                    assert relay.cuts == 1, "the drop happened while the record opened"
                    assert rec.map("notes").get("a") == 1
                    await rec.map("notes").set("b", 2)
                    await rec.flush()
            assert relay.connections >= 2  # it reconnected
        rows = await journal(hub)
        assert [(r.agent, r.effect[0][3]) for r in rows] == [("alice", "a"), ("bob", "b")]


@pytest.mark.parametrize("cut_at", [2, 3, 7])
async def test_opening_gives_up_with_a_backend_error(tmp_path: Path, cut_at: int) -> None:
    bound = 1.0
    async with running_hub(tmp_path) as hub:
        await _seed(hub)
        async with relay_to(hub.port, cut_at) as relay:
            relay.down_after_cut = True  # the hub never comes back
            started = time.monotonic()
            with anyio.fail_after(DEADLINE), pytest.raises(BackendError) as failed:
                async with (
                    open_store(
                        relay.url(),
                        token=token("bob"),
                        **{**FAST, "connect_timeout": bound, "offline_timeout": bound},
                    ) as store,
                    store.open_record(RUN, "x"),
                ):
                    pass
            elapsed = time.monotonic() - started
            assert relay.cuts == 1 and relay.refused > 0  # it did try to reconnect
        assert type(failed.value) is BackendError, "never an internal exception type"
        assert failed.value.code == BackendError.code
        assert "hub" in str(failed.value)
        assert elapsed < bound + 1.0, elapsed


# -- closing while the hub is gone ----------------------------------------------------------


async def test_closing_offline_returns_within_the_timeout_and_logs_the_loss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bound = 1.0
    caplog.set_level(logging.ERROR, logger="crdtstore.record")
    async with running_hub(tmp_path) as hub, relay_to(hub.port) as relay:
        with anyio.fail_after(DEADLINE):
            async with open_store(
                relay.url(), token=token("bob"), **{**FAST, "offline_timeout": bound}
            ) as store:
                rec = await store.open_record(RUN, "x").start()
                await rec.map("notes").set("sent", 1)
                await rec.flush()
                relay.down_after_cut = True
                relay.cut()  # the hub never comes back
                await rec.map("notes").set("lost", 2)  # batched: returns at once
                started = time.monotonic()
                await rec.aclose()
                closed_after = time.monotonic() - started
    assert closed_after < bound + 1.0, closed_after
    lost = [r.getMessage() for r in caplog.records if "unjournaled writes" in r.getMessage()]
    assert lost, "the loss is logged"
    assert "not journaled: 1" in lost[0], lost  # what was lost: the one write after the cut
    rows = await journal(hub)
    assert [r.effect[0][3] for r in rows] == ["sent"]


async def test_offline_timeout_is_an_option_of_the_ws_store() -> None:
    async with open_store(
        f"ws://127.0.0.1:9/{TENANT}", token=token("bob"), offline_timeout=0.25
    ) as store:
        assert store.backend.offline_timeout == 0.25  # type: ignore[attr-defined]


async def test_closing_over_a_silent_connection_returns_within_the_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The connection stays open but nothing gets through (a half-open TCP connection, a
    stalled hub): close still returns within the bound."""
    bound = 1.0
    caplog.set_level(logging.ERROR, logger="crdtstore.record")
    async with running_hub(tmp_path) as hub, relay_to(hub.port) as relay:
        with anyio.fail_after(DEADLINE):
            async with open_store(
                relay.url(), token=token("bob"), **{**FAST, "offline_timeout": bound}
            ) as store:
                rec = await store.open_record(RUN, "x").start()
                await rec.map("notes").set("sent", 1)
                await rec.flush()
                relay.frozen = True
                relay.down = True
                await rec.map("notes").set("lost", 2)
                started = time.monotonic()
                await rec.aclose()
                closed_after = time.monotonic() - started
    assert closed_after < bound + 1.0, closed_after
    assert [r for r in caplog.records if "unjournaled writes" in r.getMessage()]
