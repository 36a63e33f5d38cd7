"""The Redis backend against a real ``redis-server`` (tests/_redis.py): the journal and lease
conformance suites, URLs, key names and tenant isolation, ``delete_run`` leaving no key."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

import crdtstore
from crdtstore import blocking
from crdtstore._backends.redis import RedisJournal, RedisLeases
from crdtstore._backends.redis._keys import Keys, escape, parse_url
from crdtstore._journal import NewEntry, checksum
from crdtstore.testing import check_journal_backend, check_lease_backend
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


async def test_journal_conformance(server: RedisServer) -> None:
    await check_journal_backend(lambda: RedisJournal(server.url()))


async def test_lease_conformance(server: RedisServer) -> None:
    await check_lease_backend(
        lambda clock, probe: RedisLeases(RedisJournal(server.url()), clock=clock, probe=probe)
    )


# -- URLs ---------------------------------------------------------------------------------


def test_url_parsing() -> None:
    u = parse_url("rediss://user:s3cret@redis.example:6380/2?ssl_cert_reqs=none&prefix=app")
    assert u.prefix == "app" and u.lock_ttl == 10.0
    assert u.redis_url == "rediss://user:s3cret@redis.example:6380/2?ssl_cert_reqs=none"
    assert "s3cret" not in u.shown and u.shown.startswith("rediss://user:***@redis.example")
    assert parse_url("redis://h", prefix="p", lock_ttl=2).lock_ttl == 2.0
    assert parse_url("redis://h?lock_ttl=0.5").lock_ttl == 0.5


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("redis:///0", crdtstore.UnsupportedURL),  # no host
        ("http://h:1/0", crdtstore.UnsupportedURL),
        ("redis://h?prefix=a:b", crdtstore.InvalidValue),  # could name other keys
        ("redis://h?prefix=x}", crdtstore.InvalidValue),
        ("redis://h?prefix=", crdtstore.InvalidValue),
        ("redis://h?prefix=a&prefix=b", crdtstore.UnsupportedURL),
        ("redis://h?lock_ttl=0", crdtstore.InvalidValue),
        ("redis://h?lock_ttl=nan", crdtstore.InvalidValue),
    ],
)
def test_bad_urls_are_refused(url: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        crdtstore.open_store(url)


def test_a_keyword_contradicting_the_url_is_refused() -> None:
    with pytest.raises(crdtstore.InvalidValue):
        crdtstore.open_store("redis://h?prefix=a", prefix="b")
    with pytest.raises(crdtstore.InvalidValue):
        crdtstore.open_store("redis://h", token="t")


def test_the_scheme_is_registered() -> None:
    store = crdtstore.open_store("redis://127.0.0.1:1/0")
    assert isinstance(store.backend, RedisJournal)
    assert isinstance(crdtstore.open_store("rediss://127.0.0.1:1/0").backend, RedisJournal)


async def test_no_server_is_a_backend_error() -> None:
    from tests._redis import free_port

    store = crdtstore.open_store(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(crdtstore.BackendError, match="cannot connect"):
        await store.start()


async def test_tls_against_a_plain_server_is_a_backend_error(server: RedisServer) -> None:
    store = crdtstore.open_store(f"rediss://127.0.0.1:{server.port}/0?socket_connect_timeout=0.5")
    with pytest.raises(crdtstore.BackendError):
        await store.start()


async def test_password_from_the_url(tmp_path: Path) -> None:
    srv = RedisServer(tmp_path)
    srv.extra = ["--requirepass", "s3cret"]
    srv.start()
    try:
        async with (
            crdtstore.open_store(f"redis://:s3cret@127.0.0.1:{srv.port}/3") as store,
            store.open_record(run="r", agent="a") as rec,
        ):
            await rec.map("m").set("k", 1)
        with pytest.raises(crdtstore.BackendError) as err:
            await crdtstore.open_store(f"redis://:wrong@127.0.0.1:{srv.port}/3").start()
        assert "wrong" not in str(err.value)
        with srv.client(password="s3cret", db=3) as c:
            assert c.exists("crdtstore:{default}:r:r")
    finally:
        srv.stop()


# -- durability --------------------------------------------------------------------------


def _version(srv: RedisServer) -> tuple[int, int]:
    with srv.client() as c:
        major, minor = str(c.info("server")["redis_version"]).split(".")[:2]
    return int(major), int(minor)


async def test_durable_on_appendfsync_always_is_synced_before_the_answer(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Before Redis 7.2 (no WAITAOF) a durable write is durable only because the server
    fsyncs its append-only file before it answers (``appendfsync always``): the journal says
    which guarantee it relies on, and gives no warning when it has one."""
    journal = RedisJournal(server.url())
    await journal.open()
    try:
        assert journal._sync == ("waitaof" if _version(server) >= (7, 2) else "always")
        await journal.ensure_run("t", "r", create=True)
        assert await journal.append("t", "r", [_entry(1)], durable=True) == [1]
    finally:
        await journal.aclose()
    assert "only as durable" not in caplog.text


