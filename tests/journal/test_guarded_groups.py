"""Guarded writes of one record that wait at the same time share one authority transaction
(``crdtstore.record._guarded_group``), on every backend with an authority: each is decided in
order against the version it names, a refusal is told the true current version and blocks
no other write, a refused writer's retry joins the transaction under way, and a group that
accepts nothing rolls back. Across processes: tests/test_guarded_interleavings.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import crdtstore
from crdtstore import StaleVersion

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/s.db"


def count_transactions(store: crdtstore.Store, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the authority transactions the store's journal opens."""
    backend = store.backend
    opened = [0]
    authority = backend.authority

    @asynccontextmanager
    async def counted(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        opened[0] += 1
        async with authority(*args, **kwargs) as auth:
            yield auth

    monkeypatch.setattr(backend, "authority", counted)
    return opened


async def test_writes_waiting_together_share_one_transaction(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        crdtstore.open_store(url) as store,
        store.open_record("r", "a") as rec,
    ):
        m = rec.map("m")
        opened = count_transactions(store, monkeypatch)
        seqs: dict[str, int] = {}

        async def write(key: str) -> None:
            await m.set(key, key.upper(), expected_version=0)
            seqs[key] = m.get_versioned(key)[1] or -1

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(write, f"k{i}")
        # (on SQLite the first write leads a group alone, the seven that queue meanwhile
        # share the next one; the memory journal's lock lets all eight queue first; under
        # load fewer queue together, but some always do: fewer transactions than writes)
        assert opened[0] < 8
        assert sorted(seqs.values()) == list(range(1, 9))
        journal = await rec.journal()
        assert [(e.seq, e.effect[0][3]) for e in journal] == sorted((s, k) for k, s in seqs.items())


async def test_each_write_is_decided_on_the_version_it_names_in_order(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        crdtstore.open_store(url) as store,
        store.open_record("r", "a") as rec,
    ):
        m = rec.map("m")
        await m.set("k", "v0", expected_version=0)
        (v1,) = [e.seq for e in await rec.journal()]
        opened = count_transactions(store, monkeypatch)
        outcomes: dict[str, Any] = {}

        async def write(name: str, key: str, named: int) -> None:
            try:
                await m.set(key, name, expected_version=named)
            except StaleVersion as exc:
                outcomes[name] = ("stale", exc.current_version, exc.current_value)
            else:
                outcomes[name] = ("ok", m.get_versioned(key)[1])

        async with anyio.create_task_group() as tg:
            tg.start_soon(write, "lead", "other", 0)  # leads a group of its own
            await anyio.lowlevel.checkpoint()
            tg.start_soon(write, "first", "k", v1)  # then these wait together, both naming v1
            tg.start_soon(write, "second", "k", v1)
            tg.start_soon(write, "old", "k", 0)
            tg.start_soon(write, "fresh", "new", 0)  # not blocked by any refusal before it
        assert opened[0] < 5  # (usually 2: the lead's, then the four waiting together)
        # whichever of the two naming v1 was decided first won; the other one was refused
        # with the winner's version and value, the write naming 0 with the version current
        # when it was decided (the order the tasks came in is the event loop's)
        (won,) = [n for n in ("first", "second") if outcomes[n][0] == "ok"]
        (lost,) = {"first", "second"} - {won}
        won_seq = outcomes[won][1]
        assert outcomes[lost] == ("stale", won_seq, won)
        assert outcomes["old"] in (("stale", v1, "v0"), ("stale", won_seq, won))
        assert outcomes["fresh"][0] == "ok"
        assert m.to_dict() == {"k": won, "other": "lead", "new": "fresh"}
        assert len(await rec.journal()) == 4  # v0, lead, the winner, fresh: no refused write


async def test_a_refused_writer_retries_into_the_transaction_under_way(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight writers increment one counter, each retrying on the version its refusal
    reported: every increment lands, in fewer transactions than increments."""
    async with (
        crdtstore.open_store(url) as store,
        store.open_record("r", "a") as rec,
    ):
        m = rec.map("m")
        await m.set("n", 0, expected_version=0)
        opened = count_transactions(store, monkeypatch)
        refused = [0]

        async def increment() -> None:
            value, version = m.get_versioned("n")
            while True:
                try:
                    await m.set("n", int(value) + 1, expected_version=version)
                    return
                except StaleVersion as exc:
                    refused[0] += 1
                    value, version = exc.current_value, exc.current_version

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(increment)
        assert m.get("n") == 8
        # one transaction per attempt without grouping (8 + refused); under load the writers
        # may not all wait at once, so fewer than that proves retries joined one under way
        if refused[0]:
            assert opened[0] < 8 + refused[0]
        journal = await rec.journal()
        # every entry is one increment, decided on the one before it
        assert [e.effect[0][4] for e in journal] == list(range(9))


async def test_a_group_that_accepts_nothing_changes_nothing(url: str) -> None:
    async with (
        crdtstore.open_store(url) as store,
        store.open_record("r", "a") as rec,
    ):
        m = rec.map("m")
        await m.set("k", 1, expected_version=0)
        head = (await store.run_info("r")).head
        outcomes: list[Any] = []

        async def write(named: int) -> None:
            try:
                await m.set("k", named, expected_version=named)
            except StaleVersion as exc:
                outcomes.append(exc.current_version)

        async with anyio.create_task_group() as tg:
            for named in (0, head + 5, head + 6):
                tg.start_soon(write, named)
        assert outcomes == [head, head, head]
        assert (await store.run_info("r")).head == head
        assert m.get_versioned("k") == (1, head)


async def test_a_success_s_next_write_chains_on_it_in_the_same_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight writers each read-increment-write one counter five times, reading again after
    a success or a refusal (as an agent loop does): a writer's next read sees the version
    its own (or another's) accepted write will have, and its write joins the transaction
    under way at once, decided on that version. So a commit takes a chain of increments,
    and refusals are rare (without it: about one transaction per increment, and a refusal
    for each writer that read with another)."""
    async with (
        crdtstore.open_store(f"sqlite:///{tmp_path}/s.db") as store,
        store.open_record("r", "a") as rec,
    ):
        m = rec.map("m")
        await m.set("n", 0, expected_version=0)
        opened = count_transactions(store, monkeypatch)
        refused = [0]

        async def increments() -> None:
            done = 0
            while done < 5:
                value, version = m.get_versioned("n")
                try:
                    await m.set("n", int(value) + 1, expected_version=version)
                except StaleVersion:
                    refused[0] += 1
                    continue
                done += 1

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(increments)
        assert m.get("n") == 40
        journal = await rec.journal()
        assert [e.effect[0][4] for e in journal] == list(range(41))  # each on the one before
        assert opened[0] <= 40 // 3, opened[0]  # chains of increments per commit
        assert refused[0] <= 16, refused[0]


async def test_a_group_s_appends_are_written_in_one_statement_set(tmp_path: Path) -> None:
    """On SQLite the appends of a group are held back and written together before the
    commit, at the positions they were given: one head update for the group's writes."""
    async with (
        crdtstore.open_store(f"sqlite:///{tmp_path}/s.db") as store,
        store.open_record("r", "a") as rec,
    ):
        m = rec.map("m")
        await m.set("n", 0, expected_version=0)
        statements: list[str] = []
        store.backend._a.db.set_trace_callback(statements.append)  # type: ignore[attr-defined]

        async def increments() -> None:
            for _ in range(3):
                while True:
                    value, version = m.get_versioned("n")
                    try:
                        await m.set("n", int(value) + 1, expected_version=version)
                        break
                    except StaleVersion:
                        continue

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(increments)
        commits = sum(s == "COMMIT" for s in statements)
        # the head read (moved one on) at the BEGIN, set to the group's last position once
        heads = sum(s.startswith(("UPDATE runs SET head", "SELECT head")) for s in statements)
        assert heads <= 2 * commits and commits < 24, (heads, commits)
        journal = await rec.journal()
        assert [(e.seq, e.effect[0][4]) for e in journal] == [
            (s, i) for i, s in enumerate(sorted(e.seq for e in journal))
        ]
        assert m.get_versioned("n") == (24, journal[-1].seq)


async def test_a_lone_guarded_write_takes_five_statements(tmp_path: Path) -> None:
    """One guarded write, one append: the head is read by moving it past that append at the
    BEGIN (no statement of its own); a guarded write that changes nothing rolls that back."""
    async with (
        crdtstore.open_store(f"sqlite:///{tmp_path}/s.db") as store,
        store.open_record("r", "a") as rec,
    ):
        m = rec.map("m")
        await m.set("n", 0, expected_version=0)
        statements: list[str] = []
        store.backend._a.db.set_trace_callback(statements.append)  # type: ignore[attr-defined]
        await m.set("n", 1, expected_version=m.get_versioned("n")[1])
        verbs = [s.split()[0] for s in statements]
        assert verbs == ["BEGIN", "UPDATE", "INSERT", "INSERT", "COMMIT"], statements
        statements.clear()
        version = m.get_versioned("n")[1]
        assert version == 2
        await m.delete("gone", expected_version=0)  # (a key never written: nothing to journal)
        assert statements[-1] == "ROLLBACK", statements
        with pytest.raises(StaleVersion):
            await m.set("n", 2, expected_version=version - 1)
        await m.set("n", 2, expected_version=version)
        journal = await rec.journal()
        assert [(e.seq, e.effect[0][4]) for e in journal] == [(1, 0), (2, 1), (3, 2)]
    async with (
        crdtstore.open_store(f"sqlite:///{tmp_path}/s.db") as store,
        store.open_record("r", "b") as rec,
    ):
        assert rec.map("m").get_versioned("n") == (2, 3)
        await rec.map("m").set("n", 3)
        await rec.flush()
        assert rec.map("m").get_versioned("n") == (3, 4)
