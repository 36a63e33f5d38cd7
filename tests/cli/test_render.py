"""One renderer of records (``crdtstore._render``) behind ``crdtstore inspect`` and the
simulator's views: ``keep_all`` siblings, field-merged entries and counters show the same in
both, a live record and its replay give the same cells, and what ``inspect --json`` prints
as values is what ``rec.to_dict()`` holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

import crdtstore
from crdtstore import CollectionSpec, sim
from crdtstore.cli import app

pytestmark = pytest.mark.anyio

SCHEMA = {
    "k": CollectionSpec(kind="map", conflict="keep_all"),
    "f": CollectionSpec(kind="map", merge="fields"),
    "fk": CollectionSpec(kind="map", merge="fields", conflict="keep_all"),
    "n": CollectionSpec(kind="counter", max_value=100),
}


async def _write(store: crdtstore.Store) -> dict[str, Any]:
    """Two agents write every kind of collection, bob's keep_all writes made offline (on
    another store, applied later: concurrent with alice's, so both siblings stay); returns
    the merged record's ``to_dict()``."""
    async with (
        crdtstore.open_store("memory://") as side,
        side.open_record("r", "bob", "tool", schema=SCHEMA) as offline,
    ):
        await offline.map("k").set("q", "bob's")
        await offline.map("fk").set("e", {"x": 2})
        await offline.flush()
        updates = [e.update for e in await side.journal("r")]
    async with (
        store.open_record("r", "alice", schema=SCHEMA, durability="durable") as a,
        store.open_record("r", "bob", "tool", durability="durable") as b,
    ):
        await a.map("k").set("q", "alice's")
        await a.map("k").set("solo", 1)
        await a.map("f").set("e", {"x": 1, "y": 2})
        await a.map("fk").set("e", {"x": 1})
        await a.counter("n").add(3)
        await b.counter("n").add(4)
        await a.map("m").set("plain", [1, 2])
        await b.list("l").append("b1")
        await a.text("t").insert(0, "one\ntwo\n")
        for update in updates:
            await b.apply_update(update)
        await a.sync()
        await b.sync()
        await b.map("f").set("e", {"x": 1, "y": 3})
        await a.sync()
        return a.to_dict()


async def _write_to(url: str) -> dict[str, Any]:
    async with crdtstore.open_store(url) as store:
        return await _write(store)


def test_inspect_shows_siblings_fields_and_counters(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    state = anyio.run(_write_to, url)
    assert len(state["k"]["q"]["__conflict__"]) == 2  # (the writes were concurrent)
    runner = CliRunner()
    got = runner.invoke(app, ["inspect", url, "--run", "r", "--json"])
    assert got.exit_code == 0, got.output
    cols = json.loads(got.stdout)["collections"]
    for name in ("k", "f", "fk", "m"):
        assert cols[name]["kind"] == "map"
        assert {key: e["value"] for key, e in cols[name]["entries"].items()} == state[name]
    q = cols["k"]["entries"]["q"]
    assert sorted(s["agent"] for s in q["value"]["__conflict__"]) == ["alice", "bob"]
    newest = q["value"]["__conflict__"][-1]  # the key's provenance: its newest sibling's
    assert (q["provenance"]["agent"], q["provenance"]["source"]) == (
        newest["agent"],
        newest["source"],
    )
    assert q["provenance"]["seq"] >= 1
    assert len(state["fk"]["e"]["x"]["__conflict__"]) == 2
    assert cols["f"]["entries"]["e"]["provenance"]["agent"] == "bob"  # its newest field write
    assert cols["n"] == {
        "kind": "counter",
        "value": 7,
        "contributions": {"alice": 3, "bob": 4},
        "max_value": 100,
    }
    assert cols["l"]["items"] == ["b1"] and cols["l"]["item_provenance"][0]["agent"] == "bob"
    assert cols["t"]["text"] == "one\ntwo\n" and cols["t"]["authorship"][0]["end"] == 8
    assert json.loads(got.stdout)["agents"] == ["alice", "bob"]

    tree = runner.invoke(app, ["inspect", url, "--run", "r"], env={"COLUMNS": "200"})
    assert tree.exit_code == 0, tree.output
    sibling_rows = [line for line in tree.stdout.splitlines() if "q [2 siblings]" in line]
    assert len(sibling_rows) == 2
    assert {"alice (model)" in sibling_rows[0], "alice (model)" in sibling_rows[1]} == {True, False}
    assert any("bob (tool)" in row for row in sibling_rows)
    assert "counter = 7 of 100" in tree.stdout and '{"x": 1, "y": 3}' in tree.stdout


async def test_a_record_and_its_replay_show_the_same_cells() -> None:
    async with crdtstore.open_store("memory://") as store:
        await _write(store)
        async with store.open_record("r", "reader", create=False) as rec:
            live = sim.cells(rec)
            replayed = sim.cells(await store.replay("r"))
            assert not sim.diff(rec, await store.replay("r"))
            table = sim.record_table(rec)
    key = [(c.collection, c.kind, c.key, c.value, c.token) for c in live if c.collection != "n"]
    assert key == [
        (c.collection, c.kind, c.key, c.value, c.token) for c in replayed if c.collection != "n"
    ]
    by = {(c.collection, c.key, c.token): c for c in live}
    siblings = [c for c in live if c.collection == "k" and c.key == "q"]
    assert sorted((c.kind, c.siblings, c.agent, c.source) for c in siblings) == [
        ("keep_all", 2, "alice", "model"),
        ("keep_all", 2, "bob", "tool"),
    ]
    assert all(c.seq is not None for c in siblings)
    assert by["f", "e", None].kind == "fields" and by["f", "e", None].value == {"x": 1, "y": 3}
    assert by["l", "0", None].agent == "bob" and by["l", "0", None].seq is not None
    (text,) = (c for c in live if c.collection == "t")
    assert text.spans and text.spans[0].provenance is not None
    counter = [c for c in live if c.collection == "n"]
    assert sorted((c.kind, c.agent, c.value) for c in counter) == [
        ("counter", "alice", 3),
        ("counter", "bob", 4),
    ]
    assert "2 siblings" in str(table) and "n (counter)" in table.tree()
