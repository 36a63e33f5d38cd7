"""The hub's ``/-/metrics`` and ``/-/health`` (sync._metrics) and its JSON log lines
(sync._logs), over real sockets: the counters scraped during and after a load of real
WebSocket clients agree with what the test sent and what the hub refused; health is 503
while the store (a real redis-server) is down; a missing or wrong operator token is refused;
``crdtstore serve --log-format json --metrics-address`` as a real process.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from crdtstore import InvalidValue, open_store
from sync import CloseCode, Hub, HubLimits
from tests._redis import RedisServer
from tests._wait import until
from tests.network.test_sync_hub import DEADLINE, RUN, SECRET, TENANT, Peer, peer_at, refused, token

pytestmark = pytest.mark.anyio

OPERATOR = "operator-token-0123456789"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the hub runs on websockets' asyncio implementation


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=DEADLINE) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    return await anyio.to_thread.run_sync(_get, url, headers)


def samples(text: str) -> dict[str, float]:
    """The samples of a scrape: ``name{label="v",...}`` (labels sorted) -> value."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


class Running:
    def __init__(self, hub: Hub, port: int) -> None:
        self.hub = hub
        self.port = port
        self.http = f"http://127.0.0.1:{port}"
        self.ws = f"ws://127.0.0.1:{port}"

    def url(self, tok: str, run: str = RUN) -> str:
        return f"{self.ws}/{TENANT}/{run}?token={tok}"

    async def scrape(self) -> dict[str, float]:
        status, body = await get(f"{self.http}/-/metrics?token={OPERATOR}")
        assert status == 200, body
        return samples(body)


@contextlib.asynccontextmanager
async def running(store_url: str, **limits: Any) -> AsyncIterator[Running]:
    hub = Hub(store_url, SECRET, limits=HubLimits(**limits), operator_token=OPERATOR)
    async with anyio.create_task_group() as tg:
        port = await tg.start(hub.serve, "127.0.0.1", 0)
        yield Running(hub, port)
        tg.cancel_scope.cancel()


WRITERS = 4
UPDATES = 25


async def test_the_counters_agree_with_a_load_of_real_clients(tmp_path: Path) -> None:
    async with running(f"sqlite:///{tmp_path}/s.db") as h:
        peers = [Peer() for _ in range(WRITERS)]
        mid: dict[str, float] = {}
        async with contextlib.AsyncExitStack() as stack:
            for i, peer in enumerate(peers):
                await stack.enter_async_context(peer_at(h.url(token(f"w{i}")), peer))
            with anyio.fail_after(DEADLINE):
                await h.hub.wait_until(lambda hub: hub.loaded_runs() == {(TENANT, RUN): WRITERS})

            async def write(i: int, peer: Peer) -> None:
                for n in range(UPDATES):
                    await peer.set(f"w{i}-{n}", n)

            async with anyio.create_task_group() as tg:
                for i, peer in enumerate(peers):
                    tg.start_soon(write, i, peer)
                mid = await h.scrape()  # during the load
            for peer in peers:
                await peer.flush()
                await peer.wait(lambda p=peer: len(p.notes()) == WRITERS * UPDATES)
            during = await h.scrape()
            assert during["crdtstore_hub_connections_open"] == WRITERS
            assert during["crdtstore_hub_runs_loaded"] == 1
            assert during["crdtstore_hub_tenants_loaded"] == 1
        with anyio.fail_after(DEADLINE):
            await h.hub.wait_until(lambda hub: not hub.loaded_runs())

        # refusals: two bad tokens, a malformed frame, a bad path; a read-only write
        assert (await refused(h.url("not-a-token")))[0] == CloseCode.UNAUTHORIZED
        assert (await refused(h.url(token("x", secret=b"another-secret-0123456789"))))[0] == (
            CloseCode.UNAUTHORIZED
        )
        async with connect(h.url(token("mallory"))) as bad:
            await bad.send(b"\x07\x07\x07")
            with anyio.fail_after(DEADLINE), contextlib.suppress(ConnectionClosed):
                async for _ in bad:
                    pass
            assert bad.close_code == CloseCode.MALFORMED
        with pytest.raises(InvalidStatus):
            async with connect(f"{h.ws}/only-a-tenant"):
                pass
        reader = Peer()
        reader.read_only = True
        async with peer_at(h.url(token("reader", mode="ro")), reader):
            for n in range(3):
                await reader.set(f"ro{n}", n)
            response = await reader.request("whoami")  # frames are handled in order
            assert response.ok

        final = await h.scrape()
        sent = WRITERS * UPDATES
        assert final["crdtstore_hub_connections_total"] == WRITERS + 2  # + mallory, reader
        assert final["crdtstore_hub_updates_received_total"] == sent
        assert final["crdtstore_hub_updates_broadcast_total"] == sent
        assert final["crdtstore_hub_updates_delivered_total"] == sent * (WRITERS - 1)
        assert final["crdtstore_hub_writes_denied_total"] == 3
        assert final['crdtstore_hub_refusals_total{code="4401"}'] == 2
        assert final['crdtstore_hub_refusals_total{code="4400"}'] == 1
        assert final['crdtstore_hub_refusals_total{code="404"}'] == 1
        assert sum(v for k, v in final.items() if k.startswith("crdtstore_hub_refusals")) == 4
        async with open_store(f"sqlite:///{tmp_path}/s.db", tenant=TENANT) as store:
            journaled = await store.journal(RUN, limit=10_000)
        assert len(journaled) == sent
        assert final["crdtstore_hub_journal_entries_total"] == sent
        commits = final["crdtstore_hub_journal_commits_total"]
        assert 1 <= commits <= sent
        count = "crdtstore_hub_journal_commit_seconds_count"
        histogram = sum(v for k, v in final.items() if k.startswith(count))
        assert histogram == commits
        assert final["crdtstore_hub_connections_open"] == 0
        assert final["crdtstore_hub_runs_loaded"] == 0
        # the scrape during the load saw a part of it, never more
        for name in (
            "crdtstore_hub_updates_received_total",
            "crdtstore_hub_updates_broadcast_total",
            "crdtstore_hub_connections_total",
        ):
            assert 0 <= mid[name] <= final[name]
        assert mid["crdtstore_hub_connections_total"] == WRITERS


