"""The hub's journal window (``HubLimits.journal_window``) and its broadcast of shared frames.

- **Window.** A run's record (``Record.commit_on_loop``) group-commits the updates of
  plain Yjs clients at most once per window while nobody waits for a commit: the first update
  after a quiet period is committed in the iteration that applied it, the next ones within the
  window share the next commit. A ``flush``, a connected ``ws://`` client (it reads the journal),
  another store object with the SQLite file open, or the last client leaving makes the commit
  happen at once. The deferral uses asyncio's
  ``call_later``; trio has none here and commits every iteration. A hub process killed while
  updates sit in the window loses nothing: the client's sync step 2 brings them back.
- **Broadcast.** The WebSocket frame is built once and written to every connection that can
  take it; the others get it through their bounded queue (a slow consumer is closed with 4408);
  a connection that is closing is skipped. Every observer receives ``encode(Update(u))`` for
  every update ``u``, in order.

Hub-level tests run on asyncio (the hub serves with websockets' asyncio implementation); the
record-level one on both backends. The window is long (5 s) where a test asserts that
something happened "at once": it must happen well before the window ends. No sleeps to wait
for sync: every wait is on a condition under a deadline.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycrdt import Doc, Map
from typer.testing import CliRunner
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from crdtstore import InvalidValue, open_store
from crdtstore.cli import app
from crdtstore.record import LoopCommit
from sync import CloseCode, HubLimits, SyncStep1, Update, decode, encode
from sync._hub_runs import _Room
from tests._wait import elapsed
from tests.network.test_sync_hub import RUN, TENANT, HubUnderTest, Peer, peer_at, running_hub, token
from tests.network.test_sync_hub_journal import hub_record, updates
from tests.network.test_sync_processes import SECRET as PROCESS_SECRET
from tests.network.test_sync_processes import Fleet, HubProc, fleet
from tests.network.test_sync_processes import token as process_token

pytestmark = pytest.mark.anyio

WINDOW = 5.0  # a window long enough that "at once" and "at the window's end" cannot be confused
AT_ONCE = 2.5  # "well before the window ends"
DEADLINE = 10.0
REGISTRY = "__crdtstore_collections"


# -- harness --------------------------------------------------------------------------------


class Observer(Peer):
    """A :class:`Peer` that also keeps every frame it received, as received."""

    def __init__(self, doc: Doc[Any] | None = None) -> None:
        super().__init__(doc)
        self.raw: list[bytes] = []
        receive = self.session.receive

        def keep(frame: bytes) -> Any:
            self.raw.append(frame)
            return receive(frame)

        self.session.receive = keep  # type: ignore[method-assign]

    def update_frames(self) -> list[bytes]:
        return [f for f in self.raw if isinstance(decode(f), Update)]


def note(doc: Doc[Any], key: str, value: Any) -> bytes:
    """Set ``notes[key] = value`` in ``doc`` (a registered map collection); the update."""
    before = doc.get_state()
    with doc.transaction():
        registry = doc.get(REGISTRY, type=Map)
        if "notes" not in registry:
            registry["notes"] = "map"
        doc.get("notes", type=Map)[key] = value
    return doc.get_update(before)


def journaled_keys(entries: list[Any]) -> list[str]:
    return [op[3] for e in entries for op in e.effect if op[:3] == ["map", "notes", "set"]]


async def until_journaled(hub: HubUnderTest, keys: set[str], deadline: float = DEADLINE) -> float:
    """Wait until a fresh reader of the store file (another ``open_store``) sees every one of
    ``keys`` journaled; the seconds it took."""

    async def journaled() -> bool:
        return keys <= set(journaled_keys(await hub.journal()))

    return await elapsed(journaled, f"{sorted(keys)} journaled", deadline)


def room_record(hub: HubUnderTest) -> LoopCommit:
    room = hub.hub._rooms[(TENANT, RUN)]
    assert isinstance(room, _Room) and room.rec is not None
    assert isinstance(room.commit, LoopCommit)
    return room.commit


async def open_window(hub: HubUnderTest, alice: Peer) -> LoopCommit:
    """``alice`` sets ``k0``, which is journaled at once and opens a window; the run's
    record."""
    rec = room_record(hub)
    await alice.set("k0", 0)
    await until_journaled(hub, {"k0"})
    return rec


async def applied(peer: Peer) -> None:
    """Return once the hub has applied (and broadcast) everything ``peer`` sent: frames are
    handled in order, so the answer to a later request says so."""
    response = await peer.request("whoami")
    assert response.ok, response


async def poll(predicate: Callable[[], bool], deadline: float = DEADLINE) -> None:
    with anyio.fail_after(deadline):
        while not predicate():
            await anyio.sleep(0.005)


# -- the record: deferral on asyncio, every iteration on trio -------------------------------


async def test_the_record_defers_within_a_window_on_asyncio_and_commits_each_iteration_on_trio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    async with hub_record(tmp_path, monkeypatch) as (store, rec, spy):
        commit = rec.commit_on_loop(WINDOW)
        assert commit is not None
        batch = updates(6)

        async def apply(update: bytes) -> None:
            rec.replica.check_update(update)
            await rec.apply_update(update, checked=True)

        async def committed(n: int) -> None:  # within a few iterations, not at the window
            with anyio.fail_after(AT_ONCE):
                while rec._committed < n:
                    await anyio.lowlevel.checkpoint()

        await apply(batch[0])  # quiet since ever: committed in this iteration
        await committed(1)
        assert spy.now == [1]
        if anyio_backend == "asyncio":
            for update in batch[1:4]:  # each in its own iteration, within the window
                await apply(update)
                for _ in range(20):
                    await anyio.lowlevel.checkpoint()
            assert spy.now == [1] and rec._committed == 1  # waiting for the window
            with anyio.fail_after(AT_ONCE):
                await rec.flush()  # urges the deferred commit
            assert spy.now == [1, 3]

            commit.journal_window = 0.2  # now let the timer end the window
            start = time.monotonic()
            await apply(batch[4])
            await apply(batch[5])
            with anyio.fail_after(DEADLINE):
                while rec._committed < 6:
                    await rec._commit_wait()
            assert time.monotonic() - start >= 0.15  # not before the window ended
            assert spy.now == [1, 3, 2]
        else:  # trio: no call_later, so every iteration's updates are committed at its end
            for n, update in enumerate(batch[1:], start=2):
                await apply(update)
                await committed(n)
            assert spy.now == [1] * 6
        assert spy.committer == []
        assert [e.seq for e in await store.journal("r")] == [1, 2, 3, 4, 5, 6]


# -- through the hub ------------------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_updates_within_a_window_share_one_commit_and_a_flush_ends_the_window(
    tmp_path: Path,
) -> None:
    async with running_hub(tmp_path, journal_window=WINDOW) as hub:
        async with hub.peer(token("alice")) as alice:
            rec = room_record(hub)
            assert rec.journal_window == WINDOW
            before = rec.group_commits

            # the first update after a quiet period is journaled at once
            await alice.set("k0", 0)
            assert await until_journaled(hub, {"k0"}) < AT_ONCE
            assert rec.group_commits == before + 1

            # the next ones, within the window, wait for it (applied, relayed, not journaled)
            async with hub.peer(token("bob")) as bob:
                for i in range(1, 5):
                    await alice.set(f"k{i}", i)
                await bob.wait(lambda: bob.notes().get("k4") == 4)
                await applied(alice)
                assert rec.group_commits == before + 1
                assert journaled_keys(await hub.journal()) == ["k0"]

                # a flush ends the window: answered at once, the four then in one commit
                start = time.monotonic()
                await alice.flush()
                assert time.monotonic() - start < AT_ONCE
                assert rec.group_commits == before + 2
                entries = await hub.journal()
                assert journaled_keys(entries) == [f"k{i}" for i in range(5)]
                assert {e.agent for e in entries} == {"alice"}
                assert [e.seq for e in entries] == [1, 2, 3, 4, 5]

                # a quiet period as long as the window (simulated: the last commit is moved
                # back by one window) makes the next update's commit immediate again
                rec._last_commit -= WINDOW
                await alice.set("k5", 5)
                assert await until_journaled(hub, {"k5"}) < AT_ONCE
                assert rec.group_commits == before + 3


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_window_s_end_commits_the_burst_without_a_flush(tmp_path: Path) -> None:
    window = 1.0
    async with running_hub(tmp_path, journal_window=window) as hub:
        async with hub.peer(token("alice")) as alice:
            rec = room_record(hub)
            before = rec.group_commits
            await alice.set("k0", 0)
            await until_journaled(hub, {"k0"})
            opened = rec._last_commit  # the window runs from this commit
            for i in range(1, 5):  # a burst, well within the window
                await alice.set(f"k{i}", i)
            await until_journaled(hub, {f"k{i}" for i in range(5)})
            assert rec._last_commit - opened >= window * 0.9  # at the window's end
            assert rec.group_commits == before + 2  # the four in one commit
            entries = await hub.journal()
            assert [e.seq for e in entries] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_connected_ws_client_makes_every_commit_immediate(tmp_path: Path) -> None:
    async with running_hub(tmp_path, journal_window=WINDOW) as hub:
        async with hub.peer(token("alice")) as alice:
            rec = await open_window(hub, alice)
            commits = rec.group_commits
            assert rec.readers == 0

            async with (
                open_store(f"{hub.base}/{TENANT}", token=token("reader")) as ws_store,
                ws_store.open_record(RUN, "reader") as reader,
            ):
                await poll(lambda: rec.readers == 1)
                for i in (1, 2):
                    start = time.monotonic()
                    await alice.set(f"k{i}", i)
                    await poll(lambda i=i: reader.map("notes").get(f"k{i}") == i, AT_ONCE)
                    assert time.monotonic() - start < AT_ONCE  # it got there through the journal
                    assert await until_journaled(hub, {f"k{i}"}) < AT_ONCE
                assert rec.group_commits == commits + 2

            # the ws:// client left: the window is back
            await poll(lambda: rec.readers == 0)
            await alice.set("k3", 3)
            await applied(alice)
            assert rec.group_commits == commits + 2
            assert "k3" not in journaled_keys(await hub.journal())
            await alice.flush()
            assert journaled_keys(await hub.journal()) == ["k0", "k1", "k2", "k3"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_another_store_on_the_file_makes_every_commit_immediate(tmp_path: Path) -> None:
    """A store object that has the SQLite file open (here in this process; another process
    alike: its notification socket is in the same folder) may read the run: while it is
    open, a Yjs client's updates are journaled at once, and an embedded record sees them
    through the datagram, not its (long) poll."""
    async with running_hub(tmp_path, journal_window=WINDOW) as hub:
        async with hub.peer(token("alice")) as alice:
            rec = await open_window(hub, alice)
            commits = rec.group_commits
            async with (
                open_store(hub.store_url, tenant=TENANT, poll_interval=60) as store,
                store.open_record(RUN, "embedded", "tool") as embedded,
            ):
                for i in (1, 2):
                    start = time.monotonic()
                    await alice.set(f"k{i}", i)
                    await poll(lambda i=i: embedded.map("notes").get(f"k{i}") == i, AT_ONCE)
                    assert time.monotonic() - start < AT_ONCE
                assert rec.group_commits == commits + 2
            # it closed (its socket is gone): the window is back
            await alice.set("k3", 3)
            await applied(alice)
            assert rec.group_commits == commits + 2
            await alice.flush()
            assert journaled_keys(await hub.journal()) == ["k0", "k1", "k2", "k3"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_last_client_leaving_journals_the_deferred_batch(tmp_path: Path) -> None:
    async with running_hub(tmp_path, journal_window=WINDOW) as hub:
        async with hub.peer(token("alice")) as alice:
            rec = room_record(hub)
            await alice.set("k0", 0)
            await until_journaled(hub, {"k0"})
            for i in range(1, 4):
                await alice.set(f"k{i}", i)
            await applied(alice)
            assert journaled_keys(await hub.journal()) == ["k0"]  # deferred
            start = time.monotonic()
        await hub.wait_unloaded()  # the record is closed, flushing the batch
        assert time.monotonic() - start < AT_ONCE  # not at the window's end
        assert rec._rec._committed == 4
        entries = await hub.journal()
        assert journaled_keys(entries) == ["k0", "k1", "k2", "k3"]
        assert [e.seq for e in entries] == [1, 2, 3, 4]


def test_a_negative_or_infinite_window_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for bad in (-1.0, -1e-9, math.nan, math.inf):
        with pytest.raises(InvalidValue) as info:
            HubLimits(journal_window=bad)
        assert info.value.code == "INVALID_VALUE"
        assert "journal_window" in str(info.value)
    assert HubLimits(journal_window=0).journal_window == 0
    assert HubLimits().journal_window == 0.02

    monkeypatch.setenv("CRDTSTORE_SECRET", "window-test-secret-0123456789")
    store = tmp_path / "s.db"
    result = CliRunner().invoke(
        app, ["serve", "--store", f"sqlite:///{store}", "--journal-window", "-1"]
    )
    assert result.exit_code == 1
    assert "journal_window" in result.output
    assert not store.exists()  # refused before the store is opened


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_zero_window_commits_every_iteration(tmp_path: Path) -> None:
    async with running_hub(tmp_path, journal_window=0) as hub:
        async with hub.peer(token("alice")) as alice, hub.peer(token("bob")) as bob:
            rec = room_record(hub)
            before = rec.group_commits
            for i in range(4):
                await alice.set(f"k{i}", i)
                await bob.wait(lambda i=i: bob.notes().get(f"k{i}") == i)
                # committed at the end of the iteration that applied it, before bob read it
                assert rec.group_commits == before + i + 1
            assert await until_journaled(hub, {f"k{i}" for i in range(4)}) < AT_ONCE


# -- a hub process killed while updates sit in the window -----------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_kill_9_of_a_hub_process_with_updates_in_the_window_loses_nothing(
    tmp_path: Path,
) -> None:
    """``python -m sync --journal-window 30``: a Yjs client's updates that the hub applied and
    relayed but had not journaled yet are lost with the process; on reconnect to the restarted
    hub (same store), the hub's sync step 1 asks for what it lacks and the client's step 2
    brings them back: journaled, and seen by a fresh reader. A graceful stop (SIGTERM) of the
    hub journals what sits in the window."""
    store_url = f"sqlite:///{tmp_path / 'store.db'}"

    async def start_hub(f: Fleet) -> HubProc:
        argv = ["-m", "sync", "--store", store_url, "--host", "127.0.0.1", "--port", "0"]
        argv += ["--journal-window", "30"]
        hub: HubProc = await f._spawn(
            HubProc,
            "hub",
            [sys.executable, *argv],
            env={**os.environ, "CRDTSTORE_SECRET": PROCESS_SECRET},
            stdin=subprocess.DEVNULL,
        )
        await hub.wait(lambda: hub.port is not None, "hub listening", deadline=30.0)
        return hub

    async def keys_journaled() -> list[str]:
        async with open_store(store_url, tenant=TENANT) as store:
            if RUN not in {r.run for r in await store.runs()}:
                return []
            return journaled_keys(await store.journal(RUN))

    def url(port: int | None, agent: str) -> str:
        return f"ws://127.0.0.1:{port}/{TENANT}/{RUN}?token={process_token(agent)}"

    doc: Doc[Any] = Doc()
    async with fleet(tmp_path, "asyncio") as f:
        hub = await start_hub(f)
        async with (
            peer_at(url(hub.port, "alice"), Peer(doc)) as alice,
            peer_at(url(hub.port, "bob"), Peer()) as bob,
        ):
            await alice.set("k0", 0)
            with anyio.fail_after(DEADLINE):
                while await keys_journaled() != ["k0"]:  # the first: journaled at once
                    await anyio.sleep(0.01)
            for i in range(1, 6):
                await alice.set(f"k{i}", i)
            await bob.wait(lambda: len(bob.notes()) == 6)  # applied and relayed
            await applied(alice)
            assert await keys_journaled() == ["k0"]  # in the window
            hub.process.kill()  # SIGKILL
            assert await hub.exit_status() != 0
            await alice.wait(lambda: alice.closed)
        assert await keys_journaled() == ["k0"]  # lost with the process

        hub = await start_hub(f)
        async with peer_at(url(hub.port, "alice"), Peer(doc)) as alice:
            # alice's step 2 (answering the hub's step 1) carries k1..k5; a fresh room
            # commits its first batch at once, without a flush
            with anyio.fail_after(DEADLINE):
                while len(await keys_journaled()) < 6:
                    await anyio.sleep(0.02)
            keys = await keys_journaled()
            assert sorted(keys) == [f"k{i}" for i in range(6)] and len(keys) == 6  # each once

            # a graceful stop (SIGTERM) with an update in the window journals it
            await alice.set("k6", 6)
            await applied(alice)
            assert "k6" not in await keys_journaled()
            hub.process.terminate()
            assert await hub.exit_status() == 0, hub.diagnostics()
        keys = await keys_journaled()
        assert sorted(keys) == [f"k{i}" for i in range(7)] and len(keys) == 7
        async with (
            open_store(store_url, tenant=TENANT) as store,
            store.open_record(RUN, "checker", create=False) as rec,
        ):
            assert rec.to_dict()["notes"] == {f"k{i}": i for i in range(7)}
            for i in range(7):
                prov = rec.provenance("notes", f"k{i}")
                assert prov is not None and prov.agent == "alice"


# -- broadcast ------------------------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_slow_consumer_is_closed_while_the_others_get_every_frame_in_order(
    tmp_path: Path,
) -> None:
    async with running_hub(tmp_path, max_queue_frames=8, max_queue_bytes=256 * 1024) as hub:
        async with (
            hub.peer(token("alice")) as alice,
            peer_at(hub.url(token("bob")), Observer()) as bob,
            peer_at(hub.url(token("carol")), Observer()) as carol,
        ):
            assert alice.ws is not None
            sent: list[bytes] = []
            # a client that never reads: the kernel's buffers fill, then the hub's queue
            async with connect(hub.url(token("slow")), max_queue=1) as slow:
                await slow.send(encode(SyncStep1(b"\x00")))
                with anyio.fail_after(DEADLINE):
                    await hub.hub.wait_until(lambda h: h.loaded_runs().get((TENANT, RUN)) == 4)
                    i = 0
                    while hub.hub.loaded_runs().get((TENANT, RUN)) == 4:
                        frame = encode(Update(note(alice.doc, f"big{i}", "x" * 100_000)))
                        await alice.ws.send(frame)
                        sent.append(frame)
                        await applied(alice)
                        i += 1
                with anyio.fail_after(DEADLINE), contextlib.suppress(ConnectionClosed):
                    async for _ in slow:  # drain what the kernel buffered, up to the close
                        pass
                assert slow.close_code == CloseCode.SLOW_CONSUMER
            assert len(sent) > 2
            for i in range(3):  # and the others go on
                frame = encode(Update(note(alice.doc, f"after{i}", i)))
                await alice.ws.send(frame)
                sent.append(frame)
            for observer in (bob, carol):
                await observer.wait(lambda o=observer: len(o.update_frames()) >= len(sent))
                assert observer.update_frames() == sent
                assert not observer.closed
            await alice.flush()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_paused_reader_gets_every_frame_in_order_across_its_queue(tmp_path: Path) -> None:
    """A connection that stops reading gets frames written at once, then queued (its socket
    is full; also while its socket drained but its queue did not), then, once it reads again
    and its queue drained, written at once again: it receives every one, in order, as do
    the others."""
    async with running_hub(tmp_path) as hub:
        async with (
            hub.peer(token("alice")) as alice,
            peer_at(hub.url(token("bob")), Observer()) as bob,
            connect(hub.url(token("paused")), max_queue=1, max_size=None) as paused,
        ):
            assert alice.ws is not None
            await paused.send(encode(SyncStep1(b"\x00")))
            room = hub.hub._rooms[(TENANT, RUN)]
            await poll(lambda: len(room.conns) == 3)
            (conn,) = [c for c in room.conns if c.claims.agent == "paused"]
            sent: list[bytes] = []

            async def send(key: str, size: int) -> None:
                frame = encode(Update(note(alice.doc, key, "z" * size)))
                assert alice.ws is not None
                await alice.ws.send(frame)
                sent.append(frame)
                await applied(alice)

            with anyio.fail_after(DEADLINE):
                i = 0
                while not conn.queue:  # written at once until its socket is full
                    await send(f"a{i}", 200_000)
                    i += 1
            direct = len(sent) - 1
            assert direct > 0
            for i in range(3):  # behind the queue
                await send(f"q{i}", 1000)
            assert len(conn.queue) >= 4
            # the socket drained while frames are still queued (simulated: its buffer reads
            # empty): a frame broadcast now must still go behind them
            transport = conn.ws.transport
            transport.get_write_buffer_size = lambda: 0  # type: ignore[method-assign]
            try:
                await send("s", 1000)
            finally:
                del transport.get_write_buffer_size
            assert len(conn.queue) >= 5

            received: list[bytes] = []
            with anyio.fail_after(DEADLINE):
                while len(received) < len(sent):
                    frame = await paused.recv()
                    assert isinstance(frame, bytes)
                    if isinstance(decode(frame), Update):
                        received.append(frame)
                await poll(lambda: not conn.queue)
                for i in range(3):  # at once again
                    await send(f"b{i}", 1000)
                while len(received) < len(sent):
                    frame = await paused.recv()
                    assert isinstance(frame, bytes)
                    if isinstance(decode(frame), Update):
                        received.append(frame)
            assert received == sent
            await bob.wait(lambda: len(bob.update_frames()) >= len(sent))
            assert bob.update_frames() == sent


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_closing_connection_is_skipped_by_the_broadcast(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub:
        async with (
            hub.peer(token("alice")) as alice,
            peer_at(hub.url(token("bob")), Observer()) as bob,
            peer_at(hub.url(token("carol")), Observer()) as carol,
        ):
            room = hub.hub._rooms[(TENANT, RUN)]
            (conn,) = [c for c in room.conns if c.claims.agent == "carol"]
            writes: list[bytes] = []
            transport = conn.ws.transport
            write = transport.write

            def spy(data: Any) -> None:
                writes.append(bytes(data))
                write(data)

            transport.write = spy  # type: ignore[method-assign]
            # the hub starts the closing handshake of carol's connection (its close frame is
            # out), and an update is broadcast before the connection's task noticed
            conn.ws.protocol.send_close(1000, "bye")
            conn.ws.send_data()
            assert conn.ws.protocol.state is State.CLOSING
            closing = len(writes)
            assert closing == 1  # the close frame
            frame = encode(Update(note(alice.doc, "k", 1)))
            room.broadcast(frame)  # no error, nothing written after the close frame
            conn.send(frame)
            assert len(writes) == closing
            await bob.wait(lambda: bob.update_frames() == [frame])
            await carol.wait(lambda: carol.closed)
            assert carol.update_frames() == []
            assert carol.close_code == 1000


_KEYS = st.sampled_from(["a", "b", "c", "d"])
_VALUES = st.one_of(
    st.integers(0, 1000),
    st.text(max_size=8),
    st.integers(1, 3).map(lambda n: "y" * (40_000 * n)),  # 16- and 64-bit frame lengths
)
_PROGRAMS = st.lists(st.tuples(_KEYS, _VALUES), min_size=1, max_size=12)


@settings(max_examples=8, deadline=None)
@given(program=_PROGRAMS)
def test_every_observer_gets_encode_update_of_every_update_in_order(
    program: list[tuple[str, Any]],
) -> None:
    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            async with running_hub(Path(tmp)) as hub:
                async with (
                    hub.peer(token("alice")) as alice,
                    peer_at(hub.url(token("bob")), Observer()) as bob,
                    peer_at(hub.url(token("carol")), Observer()) as carol,
                    peer_at(hub.url(token("dave")), Observer()) as dave,
                ):
                    assert alice.ws is not None
                    sent = []
                    for key, value in program:  # sent in one burst
                        sent.append(encode(Update(note(alice.doc, key, value))))
                        await alice.ws.send(sent[-1])
                    for observer in (bob, carol, dave):
                        await observer.wait(lambda o=observer: len(o.update_frames()) >= len(sent))
                        assert observer.update_frames() == sent
                        assert observer.notes() == alice.notes()

    anyio.run(main, backend="asyncio")


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_ws_client_connecting_during_a_deferred_window_ends_it(tmp_path: Path) -> None:
    """A Yjs update deferred before a ``ws://`` client connected, and one arriving while it is
    connected, reach that client at once (it reads the journal), not at the window's end."""
    async with running_hub(tmp_path, journal_window=WINDOW) as hub:
        async with hub.peer(token("alice")) as alice:
            rec = await open_window(hub, alice)
            await alice.set("k1", 1)  # deferred
            await applied(alice)
            assert "k1" not in journaled_keys(await hub.journal())
            start = time.monotonic()
            async with (
                open_store(f"{hub.base}/{TENANT}", token=token("reader")) as ws_store,
                ws_store.open_record(RUN, "reader") as reader,
            ):
                await poll(lambda: rec.readers == 1)
                await alice.set("k2", 2)
                await poll(lambda: reader.map("notes").get("k2") == 2, AT_ONCE)
                assert reader.map("notes").get("k1") == 1
                assert time.monotonic() - start < AT_ONCE
