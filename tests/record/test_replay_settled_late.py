"""A late row (journaled before entries this replica already holds) that writes a key to
the value it has now must not take the key's provenance from the later entry, also when the
key's position was settled into the packed index (the write path settles big collections):
of concurrent writes of the same value, the one later in the journal is named."""

from __future__ import annotations

from functools import partial
from typing import Any

from crdtstore._journal import Row, checksum
from crdtstore.record._provenance import Meta
from crdtstore.record._replica import Replica


def _set(key: str, value: Any, root: Any) -> None:
    root[key] = value


def _write(rep: Replica, key: str, value: Any, agent: str, wall: float) -> tuple[Any, Meta, bytes]:
    effect: list[Any] = [["map", "m", "set", key, value]]
    meta = Meta(agent, "tool", wall, None)
    update = rep.local(effect, partial(_set, key, value, rep.root("m", "map")), meta)
    assert update is not None
    return effect, meta, update


def _late_row_keeps_the_later_writer(settle_min: int) -> None:
    a, b = Replica(), Replica()
    a.settle_min = settle_min
    # b's write of k, journaled first (1), not yet read by a
    effect_b, _, update_b = _write(b, "k", "v", "bob", 1.0)
    row_b = Row(1, "bob", "tool", b.client_id, 1.0, update_b, effect_b, checksum(update_b))
    # a writes the same value concurrently, journaled at 2, then other keys (3..), so the
    # collection settles with k in it
    effect_a, meta_a, _ = _write(a, "k", "v", "alice", 2.0)
    a.journaled(effect_a, meta_a, 2)
    for i in range(8):
        effect, meta, _ = _write(a, f"other{i}", i, "alice", 3.0 + i)
        a.journaled(effect, meta, 3 + i)
    if settle_min < 10:
        assert "k" not in a.index.get("m", {}), "k is settled"
    got = a.meta("m", "k")
    assert got is not None and got.seq == 2
    a.apply_rows([row_b], "r")  # late: a's head is 10
    assert a.to_dict()["m"]["k"] == "v"
    got = a.meta("m", "k")
    assert got is not None and (got.seq, got.agent) == (2, "alice")


def test_a_late_row_keeps_the_later_writer_in_the_dict() -> None:
    _late_row_keeps_the_later_writer(settle_min=10**9)  # never settled


def test_a_late_row_keeps_the_later_writer_once_settled() -> None:
    _late_row_keeps_the_later_writer(settle_min=4)
