"""Counter keys have owners (issue 19 part 2): each key of a counter belongs to the agent it
names (``<agent>\\x1f<client id>``, a plain client's ``<agent>``), as a map entry belongs to
its creator under the ``owner`` policy. Another agent's write of a key (which could undo what
its owner added) gets the map's typed refusal and writes nothing, budgeted or not, created
or overwritten; the owner's own writes, lowering included, still pass. Declaring a counter
with the owner policy, or passing an option ``CollectionSpec`` does not have
(``owner=...``), is refused at once with a typed error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pycrdt
import pytest

import crdtstore
from crdtstore import CollectionSpec, InvalidValue, PolicyViolation, Writer

pytestmark = pytest.mark.anyio

MALLORY = Writer(agent="mallory", source="tool")


def _update(rec: crdtstore.Record, change: Callable[[pycrdt.Map[Any]], None]) -> bytes:
    """An update made by another Yjs document that has the record's state."""
    doc: pycrdt.Doc[Any] = pycrdt.Doc()
    doc.apply_update(rec.replica.doc.get_update())
    before = doc.get_state()
    change(doc.get("n", type=pycrdt.Map))
    return doc.get_update(before)


@pytest.mark.parametrize("max_value", [None, 100])
async def test_another_agents_key_is_refused_as_on_an_owned_map(max_value: int | None) -> None:
    schema = {
        "n": CollectionSpec(kind="counter", max_value=max_value),
        "m": CollectionSpec(kind="map", policy="owner"),
    }
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="alice", schema=schema) as rec:
            c = rec.counter("n")
            await c.add(5)
            await rec.map("m").set("k", 1)
            await rec.flush()
            (key,) = c.entries()
            head = (await store.run_info("r")).head
            with pytest.raises(PolicyViolation) as on_map:
                await rec.apply_update(
                    _map_update(rec, "m", "k", 2), writer=MALLORY
                )  # the map's refusal, for comparison
            for change in (
                lambda m: m.__setitem__(key, 0),  # undo alice's adds
                lambda m: m.__setitem__(key, 50),
                lambda m: m.__setitem__("alice\x1f1", 9),  # a new key in alice's name
                lambda m: m.__setitem__("alice", 9),
            ):
                with pytest.raises(PolicyViolation) as refused:
                    await rec.apply_update(_update(rec, change), writer=MALLORY)
                err = refused.value
                assert (err.policy, err.agent, err.collection) == ("owner", "mallory", "n")
                assert err.code == on_map.value.code == "POLICY_VIOLATION"
                assert err.reason == "the entry belongs to 'alice'"
                assert type(err) is type(on_map.value) and on_map.value.policy == "owner"
            assert c.value == 5 and c.contributions() == {"alice": 5}
            await rec.flush()
            assert (await store.run_info("r")).head == head  # nothing written

            # mallory's own key passes, and so does lowering it
            for total in (3, 1):
                upd = _update(rec, lambda m, t=total: m.__setitem__("mallory\x1f7", t))
                await rec.apply_update(upd, writer=MALLORY)
            assert c.value == 6 and c.contributions() == {"alice": 5, "mallory": 1}
            await c.add(-2)  # alice's own lowering
            assert c.value == 4


def _map_update(rec: crdtstore.Record, name: str, key: str, value: Any) -> bytes:
    doc: pycrdt.Doc[Any] = pycrdt.Doc()
    doc.apply_update(rec.replica.doc.get_update())
    before = doc.get_state()
    doc.get(name, type=pycrdt.Map)[key] = value
    return doc.get_update(before)


async def test_a_record_of_another_agent_reads_every_contribution(tmp_path: Any) -> None:
    """The rule refuses writes, not the merge: each agent's adds (over SQLite, two store
    objects) still arrive everywhere, each under its own key."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with crdtstore.open_store(url) as s1, crdtstore.open_store(url) as s2:
        async with (
            s1.open_record(run="r", agent="alice") as a,
            s2.open_record(run="r", agent="bob") as b,
        ):
            await a.counter("n").add(2)
            await b.counter("n").add(3)
            await a.flush()
            await b.flush()
            await a.sync()
            await b.sync()
            for rec in (a, b):
                assert rec.counter("n").contributions() == {"alice": 2, "bob": 3}


async def test_owner_policy_and_unknown_options_are_refused_at_declaration() -> None:
    with pytest.raises(InvalidValue, match=r"has no option owner .*policy='owner'"):
        CollectionSpec(kind="counter", owner="alice")  # type: ignore[call-arg]
    with pytest.raises(InvalidValue, match="has no option max_entires"):
        CollectionSpec(kind="map", max_entires=3)  # type: ignore[call-arg]
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="alice") as rec:
            with pytest.raises(InvalidValue, match="always applies the owner rule") as err:
                await rec.declare("n", CollectionSpec(kind="counter", policy="owner"))
            assert err.value.code == "INVALID_VALUE"
            assert rec.spec("n") is None and await store.journal("r") == []
            with pytest.raises(InvalidValue):
                async with store.open_record(
                    run="r2",
                    agent="a",
                    schema={"n": CollectionSpec(kind="counter", policy="owner")},
                ):
                    pass
            await rec.declare("m", CollectionSpec(kind="map", policy="owner"))  # maps take it
            assert rec.spec("m") == CollectionSpec(kind="map", policy="owner")
