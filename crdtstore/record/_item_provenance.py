"""Provenance of list items and text spans: item ids -> the journal entry that brought them.

Every item of a Yjs list or text has an id, ``(client, clock)``, that never changes and that
every replica shares. :class:`ItemIndex` maps clock ranges of each client to the journal
entry whose update first carried them (a journal position, or the entry's :class:`Meta`
while it is not journaled), so the author of any item is one bisection away. It holds one
row per entry that wrote list or text items (ranges, never one row per item or character):

- a local transaction's update holds one client's structs, contiguous, and no other
  replica writes with that client id: its row records only where it starts and ends where
  the next one of the client starts (read from the update's header, the write hot path);
- an entry applied from the journal or a foreign update (a hub's Yjs client) records the
  exact ranges of its structs; a range an earlier entry brought already keeps that entry
  (the first entry in journal order that carried an item is its author, on every replica).

Items are found by position through pycrdt's sticky indexes (:func:`item_id`,
:func:`text_runs`), so reads cost a walk of the sequence, writes almost nothing. The index
is exported beside a snapshot (``ReplicaDocument.export_state``): it survives compaction and
resume.
"""

from __future__ import annotations

import base64
import sys
import zlib
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from typing import Any

from .._journal import Op, Row
from .._models import Provenance
from ..codec import CodecError, encode_var_uint, read_var_uint_at
from ..codec._ranges import first_clock, struct_ranges
from ._provenance import Meta, _EntryTable
from ._text_ids import exact_runs, item_id

_OPEN = -1  # the end of a local entry's range: where the client's next range starts


def touches_items(ops: list[Op]) -> bool:
    """Whether an effect writes list or text items (only those entries are indexed)."""
    for op in ops:  # noqa: SIM110 (a loop: any() of a generator costs 4x on this path)
        if op[0] != "map":
            return True
    return False


