"""The hub's fast path for unguarded ``journal.append`` (``Record._append_fast``).

An unguarded append of another writer's updates (a ``ws://`` client's) is applied at once,
checked against the record's current state, queued as a pending entry labelled with the
writer's client id and journaled by the hub record's group commit; its positions are
answered once committed. No authority transaction (counted by wrapping the backend's
``authority``). Guarded appends, durable appends to a batched record and retries of bytes
the record holds already take the authority path.

Record-level tests run on both anyio backends; the ws:// ones run the hub on an asyncio
thread (``tests.network.test_sync_client.HubThread``) and the clients on both. No sleeps: every wait
is on a condition under a deadline.
"""

from __future__ import annotations

import base64
import contextlib
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pycrdt import Doc, Map

from crdtstore import (
    BackendError,
    BudgetExceeded,
    CollectionSpec,
    PolicyViolation,
    Record,
    StaleVersion,
    Store,
    open_store,
)
from crdtstore._backends.sqlite import SQLiteJournal, _SQLiteAuthority
from crdtstore.record._document import REGISTRY
from sync._client import WsJournal
from tests.network.test_sync_client import (
    RUN,
    TENANT,
    journal,
    running_hub,
    token,
    until,
    ws_record,
)

pytestmark = pytest.mark.anyio

DEADLINE = 10.0


class Writer:
    """A Yjs document of another writer: each :meth:`set` gives the update it made."""

    def __init__(self, client_id: int) -> None:
        self.doc: Doc[Any] = Doc(client_id=client_id)
        self.client_id = client_id
        self.state = self.doc.get_state()
        # as a crdtstore record does: its first update registers the collection
        self.doc.get(REGISTRY, type=Map)["notes"] = "map"
        self.map = self.doc.get("notes", type=Map)

    def set(self, key: str, value: Any) -> bytes:
        self.map[key] = value
        update = self.doc.get_update(self.state)
        self.state = self.doc.get_state()
        return update


