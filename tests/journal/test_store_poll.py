"""The store's poll (``Notifier.poll`` with ``JournalBackend.changes``): one check per store
and ``poll_interval``, instead of one journal read per record.

- SQLite's ``changes()`` is ``PRAGMA data_version`` of the loop connection: it moves when
  another connection commits (another store object, another process), not for the loop
  connection's own commits.
- A write whose wake-up datagram is lost (the writer's datagram channel is shut) still
  reaches a reader on another store object: the poll sees the file changed and wakes it.
- An idle store with many records reads nothing while the file does not change: the
  records' reads stay where they were across many polls (they grew by one per record and
  poll before this change). When the file changed, the store asks the backend for the heads
  of its runs (``JournalBackend.heads``: ``runs.head`` on SQLite) and wakes the readers of
  the runs that moved only; a backend that cannot tell has every reader woken.
- A backend that cannot tell (``changes()`` is None: the memory backend) keeps the old
  behaviour: every record reads at every poll.
- A reader whose read failed tries again by itself, even when the file does not change
  again (the poll, having seen the change, would not wake it).
- Lease watches are not woken by the poll (their waiters keep their own deadlines).
- Through a hub: another process's write with its datagram lost reaches a plain Yjs peer of
  the hub (the hub record's tail, woken by the hub store's poll) and a ``ws://`` client (the
  run's push leader, woken the same way; it has no timer of its own any more).

Every test but the hub's (asyncio) runs on both anyio backends. No sleeps to wait for sync:
every wait is on a condition under a deadline.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from crdtstore import BackendError, Record, Store, open_store
from crdtstore._backends.sqlite import SQLiteJournal
from crdtstore._leases._api import WAKE_KEY
from tests._wait import until
from tests.network.test_sync_hub import RUN, TENANT, running_hub, token

pytestmark = pytest.mark.anyio

POLL = 0.05
DEADLINE = 10.0


def mute(store: Store) -> None:
    """Shut ``store``'s datagram channel: its commits wake nobody in other stores."""
    notifier = store._notifier
    assert notifier._send is not None
    notifier._send.close()
    notifier._send = None


@contextlib.asynccontextmanager
async def muted_writer_and_reader(
    tmp_path: Path,
) -> AsyncIterator[tuple[Record, Record, Store]]:
    """A writer's record on a store whose datagrams are muted (and that never polls), a
    reader's record of the same run on another store of the file (polling every ``POLL``),
    and the reader's store."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with (
        open_store(url, tenant=TENANT, poll_interval=60) as a,
        open_store(url, tenant=TENANT, poll_interval=POLL) as b,
        a.open_record(RUN, "a") as ra,
        b.open_record(RUN, "b") as rb,
    ):
        mute(a)
        yield ra, rb, b


def count_reads(store: Store) -> list[int]:
    """Count the journal reads of ``store``'s backend (a one-item list, updated in place)."""
    backend: Any = store._backend
    real = backend.read
    reads = [0]

    async def read(*args: Any, **kwargs: Any) -> Any:
        reads[0] += 1
        return await real(*args, **kwargs)

    backend.read = read
    return reads


async def write_unannounced(url: str, store: Store, reader: Record) -> None:
    """Write to ``reader``'s run from another store object on the file, its datagrams
    muted; wait until ``reader`` has it, then for 3 more polls of ``store``."""
    async with (
        open_store(url, tenant=TENANT, poll_interval=60) as other,
        other.open_record(reader.run, "y") as writer,
    ):
        mute(other)
        await writer.map("m").set("k", "v")
        await writer.flush()
        await until(lambda: reader.map("m").get("k") == "v")
        await polls(store, 3)


async def polls(store: Store, n: int) -> None:
    """Wait until ``store``'s poll has run ``n`` more times."""
    notifier = store._notifier
    target = notifier.polls + n
    await until(lambda: notifier.polls >= target)


