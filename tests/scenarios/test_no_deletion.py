"""Failure mode 8, no-deletion: the record outlives the run and personal data accumulates in a
store nobody documented. Deleting a run, its retention running out, or redacting one value
leaves no byte of it behind."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import crdtstore

pytestmark = pytest.mark.anyio

PERSONAL = "jane.doe@example.org/+44-20-7946-0958"


def leftovers(tmp_path: Path, needle: str) -> list[str]:
    return [f.name for f in tmp_path.glob("store.db*") if needle.encode() in f.read_bytes()]


async def test_deleted_and_expired_runs_and_redacted_values_leave_no_byte(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    async with crdtstore.open_store(url) as store:
        for run in ("finished", "expiring", "ongoing"):
            async with store.open_record(run=run, agent="intake", source="user") as rec:
                await rec.map("contacts").set("c1", {"who": f"{run}:{PERSONAL}"})
                await rec.map("contacts").set("c2", {"who": f"{run}:someone else"})
                await rec.text("notes").edit(f"called {run}:{PERSONAL} twice\n")
            await store.compact(run)  # snapshots hold the data too
        async with store.open_record(run="nested", agent="k", parent="finished") as kid:
            await kid.list("log").append(f"nested:{PERSONAL}")
        assert leftovers(tmp_path, PERSONAL), "the test must see the data before deleting it"

        assert await store.delete_run("finished") is True  # and its nested run
        await store.set_retention("expiring", delete_after=0)
        assert await store.sweep(now=time.time() + 1) == ["expiring"]
        # in the run that goes on, only the personal value is removed, on record
        await store.redact("ongoing", "contacts", "c1", agent="dpo", reason="erasure request")
        async with store.open_record(run="ongoing", agent="dpo", source="user") as rec:
            notes = rec.text("notes").read()
        at = notes.index(f"ongoing:{PERSONAL}")
        span = (at, at + len(f"ongoing:{PERSONAL}"))
        await store.redact("ongoing", "notes", span=span, agent="dpo", reason="erasure request")
        await store.backend.vacuum()  # type: ignore[attr-defined]

        assert [r.run for r in await store.runs()] == ["ongoing"]
        async with store.open_record(run="ongoing", agent="auditor", create=False) as rec:
            assert rec.to_dict()["contacts"] == {"c2": {"who": "ongoing:someone else"}}
            history = await rec.history("contacts", "c1")
            # every write stays on record, by whom; the value is gone
            assert [(h.redacted, h.provenance.agent, h.value) for h in history] == [
                (True, "intake", None),
                (False, "dpo", None),  # the delete
                (True, "dpo", None),
            ]
            assert rec.text("notes").read() == "called  twice\n"
    for run in ("finished", "expiring", "nested", "ongoing"):
        assert leftovers(tmp_path, f"{run}:{PERSONAL}") == [], run
