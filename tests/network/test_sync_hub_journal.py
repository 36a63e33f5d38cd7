"""The hub's journaling on the event loop (``Record.commit_on_loop``): the updates applied in
one iteration of the loop are appended in one commit, without the record's committer task;
nothing is acknowledged (``flush``) before its commit, and a failing commit acknowledges
nothing, the committer then retrying until the journal takes every entry once, in order.

The record-level tests run on both anyio backends (the callback is ``loop.call_soon`` on
asyncio, ``run_sync_soon`` on trio); the hub-level ones on asyncio (the hub serves with
websockets' asyncio implementation). No sleeps: every wait is on a condition under a deadline.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from pycrdt import Doc, Map
from websockets.asyncio.client import connect

from crdtstore import BackendError, Record, RunClosed, Store, open_store
from crdtstore._backends.sqlite import SQLiteJournal
from crdtstore._journal import NewEntry, checksum
from sync import ClientSession, PycrdtDocument, Response, TokenClaims, Update, encode, mint
from sync._hub import Hub

pytestmark = pytest.mark.anyio

SECRET = b"hub-journal-test-secret-0123456789"
DEADLINE = 10.0


def updates(n: int) -> list[bytes]:
    """``n`` updates of one writer, each setting one key of the map ``notes``."""
    doc: Doc[Any] = Doc()
    notes = doc.get("notes", type=Map)
    out = []
    for i in range(n):
        before = doc.get_state()
        notes[f"k{i}"] = i
        out.append(doc.get_update(before))
    return out


class Spy:
    """Wraps the store backend's ``append_now`` (the hub's group commit) and ``append`` (the
    committer's path): the size of every batch each was given, and what ``append_now``
    answered."""

    def __init__(self, backend: SQLiteJournal, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now: list[int] = []
        self.now_results: list[list[int] | None] = []
        self.committer: list[int] = []
        append_now, append = backend.append_now, backend.append

        def spy_now(tenant: str, run: str, entries: Sequence[NewEntry]) -> list[int] | None:
            self.now.append(len(entries))
            result = append_now(tenant, run, entries)
            self.now_results.append(result)
            return result

        async def spy_append(
            tenant: str, run: str, entries: Sequence[NewEntry], *, durable: bool
        ) -> list[int]:
            self.committer.append(len(entries))
            return await append(tenant, run, entries, durable=durable)

        monkeypatch.setattr(backend, "append_now", spy_now)
        monkeypatch.setattr(backend, "append", spy_append)


@contextlib.asynccontextmanager
async def hub_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Store, Record, Spy]]:
    """A started hub record journaling on the loop, its store and a spy on its appends."""
    async with open_store(f"sqlite:///{tmp_path / 'store.db'}", tenant="t") as store:
        rec = Record(store, "r", "hub", "system")
        await rec.start()
        try:
            assert isinstance(store.backend, SQLiteJournal)
            spy = Spy(store.backend, monkeypatch)
            rec.commit_on_loop()  # (takes the backend's append_now: the spy)
            with anyio.fail_after(DEADLINE):  # (else its first round may take what is queued)
                while not rec._committer_idle:
                    await anyio.lowlevel.checkpoint()
            yield store, rec, spy
        finally:
            await rec.aclose()


def group_commits(rec: Record) -> int:
    """Commits the record's group commit on the loop made."""
    assert rec.commit_policy is not None
    return rec.commit_policy.group_commits


async def wait_committed(rec: Record) -> None:
    """Wait until everything written through ``rec`` is journaled (riding out failures)."""
    with anyio.fail_after(DEADLINE):
        while rec._committed < rec._written:
            await rec._commit_wait()


async def test_updates_applied_in_one_loop_iteration_are_journaled_in_one_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with hub_record(tmp_path, monkeypatch) as (store, rec, spy):
        batch = updates(5)
        for update in batch:  # none of these awaits suspends: one iteration of the loop
            rec.replica.check_update(update)
            await rec.apply_update(update, checked=True)
        assert rec._committed == 0 and spy.now == []  # not journaled before the iteration ends
        await rec.flush()
        # one commit of the five, made by the group commit, not by the committer
        assert (spy.now, spy.committer, group_commits(rec)) == ([5], [], 1)
        journal = await store.journal("r")
        assert [e.seq for e in journal] == [1, 2, 3, 4, 5]
        assert [e.effect[0][3] for e in journal] == [f"k{i}" for i in range(5)]

        # the next iteration's updates are the next commit
        more = updates(8)[5:]
        for update in more:
            rec.replica.check_update(update)
            await rec.apply_update(update, checked=True)
        await rec.flush()
        assert spy.now == [5, 3] and spy.committer == []
        assert [e.seq for e in await store.journal("r")] == list(range(1, 9))


async def test_a_failing_commit_acknowledges_nothing_and_the_committer_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = True
    append_inline = SQLiteJournal._append_inline

    def flaky(self: SQLiteJournal, *args: Any, **kwargs: Any) -> list[int] | None:
        if failing:
            raise BackendError("sqlite", "disk I/O error (test)")
        return append_inline(self, *args, **kwargs)

    monkeypatch.setattr(SQLiteJournal, "_append_inline", flaky)
    async with hub_record(tmp_path, monkeypatch) as (store, rec, spy):
        batch = updates(4)
        for update in batch:
            rec.replica.check_update(update)
            await rec.apply_update(update, checked=True)
        with anyio.fail_after(DEADLINE), pytest.raises(BackendError):
            await rec.flush()  # the committer's append failed too: reported, not acknowledged
        assert spy.now == [4] and spy.committer  # the group commit failed, then the committer
        assert rec._committed == 0
        assert await store.journal("r") == []
        assert dict(rec.replica.doc.get("notes", type=Map).items()) == {
            f"k{i}": i for i in range(4)
        }  # applied (and broadcast) all the same: kept queued for the journal

        failing = False
        await wait_committed(rec)  # the committer's retry, on its backoff
        await rec.flush()
        journal = await store.journal("r")
        assert [e.seq for e in journal] == [1, 2, 3, 4]  # every entry once, in order
        assert [e.effect[0][3] for e in journal] == [f"k{i}" for i in range(4)]


async def test_a_held_write_lock_leaves_the_entries_to_the_committer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with hub_record(tmp_path, monkeypatch) as (store, rec, spy):
        other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock
            update = updates(1)[0]
            rec.replica.check_update(update)
            await rec.apply_update(update, checked=True)
            with anyio.fail_after(DEADLINE):
                while not spy.committer:  # the group commit gave up at once, then this
                    await anyio.lowlevel.checkpoint()
            assert spy.now_results == [None] and rec._committed == 0
        finally:
            other.execute("ROLLBACK")
            other.close()
        with anyio.fail_after(DEADLINE):
            await rec.flush()
        assert [e.seq for e in await store.journal("r")] == [1]


async def test_a_durable_hub_record_leaves_journaling_to_the_committer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_store(f"sqlite:///{tmp_path / 'store.db'}", tenant="t") as store:
        rec = Record(store, "r", "hub", "system", durability="durable")
        await rec.start()
        try:
            rec.commit_on_loop()
            assert isinstance(store.backend, SQLiteJournal)
            spy = Spy(store.backend, monkeypatch)
            update = updates(1)[0]
            rec.replica.check_update(update)
            with anyio.fail_after(DEADLINE):
                await rec.apply_update(update, checked=True)  # durable: returns once journaled
            assert spy.now == [] and spy.committer == [1]
        finally:
            await rec.aclose()


async def test_automatic_compaction_starts_from_the_group_commit(tmp_path: Path) -> None:
    """The commit callback runs outside any task (asyncio) or in trio's system context: the
    compaction it starts (``Store.auto_compact``) must run all the same."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    async with open_store(url, tenant="t", auto_compact=4) as store:
        rec = Record(store, "r", "hub", "system")
        await rec.start()
        try:
            rec.commit_on_loop()
            for update in updates(12):
                rec.replica.check_update(update)
                await rec.apply_update(update, checked=True)
                await rec.flush()
            assert group_commits(rec) > 0
            with anyio.fail_after(DEADLINE):
                while (await store.run_info("r")).snapshot_seq == 0:
                    await anyio.lowlevel.checkpoint()
        finally:
            await rec.aclose()


async def test_append_now_appends_at_once_or_writes_nothing(tmp_path: Path) -> None:
    async with open_store(f"sqlite:///{tmp_path / 'store.db'}", tenant="t") as store:
        backend = store.backend
        assert isinstance(backend, SQLiteJournal)
        update = updates(1)[0]
        entry = NewEntry("w", "user", 7, 1.0, update, [], checksum(update), "")
        assert backend.append_now("t", "r", [entry]) is None  # run id not known yet: no wait
        async with store.open_record("r", "a", "tool"):
            pass
        assert backend.append_now("t", "r", []) == []
        assert backend.append_now("t", "r", [entry, entry]) == [1, 2]
        other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            assert backend.append_now("t", "r", [entry]) is None  # the lock is taken: no wait
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert [e.seq for e in await store.journal("r")] == [1, 2]
        await store.close_run("r")
        with pytest.raises(RunClosed):
            backend.append_now("t", "r", [entry])
        assert [e.seq for e in await store.journal("r")] == [1, 2]  # nothing written


# -- through the hub ------------------------------------------------------------------------


def token(agent: str) -> str:
    claims = TokenClaims.model_validate(
        {"tenant": "t", "run": "r", "agent": agent, "mode": "rw", "exp": 2**31 - 1}
    )
    return mint(SECRET, claims)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_flush_request_is_answered_after_the_commit_or_with_the_journal_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain client sends updates then a flush request in one burst: the response comes
    once they are journaled; while the journal fails, the response is an error."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    hub = Hub(url, SECRET)
    failing = False
    append_inline = SQLiteJournal._append_inline

    def flaky(self: SQLiteJournal, *args: Any, **kwargs: Any) -> list[int] | None:
        if failing:
            raise BackendError("sqlite", "disk I/O error (test)")
        return append_inline(self, *args, **kwargs)

    monkeypatch.setattr(SQLiteJournal, "_append_inline", flaky)
    async with anyio.create_task_group() as tg:
        port = await tg.start(hub.serve, "127.0.0.1", 0)
        session = ClientSession(PycrdtDocument())

        async with connect(f"ws://127.0.0.1:{port}/t/r?token={token('w')}") as ws:

            async def flush() -> Response:
                request, frame = session.request("flush")
                await ws.send(frame)
                with anyio.fail_after(DEADLINE):
                    while True:
                        raw = await ws.recv()
                        assert isinstance(raw, bytes)
                        message = session.receive(raw).message
                        if isinstance(message, Response) and message.id == request.id:
                            return message

            batch = updates(6)
            for update in batch[:3]:
                await ws.send(encode(Update(update)))
            response = await flush()
            assert response.ok, response
            async with open_store(url, tenant="t") as store:
                assert [e.agent for e in await store.journal("r")] == ["w"] * 3

            failing = True
            for update in batch[3:]:
                await ws.send(encode(Update(update)))
            response = await flush()
            assert not response.ok and response.error is not None
            assert response.error.code == "BACKEND"
            async with open_store(url, tenant="t") as store:
                assert len(await store.journal("r")) == 3  # none of the failed ones

            failing = False
            room = hub._rooms[("t", "r")]
            assert room.rec is not None
            await wait_committed(room.rec)  # the committer's retry, on its backoff
            response = await flush()
            assert response.ok, response
            async with open_store(url, tenant="t") as store:
                journal = await store.journal("r")
            assert [e.seq for e in journal] == [1, 2, 3, 4, 5, 6]
            assert [e.effect[0][3] for e in journal] == [f"k{i}" for i in range(6)]
        tg.cancel_scope.cancel()