async def test_a_missing_or_wrong_operator_token_is_refused(tmp_path: Path) -> None:
    async with running(f"sqlite:///{tmp_path}/s.db") as h:
        for path, headers in [
            ("/-/metrics", {}),
            ("/-/metrics?token=wrong-token-0123456789", {}),
            ("/-/health", {"Authorization": "Bearer wrong-token-0123456789"}),
            ("/-/health", {"Authorization": f"Basic {OPERATOR}"}),
            (f"/-/metrics?token={token('alice')}", {}),  # an agent's token is not an operator's
        ]:
            status, body = await get(h.http + path, headers)
            assert status == 401, (path, headers)
            assert "OPERATOR_TOKEN" in body and "crdtstore_hub" not in body
        status, body = await get(f"{h.http}/-/metrics", {"Authorization": f"Bearer {OPERATOR}"})
        assert status == 200 and "crdtstore_hub_updates_received_total 0.0" in body
        assert await get(f"{h.http}/-/health?token={OPERATOR}") == (200, "ok\n")
        assert (await h.scrape())['crdtstore_hub_refusals_total{code="401"}'] == 5
    # no operator token configured: nothing served on the hub's port
    hub = Hub(f"sqlite:///{tmp_path}/s.db", SECRET)
    async with anyio.create_task_group() as tg:
        port = await tg.start(hub.serve, "127.0.0.1", 0)
        assert (await get(f"http://127.0.0.1:{port}/-/metrics?token={OPERATOR}"))[0] == 404
        tg.cancel_scope.cancel()
    with pytest.raises(InvalidValue):
        Hub(f"sqlite:///{tmp_path}/s.db", SECRET, operator_token="short")


