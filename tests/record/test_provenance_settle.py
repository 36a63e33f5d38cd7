"""Settling on the write path: a collection's journaled positions move from its dict into the
packed :class:`_Settled` run as the dict grows, and every lookup answers as an index that
never settles.

The model is a :class:`ProvenanceIndex` whose ``settle_min`` is never reached; the one under
test settles after a handful of keys, so random writes, overwrites, deletes, out-of-order
positions, adoptions, table sweeps and snapshot round trips cross many settle boundaries.
"""

from __future__ import annotations

import json
from typing import Any
from unittest.mock import patch

from hypothesis import given
from hypothesis import strategies as st

from crdtstore._journal import Op
from crdtstore.record import _settled
from crdtstore.record._provenance import Meta, ProvenanceIndex, _Settled

COLLS = ("m", "n")
KEYS = ("k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "", "é", "\U0001f600", "z" * 40)
AGENTS = ("alice", "bob")
NEVER = 10**9  # a settle_min no test reaches: the model never settles on the write path


def _index(settle_min: int) -> ProvenanceIndex:
    index = ProvenanceIndex()
    index.settle_min = settle_min
    return index


class _Pair:
    """The index under test and the model, driven alike."""

    def __init__(self, settle_min: int) -> None:
        self.settle_min = settle_min
        self.live = _index(settle_min)
        self.model = _index(NEVER)
        self.pending: list[tuple[bytes, list[Op], Meta]] = []
        self.next = 1  # the next fresh journal position
        self.holes: list[int] = []  # positions skipped by a later remote entry, still free
        self.wall = 0.0

    def both(self) -> tuple[ProvenanceIndex, ProvenanceIndex]:
        return self.live, self.model

    def position(self) -> int:
        if self.holes:
            return self.holes.pop(0)
        self.next += 1
        return self.next - 1

    def write(self, coll: str, keys: list[str], agent: str, delete: bool) -> None:
        """A local entry (sets or deletes): its Meta in the dicts, as the document does."""
        self.wall += 1
        meta = Meta(agent, "tool", self.wall, None, "")
        ops: list[Op] = [
            ["map", coll, "del", k] if delete else ["map", coll, "set", k, self.wall] for k in keys
        ]
        for index in self.both():
            for op in ops:
                index.index.setdefault(coll, {})[op[3]] = meta
        self.pending.append((b"", ops, meta))

    def flush(self, n: int, one_by_one: bool) -> None:
        batch, self.pending = self.pending[:n], self.pending[n:]
        seqs = [self.position() for _ in batch]
        for index in self.both():
            if one_by_one:
                for (_, ops, meta), seq in zip(batch, seqs, strict=True):
                    index.journaled(ops, meta, seq)
            else:
                index.journaled_many(batch, seqs)

    def adopt(self, coll: str, key: str, agent: str) -> None:
        """A later remote entry names the key: the next local entries land before it."""
        seq = self.next + 2
        self.holes.extend(range(self.next, seq))
        self.next = seq + 1
        self.wall += 1
        for index in self.both():
            index.adopt(coll, key, seq, agent, "user", self.wall, "r")

    def sweep(self) -> None:
        for index in self.both():
            index.table.keep(index._live_seqs())

    def round_trip(self) -> None:
        """The index under test through a snapshot (only with nothing pending: an entry not
        journaled yet comes back as a list, no longer the Meta its journaling looks for)."""
        if self.pending:
            return
        state = json.loads(json.dumps(self.live.export_state()))
        self.live = _index(self.settle_min)
        self.live.import_state(state)

    def check(self) -> None:
        for coll in (*COLLS, "never"):
            for key in (*KEYS, "absent"):
                expected = self.model.meta(coll, key)
                assert self.live.meta(coll, key) == expected, (coll, key)
                assert self.live.agent_of(coll, key) == (expected and expected.agent)
        assert self.live.head == self.model.head
        assert self.live.coll_seq == self.model.coll_seq


_keys = st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True)
_actions = st.lists(
    st.one_of(
        st.tuples(
            st.just("write"), st.sampled_from(COLLS), _keys, st.sampled_from(AGENTS), st.booleans()
        ),
        st.tuples(st.just("flush"), st.integers(1, 6), st.booleans()),
        st.tuples(
            st.just("adopt"), st.sampled_from(COLLS), st.sampled_from(KEYS), st.sampled_from(AGENTS)
        ),
        st.tuples(st.just("sweep")),
        st.tuples(st.just("round_trip")),
    ),
    max_size=60,
)


