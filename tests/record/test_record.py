"""The record API on the memory and SQLite stores, on asyncio and trio."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

import crdtstore
from crdtstore import (
    CollectionKindMismatch,
    InvalidName,
    InvalidValue,
    StoreClosed,
    UnknownRun,
    UnsupportedURL,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "memory://"
    return f"sqlite:///{tmp_path}/nested/dir/store.db"


async def test_map_list_text_roundtrip(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r1", agent="a1") as rec:
            m = rec.map("findings")
            await m.set("f1", {"text": "cold cache", "score": 3, "tags": ["a", "b"]})
            await m.set("n", 5)
            await m.set("x", 2.5)
            await m.update({"p": None, "q": True})
            assert m["f1"] == {"text": "cold cache", "score": 3, "tags": ["a", "b"]}
            assert m.get("n") == 5 and type(m.get("n")) is int
            assert m.get("x") == 2.5
            assert m.get("missing", "dflt") == "dflt"
            assert sorted(m.keys()) == ["f1", "n", "p", "q", "x"]
            assert await m.delete("p") is True
            assert await m.delete("p") is False
            assert "p" not in m and len(m) == 4

            lst = rec.list("log")
            await lst.append("a")
            await lst.extend(["b", "c"])
            await lst.insert(0, "z")
            await lst.delete(1)
            assert list(lst) == ["z", "b", "c"] and lst[-1] == "c"
            with pytest.raises(IndexError):
                await lst.delete(5)

            t = rec.text("notes")
            await t.edit("hello world")
            await t.edit("hello brave new world")
            await t.append("!")
            assert str(t) == "hello brave new world!"
            await rec.flush()
            expected = rec.to_dict()
        assert expected["log"] == ["z", "b", "c"]
        # resume: a new record rebuilds the same state from the journal
        async with store.open_record(run="r1", agent="a2") as again:
            assert again.to_dict() == expected
            assert again.collections() == {"findings": "map", "log": "list", "notes": "text"}


async def test_two_records_same_run_see_each_other(url: str) -> None:
    async with (
        crdtstore.open_store(url) as store,
        store.open_record(run="r", agent="a") as a,
        store.open_record(run="r", agent="b", source="tool") as b,
    ):
        await a.map("m").set("from_a", 1)
        await b.map("m").set("from_b", 2)
        await a.flush()
        await b.flush()
        with anyio.fail_after(5):
            while len(a.map("m")) < 2 or len(b.map("m")) < 2:
                await anyio.sleep(0.005)
        assert a.to_dict() == b.to_dict() == {"m": {"from_a": 1, "from_b": 2}}
        prov = a.map("m").provenance("from_b")
        assert prov is not None
        assert (prov.agent, prov.source, prov.run) == ("b", "tool", "r")
        assert prov.seq is not None and prov.seq >= 1


async def test_changes_feed_local_and_remote(url: str) -> None:
    async with (
        crdtstore.open_store(url) as store,
        store.open_record(run="r", agent="a") as a,
        store.open_record(run="r", agent="b") as b,
    ):
        seen: list[Any] = []
        stream = a.changes()  # subscribed from here on

        async def consume() -> None:
            async for change in stream:
                seen.append(change)
                if len(seen) == 2:
                    return

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await a.map("m").set("k1", 1)
            await b.map("m").set("k2", 2)
            await b.flush()
        assert [(c.collection, c.keys, c.agent, c.local) for c in seen] == [
            ("m", ("k1",), "a", True),
            ("m", ("k2",), "b", False),
        ]
        assert seen[1].seq is not None


async def test_history_and_provenance(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r", agent="a", source="model") as a:
            await a.map("m").set("k", "v1")
            await a.map("m").set("k", "v2")
            await a.map("m").delete("k")
            await a.map("m").set("k", "v3")
            await a.flush()
            hist = await a.map("m").history("k")
            assert [(h.value, h.deleted) for h in hist] == [
                ("v1", False),
                ("v2", False),
                (None, True),
                ("v3", False),
            ]
            assert [h.provenance.seq for h in hist] == [1, 2, 3, 4]
            prov = a.map("m").provenance("k")
            assert prov is not None and prov.seq == 4 and prov.agent == "a"


async def test_transaction_is_one_entry(url: str) -> None:
    async with crdtstore.open_store(url) as store, store.open_record(run="r", agent="a") as a:
        async with a.transaction():
            await a.map("m").set("x", 1)
            await a.list("l").append("x")
            await a.text("t").edit("x")
        await a.flush()
        entries = await a.journal()
        assert len(entries) == 1
        assert {op[0] for op in entries[0].effect} == {"map", "list", "text"}


async def test_bad_names_create_nothing(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        for bad in ["", "a/b", "a\\b", "..", "a..b", "x\x00", "\t", "x" * 129, " a"]:
            with pytest.raises(InvalidName):
                store.open_record(run=bad, agent="a")
            with pytest.raises(InvalidName):
                store.open_record(run="ok", agent=bad)
        async with store.open_record(run="ok", agent="a") as rec:
            for bad in ["", "a/b", "..", "__reserved"]:
                with pytest.raises(InvalidName):
                    rec.map(bad)
            with pytest.raises(InvalidName):
                await rec.map("m").set("", 1)
        assert [r.run for r in await store.runs()] == ["ok"]
        assert await store.journal("ok") == []


async def test_bad_values_write_nothing(url: str) -> None:
    async with crdtstore.open_store(url) as store, store.open_record(run="r", agent="a") as rec:
        m = rec.map("m")
        for bad in [float("nan"), float("inf"), object(), {1: "x"}, b"bytes", 2**60]:
            with pytest.raises(InvalidValue):
                await m.set("k", bad)
        await m.set("k", 1)
        with pytest.raises(CollectionKindMismatch):
            rec.list("m")
        await rec.flush()
        assert rec.to_dict() == {"m": {"k": 1}}
        assert len(await rec.journal()) == 1


async def test_unknown_run_and_urls(url: str) -> None:
    with pytest.raises(UnsupportedURL):
        crdtstore.open_store("nope://x")
    with pytest.raises(UnsupportedURL):
        crdtstore.open_store("no-scheme")
    async with crdtstore.open_store(url) as store:
        with pytest.raises(UnknownRun):
            async with store.open_record(run="ghost", agent="a", create=False):
                pass
        with pytest.raises(UnknownRun):
            await store.journal("ghost")


async def test_closed_record_refuses_writes(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        rec = store.open_record(run="r", agent="a")
        await rec.start()
        m = rec.map("m")
        await m.set("k", 1)
        await rec.aclose()
        await rec.aclose()  # idempotent
        with pytest.raises(StoreClosed):
            await m.set("k", 2)
    with pytest.raises(StoreClosed):
        store.open_record(run="r", agent="a")


async def test_compaction_keeps_state_and_provenance(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r", agent="a") as a:
            for i in range(50):
                await a.map("m").set(f"k{i % 7}", i)
                await a.list("l").append(i)
            await a.flush()
            before = a.to_dict()
            result = await store.compact("r")
            assert result.seq == 100
            # tailing keeps working across a compaction
            await a.map("m").set("after", True)
            await a.flush()
        info = await store.run_info("r")
        assert info.snapshot_seq == 100 and info.head == 101
        async with store.open_record(run="r", agent="b") as b:
            assert b.to_dict() == {**before, "m": {**before["m"], "after": True}}
            prov = b.map("m").provenance("k0")
            assert prov is not None and prov.seq == 99 and prov.agent == "a"
        await store.compact("r", drop_journal=True)
        assert [e.seq for e in await store.journal("r")] == []
        async with store.open_record(run="r", agent="c") as c:
            assert c.to_dict()["m"]["after"] is True


async def test_delete_run_removes_it(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r", agent="a") as a:
            await a.map("m").set("secret", "personal data")
        assert await store.delete_run("r") is True
        assert await store.delete_run("r") is False
        assert await store.runs() == []


async def test_own_snapshots_and_entries_are_not_held_to_max_update(url: str) -> None:
    """max_update bounds bytes from elsewhere; the store's own snapshot of a big record (1M
    distinct keys made a 17.9 MB one, over the 16 MiB default) must still open."""
    async with crdtstore.open_store(url, max_update=300) as store:
        async with store.open_record(run="r", agent="a") as rec:
            await rec.map("m").set("big", "x" * 500)  # one entry over the limit
            for i in range(50):
                await rec.map("m").set(f"k{i}", i)
        async with store.open_record(run="r", agent="b") as rec:
            assert rec.map("m")["big"] == "x" * 500
            assert rec.skipped == []
        result = await store.compact("r")
        assert result.snapshot_bytes > 300
        async with store.open_record(run="r", agent="c") as rec:
            assert len(rec.map("m")) == 51
            with pytest.raises(crdtstore.PayloadTooLarge):
                await rec.apply_update(b"\x00" * 400)
