"""The packed part of a collection's provenance index: its journaled keys sorted, as one
UTF-8 byte string with offsets, and their journal positions in arrays (:class:`_Settled`),
with the unsorted tail a load appends to in journal order.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from itertools import accumulate, chain, islice, repeat
from operator import add


def _compact(values: array[int]) -> array[int]:
    """``values`` as 4-byte unsigned items when they all fit (journal positions and offsets
    into a run's keys nearly always do), else as they are."""
    if not values or (min(values) >= 0 and max(values) < 1 << 32):
        return array("I", values)
    return values


class _Settled:
    """The journaled part of one collection's provenance index, packed: its keys sorted, as
    one UTF-8 byte string with an array of offsets, and their journal positions in an array
    (4-byte items while they fit: 8 bytes a key besides its UTF-8 bytes, where a ``str``
    object alone takes 50-60 and a dict entry with an int about 70 more). Looked up by
    bisection; newer positions live in the collection's dict, which takes
    precedence, until the next :meth:`merge`. (UTF-8 byte order is code point order, so the
    order is that of the keys as ``str``.) A load adds positions in journal order to an
    unsorted tail (:meth:`append`), newer than the sorted part, packed on first use."""

    __slots__ = ("_blob", "_ends", "_offs", "_tail", "_tail_seqs", "seqs")

    def __init__(self) -> None:
        self._blob = b""
        self._offs = array("q", [0])
        self.seqs = array("q")
        # (the tail's buffers are made here, before any load: see _pack)
        self._tail = bytearray()  # keys appended, UTF-8, in journal order
        self._ends = array("q")  # where each appended key ends in _tail
        self._tail_seqs = array("q")

    def __len__(self) -> int:
        return len(self.seqs) + len(self._tail_seqs)

    @property
    def keys(self) -> list[str]:
        """The keys, sorted (a new list: for export and tests, not for lookups)."""
        self._pack()
        return [k.decode("utf-8", "surrogatepass") for k in self._encoded()]

    def sorted_seqs(self) -> array[int]:
        """:attr:`seqs` with the tail packed in (the positions in the order of :attr:`keys`)."""
        self._pack()
        return self.seqs

    def all_seqs(self) -> tuple[array[int], array[int]]:
        """Every position held, packed or in the tail (a superset of the live ones: a tail
        entry may replace another), without packing."""
        return self.seqs, self._tail_seqs

    def _encoded(self) -> list[bytes]:
        blob, offs = self._blob, self._offs
        return [blob[a:b] for a, b in zip(offs, islice(offs, 1, None), strict=False)]

    def get(self, key: str) -> int | None:
        if self._tail_seqs:
            self._pack()
        k = key.encode("utf-8", "surrogatepass")
        lo, hi = 0, len(self.seqs)
        blob, offs = self._blob, self._offs
        while lo < hi:
            mid = (lo + hi) // 2
            if blob[offs[mid] : offs[mid + 1]] < k:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self.seqs) and blob[offs[lo] : offs[lo + 1]] == k:
            return self.seqs[lo]
        return None

    def append(self, keys: Sequence[str], seqs: Iterable[int]) -> None:
        """Add ``keys`` (journal position ``seqs[i]`` for ``keys[i]``), newer than every
        position held, to the tail: bytes in arrays, not a ``str`` and an ``int`` per key
        held until the load ends (their memory pools stay with the process once freed when
        anything else was allocated among them, see ``bench/memory.py``)."""
        ends = self._ends
        start = ends[-1] if ends else 0
        joined = "".join(keys)
        if joined.isascii():  # (the usual case: one encoding, a str's length its bytes')
            ends.extend(islice(accumulate(map(len, keys), initial=start), 1, None))
            self._tail += joined.encode("ascii")
        else:
            encoded = [k.encode("utf-8", "surrogatepass") for k in keys]
            ends.extend(islice(accumulate(map(len, encoded), initial=start), 1, None))
            self._tail += b"".join(encoded)
        self._tail_seqs.extend(seqs)

    def _pack(self) -> None:
        """Merge the tail into the sorted part.

        What survives is made before the keys become objects (the new arrays first, then
        filled): an object made among many short-lived ones keeps their memory pool, and
        its arena, in the process once they are freed.
        """
        tail_seqs = self._tail_seqs
        if not tail_seqs:
            return
        wide = (
            min(tail_seqs) < 0
            or max(tail_seqs) >= 1 << 32
            or (bool(self.seqs) and self.seqs.typecode != "I")
        )
        seqs_out = array("q" if wide else "I")
        offs_out = array("q" if len(self._blob) + len(self._tail) >= 1 << 32 else "I", [0])
        tail, ends = bytes(self._tail), self._ends
        new = dict(
            zip(
                [tail[a:b] for a, b in zip(chain((0,), ends), ends, strict=False)],
                tail_seqs,
                strict=True,
            )
        )
        del tail
        self._merge_into(new, offs_out, seqs_out)
        del new
        del self._tail[:], ends[:], tail_seqs[:]  # (in place: the objects stay)

    def _set(self, keys: list[bytes], seqs: array[int]) -> None:
        self._blob = b"".join(keys)
        offs = array("q", [0])
        offs.extend(accumulate(map(len, keys)))
        self._offs = _compact(offs)
        self.seqs = _compact(seqs)

    @classmethod
    def of_sorted(cls, keys: Sequence[str], seqs: array[int]) -> _Settled:
        """A run from keys already sorted (a snapshot's) and their positions."""
        run = cls()
        run._set([k.encode("utf-8", "surrogatepass") for k in keys], seqs)
        return run

    def merge(self, new: dict[str, int]) -> None:
        """Take in ``new`` (key -> position), replacing the positions of keys already here.

        At C speed but for a few steps per chunk of old keys: the run is rebuilt chunk by
        chunk, each chunk's old keys and the new keys that sort among them going into one
        dict (a key already here takes its new position in place) sorted again, a chunk none
        sorts among copied as it is. A chunk at a time, so that the old keys are never all
        Python objects at once: their peak would stay in the process as free pools of the
        allocator (see ``bench/memory.py``).
        """
        self._pack()
        if not new:
            return
        encoded = dict(zip(map(str.encode, new, _UTF8, _SURROGATES), new.values(), strict=True))
        if not self.seqs:  # (a load's one packing)
            ordered = sorted(encoded)
            self._set(ordered, array("q", map(encoded.__getitem__, ordered)))
            return
        # the run's typecodes, unless what comes in does not fit them (then 8 bytes, for good)
        seqs_code, offs_code = self.seqs.typecode, self._offs.typecode
        if seqs_code == "I":
            try:
                array("I", new.values())  # (a check at C speed: a position past 4 bytes)
            except OverflowError:
                seqs_code = "q"
        if offs_code == "I" and len(self._blob) + sum(map(len, encoded)) >= 1 << 32:
            offs_code = "q"
        self._merge_into(encoded, array(offs_code, [0]), array(seqs_code))

    def _merge_into(
        self, new: dict[bytes, int], out_offs: array[int], out_seqs: array[int]
    ) -> None:
        """:meth:`merge` of ``new`` (UTF-8 key -> position) into ``out_offs`` (holding
        ``[0]``) and ``out_seqs`` (empty), of typecodes that fit."""
        ordered = sorted(new)  # (code point order is the UTF-8 byte order)
        blob, offs, seqs, n = self._blob, self._offs, self.seqs, len(self.seqs)
        if seqs.typecode != out_seqs.typecode:
            seqs = array(out_seqs.typecode, seqs)
        pieces: list[bytes] = []
        if not n:
            pieces.append(b"".join(ordered))
            out_offs.extend(islice(accumulate(map(len, ordered), initial=0), 1, None))
            out_seqs.extend(map(new.__getitem__, ordered))
        j = 0  # the first new key not taken in yet
        for start in range(0, n, _CHUNK):
            stop = min(start + _CHUNK, n)
            # the new keys up to this chunk's last (which one of them may replace)
            last = blob[offs[stop - 1] : offs[stop]]
            hi = len(ordered) if stop == n else bisect_right(ordered, last, j)
            if hi == j:  # no new key among this chunk's (keys that grow): taken as they are
                pieces.append(blob[offs[start] : offs[stop]])
                shift = out_offs[-1] - offs[start]
                out_offs.extend(map(add, offs[start + 1 : stop + 1], repeat(shift)))
                out_seqs.extend(seqs[start:stop])
                continue
            bounds = offs[start : stop + 1]
            old = [blob[a:b] for a, b in zip(bounds, islice(bounds, 1, None), strict=False)]
            part = ordered[j:hi]
            j = hi
            combined = dict(zip(old, seqs[start:stop], strict=True))
            combined.update(zip(part, map(new.__getitem__, part), strict=True))
            keys = sorted(combined)
            chunk_seqs = array(out_seqs.typecode, map(combined.__getitem__, keys))
            pieces.append(b"".join(keys))
            out_offs.extend(islice(accumulate(map(len, keys), initial=out_offs[-1]), 1, None))
            out_seqs.extend(chunk_seqs)
        self._blob = b"".join(pieces)
        self._offs = out_offs
        self.seqs = out_seqs


_CHUNK = 512  # old keys of a settled run that its merge holds as objects at a time (few:
# a writer's new keys often sort among a few chunks only, the others are copied as they are)
_UTF8, _SURROGATES = repeat("utf-8"), repeat("surrogatepass")  # (str.encode's arguments)
