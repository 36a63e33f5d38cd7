"""Two redactions of one run at once (two hubs on one Redis, two processes on one SQLite
file) each rewrite the journal entries that carried their value: rewritten from the same
original bytes, the later rewrite would put back the value the earlier one blanked. A
redaction holds the run's redaction lease, so they run one after the other and neither
value survives. The two stores here stand for the two processes: before rewriting the
journal, each waits (up to a short deadline) for the other to have read it too, the
interleaving that loses a redaction without the lease."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

import crdtstore
from tests._redis import RedisServer

pytestmark = pytest.mark.anyio

SECRET_X, SECRET_Y = "X-SECRET-1357", "Y-SECRET-2468"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's client is asyncio only


@pytest.fixture(params=["sqlite", "redis"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    srv: RedisServer = request.getfixturevalue("redis_server")
    return srv.url()


def _rendezvous(store: crdtstore.Store, arrived: list[anyio.Event], me: int) -> None:
    """Make ``store``'s rewrite of the journal wait until the other store has read it too."""
    backend = store.backend
    rewrite = backend.rewrite_entries

    async def meet_then_rewrite(*args: Any, **kwargs: Any) -> Any:
        arrived[me].set()
        with anyio.move_on_after(1.0):  # (with the lease the other waits for this one)
            await arrived[1 - me].wait()
        return await rewrite(*args, **kwargs)

    backend.rewrite_entries = meet_then_rewrite  # type: ignore[method-assign]


async def test_two_redactions_at_once_both_hold(url: str) -> None:
    async with crdtstore.open_store(url) as a, crdtstore.open_store(url) as b:
        async with a.open_record(run="r", agent="w", source="tool") as rec:
            async with rec.transaction():  # one entry carries both values
                await rec.map("m").set("x", SECRET_X)
                await rec.map("m").set("y", SECRET_Y)
            await rec.map("m").set("z", "kept")
        arrived = [anyio.Event(), anyio.Event()]
        _rendezvous(a, arrived, 0)
        _rendezvous(b, arrived, 1)
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: a.redact("r", "m", "x", reason="x"))
                tg.start_soon(lambda: b.redact("r", "m", "y", reason="y"))
        for store in (a, b):
            rows = await store.backend.read(store.tenant, "r", 0)
            assert rows, "every entry stays"
            for row in rows:
                blob = row.update + json.dumps(row.effect).encode()
                assert SECRET_X.encode() not in blob and SECRET_Y.encode() not in blob
        async with crdtstore.open_store(url) as c:
            async with c.open_record(run="r", agent="reader", source="tool") as rec:
                assert rec.map("m").to_dict() == {"z": "kept"}
