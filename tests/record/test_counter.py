"""Counter collections through real records and stores (issue 19 part 2).

- Adds from several records of several store objects (as processes would) on one SQLite
  file merge: the value is the sum, ints stay ints, contributions are grouped by agent; each
  add is one journal entry (a map ``set`` of the replica's own key); a resumed record adds
  under a new key and the value survives resume and compaction (journal dropped).
- ``max_value`` is exact: two store objects racing adds of 1 against a budget of 30 end at
  exactly 30, every other add refused with ``BudgetExceeded`` and nothing written by it; on
  memory, SQLite and a real redis-server.
- Bad input: a non-number or non-finite amount, a counter declared with a policy, a model
  or entry budgets, ``max_value`` on a map, a map handle on a counter; each changes nothing.
- The blocking facade, ``crdtstore inspect`` (JSON and tree) and the agent tools' store_get
  show the value.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

import crdtstore
from crdtstore import (
    BudgetExceeded,
    CollectionKindMismatch,
    CollectionSpec,
    InvalidValue,
    blocking,
)
from crdtstore.cli import app
from tests._redis import RedisServer

pytestmark = pytest.mark.anyio


async def test_adds_from_many_records_and_stores_merge(tmp_path: Path, anyio_backend: str) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    async with crdtstore.open_store(url) as s1, crdtstore.open_store(url) as s2:
        recs = [
            await s.open_record(run="r", agent=f"agent{i % 3}").start()
            for i, s in enumerate([s1, s2, s1, s2])
        ]

        async def adds(rec: crdtstore.Record, n: int) -> None:
            for _ in range(n):
                await rec.counter("tokens_used").add(7)

        async with anyio.create_task_group() as tg:
            for i, rec in enumerate(recs):
                tg.start_soon(adds, rec, 10 + i)
        for rec in recs:
            await rec.flush()
        for rec in recs:
            await rec.sync()
            c = rec.counter("tokens_used")
            assert c.value == 7 * (10 + 11 + 12 + 13)
            assert type(c.value) is int
            assert c.contributions() == {"agent0": 7 * (10 + 13), "agent1": 7 * 11, "agent2": 84}
            assert len(c.entries()) == 4  # one key per replica
        assert recs[0].spec("tokens_used") == CollectionSpec(kind="counter")
        assert recs[0].collections() == {"tokens_used": "counter"}
        assert recs[0].to_dict() == {"tokens_used": 322}
        entries = await s1.journal("r")
        assert len(entries) == 46
        assert all(e.effect[0][:3] == ["map", "tokens_used", "set"] for e in entries)
        for rec in recs:
            await rec.aclose()

        # resume: a new record adds under a new key; the old contribution stays
        async with s1.open_record(run="r", agent="agent0") as rec:
            await rec.counter("tokens_used").add(-2)
            assert rec.counter("tokens_used").value == 320
        result = await s2.compact("r", drop_journal=True)
        assert result is not None
        async with s2.open_record(run="r", agent="agent9") as rec:
            c = rec.counter("tokens_used")
            assert c.value == 320 and c.contributions()["agent0"] == 7 * 23 - 2
            assert len(c.entries()) == 5
            await c.add(0.5)
            assert c.value == 320.5


@pytest.fixture(params=["memory", "sqlite", "redis"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://counter-{time.monotonic_ns()}"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    srv: RedisServer = request.getfixturevalue("redis_server")
    return srv.url(prefix=f"c{time.monotonic_ns()}")


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # (redis-py is asyncio only)
async def test_max_value_is_exact_across_store_objects(url: str, anyio_backend: str) -> None:
    spec = {"budget": CollectionSpec(kind="counter", max_value=30)}
    async with crdtstore.open_store(url) as s1, crdtstore.open_store(url) as s2:
        recs = [
            await s.open_record(run="r", agent=f"a{i}", schema=spec).start()
            for i, s in enumerate([s1, s2, s1, s2])
        ]
        accepted = refused = 0

        async def adds(rec: crdtstore.Record) -> None:
            nonlocal accepted, refused
            for _ in range(12):
                try:
                    await rec.counter("budget").add(1)
                    accepted += 1
                except BudgetExceeded as exc:
                    assert exc.code == "BUDGET_EXCEEDED" and exc.limit == 30
                    refused += 1

        async with anyio.create_task_group() as tg:
            for rec in recs:
                tg.start_soon(adds, rec)
        assert (accepted, refused) == (30, 18)
        for rec in recs:
            await rec.sync()
            assert rec.counter("budget").value == 30
        head = (await s1.run_info("r")).head
        with pytest.raises(BudgetExceeded):
            await recs[0].counter("budget").add(0.5)
        await recs[0].counter("budget").add(-3)  # lowering is always allowed
        assert recs[0].counter("budget").value == 27
        assert (await s1.run_info("r")).head == head + 1  # the refusal wrote nothing
        for rec in recs:
            await rec.aclose()


async def test_bad_input_changes_nothing(anyio_backend: str) -> None:
    async with crdtstore.open_store(f"memory://bad-{time.monotonic_ns()}") as store:
        async with store.open_record(run="r", agent="a") as rec:
            c = rec.counter("n")
            for bad in ("1", None, True, float("nan"), float("inf"), 2**60, [1]):
                with pytest.raises(InvalidValue):
                    await c.add(bad)  # type: ignore[arg-type]
            assert await store.journal("r") == [] and c.value == 0
            await c.add(2)
            with pytest.raises(CollectionKindMismatch):
                rec.map("n")
            await rec.map("m").set("k", 1)
            with pytest.raises(CollectionKindMismatch):
                await rec.counter("m").add(1)  # an undeclared map is not a counter

            class M(BaseModel):
                x: int

            for spec in (
                CollectionSpec(kind="counter", policy="append_only"),
                CollectionSpec(kind="counter", max_entries=3),
                CollectionSpec(kind="counter", model=M),
                CollectionSpec(kind="map", max_value=3),
            ):
                with pytest.raises(InvalidValue):
                    await rec.declare("other", spec)
            assert rec.spec("other") is None
            assert rec.counter("n").value == 2


def test_blocking_facade_and_inspect_show_the_counter(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    with blocking.open_store(url) as store:
        with store.open_record(run="r", agent="tool-runner", source="tool") as rec:
            c = rec.counter("calls")
            c.add(3)
            c.add(4)
            assert c.value == 7
            assert c.contributions() == {"tool-runner": 7}
            rec.flush()
    runner = CliRunner()
    got = runner.invoke(app, ["inspect", url, "--run", "r", "--json"])
    assert got.exit_code == 0, got.output
    col = json.loads(got.stdout)["collections"]["calls"]
    assert col == {
        "kind": "counter",
        "value": 7,
        "contributions": {"tool-runner": 7},
        "max_value": None,
    }
    tree = runner.invoke(app, ["inspect", url, "--run", "r"])
    assert tree.exit_code == 0 and "counter = 7" in tree.stdout


async def test_agent_tools_read_a_counter(anyio_backend: str) -> None:
    from crdtstore.tools import Toolset

    async with crdtstore.open_store(f"memory://tools-{time.monotonic_ns()}") as store:
        async with store.open_record(run="r", agent="a") as rec:
            await rec.counter("tokens").add(5)
            async with Toolset(rec) as tools:
                got = await tools.call("store_get", {"collection": "tokens"})
            assert got["value"] == 5 and got["kind"] == "counter", got