@pytest.mark.parametrize("fsync", ["everysec", "no"])
async def test_durable_without_waitaof_or_fsync_always_warns(
    tmp_path: Path, fsync: str, caplog: pytest.LogCaptureFixture
) -> None:
    """On Redis 7.0/7.1 with ``appendfsync everysec`` (or ``no``) nothing can make one write
    durable: a durable write is acknowledged after the append, as a batched one, and the store
    says so (once) instead of claiming a guarantee; on 7.2+ it waits with WAITAOF."""
    srv = RedisServer(tmp_path)
    srv.extra = ["--appendfsync", fsync]  # (the later argument wins)
    srv.start()
    try:
        journal = RedisJournal(srv.url())
        await journal.open()
        try:
            waitaof = _version(srv) >= (7, 2)
            assert journal._sync == ("waitaof" if waitaof else "none")
            await journal.ensure_run("t", "r", create=True)
            for i in (1, 2):
                assert await journal.append("t", "r", [_entry(i)], durable=True) == [i]
        finally:
            await journal.aclose()
        warned = caplog.text.count("only as durable")
        assert warned == (0 if waitaof else 1), caplog.text
    finally:
        srv.stop()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_is_refused_clearly(server: RedisServer, anyio_backend: str) -> None:
    with pytest.raises(crdtstore.BackendError, match="asyncio only"):
        await crdtstore.open_store(server.url()).start()


# -- keys ---------------------------------------------------------------------------------


@given(
    st.tuples(st.text(":{}%ab", min_size=1, max_size=6), st.text(":{}%ab", min_size=1, max_size=6)),
    st.tuples(st.text(":{}%ab", min_size=1, max_size=6), st.text(":{}%ab", min_size=1, max_size=6)),
)
def test_key_names_are_injective(a: tuple[str, str], b: tuple[str, str]) -> None:
    keys = Keys("p")
    ka, kb = keys.run_keys(*a), keys.run_keys(*b)
    if a != b:
        assert set(ka.all()).isdisjoint(kb.all())
        assert ka.meta != keys.runs(b[0]) and kb.meta != keys.runs(a[0])
    # every key of a tenant starts with its base, which names no other tenant's
    assert all(k.startswith(keys.tenant(a[0]) + ":") for k in ka.all())
    if a[0] != b[0]:
        assert not keys.tenant(b[0]).startswith(keys.tenant(a[0]))
    assert escape(a[1]).count("{") == 0


async def test_tenants_are_isolated(server: RedisServer) -> None:
    url = server.url()
    prefix = url.rsplit("prefix=", 1)[1]
    evil = "a}:r:secret"  # a tenant name that looks like a key path of tenant "a"
    async with (
        crdtstore.open_store(url, tenant="a") as a,
        crdtstore.open_store(url, tenant=evil) as b,
    ):
        async with a.open_record(run="secret", agent="x") as rec:
            await rec.map("m").set("k", "a's")
        async with b.open_record(run="secret", agent="y") as rec:
            assert rec.map("m").get("k") is None, "tenant b must not see a's run"
            await rec.map("m").set("k", "b's")
        assert [r.run for r in await b.runs()] == ["secret"]
        async with a.open_record(run="secret", agent="x") as rec:
            assert rec.map("m").get("k") == "a's"
        assert await b.delete_run("secret")
        assert [r.run for r in await a.runs()] == ["secret"], "b's delete must not touch a"
    keys = server.keys(f"{prefix}:*")
    assert keys and all(k.startswith(f"{prefix}:{{a}}:".encode()) for k in keys), keys


