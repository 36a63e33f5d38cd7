"""The Redis store's stream read (``_backends/redis/_tail.py``) wakes a run's readers for the
entries of others only: the entries of a run's one reader here come back to it through the
stream read too (often before its append's answer), and wake nobody; with two readers of
one run in one store, each one's entries still reach the other."""

from __future__ import annotations

import pytest

import crdtstore
from crdtstore._backends.redis._tail import Tail
from crdtstore._journal import NewEntry, checksum
from tests._redis import RedisServer
from tests._wait import until


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's client is asyncio only


@pytest.mark.anyio
async def test_own_entries_wake_nobody_others_do(redis_server: RedisServer) -> None:
    url = redis_server.url(prefix="tail-own")
    async with (
        crdtstore.open_store(url) as a,
        crdtstore.open_store(url) as b,
        a.open_record(run="r", agent="a", source="tool") as ra,
        b.open_record(run="r", agent="b", source="tool") as rb,
    ):
        tail = a.backend.tail
        assert tail is not None
        woken: list[tuple[str, str]] = []
        wake = tail._wake
        tail._wake = lambda tenant, run: (woken.append((tenant, run)), wake(tenant, run))[1]
        stream = a.backend.keys.run_keys(a.tenant, "r").stream
        for i in range(20):
            await ra.map("m").set(f"a{i}", i)
        await ra.flush()
        head = await a.backend.head(a.tenant, "r")
        await until(lambda: tail.seen({stream: "r"}).get("r", 0) >= head)
        assert woken == []  # its own entries, read back by the stream read: no wake-up
        assert ra.applied_seq == head
        await rb.map("m").set("b", 1)
        await rb.flush()
        await until(lambda: ra.map("m").get("b") == 1)
        assert woken and set(woken) == {(a.tenant, "r")}


