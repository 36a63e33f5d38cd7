"""The run lifecycle: nested runs, close/archive, retention, deletion and redaction."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import crdtstore
from crdtstore import RunClosed, UnknownRun

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://life-{id(request)}"
    return f"sqlite:///{tmp_path}/store.db"


async def test_nested_run_shares_the_record_under_its_own_attribution(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="parent", agent="lead") as lead:
            await lead.map("facts").set("goal", "ship")
            await lead.flush()
            async with store.open_record(run="child", agent="helper", parent="parent") as kid:
                assert kid.map("facts")["goal"] == "ship"  # the parent's record
                await kid.map("facts").set("detail", "from the child")
                await kid.flush()
                await lead.sync()
                assert lead.map("facts")["detail"] == "from the child"
                prov = lead.map("facts").provenance("detail")
                assert prov is not None
                assert (prov.run, prov.agent) == ("child", "helper")
                assert lead.map("facts").provenance("goal").run == "parent"  # type: ignore[union-attr]
            entries = await store.journal("parent")
            assert [e.origin_run for e in entries] == ["parent", "child"]
            seqs = [e.seq for e in entries]
            assert seqs == sorted(set(seqs)), "one sequence for parent and child"
            hist = await store.history("parent", "facts", "detail")
            assert [h.provenance.run for h in hist] == ["child"]
        with pytest.raises(crdtstore.InvalidValue):
            async with store.open_record(run="child", agent="x", parent="elsewhere"):
                pass
        with pytest.raises(UnknownRun):
            async with store.open_record(run="orphan", agent="x", parent="missing"):
                pass
        # deleting the parent deletes the child
        assert {r.run for r in await store.runs()} == {"parent", "child"}
        assert await store.delete_run("parent") is True
        assert await store.runs() == []


async def test_closed_and_archived_runs_refuse_writes(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r", agent="a") as rec:
            await rec.map("m").set("k", 1)
        info = await store.close_run("r")
        assert info.state == "closed"
        with pytest.raises(RunClosed):
            async with store.open_record(run="r", agent="a"):
                pass
        async with store.open_record(run="r", agent="reader", create=False) as ro:
            assert ro.map("m")["k"] == 1
            _, version = ro.map("m").get_versioned("k")
            with pytest.raises(RunClosed):
                await ro.map("m").set("k", 2, expected_version=version)
        info = await store.archive_run("r")
        assert (info.state, info.snapshot_seq) == ("archived", 1)


async def test_an_open_record_learns_its_run_was_closed(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r", agent="a") as rec:
            await rec.map("m").set("k", 1)
            await rec.flush()
            await store.close_run("r")
            await rec.map("m").set("k", 2)  # applies locally...
            with pytest.raises(RunClosed):  # ...but the journal refuses it
                await rec.flush()
            with pytest.raises(RunClosed):
                await rec.map("m").set("k", 3)
        assert [e.seq for e in await store.journal("r")] == [1]


async def test_retention_sweeps_expired_runs(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        for run in ("old", "young", "forever"):
            async with store.open_record(run=run, agent="a") as rec:
                await rec.map("m").set("k", run)
        await store.set_retention("old", delete_after=0)
        await store.set_retention("young", delete_after=3600)
        with pytest.raises(crdtstore.InvalidValue):
            await store.set_retention("young", delete_after=-1)
        assert await store.sweep() == ["old"]
        assert {r.run for r in await store.runs()} == {"young", "forever"}
        import time

        assert await store.sweep(now=time.time() + 7200) == ["young"]
        assert [r.run for r in await store.runs()] == ["forever"]


async def test_redaction_removes_the_value_everywhere_and_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    secret = "ssn-078-05-1120-SECRET"
    async with crdtstore.open_store(f"sqlite:///{path}") as store:
        async with store.open_record(run="r", agent="a", source="tool") as rec:
            await rec.map("people").set("p1", {"name": "Pat", "ssn": secret})
            await rec.map("people").set("p2", {"name": "Sam"})
            await rec.list("log").append("looked up Pat")
        await store.compact("r")  # an older snapshot that holds the value too
        await store.redact("r", "people", "p1", agent="dpo", reason="GDPR erasure request")
        async with store.open_record(run="r", agent="b") as rec:
            assert "p1" not in rec.map("people")
            assert rec.map("people")["p2"] == {"name": "Sam"}
            assert rec.list("log").to_list() == ["looked up Pat"]
            hist = await rec.history("people", "p1")
            # the write stays on record (by whom), its value replaced by the marker
            assert [(h.redacted, h.deleted, h.provenance.agent) for h in hist] == [
                (True, False, "a"),
                (False, True, "dpo"),
                (True, True, "dpo"),
            ]
        for entry in await store.journal("r"):
            assert secret.encode() not in entry.update
            assert secret not in str(entry.effect)
        await store.backend.vacuum()  # type: ignore[attr-defined]
    for f in tmp_path.glob("store.db*"):
        assert secret.encode() not in f.read_bytes(), f"the redacted value is still in {f.name}"
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()


async def test_deleted_run_leaves_no_byte_after_vacuum(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    marker = "PERSONAL-DATA-MARKER-4711"
    async with crdtstore.open_store(f"sqlite:///{path}") as store:
        async with store.open_record(run="r", agent="a") as rec:
            await rec.map("m").set("k", marker)
            async with store.open_record(run="kid", agent="b", parent="r") as kid:
                await kid.list("l").append(marker + "-kid")
        async with store.open_record(run="keep", agent="a") as rec:
            await rec.map("m").set("k", "kept")
        await store.compact("r")
        await store.delete_run("r")
        await store.backend.vacuum()  # type: ignore[attr-defined]
        assert [r.run for r in await store.runs()] == ["keep"]
    for f in tmp_path.glob("store.db*"):
        assert marker.encode() not in f.read_bytes(), f.name
