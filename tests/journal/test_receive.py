"""Receiving remote journal entries: ``Replica.apply_rows`` applies a batch in one pycrdt
transaction and reads the touched keys back through it. These tests pin that the batching
does not change what the document holds nor which entry each key's provenance names, with
concurrent writers (LWW losers must not be named), any batching of the journal, and a name
registered concurrently as another kind.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from crdtstore._journal import Op, Row, checksum
from crdtstore.record._provenance import Meta
from crdtstore.record._replica import Replica

WRITERS = 3
KEYS = 4

# (writer, key, delete?) or a sync (from, to): writer ``to`` takes in everything ``from`` has
steps_st = st.lists(
    st.one_of(
        st.tuples(
            st.just("w"),
            st.integers(0, WRITERS - 1),
            st.integers(0, KEYS - 1),
            st.booleans(),
        ),
        st.tuples(st.just("s"), st.integers(0, WRITERS - 1), st.integers(0, WRITERS - 1)),
    ),
    min_size=1,
    max_size=40,
)


def _journal(steps: list[tuple[Any, ...]]) -> list[Row]:
    """Rows in a causal order (each appended when written; a writer only takes in entries
    already journaled); every set writes a value no other entry writes (its position)."""
    writers = [Replica() for _ in range(WRITERS)]
    rows: list[Row] = []
    for step in steps:
        if step[0] == "s":
            src, dst = writers[step[1]], writers[step[2]]
            if src is not dst:
                dst.apply_update(src.doc.get_update())
            continue
        _, w, k, delete = step
        rep, seq, key = writers[w], len(rows) + 1, f"k{k}"
        root = rep.root("m", "map")
        if delete and key not in root:
            continue
        ops: list[Op] = [["map", "m", "del", key]] if delete else [["map", "m", "set", key, seq]]

        def apply(root: Any = root, key: str = key, delete: bool = delete, seq: int = seq) -> None:
            if delete:
                del root[key]
            else:
                root[key] = seq

        update = rep.local(ops, apply, Meta(f"w{w}", "tool", float(seq), None))
        assert update is not None
        rows.append(
            Row(seq, f"w{w}", "tool", rep.client_id, float(seq), update, ops, checksum(update))
        )
    return rows


@given(steps=steps_st, cuts=st.lists(st.integers(1, 40), max_size=10))
def test_batched_apply_names_the_writer_of_every_current_value(
    steps: list[tuple[Any, ...]], cuts: list[int]
) -> None:
    rows = _journal(steps)
    one_by_one, batched = Replica(), Replica()
    for row in rows:
        one_by_one.apply_rows([row], "r")
    start = 0
    for cut in [*sorted(set(cuts)), len(rows)]:
        batched.apply_rows(rows[start:cut], "r")
        start = max(start, cut)
    assert batched.to_dict() == one_by_one.to_dict()
    assert batched.head == one_by_one.head == (rows[-1].seq if rows else 0)
    assert not batched.skipped
    current = batched.to_dict().get("m", {})
    for key, value in current.items():
        # values are unique: the entry that wrote the value is the provenance, in any batching
        for rep in (batched, one_by_one):
            meta = rep.meta("m", key)
            assert meta is not None, key
            assert meta.seq == value, (key, meta)
            assert meta.agent == rows[value - 1].agent


def test_a_name_registered_concurrently_as_another_kind_in_one_batch() -> None:
    as_map, as_list = Replica(), Replica()

    def set_key() -> None:
        as_map.root("c", "map")["k"] = 1

    def append() -> None:
        as_list.root("c", "list").append(2)

    rows = []
    for seq, (rep, ops, apply) in enumerate(
        [
            (as_map, [["map", "c", "set", "k", 1]], set_key),
            (as_list, [["list", "c", "append", 2]], append),
        ],
        start=1,
    ):
        update = rep.local(ops, apply, Meta(f"a{seq}", "tool", 0.0, None))
        assert update is not None
        rows.append(Row(seq, f"a{seq}", "tool", rep.client_id, 0.0, update, ops, checksum(update)))
    for order in (rows, rows[::-1]):
        replica = Replica()
        replica.apply_rows(order, "r")  # no CollectionKindMismatch escapes
        kind = replica.collections()["c"]
        assert kind in ("map", "list")
        meta = replica.meta("c", "k")
        # the map write is only named when the registry says "c" is a map
        assert (meta is not None and meta.agent == "a1") == (kind == "map")
        assert replica.coll_seq["c"] == order[-1].seq