@pytest.mark.anyio
async def test_two_readers_of_one_run_in_one_store_see_each_other(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url(prefix="tail-two")
    async with (
        crdtstore.open_store(url) as store,
        store.open_record(run="r", agent="x", source="tool") as rx,
        store.open_record(run="r", agent="y", source="tool") as ry,
    ):
        for i in range(10):
            await rx.map("m").set(f"x{i}", i)
            await ry.map("m").set(f"y{i}", i)
        await rx.flush()
        await ry.flush()
        await until(lambda: ry.map("m").get("x9") == 9 and rx.map("m").get("y9") == 9)
        assert len(rx.map("m")) == len(ry.map("m")) == 20


def _entries(first: int, n: int, client: int) -> list[NewEntry]:
    return [
        NewEntry("a", "tool", client, 1.0, b"u%d" % i, [], checksum(b"u%d" % i))
        for i in range(first, first + n)
    ]


def _stream_entries(first: int, entries: list[NewEntry]) -> list[list[object]]:
    """``XREAD`` entries of ``entries`` at positions from ``first`` (as the append writes)."""
    out: list[list[object]] = []
    for i, e in enumerate(entries):
        c, k = str(e.client_id).encode(), str(e.checksum).encode()
        f = [b"a", b"a", b"s", b"tool", b"c", c, b"w", b"1.0", b"u", e.update, b"e", b"[]",
             b"k", k, b"o", b"", b"l", b""]  # fmt: skip
        out.append([f"{first + i}-0".encode(), f])
    return out


@pytest.mark.parametrize("gap", [True, False])
def test_own_entries_past_a_gap_wake_the_reader(gap: bool) -> None:
    """A record that commits while entries of others before its own are unread cannot take
    its position past its own entries: the stream read that brings them wakes it, even
    though they are its own (else it stayed behind its own head until the next write of
    someone else). Negative control: own entries right after what it had wake nobody."""
    woken: list[str] = []
    tail = Tail(lambda: None, None, lambda tenant, run: woken.append(run))
    tail.healthy = True
    stream, own, other = "s", 7, 8
    tail.watch_run(stream, "meta", "t", "r", 0, own)
    if gap:  # 1-2 written by another process, unread; 3-4 this store's, answered first
        tail.wrote(stream, 3, _entries(3, 2, own))
        tail._handle({b"s": _stream_entries(1, _entries(1, 2, other))})
        assert woken == ["r"]
        assert [r.seq for r in tail.cached(stream, 0, 10) or []] == [1, 2]
    else:  # 1-2 this store's, answered before the stream read brought them
        tail.wrote(stream, 1, _entries(1, 2, own))
        assert tail.cached(stream, 0, 10) is not None
    woken.clear()
    first = 3 if gap else 1
    tail._handle({b"s": _stream_entries(first, _entries(first, 2, own))})
    assert woken == (["r"] if gap else [])


def test_own_entries_brought_back_are_not_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream read brings this store's own appends back: when the append's answer came
    first (its entries are kept already), they are not read again; entries of others are
    kept as the stream read brought them and read only when a reader takes them."""
    from crdtstore._backends.redis import _tail

    parsed: list[object] = []
    row_of = _tail.row_of
    monkeypatch.setattr(_tail, "row_of", lambda e: (parsed.append(e), row_of(e))[1])
    tail = Tail(lambda: None, None, lambda tenant, run: None)
    tail.healthy = True
    stream, own, other = "s", 7, 8
    tail.watch_run(stream, "meta", "t", "r", 0, own)
    tail.wrote(stream, 1, _entries(1, 3, own))
    kept = tail.cached(stream, 0, 10)
    tail._handle({b"s": _stream_entries(1, _entries(1, 3, own))})
    assert parsed == []
    assert tail.cached(stream, 0, 10) == kept
    tail._handle({b"s": _stream_entries(4, _entries(4, 2, other))})
    assert parsed == []  # (not read until a reader takes them)
    got = tail.cached(stream, 3, 10)
    assert [(r.seq, r.client_id, r.update) for r in got or []] == [(4, 8, b"u4"), (5, 8, b"u5")]
    assert len(parsed) == 2
    assert tail.cached(stream, 3, 10) == got and len(parsed) == 2  # (read once)


def test_an_entry_unlike_the_kept_one_is_read() -> None:
    """A stream entry at a position this store kept an append of is skipped only when it is
    that very entry (client id and checksum): another one there (the run deleted and made
    again meanwhile) replaces it; and an own entry the stream read brings before the
    append's answer is kept, and read when a second reader of the run takes it."""
    tail = Tail(lambda: None, None, lambda tenant, run: None)
    tail.healthy = True
    stream, own, other = "s", 7, 8
    tail.watch_run(stream, "meta", "t", "r", 0, own)
    tail.wrote(stream, 1, _entries(1, 2, own))
    tail._handle({b"s": _stream_entries(1, _entries(11, 2, other))})
    got = tail.cached(stream, 0, 10) or []
    assert [(r.client_id, r.update) for r in got] == [(8, b"u11"), (8, b"u12")]
    tail._handle({b"s": _stream_entries(3, _entries(3, 1, own))})  # before its answer
    tail.wrote(stream, 3, _entries(3, 1, own))
    assert [(r.seq, r.update) for r in tail.cached(stream, 2, 10) or []] == [(3, b"u3")]


@pytest.mark.anyio
async def test_entries_of_others_are_applied_by_the_stream_read(
    redis_server: RedisServer,
) -> None:
    """A record whose tail waits takes the entries of another process in from the stream
    read's wake-up itself (``Watch.direct``): its tail task is not woken for them. Not while
    a local transaction is open (they wait for its end, in the tail task), nor when a
    second reader of the run shares the watch."""
    url = redis_server.url(prefix="tail-direct")
    async with (
        crdtstore.open_store(url) as a,
        crdtstore.open_store(url) as b,
        a.open_record(run="r", agent="a", source="tool") as ra,
        b.open_record(run="r", agent="b", source="tool") as rb,
    ):
        watch = b.notifier.watch(b.tenant, "r")
        b.notifier.unwatch(b.tenant, "r")  # (only looked at: rb stays its one user)
        await until(lambda: watch.direct is not None)
        event = watch.event
        for i in range(5):
            await ra.map("m").set(f"a{i}", i)
            await ra.flush()
            await until(lambda i=i: rb.map("m").get(f"a{i}") == i)
        assert watch.event is event  # (never fired: the tail task slept through)
        async with rb.transaction():
            await ra.map("m").set("in-txn", 1)
            await ra.flush()
            await until(lambda: watch.event is not event)  # woken: the task waits for the txn
            assert rb.map("m").get("in-txn") is None
        await until(lambda: rb.map("m").get("in-txn") == 1)
        async with b.open_record(run="r", agent="c", source="tool") as rc:
            event = watch.event
            await ra.map("m").set("two", 2)
            await ra.flush()
            await until(lambda: rb.map("m").get("two") == 2 and rc.map("m").get("two") == 2)
            assert watch.event is not event
