"""The grant rule, without I/O.

A waiting request is granted when none of its resources is held and none is wanted by an
earlier waiting request. Evaluated in rank order, one pass: a request that stays waiting
"reserves" its resources against every later one, so grants per resource happen in rank order
(FIFO), a request only ever waits on earlier ones (no deadlock: the earliest waiting request
waits only on holders, which end by release or TTL), and later requests for unrelated
resources are granted at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple


class QueueEntry(NamedTuple):
    """One request as the grant rule sees it."""

    rank: int
    resources: frozenset[str]
    granted: bool


def grant_order(queue: Iterable[QueueEntry]) -> list[int]:
    """The ranks of the waiting requests that become granted now, in rank order."""
    entries = sorted(queue, key=lambda e: e.rank)
    held: set[str] = set()
    for e in entries:
        if e.granted:
            held |= e.resources
    wanted: set[str] = set()
    out: list[int] = []
    for e in entries:
        if e.granted:
            continue
        if e.resources.isdisjoint(held) and e.resources.isdisjoint(wanted):
            out.append(e.rank)
            held |= e.resources
        else:
            wanted |= e.resources
    return out


def blockers(queue: Sequence[QueueEntry], rank: int) -> list[int]:
    """The ranks of the requests that directly keep request ``rank`` waiting: holders of its
    resources and earlier waiting requests that want one of them."""
    me = next((e for e in queue if e.rank == rank), None)
    if me is None or me.granted:
        return []
    return sorted(
        e.rank
        for e in queue
        if e.rank != rank
        and (e.granted or e.rank < rank)
        and not e.resources.isdisjoint(me.resources)
    )
