"""Guarded and fenced appends decided by the backend in the step that appends
(``crdtstore._guarded_append``), on SQLite and on a real ``redis-server``: a guard is refused
(``GuardMoved``) exactly when an entry after the writer's position touches what it guards, a
fence with a superseded or released token is refused ``LEASE_LOST``, and a refusal appends
nothing. Then the record on ``redis://``: guarded and fenced writes through the Lua script."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import crdtstore
from crdtstore import LeaseLost, StaleVersion
from crdtstore._guarded_append import AtomicGuardedAppend, Fence, Guard, GuardMoved, touches
from crdtstore._journal import NewEntry, Op, checksum
from tests._redis import RedisServer
from tests._wait import until
from tests.record import test_fenced_writes as fenced

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's client is asyncio only


@pytest.fixture(params=["sqlite", "redis"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, redis_server: RedisServer
) -> AsyncIterator[crdtstore.Store]:
    url = f"sqlite:///{tmp_path}/s.db" if request.param == "sqlite" else redis_server.url()
    async with crdtstore.open_store(url, tenant="t") as s:
        await s.backend.ensure_run("t", "r", create=True)
        yield s


def _entry(effect: list[Op]) -> NewEntry:
    update = b"\x00\x00"
    return NewEntry("a", "tool", 7, 1.0, update, effect, checksum(update))


def _atomic(store: crdtstore.Store) -> AtomicGuardedAppend:
    backend = store.backend
    assert isinstance(backend, AtomicGuardedAppend)
    return backend


SET_K: list[Op] = [["map", "m", "set", "k", 1]]
SET_OTHER: list[Op] = [["map", "m", "set", "other", 1]]
LIST_INS: list[Op] = [["list", "l", "ins", 0, [1]]]


async def test_a_guard_is_refused_only_when_an_entry_after_seen_touches_it(
    store: crdtstore.Store,
) -> None:
    b = _atomic(store)
    assert await b.append_guarded_at("t", "r", [_entry(SET_K)], Guard(0), durable=False) == [1]
    await store.backend.append("t", "r", [_entry(SET_OTHER), _entry(LIST_INS)], durable=False)
    # seen 1: entries 2 (m/other) and 3 (list l) came after it
    ok = await b.append_guarded_at(
        "t", "r", [_entry(SET_K)], Guard(1, keys=(("m", "k"),)), durable=False
    )
    assert ok == [4]
    for guard in (
        Guard(1, keys=(("m", "other"),)),
        Guard(1, scopes=("l",)),
        Guard(1, scopes=("m",)),
        Guard(3, scopes=("*",)),
        Guard(0, keys=(("m", "k"),)),
    ):
        with pytest.raises(GuardMoved) as moved:
            await b.append_guarded_at("t", "r", [_entry(SET_K)], guard, durable=False)
        assert moved.value.head == 4
    assert await store.backend.head("t", "r") == 4  # a refusal appends nothing
    assert await b.append_guarded_at("t", "r", [], Guard(4, scopes=("*",)), durable=False) == []


async def test_entries_compacted_away_after_seen_refuse_the_guard(store: crdtstore.Store) -> None:
    b = _atomic(store)
    await store.backend.append("t", "r", [_entry(SET_OTHER)] * 3, durable=False)
    snap = await store.backend.load_snapshot("t", "r")
    assert snap is None
    from crdtstore._journal import SnapshotRow

    await store.backend.save_snapshot(
        "t", "r", SnapshotRow(3, b"\x00\x00", {}, 0.0), drop_journal=True
    )
    with pytest.raises(GuardMoved):  # entries 2, 3 are gone: nobody can tell what they did
        await b.append_guarded_at(
            "t", "r", [_entry(SET_K)], Guard(1, keys=(("m", "k"),)), durable=False
        )
    got = await b.append_guarded_at(
        "t", "r", [_entry(SET_K)], Guard(3, keys=(("m", "k"),)), durable=False
    )
    assert got == [4]


async def test_a_fence_holds_only_for_the_live_grant_and_its_token(store: crdtstore.Store) -> None:
    b = _atomic(store)
    assert b.hosts_leases(store.leases.backend)
    lease = store.lease(["item:tasks/t1"], ttl=30, owner="a")
    await lease.acquire()
    f = Fence(lease.lease_id, lease.token, "item:tasks/t1")
    assert await b.append_guarded_at("t", "r", [_entry(SET_K)], Guard(0, fence=f), durable=True)
    for bad in (
        f._replace(token=lease.token + 1),
        f._replace(resource="item:tasks/t2"),
        f._replace(lease_id="nope"),
    ):
        with pytest.raises(LeaseLost) as err:
            await b.append_guarded_at("t", "r", [_entry(SET_K)], Guard(1, fence=bad), durable=True)
        assert err.value.code == "LEASE_LOST"
    await lease.release()
    newer = store.lease(["item:tasks/t1"], ttl=30, owner="b")
    await newer.acquire()
    assert newer.token > lease.token
    with pytest.raises(LeaseLost):  # superseded: the old holder cannot write any more
        await b.append_guarded_at("t", "r", [_entry(SET_K)], Guard(1, fence=f), durable=True)
    assert await store.backend.head("t", "r") == 1
    g = Fence(newer.lease_id, newer.token, "item:tasks/t1")
    assert await b.append_guarded_at("t", "r", [_entry(SET_K)], Guard(1, fence=g), durable=True)
    await newer.release()


_OPS = st.sampled_from([SET_K, SET_OTHER, LIST_INS, [["map", "n", "del", "k"]], []])
_GUARDS = st.builds(
    Guard,
    seen=st.just(0),
    keys=st.sampled_from([(), (("m", "k"),), (("n", "k"),)]),
    scopes=st.sampled_from([(), ("m",), ("l",), ("*",)]),
    fence=st.none(),
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(effects=st.lists(_OPS, max_size=4), guard=_GUARDS)
async def test_the_backend_refuses_exactly_what_touches_the_guard(
    redis_server: RedisServer, effects: list[list[Op]], guard: Guard
) -> None:
    """The Lua script and the SQLite transaction agree with ``touches`` on every history."""
    sqlite = f"sqlite:///{redis_server.folder / uuid.uuid4().hex}.db"
    for url in (redis_server.url(), sqlite):
        async with crdtstore.open_store(url, tenant="t") as s:
            await s.backend.ensure_run("t", "r", create=True)
            if effects:
                await s.backend.append("t", "r", [_entry(e) for e in effects], durable=False)
            expect_moved = any(touches(e, guard) for e in effects)
            try:
                await _atomic(s).append_guarded_at("t", "r", [_entry(SET_K)], guard, durable=False)
                moved = False
            except GuardMoved:
                moved = True
            assert moved == expect_moved, url


# -- the record on redis:// ------------------------------------------------------------------


async def test_fenced_writes_on_redis(redis_server: RedisServer) -> None:
    await fenced.test_fenced_write_needs_the_live_lease_with_the_newest_token(redis_server.url())


async def test_claims_on_redis(redis_server: RedisServer) -> None:
    await fenced.test_claims_are_exclusive_and_visible(redis_server.url())


async def test_guarded_writes_on_redis_see_other_stores(redis_server: RedisServer) -> None:
    url = redis_server.url()
    async with (
        crdtstore.open_store(url) as s1,
        crdtstore.open_store(url) as s2,
        s1.open_record(run="r", agent="a") as a,
        s2.open_record(run="r", agent="b") as b,
    ):
        await a.map("m").set("k", 1)
        await a.flush()
        _, version = a.map("m").get_versioned("k")
        # b has not necessarily seen it: the script refuses b's stale decision, b reads and
        # decides again with the entry in
        with pytest.raises(StaleVersion) as err:
            await b.map("m").set("k", 2, expected_version=0)
        assert err.value.current_version == version
        await b.map("m").set("k", 2, expected_version=version)
        await a.sync()
        assert a.map("m")["k"] == 2
        # a guarded write unrelated to another store's concurrent writes goes through
        await a.map("m").set("x", 1)
        await a.flush()
        _, vk = b.map("m").get_versioned("k")
        await b.map("m").set("k", 3, expected_version=vk)
        with pytest.raises(StaleVersion):
            await b.map("m").set("k", 4, based_on=crdtstore.Version(scope="m", seq=0))


def test_guarded_counter_across_processes_on_redis(redis_server: RedisServer) -> None:
    """4 processes increment one counter through ``redis://`` with ``expected_version``: a
    write succeeds only on the current version (no lost increment), refusals name it."""
    from tests.journal.test_guarded_processes import check_counters

    check_counters(redis_server.url(), 4, 2.0)


async def test_fences_and_tokens_across_a_redis_kill9(tmp_path: Path) -> None:
    """``kill -9`` of redis-server and a restart on the same folder: the holder's fenced
    writes go on with its token, the next grant's token is higher, and the old token is
    refused from then on."""
    srv = RedisServer(tmp_path / "redis").start()
    try:
        async with (
            crdtstore.open_store(srv.url()) as store,
            store.open_record(run="r", agent="a") as rec,
        ):
            lease = store.lease(["item:tasks/t1"], ttl=60, owner="a")
            await lease.acquire()
            await rec.map("m").set("t1", 1, lease=lease, resource="item:tasks/t1")
            srv.kill9()
            srv.start()

            async def fenced_write() -> bool:
                try:
                    await rec.map("m").set("t1", 2, lease=lease, resource="item:tasks/t1")
                except crdtstore.BackendError:
                    return False
                return True

            await until(fenced_write, "a fenced write after the restart")
            await lease.release()
            newer = store.lease(["item:tasks/t1"], ttl=60, owner="b")
            await newer.acquire()
            assert newer.token > lease.token
            with pytest.raises(LeaseLost):
                await rec.map("m").set("t1", 3, lease=lease, resource="item:tasks/t1")
            await rec.map("m").set("t1", 4, lease=newer, resource="item:tasks/t1")
            await newer.release()
            assert rec.map("m")["t1"] == 4
    finally:
        srv.stop()
