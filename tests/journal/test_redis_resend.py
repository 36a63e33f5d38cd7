"""A command of the Redis backend whose reply is lost with its connection (it ran; the
client only saw the connection drop) is sent again, and the resend never applies it twice:
an append is not journaled twice and still answers its positions, a guarded append that
landed is not reported refused, a lease request is not queued behind itself, a release is
not reported unknown, an authority's lock is not waited for until its TTL, a config change
is not applied twice. A real redis-server behind a real TCP proxy (tests/_lossy_proxy.py)
that drops the reply."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from crdtstore._backends.redis import RedisJournal
from crdtstore._guarded_append import Guard
from crdtstore._journal import NewEntry, checksum
from crdtstore._leases import this_proc
from tests._lossy_proxy import LossyProxy
from tests._redis import RedisServer


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's client is asyncio only


pytestmark = pytest.mark.anyio


@pytest.fixture
async def lossy(redis_server: RedisServer) -> AsyncIterator[tuple[LossyProxy, RedisJournal]]:
    async with anyio.create_task_group() as tg:
        proxy = await LossyProxy.start(tg, "127.0.0.1", redis_server.port)
        url = redis_server.url().replace(f":{redis_server.port}/", f":{proxy.listen_port}/")
        journal = RedisJournal(url)
        await journal.open()
        try:
            await journal.ensure_run("t", "r", create=True)
            yield proxy, journal
        finally:
            await journal.aclose()
            tg.cancel_scope.cancel()


def _entry(marker: str, effect: Any = ()) -> NewEntry:
    update = marker.encode()  # (the journal keeps the bytes; the marker finds the command)
    return NewEntry("a", "tool", 7, time.time(), update, list(effect), checksum(update))


async def test_an_append_whose_reply_is_lost_is_journaled_once(
    lossy: tuple[LossyProxy, RedisJournal],
) -> None:
    proxy, journal = lossy
    assert await journal.append("t", "r", [_entry("first")], durable=False) == [1]
    proxy.lose_reply_to(b"lost-append")
    got = await journal.append(
        "t", "r", [_entry("lost-append-1"), _entry("lost-append-2")], durable=False
    )
    assert proxy.lost == 1
    assert got == [2, 3]
    rows = await journal.read("t", "r", 0)
    assert [r.update for r in rows] == [b"first", b"lost-append-1", b"lost-append-2"]
    # an append that never ran before its connection was lost is still made, once
    assert await journal.append("t", "r", [_entry("after")], durable=False) == [4]


async def test_a_guarded_append_whose_reply_is_lost_is_not_reported_refused(
    lossy: tuple[LossyProxy, RedisJournal],
) -> None:
    proxy, journal = lossy
    effect = [["map", "m", "set", "k", 1]]
    proxy.lose_reply_to(b"lost-guarded")
    got = await journal.append_guarded_at(
        "t", "r", [_entry("lost-guarded", effect)], Guard(0, keys=(("m", "k"),)), durable=False
    )
    assert proxy.lost == 1 and got == [1]
    assert await journal.head("t", "r") == 1


async def test_an_authority_commit_and_lock_whose_replies_are_lost(
    lossy: tuple[LossyProxy, RedisJournal],
) -> None:
    proxy, journal = lossy
    proxy.lose_reply_to(b"acquire")
    with anyio.fail_after(5):  # (not the lock's TTL: the resend knows its own token)
        async with journal.authority("t", "r", durable=False) as auth:
            await auth.append([_entry("lost-commit")])
            proxy.lose_reply_to(b"lost-commit")
    assert proxy.lost == 2
    assert [r.update for r in await journal.read("t", "r", 0)] == [b"lost-commit"]
    # the lock is gone: a plain append goes through at once
    with anyio.fail_after(5):
        assert await journal.append("t", "r", [_entry("next")], durable=False) == [2]


async def test_lease_request_and_release_whose_replies_are_lost(
    lossy: tuple[LossyProxy, RedisJournal],
) -> None:
    proxy, journal = lossy
    leases = journal.lease_backend()
    proxy.lose_reply_to(b"lossy-owner")
    with anyio.fail_after(5):
        st = await leases.request(
            "t", "lossy-owner", ("x",), ttl=30.0, key=None, proc=this_proc(), wait=True
        )
    assert proxy.lost == 1
    assert st.state == "granted" and st.token == 1  # not queued behind its own first send
    status = await leases.status("t")
    assert [h.lease_id for h in status.holders] == [st.lease_id] and not status.waiters
    proxy.lose_reply_to(b"release")
    await leases.release("t", st.lease_id, "lossy-owner", st.token)  # not LeaseNotFound
    assert proxy.lost == 2
    assert (await leases.status("t")).holders == ()


async def test_a_config_change_whose_reply_is_lost_is_applied_once(
    lossy: tuple[LossyProxy, RedisJournal],
) -> None:
    proxy, journal = lossy

    def bump(config: dict[str, Any]) -> dict[str, Any]:
        return {**config, "n": config.get("n", 0) + 1, "lossy": "config"}

    assert await journal.update_config("t", "r", bump) == {"n": 1, "lossy": "config"}
    proxy.lose_reply_to(b"lossy")  # (the script is loaded now: the lost reply is its answer)
    assert await journal.update_config("t", "r", bump) == {"n": 2, "lossy": "config"}
    assert proxy.lost == 1
    assert await journal.get_config("t", "r") == {"n": 2, "lossy": "config"}


async def test_a_run_deletion_whose_reply_is_lost_reports_the_run_deleted(
    lossy: tuple[LossyProxy, RedisJournal],
) -> None:
    proxy, journal = lossy
    await journal.ensure_run("t", "lossy-run", create=True)
    assert await journal.delete_run("t", "scratch") is False  # (loads the script)
    proxy.lose_reply_to(b"lossy-run")
    assert await journal.delete_run("t", "lossy-run") is True
    assert proxy.lost == 1
    assert await journal.get_run("t", "lossy-run") is None
    assert await journal.delete_run("t", "lossy-run") is False  # a first send: it is gone


async def test_an_append_that_may_have_run_appends_only_what_did_not(
    lossy: tuple[LossyProxy, RedisJournal],
) -> None:
    # the committer retries a failed append with what is pending by then: the entries of
    # the failed one (which may have run) and newer ones
    _, journal = lossy
    e1, e2, e3 = _entry("e1"), _entry("e2"), _entry("e3")
    assert await journal.append("t", "r", [e1], durable=False) == [1]
    assert await journal.append("t", "r", [_entry("other writer")], durable=False) == [2]
    journal.uncertain(e1)
    assert await journal.append("t", "r", [e1, e2, e3], durable=False) == [1, 3, 4]
    rows = await journal.read("t", "r", 0)
    assert [r.update for r in rows] == [b"e1", b"other writer", b"e2", b"e3"]
    journal.uncertain(e2)  # it did run: nothing is appended
    assert await journal.append("t", "r", [e2, e3], durable=False) == [3, 4]
    e4 = _entry("e4")
    journal.uncertain(e4)  # it did not run: appended once
    assert await journal.append("t", "r", [e4], durable=False) == [5]
    assert await journal.head("t", "r") == 5


async def test_a_records_appends_whose_replies_are_lost_are_journaled_once(
    redis_server: RedisServer,
) -> None:
    import crdtstore

    async with anyio.create_task_group() as tg:
        proxy = await LossyProxy.start(tg, "127.0.0.1", redis_server.port)
        url = redis_server.url().replace(f":{redis_server.port}/", f":{proxy.listen_port}/")
        async with crdtstore.open_store(url) as store:
            async with store.open_record(run="p", agent="w", source="tool") as rec:
                m = rec.map("m")
                for i in range(50):
                    await m.set(f"k{i}", i)
                await rec.flush()
                for round_ in range(3):
                    proxy.lose_reply_to(f"lossy-{round_}".encode())
                    for i in range(200):
                        await m.set(f"r{round_}-{i}", f"lossy-{round_}" if i == 0 else i)
                    await rec.flush()
            assert proxy.lost == 3
            rows = await store.backend.read(store.tenant, "p", 0)
            updates = [r.update for r in rows]
            assert len(updates) == len(set(updates)) == 50 + 3 * 200  # each entry once
            assert [r.seq for r in rows] == list(range(1, len(rows) + 1))
        tg.cancel_scope.cancel()
