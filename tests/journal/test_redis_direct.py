"""The hot commands of the Redis backend (appends, reads, lease transitions, the stream read)
go through ``Direct`` (``_backends/redis/_client.py``), beside redis-py's command machinery:
a cancelled command never leaves its reply for the next one, a connection the server closed
is reconnected and the command sent again, a script the server forgot is loaded again."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

import crdtstore
from crdtstore._backends.redis import RedisJournal
from crdtstore._leases import this_proc
from tests._redis import RedisServer
from tests._wait import until


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's client is asyncio only


pytestmark = pytest.mark.anyio


async def test_a_cancelled_command_leaves_no_reply_behind(server: RedisServer) -> None:
    journal = RedisJournal(server.url(prefix="direct-cancel"))
    await journal.open()
    try:
        direct = journal.scripts.direct
        cancelled = 0
        for i in range(200):
            # cancelled at every point of its way: before the write, while the reply is
            # in flight, or not at all
            with anyio.move_on_after(0.00002 * (i % 10)) as scope:
                await direct(b"ECHO", f"cancelled-{i}")
            cancelled += scope.cancelled_caught
            assert await direct(b"ECHO", f"probe-{i}") == f"probe-{i}".encode()
        assert cancelled > 0
    finally:
        await journal.aclose()


async def test_killed_connections_are_reconnected(server: RedisServer) -> None:
    url = server.url(prefix="direct-kill")
    async with (
        crdtstore.open_store(url) as a,
        crdtstore.open_store(url) as b,
        a.open_record(run="r", agent="a", source="tool") as ra,
        b.open_record(run="r", agent="b", source="tool") as rb,
    ):
        await ra.map("m").set("before", 1)
        await ra.flush()
        await until(lambda: rb.map("m").get("before") == 1)
        lease = a.leases.backend
        st = await lease.request(
            a.tenant, "o", ("x",), ttl=30.0, key=None, proc=this_proc(), wait=True
        )
        await lease.release(a.tenant, st.lease_id, "o", st.token)
        # the server drops every client connection of both stores (not this one's)
        server.client().execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        await ra.map("m").set("after", 2)
        await ra.flush()  # (sent once more on a new connection: no error)
        again = await lease.request(
            a.tenant, "o", ("x",), ttl=30.0, key=None, proc=this_proc(), wait=True
        )
        assert again.state == "granted" and again.token == (st.token or 0) + 1
        await lease.release(a.tenant, again.lease_id, "o", again.token)
        # the other store's stream read came back too, and nothing was appended twice
        await until(lambda: rb.map("m").get("after") == 2)
        rows = await a.backend.read(a.tenant, "r", 0)
        assert [r.effect[0][3] for r in rows] == ["before", "after"]


async def test_a_forgotten_script_is_loaded_again(server: RedisServer) -> None:
    url = server.url(prefix="direct-flush")
    async with (
        crdtstore.open_store(url) as store,
        store.open_record(run="r", agent="a", source="tool") as rec,
    ):
        await rec.map("m").set("one", 1)
        await rec.flush()
        server.client().script_flush()
        await rec.map("m").set("two", 2)
        await rec.flush()
        lease = store.leases.backend
        st = await lease.request(
            store.tenant, "o", ("x",), ttl=30.0, key=None, proc=this_proc(), wait=True
        )
        await lease.release(store.tenant, st.lease_id, "o", st.token)
        assert st.token is not None and st.token >= 1
        rows = await store.backend.read(store.tenant, "r", 0)
        assert [r.seq for r in rows] == [1, 2]
