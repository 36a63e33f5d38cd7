"""Pipelined appends on Redis (``_backends/redis/_pipelined.py``): a committer sends its next
batch while the one before is in flight; the append script refuses a batch ("behind",
nothing written) unless the one before it is in the journal, so a refused or failed append
is never overtaken by a later one. Against the general path: the journal of writers whose
appends are pipelined (and refused now and then by a held authority lock) is dense, holds
each writer's entries in the order they were written, and replays to the writers' state."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import crdtstore
from crdtstore._journal import NewEntry, checksum
from tests._redis import RedisServer
from tests._wait import until


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's client is asyncio only


def entry(i: int) -> NewEntry:
    update = f"update {i}".encode()
    return NewEntry("a", "tool", 7, 1000.0 + i, update, [], checksum(update))


async def sent(backend: object, *args: object) -> object:
    """``append_pipelined`` once its connection is up (the first call connects it)."""
    send = backend.append_pipelined  # type: ignore[attr-defined]
    return await until(lambda: send(*args), "the pipelined connection")


@pytest.mark.anyio
async def test_a_batch_lands_only_behind_the_one_sent_before_it(
    redis_server: RedisServer,
) -> None:
    async with (
        crdtstore.open_store(redis_server.url()) as store,
        store.open_record(run="r", agent="a", source="tool") as rec,
    ):
        await rec.map("m").set("first", 0)
        await rec.flush()  # (an append the usual way loads the script into the server)
        backend, tenant = store.backend, store.tenant
        lock = backend.keys.run_keys(tenant, "r").lock  # type: ignore[attr-defined]
        client = backend.client  # type: ignore[attr-defined]
        # two in flight at once: both appended, in the order sent, at dense positions
        a = await sent(backend, tenant, "r", [entry(1), entry(2)], None)
        b = backend.append_pipelined(tenant, "r", [entry(3)], a)  # type: ignore[attr-defined]
        assert b is not None and not a.done()  # type: ignore[attr-defined]
        await b.wait()
        assert (a.positions(), b.positions()) == ([2, 3], [4])  # type: ignore[attr-defined]
        # one refused (the run's authority is held): the one behind it is refused too, even
        # once the lock is gone (negative control: behind an appended one, it lands)
        await client.set(lock, "someone", px=30_000)
        refused = await sent(backend, tenant, "r", [entry(4)], None)
        await refused.wait()  # type: ignore[attr-defined]
        assert refused.positions() is None  # type: ignore[attr-defined]
        await client.delete(lock)
        behind = await sent(backend, tenant, "r", [entry(5)], refused)
        await behind.wait()  # type: ignore[attr-defined]
        assert behind.positions() is None  # type: ignore[attr-defined]
        assert await backend.head(tenant, "r") == 4
        after_b = await sent(backend, tenant, "r", [entry(5)], b)
        await after_b.wait()  # type: ignore[attr-defined]
        assert after_b.positions() == [5]  # type: ignore[attr-defined]
        rows = (await backend.read(tenant, "r", 0))[1:]
        assert [r.update for r in rows] == [entry(i).update for i in (1, 2, 3, 5)]


@pytest.mark.anyio
async def test_the_committer_pipelines_and_keeps_the_order(redis_server: RedisServer) -> None:
    async with (
        crdtstore.open_store(redis_server.url()) as store,
        store.open_record(run="r", agent="a", source="tool") as rec,
    ):
        backend: object = store.backend
        send = backend.append_pipelined  # type: ignore[attr-defined]
        sends: list[bool] = []  # whether each batch sent went behind another

        def counting(tenant: str, run: str, entries: object, after: object) -> object:
            got = send(tenant, run, entries, after)
            if got is not None:
                sends.append(after is not None)
            return got

        backend.append_pipelined = counting  # type: ignore[attr-defined]
        m = rec.map("m")
        i = 0
        while not sends:  # (until the committer's connection is up)
            await m.set(f"k{i}", i)
            await rec.flush()
            i += 1
        with redis_server.client() as admin:
            # the server holds back writes: the committer's batch stays in flight
            admin.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")
            try:
                for _ in range(2):
                    n = len(sends)
                    await m.set(f"k{i}", i)
                    i += 1
                    await until(lambda n=n: len(sends) > n, "the batch to be sent")
            finally:
                admin.execute_command("CLIENT", "UNPAUSE")
        await rec.flush()
        assert sends[-2:] == [False, True], "the second batch went behind the first"
        for _ in range(100):
            await m.set(f"k{i}", i)
            i += 1
            await anyio.lowlevel.checkpoint()
        await rec.flush()
        rows = await store.backend.read(store.tenant, "r", 0)
        assert [r.seq for r in rows] == list(range(1, i + 1))
        assert [r.effect[0][3] for r in rows] == [f"k{j}" for j in range(i)]


STEP = st.one_of(
    # (a checkpoint after each write: the committer sends it behind the batch in flight)
    st.tuples(st.just("write"), st.integers(0, 1), st.integers(1, 6), st.booleans()),
    st.tuples(st.just("yield"), st.integers(1, 3)),
    st.tuples(st.just("lock"), st.integers(1, 5)),  # held for that many ms
    st.tuples(st.just("pause"), st.integers(1, 5)),  # the server holds writes back (ms)
    st.tuples(st.just("flush"), st.integers(0, 1)),
)


@settings(max_examples=25)
@given(st.lists(STEP, min_size=1, max_size=25))
def test_pipelined_writers_journal_in_order(redis_server: RedisServer, steps: list) -> None:
    async def main() -> None:
        url = redis_server.url()
        async with (
            crdtstore.open_store(url) as s0,
            crdtstore.open_store(url) as s1,
            s0.open_record(run="r", agent="w0", source="tool") as r0,
            s1.open_record(run="r", agent="w1", source="tool") as r1,
        ):
            recs = (r0, r1)
            lock = s0.backend.keys.run_keys(s0.tenant, "r").lock  # type: ignore[attr-defined]
            client = s0.backend.client  # type: ignore[attr-defined]
            for w, (store, rec) in enumerate(((s0, r0), (s1, r1))):  # connect the pipelines
                send = store.backend.append_pipelined  # type: ignore[attr-defined]
                up: list[object] = []
                store.backend.append_pipelined = (  # type: ignore[attr-defined]
                    lambda *a, send=send, up=up: up.append(send(*a)) or up[-1]
                )
                while not any(up):
                    await rec.map("warm").set(f"w{w}", len(up))
                    await rec.flush()
            written = [0, 0]
            for step in steps:
                if step[0] == "write":
                    _, w, n, each = step
                    for _ in range(n):
                        await recs[w].map("m").set(f"w{w}-{written[w]}", written[w])
                        written[w] += 1
                        if each:
                            await anyio.lowlevel.checkpoint()
                elif step[0] == "yield":
                    for _ in range(step[1]):
                        await anyio.lowlevel.checkpoint()
                elif step[0] == "lock":  # appends meanwhile are refused, then wait it out
                    await client.set(lock, "test", px=step[1])
                elif step[0] == "pause":  # appends meanwhile stay in flight
                    await client.execute_command("CLIENT", "PAUSE", step[1], "WRITE")
                else:
                    await recs[step[1]].flush()
            for rec in recs:
                await rec.flush()
            rows = await s0.backend.read(s0.tenant, "r", 0)
            assert [r.seq for r in rows] == list(range(1, len(rows) + 1))  # dense
            order: dict[str, list[int]] = {"w0": [], "w1": []}
            for r in rows:
                for op in r.effect:
                    if op[1] == "m":
                        order[r.agent].append(int(op[3].split("-")[1]))
            assert order == {"w0": list(range(written[0])), "w1": list(range(written[1]))}
            await until(lambda: r0.applied_seq == r1.applied_seq == len(rows))
            async with s0.open_record(run="r", agent="x", source="tool") as fresh:
                want = {f"w{w}-{i}": i for w in (0, 1) for i in range(written[w])}
                assert fresh.map("m").to_dict() == r0.map("m").to_dict() == want

    anyio.run(main, backend="asyncio")