class Counts:
    """Authority transactions opened on a backend (wraps its ``authority``)."""

    def __init__(self, backend: SQLiteJournal, monkeypatch: pytest.MonkeyPatch) -> None:
        self.authority = 0
        authority = backend.authority

        @contextlib.asynccontextmanager
        async def counted(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
            self.authority += 1
            async with authority(*args, **kwargs) as auth:
                yield auth

        monkeypatch.setattr(backend, "authority", counted)


@contextlib.asynccontextmanager
async def hub_record(
    path: Path, schema: dict[str, CollectionSpec] | None = None
) -> AsyncIterator[tuple[Store, Record]]:
    """A started hub record journaling on the loop (as the hub opens one), and its store."""
    async with open_store(f"sqlite:///{path / 'store.db'}", tenant="t") as store:
        rec = Record(store, "r", "hub", "system", schema=schema)
        await rec.start()
        try:
            rec.commit_on_loop()
            with anyio.fail_after(DEADLINE):  # (else its first round may take what is queued)
                while not rec._committer_idle:
                    await anyio.lowlevel.checkpoint()
            yield store, rec
        finally:
            await rec.aclose()


def flaky_journal(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """Make every SQLite append (group commit, committer, authority) fail while the returned
    switch's ``"on"`` is true."""
    switch = {"on": False}
    inline, append, auth_append = (
        SQLiteJournal._append_inline,
        SQLiteJournal.append,
        _SQLiteAuthority.append,
    )

    def check() -> None:
        if switch["on"]:
            raise BackendError("sqlite", "disk I/O error (test)")

    def flaky_inline(self: SQLiteJournal, *args: Any, **kwargs: Any) -> Any:
        check()
        return inline(self, *args, **kwargs)

    async def flaky_append(self: SQLiteJournal, *args: Any, **kwargs: Any) -> Any:
        check()
        return await append(self, *args, **kwargs)

    async def flaky_authority(self: _SQLiteAuthority, *args: Any, **kwargs: Any) -> Any:
        check()
        return await auth_append(self, *args, **kwargs)

    monkeypatch.setattr(SQLiteJournal, "_append_inline", flaky_inline)
    monkeypatch.setattr(SQLiteJournal, "append", flaky_append)
    monkeypatch.setattr(_SQLiteAuthority, "append", flaky_authority)
    return switch


def notes(rec: Record) -> dict[str, Any]:
    return dict(rec.replica.doc.get("notes", type=Map).items())


# -- record level (both backends) -----------------------------------------------------------


def group_commits(rec: Record) -> int:
    """Commits the record's group commit on the loop made."""
    assert rec.commit_policy is not None
    return rec.commit_policy.group_commits


async def test_unguarded_appends_take_no_authority_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with hub_record(tmp_path) as (store, rec):
        assert isinstance(store.backend, SQLiteJournal)
        counts = Counts(store.backend, monkeypatch)
        w = Writer(77)
        commits = group_commits(rec)
        batch = [w.set(f"k{i}", i) for i in range(3)]
        seqs = await rec.append_updates(batch, client_id=77, durable=False)
        assert seqs == [1, 2, 3]
        assert counts.authority == 0 and rec.fast_appends == 1
        assert group_commits(rec) == commits + 1  # the three in one group commit
        entries = await store.journal("r")
        assert [(e.seq, e.client_id, e.agent) for e in entries] == [(s, 77, "hub") for s in seqs]
        assert [e.effect[0][3] for e in entries] == ["k0", "k1", "k2"]
        assert [rec.version("notes", f"k{i}") for i in range(3)] == seqs
        # the tail reads them as another writer's entries: not applied twice
        assert await rec.sync() == 3 and rec._applied_foreign <= {1, 2, 3}

        # guarded: the authority path, as before
        update = w.set("k0", "again")
        (seq,) = await rec.append_updates(
            [update], client_id=77, durable=False, expected=("notes", "k0", 1)
        )
        assert seq == 4 and counts.authority == 1
        with pytest.raises(StaleVersion):
            await rec.append_update(
                w.set("k1", "x"), client_id=77, durable=False, expected=("notes", "k1", 0)
            )
        assert counts.authority == 2 and notes(rec)["k1"] == 1  # refused: nothing applied
        # a durable append to a batched record: the authority path (durable commit)
        w2 = Writer(78)
        assert await rec.append_update(w2.set("d", 1), client_id=78, durable=True) == 5
        assert counts.authority == 3 and rec.fast_appends == 1
        assert [e.client_id for e in await store.journal("r")][-1] == 78


async def test_a_retried_append_journals_nothing_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with hub_record(tmp_path) as (store, rec):
        assert isinstance(store.backend, SQLiteJournal)
        counts = Counts(store.backend, monkeypatch)
        w = Writer(5)
        first = [w.set("a", 1), w.set("b", 2)]
        assert await rec.append_updates(first, client_id=5, durable=False) == [1, 2]
        # the answer was lost: the same bytes again, then with a new entry after them
        assert await rec.append_updates(first, client_id=5, durable=False) == [1, 2]
        assert counts.authority == 1  # the retry looked its entries up
        more = [*first, w.set("c", 3)]
        assert await rec.append_updates(more, client_id=5, durable=False) == [1, 2, 3]
        # a new entry first, then a retried one: the new one is queued, the retry looks up
        fresh = w.set("d", 4)
        assert await rec.append_updates([fresh, first[1]], client_id=5, durable=False) == [
            4,
            2,
        ]
        entries = await store.journal("r")
        assert [e.seq for e in entries] == [1, 2, 3, 4]
        assert [e.effect[0][3] for e in entries] == ["a", "b", "c", "d"]
        assert {e.client_id for e in entries} == {5}


async def test_a_refused_effect_changes_nothing_and_raises_the_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = {
        "notes": CollectionSpec(max_entries=2),
        "locked": CollectionSpec(policy="guarded"),
    }
    async with hub_record(tmp_path, schema) as (store, rec):
        assert isinstance(store.backend, SQLiteJournal)
        counts = Counts(store.backend, monkeypatch)
        w = Writer(9)
        assert await rec.append_updates([w.set("a", 1)], client_id=9, durable=False) == [1]
        before = rec.replica.doc.get_state()
        # three entries in one append, the third over the budget: none of them is applied
        batch = [w.set("b", 2), w.set("c", 3)]
        with pytest.raises(BudgetExceeded) as exc:
            await rec.append_updates(batch, client_id=9, durable=False)
        assert exc.value.code == "BUDGET_EXCEEDED"
        locked: Doc[Any] = Doc(client_id=10)
        before_locked = locked.get_state()
        locked.get(REGISTRY, type=Map)["locked"] = "map"
        locked.get("locked", type=Map)["x"] = 1
        with pytest.raises(PolicyViolation) as pexc:
            await rec.append_update(locked.get_update(before_locked), client_id=10, durable=False)
        assert pexc.value.code == "POLICY_VIOLATION"
        assert rec.replica.doc.get_state() == before and notes(rec) == {"a": 1}
        assert not rec._pending and not rec._fast and counts.authority == 0
        await rec.flush()
        assert [e.seq for e in await store.journal("r")] == [1]
        # within the budget again: taken
        assert await rec.append_updates(batch[:1], client_id=9, durable=False) == [2]


async def test_a_failing_commit_answers_backend_and_a_retry_journals_each_entry_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    switch = flaky_journal(monkeypatch)
    async with hub_record(tmp_path) as (store, rec):
        w = Writer(3)
        assert await rec.append_updates([w.set("a", 0)], client_id=3, durable=False) == [1]
        switch["on"] = True
        batch = [w.set(f"k{i}", i) for i in range(3)]
        with anyio.fail_after(DEADLINE), pytest.raises(BackendError) as exc:
            await rec.append_updates(batch, client_id=3, durable=False)
        assert exc.value.code == "BACKEND"
        assert [e.seq for e in await store.journal("r")] == [1]  # nothing acknowledged
        # the client retries while the journal still fails: the same error, nothing twice
        with anyio.fail_after(DEADLINE), pytest.raises(BackendError):
            await rec.append_updates(batch, client_id=3, durable=False)
        switch["on"] = False
        with anyio.fail_after(DEADLINE):
            while rec._failure is not None:  # the committer's retry, on its backoff
                await rec._commit_wait()
            seqs = await rec.append_updates(batch, client_id=3, durable=False)
        assert seqs == [2, 3, 4]
        await rec.flush()
        entries = await store.journal("r")
        assert [e.seq for e in entries] == [1, 2, 3, 4]  # each entry once, in order
        assert [e.effect[0][3] for e in entries] == ["a", "k0", "k1", "k2"]
        assert {e.client_id for e in entries} == {3}


_plans = st.lists(
    st.lists(st.tuples(st.integers(1, 3), st.booleans()), min_size=1, max_size=4),
    min_size=1,
    max_size=4,
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans=_plans)
def test_concurrent_writers_entries_keep_their_order(
    backend: str, plans: list[list[tuple[int, bool]]]
) -> None:
    """Writers append at the same time, each its appends one after the other (as a
    connection's frames are handled), some of them guarded (the authority path, which
    journals the pending entries first): every entry is journaled once, each writer's in
    the order it sent them, at the positions its appends were answered with."""

    async def main(path: Path) -> None:
        async with hub_record(path) as (store, rec):
            answered: dict[int, list[int]] = {}

            async def write(n: int, plan: list[tuple[int, bool]]) -> None:
                w, cid = Writer(1000 + n), 1000 + n
                got = answered.setdefault(cid, [])
                i = 0
                for size, guarded in plan:
                    if guarded:
                        update = w.set(f"w{n}-{i}", i)
                        got.append(
                            await rec.append_update(
                                update,
                                client_id=cid,
                                durable=False,
                                expected=("notes", f"w{n}-{i}", 0),
                            )
                        )
                        i += 1
                        continue
                    batch = []
                    for _ in range(size):
                        batch.append(w.set(f"w{n}-{i}", i))
                        i += 1
                    got.extend(await rec.append_updates(batch, client_id=cid, durable=False))

            with anyio.fail_after(DEADLINE):
                async with anyio.create_task_group() as tg:
                    for n, plan in enumerate(plans):
                        tg.start_soon(write, n, plan)
            entries = await store.journal("r", limit=10_000)
            assert len(entries) == sum(len(s) for s in answered.values())
            for cid, seqs in answered.items():
                mine = [e for e in entries if e.client_id == cid]
                assert [e.seq for e in mine] == seqs  # answered positions, in sent order
                n = cid - 1000
                assert [e.effect[0][3] for e in mine] == [f"w{n}-{i}" for i in range(len(mine))]

    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(main, Path(tmp), backend=backend)


# -- through the hub (ws:// clients on both backends) ----------------------------------------


async def test_ws_appends_take_the_fast_path_and_the_writer_skips_its_own_entries(
    tmp_path: Path,
) -> None:
    async with (
        running_hub(tmp_path) as hub,
        ws_record(hub, token("alice")) as alice,
        ws_record(hub, token("bob")) as bob,
    ):
        assert hub.hub is not None
        room = hub.hub._rooms[(TENANT, RUN)]
        assert room.rec is not None
        fast = room.rec.fast_appends
        async with alice.changes(local=False) as changes:
            for i in range(5):
                await alice.map("m").set(f"a{i}", i)
            await alice.flush()
            assert room.rec.fast_appends > fast  # (the client may send several per append)
            await bob.map("m").set("b", 1)
            await bob.flush()
            with anyio.fail_after(DEADLINE):
                change = await changes.__anext__()  # bob's, not one of alice's own
            assert (change.collection, change.keys, change.agent) == ("m", ("b",), "bob")
        entries = await journal(hub)
        own = {e.client_id for e in entries if e.agent == "alice"}
        assert own == {alice.replica.client_id}  # labelled with the writer's client id
        assert {e.client_id for e in entries if e.agent == "bob"} == {bob.replica.client_id}
        await until(lambda: alice.to_dict() == bob.to_dict())
        assert [alice.version("m", f"a{i}") for i in range(5)] == [
            e.seq for e in entries if e.agent == "alice"
        ]


async def test_a_failing_hub_commit_answers_backend_and_a_resend_journals_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a real hub: while its journal fails, ``journal.append`` is answered with the
    error ``BACKEND`` (nothing acknowledged); sent again once it recovers, each entry is
    journaled once, in order, at the positions answered."""
    switch = flaky_journal(monkeypatch)  # (class level: the hub's thread too)
    w = Writer(4242)
    batch = [{"update": _b64(w.set(f"k{i}", i)), "client_id": 4242} for i in range(3)]
    async with running_hub(tmp_path) as hub, ws_record(hub, token("alice")) as rec:
        await rec.map("m").set("first", 1)
        await rec.flush()
        head = len(await journal(hub))
        backend = rec._backend
        assert isinstance(backend, WsJournal)
        switch["on"] = True
        with anyio.fail_after(DEADLINE), pytest.raises(BackendError) as exc:
            await backend.call(RUN, "journal.append", {"entries": batch, "durable": False})
        assert exc.value.code == "BACKEND"
        # (read while the journal still fails: once it recovers, the hub's committer may
        # journal the queued entries at any moment, before the resend below)
        assert len(await journal(hub)) == head
        switch["on"] = False
        got: Any = None
        with anyio.fail_after(DEADLINE):
            while got is None:  # the hub's committer retries on its backoff
                try:
                    got = await backend.call(
                        RUN, "journal.append", {"entries": batch, "durable": False}
                    )
                except BackendError:
                    await anyio.sleep(0.01)
        entries = await journal(hub)
        assert got == [head + 1, head + 2, head + 3]
        assert [e.seq for e in entries] == list(range(1, head + 4))
        mine = [e for e in entries if e.client_id == 4242]
        assert [(e.seq, e.agent) for e in mine] == [(s, "alice") for s in got]
        assert [e.effect[0][3] for e in mine] == ["k0", "k1", "k2"]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
