"""The fast path of ``JournalReplay.apply_rows`` (``_apply_fresh``: groups that no key's
provenance places after, as an opening, a compaction or most tails apply) must leave the same
document and provenance as the general path (``_apply_general``) on the same groups: for
random journals of three writers that see each other late (distinct keys, overwrites,
concurrent writes that lose, deletes, lists and texts, a name registered as two kinds),
with damaged entries, from nothing and from a snapshot, and with groups delivered again
(late rows, which both take through the general path).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from crdtstore import CollectionKindMismatch
from crdtstore._journal import Row, checksum
from crdtstore.record._provenance import Meta
from crdtstore.record._replica import Replica
from tests.strategies import Op, _plan, json_scalars, list_ops, text_ops

AGENTS = ("alice", "bob", "carol")
MAPS = ("m0", "m1", "l0")  # l0 is also a list: concurrent writers may register it as both


class _General(Replica):
    """A replica whose every group goes through the general path."""

    def _apply_fresh(self, rows: list[Row], run: str, settle: bool) -> None:
        self._apply_general(rows, run, settle, late=False)


_keys = st.one_of(st.sampled_from("abcd"), st.integers(0, 10_000).map(lambda i: f"k{i}"))
_values = st.one_of(st.integers(0, 3), json_scalars())  # (often equal: ties to tell apart)
_map_ops = st.one_of(
    st.builds(lambda n, k, v: Op("map", n, "set", (k, v)), st.sampled_from(MAPS), _keys, _values),
    st.builds(lambda n, k: Op("map", n, "del", (k,)), st.sampled_from(MAPS), _keys),
    # two keys set in one entry (possibly the same key twice)
    st.builds(
        lambda n, k, v, k2, v2: Op("map", n, "pair", (k, v, k2, v2)),
        st.sampled_from(MAPS),
        _keys,
        _values,
        _keys,
        _values,
    ),
)
_steps = st.lists(
    st.tuples(
        st.integers(0, len(AGENTS) - 1),  # the writer
        st.integers(0, 100),  # the percentage of the journal it has seen before writing
        st.one_of(_map_ops, _map_ops, _map_ops, list_ops(), text_ops()),
    ),
    min_size=8,
    max_size=60,
)


def _set_two(k: str, v: Any, k2: str, v2: Any, root: Any) -> None:
    root[k] = v
    root[k2] = v2


def _journal(steps: list[tuple[int, int, Op]], corrupt: set[int]) -> list[Row]:
    """Rows written by three replicas that see each other's entries only as far as each step
    says; rows whose position is in ``corrupt`` get a wrong checksum."""
    writers = [Replica() for _ in AGENTS]
    seen = [0] * len(writers)
    rows: list[Row] = []
    for n, (w, sync, op) in enumerate(steps):
        rep = writers[w]
        for row in rows[seen[w] : len(rows) * sync // 100]:
            if row.client_id != rep.client_id:
                rep.apply_update(row.update)
        seen[w] = max(seen[w], len(rows) * sync // 100)
        try:
            root = rep.root(op.name, op.kind)
        except CollectionKindMismatch:
            continue
        if op.action == "pair":
            k, v, k2, v2 = op.args
            effect: list[Any] = [["map", op.name, "set", k, v], ["map", op.name, "set", k2, v2]]
            mutate: Callable[[Any], None] = partial(_set_two, k, v, k2, v2)
        else:
            plan = _plan(op, rep.read(op.name, op.kind))
            if plan is None:
                continue
            effect, mutate = plan
        meta = Meta(AGENTS[w], "tool", 1000.0 + n, None)
        update = rep.local(effect, partial(mutate, root), meta)
        assert update is not None
        seq = len(rows) + 1
        crc = checksum(update) ^ (1 if seq in corrupt else 0)
        rows.append(Row(seq, AGENTS[w], "tool", rep.client_id, 1000.0 + n, update, effect, crc))
        if seen[w] == seq - 1:
            seen[w] = seq
    return rows


def _state(rep: Replica) -> Any:
    keys = {(c, k) for c in rep.index for k in rep.index[c]}
    return (
        rep.to_dict(),
        {ck: rep.meta(*ck) for ck in sorted(keys)},
        list(rep.table.seqs),  # (before export_state, which sweeps it)
        rep.export_state(),
        [(e.seq, e.reason) for e in rep.skipped],
        rep.head,
        dict(rep.coll_seq),
    )


def _start(rep: Replica, snapshot: Replica | None) -> Replica:
    if snapshot is not None:
        rep.apply_update(snapshot.doc.get_update())
        rep.import_state(snapshot.export_state())
    return rep


def _apply(rep: Replica, rows: list[Row], sizes: list[int], again: set[int], own: bool) -> Replica:
    """Apply ``rows`` in groups of the given sizes (cycled), delivering the groups numbered
    in ``again`` twice in a row (late rows)."""
    at = i = 0
    while at < len(rows):
        group = rows[at : at + sizes[i % len(sizes)]]
        rep.apply_rows(group, "r", settle=False, own=own)
        if i in again:
            rep.apply_rows(group, "r", settle=False, own=own)
        at += len(group)
        i += 1
    rep._settle()
    return rep


@example(  # one key set to one value twice in a group: only the later entry is kept
    steps=[(0, 0, Op("map", "m0", "set", ("a", 0))), (0, 0, Op("map", "m0", "set", ("a", 0)))],
    sizes=[2],
    again=set(),
    corrupt=set(),
    snapshot=0,
    own=False,
)
@example(  # the same, two collections in the group
    steps=[
        (0, 0, Op("map", "m1", "set", ("b", 1))),
        (0, 0, Op("map", "m0", "set", ("a", 0))),
        (0, 0, Op("map", "m0", "pair", ("a", 0, "c", 1))),
    ],
    sizes=[3],
    again=set(),
    corrupt=set(),
    snapshot=0,
    own=False,
)
@given(
    steps=_steps,
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    again=st.sets(st.integers(0, 20), max_size=2),
    corrupt=st.sets(st.integers(1, 60), max_size=2),
    snapshot=st.integers(0, 60),
    own=st.booleans(),
)
def test_fresh_path_equals_general_path(
    steps: list[tuple[int, int, Op]],
    sizes: list[int],
    again: set[int],
    corrupt: set[int],
    snapshot: int,
    own: bool,
) -> None:
    rows = _journal(steps, corrupt)
    snapshot = min(snapshot, len(rows))
    snap = None
    if snapshot:  # start from a snapshot of the first entries, as an opening may
        snap = _General()
        snap.apply_rows(rows[:snapshot], "r")
    rest = rows[snapshot:]
    fast = _apply(_start(Replica(), snap), rest, sizes, again, own)
    general = _apply(_start(_General(), snap), rest, sizes, again, own)
    assert _state(fast) == _state(general)


def test_a_concurrent_write_that_loses_keeps_the_earlier_provenance() -> None:
    """Negative control: on both paths, a later entry whose concurrent write loses (the lower
    client id) is not the key's provenance: the fast path reads the key, it does not take
    the group's one write of it as the winner."""
    hi, lo = sorted((Replica(), Replica()), key=lambda r: r.client_id, reverse=True)
    rows = []
    for seq, (rep, value) in enumerate(((hi, "kept"), (lo, "lost")), start=1):
        effect: list[Any] = [["map", "m", "set", "k", value]]
        root = rep.root("m", "map")
        update = rep.local(
            effect,
            partial(root.__setitem__, "k", value),
            Meta("a", "t", 1.0, None),
        )
        assert update is not None
        rows.append(Row(seq, "a", "t", rep.client_id, 1.0, update, effect, checksum(update)))
    for make in (Replica, _General):
        rep = make()
        rep.apply_rows(rows[:1], "r", own=False)
        rep.apply_rows(rows[1:], "r", own=False)  # (a group of its own: the fast path)
        meta = rep.meta("m", "k")
        assert (rep.to_dict()["m"]["k"], meta and meta.seq) == ("kept", 1)