async def test_delete_run_leaves_no_key(server: RedisServer) -> None:
    url = server.url()
    prefix = url.rsplit("prefix=", 1)[1]
    async with crdtstore.open_store(url, tenant="t") as store:
        async with store.open_record(run="doomed", agent="a") as rec:
            await rec.map("m").set("k", "personal data")
            await rec.list("l").append(1)
            await rec.text("x").insert(0, "hello")
        async with store.open_record(run="doomed-child", agent="a", parent="doomed") as rec:
            await rec.map("m").set("k", "more")
        async with store.open_record(run="kept", agent="a") as rec:
            await rec.map("m").set("k", 1)
        await store.compact("doomed", drop_journal=True)
        before = server.keys(f"{prefix}:*")
        assert any(b"doomed" in k for k in before)
        assert await store.delete_run("doomed")
        after = server.keys(f"{prefix}:*")
        assert not [k for k in after if b"doomed" in k], after
        assert {k.decode() for k in after} == {
            f"{prefix}:{{t}}:runs",
            f"{prefix}:{{t}}:r:kept",
            f"{prefix}:{{t}}:r:kept:j",
            f"{prefix}:{{t}}:r:kept:k",
            # the tenant's lease counters (the compaction lease took a token): never removed,
            # tokens never go back
            f"{prefix}:{{t}}:lease:n",
        }
        with server.client() as c:
            assert not [v for k in after for v in _values(c, k) if b"personal" in v]


def _values(c: redis.Redis, key: bytes) -> list[bytes]:
    kind = c.type(key)
    if kind == b"hash":
        return list(c.hgetall(key).values())
    if kind == b"stream":
        return [v for _, f in c.xrange(key) for v in f.values()]
    if kind == b"zset":
        return list(c.zrange(key, 0, -1))
    return [c.get(key) or b""]


async def test_compaction_trims_without_resetting_the_stream(server: RedisServer) -> None:
    url = server.url()
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r", agent="a") as rec:
            for i in range(2500):
                await rec.map("m").set(f"k{i % 50}", i)
            await rec.flush()
            result = await store.compact("r", drop_journal=True)
            assert result.seq == 2500
            await rec.map("m").set("after", 1)
            await rec.flush()
        journal = await store.journal("r", limit=10_000)
        assert [e.seq for e in journal] == [2501], "trimmed below the snapshot, positions go on"
        keys = RedisJournal(url).keys.run_keys("default", "r")
        with server.client() as c:
            assert c.type(keys.stream) == b"stream"
            assert c.xinfo_stream(keys.stream)["last-generated-id"] == b"2501-0"
            assert c.zcard(keys.index) == 1, "the key index went with the entries"
        async with store.open_record(run="r", agent="b") as rec:
            assert rec.map("m").get("k49") == 2499 and rec.map("m").get("after") == 1


