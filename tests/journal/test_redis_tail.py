"""The Redis store's stream read (``_backends/redis/_tail.py``) wakes a run's readers for the
entries of others only: the entries of a run's one reader here come back to it through the
stream read too (often before its append's answer), and wake nobody; with two readers of
one run in one store, each one's entries still reach the other."""

from __future__ import annotations

import pytest

import crdtstore
from tests._redis import RedisServer
from tests._wait import until


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's client is asyncio only


pytestmark = pytest.mark.anyio


async def test_own_entries_wake_nobody_others_do(redis_server: RedisServer) -> None:
    url = redis_server.url(prefix="tail-own")
    async with (
        crdtstore.open_store(url) as a,
        crdtstore.open_store(url) as b,
        a.open_record(run="r", agent="a", source="tool") as ra,
        b.open_record(run="r", agent="b", source="tool") as rb,
    ):
        tail = a.backend.tail
        assert tail is not None
        woken: list[tuple[str, str]] = []
        wake = tail._wake
        tail._wake = lambda tenant, run: (woken.append((tenant, run)), wake(tenant, run))[1]
        stream = a.backend.keys.run_keys(a.tenant, "r").stream
        for i in range(20):
            await ra.map("m").set(f"a{i}", i)
        await ra.flush()
        head = await a.backend.head(a.tenant, "r")
        await until(lambda: tail.seen({stream: "r"}).get("r", 0) >= head)
        assert woken == []  # its own entries, read back by the stream read: no wake-up
        assert ra.applied_seq == head
        await rb.map("m").set("b", 1)
        await rb.flush()
        await until(lambda: ra.map("m").get("b") == 1)
        assert woken and set(woken) == {(a.tenant, "r")}


async def test_two_readers_of_one_run_in_one_store_see_each_other(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url(prefix="tail-two")
    async with (
        crdtstore.open_store(url) as store,
        store.open_record(run="r", agent="x", source="tool") as rx,
        store.open_record(run="r", agent="y", source="tool") as ry,
    ):
        for i in range(10):
            await rx.map("m").set(f"x{i}", i)
            await ry.map("m").set(f"y{i}", i)
        await rx.flush()
        await ry.flush()
        await until(lambda: ry.map("m").get("x9") == 9 and rx.map("m").get("y9") == 9)
        assert len(rx.map("m")) == len(ry.map("m")) == 20
