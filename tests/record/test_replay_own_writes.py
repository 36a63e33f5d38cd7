"""A replica with writes of its own receiving remote journal entries in batches.

``Replica.apply_rows`` reads the value before the batch of each key whose provenance names
a later entry than the batch's row writing it (the replica's own write, journaled after
those rows or not journaled yet), and keeps that provenance when the batch leaves the value
as it was: two writes of one value cannot be told apart by the document, and every replica
names the one latest in the journal. These tests pin that the replica's own write stays
named, in any batching, and that a batching names what applying the rows one by one names.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from crdtstore._journal import Op, Row, checksum
from crdtstore.record._provenance import Meta
from crdtstore.record._replica import Replica

KEYS = 4

# (writer 0 or 1, key, value, delete?) of the remote writers; they never see each other
remote_st = st.lists(
    st.tuples(st.integers(0, 1), st.integers(0, KEYS - 1), st.integers(0, 1), st.booleans()),
    min_size=1,
    max_size=30,
)
# the replica's own writes: key -> value, made before the remote rows are applied
own_st = st.dictionaries(st.integers(0, KEYS - 1), st.integers(0, 1), min_size=1)


def _remote_rows(steps: list[tuple[int, int, int, bool]], own: dict[int, int]) -> list[Row]:
    """Rows of two remote writers. A key the replica wrote is only ever set by them to the
    value the replica wrote (its value never changes); other keys get any value or none."""
    writers = [Replica(), Replica()]
    rows: list[Row] = []
    for w, k, v, delete in steps:
        if k in own:
            v, delete = own[k], False
        rep, key = writers[w], f"k{k}"
        root = rep.root("m", "map")
        if delete and key not in root:
            continue
        ops: list[Op] = [["map", "m", "del", key]] if delete else [["map", "m", "set", key, v]]

        def apply(root: Any = root, key: str = key, delete: bool = delete, v: int = v) -> None:
            if delete:
                del root[key]
            else:
                root[key] = v

        seq = len(rows) + 1
        update = rep.local(ops, apply, Meta(f"w{w}", "tool", float(seq), None))
        assert update is not None
        rows.append(
            Row(seq, f"w{w}", "tool", rep.client_id, float(seq), update, ops, checksum(update))
        )
    return rows


def _with_own_writes(own: dict[int, int], journal_at: int | None) -> list[Replica]:
    """Two replicas in the same state: one made the writes ``own`` (journaled from position
    ``journal_at`` on, after every remote row, or not yet when None); the other took in its
    document and provenance."""
    rep = Replica()
    root = rep.root("m", "map")
    for k, v in own.items():
        ops: list[Op] = [["map", "m", "set", f"k{k}", v]]
        meta = Meta("me", "tool", 0.5, None)

        def apply(key: str = f"k{k}", v: int = v) -> None:
            root[key] = v

        assert rep.local(ops, apply, meta) is not None
        if journal_at is not None:
            rep.journaled(ops, meta, journal_at)
            journal_at += 1
    twin = Replica()
    twin.apply_update(rep.doc.get_update())
    twin.root("m", "map")  # (as a replica that wrote to it holds it)
    twin.index = {name: dict(keys) for name, keys in rep.index.items()}
    twin.import_state({"table": rep.table.export(), "head": rep.head, "coll_seq": rep.coll_seq})
    return [rep, twin]


def _provenance(rep: Replica) -> dict[str, Any]:
    return {f"k{k}": rep.meta("m", f"k{k}") for k in range(KEYS)}


@given(
    remote=remote_st,
    own=own_st,
    journaled=st.booleans(),
    cuts=st.lists(st.integers(1, 30), max_size=6),
)
def test_own_writes_keep_their_provenance_in_any_batching(
    remote: list[tuple[int, int, int, bool]],
    own: dict[int, int],
    journaled: bool,
    cuts: list[int],
) -> None:
    rows = _remote_rows(remote, own)
    one_by_one, batched = _with_own_writes(own, len(rows) + 1 if journaled else None)
    for row in rows:
        one_by_one.apply_rows([row], "r")
    start = 0
    for cut in [*sorted(set(cuts)), len(rows)]:
        batched.apply_rows(rows[start:cut], "r")
        start = max(start, cut)
    assert batched.to_dict() == one_by_one.to_dict()
    assert _provenance(batched) == _provenance(one_by_one)
    assert batched.head == one_by_one.head
    assert dict(batched.coll_seq) == dict(one_by_one.coll_seq)
    current = batched.to_dict()["m"]
    for k, v in own.items():
        # the remote rows left the value as the replica wrote it: its own write stays named
        assert current[f"k{k}"] == v
        meta = batched.meta("m", f"k{k}")
        assert meta is not None and meta.agent == "me", (k, meta)
        assert meta.seq is None if not journaled else meta.seq > len(rows)
    for key, value in current.items():
        if int(key[1:]) not in own:  # a remote write of that value, the latest one
            meta = batched.meta("m", key)
            assert meta is not None and meta.seq is not None
            assert rows[meta.seq - 1].effect[0][2:] == ["set", key, value]
