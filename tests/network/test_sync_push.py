"""Head pushes that carry the journal's new entries (``sync._ops_journal``) and the ``ws://``
client answering its record's reads from them (``sync._link``).

- A hypothesis model of the client's kept entries: pushes (early, late, duplicated, stale,
  with holes), answers, reconnects and commits in any order; a reader tailing by position
  sees every entry exactly once and in order, and every read answered from the kept entries
  is what the hub's ``journal.read`` would answer (a prefix of it, field by field).
- Through a real hub (in a thread, as in ``tests/network/test_sync_client.py``): pushed entries are
  applied without a ``journal.read`` request, the hub reads the journal once per run for its
  pushes (not once per connection), and a reader behind a relay that cuts its connection at
  random moments still gets every entry exactly once, in journal order, with bursts larger
  than one push.

No sleep waits for sync: every wait is on a condition under a deadline.
"""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crdtstore import Record, open_store
from crdtstore._journal import Row
from sync import Push, decode, encode
from sync._client import WsJournal
from sync._link import _Link
from sync._ops_journal import MAX_PUSH_ROWS, row_to_json, run_pushes
from tests.network.test_sync_client import (
    FAST,
    RUN,
    HubThread,
    journal,
    running_hub,
    sqlite_store,
    token,
    until,
)
from tests.network.test_sync_client_faults import relay_to

SLOW_DEADLINE = 30.0
OWN = 7  # the reader's client id
OTHER = 9

# -- the kept entries, as a model ---------------------------------------------------------------


def _row(seq: int, client_id: int) -> Row:
    return Row(
        seq,
        f"agent{client_id}",
        "model",
        client_id,
        1000.0 + seq / 8,
        bytes([seq % 251, 1, 2]),
        [["map", "m", "set", f"k{seq}", {"v": [seq, None, "x"]}]],
        seq * 31 % 65521,
        "",
    )


def _hub_read(log: list[Row], after: int, limit: int, skip: int) -> list[Row]:
    """What the hub's ``journal.read`` answers (``log[i]`` is position ``i + 1``)."""
    return [r for r in log[after:] if r.client_id != skip][:limit]


_event = st.one_of(
    st.tuples(st.just("commit"), st.lists(st.sampled_from([OWN, OTHER]), min_size=1, max_size=6)),
    st.tuples(st.just("push"), st.integers(0, 40), st.integers(0, 12), st.booleans()),
    st.tuples(st.just("answer"), st.integers(0, 40)),
    st.tuples(st.just("reconnect")),
    st.tuples(st.just("read"), st.integers(1, 8)),
    st.tuples(st.just("own_commit_applied")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_event, max_size=60))
def test_a_reader_takes_every_entry_once_in_order_whatever_the_pushes(
    events: list[tuple[Any, ...]],
) -> None:
    link = _Link(WsJournal("ws://127.0.0.1:1/t", token="x"), "r")
    log: list[Row] = []
    applied = 0  # the reader's position (the record's applied_seq)
    taken: list[int] = []  # positions of the others' entries the reader applied

    def read(limit: int) -> None:
        nonlocal applied
        kept = link.cached(applied, limit, OWN)
        truth = _hub_read(log, applied, limit, OWN)
        if kept is None:  # asked the hub
            rows = truth
            if rows:
                link.saw(rows[-1].seq)
        else:
            assert kept == truth[: len(kept)], "an answer the hub would not give"
            rows = kept
        rows = [r for r in rows if r.seq > applied]
        if rows:
            assert all(b.seq > a.seq for a, b in itertools.pairwise(rows))
            taken.extend(r.seq for r in rows if r.client_id != OWN)
            applied = rows[-1].seq

    for event in events:
        kind = event[0]
        if kind == "commit":
            for client in event[1]:
                log.append(_row(len(log) + 1, client))
        elif kind == "push" and log:
            _, start, count, tell = event
            hi = min(len(log), start + count)
            lo = min(start, hi)
            push = Push(push="head", seq=hi, rows=[row_to_json(r) for r in log[lo:hi]] or None)
            link.pushed(decode(encode(push)))  # type: ignore[arg-type]
            if tell:  # the same push again (a retry, or a second run task's)
                link.pushed(push)
        elif kind == "answer" and log:
            link.saw(min(event[1], len(log)))
        elif kind == "reconnect":
            link.forget()
        elif kind == "read":
            read(event[1])
        elif kind == "own_commit_applied":
            # the record applied its own entries when the hub answered its append (they are
            # contiguous with what it read): its position jumps over them
            while applied < len(log) and log[applied].client_id == OWN:
                applied += 1
    link.saw(len(log))  # the hub pushes its head at last (at the latest, its head poll)
    while True:  # the tail: reads until the hub has nothing more
        before = applied
        read(8)
        if applied == before and not _hub_read(log, applied, 8, OWN):
            break
    assert taken == [r.seq for r in log if r.client_id != OWN], "skipped or repeated"