async def test_a_garbage_stream_entry_is_skipped_and_reported(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = server.url()
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r", agent="a") as rec:
            await rec.map("m").set("k", 1)
        keys = RedisJournal(url).keys.run_keys("default", "r")
        with server.client() as c:
            c.xadd(keys.stream, {"junk": "x"}, id="2-0")
            c.hset(keys.meta, "head", 2)
        async with store.open_record(run="r", agent="b") as rec:
            assert rec.map("m").get("k") == 1
        assert "entry 2 of run 'r' is corrupt" in caplog.text


# -- the authority ------------------------------------------------------------------------


def _entry(i: int) -> NewEntry:
    update = f"u{i}".encode()
    return NewEntry("a", "tool", 7, 0.0, update, [], checksum(update))


async def test_plain_appends_of_another_store_wait_for_an_authority(server: RedisServer) -> None:
    url = server.url()
    j1, j2 = RedisJournal(url), RedisJournal(url)
    await j1.open()
    await j2.open()
    try:
        await j1.ensure_run("t", "r", create=True)
        order: list[str] = []

        async def plain() -> None:
            assert await j2.append("t", "r", [_entry(2)], durable=False) == [2]
            order.append("plain")

        async with j1.authority("t", "r", durable=True) as auth:
            async with anyio.create_task_group() as tg:
                tg.start_soon(plain)
                await anyio.sleep(0.05)  # the plain append is refused meanwhile, and waits
                assert order == []
                assert await auth.append([_entry(1)]) == [1]
                assert await j2.head("t", "r") == 0, "an authority's appends land at its end"
                order.append("authority")
                # (leaving the task group waits for the plain append: it must not wait for
                # the lock that this block still holds, so end the authority first)
                tg.cancel_scope.cancel()
        await j2.append("t", "r", [_entry(2)], durable=False)
        assert [r.update for r in await j2.read("t", "r", 0)] == [b"u1", b"u2"]
    finally:
        await j1.aclose()
        await j2.aclose()


async def test_an_expired_authority_cannot_commit(server: RedisServer) -> None:
    url = server.url(lock_ttl=0.2)
    j1, j2 = RedisJournal(url), RedisJournal(url)
    await j1.open()
    await j2.open()
    try:
        await j1.ensure_run("t", "r", create=True)
        keys = j1.keys.run_keys("t", "r")
        authority = j1.authority("t", "r", durable=True)
        auth = await authority.__aenter__()
        await auth.append([_entry(1)])
        # a holder that went silent past its lock's TTL (a stopped process)
        with server.client() as c:
            await until(lambda: not c.exists(keys.lock), "the lock to expire")
        assert await j2.append("t", "r", [_entry(2)], durable=False) == [1]
        with pytest.raises(crdtstore.BackendError, match="lost its lock"):
            await authority.__aexit__(None, None, None)
        assert [r.update for r in await j2.read("t", "r", 0)] == [b"u2"], "nothing of it"
    finally:
        await j1.aclose()
        await j2.aclose()


# -- leases across stores and restarts ----------------------------------------------------


async def test_a_release_wakes_a_waiter_of_another_store(server: RedisServer) -> None:
    """The hand-off reaches a waiter in another store (another process, to the lease layer)
    through the tenant's wake-up stream, not after a fallback poll (2 s) or the TTL."""
    url = server.url()
    async with crdtstore.open_store(url) as a, crdtstore.open_store(url) as b:
        held = await a.lease(["src/x.py"], ttl=30).acquire()
        got: list[float] = []

        async def wait_for_it() -> None:
            async with b.lease(["src/x.py"], ttl=30) as lease:
                got.append(time.monotonic())
                assert lease.token > held.token

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_it)
            await until(lambda: _waiting(b), "b to queue", deadline=10)
            released = time.monotonic()
            await held.release()
        assert got and got[0] - released < 1.0, "the waiter was not woken by the release"


async def _waiting(store: crdtstore.Store) -> bool:
    return len((await store.leases.status()).waiters) == 1


async def test_leases_survive_a_redis_restart(tmp_path: Path) -> None:
    """kill -9 of redis-server and a restart on the same folder (append-only file): the
    holder, the waiter's place and the token counter are all still there."""
    srv = RedisServer(tmp_path).start()
    try:
        url = srv.url()
        async with crdtstore.open_store(url) as store:
            backend = store.leases.backend
            proc = crdtstore._leases.this_proc()
            a = await backend.request("t", "A", ("f",), ttl=60.0, key=None, proc=proc, wait=True)
            w = await backend.request("t", "B", ("f",), ttl=60.0, key=None, proc=proc, wait=True)
            assert a.token is not None and not w.granted
            srv.kill9()
            srv.start()
            st = await until(lambda: _status(backend), "redis to be back")
            assert [(h.owner, h.token) for h in st.holders] == [("A", a.token)]
            assert [(x.owner, x.rank) for x in st.waiters] == [("B", w.rank)]
            await backend.release("t", a.lease_id, "A", a.token)
            b = await backend.heartbeat("t", w.lease_id, "B", proc)
            assert b.granted and b.token is not None and b.token > a.token
    finally:
        srv.stop()


