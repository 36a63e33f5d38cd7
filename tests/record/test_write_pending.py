"""The pending queue of a single map set: its ops are tuples (once the cyclic GC has looked at
them it stops tracking them, so a writer far ahead of the journal does not fill the oldest
generation), as are those of a set inside a transaction; and what they journal is what the
general path journals for the same set."""

from __future__ import annotations

import gc
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

import crdtstore

_keys = st.sampled_from(["a", "b", "k", "é", "long" * 10])
_values = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
    | st.lists(st.integers(0, 9), max_size=3)
    | st.dictionaries(st.text(max_size=2), st.integers(0, 9), max_size=2)
)


@pytest.mark.anyio
async def test_pending_single_sets_of_scalars_are_untracked() -> None:
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record("r", "writer", "tool") as rec,
    ):
        m = rec.map("m")
        for i in range(50):
            await m.set(f"k{i}", i if i % 2 else f"v{i}")  # no task switch: all stay pending
        await m.set("d", {"nested": [1]})
        pending = list(rec._pending)
        assert len(pending) == 51
        # (a collection looks at the 1-tuple before its op, which it then untracks: the next
        # collection, of the generation the 1-tuple has moved to, untracks that)
        gc.collect()
        gc.collect()
        for _, ops, _ in pending[:50]:
            assert not gc.is_tracked(ops) and not gc.is_tracked(ops[0])
            assert ops[0][:3] == ("map", "m", "set")
        assert gc.is_tracked(pending[50][1])  # (a container value keeps its op tracked)
        async with rec.transaction():
            for i in range(5):
                await m.set(f"t{i}", i)
        (_, ops, _) = rec._pending[-1]
        gc.collect()
        assert len(ops) == 5 and not any(gc.is_tracked(op) for op in ops)
        await rec.flush()
        assert not rec._pending
        assert [e.effect for e in await rec.journal(0, 100)][:2] == [
            [["map", "m", "set", "k0", "v0"]],
            [["map", "m", "set", "k1", 1]],
        ]


async def _journal(writes: list[tuple[str, Any]], how: str) -> tuple[Any, ...]:
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record("r", "writer", "tool") as rec,
    ):
        m = rec.map("m")
        for key, value in writes:
            if how == "set":
                await m.set(key, value)
            elif how == "txn":  # the op joins the transaction's list
                async with rec.transaction():
                    await m.set(key, value)
            else:  # the general path: ops as the collections build them, and an apply
                await m.update({key: value})
        await rec.flush()
        entries = await rec.journal(0, 10_000)
        rows = await store._backend.read(store.tenant, "r", 0)
        provenance = {k: (p.agent, p.seq) for k in m if (p := m.provenance(k))}
        return (
            [e.effect for e in entries],
            [[list(op) for op in row.effect] for row in rows],
            m.to_dict(),
            provenance,
        )


@given(writes=st.lists(st.tuples(_keys, _values), min_size=1, max_size=10))
def test_single_sets_journal_what_the_general_path_journals(writes: Any) -> None:
    single = anyio.run(_journal, writes, "set")
    assert single == anyio.run(_journal, writes, "txn") == anyio.run(_journal, writes, "update")
    effects, rows, _, _ = single
    assert effects == rows == [[["map", "m", "set", k, v]] for k, v in writes]
