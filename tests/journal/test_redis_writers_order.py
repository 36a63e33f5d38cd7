"""Two writers of one run on Redis, their appends refused now and then by a held authority
lock and held back by a paused server: the journal is dense, holds each writer's entries in
the order they were written, every reader reaches the head (also past its own entries, see
``Tail.wrote``), and a fresh record replays it to the writers' state."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import crdtstore
from tests._redis import RedisServer
from tests._wait import until


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's client is asyncio only


STEP = st.one_of(
    # (with a checkpoint after each write, the committer may take each in an append of its own)
    st.tuples(st.just("write"), st.integers(0, 1), st.integers(1, 6), st.booleans()),
    st.tuples(st.just("yield"), st.integers(1, 3)),
    st.tuples(st.just("lock"), st.integers(1, 5)),  # held for that many ms
    st.tuples(st.just("pause"), st.integers(1, 5)),  # the server holds writes back (ms)
    st.tuples(st.just("flush"), st.integers(0, 1)),
)


@settings(max_examples=25)
@given(st.lists(STEP, min_size=1, max_size=25))
def test_writers_journal_in_order_and_readers_reach_the_head(
    redis_server: RedisServer, steps: list[tuple[object, ...]]
) -> None:
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
