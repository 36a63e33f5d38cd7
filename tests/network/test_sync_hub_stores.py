"""The hub's tenant stores (``Hub._store``, ``Hub._unstore``, ``HubLimits.store_linger``).

A tenant's store (three SQLite connections, a lease connection and a notification socket:
some 9 file descriptors) is open while a run of the tenant is loaded, and closed
``store_linger`` seconds after the last one is unloaded. Before, every tenant ever seen kept
its store until the hub stopped: a hub under the usual soft limit of 1,024 descriptors
stopped accepting after about a hundred tenants, for good.

- A store stays open while any run of its tenant is loaded, closes when the last one is
  unloaded (linger 0), and the hub's descriptors come back to where they were.
- A store lingering unused is reused by the next run of its tenant (same object), and closed
  once the linger passes.
- Property (hypothesis): random connects and disconnects over 3 tenants and 2 runs each,
  with linger 0 or a few ms: after every step settles, a tenant's store is open exactly when
  one of its runs is loaded; every write made through any connection is in the journal.
- A real hub process (``python -m sync --store-linger 0``) under a soft limit of 128 file
  descriptors serves 60 tenants one after the other, each writing through a ``ws://``
  client; every write is journaled. With the stores kept open (``--store-linger 3600``, the
  old behaviour) the same run fails: the hub runs out of descriptors.

No sleeps to wait for sync: every wait is on a condition under a deadline.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from crdtstore import InvalidValue, open_store
from crdtstore.cli import app
from sync import HubLimits, TokenClaims, mint
from tests.network.test_sync_hub import DEADLINE, RUN, Peer, peer_at, running_hub, token
from tests.network.test_sync_processes import SECRET as PROCESS_SECRET
from tests.network.test_sync_processes import HubProc, fleet

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the hub runs on asyncio (websockets)


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def settled(hub: Any, predicate: Any) -> None:
    with anyio.fail_after(DEADLINE):
        await hub.wait_until(predicate)


async def test_a_tenant_store_is_open_while_a_run_of_it_is_loaded(tmp_path: Path) -> None:
    async with running_hub(tmp_path, store_linger=0) as hub:
        baseline = fds()
        url1 = hub.url(token("a", tenant="t1", run="r1"), tenant="t1", run="r1")
        url2 = hub.url(token("b", tenant="t1", run="r2"), tenant="t1", run="r2")
        async with peer_at(url1, Peer()) as p1:
            await p1.set("k", 1)
            async with peer_at(url2, Peer()):
                assert hub.hub.open_tenants() == {"t1": 2}
            await settled(hub.hub, lambda h: h.open_tenants() == {"t1": 1})
            await p1.flush()
        await settled(hub.hub, lambda h: not h.open_tenants())
        assert fds() <= baseline  # the store's connections and socket are closed
        async with open_store(hub.store_url, tenant="t1") as store:
            assert [e.agent for e in await store.journal("r1")] == ["a"]


async def test_a_lingering_store_is_reused_then_closed(tmp_path: Path) -> None:
    async with running_hub(tmp_path, store_linger=0.3) as hub:
        url = hub.url(token("a", tenant="t1", run="r1"), tenant="t1", run="r1")
        async with peer_at(url, Peer()):
            store = hub.hub._stores["t1"].store
        await settled(hub.hub, lambda h: not h.loaded_runs())
        assert hub.hub.open_tenants() == {"t1": 0}  # lingering
        async with peer_at(url, Peer()):
            assert hub.hub._stores["t1"].store is store  # reused, not reopened
        await settled(hub.hub, lambda h: not h.open_tenants())  # closed after the linger


def test_store_linger_must_be_finite_and_not_negative(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(InvalidValue, match="store_linger"):
            HubLimits(store_linger=bad)
    assert HubLimits().store_linger == 5.0
    monkeypatch.setenv("CRDTSTORE_SECRET", "linger-test-secret-0123456789")
    store = tmp_path / "s.db"
    result = CliRunner().invoke(
        app, ["serve", "--store", f"sqlite:///{store}", "--store-linger", "-1"]
    )
    assert result.exit_code == 1
    assert "store_linger" in result.output
    assert not store.exists()  # refused before the store is opened


STEPS = st.lists(
    st.tuples(st.booleans(), st.sampled_from(["t0", "t1", "t2"]), st.sampled_from(["r0", "r1"])),
    min_size=1,
    max_size=14,
)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=STEPS, linger=st.sampled_from([0.0, 0.005]))
def test_stores_follow_loaded_runs_under_random_connects_and_disconnects(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[bool, str, str]], linger: float
) -> None:
    tmp = tmp_path_factory.mktemp("stores")

    async def main() -> None:
        written: dict[tuple[str, str], set[str]] = {}
        async with running_hub(tmp, store_linger=linger) as hub, anyio.create_task_group() as tg:
            open_conns: list[tuple[str, str, anyio.Event, anyio.Event]] = []

            async def connection(
                tenant: str, run: str, key: str, leave: anyio.Event, ready: anyio.Event
            ) -> None:
                url = hub.url(token(key, tenant=tenant, run=run), tenant=tenant, run=run)
                async with peer_at(url, Peer()) as peer:
                    await peer.set(key, key)
                    await peer.flush()
                    written.setdefault((tenant, run), set()).add(key)
                    ready.set()
                    await leave.wait()

            for i, (connect, tenant, run) in enumerate(steps):
                if connect or not open_conns:
                    leave, ready = anyio.Event(), anyio.Event()
                    tg.start_soon(connection, tenant, run, f"w{i}", leave, ready)
                    with anyio.fail_after(DEADLINE):
                        await ready.wait()
                    open_conns.append((tenant, run, leave, ready))
                else:
                    _, _, leave, _ = open_conns.pop(i % len(open_conns))
                    leave.set()
                loaded = {(t, r) for t, r, _, _ in open_conns}
                tenants = {t for t, _ in loaded}
                await settled(
                    hub.hub,
                    lambda h, loaded=loaded, tenants=tenants: (
                        set(h.loaded_runs()) == loaded and set(h.open_tenants()) == tenants
                    ),
                )
                assert all(n > 0 for n in hub.hub.open_tenants().values())
            for _, _, leave, _ in open_conns:
                leave.set()
            await settled(hub.hub, lambda h: not h.open_tenants())
        for (tenant, run), keys in written.items():
            async with open_store(f"sqlite:///{tmp / 'store.db'}", tenant=tenant) as store:
                got = {k for e in await store.journal(run) for k in _keys(e)}
                assert keys <= got

    anyio.run(main)


def _keys(entry: Any) -> set[str]:
    return {op[3] for op in entry.effect if op[:3] == ["map", "notes", "set"]}


# ``python -m sync`` under a limit of 128 file descriptors (soft and hard: it cannot raise it)
_LIMITED_HUB = (
    "import resource as r, runpy, sys; "
    "r.setrlimit(r.RLIMIT_NOFILE, (128, 128)); "
    "sys.argv = ['sync', *sys.argv[1:]]; "
    "runpy.run_module('sync', run_name='__main__', alter_sys=True)"
)


def _token(tenant: str) -> str:
    claims = TokenClaims.model_validate(
        {"tenant": tenant, "run": RUN, "agent": "w", "mode": "rw", "exp": int(time.time()) + 3600}
    )
    return mint(PROCESS_SECRET.encode(), claims)


@pytest.mark.parametrize(("linger", "expect_ok"), [("0", True), ("3600", False)])
async def test_a_hub_under_128_descriptors_serves_60_tenants_in_turn(
    tmp_path: Path, linger: str, expect_ok: bool
) -> None:
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    env = {**os.environ, "CRDTSTORE_SECRET": PROCESS_SECRET}
    argv = [sys.executable, "-c", _LIMITED_HUB, "--store", store_url, "--port", "0"]
    argv += ["--store-linger", linger]
    async with fleet(tmp_path, "asyncio") as f:
        hub = await f._spawn(HubProc, "hub", argv, env=env, stdin=subprocess.DEVNULL)
        await hub.wait(lambda: hub.port is not None, "hub listening")
        failures = 0
        for i in range(60):
            tenant = f"tenant{i}"
            try:
                with anyio.fail_after(10):
                    async with (
                        open_store(
                            f"ws://127.0.0.1:{hub.port}/{tenant}",
                            token=_token(tenant),
                            connect_timeout=5.0,
                        ) as store,
                        store.open_record(RUN, "ignored") as rec,
                    ):
                        await rec.map("m").set("k", i)
                        await rec.flush()
            except Exception:
                failures += 1
                if not expect_ok:
                    break
        if expect_ok:
            assert failures == 0
            for i in range(0, 60, 7):
                async with open_store(store_url, tenant=f"tenant{i}") as store:
                    assert [e.agent for e in await store.journal(RUN)] == ["w"]
        else:
            assert failures > 0  # the old behaviour: out of descriptors
            assert any("Too many open files" in line for line in hub.stderr)
        await f.kill_all()


async def test_the_hub_process_raises_its_soft_open_files_limit(tmp_path: Path) -> None:
    """``crdtstore serve`` raises the soft limit towards the hard one (the usual soft 1,024 is
    far below what a hub may hold); a library user's process is left alone."""
    argv = [sys.executable, "-c", _LIMITED_HUB.replace("(128, 128)", "(256, 4096)")]
    argv += ["--store", f"sqlite:///{tmp_path / 'store.db'}", "--port", "0"]
    env = {**os.environ, "CRDTSTORE_SECRET": PROCESS_SECRET}
    async with fleet(tmp_path, "asyncio") as f:
        hub = await f._spawn(HubProc, "hub", argv, env=env, stdin=subprocess.DEVNULL)
        await hub.wait(lambda: hub.port is not None, "hub listening")
        limits = Path(f"/proc/{hub.process.pid}/limits").read_text()
        line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
        assert line.split()[3:5] == ["4096", "4096"]
        assert any("open files limit: 4096" in x for x in hub.stderr)
        await f.kill_all()
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    async with running_hub(tmp_path / "lib"):
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == before