async def test_health_is_503_while_the_store_does_not_answer(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        async with running(server.url()) as h:
            h.hub.metrics.health_timeout = 1.0
            health = f"{h.http}/-/health?token={OPERATOR}"
            assert await get(health) == (200, "ok\n")
            async with peer_at(h.url(token("alice")), Peer()) as alice:
                await alice.set("k", 1)
                await alice.flush()
                assert await get(health) == (200, "ok\n")  # (through the open store)
                server.stop()
                status, body = await get(health)
                assert status == 503 and body.startswith("unavailable: the store"), body
                server.start()

                async def healthy() -> bool:
                    return await get(health) == (200, "ok\n")

                await until(healthy, "health to be 200 again", DEADLINE)
    finally:
        server.stop()


async def test_lease_and_slow_consumer_counters(tmp_path: Path) -> None:
    async with running(
        f"sqlite:///{tmp_path}/s.db", max_queue_frames=8, max_queue_bytes=256 * 1024
    ) as h:
        async with peer_at(h.url(token("alice")), Peer()) as alice:
            async with peer_at(h.url(token("bob")), Peer()) as bob:

                async def call(peer: Peer, op: str, **params: Any) -> Any:
                    assert peer.ws is not None
                    request, frame = peer.session.request(op, params)
                    await peer.ws.send(frame)
                    await peer.wait(lambda: request.id in peer.responses)
                    response = peer.responses[request.id]
                    assert response.ok, response
                    return response.result

                a = await call(alice, "lease.request", resources=["src/a.py"], ttl=0.3)
                assert a["state"] == "granted"
                await call(alice, "lease.heartbeat", lease_id=a["lease_id"])  # the same grant
                b = await call(bob, "lease.request", resources=["src/a.py"], ttl=30)
                assert b["state"] == "waiting_on_lock"
                await call(bob, "lease.heartbeat", lease_id=b["lease_id"])  # still the same wait

                async def bob_granted() -> Any:
                    state = await call(bob, "lease.heartbeat", lease_id=b["lease_id"])
                    return state if state["state"] == "granted" else None

                # alice stops heartbeating: her grant lapses after its TTL, bob's is next
                b = await until(bob_granted, "bob's grant", DEADLINE)
                c = await call(alice, "lease.request", resources=["src/c.py"], ttl=0.05)
                assert c["state"] == "granted"
                reaped = 0
                with anyio.fail_after(DEADLINE):
                    while reaped == 0:
                        reaped = (await call(alice, "lease.reap"))["reaped"]
                await call(bob, "lease.release", lease_id=b["lease_id"], token=b["token"])
                got = await h.scrape()
                assert got["crdtstore_hub_lease_grants_total"] == 3  # a, b (after a), c
                assert got["crdtstore_hub_lease_waits_total"] == 1
                assert got["crdtstore_hub_lease_reaps_total"] == reaped

            # a slow consumer (never reads): its queue overflows, it is disconnected
            async with connect(h.url(token("slow")), max_queue=1) as slow:
                with anyio.fail_after(DEADLINE):
                    await h.hub.wait_until(lambda hub: hub.loaded_runs().get((TENANT, RUN)) == 2)
                    i = 0
                    while h.hub.loaded_runs().get((TENANT, RUN)) == 2:
                        await alice.set(f"big{i}", "x" * 200_000)
                        await alice.request("whoami")
                        i += 1
                with anyio.fail_after(DEADLINE), contextlib.suppress(ConnectionClosed):
                    async for _ in slow:
                        pass
                assert slow.close_code == CloseCode.SLOW_CONSUMER
            got = await h.scrape()
            assert got["crdtstore_hub_send_queue_overflows_total"] == 1
            assert got["crdtstore_hub_send_queue_dropped_frames_total"] >= 1
            assert got['crdtstore_hub_refusals_total{code="4408"}'] == 1


async def test_serve_logs_json_and_serves_metrics_on_a_separate_address(tmp_path: Path) -> None:
    env = {**os.environ, "CRDTSTORE_SECRET": SECRET.decode()}
    args = ["--store", f"sqlite:///{tmp_path}/s.db", "--port", "0", "--log-format", "json"]
    proc = subprocess.Popen(  # noqa: ASYNC220 (started once; its stderr is read by a thread)
        [sys.executable, "-m", "sync", *args, "--metrics-address", "127.0.0.1:0"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:

        def said(prefix: str) -> str | None:
            return next((ln.split()[-1] for ln in lines if ln.startswith(prefix)), None)

        await until(lambda: said("crdtstore hub listening"), "the hub to listen", DEADLINE)
        await until(lambda: said("crdtstore hub metrics"), "the metrics address", DEADLINE)
        ws_url, metrics_url = said("crdtstore hub listening"), said("crdtstore hub metrics")
        assert ws_url is not None and metrics_url is not None

        async with peer_at(f"{ws_url}/{TENANT}/{RUN}?token={token('alice')}", Peer()) as p:
            await p.set("k", 1)
            await p.flush()
        status, body = await get(metrics_url)  # no token: the address is the access control
        assert status == 200
        assert samples(body)["crdtstore_hub_updates_received_total"] == 1
        assert await get(metrics_url.replace("/-/metrics", "/-/health")) == (200, "ok\n")
        assert (await get(metrics_url.replace("/-/metrics", f"/{TENANT}/{RUN}")))[0] == 404

        def connected() -> dict[str, Any] | None:
            for line in list(lines):
                if line.startswith("{"):
                    record = json.loads(line)
                    if "connected" in record["message"]:
                        return dict(record)
            return None

        await until(connected, "the JSON line of the connection", DEADLINE)
        record = connected()
        assert record is not None
        assert (record["tenant"], record["run"], record["agent"]) == (TENANT, RUN, "alice")
        assert record["level"] == "INFO" and record["logger"] == "sync.hub"
        json_lines = [ln for ln in lines if ln.startswith("{")]
        assert json_lines and all(json.loads(ln)["message"] for ln in json_lines)
    finally:
        proc.terminate()
        proc.wait(timeout=DEADLINE)
        reader.join(timeout=DEADLINE)
        assert proc.stderr is not None
        proc.stderr.close()
