"""The hub sweeps expired runs by itself (``HubLimits.sweep_interval``, default 60 s; ``crdtstore
serve --sweep-interval``) in every tenant it has served, logs what it deleted, and keeps
runs that are not expired (also one that is loaded and being written while it sweeps)."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest

from crdtstore import InvalidValue, open_store
from sync import HubLimits
from tests._wait import until
from tests.network.test_sync_hub import Peer, peer_at, running_hub, token

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the hub runs on asyncio (websockets)


def test_hub_limits_sweep_interval() -> None:
    assert HubLimits().sweep_interval == 60.0
    assert HubLimits(sweep_interval=None).sweep_interval is None
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(InvalidValue):
            HubLimits(sweep_interval=bad)


async def test_the_hub_sweeps_expired_runs_and_logs_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sync.hub.retention")
    async with running_hub(tmp_path, sweep_interval=0.05, store_linger=0) as hub:
        for run in ("old", "live"):
            url = hub.url(token("a", tenant="t1", run=run), tenant="t1", run=run)
            async with peer_at(url, Peer()) as p:
                await p.set("k", run)
                await p.flush()
        live_url = hub.url(token("b", tenant="t1", run="live"), tenant="t1", run="live")
        async with peer_at(live_url, Peer()) as writer:  # loaded and written during sweeps
            async with open_store(hub.store_url, tenant="t1") as store:
                await store.set_retention("old", delete_after=0)
                await store.set_retention("live", delete_after=3600)
                for i in range(20):
                    await writer.set(f"w{i}", i)
                    await anyio.sleep(0.005)  # spread the writes over several sweeps
                await writer.flush()
                await until(
                    lambda: any(
                        "deleted run t1/old" in r.getMessage() and getattr(r, "run", "") == "old"
                        for r in caplog.records
                    ),
                    "the hub's sweep to delete and log the expired run",
                )
                assert {r.run for r in await store.runs()} == {"live"}
                async with store.open_record(run="live", agent="r", create=False) as rec:
                    notes = rec.map("notes").to_dict()
                    assert notes == {"k": "live", **{f"w{i}": i for i in range(20)}}


async def test_the_hub_sweeps_a_tenant_no_client_has_opened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run of a tenant that no client opened since the hub started expires too: the sweep
    asks the backend for every tenant (JournalBackend.tenants), not only those it served."""
    caplog.set_level(logging.INFO, logger="sync.hub.retention")
    async with running_hub(tmp_path, sweep_interval=0.05, store_linger=0) as hub:
        async with open_store(hub.store_url, tenant="quiet") as store:
            for run in ("old", "kept"):
                async with store.open_record(run=run, agent="a") as rec:
                    await rec.map("m").set("k", run)
            await store.set_retention("old", delete_after=0)
            await until(
                lambda: any("deleted run quiet/old" in r.getMessage() for r in caplog.records),
                "the hub's sweep to delete the expired run of a tenant it never served",
            )
            assert [r.run for r in await store.runs()] == ["kept"]
