"""Redaction of a field of a declared ``merge="fields"`` map (``store.redact(run, c, key,
field=...)``): the field is deleted live, so a record holding it drops it without reopening
(the map shows entries, not physical keys: the delete used to be skipped and only the
rewritten journal dropped the value, for records opened afterwards), the other fields stay,
and the field's history keeps the write, the delete and the redaction."""

from __future__ import annotations

from pathlib import Path

import pytest

import crdtstore
from crdtstore import CollectionSpec
from tests._wait import until

pytestmark = pytest.mark.anyio

SECRET = "FIELD-SECRET-0815"


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://redact-fields-{id(request)}"
    return f"sqlite:///{tmp_path}/store.db"


async def test_a_record_holding_the_field_drops_it_without_reopening(url: str) -> None:
    schema = {"f": CollectionSpec(kind="map", merge="fields")}
    async with crdtstore.open_store(url) as store:
        async with store.open_record("r", "writer", schema=schema) as holder:
            await holder.map("f").patch("e", {"ssn": SECRET, "name": "kept"})
            await holder.map("f").patch("other", {"ssn": "not this one"})
            await holder.flush()  # a redaction removes what is journaled
            await store.redact("r", "f", "e", field="ssn", agent="dpo", reason="erasure")

            def dropped() -> bool:
                return SECRET.encode() not in holder.replica.doc.get_update()

            await until(dropped, "the holder to drop the field")
            assert holder.map("f").get("e") == {"name": "kept"}
            assert holder.map("f").get("other") == {"ssn": "not this one"}
        entries = await store.journal("r")
        assert [(e.agent, e.effect[0][2]) for e in entries[-2:]] == [
            ("dpo", "del"),
            ("dpo", "redact"),
        ]
        history = await store.history("r", "f", "e\x1essn")
        assert [(h.provenance.agent, h.redacted, h.deleted) for h in history] == [
            ("writer", True, False),
            ("dpo", False, True),
            ("dpo", True, True),
        ]
        assert not any(SECRET in str(e.effect) or SECRET.encode() in e.update for e in entries)