def test_a_push_with_a_malformed_row_is_ignored_and_only_wakes() -> None:
    link = _Link(WsJournal("ws://127.0.0.1:1/t", token="x"), "r")
    link.pushed(Push(push="head", seq=2, rows=[row_to_json(_row(1, OTHER)), ["nonsense"]]))
    assert link.rows == {} and link.known == 2
    assert link.cached(0, 10, OWN) is None  # the reader asks the hub


def test_kept_entries_are_bounded() -> None:
    link = _Link(WsJournal("ws://127.0.0.1:1/t", token="x"), "r")
    for start in range(0, 5000, 50):  # a writer's own entries: it never reads them
        rows = [row_to_json(_row(s, OWN)) for s in range(start + 1, start + 51)]
        link.pushed(Push(push="head", seq=start + 50, rows=rows))
    assert len(link.rows) <= 2 * 1024 + 50
    assert max(link.rows) == 5000
    assert link.cached(4000, 10, OTHER) == [_row(s, OWN) for s in range(4001, 4011)]


# -- through a hub ------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def reader(url: str, agent: str, **options: Any) -> AsyncIterator[tuple[Record, WsJournal]]:
    # a long poll interval: every read the test sees comes from a push's wake-up
    async with (
        open_store(
            url, token=token(agent, mode="ro"), poll_interval=60.0, **{**FAST, **options}
        ) as store,
        store.open_record(RUN, agent) as rec,
    ):
        assert isinstance(store.backend, WsJournal)
        yield rec, store.backend


def _hub_pushes(hub: HubThread) -> Any:
    assert hub.hub is not None
    (room,) = hub.hub._rooms.values()
    return run_pushes(room)