class _Runs:
    """One client's ranges, sorted by start: ``starts``, ``ends`` (``_OPEN``: up to the next
    start) and ``refs`` (a journal position, or a :class:`Meta` not journaled yet)."""

    __slots__ = ("ends", "refs", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.refs: list[Any] = []

    def covered(self, i: int) -> int:
        """The end of what range ``i`` covers."""
        end = self.ends[i]
        if end != _OPEN:
            return end
        return self.starts[i + 1] if i + 1 < len(self.starts) else 1 << 62

    def add(self, start: int, end: int, ref: Any) -> list[int]:
        """Take in ``[start, end)`` for ``ref`` where no range covers it yet; return the
        starts of the pieces added."""
        starts = self.starts
        last = len(starts) - 1
        if (
            last < 0
            or (start > starts[last] and self.ends[last] == _OPEN)
            or start >= self.covered(last)
        ):
            starts.append(start)
            self.ends.append(end)
            self.refs.append(ref)
            return [start]
        if end == _OPEN:  # a local range starting inside what is known: known already
            return []
        added: list[int] = []
        at = start
        while at < end:
            i = bisect_right(starts, at) - 1
            if i >= 0 and at < self.covered(i):  # covered: skip past it
                at = self.covered(i)
                continue
            stop = starts[i + 1] if i + 1 < len(starts) else end
            stop = min(stop, end)
            starts.insert(i + 1, at)
            self.ends.insert(i + 1, stop)
            self.refs.insert(i + 1, ref)
            added.append(at)
            at = stop
        return added

    def find(self, clock: int) -> Any:
        i = bisect_right(self.starts, clock) - 1
        if i < 0 or clock >= self.covered(i):
            return None
        return self.refs[i]


class ItemIndex:
    """Who brought each list or text item of a replica (see the module docstring)."""

    def __init__(self) -> None:
        self.runs: dict[int, _Runs] = {}
        self.table = _EntryTable()  # provenance of the journal positions refs name
        # id(meta) -> (meta, [(client, start)]) of ranges whose entry is not journaled yet
        self.unjournaled: dict[int, tuple[Meta, list[tuple[int, int]]]] = {}
        self._encoded: dict[int, bytes] = {}  # client id -> its varUint (see _own_start)

    def __len__(self) -> int:
        return sum(len(r.starts) for r in self.runs.values())

    def _add(self, client: int, start: int, end: int, ref: Any) -> list[int]:
        runs = self.runs.get(client)
        if runs is None:
            runs = self.runs[client] = _Runs()
        return runs.add(start, end, ref)

    def local(self, update: bytes, meta: Meta) -> None:
        """A local transaction's update (one client's structs, from its header)."""
        head = first_clock(update)
        if head is None:
            if update[:1] not in (b"\x00", b""):  # (several clients: not a local update)
                self.foreign(update, meta)
            return
        client, start = head
        if self._add(client, start, _OPEN, meta):
            held = self.unjournaled.get(id(meta))
            if held is None:
                self.unjournaled[id(meta)] = (meta, [(client, start)])
            else:
                held[1].append((client, start))

    def foreign(self, update: bytes, meta: Meta) -> None:
        """Update bytes of another writer not journaled yet (the exact ranges)."""
        try:
            ranges = struct_ranges(update)
        except CodecError:
            return
        added = [(c, s) for c, start, end in ranges for s in self._add(c, start, end, meta)]
        if added:
            held = self.unjournaled.get(id(meta))
            if held is None:
                self.unjournaled[id(meta)] = (meta, added)
            else:
                held[1].extend(added)

    def applied(
        self,
        update: bytes,
        seq: int,
        agent: str,
        source: str,
        wall: float,
        run: str,
        client_id: int = -1,
    ) -> None:
        """A journal entry applied (first entry wins). An entry whose update holds only the
        structs of the client id it was journaled with is a crdtstore writer's local
        transaction (its own or a ``ws://`` client's): its start is enough, as for
        :meth:`local`; any other (a foreign update a hub journaled) is decoded for its exact
        ranges."""
        start = self._own_start(update, client_id)
        if start is not None:
            runs = self.runs.get(client_id)
            if runs is not None and runs.ends[-1] == _OPEN and start > runs.starts[-1]:
                runs.starts.append(start)  # the usual case, inline
                runs.ends.append(_OPEN)
                runs.refs.append(seq)
                added = True
            else:
                added = bool(self._add(client_id, start, _OPEN, seq))
        else:
            try:
                ranges = struct_ranges(update)
            except CodecError:
                return
            added = False
            for client, start, end in ranges:
                if self._add(client, start, end, seq):
                    added = True
        if added:
            self.table.add(seq, agent, source, wall, run)

    def applied_rows(self, rows: Iterable[Row]) -> None:
        """:meth:`applied` of every entry of ``rows`` whose effect writes list or text items
        (in journal order; the replay's path: the usual case inline)."""
        encoded, runs_of, table = self._encoded, self.runs, self.table
        if not isinstance(rows, list):
            rows = list(rows)
        if rows:
            table.fit(max(row[0] for row in rows))
        tseqs, walls, names = table.seqs, table.walls, table.name_index
        last: tuple[str, str, str] = ("", "", "")
        who_ = -1
        for seq, agent, source, cid, wall, update, effect, _, origin, _ in rows:
            for op in effect:
                if op[0] != "map":
                    break
            else:
                continue
            enc = encoded.get(cid)
            runs = runs_of.get(cid)
            if (
                enc is None
                or runs is None
                or len(update) < 4
                or update[0] != 1
                or not 0 < update[1] < 0x80
                or not update.startswith(enc, 2)
                or (tseqs and seq <= tseqs[-1])
            ):
                self.applied(update, seq, agent, source, wall, origin, cid)
                continue
            pos = 2 + len(enc)
            b = update[pos]
            if b < 0x80:
                start = b
            elif len(update) > pos + 1 and update[pos + 1] < 0x80:  # two bytes, inline
                start = (b & 0x7F) | (update[pos + 1] << 7)
            else:
                try:
                    start = read_var_uint_at(update, pos)[0]
                except CodecError:
                    continue
            if runs.ends[-1] != _OPEN or start <= runs.starts[-1]:
                self.applied(update, seq, agent, source, wall, origin, cid)
                continue
            runs.starts.append(start)
            runs.ends.append(_OPEN)
            runs.refs.append(seq)
            tseqs.append(seq)
            walls.append(wall)
            if last[0] != agent or last[1] != source or last[2] != origin:
                last = (agent, source, origin)
                who_ = names(agent, source, origin)
            table.who.append(who_)  # (not held: a name new to the table widens the column)

    def _own_start(self, update: bytes, client_id: int) -> int | None:
        """The first clock of ``update`` if it holds only structs of ``client_id`` (the
        header compared with the client's encoded id, cached), else None."""
        enc = self._encoded.get(client_id)
        if enc is None:
            if client_id < 0 or len(self._encoded) > 4096:
                return None
            enc = self._encoded[client_id] = encode_var_uint(client_id)
        if len(update) < 4 or update[0] != 1 or not 0 < update[1] < 0x80:
            return None
        if not update.startswith(enc, 2):
            return None
        pos = 2 + len(enc)
        b = update[pos]
        if b < 0x80:
            return b
        try:
            return read_var_uint_at(update, pos)[0]
        except CodecError:
            return None

    def journaled(self, meta: Meta, seq: int) -> None:
        """The entry of ``meta`` got journal position ``seq``."""
        held = self.unjournaled.pop(id(meta), None)
        if held is None or held[0] is not meta:
            return
        for client, start in held[1]:
            runs = self.runs[client]
            i = bisect_left(runs.starts, start)
            if i < len(runs.starts) and runs.starts[i] == start and runs.refs[i] is meta:
                runs.refs[i] = seq
        self.table.add(seq, meta.agent, meta.source, meta.wall_time, meta.run)

    def ref(self, client: int, clock: int) -> Any:
        """The journal position (or the :class:`Meta` of an entry not journaled yet) that
        brought item ``(client, clock)``; None if unknown."""
        runs = self.runs.get(client)
        return None if runs is None else runs.find(clock)

    def meta_of(self, ref: Any) -> Meta | None:
        if ref is None or isinstance(ref, Meta):
            return ref
        return self.table.get(ref)

    def meta(self, client: int, clock: int) -> Meta | None:
        """The provenance of item ``(client, clock)`` (None if unknown)."""
        return self.meta_of(self.ref(client, clock))

    def export(self) -> dict[str, Any]:
        """The journaled ranges as JSON-able data (beside a snapshot): per client the
        columns ``start``, ``end``, ``seq``, and the table of positions, each packed as
        :func:`_zpack`."""
        clients: dict[str, Any] = {}
        for client, runs in self.runs.items():
            if not self.unjournaled:  # every range journaled (a compaction's): at C speed
                clients[str(client)] = {
                    "start": _zpack(array("q", runs.starts)),
                    "end": _zpack(array("q", runs.ends)),
                    "seq": _zpack(array("q", runs.refs)),
                }
                continue
            rows = [i for i, ref in enumerate(runs.refs) if type(ref) is int]
            if not rows:
                continue
            ends = [runs.ends[i] for i in rows]
            for n, i in enumerate(rows):  # an open range followed by an unjournaled one
                if ends[n] == _OPEN and i + 1 < len(runs.starts) and n + 1 == len(rows):
                    ends[n] = runs.starts[i + 1]
            clients[str(client)] = {
                "start": _zpack(array("q", [runs.starts[i] for i in rows])),
                "end": _zpack(array("q", ends)),
                "seq": _zpack(array("q", [runs.refs[i] for i in rows])),
            }
        seqs, walls, who, names = self.table.columns()
        return {
            "clients": clients,
            "table": {
                "seq": _zpack(seqs),
                "wall": _zpack(walls),
                "who": _zpack(who),
                "names": names,
            },
        }

    def load(self, state: dict[str, Any] | None) -> None:
        """Take in ranges as :meth:`export` wrote them (under what is known already).

        Raises:
            ValueError: the columns do not fit together.
        """
        if not state:
            return
        packed = state.get("table", {})
        seqs = _zunpack("q", packed.get("seq", ""))
        walls = _zunpack("d", packed.get("wall", ""))
        who = _zunpack("q", packed.get("who", ""))
        if not self.table.adopt(seqs, walls, who, packed.get("names", [])):
            raise ValueError("inconsistent item provenance table")
        for key, cols in state.get("clients", {}).items():
            client = int(key)
            starts, ends = _zunpack("q", cols["start"]), _zunpack("q", cols["end"])
            refs = _zunpack("q", cols["seq"])
            if not (len(starts) == len(ends) == len(refs)):
                raise ValueError("inconsistent item provenance")
            if client not in self.runs:
                runs = self.runs[client] = _Runs()
                runs.starts, runs.ends, runs.refs = starts.tolist(), ends.tolist(), refs.tolist()
                continue
            for start, end, seq in zip(starts, ends, refs, strict=True):
                self._add(client, start, end, seq)


def _zpack(values: array[Any]) -> str:
    """A column as base64 of zlib of its little-endian 8-byte items (ranges of a long log
    or text repeat most of their bytes: a tenth of the plain column, read back at C
    speed)."""
    if values.typecode != "d":
        values = array("q", values)
    if sys.byteorder == "big":  # pragma: no cover
        values = array(values.typecode, values)
        values.byteswap()
    return base64.b64encode(zlib.compress(values.tobytes(), 1)).decode("ascii")


def _zunpack(typecode: str, data: str) -> array[Any]:
    """The inverse of :func:`_zpack`.

    Raises:
        ValueError: not base64 of zlib data of whole items.
    """
    out = array(typecode)
    if data:
        try:
            out.frombytes(zlib.decompress(base64.b64decode(data)))
        except zlib.error as exc:
            raise ValueError(f"bad item provenance column: {exc}") from None
    if sys.byteorder == "big":  # pragma: no cover
        out.byteswap()
    return out


def to_provenance(meta: Meta | None, run: str) -> Provenance | None:
    """The public :class:`Provenance` of a :class:`Meta` (``run``: the journal's run)."""
    if meta is None:
        return None
    return Provenance(
        run=meta.run or run,
        agent=meta.agent,
        source=meta.source,
        wall_time=meta.wall_time,
        seq=meta.seq,
    )


def text_runs(
    root: Any, text: str, start: int = 0, end: int | None = None
) -> list[tuple[int, int, int]]:
    """The id of every character of a text: ``(client, clock)`` per character, as
    ``(character index, client, clock)`` of each run of consecutive ids.

    pycrdt (0.14.13) takes a text's sticky index at a UTF-8 byte offset and names the item
    at the block's first clock plus the byte offset into the block (UTF-8 bytes where
    clocks count UTF-16 units): so a block is recognised by byte offsets that follow each
    other, and each character's clock counted in UTF-16 units from the block's start (exact
    also where pycrdt counts in clock units)."""
    out: list[tuple[int, int, int]] = []
    pos = len(text[:start].encode("utf-8", "surrogatepass"))  # UTF-8 offset
    prev: tuple[int, int] | None = None  # the previous character's (client, raw clock)
    prev_bytes = 0
    with root.doc.transaction():
        for i, ch in enumerate(text[start:end], start):
            got = item_id(root, pos)
            if got is None:
                out.append((i, -1, 0))
            elif prev is None or got[0] != prev[0] or got[1] != prev[1] + prev_bytes:
                out.append((i, got[0], got[1]))
            prev = got
            prev_bytes = len(ch.encode("utf-8", "surrogatepass"))
            pos += prev_bytes
    return out


def text_authorship(
    root: Any, items: ItemIndex, run: str, start: int = 0, end: int | None = None
) -> list[tuple[int, int, str, Provenance | None]]:
    """``(start, end, text, provenance)`` of each maximal span of a text written by one
    journal entry (character indices, ``end`` exclusive; provenance None where unknown),
    of characters ``start`` to ``end`` only (clipped to the text)."""
    text = str(root)
    end = len(text) if end is None else max(0, min(end, len(text)))
    start = max(0, min(start, end))
    with root.doc.transaction():
        runs = exact_runs(root, text, text_runs(root, text, start, end), end)
    spans: list[list[Any]] = []  # [start, end, ref]
    bounds = [first for first, _, _ in runs] + [end]
    for n, (start, client, clock) in enumerate(runs):
        for i in range(start, bounds[n + 1]):
            ref = None if client < 0 else items.ref(client, clock)
            clock += 2 if ord(text[i]) > 0xFFFF else 1
            if spans and spans[-1][2] == ref and type(spans[-1][2]) is type(ref):
                spans[-1][1] = i + 1
            else:
                spans.append([i, i + 1, ref])
    return [(s, e, text[s:e], to_provenance(items.meta_of(ref), run)) for s, e, ref in spans]
