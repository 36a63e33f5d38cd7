"""The cross-process notifier's cached listing of its socket folder, and the writer's own watch
(``crdtstore._notify``).

- A writer lists the socket folder again only when the folder's mtime changed (a listing made
  while the folder was quiet is cached). A store opened on the same file *after* a writer
  cached its listing binds a new socket, which changes the mtime: the writer's next commit
  wakes it at once (the poll interval is set to 30 s, so only the datagram can have woken it).
- A dead listener's socket file, or a file that is no socket, in the folder is removed or
  ignored, without error, and the live listeners are still woken.
- A record's own commit does not wake its own watch when it is the only user of that watch
  (only ``Watch.head`` is raised); another record on the same store and run shares the watch,
  which is then woken.

Every test runs on both anyio backends. No sleeps to wait for sync: every wait is on a
condition under a deadline.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import anyio
import pytest

from crdtstore import Record, Store, open_store
from crdtstore._notify import _QUIET_NS
from tests._wait import elapsed, until

pytestmark = pytest.mark.anyio

TENANT = "t"
RUN = "r"
POLL = 30.0  # no poll in these tests: only a wake-up can make a reader read
WOKEN = 3.0  # well under the poll interval
DEADLINE = 10.0


async def write(rec: Record, key: str, value: int) -> None:
    await rec.map("m").set(key, value)
    await rec.flush()


async def cache_listing(store: Store, rec: Record) -> None:
    """Commit through ``rec`` until the store's notifier keeps its listing of the socket
    folder (it does once the folder has been quiet for ``_QUIET_NS``, some 50 ms): commits
    after this one stat the folder instead of listing it."""
    notifier = store._notifier
    count = iter(range(1_000_000))

    async def listed() -> bool:
        i = next(count)
        await write(rec, f"warm{i}", i)
        return notifier._listed_at is not None

    await until(listed, "the notifier to keep its listing", DEADLINE)


async def test_a_store_opened_after_the_listing_was_cached_is_woken_by_the_next_commit(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    async with (
        open_store(url, tenant=TENANT, poll_interval=POLL) as a,
        a.open_record(RUN, "wa") as ra,
    ):
        await cache_listing(a, ra)
        cached_at = a._notifier._listed_at
        assert a._notifier._listed == []  # nobody else listens yet

        async with (
            open_store(url, tenant=TENANT, poll_interval=POLL) as b,
            b.open_record(RUN, "wb") as rb,
        ):
            await write(ra, "k1", 1)
            assert await elapsed(lambda: rb.map("m").get("k1") == 1) < WOKEN
            assert a._notifier._listed_at != cached_at  # listed again: the folder changed
            assert a._notifier._listed == [b._notifier._own]

            # and the other way round
            await write(rb, "k2", 2)
            assert await elapsed(lambda: ra.map("m").get("k2") == 2) < WOKEN

            # once the folder is quiet again, the new listing is cached and still wakes b
            await cache_listing(a, ra)
            await write(ra, "k3", 3)
            assert await elapsed(lambda: rb.map("m").get("k3") == 3) < WOKEN


async def test_dead_listeners_in_the_folder_are_removed_or_ignored(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    async with (
        open_store(url, tenant=TENANT, poll_interval=POLL) as a,
        a.open_record(RUN, "wa") as ra,
        open_store(url, tenant=TENANT, poll_interval=POLL) as b,
        b.open_record(RUN, "wb") as rb,
    ):
        await cache_listing(a, ra)
        folder = a._notifier._dir
        assert folder is not None
        dead = folder / "1-deadbeef"  # a process that died without removing its socket
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(str(dead))
        junk = folder / "junk"  # not a socket at all
        junk.write_text("not a socket")

        await write(ra, "k1", 1)  # no error
        assert await elapsed(lambda: rb.map("m").get("k1") == 1) < WOKEN  # b is still woken
        assert not dead.exists()  # ECONNREFUSED: removed
        await write(ra, "k2", 2)  # and again, with the folder changed by that removal
        assert await elapsed(lambda: rb.map("m").get("k2") == 2) < WOKEN
        assert sorted(p.name for p in folder.iterdir() if p != junk) == sorted(
            Path(n._own).name for n in (a._notifier, b._notifier)
        )


async def test_the_writer_s_own_watch_is_not_woken_unless_shared(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    async with (
        open_store(url, tenant=TENANT, poll_interval=POLL) as store,
        store.open_record(RUN, "w1") as r1,
    ):
        await write(r1, "a", 1)
        watch = r1._watch
        assert watch is not None and watch.users == 1
        event, blind = watch.event, watch.blind
        for i in range(3):
            await write(r1, f"b{i}", i)
            assert watch.head == r1.applied_seq  # the position is noted...
        for _ in range(10):
            await anyio.lowlevel.checkpoint()
        assert watch.event is event and not event.is_set()  # ...without a wake-up
        assert watch.blind == blind

        async with store.open_record(RUN, "w2") as r2:  # a second reader of the run here
            assert r2._watch is watch and watch.users == 2
            event = watch.event
            await write(r1, "c", 3)
            assert event.is_set()  # woken: r2 has not got the entry
            assert await elapsed(lambda: r2.map("m").get("c") == 3) < WOKEN
            await write(r2, "d", 4)  # and the other way round
            assert await elapsed(lambda: r1.map("m").get("d") == 4) < WOKEN

        # alone again: no wake-up
        assert watch.users == 1
        event = watch.event
        await write(r1, "e", 5)
        assert watch.event is event and not event.is_set()
        assert watch.head == r1.applied_seq
        assert [e.seq for e in await store.journal(RUN)] == list(range(1, r1.applied_seq + 1))


async def test_a_listing_made_while_the_folder_was_changing_is_not_kept(tmp_path: Path) -> None:
    """A socket bound within the file system's timestamp granularity after a listing leaves
    the folder's mtime as it was. Simulated: the folder's mtime is set to now just before the
    writer lists (the listing is made less than ``_QUIET_NS`` later), and set back to it after
    the new store bound its socket. The writer must list again on its next commit all the
    same (a listing of a folder that was not quiet is not kept)."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    async with (
        open_store(url, tenant=TENANT, poll_interval=POLL) as a,
        a.open_record(RUN, "wa") as ra,
    ):
        await cache_listing(a, ra)
        folder = a._notifier._dir
        assert folder is not None
        for attempt in range(50):  # (a commit that took longer than _QUIET_NS is retried)
            stamp = time.time_ns()
            os.utime(folder, ns=(stamp, stamp))  # the folder "just changed"
            await write(ra, f"k0-{attempt}", 0)  # lists (the mtime changed), while busy
            if time.time_ns() - stamp < _QUIET_NS:
                break
        else:
            pytest.fail("no commit took less than _QUIET_NS")
        assert a._notifier._listed_at is None
        async with (
            open_store(url, tenant=TENANT, poll_interval=POLL) as b,
            b.open_record(RUN, "wb") as rb,
        ):
            os.utime(folder, ns=(stamp, stamp))  # b's socket: "in the same tick"
            await write(ra, "k1", 1)
            assert await elapsed(lambda: rb.map("m").get("k1") == 1) < WOKEN