@pytest.mark.anyio
async def test_pushed_entries_are_applied_without_a_read_request(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub:
        async with open_store(hub.url(), token=token("w"), poll_interval=60.0, **FAST) as wstore:
            async with wstore.open_record(RUN, "w") as writer:
                await writer.map("m").set("start", 0)
                await writer.flush()
                async with (
                    reader(hub.url(), "r1") as (r1, j1),
                    reader(hub.url(), "r2") as (r2, j2),
                    reader(hub.url(), "r3") as (r3, j3),
                ):
                    await until(lambda: all(r.map("m").get("start") == 0 for r in (r1, r2, r3)))
                    # past the readers' first reads (opening, the tail's first round)
                    await writer.map("m").set("warm", 1)
                    await until(lambda: all(r.map("m").get("warm") == 1 for r in (r1, r2, r3)))
                    pushes = _hub_pushes(hub)
                    assert pushes is not None and len(pushes.conns) == 4  # writer + 3 readers
                    wj = wstore.backend
                    assert isinstance(wj, WsJournal)
                    asked = [j.reads_asked for j in (j1, j2, j3, wj)]
                    hub_reads = pushes.reads
                    n = 20
                    for i in range(n):  # one at a time: each arrives by its own push
                        await writer.map("m").set(f"k{i}", i)
                        await writer.flush()
                        await until(lambda i=i: all(r.map("m").get(f"k{i}") == i
                                                    for r in (r1, r2, r3)))  # fmt: skip
                    # no read went out: neither the readers' nor the writer's (its own
                    # entries come back in the pushes too; it applied them already)
                    assert [j.reads_asked for j in (j1, j2, j3, wj)] == asked
                    assert all(j.reads_kept >= n for j in (j1, j2, j3))
                    # one journal read per commit for the whole run, not one per connection
                    assert pushes.reads - hub_reads <= n + 2, (pushes.reads, hub_reads)
        for rec in (r1, r2, r3):
            assert rec.map("m").to_dict() == {
                "start": 0,
                "warm": 1,
                **{f"k{i}": i for i in range(n)},
            }


async def _write(hub: HubThread, keys: list[str], burst: int) -> None:
    """Write ``keys`` through the hub's store directly (another process), ``burst`` at a
    time without waiting (one commit holds several entries)."""
    async with sqlite_store(hub) as store, store.open_record(RUN, "direct", "tool") as rec:
        m = rec.map("m")
        for at in range(0, len(keys), burst):
            for key in keys[at : at + burst]:
                await m.set(key, at)
            await rec.flush()


@pytest.mark.anyio
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_cut_connections_lose_and_repeat_nothing(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    keys = [f"k{i}" for i in range(150)]
    async with running_hub(tmp_path) as hub:
        async with open_store(hub.url(), token=token("w"), **FAST) as wstore:
            async with wstore.open_record(RUN, "w") as w:  # creates the run
                await w.map("m").set("start", 0)
                await w.flush()
        async with relay_to(hub.port) as relay:
            async with reader(relay.url(), "r") as (rec, _):
                seen: list[tuple[int, str]] = []
                stream = rec.changes(local=False)

                async def consume() -> None:
                    async for change in stream:
                        assert change.seq is not None
                        seen.extend((change.seq, k) for k in change.keys)

                async def cut() -> None:
                    for _ in range(4):
                        await anyio.sleep(rng.uniform(0.0, 0.05))
                        relay.cut()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(consume)
                    tg.start_soon(cut)
                    # small writes (pushed with their entries) and a burst larger than one
                    # push (only the head is pushed: the reader asks)
                    await _write(hub, keys[:60], rng.choice([1, 3]))
                    relay.cut()  # at least one cut lands mid-stream, however fast the rest
                    await _write(hub, keys[60:], MAX_PUSH_ROWS + 26)
                    with anyio.fail_after(SLOW_DEADLINE):  # reloads of the run, under load
                        while len(seen) < len(keys):
                            await anyio.sleep(0.005)
                    tg.cancel_scope.cancel()
                assert relay.connections >= 2, "the cuts made it reconnect"
        assert [k for _, k in seen] == keys, f"every entry once, in order: {seen}"
        seqs = [s for s, _ in seen]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        rows = await journal(hub)
        assert [r.seq for r in rows if r.agent == "direct"] == seqs


@pytest.mark.anyio
async def test_the_push_task_is_handed_over_when_its_connection_leaves(tmp_path: Path) -> None:
    held: dict[str, tuple[Record, WsJournal]] = {}
    leave = {"a": anyio.Event(), "b": anyio.Event()}

    async def hold(agent: str) -> None:  # a reader in a task of its own, until told to leave
        async with reader(hub.url(), agent) as opened:
            held[agent] = opened
            await leave[agent].wait()
        del held[agent]

    async with running_hub(tmp_path) as hub:
        async with open_store(hub.url(), token=token("w"), **FAST) as wstore:
            async with wstore.open_record(RUN, "w") as w:  # creates the run
                await w.map("m").set("start", 0)
                await w.flush()
        async with (
            sqlite_store(hub) as store,
            store.open_record(RUN, "direct", "tool") as direct,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(hold, "b")
            await until(lambda: "b" in held)
            tg.start_soon(hold, "a")
            await until(lambda: "a" in held)
            a, ja = held["a"]
            pushes = _hub_pushes(hub)
            assert pushes is not None and len(pushes.conns) == 2
            assert pushes.leader is not None and pushes.leader.claims.agent == "b"
            leave["b"].set()  # the leading connection leaves
            await until(lambda: "b" not in held and len(pushes.conns) == 1)
            await direct.map("m").set("warm", 1)
            await until(lambda: a.map("m").get("warm") == 1)
            assert pushes.leader is not None and pushes.leader.claims.agent == "a"
            asked = ja.reads_asked
            for i in range(5):
                await direct.map("m").set(f"k{i}", i)
                await direct.flush()
                await until(lambda i=i: a.map("m").get(f"k{i}") == i)
            assert ja.reads_asked == asked, "a's pushes went on, with their entries"
            leave["a"].set()
