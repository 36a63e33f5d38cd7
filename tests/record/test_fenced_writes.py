"""Fenced writes and claims: the record checks a lease in the same transaction as the write
(issue 4, items 5 and 6; the double-claim scenario is in tests/scenarios)."""

from __future__ import annotations

from pathlib import Path

import pytest

import crdtstore
from crdtstore import LeaseHeld, LeaseLost

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://fence-{id(request)}"
    return f"sqlite:///{tmp_path}/store.db"


async def journal_len(store: crdtstore.Store) -> int:
    return len(await store.journal("r", limit=100_000))


async def test_fenced_write_needs_the_live_lease_with_the_newest_token(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r", agent="a") as rec:
            files = rec.map("files")
            lease = store.lease(["src/./app/../main.py"], ttl=30, owner="a")
            await lease.acquire()
            await files.set("src/main.py", {"lines": 10}, lease=lease)
            assert files["src/main.py"] == {"lines": 10}
            with pytest.raises(LeaseLost):  # the lease does not cover this file
                await files.set("src/other.py", {"lines": 1}, lease=lease)
            await lease.release()
            n = await journal_len(store)
            with pytest.raises(LeaseLost):  # released: no longer granted
                await files.set("src/main.py", {"lines": 99}, lease=lease)
            # a newer holder supersedes the old token
            newer = store.lease(["src/main.py"], ttl=30, owner="b")
            await newer.acquire()
            assert newer.token > lease.token
            with pytest.raises(LeaseLost):
                await files.set("src/main.py", {"lines": 98}, lease=lease)
            await rec.flush()
            assert await journal_len(store) == n
            assert files["src/main.py"] == {"lines": 10}
            await files.set("src/main.py", {"lines": 11}, lease=newer)
            await newer.release()


async def test_claims_are_exclusive_and_visible(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with (
            store.open_record(run="r", agent="alice") as alice,
            store.open_record(run="r", agent="bob") as bob,
        ):
            claim = await alice.claim("tasks", "t1", ttl=30)
            with pytest.raises(LeaseHeld) as err:
                await bob.claim("tasks", "t1", ttl=30)
            assert "alice" in str(err.value)
            await bob.sync()
            seen = bob.map("claims")["tasks/t1"]
            assert (seen["claimer"], seen["state"], seen["token"]) == (
                "alice",
                "claimed",
                claim.token,
            )
            await claim.complete(result={"ok": True})
            await bob.sync()
            assert bob.map("claims")["tasks/t1"]["state"] == "done"
            assert bob.map("claims")["tasks/t1"]["result"] == {"ok": True}
            with pytest.raises(LeaseHeld, match="alice"):  # done already: nobody redoes it
                await bob.claim("tasks", "t1", ttl=30)
            # an item given back can be taken; the old claim's token can no longer write
            given_back = await alice.claim("tasks", "t2", ttl=30)
            await given_back.release()
            async with await bob.claim("tasks", "t2", ttl=30) as again:
                assert again.token > given_back.token
                with pytest.raises(LeaseLost):
                    await alice.map("claims").set(
                        "tasks/t2", {"state": "stale"}, lease=given_back.lease
                    )
            await alice.sync()
            assert alice.map("claims")["tasks/t2"]["state"] == "released"
            assert alice.map("claims")["tasks/t2"]["claimer"] == "bob"
