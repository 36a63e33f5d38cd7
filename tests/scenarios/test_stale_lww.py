"""Failure mode 3, stale-lww: last-writer-wins keeps a stale value because the writer with
the stale value happened to finish second."""

from __future__ import annotations

import pytest

import crdtstore
from crdtstore import CollectionSpec, Conflict, StaleVersion, tree_merge

pytestmark = pytest.mark.anyio


async def test_keep_all_keeps_the_correction_as_a_sibling() -> None:
    schema = {"facts": CollectionSpec(kind="map", conflict="keep_all")}
    async with (
        crdtstore.open_store("memory://") as s1,
        crdtstore.open_store("memory://") as s2,
        s1.open_record(run="r", agent="fact-checker", schema=schema) as checker,
        s2.open_record(run="r", agent="slow-agent", schema=schema) as slow,
    ):
        # the checker corrects the value; the slow agent, working from the old state,
        # finishes second and writes the stale value
        await checker.map("facts").set("population", 8_100_000)
        await slow.map("facts").set("population", 7_900_000)
        await checker.flush()
        await slow.flush()
        for src, dst in ((s1, slow), (s2, checker)):
            updates = [e.update for e in await src.journal("r")]
            await dst.apply_update(tree_merge(updates))
        for rec in (checker, slow):
            got = rec.map("facts").get("population")
            assert isinstance(got, Conflict), "the correction must not be silently lost"
            assert sorted(got.values) == [7_900_000, 8_100_000]


async def test_guarded_refuses_the_stale_write() -> None:
    schema = {"facts": CollectionSpec(kind="map", policy="guarded")}
    async with crdtstore.open_store("memory://") as store:
        async with (
            store.open_record(run="r", agent="fact-checker", schema=schema) as checker,
            store.open_record(run="r", agent="slow-agent", schema=schema) as slow,
        ):
            await checker.map("facts").set("population", 7_900_000, expected_version=0)
            await slow.sync()
            _, seen = slow.map("facts").get_versioned("population")  # slow reads...
            _, v = checker.map("facts").get_versioned("population")
            await checker.map("facts").set("population", 8_100_000, expected_version=v)
            with pytest.raises(StaleVersion) as err:  # ...and finishes second
                await slow.map("facts").set("population", 7_900_000, expected_version=seen)
            assert err.value.current_value == 8_100_000
            await slow.sync()
            assert slow.map("facts")["population"] == 8_100_000
            # under plain lww the stale value would have won, but its loss is on record
            history = await checker.history("facts", "population")
            assert [h.value for h in history] == [7_900_000, 8_100_000]
