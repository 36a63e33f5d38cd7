"""Failure mode 7, leaky-scope: one missing filter mixes two runs or two tenants."""

from __future__ import annotations

from pathlib import Path

import pytest

import crdtstore
from crdtstore import UnknownRun

pytestmark = pytest.mark.anyio


async def test_runs_and_tenants_never_see_each_other(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    async with (
        crdtstore.open_store(url, tenant="acme") as acme,
        crdtstore.open_store(url, tenant="globex") as globex,
    ):
        async with acme.open_record(run="shared-name", agent="a") as rec:
            await rec.map("secrets").set("k", "acme-secret")
            await rec.list("log").append("acme-log")
        async with acme.open_record(run="other", agent="a") as rec:
            await rec.map("secrets").set("k", "other-run-secret")
        # the other tenant, same store file, same run name
        assert [r.run for r in await globex.runs()] == []
        for call in (
            lambda: globex.journal("shared-name"),
            lambda: globex.history("shared-name", "secrets", "k"),
            lambda: globex.run_info("shared-name"),
            lambda: globex.compact("shared-name"),
            lambda: globex.replay("shared-name"),
        ):
            with pytest.raises(UnknownRun):
                await call()
        with pytest.raises(UnknownRun):
            async with globex.open_record(run="shared-name", agent="b", create=False):
                pass
        async with globex.open_record(run="shared-name", agent="b") as theirs:
            assert theirs.to_dict() == {}
            await theirs.map("secrets").set("k", "globex-secret")
            await theirs.flush()
            assert [h.value for h in await theirs.history("secrets", "k")] == ["globex-secret"]
            assert await theirs.changes_since(0) != []
            assert all(c.agent == "b" for c in await theirs.changes_since(0))
        assert await globex.delete_run("other") is False
        # and runs of one tenant are separate from each other
        async with acme.open_record(run="shared-name", agent="c") as rec:
            assert rec.map("secrets")["k"] == "acme-secret"
            assert [h.value for h in await rec.history("secrets", "k")] == ["acme-secret"]
            assert rec.view(["secrets"]).data()["secrets"]["k"]["value"] == "acme-secret"
        assert {r.run for r in await acme.runs()} == {"shared-name", "other"}
        assert [e.agent for e in await acme.journal("other")] == ["a"]