async def test_a_commit_notifies_the_stores_of_its_tenant_only(tmp_path: Path) -> None:
    """One socket folder per file and tenant: a hub holds a store per tenant, and with one
    folder per file every commit sent a datagram to (and woke) every tenant's store."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with (
        open_store(url, tenant=TENANT, poll_interval=POLL) as a,
        open_store(url, tenant="other", poll_interval=POLL) as other,
        open_store(url, tenant=TENANT, poll_interval=POLL) as c,
        a.open_record(RUN, "a") as ra,
        c.open_record(RUN, "c") as rc,
    ):
        listed = a._notifier._listeners()
        assert c._notifier._own in listed
        assert other._notifier._own not in listed
        assert a._notifier._dir != other._notifier._dir
        await write(ra, "k", 1)
        assert await elapsed(lambda: rc.map("m").get("k") == 1) < WOKEN  # by the datagram


async def test_the_socket_folder_goes_with_its_last_socket(tmp_path: Path) -> None:
    """One folder per file and tenant: they would pile up in the temporary directory."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with open_store(url, tenant=TENANT, poll_interval=POLL) as a:
        folder = a._notifier._dir
        assert folder is not None and folder.is_dir()
        async with open_store(url, tenant=TENANT, poll_interval=POLL):
            pass
        assert folder.is_dir()  # a's socket is still there
        async with open_store(url, tenant=TENANT, poll_interval=POLL) as c:
            assert c._notifier._dir == folder
    assert not folder.exists()


async def test_a_folder_removed_and_made_again_is_looked_at_by_its_path(tmp_path: Path) -> None:
    """The writer keeps its socket folder open and looks at it with ``fstat`` (no path walk
    per commit). Should the folder be removed (its sockets unlinked from outside) and made
    again, the open one is a dead directory whose mtime never moves: the writer then looks by
    path, and a store binding its socket in the new folder is still listed."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    async with open_store(url, tenant=TENANT, poll_interval=POLL) as a:
        notifier = a._notifier
        folder = notifier._dir
        assert folder is not None and notifier._dir_fd is not None
        os.unlink(notifier._own)
        os.rmdir(folder)
        folder.mkdir(mode=0o700)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as first:
            first.bind(str(folder / "1-first"))
            stamp = time.time_ns() - 2 * _QUIET_NS
            os.utime(folder, ns=(stamp, stamp))  # quiet: the listing is kept
            assert notifier._listeners() == [str(folder / "1-first")]
            assert notifier._listed_at == stamp
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as second:
                second.bind(str(folder / "2-second"))
                assert sorted(notifier._listeners()) == [
                    str(folder / "1-first"),
                    str(folder / "2-second"),
                ]
            os.unlink(folder / "2-second")
        os.unlink(folder / "1-first")
