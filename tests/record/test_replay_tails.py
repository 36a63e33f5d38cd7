"""A load (``apply_rows(..., settle=False)`` then ``_settle()``: an opening, a compaction) keeps
the positions it indexes in the packed runs' tails, bytes in arrays, not a ``str`` key each in
the dicts until it ends; it must leave the same document and provenance as applying the same
groups with ``settle=True`` (the dicts, settled as they grow), for random journals of three
writers (overwrites, losing concurrent writes, deletes, lists, texts, damaged entries), from
nothing or from a snapshot, with provenance read in the middle of the load (which packs the
tails early), a small ``settle_min`` (so that the dicts settle too) and small transactions
(a call's groups taking different paths).
"""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

from hypothesis import example, given
from hypothesis import strategies as st

from crdtstore._journal import Row
from crdtstore.record import _replay
from crdtstore.record._provenance import _Settled
from crdtstore.record._replica import Replica
from tests.record.test_replay_fresh import _General, _journal, _start, _steps
from tests.strategies import Op


def _keys_of(rows: list[Row]) -> list[tuple[str, str]]:
    """Every map key the entries ``rows`` wrote (so both replicas are asked the same)."""
    return sorted({(op[1], op[3]) for row in rows for op in row.effect if op[0] == "map"})


def _load(
    rep: Replica,
    rows: list[Row],
    sizes: list[int],
    probes: set[int],
    load: bool,
    keys: list[tuple[str, str]],
) -> tuple[Replica, list[Any]]:
    """Apply ``rows`` in groups of the given sizes (cycled), as a load (``settle=False``,
    packed at the end) or not; after the groups numbered in ``probes``, read every key's
    provenance. Return the replica and what the probes read."""
    read: list[Any] = []
    at = i = 0
    while at < len(rows):
        group = rows[at : at + sizes[i % len(sizes)]]
        rep.apply_rows(group, "r", settle=not load, own=False)
        if i in probes:
            read.append({ck: rep.meta(*ck) for ck in keys})
        at += len(group)
        i += 1
    if load:
        rep._settle()
    return rep, read


def _state(rep: Replica, keys: list[tuple[str, str]]) -> Any:
    return (
        rep.to_dict(),
        {ck: rep.meta(*ck) for ck in keys},
        {ck: rep.agent_of(*ck) for ck in keys},
        rep.export_state(),  # (settles every collection and sweeps the entry table first)
        [(e.seq, e.reason) for e in rep.skipped],
        rep.head,
        dict(rep.coll_seq),
    )


@example(  # a call's first group indexes "a" in the dict, its second one in the tail
    steps=[
        (0, 0, Op("map", "m0", "pair", ("a", 1, "b", 2))),
        (0, 0, Op("map", "m1", "set", ("x", 1))),
        (0, 0, Op("map", "m0", "set", ("a", 5))),
        (0, 0, Op("map", "m0", "set", ("c", 6))),
    ],
    sizes=[4],
    probes={0},
    corrupt=set(),
    snapshot=0,
    settle_min=4096,
    group=2,
)
@given(
    steps=_steps,
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    probes=st.sets(st.integers(0, 12), max_size=2),
    corrupt=st.sets(st.integers(1, 60), max_size=1),
    snapshot=st.integers(0, 60),
    settle_min=st.sampled_from([2, 5, 4096]),
    group=st.sampled_from([2, 3, 32]),  # entries per pycrdt transaction (_APPLY_GROUP)
)
def test_a_load_through_the_tails_equals_settling_as_it_goes(
    steps: list[tuple[int, int, Op]],
    sizes: list[int],
    probes: set[int],
    corrupt: set[int],
    snapshot: int,
    settle_min: int,
    group: int,
) -> None:
    rows = _journal(steps, corrupt)
    snapshot = min(snapshot, len(rows))
    snap = None
    if snapshot:
        snap = _General()
        snap.apply_rows(rows[:snapshot], "r")
    rest = rows[snapshot:]
    loaded, general = Replica(), Replica()
    loaded.settle_min = general.settle_min = settle_min
    keys = _keys_of(rows)
    with patch.object(_replay, "_APPLY_GROUP", group):  # (several groups in a call)
        loaded, read_loaded = _load(_start(loaded, snap), rest, sizes, probes, True, keys)
        general, read_general = _load(_start(general, snap), rest, sizes, probes, False, keys)
    assert read_loaded == read_general
    assert _state(loaded, keys) == _state(general, keys)


def test_a_load_holds_no_key_in_the_dicts() -> None:
    """The mechanism itself: between the groups of a load no key is held as a ``str`` in a
    dict (all wait in the tail, as bytes), and ``_settle`` packs them, each key named."""
    rows = _journal([(0, 100, Op("map", "m0", "set", (f"k{i}", i))) for i in range(300)], set())
    rep = Replica()
    for at in range(0, len(rows), 64):
        rep.apply_rows(rows[at : at + 64], "r", settle=False, own=False)
        assert not any(rep.index.values())
        assert rep._tails()
    rep._settle()
    assert not rep._tails()
    assert len(rep._settled["m0"]) == 300
    assert [rep.meta("m0", f"k{i}").seq for i in range(300)] == list(range(1, 301))  # type: ignore[union-attr]


@given(
    steps=st.lists(
        st.tuples(
            st.booleans(),  # append to the tail (else merge a dict, which packs it first)
            st.dictionaries(st.text("ab\x00\udc80é", max_size=3), st.integers(0, 2**40)),
        ),
        max_size=8,
    ),
    probe=st.text("ab\x00\udc80é", max_size=3),
)
def test_tail_and_merge_answer_as_a_dict(
    steps: list[tuple[bool, dict[str, int]]], probe: str
) -> None:
    settled, model = _Settled(), {}
    for tail, new in steps:
        if tail:
            settled.append(list(new), new.values())
        else:
            settled.merge(new)
        model.update(new)
    assert settled.get(probe) == model.get(probe)
    assert settled.keys == sorted(model)
    assert list(settled.seqs) == [model[k] for k in sorted(model)]
    assert len(settled) == len(model)
