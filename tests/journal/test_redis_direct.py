"""The hot commands of the Redis backend (appends, reads, lease transitions, the stream read)
go through ``Direct`` (``_backends/redis/_client.py``), beside redis-py's command machinery:
a cancelled command never leaves its reply for the next one, a connection the server closed
is reconnected and the command sent again, a script the server forgot is loaded again."""

from __future__ import annotations

import anyio
import pytest

import crdtstore
from crdtstore._backends.redis import RedisJournal
from crdtstore._leases import this_proc
from tests._redis import RedisServer
from tests._wait import until


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's client is asyncio only


pytestmark = pytest.mark.anyio


async def test_a_cancelled_command_leaves_no_reply_behind(redis_server: RedisServer) -> None:
    journal = RedisJournal(redis_server.url(prefix="direct-cancel"))
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


async def test_killed_connections_are_reconnected(redis_server: RedisServer) -> None:
    url = redis_server.url(prefix="direct-kill")
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
        redis_server.client().execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
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


async def test_a_forgotten_script_is_loaded_again(redis_server: RedisServer) -> None:
    url = redis_server.url(prefix="direct-flush")
    async with (
        crdtstore.open_store(url) as store,
        store.open_record(run="r", agent="a", source="tool") as rec,
    ):
        await rec.map("m").set("one", 1)
        await rec.flush()
        redis_server.client().script_flush()
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


async def test_redis_py_commands_survive_a_killed_connection(redis_server: RedisServer) -> None:
    # the commands left on redis-py (the XREVRANGE of a lease wake-up stream, the lease
    # table's reads, the run's metadata) are sent again on a new connection, as Direct's are
    url = redis_server.url(prefix="direct-kill-py")

    def kill() -> None:
        redis_server.client().execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")

    async with crdtstore.open_store(url) as store:
        lease = store.leases.backend
        st = await lease.request("t1", "o", ("x",), ttl=30.0, key=None, proc=this_proc(), wait=True)
        await lease.release("t1", st.lease_id, "o", st.token)
        kill()
        # a tenant not watched yet: its first request reads its wake-up stream (XREVRANGE)
        got = await lease.request(
            "t2", "o", ("x",), ttl=30.0, key=None, proc=this_proc(), wait=True
        )
        assert got.state == "granted" and got.token == 1
        await lease.release("t2", got.lease_id, "o", got.token)
        kill()
        status = await lease.status("t1")  # (a MULTI pipeline)
        assert status.holders == () and status.next_token == 2
        kill()
        assert await store.backend.get_run(store.tenant, "nothing") is None


async def test_a_reply_later_than_the_socket_timeout_times_out(redis_server: RedisServer) -> None:
    """A reply is read under the connection's socket timeout (one timer per read, not
    redis-py's ``read_response``): a command that blocks past it raises a timeout, its
    connection is dropped (the reply may still come), and the next command works."""
    from crdtstore._backends.redis._client import ReplyTimeout

    url = redis_server.url(prefix="direct-timeout")
    sep = "&" if "?" in url else "?"
    journal = RedisJournal(f"{url}{sep}socket_timeout=0.2")
    await journal.open()
    try:
        direct = journal.scripts.direct
        with anyio.fail_after(5):
            with pytest.raises(ReplyTimeout):
                await direct(b"BLPOP", b"direct-timeout-nothing", 2)
            assert await direct(b"ECHO", b"after") == b"after"
            assert await direct(b"BLPOP", b"direct-timeout-nothing", 0.05) is None
    finally:
        await journal.aclose()