async def _status(backend: Any) -> Any:
    try:
        return await backend.status("t")
    except crdtstore.BackendError:
        return None


# -- wake-ups -----------------------------------------------------------------------------


async def test_one_blocking_read_per_store_for_all_its_runs(server: RedisServer) -> None:
    """A store with 20 runs open holds one blocked XREAD, not a read per record; a write to
    any of them from another store arrives without sync()."""
    url = server.url()
    async with crdtstore.open_store(url, poll_interval=60.0) as reader:
        async with contextlib.AsyncExitStack() as stack:
            recs = [
                await stack.enter_async_context(reader.open_record(run=f"r{i}", agent="r"))
                for i in range(20)
            ]
            with server.client() as c:
                await until(lambda: c.info("clients")["blocked_clients"] == 1, "one XREAD")
                async with crdtstore.open_store(url) as writer:
                    for i in (0, 7, 19):
                        async with writer.open_record(run=f"r{i}", agent="w") as rec:
                            await rec.map("m").set("k", i)
                    for i in (0, 7, 19):
                        await until(lambda i=i: recs[i].map("m").get("k") == i, f"run r{i}")
                assert c.info("clients")["blocked_clients"] == 1


def test_the_blocking_facade(server: RedisServer) -> None:
    url = server.url()
    with blocking.open_store(url) as store, store.open_record(run="r", agent="a") as rec:
        rec.map("m").set("k", 1)
        rec.flush()
        assert [e.seq for e in store.journal("r")] == [1]


# -- compaction -----------------------------------------------------------------------------


async def test_one_compactor_per_run(server: RedisServer) -> None:
    """A run is compacted by the holder of its compaction lease only: the automatic
    compaction of another store leaves it (LeaseHeld), an explicit one waits its turn."""
    url = server.url()
    async with (
        crdtstore.open_store(url) as a,
        crdtstore.open_store(url) as b,
        a.open_record(run="r", agent="w") as rec,
    ):
        for i in range(10):
            await rec.map("m").set(f"k{i}", i)
        await rec.flush()
        held = a.lease(["item:__crdtstore_compaction/r"], ttl=30, owner="other")
        await held.acquire()
        with pytest.raises(crdtstore.LeaseHeld):
            await b._compact("r", False, None, wait=False)
        assert (await b.run_info("r")).snapshot_seq == 0
        done = anyio.Event()

        async def compact() -> None:
            await b.compact("r")
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(compact)
            await until(lambda: _waiting(b), "the compaction to wait for the lease")
            assert not done.is_set()
            await held.release()
            await until(done.is_set, "the compaction once the lease is free")
        assert (await b.run_info("r")).snapshot_seq == 10


async def test_a_compaction_racing_writers_and_readers_misses_no_entry(
    server: RedisServer,
) -> None:
    """Compactions that drop the journal, while a writer writes and a reader of another store
    follows: the reader is told of every write (none falls below a trim before it read
    it), and a store opened at the end replays the same state."""
    url = server.url()
    n = 300
    async with (
        crdtstore.open_store(url) as ws,
        crdtstore.open_store(url) as rs,
        crdtstore.open_store(url, trim_grace=0.2) as cs,
        ws.open_record(run="r", agent="w") as w,
        rs.open_record(run="r", agent="r") as r,
    ):
        seen: set[str] = set()
        stream = r.changes(local=False, buffer=100_000)

        async def follow() -> None:
            async for change in stream:
                seen.update(change.keys)
                if len(seen) >= n:
                    return

        async def compactions() -> None:
            while len(seen) < n:
                await cs.compact("r", drop_journal=True)
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            tg.start_soon(compactions)
            for i in range(n):
                await w.map("m").set(f"k{i}", i)
                if i % 10 == 0:
                    await w.flush()
            await w.flush()
            await until(lambda: len(seen) >= n, "the reader to be told of every write")
        assert stream.lost == 0
        assert r.to_dict() == w.to_dict()
    async with crdtstore.open_store(url) as fresh, fresh.open_record(run="r", agent="x") as x:
        assert x.map("m").to_dict() == {f"k{i}": i for i in range(n)}
        assert (await fresh.run_info("r")).snapshot_seq > 0
