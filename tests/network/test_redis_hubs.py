"""Several hubs on one Redis (issue 16, item 3): two ``python -m sync --store redis://...``
processes on different ports serve one run; ``ws://`` clients spread over them see each
other's writes; a guarded write is decided by Redis whichever hub it goes through; a client
given both hubs (``open_store([url1, url2])``) moves to the other when its hub is killed
(``kill -9``), and nothing it had acknowledged is lost."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import crdtstore
from crdtstore import LeaseLost, StaleVersion
from sync import TokenClaims, mint
from tests._redis import RedisServer, free_port
from tests._wait import until
from tests.network.test_sync_processes import CLIENT, _node

pytestmark = pytest.mark.anyio

SECRET = "redis-hubs-test-secret-0123456789"
TENANT = "t1"
RUN = "r1"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the hubs' store is redis-py's (asyncio)


def token(agent: str) -> str:
    claims = TokenClaims.model_validate(
        {"tenant": TENANT, "run": RUN, "agent": agent, "mode": "rw", "exp": int(time.time()) + 3600}
    )
    return mint(SECRET.encode(), claims)


class Hub:
    """``python -m sync --store <redis url>`` on a port of its own."""

    def __init__(self, store: str, folder: Path, name: str) -> None:
        self.port = free_port()
        self.stderr = (folder / f"{name}.stderr").open("wb")
        argv = [sys.executable, "-m", "sync", "--store", store]
        argv += ["--host", "127.0.0.1", "--port", str(self.port)]
        env = {**os.environ, "CRDTSTORE_SECRET": SECRET}
        self.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr
        )
        self.url = f"ws://127.0.0.1:{self.port}/{TENANT}"

    def listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


@pytest.fixture
def hubs(server: RedisServer, tmp_path: Path) -> Iterator[tuple[str, Hub, Hub]]:
    store = server.url()
    one, two = Hub(store, tmp_path, "hub1"), Hub(store, tmp_path, "hub2")
    try:
        yield store, one, two
    finally:
        one.stop()
        two.stop()


async def test_two_hubs_share_a_run_and_a_client_moves_when_its_hub_dies(
    hubs: tuple[str, Hub, Hub],
) -> None:
    store_url, one, two = hubs
    await until(lambda: one.listening() and two.listening(), "both hubs listening")
    async with (
        crdtstore.open_store([one.url, two.url], token=token("a")) as sa,
        crdtstore.open_store(two.url, token=token("b")) as sb,
        sa.open_record(run=RUN, agent="a") as a,
        sb.open_record(run=RUN, agent="b") as b,
    ):
        for i in range(30):
            await a.map("m").set(f"a{i}", i)
        await a.flush()
        for i in range(30):
            await b.map("m").set(f"b{i}", i)
        await b.flush()
        await until(lambda: b.map("m").get("a29") == 29, "b (hub 2) sees a's writes (hub 1)")
        await until(lambda: a.map("m").get("b29") == 29, "a (hub 1) sees b's writes (hub 2)")

        # a guarded write is decided by Redis, whichever hub it goes through
        await a.sync()
        await b.sync()
        _, version = a.map("m").get_versioned("a0")
        assert b.map("m").get_versioned("a0")[1] == version
        outcomes = []
        for rec, value in ((a, "from a"), (b, "from b")):
            try:
                await rec.map("m").set("a0", value, expected_version=version)
                outcomes.append("ok")
            except StaleVersion:
                outcomes.append("stale")
        assert sorted(outcomes) == ["ok", "stale"]

        # fenced writes are decided by Redis too: a lease taken through hub 1 supersedes one
        # taken through hub 2, and the older token's write is refused
        old = sb.lease(["item:tasks/t1"], ttl=30, owner="b")
        await old.acquire()
        await b.map("m").set("t1", "b has it", lease=old, resource="item:tasks/t1")
        await old.release()
        newer = sa.lease(["item:tasks/t1"], ttl=30, owner="a")
        await newer.acquire()
        assert newer.token > old.token
        with pytest.raises(LeaseLost) as lost:
            await b.map("m").set("t1", "b again", lease=old, resource="item:tasks/t1")
        assert lost.value.code == "LEASE_LOST"
        await a.map("m").set("t1", "a has it", lease=newer, resource="item:tasks/t1")
        await newer.release()

        # a JavaScript y-websocket client on hub 2 writes, and waits for a's writes
        js = await anyio.open_process(
            [
                _node(), str(CLIENT), "--server", two.url, "--run", RUN, "--token", token("js"),
                json.dumps({"cmd": "map.set", "name": "m", "key": "js", "value": 1}),
                json.dumps({"cmd": "flush", "timeout": 60}),
                json.dumps({"cmd": "wait-for", "timeout": 60, "contains": {"m": {"a59": 59}}}),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )  # fmt: skip

        # kill -9 the hub of a: a moves to hub 2, its acknowledged writes are all there
        one.kill9()
        for i in range(30, 60):
            await a.map("m").set(f"a{i}", i)
        await a.flush()
        await until(lambda: b.map("m").get("a59") == 59, "b sees what a wrote after the kill")
        assert sa.backend._links[RUN].hub == f"ws://127.0.0.1:{two.port}"  # type: ignore[attr-defined]
        out = b""
        try:
            assert js.stdout is not None
            with anyio.fail_after(90):
                async for chunk in js.stdout:
                    out += chunk
                await js.wait()
        finally:
            if js.returncode is None:
                js.kill()
                await js.wait()
        assert js.returncode == 0, out.decode()
        await until(lambda: a.map("m").get("js") == 1, "a sees the JavaScript client's write")
    async with crdtstore.open_store(store_url, tenant=TENANT) as direct:
        replayed = (await direct.replay(RUN)).to_dict()["m"]
    for i in range(60):
        assert replayed[f"a{i}"] == (i if i else replayed["a0"])
    for i in range(30):
        assert replayed[f"b{i}"] == i
