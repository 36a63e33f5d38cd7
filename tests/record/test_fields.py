"""Per-field merge of map entries (``CollectionSpec(kind="map", merge="fields")``)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import crdtstore
from crdtstore import (
    DELETE,
    CollectionSpec,
    Conflict,
    FieldMap,
    InvalidName,
    InvalidValue,
    PolicyViolation,
    SchemaInvalid,
    StaleVersion,
    tree_merge,
)

pytestmark = pytest.mark.anyio

SCHEMA = {"findings": CollectionSpec(kind="map", merge="fields")}
KEEP = {"findings": CollectionSpec(kind="map", merge="fields", conflict="keep_all")}


class Finding(BaseModel):
    title: str
    status: str = "open"
    notes: list[str] = []


async def deliver(src: crdtstore.Store, dst: crdtstore.Record, rng: random.Random) -> None:
    """``src``'s journal into ``dst``: shuffled, duplicated, in merged random batches."""
    updates = [e.update for e in await src.journal("r", limit=100_000)]
    updates = updates + rng.sample(updates, k=len(updates) // 2)
    rng.shuffle(updates)
    while updates:
        n = rng.randint(1, len(updates))
        batch, updates = updates[:n], updates[n:]
        await dst.apply_update(tree_merge(batch))


async def test_concurrent_patches_of_different_fields_both_survive(tmp_path: Path) -> None:
    async with crdtstore.open_store(f"sqlite:///{tmp_path}/s.db") as store:
        async with (
            store.open_record(run="r", agent="alice", schema=SCHEMA) as a,
            store.open_record(run="r", agent="bob", schema=SCHEMA) as b,
        ):
            await a.map("findings").set("f1", {"title": "leak", "status": "new"})
            await a.flush()
            await b.sync()
            # concurrently: neither has seen the other's patch
            await a.map("findings").patch("f1", {"status": "confirmed"})
            await b.map("findings").patch("f1", {"notes": ["seen in prod"]})
            await a.flush()
            await b.flush()
            await a.sync()
            await b.sync()
            want = {"title": "leak", "status": "confirmed", "notes": ["seen in prod"]}
            assert a.map("findings").get("f1") == want
            assert b.map("findings").get("f1") == want
            assert a.to_dict() == b.to_dict() == {"findings": {"f1": want}}
            m = b.map("findings")
            assert isinstance(m, FieldMap)
            prov = m.provenance("f1", "status")
            assert prov is not None and prov.agent == "alice"
            prov = m.provenance("f1", "notes")
            assert prov is not None and prov.agent == "bob"
            hist = await m.history("f1", "status")
            assert [h.value for h in hist] == ["new", "confirmed"]
            assert [h.provenance.agent for h in await m.history("f1", "notes")] == ["bob"]
            # the plain Yjs form: one flat key per field
            raw = b.replica.to_dict()["findings"]
            assert raw["f1\x1estatus"] == "confirmed"
            assert raw["f1\x1enotes"] == ["seen in prod"]


async def test_whole_value_sets_merge_by_field_too() -> None:
    """Two writers ``set`` the whole entry from the same stale copy, each changing one field:
    only the changed fields are written, so both changes survive."""
    async with (
        crdtstore.open_store("memory://") as s1,
        crdtstore.open_store("memory://") as s2,
        s1.open_record(run="r", agent="a", schema=SCHEMA) as a,
        s2.open_record(run="r", agent="b", schema=SCHEMA) as b,
    ):
        rng = random.Random(3)
        await a.map("findings").set("f", {"title": "t", "status": "new", "owner": "x"})
        await a.flush()
        await deliver(s1, b, rng)
        base = dict(b.map("findings")["f"])
        await a.map("findings").set("f", {**base, "status": "done"})
        await b.map("findings").set("f", {**base, "notes": ["n"]})
        await a.flush()
        await b.flush()
        await deliver(s2, a, rng)
        await deliver(s1, b, rng)
        want = {"title": "t", "status": "done", "owner": "x", "notes": ["n"]}
        assert a.map("findings")["f"] == b.map("findings")["f"] == want
        # a set that drops a field deletes it
        await a.map("findings").set("f", {"title": "t"})
        assert a.map("findings")["f"] == {"title": "t"}


async def test_same_field_lww_keeps_the_loser_in_history() -> None:
    async with (
        crdtstore.open_store("memory://") as s1,
        crdtstore.open_store("memory://") as s2,
        s1.open_record(run="r", agent="a", schema=SCHEMA) as a,
        s2.open_record(run="r", agent="b", schema=SCHEMA) as b,
    ):
        rng = random.Random(5)
        await a.map("findings").patch("f", {"status": "A"})
        await b.map("findings").patch("f", {"status": "B"})
        await a.flush()
        await b.flush()
        await deliver(s2, a, rng)
        await deliver(s1, b, rng)
        won = a.map("findings")["f"]["status"]
        assert won == b.map("findings")["f"]["status"]
        await a.flush()
        values = {h.value for h in await a.map("findings").history("f", "status")}
        assert values == {"A", "B"}


async def test_keep_all_fields_keep_concurrent_siblings() -> None:
    async with (
        crdtstore.open_store("memory://") as s1,
        crdtstore.open_store("memory://") as s2,
        s1.open_record(run="r", agent="a", schema=KEEP) as a,
        s2.open_record(run="r", agent="b", schema=KEEP) as b,
    ):
        rng = random.Random(7)
        await a.map("findings").patch("f", {"status": "A", "title": "t"})
        await b.map("findings").patch("f", {"status": "B", "notes": []})
        await a.flush()
        await b.flush()
        await deliver(s2, a, rng)
        await deliver(s1, b, rng)
        for rec in (a, b):
            entry = rec.map("findings")["f"]
            assert entry["title"] == "t" and entry["notes"] == []
            assert isinstance(entry["status"], Conflict)
            assert sorted(entry["status"].values) == ["A", "B"]
        assert a.to_dict() == b.to_dict()
        assert "__conflict__" in a.to_dict()["findings"]["f"]["status"]
        # a later patch that saw both resolves them
        await a.map("findings").patch("f", {"status": "A"})
        assert a.map("findings")["f"] == {"status": "A", "title": "t", "notes": []}
        assert [s.value for s in a.map("findings").siblings("f", "status")] == ["A"]


async def test_schema_validates_the_merged_entry() -> None:
    schema = {"findings": CollectionSpec(kind="map", merge="fields", model=Finding)}
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a", schema=schema) as rec:
            m = rec.map("findings")
            with pytest.raises(SchemaInvalid):
                await m.patch("f", {"status": "new"})  # no title: the entry would be invalid
            assert "f" not in m and rec.replica.to_dict().get("findings", {}) == {}
            await m.patch("f", {"title": "leak"})
            got = m["f"]
            assert isinstance(got, Finding) and got.status == "open"
            # only the named field is stored (defaults are not written)
            assert m.fields("f") == ["title"]
            with pytest.raises(SchemaInvalid):
                await m.patch("f", {"notes": "not a list"})
            with pytest.raises(SchemaInvalid):
                await m.patch("f", {}, remove=["title"])
            assert m["f"] == Finding(title="leak")
            await m.set("f", Finding(title="leak2", status="done"))
            assert m["f"] == Finding(title="leak2", status="done")


async def test_removing_fields_and_deleting_entries() -> None:
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a", schema=SCHEMA) as rec:
            m = rec.map("findings")
            await m.patch("f", {"a": 1, "b": 2, "c": 3})
            await m.patch("f", {"a": DELETE})
            await m.patch("f", {}, remove=["b"])
            assert m["f"] == {"c": 3}
            await m.patch("f", {}, remove=["c"])  # no field left: the entry stays, empty
            assert m["f"] == {} and "f" in m and len(m) == 1
            await m.patch("f", {"x": 1})
            assert m["f"] == {"x": 1}
            await m.set("g", {})
            assert m["g"] == {}
            assert await m.delete("f") is True
            assert await m.delete("f") is False
            assert "f" not in m and m.keys() == ["g"]
            assert rec.to_dict() == {"findings": {"g": {}}}


async def test_bad_input_is_refused_and_writes_nothing() -> None:
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a", schema=SCHEMA) as rec:
            m = rec.map("findings")
            await m.patch("f", {"a": 1})
            await rec.flush()
            before = (rec.replica.to_dict(), rec.applied_seq)
            bad: list[tuple[Any, ...]] = [
                ("f", ["a", 1]),
                ("f", "a=1"),
                ("f", {"": 1}),
                ("f", {"a\x1eb": 1}),
                ("f", {"a\x1fb": 1}),
                ("f", {3: 1}),
                ("f\x1eg", {"a": 1}),
                ("", {"a": 1}),
                ("f", {"a": float("nan")}),
                ("f", {"a": object()}),
                ("f", {"a" * 1100: 1}),
            ]
            for key, fields in bad:
                with pytest.raises((InvalidValue, InvalidName)) as info:
                    await m.patch(key, fields)
                assert info.value.code in ("INVALID_VALUE", "INVALID_NAME")
            with pytest.raises(InvalidValue):
                await m.patch("f", {"a": 2}, remove="a")  # a str, not a list of names
            with pytest.raises(InvalidValue):
                await m.patch("f", {"a": 2}, remove=["a"])
            with pytest.raises(InvalidValue):
                await m.set("f", 5)
            with pytest.raises(InvalidValue, match="based_on"):
                await m.patch("f", {"a": 2, "b": 3}, expected_version=1)
            with pytest.raises(InvalidValue, match="based_on"):
                await m.set("f", {"a": 2}, expected_version=1)
            with pytest.raises(InvalidValue, match="based_on"):
                await m.delete("f", expected_version=1)
            await rec.flush()
            assert (rec.replica.to_dict(), rec.applied_seq) == before


async def test_patch_on_an_ordinary_map_is_refused_naming_merge_fields() -> None:
    schema = {"k": CollectionSpec(kind="map", conflict="keep_all")}
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a", schema=schema) as rec:
            await rec.map("plain").set("f", {"a": 1})
            for name in ("plain", "k"):
                with pytest.raises(InvalidValue, match="merge='fields'"):
                    await rec.map(name).patch("f", {"b": 2})
            assert rec.map("plain")["f"] == {"a": 1}
            with pytest.raises(InvalidValue):
                await rec.declare("t", CollectionSpec(kind="list", merge="fields"))


async def test_based_on_and_lease_work_on_patch(tmp_path: Path) -> None:
    async with crdtstore.open_store(f"sqlite:///{tmp_path}/s.db") as store:
        async with (
            store.open_record(run="r", agent="a", schema=SCHEMA) as a,
            store.open_record(run="r", agent="b", schema=SCHEMA) as b,
        ):
            await a.map("findings").patch("f", {"x": 1})
            await a.flush()
            await b.sync()
            seen = b.current_version("findings")
            await b.map("findings").patch("f", {"y": 2}, based_on=seen)  # nothing moved
            await a.sync()
            stale = a.current_version("findings")
            await b.map("findings").patch("f", {"z": 3})
            await b.flush()
            with pytest.raises(StaleVersion):
                await a.map("findings").patch("f", {"x": 5}, based_on=stale)
            await a.sync()
            assert a.map("findings")["f"] == {"x": 1, "y": 2, "z": 3}
            lease = store.lease(["item:findings/f"], ttl=30, owner="a")
            await lease.acquire()
            await a.map("findings").patch("f", {"x": 9}, lease=lease)
            assert a.map("findings")["f"]["x"] == 9


async def test_owner_policy_applies_per_field() -> None:
    schema = {"findings": CollectionSpec(kind="map", merge="fields", policy="owner")}
    async with crdtstore.open_store("memory://") as store:
        async with (
            store.open_record(run="r", agent="a", schema=schema) as a,
            store.open_record(run="r", agent="b", schema=schema) as b,
        ):
            await a.map("findings").patch("f", {"status": "new"})
            await a.flush()
            await b.sync()
            with pytest.raises(PolicyViolation):
                await b.map("findings").patch("f", {"status": "stolen"})
            await b.map("findings").patch("f", {"notes": ["mine"]})
            assert b.map("findings")["f"] == {"status": "new", "notes": ["mine"]}


async def test_declaration_without_merge_compares_equal_to_an_old_one() -> None:
    assert "merge" not in CollectionSpec(kind="map").declaration()
    assert CollectionSpec(kind="map", merge="fields").declaration()["merge"] == "fields"


async def test_patches_inside_a_transaction_are_one_entry_and_read_back() -> None:
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a", schema=SCHEMA) as rec:
            m = rec.map("findings")
            await m.patch("f", {"a": 1})
            await rec.flush()
            before = len(await store.journal("r"))
            async with rec.transaction():
                await m.patch("f", {"b": 2})
                assert m["f"] == {"a": 1, "b": 2}
                await m.patch("f", {"a": DELETE, "c": 3})
                await m.patch("g", {"x": 1})
                assert m["f"] == {"b": 2, "c": 3} and "g" in m
            await rec.flush()
            assert len(await store.journal("r")) == before + 1
            await m.update({"h": {"y": 1}, "f": {"b": 2}})
            assert m.to_dict() == {"f": {"b": 2}, "g": {"x": 1}, "h": {"y": 1}}
            await rec.flush()
            async with store.open_record(run="r", agent="b", schema=SCHEMA) as other:
                assert other.map("findings").to_dict() == m.to_dict()


async def test_keep_all_fields_with_based_on() -> None:
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a", schema=KEEP) as rec:
            m = rec.map("findings")
            await m.patch("f", {"s": 1})
            await rec.flush()
            v = rec.current_version("findings")
            await m.patch("f", {"s": 2, "t": 1}, based_on=v)
            assert m["f"] == {"s": 2, "t": 1}
            assert len(m.siblings("f", "s")) == 1
            hist = await m.history("f", "s")
            assert [h.value for h in hist] == [2]  # keep_all: the current sibling's key


async def test_a_view_patches_only_inside_it() -> None:
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a", schema=SCHEMA) as rec:
            view = rec.view(["findings/net*"])
            await view.map("findings").patch("net1", {"status": "new"})
            with pytest.raises(PolicyViolation):
                await view.map("findings").patch("disk1", {"status": "new"})
            assert rec.map("findings").to_dict() == {"net1": {"status": "new"}}
            data = view.data()["findings"]
            assert data["net1"]["value"] == {"status": "new"}
            assert data["net1"]["provenance"]["agent"] == "a"


async def test_set_writes_a_field_whose_json_changed_even_if_python_calls_it_equal() -> None:
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a", schema=SCHEMA) as rec:
            m = rec.map("findings")
            await m.set("f", {"ok": True, "n": 5, "xs": [1, {"b": False}]})
            await m.set("f", {"ok": 1, "n": 5.0, "xs": [1, {"b": 0}]})
            assert m["f"] == {"ok": 1, "n": 5, "xs": [1, {"b": 0}]}
            assert type(m["f"]["ok"]) is int and type(m["f"]["xs"][1]["b"]) is int
            await rec.flush()
            assert [h.value for h in await m.history("f", "n")] == [5]  # unchanged: not written


async def test_expected_version_guards_a_one_field_patch(tmp_path: Path) -> None:
    async with crdtstore.open_store(f"sqlite:///{tmp_path}/s.db") as store:
        async with (
            store.open_record(run="r", agent="a", schema=SCHEMA) as a,
            store.open_record(run="r", agent="b", schema=SCHEMA) as b,
        ):
            ma, mb = a.map("findings"), b.map("findings")
            assert isinstance(ma, FieldMap) and isinstance(mb, FieldMap)
            assert ma.get_versioned("f", "status") == (None, 0)
            await ma.patch("f", {"status": "new"}, expected_version=0)  # create the field
            await mb.patch("f", {"notes": ["n"]})
            await b.flush()
            await a.sync()
            value, version = ma.get_versioned("f", "status")
            assert value == "new" and version is not None and version > 0
            await b.sync()
            # both read the same version; b's guarded patch wins, a's is refused
            await mb.patch("f", {"status": "b's"}, expected_version=version)
            with pytest.raises(StaleVersion) as info:
                await ma.patch("f", {"status": "a's"}, expected_version=version)
            assert info.value.current_value == "b's"
            # another field moving does not make the guard stale
            await mb.patch("f", {"notes": ["n", "m"]})
            await b.flush()
            await a.sync()
            _, version = ma.get_versioned("f", "status")
            await ma.patch("f", {"status": DELETE}, expected_version=version)
            await b.sync()
            assert mb["f"] == {"notes": ["n", "m"]}
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a", schema=KEEP) as rec:
            with pytest.raises(InvalidValue, match="lww"):
                await rec.map("findings").patch("f", {"s": 1}, expected_version=0)
