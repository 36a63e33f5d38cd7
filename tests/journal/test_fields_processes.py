"""Four agent processes patch different fields of the same 50 entries at once, through one
SQLite store and through a hub process (``ws://``): every field is present everywhere, the
field all of them patch agrees everywhere, and provenance names each field's writer."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import crdtstore
from crdtstore import FieldMap
from tests.network.test_sync_processes import DEADLINE, RUN, TENANT, PyAgent, fleet, token, wait_all

pytestmark = pytest.mark.anyio

HERE = Path(__file__).resolve().parents[1]
AGENT = HERE / "_fields_agent_proc.py"
AGENTS = ["w0", "w1", "w2", "w3"]
N = 50


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the processes run on asyncio; the hub fleet needs it


def check(results: list[dict[str, Any]]) -> dict[str, Any]:
    fields = {f"f_{a}" for a in AGENTS}
    state = results[0]["state"]
    for r in results:
        assert r["state"] == state, "processes diverged"
        assert r["provenance"] == results[0]["provenance"], "provenance diverged"
    assert sorted(state) == sorted(f"e{i}" for i in range(N))
    for i in range(N):
        entry = state[f"e{i}"]
        assert set(entry) == fields | {"last"}, f"e{i} lost a field: {sorted(entry)}"
        for a in AGENTS:
            assert entry[f"f_{a}"] == f"{a}:{i}"
            assert results[0]["provenance"][f"e{i}.f_{a}"] == a
        assert entry["last"] in AGENTS
        assert results[0]["provenance"][f"e{i}.last"] == entry["last"]
    return dict(state)


async def run_agents(tmp_path: Path, url: str, *, hub: bool) -> dict[str, Any]:
    async with fleet(tmp_path, "asyncio") as f:
        if hub:
            h = await f.hub()
            url = f"ws://127.0.0.1:{h.port}/{TENANT}"
        expect = ",".join(f"f_{a}" for a in AGENTS)
        procs: list[PyAgent] = []
        for a in AGENTS:
            argv = [sys.executable, str(AGENT), url, RUN, a, "--field", f"f_{a}"]
            argv += ["--expect", expect, "--n", str(N), "--deadline", str(DEADLINE)]
            if hub:
                argv += ["--token", token(a)]
            procs.append(await f._spawn(PyAgent, a, argv))
        await wait_all(procs, lambda p: p.has("READY"), "READY")
        for p in procs:  # everyone creates the same entries at once
            await p.send("go")
        await wait_all(procs, lambda p: p.has("OK"), "every field seen")
        return check([p.ok() for p in procs])


async def check_store(store_url: str, state: dict[str, Any], tenant: str | None) -> None:
    options = {} if tenant is None else {"tenant": tenant}
    async with crdtstore.open_store(store_url, **options) as store:
        async with store.open_record(RUN, "checker", create=False) as rec:
            m = rec.map("m")
            assert isinstance(m, FieldMap)
            assert m.to_json() == state
            prov = m.provenance("e7", "f_w2")
            assert prov is not None and prov.agent == "w2"
            history = await m.history("e7", "last")
            assert sorted(h.provenance.agent for h in history) == AGENTS


async def test_four_processes_patch_fields_through_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'direct.db'}"
    state = await run_agents(tmp_path, url, hub=False)
    await check_store(url, state, None)


async def test_four_processes_patch_fields_through_the_hub(tmp_path: Path) -> None:
    state = await run_agents(tmp_path, "", hub=True)
    await check_store(f"sqlite:///{tmp_path / 'store.db'}", state, TENANT)
