"""A counter read and added to by a real JavaScript Yjs client (y-websocket, ``client.mjs``)
through the hub: it sees a ``Y.Map`` of numbers whose sum is the counter's value, and counts
by setting a key of its own to its running total (issue 19 part 2). The Python side runs
on both anyio backends (the hub runs on asyncio in a thread of its own)."""

from __future__ import annotations

import pytest

from crdtstore import CollectionSpec
from tests._wait import until
from tests.network.test_interop import RunningHub, js_client, py_record, token
from tests.network.test_interop import hub as hub  # the fixture: a real hub in a thread

pytestmark = pytest.mark.anyio


async def test_a_js_yjs_client_reads_and_adds_to_a_counter(hub: RunningHub) -> None:
    async with py_record(hub) as rec, js_client(hub, token("js-1")) as js:
        await rec.declare("tokens", CollectionSpec(kind="counter"))
        c = rec.counter("tokens")
        await c.add(5)
        await c.add(2)
        await rec.flush()
        await js.cmd("wait-for", state={"tokens": {f"py\x1f{rec.replica.client_id}": 7}})
        await js.cmd("map.set", name="tokens", key="js-1\x1f1", value=4)
        await until(lambda: c.value == 11, "the JS client's add to count")
        assert c.contributions() == {"js-1": 4, "py": 7}
        assert type(c.value) is int
        await js.cmd("map.set", name="tokens", key="js-1\x1f1", value=10)  # its running total
        await until(lambda: c.value == 17, "the JS client's second add")
