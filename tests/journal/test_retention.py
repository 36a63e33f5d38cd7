"""Retention that runs by itself (issue 19 part 5): ``open_store(..., sweep_interval=...)``
deletes expired runs without a call to ``sweep()``, logs them, leaves live runs alone; and a
sweep racing writers and ``set_retention`` deletes nothing that is not expired, on memory,
SQLite and a real redis-server (the backends decide "due" and delete in one atomic step)."""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path

import anyio
import pytest

import crdtstore
from crdtstore import InvalidValue, UnknownRun
from tests._redis import RedisServer
from tests._wait import until

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's client is asyncio only (trio: see the last test)


@pytest.fixture(params=["memory", "sqlite", "redis"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://retention-{time.monotonic_ns()}"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    srv: RedisServer = request.getfixturevalue("redis_server")
    return srv.url(prefix=f"t{time.monotonic_ns()}")


async def _runs(store: crdtstore.Store) -> set[str]:
    return {r.run for r in await store.runs()}


async def test_an_expired_run_disappears_without_a_sweep_call(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="crdtstore.retention")
    async with crdtstore.open_store(url, sweep_interval=0.05) as store:
        for run in ("old", "young", "forever"):
            async with store.open_record(run=run, agent="a") as rec:
                await rec.map("m").set("k", run)
        async with store.open_record(run="old-child", agent="a", parent="old") as rec:
            await rec.map("m").set("c", 1)
        await store.set_retention("young", delete_after=3600)
        await store.set_retention("old", delete_after=0)
        await until(
            lambda: any("deleted run default/old" in r.getMessage() for r in caplog.records),
            "the background sweep to delete the expired run",
        )
        assert await _runs(store) == {"young", "forever"}  # its nested run went with it
        async with store.open_record(run="young", agent="a", create=False) as rec:
            assert rec.map("m").get("k") == "young"


async def test_a_sweep_racing_writers_and_extensions_deletes_only_what_expired(url: str) -> None:
    """Writers append to every run while a background sweep (every 5 ms) runs and a third
    task extends the deadline of half the due runs at random moments. Afterwards: every run
    whose extension was accepted exists with every write acknowledged to it, the runs without
    a deadline are whole, and the due runs that were not extended are gone."""
    rng = random.Random(19)
    live = [f"live{i}" for i in range(3)]
    doomed = [f"due{i}" for i in range(8)]
    acked: dict[str, int] = {}
    extended: set[str] = set()
    async with crdtstore.open_store(url, sweep_interval=0.005) as store:
        for run in live + doomed:
            async with store.open_record(run=run, agent="w") as rec:
                await rec.map("m").set("k0", 0)
            acked[run] = 1
        for run in doomed:  # due in 0 to 50 ms: the sweep and the extender overlap
            await store.set_retention(run, delete_after=rng.uniform(0, 0.05))

        async def write(run: str) -> None:
            try:
                async with store.open_record(run=run, agent="w", create=False) as rec:
                    for i in range(1, 30):
                        await rec.map("m").set(f"k{i}", i)
                        await rec.flush()
                        acked[run] = i + 1
                        await anyio.sleep(0.001)
            except crdtstore.CrdtStoreError:
                assert run in doomed and run not in extended, f"a write to {run} failed"

        async def extend(run: str) -> None:
            await anyio.sleep(rng.uniform(0, 0.05))
            try:
                await store.set_retention(run, delete_after=3600)
            except UnknownRun:
                return  # it expired and was swept first
            extended.add(run)

        async with anyio.create_task_group() as tg:
            for run in live + doomed:
                tg.start_soon(write, run)
            for run in doomed[::2]:
                tg.start_soon(extend, run)
        await until(
            lambda: _gone(store, set(doomed) - extended), "the unextended due runs to be swept"
        )
        assert await _runs(store) == set(live) | extended
        for run in set(live) | extended:
            async with store.open_record(run=run, agent="r", create=False) as rec:
                got = rec.map("m").to_dict()
                assert len(got) == acked[run], f"{run} lost writes: {sorted(got)}"


async def _gone(store: crdtstore.Store, runs: set[str]) -> bool:
    return not (await _runs(store) & runs)


async def test_the_backend_check_and_delete_is_one_step(url: str) -> None:
    """``delete_run_if_due`` reads the deadline in the step that deletes: a sweep that listed
    a run as due before a ``set_retention`` extended it keeps the run."""
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r", agent="a") as rec:
            await rec.map("m").set("k", 1)
        backend, tenant = store.backend, store.tenant
        assert not await backend.delete_run_if_due(tenant, "r", time.time())  # no deadline
        await store.set_retention("r", delete_after=0)
        listed = time.time() + 1  # what a sweep saw as due ...
        await store.set_retention("r", delete_after=3600)  # ... then extended
        assert not await backend.delete_run_if_due(tenant, "r", listed)
        assert await _runs(store) == {"r"}
        assert not await backend.delete_run_if_due(tenant, "missing", listed)
        assert await backend.delete_run_if_due(tenant, "r", time.time() + 7200)
        assert await _runs(store) == set()


async def test_sweep_interval_is_checked() -> None:
    for bad in (0, -1, float("inf"), float("nan"), "1", True):
        with pytest.raises(InvalidValue):
            crdtstore.open_store("memory://", sweep_interval=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_background_sweep_on_trio_stops_with_the_store(anyio_backend: str) -> None:
    store = crdtstore.open_store(f"memory://trio-{time.monotonic_ns()}", sweep_interval=0.01)
    await store.start()
    try:
        async with store.open_record(run="r", agent="a") as rec:
            await rec.map("m").set("k", 1)
        await store.set_retention("r", delete_after=0)
        await until(lambda: _gone(store, {"r"}), "the sweep on trio")
    finally:
        await store.aclose()
    await store.aclose()  # idempotent; the sweep task ended with the store's task group
