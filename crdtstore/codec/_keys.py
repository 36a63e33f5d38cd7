"""Which map entry an item id is: the index the record keeps of its document's map entries, so
that an external update's overwrites (which name only the entry they replace) and deletions
(which name only item ids) are read as writes to keys. No I/O, no pycrdt.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from typing import Any

from ._v1 import Decoded

__all__ = ["KeyIndex", "Ref"]

Ref = tuple[Any, str]  # (parent, key): the root name or a nested type's id, and the key


class KeyIndex:
    """Which map entry an item id is: ``(client, clock) -> (parent, key)``, for the items with a
    ``parentSub`` of one document (tombstones included: a later overwrite names its origin, a
    delete set names the ids).

    A cache of facts: an item's parent and key never change, and an id names one item in
    every replica. Per client, sorted runs of clocks (an ``array`` of starts and of ends, and
    the ``(parent, key)`` of each run, shared between the runs of one key): about 24 bytes per
    run, most runs one item long (a run of deleted entries of one key, in a document's
    encoding, is one).
    """

    __slots__ = ("_clients", "_cover", "_refs")

    def __init__(self) -> None:
        self._clients: dict[int, tuple[array[int], array[int], list[Ref]]] = {}
        self._refs: dict[Ref, Ref] = {}
        # per client, the ids known merged into intervals whatever their key (a delete set
        # of a whole history is checked against a few of them, not every run)
        self._cover: dict[int, tuple[array[int], array[int]]] = {}

    def __len__(self) -> int:
        return sum(len(runs[0]) for runs in self._clients.values())

    def find(self, client: int, clock: int) -> Ref | None:
        """The ``(parent, key)`` of the entry holding the id, None when not known."""
        runs = self._clients.get(client)
        if runs is None:
            return None
        starts, ends, refs = runs
        i = bisect_right(starts, clock) - 1
        if i >= 0 and clock < ends[i]:
            return refs[i]
        return None

    def covers(self, client: int, clock: int, length: int) -> bool:
        """Whether every id of ``clock .. clock + length - 1`` is a known map entry."""
        cover = self._cover.get(client)
        if cover is None:
            return False
        starts, ends = cover
        i = bisect_right(starts, clock) - 1
        return i >= 0 and ends[i] >= clock + length

    def _covered(self, client: int, clock: int, end: int) -> None:
        cover = self._cover.get(client)
        if cover is None:
            cover = self._cover[client] = (array("q"), array("q"))
        starts, ends = cover
        if not starts or clock > ends[-1]:
            starts.append(clock)
            ends.append(end)
            return
        if clock >= starts[-1]:  # touches or overlaps the last interval
            ends[-1] = max(ends[-1], end)
            return
        i = bisect_right(starts, clock) - 1
        if i >= 0 and ends[i] >= clock:
            lo = i
            clock = starts[i]
        else:
            lo = i + 1
        hi = lo
        while hi < len(starts) and starts[hi] <= end:
            end = max(end, ends[hi])
            hi += 1
        starts[lo:hi] = array("q", [clock])
        ends[lo:hi] = array("q", [end])

    def overlapping(self, client: int, clock: int, length: int) -> list[tuple[int, int, Ref]]:
        """The runs ``(start, end, ref)`` with an id in ``clock .. clock + length - 1``."""
        runs = self._clients.get(client)
        if runs is None:
            return []
        starts, ends, refs = runs
        i = max(bisect_right(starts, clock) - 1, 0)
        end = clock + length
        out = []
        while i < len(starts) and starts[i] < end:
            if ends[i] > clock:
                out.append((starts[i], ends[i], refs[i]))
            i += 1
        return out

    def add(self, client: int, clock: int, length: int, ref: Ref) -> bool:
        """Record that ids ``clock .. clock + length - 1`` of ``client`` write ``ref`` (what is
        known already is left as it is); return whether the first id was not known."""
        ref = self._refs.setdefault(ref, ref)
        end = clock + length
        self._covered(client, clock, end)
        runs = self._clients.get(client)
        if runs is None:
            runs = self._clients[client] = (array("q"), array("q"), [])
        starts, ends, refs = runs
        if not starts or clock >= ends[-1]:  # the usual case: past every run known
            if starts and clock == ends[-1] and refs[-1] is ref:
                ends[-1] = end
            else:
                starts.append(clock)
                ends.append(end)
                refs.append(ref)
            return True
        i = bisect_right(starts, clock) - 1
        fresh = True
        if i >= 0 and ends[i] > clock:
            clock = ends[i]  # the start is known
            fresh = False
        i += 1
        while clock < end:
            nxt = starts[i] if i < len(starts) else end
            if clock < nxt:
                stop = min(nxt, end)
                starts.insert(i, clock)
                ends.insert(i, stop)
                refs.insert(i, ref)
                i += 1
                clock = stop
            else:
                clock = max(clock, ends[i])
                i += 1
        return fresh

    def copy(self) -> KeyIndex:
        """An independent copy (for a scratch replica made from this one's document)."""
        other = KeyIndex()
        other._refs = dict(self._refs)
        other._cover = {c: (array("q", a), array("q", b)) for c, (a, b) in self._cover.items()}
        other._clients = {
            c: (array("q", starts), array("q", ends), list(refs))
            for c, (starts, ends, refs) in self._clients.items()
        }
        return other

    def index(self, decoded: Decoded) -> tuple[list[Ref | None], list[bool]]:
        """Add the map entries of ``decoded`` (an update, or a document's encoding); return
        each entry's ``(parent, key)`` (None for an entry whose origin is not known: it cannot
        be integrated either) and whether it was new to the index."""
        out: list[Ref | None] = []
        fresh = [False] * len(decoded.entries)
        waiting: list[int] = []
        for n, item in enumerate(decoded.entries):
            ref: Ref | None = None
            if item.key is not None:
                ref = (item.parent, item.key)
            elif item.origin is not None:
                ref = self.find(*item.origin)  # (this update's own items are added as read)
            if ref is None:
                waiting.append(n)
            else:
                fresh[n] = self.add(item.client, item.clock, item.length, ref)
            out.append(ref)
        # origins later in the update (another client's items): resolve until nothing moves
        while waiting:
            still = []
            for n in waiting:
                item = decoded.entries[n]
                assert item.origin is not None
                ref = self.find(*item.origin)
                if ref is None:
                    still.append(n)
                else:
                    fresh[n] = self.add(item.client, item.clock, item.length, ref)
                    out[n] = ref
            if len(still) == len(waiting):
                break
            waiting = still
        return out, fresh