@given(st.integers(1, 8), st.integers(1, 5), _actions)
def test_settling_while_writing_answers_as_never_settling(
    settle_min: int, chunk: int, actions: list[tuple[Any, ...]]
) -> None:
    with patch.object(_settled, "_CHUNK", chunk):  # merges cross chunk boundaries
        pair = _Pair(settle_min)
        for action in actions:
            getattr(pair, action[0])(*action[1:])
            pair.check()
        pair.flush(len(pair.pending), one_by_one=False)
        pair.check()
        # a snapshot of each holds the same: every journaled key packed, the same table rows
        assert pair.live.export_state() == pair.model.export_state()


_runs = st.dictionaries(
    st.text(st.characters(exclude_categories=()), max_size=4), st.integers(0, 10**12), max_size=40
)


@given(st.lists(_runs, min_size=1, max_size=4), st.integers(1, 6))
def test_settled_merge_in_chunks_answers_as_a_dict(runs: list[dict[str, int]], chunk: int) -> None:
    settled, expected = _Settled(), {}
    with patch.object(_settled, "_CHUNK", chunk):
        for new in runs:
            settled.merge(dict(new))
            expected.update(new)
            assert settled.keys == sorted(expected)
            assert list(settled.seqs) == [expected[k] for k in sorted(expected)]
    for key, seq in expected.items():
        assert settled.get(key) == seq
    assert settled.get("\x00absent") is None or "\x00absent" in expected


def test_write_path_settles_amortised() -> None:
    # 2,000 single-set entries on one collection, journaled in batches of 10, settle_min 16:
    # the dict stays at most about half the settled run, settled a logarithmic number of times
    pair = _Pair(16)
    settle_one = pair.live._settle_one
    merges: list[int] = []

    def counted(name: str, keys: dict[str, Any]) -> None:
        merges.append(len(keys))
        settle_one(name, keys)

    pair.live._settle_one = counted  # type: ignore[method-assign]
    for i in range(2_000):
        pair.write("m", [f"k{i}"], "alice", delete=False)
        if len(pair.pending) == 10:
            pair.flush(10, one_by_one=False)
            settled = len(pair.live._settled.get("m", ()))
            assert len(pair.live.index["m"]) <= max(16, settled // 2) + 10
    assert len(pair.live._settled["m"]) + len(pair.live.index["m"]) == 2_000
    assert len(pair.model.index["m"]) == 2_000  # the model never settles
    assert 5 <= len(merges) <= 16  # (16 * 1.5 ** 12 > 2,000)
    pair.check()


def test_pending_entries_do_not_settle_every_write() -> None:
    # more entries not journaled yet than settle_min: once settled, the dict is settled again
    # only when journaled positions have grown by settle_min, not on every write
    pair = _Pair(4)
    for i in range(20):
        pair.write("m", [f"p{i}"], "bob", delete=False)
    pair.write("m", ["k0"], "alice", delete=False)
    pair.flush(0, one_by_one=False)
    pending, pair.pending = pair.pending[:20], pair.pending[20:]
    pair.flush(1, one_by_one=True)  # k0 journaled: the dict (21 keys) is settled
    assert len(pair.live._settled["m"]) == 1 and len(pair.live.index["m"]) == 20
    assert pair.live._settle_at["m"] == 20 + 4
    pair.pending = pending
    pair.check()