async def test_sqlite_changes_moves_for_other_connections_only(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with (
        open_store(url, tenant=TENANT, poll_interval=60) as a,
        open_store(url, tenant=TENANT, poll_interval=60) as b,
        a.open_record(RUN, "a") as ra,
    ):
        await ra.map("m").set("k", 0)
        await ra.flush()
        before_a, before_b = a._backend.changes(), b._backend.changes()
        assert before_a is not None and before_b is not None
        await ra.map("m").set("k", 1)
        await ra.flush()
        assert b._backend.changes() != before_b  # another connection committed
        assert a._backend.changes() == before_a  # its own loop connection: no move


async def test_a_write_whose_datagram_is_lost_reaches_another_store_by_the_poll(
    tmp_path: Path,
) -> None:
    async with muted_writer_and_reader(tmp_path) as (ra, rb, _):
        for i in range(5):
            await ra.map("m").set("k", i)
            await ra.flush()
            await until(lambda i=i: rb.map("m").get("k") == i)  # type: ignore[misc]


async def test_an_idle_store_reads_nothing_however_many_records(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with (
        open_store(url, tenant=TENANT, poll_interval=POLL) as store,
        contextlib.AsyncExitStack() as stack,
    ):
        records: list[Record] = [
            await stack.enter_async_context(store.open_record(f"run{i}", "x")) for i in range(20)
        ]
        reads = count_reads(store)
        await polls(store, 3)  # the first poll may wake them all once
        settled = reads[0]
        await polls(store, 10)
        assert reads[0] == settled  # 10 polls x 20 records: no read
        # a change by another connection, unannounced, wakes the reader of its run only
        await write_unannounced(url, store, records[3])
        assert 1 <= reads[0] - settled <= 2  # run3's record; not the 19 others


async def test_without_heads_every_reader_is_woken_when_the_file_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    monkeypatch.setattr(SQLiteJournal, "heads", lambda self, tenant, runs: None)  # cannot tell
    async with (
        open_store(url, tenant=TENANT, poll_interval=POLL) as store,
        contextlib.AsyncExitStack() as stack,
    ):
        records: list[Record] = [
            await stack.enter_async_context(store.open_record(f"run{i}", "x")) for i in range(5)
        ]
        reads = count_reads(store)
        await polls(store, 3)
        settled = reads[0]
        await write_unannounced(url, store, records[3])
        assert reads[0] - settled >= 5  # all of them read again


async def test_sqlite_heads_are_the_journal_heads(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with (
        open_store(url, tenant=TENANT, poll_interval=60) as store,
        store.open_record("a", "x") as ra,
        store.open_record("b", "x") as rb,
    ):
        for i in range(3):
            await ra.map("m").set("k", i)
            await ra.flush()
        await rb.map("m").set("k", 0)
        await rb.flush()
        runs = ["a", "b", "nope"] + [f"x{i}" for i in range(600)]  # (chunks of 500)
        assert store._backend.heads(TENANT, runs) == {"a": ra.applied_seq, "b": rb.applied_seq}
        assert store._backend.heads("other", ["a"]) == {}


async def test_a_backend_that_cannot_tell_is_read_at_every_poll() -> None:
    async with (
        open_store("memory://", tenant=TENANT, poll_interval=POLL) as store,
        store.open_record(RUN, "x"),
    ):
        assert store._backend.changes() is None
        reads = count_reads(store)
        await polls(store, 4)
        assert reads[0] >= 3


async def test_a_failed_read_is_tried_again_without_another_change(tmp_path: Path) -> None:
    async with muted_writer_and_reader(tmp_path) as (ra, rb, b):
        backend: Any = b._backend
        real = backend.read
        failures = [0]

        async def flaky(*args: Any, **kwargs: Any) -> Any:
            if failures[0] == 0:
                failures[0] += 1
                raise BackendError("sqlite", "database is locked (injected)")
            return await real(*args, **kwargs)

        backend.read = flaky
        await ra.map("m").set("k", "v")  # one change only: the poll wakes b once
        await ra.flush()
        await until(lambda: rb.map("m").get("k") == "v")
        assert failures[0] == 1


async def test_lease_watches_are_not_woken_by_the_poll() -> None:
    async with open_store("memory://", tenant=TENANT, poll_interval=POLL) as store:
        notifier = store._notifier
        leases = notifier.watch(WAKE_KEY, TENANT, polled=False)
        journal = notifier.watch(TENANT, RUN)
        try:
            await polls(store, 3)
            assert leases.blind == 0
            assert journal.blind >= 2
        finally:
            notifier.unwatch(WAKE_KEY, TENANT)
            notifier.unwatch(TENANT, RUN)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the hub runs on asyncio
async def test_through_a_hub_a_write_with_its_datagram_lost_reaches_peers_and_clients(
    tmp_path: Path,
) -> None:
    async with running_hub(tmp_path) as hub:
        async with (
            open_store(hub.store_url, tenant=TENANT, poll_interval=60) as other,
            other.open_record(RUN, "other") as writer,
        ):
            await writer.map("m").set("k", "first")
            await writer.flush()
            async with (
                hub.peer(token("yjs")) as peer,
                open_store(f"{hub.base}/{TENANT}", token=token("py")) as ws,
                ws.open_record(RUN, "ignored") as client,
            ):
                await peer.wait(lambda: peer.doc.get("m", type=_map()).get("k") == "first")
                await until(lambda: client.map("m").get("k") == "first")
                mute(other)
                for i in range(3):
                    await writer.map("m").set("k", f"v{i}")
                    await writer.flush()
                    started = time.monotonic()
                    await peer.wait(
                        lambda i=i: peer.doc.get("m", type=_map()).get("k") == f"v{i}"  # type: ignore[misc]
                    )
                    await until(lambda i=i: client.map("m").get("k") == f"v{i}")  # type: ignore[misc]
                    assert time.monotonic() - started < DEADLINE


def _map() -> Any:
    from pycrdt import Map

    return Map
