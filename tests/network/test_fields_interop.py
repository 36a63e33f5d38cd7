"""A plain Yjs client (``yjs`` + ``y-websocket`` in Node.js, ``tests/interop/client.mjs``) and
a merge="fields" map: it sees each field as a flat key ``<key>\\x1e<field>`` of the root
``Y.Map``, and patches an entry by setting one such key; the Python record reads the merged
entry, with the JS agent as the field's provenance."""

from __future__ import annotations

import pytest

import crdtstore
from crdtstore import CollectionSpec, FieldMap, StaleVersion
from tests._wait import until
from tests.network.test_interop import RUN, TENANT, RunningHub, hub, js_client, token

__all__ = ["hub"]  # the fixture, imported to be used here

pytestmark = pytest.mark.anyio

SCHEMA = {"findings": CollectionSpec(kind="map", merge="fields")}


async def test_a_plain_yjs_client_reads_and_patches_fields(hub: RunningHub) -> None:
    async with (
        crdtstore.open_store(hub.store_url, tenant=TENANT) as store,
        store.open_record(RUN, "py", "tool", schema=SCHEMA) as rec,
        js_client(hub, token("js-1")) as js,
    ):
        m = rec.map("findings")
        assert isinstance(m, FieldMap)
        await m.patch("f1", {"title": "leak", "status": "new"})
        await rec.flush()
        flat = {"findings": {"f1\x1etitle": "leak", "f1\x1estatus": "new"}}
        await js.cmd("wait-for", state=flat)
        # the JS client patches one field, the Python record another, at once
        await js.cmd("map.set", name="findings", key="f1\x1enotes", value=["from js"])
        await m.patch("f1", {"status": "confirmed"})
        await rec.flush()
        want = {"title": "leak", "status": "confirmed", "notes": ["from js"]}
        await until(lambda: m.get("f1") == want)
        prov = m.provenance("f1", "notes")
        assert prov is not None and prov.agent == "js-1"
        await js.cmd(
            "wait-for",
            state={"findings": {f"f1\x1e{f}": v for f, v in want.items()}},
        )


async def test_guarded_patches_through_the_ws_store(hub: RunningHub) -> None:
    """``based_on`` and a one-field ``expected_version`` on patches of ``ws://`` records:
    decided at the hub."""
    url = hub.server
    async with (
        crdtstore.open_store(url, token=token("w1")) as s1,
        crdtstore.open_store(url, token=token("w2")) as s2,
        s1.open_record(RUN, "w1", schema=SCHEMA) as a,
        s2.open_record(RUN, "w2", schema=SCHEMA) as b,
    ):
        await a.map("findings").patch("f", {"x": 1, "y": 1})
        await a.flush()
        await b.sync()
        seen = b.current_version("findings")
        await b.map("findings").patch("f", {"y": 2}, based_on=seen)
        stale = a.current_version("findings")
        await b.map("findings").patch("f", {"z": 3})
        await b.flush()
        with pytest.raises(StaleVersion):
            await a.map("findings").patch("f", {"x": 5, "w": 0}, based_on=stale)
        await a.sync()
        want = {"x": 1, "y": 2, "z": 3}
        assert a.map("findings")["f"] == want
        await until(lambda: b.map("findings").get("f") == want)
        prov = a.map("findings").provenance("f", "y")
        assert prov is not None and prov.agent == "w2"
        ma, mb = a.map("findings"), b.map("findings")
        assert isinstance(ma, FieldMap) and isinstance(mb, FieldMap)
        _, version = ma.get_versioned("f", "x")
        await until(lambda: mb.get_versioned("f", "x")[1] == version)
        await mb.patch("f", {"x": 7}, expected_version=version)
        with pytest.raises(StaleVersion):
            await ma.patch("f", {"x": 8}, expected_version=version)
        await a.sync()
        assert ma["f"]["x"] == 7
