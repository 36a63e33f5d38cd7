"""The committer's group commit at C speed: the memory journal's ``append_columns`` (a batch
by columns, packed into blocks at once) and ``journaled_many``'s path for a run of single map
sets, each checked against the plain path it stands in for."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

import crdtstore
from crdtstore._backends.memory._journal import _BLOCK, _DIRECT, MemoryJournal
from crdtstore._journal import NewEntry
from crdtstore.record._provenance import Meta, ProvenanceIndex
from crdtstore.record._replica import Replica


def _entry(i: int, agent: str) -> NewEntry:
    effect = [["map", "m", "set", f"k{i}", {"v": i, "f": 0.5}]]
    return NewEntry(agent, "tool", 7, 1.0 + i, b"u%d" % i, effect, i, "", "c" if i % 3 else "")


def _columns(entries: list[NewEntry]) -> list[list[Any]]:
    cols = [list(col) for col in zip(*entries, strict=True)]
    # a column of one value as that value alone, as the committer gives it
    return [
        col[:1] if col.count(col[0]) == len(col) and i != 3 else col for i, col in enumerate(cols)
    ]


# appends of a few entries (kept as tuples) and of a group commit's many (packed at once)
_SIZES = st.sampled_from([1, 3, _DIRECT - 1, _DIRECT, _BLOCK + 1, 2 * _BLOCK + 7])


@given(
    steps=st.lists(st.tuples(st.booleans(), _SIZES, st.booleans()), min_size=1, max_size=6),
    afters=st.lists(st.integers(0, 3000), min_size=1, max_size=4),
)
def test_columns_and_entries_interleaved_read_back_in_order(
    steps: list[tuple[bool, int, bool]], afters: list[int]
) -> None:
    """Whatever mix of ``append`` and ``append_columns`` (of one or several writers), every
    row reads back at its position, as appended, from any position on."""

    async def main() -> None:
        journal = MemoryJournal("memory://")
        await journal.ensure_run("t", "r", create=True)
        expected: list[NewEntry] = []
        for by_columns, size, mixed in steps:
            base = len(expected)
            entries = [_entry(base + i, "b" if mixed and i % 2 else "a") for i in range(size)]
            if by_columns:
                seqs = await journal.append_columns("t", "r", _columns(entries), durable=False)
            else:
                seqs = await journal.append("t", "r", entries, durable=False)
            assert seqs == list(range(base + 1, base + size + 1))
            expected += entries
        assert await journal.head("t", "r") == len(expected)
        for after in afters:
            after %= len(expected) + 1
            rows = await journal.read("t", "r", after, limit=600)
            want = expected[after : after + 600]
            assert [r.seq for r in rows] == list(range(after + 1, after + 1 + len(want)))
            assert [tuple(r[1:]) for r in rows] == [tuple(e) for e in want]

    anyio.run(main)


@pytest.mark.anyio
async def test_a_record_commits_by_columns_and_reads_back() -> None:
    """A group commit to memory:// (many single sets) goes by columns; another record reads
    every entry, with its writer's names, and a compaction keeps them."""
    async with crdtstore.open_store("memory://", auto_compact=None) as store:
        async with store.open_record("r", "alice", "tool") as a:
            m = a.map("m")
            for i in range(3 * _DIRECT):
                await m.set(f"k{i}", i)
            await a.flush()
            entries = await a.journal(0, limit=10_000)
            assert [e.seq for e in entries] == list(range(1, 3 * _DIRECT + 1))
            assert {(e.agent, e.source) for e in entries} == {("alice", "tool")}
            async with store.open_record("r", "bob", "user") as b:
                assert b.map("m").to_dict() == {f"k{i}": i for i in range(3 * _DIRECT)}
                assert b.provenance("m", "k5").seq == 6  # type: ignore[union-attr]


def _batch(
    index: ProvenanceIndex, writes: list[tuple[int, int]], names: list[str]
) -> list[tuple[bytes, Any, Meta]]:
    """Single-set entries (key number, writer number) as the write path leaves them: every
    key pointing at its entry's Meta, the later write of a key winning."""
    keys = index.index.setdefault("m", {})
    batch = []
    for n, (key, writer) in enumerate(writes):
        meta = Meta(names[writer], "tool", 10.0 + n, None, "")
        op = ("map", "m", "set", f"k{key}", n)
        keys[f"k{key}"] = meta
        batch.append((b"u", (op,), meta))
    return batch


@given(
    writes=st.one_of(
        # distinct keys (the run's path when one writer made them) or any
        st.lists(st.integers(0, 40), min_size=8, max_size=30, unique=True),
        st.lists(st.integers(0, 12), min_size=8, max_size=30),
    ).flatmap(
        lambda keys: st.lists(st.integers(0, 1), min_size=len(keys), max_size=len(keys)).map(
            lambda who: list(zip(keys, who, strict=True))
        )
    ),
    start=st.integers(1, 5),
    writers=st.sampled_from([["a", "a"], ["a", "b"]]),
    settle_min=st.sampled_from([4, 4096]),
    by_columns=st.booleans(),
)
def test_journaled_run_matches_the_entry_by_entry_path(
    writes: list[tuple[int, int]],
    start: int,
    writers: list[str],
    settle_min: int,
    by_columns: bool,
) -> None:
    """``journaled_many`` of a batch of single sets leaves the provenance index exactly as
    the entry-by-entry loop does, whether it takes the run's path (distinct keys, one
    writer) or not (a key written twice, two writers), settling or not, given the batch's
    columns (as the committer gave them to the backend) or not."""
    fast, plain = Replica(), Replica()
    for replica in (fast, plain):
        replica.settle_min = settle_min
        replica.journaled([["map", "m", "set", "k0", 0]], Meta("z", "user", 1.0, None), 1)
    seqs = list(range(start + 1, start + 1 + len(writes)))
    batch = _batch(fast, writes, writers)
    plain_batch = _batch(plain, writes, writers)
    columns = None
    if by_columns:
        columns = _columns(
            [
                NewEntry(m.agent, m.source, 7, m.wall_time, u, ops, 0, m.run, m.call)
                for u, ops, m in batch
            ]
        )
    took = fast._journaled_run(batch, seqs, columns)  # (when it does not, it changes nothing)
    if not took:
        fast.journaled_many(batch, seqs, columns)
    ProvenanceIndex.journaled_many(plain, plain_batch, seqs)
    one_writer = len({writers[w] for _, w in writes}) == 1
    assert took == (len({k for k, _ in writes}) == len(writes) and one_writer)
    assert fast.index == plain.index
    assert {n: (s.keys, list(s.seqs)) for n, s in fast._settled.items()} == {
        n: (s.keys, list(s.seqs)) for n, s in plain._settled.items()
    }
    for attr in ("seqs", "walls", "who"):
        assert list(getattr(fast.table, attr)) == list(getattr(plain.table, attr))
    assert (fast.head, fast.coll_seq) == (plain.head, plain.coll_seq)
