"""Schemas, write policies, budgets, versions and guarded writes (issue 3, first part)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel, Field

import crdtstore
from crdtstore import (
    BudgetExceeded,
    CollectionSpec,
    InvalidValue,
    PolicyViolation,
    SchemaInvalid,
    StaleVersion,
)

pytestmark = pytest.mark.anyio


class Finding(BaseModel):
    text: str = Field(min_length=1)
    confidence: float = Field(ge=0, le=1)
    tags: list[str] = []


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://sem-{id(request)}"
    return f"sqlite:///{tmp_path}/store.db"


async def journal_bytes(store: crdtstore.Store, run: str) -> list[tuple[int, bytes]]:
    return [(e.seq, e.update) for e in await store.journal(run, limit=100_000)]


async def test_schema_validates_and_reads_models(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r", agent="a") as rec:
            findings = rec.map("findings", model=Finding)
            await findings.set("f1", Finding(text="cold cache", confidence=0.9))
            await findings.set("f2", {"text": "warm", "confidence": 1})
            got = findings["f1"]
            assert isinstance(got, Finding)
            assert got == Finding(text="cold cache", confidence=0.9)
            assert findings.get("f2") == Finding(text="warm", confidence=1.0)
            await rec.flush()
            before = rec.to_dict()
            journal = await journal_bytes(store, "r")
            with pytest.raises(SchemaInvalid) as err:
                await findings.set("bad", {"text": "", "confidence": 7})
            assert {e["loc"][0] for e in err.value.errors} == {"text", "confidence"}
            assert err.value.code == "SCHEMA_INVALID"
            log = rec.list("log", model=Finding)
            with pytest.raises(SchemaInvalid):
                await log.append({"nope": 1})
            await rec.flush()
            assert rec.to_dict() == before
            assert await journal_bytes(store, "r") == journal


async def test_declared_policies_are_enforced_for_every_writer(url: str) -> None:
    schema = {
        "log": CollectionSpec(kind="list", policy="append_only"),
        "facts": CollectionSpec(kind="map", policy="append_only"),
        "claims": CollectionSpec(kind="map", policy="owner"),
        "counters": CollectionSpec(kind="map", policy="guarded"),
    }
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r", agent="alice", schema=schema) as alice:
            await alice.list("log").append("one")
            await alice.map("facts").set("sky", "blue")
            await alice.map("claims").set("item1", "alice works on it")
            await alice.flush()
        # bob declares nothing: the run's declarations still bind him
        async with store.open_record(run="r", agent="bob") as bob:
            before = bob.to_dict()
            journal = await journal_bytes(store, "r")
            log, facts, claims = bob.list("log"), bob.map("facts"), bob.map("claims")
            for attempt in [
                log.insert(0, "rewritten history"),
                log.delete(0),
                facts.set("sky", "green"),
                facts.delete("sky"),
                claims.set("item1", "bob steals it"),
                claims.delete("item1"),
                bob.map("counters").set("n", 1),
            ]:
                with pytest.raises(PolicyViolation) as err:
                    await attempt
                assert err.value.agent == "bob"
                assert err.value.code == "POLICY_VIOLATION"
            await bob.flush()
            assert bob.to_dict() == before
            assert await journal_bytes(store, "r") == journal
            # what the policies allow
            await log.append("two")
            await facts.set("grass", "green")
            await claims.set("item2", "bob's own")
            await claims.set("item2", "bob's own, updated")
            await bob.map("counters").set("n", 1, expected_version=0)
            assert bob.list("log").to_list() == ["one", "two"]
            with pytest.raises(crdtstore.CollectionKindMismatch):
                bob.map("log")


async def test_redeclaring_differently_is_refused(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.open_record(
            run="r", agent="a", schema={"m": CollectionSpec(policy="append_only")}
        ) as rec:
            await rec.declare("m", CollectionSpec(policy="append_only"))  # same: fine
            with pytest.raises(InvalidValue):
                await rec.declare("m", CollectionSpec(policy="open"))
            with pytest.raises(InvalidValue):
                await rec.declare("t", CollectionSpec(kind="text", policy="owner"))
            assert rec.spec("m") is not None
            assert rec.spec("m").policy == "append_only"  # type: ignore[union-attr]


async def test_budgets_refuse_growth_and_report_size(url: str) -> None:
    schema = {
        "notes": CollectionSpec(kind="list", max_entries=3),
        "kv": CollectionSpec(kind="map", max_bytes=40, max_value_bytes=20),
    }
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r", agent="a", schema=schema) as rec:
            await rec.list("notes").extend(["a", "b", "c"])
            with pytest.raises(BudgetExceeded) as err:
                await rec.list("notes").append("d")
            assert (err.value.budget, err.value.used, err.value.limit) == ("entries", 3, 3)
            await rec.list("notes").delete(0)
            await rec.list("notes").append("d")  # room again after a delete
            with pytest.raises(BudgetExceeded) as err:
                await rec.map("kv").set("k", "x" * 30)
            assert err.value.budget == "value bytes"
            await rec.map("kv").set("a", "x" * 15)  # 17 bytes as JSON
            await rec.map("kv").set("b", "y" * 15)  # 34
            with pytest.raises(BudgetExceeded):
                await rec.map("kv").set("c", "z" * 15)
            await rec.map("kv").set("a", "short")  # overwriting frees bytes
            await rec.map("kv").set("c", "z" * 10)
            size = rec.size()
            assert size["notes"]["entries"] == 3
            assert size["kv"]["bytes"] == len('"short"') + 17 + 12
            assert size["*"]["tokens"] >= size["kv"]["bytes"] // 4


async def test_guarded_write_on_current_version_only(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with (
            store.open_record(run="r", agent="a") as a,
            store.open_record(run="r", agent="b") as b,
        ):
            m = a.map("state")
            await m.set("phase", "plan", expected_version=0)
            value, version = m.get_versioned("phase")
            assert value == "plan"
            assert version is not None and version > 0
            # b moves it on (b has not necessarily seen a's write yet: the authority applies
            # everything unseen before checking)
            await b.map("state").set("phase", "build", expected_version=version)
            journal = await journal_bytes(store, "r")
            with pytest.raises(StaleVersion) as err:
                await m.set("phase", "stale", expected_version=version)
            assert err.value.current_value == "build"
            assert err.value.current_version == b.map("state").get_versioned("phase")[1]
            assert await journal_bytes(store, "r") == journal
            assert m.get("phase") == "build"
            # retry with the fresh version succeeds
            await m.set("phase", "ship", expected_version=err.value.current_version)
            assert m.get("phase") == "ship"
            with pytest.raises(InvalidValue):
                await m.set("phase", "x", expected_version=-1)


async def test_guarded_write_journals_earlier_batched_writes_first(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r", agent="a") as a:
            await a.map("m").set("x", 1)  # batched, maybe not journaled yet
            await a.map("m").set("y", 2, expected_version=0)
            seqs = {e.effect[0][3]: e.seq for e in await store.journal("r")}
            assert seqs["x"] < seqs["y"]


async def test_guarded_counter_with_concurrent_tasks(url: str) -> None:
    """Read-increment-guarded-write from many tasks on two records: no lost increment."""
    async with crdtstore.open_store(url) as store:
        async with (
            store.open_record(run="r", agent="a") as a,
            store.open_record(run="r", agent="b") as b,
        ):
            done = {"ok": 0, "stale": 0}

            async def worker(rec: crdtstore.Record) -> None:
                m = rec.map("c")
                for _ in range(15):
                    while True:
                        value, version = m.get_versioned("n")
                        try:
                            await m.set("n", (value or 0) + 1, expected_version=version or 0)
                        except StaleVersion:
                            done["stale"] += 1
                            continue
                        done["ok"] += 1
                        break

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    for rec in (a, b, a, b):
                        tg.start_soon(worker, rec)
            assert done["ok"] == 60
            await a.sync()
            assert a.map("c")["n"] == 60


async def test_staleness_based_on_and_changes_since(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with (
            store.open_record(run="r", agent="planner") as a,
            store.open_record(run="r", agent="worker") as b,
        ):
            await a.map("tasks").set("t1", "todo")
            await a.map("notes").set("n", "x")
            await a.flush()
            await b.sync()
            seen_tasks = b.current_version("tasks")
            seen_all = b.current_version()
            # an unrelated collection moves: a collection-scoped view is still fresh
            await a.map("notes").set("n", "y")
            await a.flush()
            await b.map("plan").set("p", "go", based_on=seen_tasks)
            with pytest.raises(StaleVersion):
                await b.map("plan").set("p", "stop", based_on=seen_all)
            # the tasks move: a write based on the old view of tasks is refused
            before = b.current_version("tasks")
            await a.map("tasks").set("t1", "done")
            await a.flush()
            journal = await journal_bytes(store, "r")
            with pytest.raises(StaleVersion) as err:
                await b.map("plan").set("p", "act on stale tasks", based_on=before)
            assert err.value.current_version > before.seq
            assert await journal_bytes(store, "r") == journal
            changes = await b.changes_since(before)
            assert [(c.collection, c.keys, c.agent) for c in changes] == [
                ("tasks", ("t1",), "planner")
            ]
            every = await b.changes_since(0)
            assert {c.collection for c in every} == {"tasks", "notes", "plan"}


async def test_view_is_a_slice_with_provenance_and_a_scoped_handle(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r", agent="a", source="tool") as rec:
            await rec.map("findings").update({"net/1": "dns", "net/2": "tls", "disk/1": "full"})
            await rec.map("secrets").set("token", "s3cr3t")
            await rec.list("log").append("started")
            view = rec.view(["findings/net/*", "log"])
            data = view.data()
            assert set(data) == {"findings", "log"}
            assert set(data["findings"]) == {"net/1", "net/2"}
            assert data["findings"]["net/1"]["value"] == "dns"
            assert data["findings"]["net/1"]["provenance"]["agent"] == "a"
            assert data["findings"]["net/1"]["provenance"]["source"] == "tool"
            assert data["log"] == ["started"]
            scoped = view.map("findings")
            assert scoped.get("net/2") == "tls"
            await scoped.set("net/3", "mtu")
            await rec.flush()
            journal = await journal_bytes(store, "r")
            for attempt in [
                lambda: scoped.get("disk/1"),
                lambda: view.map("secrets"),
                lambda: view.text("notes"),
            ]:
                with pytest.raises(PolicyViolation):
                    attempt()
            with pytest.raises(PolicyViolation):
                await scoped.set("disk/2", "nope")
            with pytest.raises(PolicyViolation):
                await scoped.delete("disk/1")
            await rec.flush()
            assert len(await journal_bytes(store, "r")) == len(journal)
            assert sorted(scoped.keys()) == ["net/1", "net/2", "net/3"]
            assert "disk/1" not in scoped


def test_a_schema_error_carries_no_input_json_cannot_hold() -> None:
    """A NaN (or any input) that fails a model is not echoed in ``errors``: the error must
    stay JSON (a tool result), and the input is the caller's own (found by
    test_tools_properties: ``store_put`` of NaN to a typed map)."""
    import json

    from pydantic import BaseModel

    from crdtstore import SchemaInvalid
    from crdtstore._semantics import validate_value

    class Finding(BaseModel):
        title: str

    with pytest.raises(SchemaInvalid) as info:
        validate_value(None, Finding, "findings", "k", {"title": float("nan")})
    text = json.dumps(info.value.to_dict(), allow_nan=False)
    assert "string_type" in text and "input" not in info.value.errors[0]
