"""The one-statement grant and release of an uncontended lease on SQLite, against other
connections that commit between them.

``request_now`` moves row 0 (the counters) to the new rank and ``release_now`` moves the row
back, each checked by the rows it relies on rather than by ``data_version`` (see
``_lease_rows.MOVE_GRANT``). Their caches go stale whenever another connection commits, and
a stale one must never grant a taken resource, hand out a token again or release past a
waiter. Hypothesis interleaves two backends on one file (each its own connection, as two
processes); after every step the file must hold at most one grant per resource, and every
token granted must be new. Two fixed orderings show each condition at work, with negative
controls: the same statements without their conditions do the damage.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from crdtstore import InvalidResource, LeaseHeld, LeaseLost, LeaseNotFound
from crdtstore._backends.sqlite import SQLiteJournal, SQLiteLeases
from crdtstore._backends.sqlite import _leases as leases_mod
from crdtstore._backends.sqlite._lease_rows import (
    MOVE_GRANT,
    MOVE_RETIRE,
    load_table,
)
from crdtstore._leases import FakeClock, Proc
from crdtstore._leases._conformance import FakeProbe

pytestmark = pytest.mark.anyio

T = "t"
FILES = ("a", "b")


def proc(pid: int) -> Proc:
    return Proc("h", "boot-0", pid, 1)


def file_table(path: Path) -> Any:
    db = sqlite3.connect(path)
    try:
        db.execute("BEGIN")
        return load_table(db)
    finally:
        db.rollback()
        db.close()


async def two_backends(path: Path) -> tuple[list[SQLiteLeases], FakeClock, FakeProbe]:
    clock, probe = FakeClock(), FakeProbe()
    out = []
    for _ in range(2):
        journal = SQLiteJournal(f"sqlite:///{path}")
        await journal.open()
        b = SQLiteLeases(journal, clock=clock, probe=probe)
        await b.open()
        out.append(b)
    return out, clock, probe


async def close(backends: list[SQLiteLeases]) -> None:
    for b in backends:
        await b.aclose()
        await b.journal.aclose()


op = st.one_of(
    # (backend, resource, at once, wait)
    st.tuples(
        st.just("request"), st.integers(0, 1), st.sampled_from(FILES), st.booleans(), st.booleans()
    ),
    # (the taker's backend or the other, how far back among the leases taken)
    st.tuples(st.just("release"), st.sampled_from([0, 0, 0, 1]), st.sampled_from([0, 0, 1])),
    st.tuples(st.just("heartbeat"), st.sampled_from([0, 1]), st.sampled_from([0, 0, 1])),
    st.tuples(st.just("advance"), st.sampled_from([1.0, 11.0])),
    st.tuples(st.just("reap"), st.integers(0, 1)),
)


async def run_ops(path: Path, ops: list[tuple[Any, ...]]) -> None:
    (a, b), clock, _ = await two_backends(path)
    backends = (a, b)
    held: list[tuple[int, str, str, int]] = []  # (backend, lease id, owner, token)
    tokens: set[int] = set()
    try:
        for i, o in enumerate(ops):
            kind = o[0]
            try:
                if kind == "request":
                    _, who, res, now, wait = o
                    owner, p = f"o{who}", proc(1 + who)
                    got = backends[who].request_now(T, owner, (res,), 10.0, p) if now else None
                    if got is None:
                        s = await backends[who].request(
                            T, owner, (res,), ttl=10.0, key=None, proc=p, wait=wait
                        )
                        got = (s.lease_id, s.rank, s.token, 0.0) if s.token else None
                    if got is not None:
                        token = got[2]
                        assert token not in tokens, (i, o, "a token handed out again")
                        assert all(token > t for t in tokens), (i, o, "a token went back")
                        tokens.add(token)
                        held.append((who, got[0], owner, token))
                elif kind in ("release", "heartbeat") and held:
                    who, lease_id, owner, token = held[-1 - o[2] % len(held)]
                    bk = backends[(who + o[1]) % 2]  # maybe not the one that took it
                    if kind == "heartbeat":
                        await bk.heartbeat(T, lease_id, owner, proc(1 + who))
                    elif not bk.release_now(T, lease_id, owner, token):
                        await bk.release(T, lease_id, owner, token)
                elif kind == "advance":
                    clock.advance(o[1])
                elif kind == "reap":
                    await backends[o[1]].reap()
            except (LeaseHeld, LeaseLost, LeaseNotFound, InvalidResource):
                pass
            t = file_table(path)
            granted = [r for r in t.reqs.values() if r.state == "granted"]
            for res in FILES:
                holders = [r for r in granted if res in r.resources and r.expires > clock.now()]
                assert len(holders) <= 1, (i, o, res, holders)
            # a waiter is never left behind a free resource (what a release must hand off)
            for r in t.reqs.values():
                if r.state != "granted":
                    assert any(set(g.resources) & set(r.resources) for g in granted), (i, o)
            assert t.next_token > max(tokens, default=0), (i, o)
    finally:
        await close(list(backends))


@settings(deadline=None, max_examples=150)
@given(ops=st.lists(op, min_size=1, max_size=30))
# the two orderings that each MOVE_ condition is for (found by the search, kept)
@example(ops=[("request", 0, "a", False, False), ("release", 0, 0),
              ("request", 1, "b", False, False), ("release", 0, 0),
              ("request", 0, "a", True, False)])  # fmt: skip
@example(ops=[("request", 0, "a", False, False), ("release", 0, 0),
              ("request", 0, "a", True, False), ("request", 1, "a", False, True),
              ("release", 0, 0)])  # fmt: skip
def test_two_connections_interleaved_never_grant_twice_nor_reuse_a_token(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[Any, ...]]
) -> None:
    anyio.run(run_ops, tmp_path_factory.mktemp("moves") / "s.db", ops)


async def warm(b: SQLiteLeases) -> None:
    """A request and its release through ``b``: its cache is then the empty table."""
    s = await b.request(T, "w", ("w",), ttl=10.0, key=None, proc=proc(9), wait=False)
    await b.release(T, s.lease_id, "w", s.token)


async def stale_grant(path: Path) -> tuple[int, int] | None:
    """a's cache is the empty table at counters (R, T); b then takes and releases a lease and
    takes another (with a key: row 0 stays in place); a asks at once on its stale cache:
    (the token it got, the token b holds), or None."""
    (a, b), _, _ = await two_backends(path)
    try:
        await warm(a)
        await warm(b)
        held = await b.request(T, "B", ("b",), ttl=10.0, key=("s", 1), proc=proc(2), wait=False)
        got = a.request_now(T, "A", ("a",), 10.0, proc(1))
        return None if got is None else (got[2], held.token)  # type: ignore[return-value]
    finally:
        await close([a, b])


async def test_a_stale_empty_cache_hands_out_no_token_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert await stale_grant(tmp_path / "one.db") is None
    # Negative control: without its check of row 0's counters, the statement grants with
    # token T, below the one b holds.
    unchecked = MOVE_GRANT.replace(" AND next_rank = ?1 AND next_token = ?3", "")
    assert unchecked != MOVE_GRANT
    monkeypatch.setattr(leases_mod, "MOVE_GRANT", unchecked)
    got = await stale_grant(tmp_path / "two.db")
    assert got is not None and got[0] < got[1]  # an older token than the one b holds


async def stale_release(path: Path) -> list[tuple[str, str]]:
    """a holds "a" (one statement); b queues for it; a releases at once on its cache, else
    the awaited way: the (owner, state) rows left."""
    (a, b), _, _ = await two_backends(path)
    try:
        await warm(a)
        got = a.request_now(T, "A", ("a",), 10.0, proc(1))
        assert got is not None
        waiting = await b.request(T, "B", ("a",), ttl=10.0, key=None, proc=proc(2), wait=True)
        assert waiting.state == "waiting_on_lock"
        if not a.release_now(T, got[0], "A", got[2]):
            await a.release(T, got[0], "A", got[2])
        return [(r.owner, r.state) for r in file_table(path).reqs.values()]
    finally:
        await close([a, b])


async def test_a_release_with_a_waiter_queued_elsewhere_hands_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert await stale_release(tmp_path / "one.db") == [("B", "granted")]
    # Negative control: without its check of the ranks above, the statement releases and
    # leaves the waiter waiting for nobody.
    unchecked = MOVE_RETIRE.split(" AND (SELECT")[0]
    monkeypatch.setattr(leases_mod, "MOVE_RETIRE", unchecked)
    assert await stale_release(tmp_path / "two.db") == [("B", "waiting")]
