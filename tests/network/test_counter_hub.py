"""A counter read and added to by a plain Yjs client through the hub (issue 19 part 2).

The counter is a ``Y.Map`` of numbers in the document: a plain client (a pycrdt Doc speaking
y-protocols, as y-websocket would) sees a crdtstore writer's contribution under its key and
counts by setting a key of its own to its running total; crdtstore records count it. A
write that deletes a contribution or stores something that is not a number is refused by
the hub (the counter's rule, checked for every writer) and the counter is unchanged. Over
``ws://`` a budgeted add is decided by the hub: the budget holds exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from pycrdt import Map

from crdtstore import BudgetExceeded, CollectionSpec, open_store
from tests._wait import until
from tests.network.test_sync_client import running_hub as hub_thread
from tests.network.test_sync_client import sqlite_store, ws_record
from tests.network.test_sync_client import token as ws_token
from tests.network.test_sync_hub import REGISTRY, RUN, TENANT, Peer, peer_at, running_hub, token

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the hub runs on asyncio (websockets)


async def _write(peer: Peer, fn: Any) -> None:
    before = peer.doc.get_state()
    with peer.doc.transaction():
        registry = peer.doc.get(REGISTRY, type=Map)
        if "tokens" not in registry:
            registry["tokens"] = "map"
        fn(peer.doc.get("tokens", type=Map))
    assert peer.ws is not None
    await peer.ws.send(peer.session.update_frame(peer.doc.get_update(before)))


async def test_a_plain_yjs_client_reads_and_adds_to_a_counter(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub:
        async with open_store(hub.store_url, tenant=TENANT) as store:
            schema = {"tokens": CollectionSpec(kind="counter")}
            async with store.open_record(run=RUN, agent="py", schema=schema) as rec:
                await rec.counter("tokens").add(5)
                await rec.flush()
                url = hub.url(token("js"), tenant=TENANT, run=RUN)
                async with peer_at(url, Peer()) as peer:
                    seen = dict(peer.doc.get("tokens", type=Map).items())
                    assert sum(seen.values()) == 5  # a Y.Map of numbers
                    await _write(peer, lambda m: m.__setitem__("js\x1f1", 3))
                    await peer.flush()
                    await rec.sync()
                    assert rec.counter("tokens").value == 8
                    assert rec.counter("tokens").contributions() == {"js": 3, "py": 5}
                    await _write(peer, lambda m: m.__setitem__("js\x1f1", "lots"))
                    await until(lambda: peer.closed, "the hub to refuse a non-number")
                async with peer_at(url, Peer()) as peer:
                    await _write(peer, lambda m: m.pop("js\x1f1"))
                    await until(lambda: peer.closed, "the hub to refuse a delete")
                await rec.sync()
                assert rec.counter("tokens").value == 8


async def test_ws_records_share_a_budgeted_counter_through_the_hub(tmp_path: Path) -> None:
    """Over ``ws://`` a budgeted add is decided by the hub (a guarded write): records of two
    ``ws://`` stores and one SQLite record racing adds of 1 stop at exactly ``max_value``."""
    async with hub_thread(tmp_path) as hub:
        async with sqlite_store(hub) as store:
            schema = {"budget": CollectionSpec(kind="counter", max_value=12)}
            async with (
                store.open_record("r1", "local", schema=schema) as local,
                ws_record(hub, ws_token("w1")) as w1,
                ws_record(hub, ws_token("w2")) as w2,
            ):
                accepted = refused = 0

                async def adds(rec: Any) -> None:
                    nonlocal accepted, refused
                    for _ in range(6):
                        try:
                            await rec.counter("budget").add(1)
                            accepted += 1
                        except BudgetExceeded:
                            refused += 1

                async with anyio.create_task_group() as tg:
                    for rec in (local, w1, w2):
                        tg.start_soon(adds, rec)
                assert (accepted, refused) == (12, 6)
                for rec in (local, w1, w2):
                    await rec.sync()
                    assert rec.counter("budget").value == 12
                assert set(w1.counter("budget").contributions()) <= {"local", "w1", "w2"}
