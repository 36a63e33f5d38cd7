"""One replica of a run's record: a pycrdt Doc plus crdtstore's bookkeeping. No I/O.

The replica is the pure core that the record (live, with a journal behind it), compaction,
replay and the simulator all drive. It knows how to

- make a local transaction and capture its update delta (exactly one per transaction);
- apply a journal entry from elsewhere, checking its checksum and refusing bad bytes;
- keep the provenance of the current value of every map key, compactly: each key holds the
  journal position of the entry that wrote it (an int), and a per-replica table holds agent,
  source, wall time and nested run once per entry (see :class:`_EntryTable`);
- list the collections (a registry kept *in the document*, so every replica and every Yjs
  client agrees on which root is a map, a list or a text);
- apply update bytes made outside the typed API (a Yjs client's, through the hub) and derive
  their effect: map ops read from the update's bytes (every set it carries, LWW losers
  included), list and text ops from the document's events; registering the roots a plain
  Yjs client wrote without the registry (:meth:`Replica.apply_external`).
"""

from __future__ import annotations

import base64
import difflib
import inspect
import json
import logging
import sys
import time
import weakref
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from itertools import accumulate, islice
from operator import lt
from typing import Any, NamedTuple

from pycrdt import Array, Doc, Map, Text, Transaction, merge_updates

from ._errors import (
    CollectionKindMismatch,
    InvalidName,
    InvalidUpdate,
    JournalCorrupt,
    PayloadTooLarge,
)
from ._journal import NewEntry, Op, Row, checksum
from ._names import check_name
from ._v1 import (
    TYPE_REFS,
    Decoded,
    KeyIndex,
    UpdateDecodeError,
    decode_update,
    read_delete_set,
    read_state_vector,
    root_kinds,
    write_state_vector,
)
from ._values import from_stored

log = logging.getLogger("crdtstore.replica")
_ABSENT: Any = object()

REGISTRY = "__crdtstore_collections"
KINDS: dict[str, type[Any]] = {"map": Map, "list": Array, "text": Text}
DEFAULT_MAX_UPDATE = 16 * 1024 * 1024
_EMPTY_UPDATES = (b"\x00\x00",)


class Meta(NamedTuple):
    """Provenance of one journal entry (shared by every key it wrote).

    A tuple of atomic values, so that the garbage collector stops tracking it. ``seq`` is None
    until the entry is journaled: until then the provenance index points at this object
    (one per entry, shared by every key it wrote); once the position is known the index holds
    just the position and the replica's :class:`_EntryTable` the rest (without ``call``: the
    live index does not keep tool-call ids, the journal does).
    """

    agent: str
    source: str
    wall_time: float
    seq: int | None
    run: str = ""  # the nested run that wrote it; "" for the journal's own run
    call: str = ""  # the tool-call id it was written for (Record.attributed); "" for none

    def as_list(self) -> list[Any]:
        return [self.seq, self.agent, self.source, self.wall_time, self.run]


def tree_merge(updates: Sequence[bytes], fan_in: int = 64) -> bytes:
    """Merge many updates into one, in O(n log n) instead of ``merge_updates``' O(n^2).

    The result does not depend on the order of ``updates`` (PYCRDT-NOTES hazard 2).
    """
    level = [u for u in updates if u not in _EMPTY_UPDATES]
    if not level:
        return b"\x00\x00"
    while len(level) > 1:
        level = [
            level[i] if len(level[i : i + fan_in]) == 1 else merge_updates(*level[i : i + fan_in])
            for i in range(0, len(level), fan_in)
        ]
    return level[0]


_CHAR_DIFF_LIMIT = 4096  # characters: above this a changed block is replaced whole


def _common_prefix(a: str, b: str) -> int:
    # binary search over slice equality: the comparisons run at C speed
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid :] == b[len(b) - mid :]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def text_diff(old: str, new: str) -> list[tuple[str, int, Any]]:
    """The character edits turning ``old`` into ``new``, last first (so indices stay valid).

    A real diff, not a whole rewrite: an agent that rewrites a text with two distant changes
    produces two small edits, and a concurrent edit between them survives. To stay fast on
    long texts it trims the common prefix and suffix, matches lines, and compares characters
    only inside changed blocks of lines (a block longer than a few thousand characters is
    replaced whole).
    """
    if old == new:
        return []
    p = _common_prefix(old, new)
    q = _common_suffix(old, new, min(len(old), len(new)) - p)
    a, b = old[p : len(old) - q], new[p : len(new) - q]
    groups: list[list[tuple[str, int, Any]]] = []  # in text order, old coordinates

    def replace(at: int, old_part: str, new_part: str) -> None:
        group: list[tuple[str, int, Any]] = []
        if old_part:
            group.append(("del", at, len(old_part)))
        if new_part:
            group.append(("ins", at, new_part))
        groups.append(group)

    def chars(at: int, old_part: str, new_part: str) -> None:
        if len(old_part) > _CHAR_DIFF_LIMIT and len(new_part) > _CHAR_DIFF_LIMIT:
            replace(at, old_part, new_part)
            return
        matcher = difflib.SequenceMatcher(None, old_part, new_part, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag != "equal":
                replace(at + i1, old_part[i1:i2], new_part[j1:j2])

    if not a or not b:
        replace(p, a, b)
    else:
        la, lb = a.splitlines(keepends=True), b.splitlines(keepends=True)
        offsets = [0]
        for line in la:
            offsets.append(offsets[-1] + len(line))
        lines = difflib.SequenceMatcher(None, la, lb, autojunk=False)
        for tag, i1, i2, j1, j2 in lines.get_opcodes():
            if tag != "equal":
                chars(p + offsets[i1], "".join(la[i1:i2]), "".join(lb[j1:j2]))
    return [op for group in reversed(groups) for op in group]


def apply_text_edits(text: Any, old: str, edits: list[tuple[str, int, Any]]) -> None:
    """Apply :func:`text_diff` edits (character positions into ``old``, last first) to a
    pycrdt ``Text`` holding ``old``. pycrdt's Text counts UTF-8 bytes: since the edits come
    last first, the text before each edit point is still the old one, and its UTF-8 length
    is the byte offset."""
    for kind, at, arg in edits:
        start = len(old[:at].encode())
        if kind == "del":
            del text[start : start + len(old[at : at + arg].encode())]
        else:
            text.insert(start, arg)


def _varuint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise InvalidUpdate("truncated variable-length integer")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _check_counts(update: bytes) -> None:
    """Refuse an update whose leading counts cannot fit in its bytes, before pycrdt's
    decoder pre-allocates for them (4 bytes claiming 2**28 clients made it allocate about
    500 MiB). A v1 update starts with the number of clients, then per client the number of
    structs: each client and each struct takes at least one byte."""
    size = len(update)
    if size >= 2 and update[0] < 0x80 and update[1] < 0x80:
        # both counts fit in one byte (the usual case): the same checks, without the decoder
        if update[0] > size - 1:
            raise InvalidUpdate(f"claims {update[0]} clients in {size} bytes")
        if update[0] and update[1] > size - 2:
            raise InvalidUpdate(f"claims {update[1]} structs in {size} bytes")
        return
    clients, pos = _varuint(update, 0)
    if clients > len(update) - pos:
        raise InvalidUpdate(f"claims {clients} clients in {len(update)} bytes")
    if clients:
        structs, pos = _varuint(update, pos)
        if structs > len(update) - pos:
            raise InvalidUpdate(f"claims {structs} structs in {len(update)} bytes")


class _EntryTable:
    """Provenance of journaled entries, by journal position, in parallel arrays.

    One row per entry that is still the provenance of some key: 8 bytes of position, 8 of wall
    time and a pointer to a shared ``(agent, source, run)`` tuple, instead of a ``Meta`` tuple
    and its float per key (100k keys: about 2.4 MiB instead of 11). Rows are kept sorted
    by position (entries arrive in journal order but for the odd local commit that lands
    after a later remote entry was applied); rows no key points at any more are dropped when
    the table has grown to twice what was live at the last sweep.
    """

    __slots__ = ("_last", "_names", "seqs", "sweep_at", "walls", "who")

    def __init__(self) -> None:
        self.seqs = array("q")
        self.walls = array("d")
        self.who: list[tuple[str, str, str]] = []
        self._names: dict[tuple[str, str, str], tuple[str, str, str]] = {}
        self._last = ("", "", "")
        self.sweep_at = 4096

    def __len__(self) -> int:
        return len(self.seqs)

    def names(self, agent: str, source: str, run: str) -> tuple[str, str, str]:
        """The shared ``(agent, source, run)`` tuple."""
        last = self._last
        if last[0] is agent and last[1] is source and last[2] is run:
            return last
        who = (agent, source, run)
        who = self._last = self._names.setdefault(who, who)
        return who

    def add(self, seq: int, agent: str, source: str, wall: float, run: str) -> None:
        who = self.names(agent, source, run)
        seqs = self.seqs
        if not seqs or seq > seqs[-1]:
            seqs.append(seq)
            self.walls.append(wall)
            self.who.append(who)
            return
        i = bisect_left(seqs, seq)
        if i < len(seqs) and seqs[i] == seq:  # the same entry again: it is one entry
            return
        seqs.insert(i, seq)
        self.walls.insert(i, wall)
        self.who.insert(i, who)

    def get(self, seq: int) -> Meta | None:
        seqs = self.seqs
        i = bisect_left(seqs, seq)
        if i == len(seqs) or seqs[i] != seq:
            return None
        agent, source, run = self.who[i]
        return Meta(agent, source, self.walls[i], seq, run)

    def keep(self, live: set[Any]) -> None:
        """Drop the rows whose position is not in ``live``."""
        if live.issuperset(self.seqs):  # every row is live (at C speed): nothing to drop
            self.sweep_at = max(4096, 2 * len(self.seqs))
            return
        rows = [i for i, seq in enumerate(self.seqs) if seq in live]
        self.seqs = array("q", [self.seqs[i] for i in rows])
        self.walls = array("d", [self.walls[i] for i in rows])
        self.who = [self.who[i] for i in rows]
        self.sweep_at = max(4096, 2 * len(rows))

    def export(self) -> dict[str, Any]:
        """The rows as JSON-able data: the columns packed (see :func:`_pack`)."""
        names = list(dict.fromkeys(self.who))
        number = {who: i for i, who in enumerate(names)}
        return {
            "seq": _pack(self.seqs),
            "wall": _pack(self.walls),
            "who": _pack(array("l", [number[w] for w in self.who])),
            "names": [list(w) for w in names],
        }

    def load(self, table: dict[str, Any]) -> None:
        """Take in rows as :meth:`export` wrote them."""
        names = [self.names(str(a), str(s), str(r)) for a, s, r in table.get("names", [])]
        seqs, walls = _unpack("q", table.get("seq", [])), _unpack("d", table.get("wall", []))
        who = [names[i] for i in _unpack("l", table.get("who", []))]
        if not (len(seqs) == len(walls) == len(who)):
            raise ValueError("inconsistent provenance table")
        if not self.seqs and _increasing(seqs):
            # the usual case, a fresh replica: adopt the arrays as they are
            self.seqs, self.walls, self.who = seqs, walls, who
            self.sweep_at = max(4096, 2 * len(seqs))
            return
        for seq, wall, (agent, source, run) in zip(seqs, walls, who, strict=True):
            self.add(seq, agent, source, wall, run)


def _pack(values: array[Any]) -> str:
    """An array as base64 of its items in little-endian order: a snapshot's provenance
    columns are read back without a Python object per item."""
    if sys.byteorder == "big":
        values = array(values.typecode, values)
        values.byteswap()
    if values.typecode == "l":  # "l" is 4 or 8 bytes by platform: store 8
        values = array("q", values)
    return base64.b64encode(values.tobytes()).decode("ascii")


def _unpack(typecode: str, data: str | list[Any]) -> array[Any]:
    """The inverse of :func:`_pack` (a list is taken as is: an earlier layout)."""
    if isinstance(data, list):
        return array(typecode, data)
    out = array("q" if typecode == "l" else typecode)
    out.frombytes(base64.b64decode(data))
    if sys.byteorder == "big":
        out.byteswap()
    return out


def _increasing(items: Sequence[Any]) -> bool:
    """Whether ``items`` is strictly increasing (compared at C speed)."""
    return all(map(lt, items, islice(items, 1, None)))


class _Settled:
    """The journaled part of one collection's provenance index, packed: its keys sorted, as
    one UTF-8 byte string with an array of offsets, and their journal positions in an array
    (24 bytes a key besides the key's UTF-8 bytes, where a ``str`` object alone takes 50-60
    and a dict entry with an int about 70 more: a 100k-key collection holds 2.2 MiB instead of
    8). Looked up by bisection; newer positions live in the collection's dict, which takes
    precedence, until the next :meth:`merge`. (UTF-8 byte order is code point order, so the
    order is that of the keys as ``str``.)"""

    __slots__ = ("_blob", "_offs", "seqs")

    def __init__(self) -> None:
        self._blob = b""
        self._offs = array("q", [0])
        self.seqs = array("q")

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def keys(self) -> list[str]:
        """The keys, sorted (a new list: for export and tests, not for lookups)."""
        return [k.decode("utf-8", "surrogatepass") for k in self._encoded()]

    def _encoded(self) -> list[bytes]:
        blob, offs = self._blob, self._offs
        return [blob[a:b] for a, b in zip(offs, islice(offs, 1, None), strict=False)]

    def get(self, key: str) -> int | None:
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

    def _set(self, keys: list[bytes], seqs: array[int]) -> None:
        self._blob = b"".join(keys)
        offs = array("q", [0])
        offs.extend(accumulate(map(len, keys)))
        self._offs = offs
        self.seqs = seqs

    @classmethod
    def of_sorted(cls, keys: Sequence[str], seqs: array[int]) -> _Settled:
        """A run from keys already sorted (a snapshot's) and their positions."""
        run = cls()
        run._set([k.encode("utf-8", "surrogatepass") for k in keys], seqs)
        return run

    def merge(self, new: dict[str, int]) -> None:
        """Take in ``new`` (key -> position), replacing the positions of keys already here."""
        old_keys, old_seqs = self._encoded(), self.seqs
        keys: list[bytes] = []
        seqs = array("q")
        prev, n = 0, len(old_keys)
        for skey in sorted(new):
            key = skey.encode("utf-8", "surrogatepass")
            i = bisect_left(old_keys, key, prev)
            if i > prev:  # the runs in between are copied at C speed
                keys += old_keys[prev:i]
                seqs += old_seqs[prev:i]
            keys.append(key)
            seqs.append(new[skey])
            prev = i + 1 if i < n and old_keys[i] == key else i
        keys += old_keys[prev:]
        seqs += old_seqs[prev:]
        self._set(keys, seqs)


_SETTLE_MIN = 4096  # index entries of a collection kept as a dict before settling them


def policed(ops: list[Op]) -> list[Op]:
    """The part of an external update's effect (:meth:`Replica.apply_external`) that write
    policies and budgets judge: list and text inserts are left out. Their index is where the
    items landed in this document, and an append made concurrently elsewhere (legal under
    ``append_only``) lands anywhere among this replica's own appends, so an insert cannot be
    told from an append by it (the items' origins could tell; not implemented). Deletes and
    map ops are judged as usual."""
    return [op for op in ops if op[0] == "map" or op[2] != "ins"]


def _plain(value: Any) -> Any:
    """A value read from the document, as JSON (a nested shared type, which only a foreign
    client writes, as its Python form)."""
    to_py = getattr(value, "to_py", None)
    return value if to_py is None else to_py()


def _collection_name(name: str) -> bool:
    try:
        check_name("collection", name)
    except InvalidName:
        return False
    return True


# pycrdt's ``observe`` reads the callback's signature (``inspect.signature``: ~20 us, most of
# what subscribing costs); an effect observer carries it ready-made (one parameter: the event).
_EVENT_SIGNATURE = inspect.Signature(
    [inspect.Parameter("event", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
)


def _signed(on_event: Callable[[Any], None]) -> Callable[[Any], None]:
    on_event.__signature__ = _EVENT_SIGNATURE  # type: ignore[attr-defined]
    return on_event


def _map_effect(name: str, ops: list[Op]) -> Callable[[Any], None]:
    def on_event(event: Any) -> None:
        for key, change in event.keys.items():
            if change.get("action") == "delete":
                ops.append(["map", name, "del", key])
            else:
                ops.append(["map", name, "set", key, _plain(change.get("newValue"))])

    return _signed(on_event)


def _list_effect(name: str, ops: list[Op]) -> Callable[[Any], None]:
    def on_event(event: Any) -> None:
        at = 0
        for d in event.delta:
            if "retain" in d:
                at += d["retain"]
            elif "insert" in d:
                values = [_plain(v) for v in d["insert"]]
                ops.append(["list", name, "ins", at, values])
                at += len(values)
            elif "delete" in d:
                ops.append(["list", name, "del", at, d["delete"]])

    return _signed(on_event)


def _text_effect(
    name: str, ops: list[Op], old: tuple[str, int], after: dict[str, tuple[str, int] | None]
) -> Callable[[Any], None]:
    """Text ops in characters from a TextEvent delta, which counts UTF-8 bytes (retained and
    deleted spans are spans of ``old``: the text before the update and its UTF-8 length);
    the text after it (and its length) goes to ``after[name]`` (None when the delta holds an
    embed, which ``str`` leaves out)."""

    def on_event(event: Any) -> None:
        text_before, size = old
        ascii_only = text_before.isascii()
        at = 0  # character index in the text as edited so far
        char = 0  # character index into the text before
        pieces: list[str] = []
        embed = False
        for d in event.delta:
            if "retain" in d:
                n = d["retain"]
                k = n if ascii_only else _chars_in(text_before, char, n)
                pieces.append(text_before[char : char + k])
                at += k
                char += k
            elif "insert" in d:
                text = d["insert"]
                if isinstance(text, str):
                    if text:
                        ops.append(["text", name, "ins", at, text])
                        pieces.append(text)
                        at += len(text)
                        size += len(text.encode())
                else:
                    embed = True
            elif "delete" in d:
                n = d["delete"]
                k = n if ascii_only else _chars_in(text_before, char, n)
                ops.append(["text", name, "del", at, k])
                char += k
                size -= n
        pieces.append(text_before[char:])
        after[name] = None if embed else ("".join(pieces), size)

    return _signed(on_event)


def _json_number(text: str) -> Any:
    return from_stored(float(text))


def list_values(root: Array[Any]) -> list[Any]:
    """Every value of the list ``root``, as :func:`from_stored` gives them, read in one call.

    pycrdt reads an array item by item, each in a transaction of its own that seeks to the
    index: 7-10 us an item (a list of 1M small dicts: about 9 s). yrs can write the whole array
    as JSON instead (``to_json`` of the integrated array), which is parsed with every number
    made what :func:`from_stored` makes of the float yrs holds: about 2.3 us an item for the
    same list, 0.6 of them in yrs (about 4x faster). Values crdtstore writes are JSON
    already; what only a plain Yjs client can store comes out as JSON too: a nested shared
    type as its plain content, binary as a list of byte values, a big integer beyond 2**53 as
    a float. Falls back to the item by item read if this pycrdt lacks the call.
    """
    integrated = getattr(root, "_integrated", None)
    if integrated is None or not hasattr(integrated, "to_json"):  # pragma: no cover
        return [from_stored(v) for v in root]  # (another pycrdt, or a list not in a doc)
    with root.doc.transaction() as txn:
        rtxn = txn._txn
        assert rtxn is not None
        text = integrated.to_json(rtxn)
    values: list[Any] = json.loads(text, parse_int=_json_number, parse_float=_json_number)
    return values


def _direct_insert_works() -> bool:
    """Whether this pycrdt's internals are as the write path's shortcuts expect (checked once
    at import, on scratch documents; if not, the write path takes pycrdt's public API):

    - a map set goes straight to yrs, ``root._integrated.insert(txn, key, value)``, which is
      what ``root[key] = value`` ends in for a value that is not a shared type (without its
      two nested Python transaction frames): :meth:`Replica.do_set`, :meth:`Replica.local_set`;
    - a transaction is a yrs transaction made, committed and dropped while ``doc._txn`` names
      a pycrdt ``Transaction`` holding it, which is what ``with doc.transaction():`` does
      when none is open (:meth:`Replica.local_set`);
    - a callback given to the yrs document's ``observe`` gets every committed transaction's
      event with its ``update`` (the capture, without pycrdt's wrapper frame).
    """
    try:
        doc: Doc[Any] = Doc()
        root = doc.get("m", type=Map)
        seen: list[bytes] = []
        sub = doc._doc.observe(lambda event: seen.append(event.update))
        with doc.transaction() as outer:
            root._integrated.insert(outer._txn, "a", 1)
        wtxn = Transaction(doc)
        txn = doc._doc.create_transaction()
        wtxn._txn, wtxn._leases, doc._txn = txn, 1, wtxn
        root._integrated.insert(txn, "k", {"v": [1]})
        txn.commit()
        txn.drop()
        wtxn._txn, wtxn._leases, doc._txn = None, 0, None
        other: Doc[Any] = Doc()
        for update in seen:
            other.apply_update(update)
        want = {"a": 1.0, "k": {"v": [1.0]}}
        ok = (
            len(seen) == 2
            and dict(root.items()) == want
            and dict(other.get("m", type=Map).items()) == want
            and doc._allow_multithreading is False
            and doc._exceptions == []
            and doc._txn is None
        )
        del sub
        return ok
    except Exception:  # pragma: no cover - another pycrdt
        return False


_DIRECT_INSERT = _direct_insert_works()


def _chars_in(text: str, start: int, size: int) -> int:
    """How many characters of ``text`` from ``start`` make ``size`` UTF-8 bytes."""
    head = text[start : start + size].encode()  # at most size characters, >= size bytes
    return len(head[:size].decode("utf-8", errors="ignore"))


# the value recorded for a nested shared type written as a map value that lost LWW
_EMPTY_OF: dict[str, Callable[[], Any]] = {"map": dict, "list": list, "text": str}


def _within(client: int, a: int, b: int, ranges: list[tuple[int, int, int]]) -> bool:
    """Whether clocks ``a .. b - 1`` of ``client`` all lie in ``ranges`` (``(client, start,
    end)``, each client's sorted)."""
    for c, start, end in ranges:
        if c == client and start <= a < end:
            a = end
    return a >= b


class Replica:
    """A Doc with its collection registry, update capture and provenance index."""

    def __init__(self, *, max_update: int = DEFAULT_MAX_UPDATE) -> None:
        # A fresh random client id for every replica: a reused id makes peers drop writes
        # (PYCRDT-NOTES hazard 5). The agent identity lives in the journal, not here.
        self.doc: Doc[Any] = Doc()
        self.client_id: int = self.doc.client_id
        self.max_update = max_update
        self.registry: Map[Any] = self.doc.get(REGISTRY, type=Map)
        self._roots: dict[tuple[str, str], Any] = {}
        self._kinds: dict[str, str] = {}
        # collection -> key -> the journal position of the entry that wrote the current value
        # (its provenance is in self.table), or the entry's Meta while it is not journaled, or
        # (from snapshots of older versions, until first asked) [seq, agent, source, wall, run]
        # (Bulk loads move the journaled positions of big collections into self._settled.)
        self.index: dict[str, dict[str, Any]] = {}
        self._settled: dict[str, _Settled] = {}
        self.table = _EntryTable()
        self.seq = 0  # journal position reached, when driven by a replay
        self.skipped: list[JournalCorrupt] = []  # corrupt journal entries not applied
        self.head = 0  # highest journal position reflected here (applied or own, journaled)
        self.coll_seq: dict[str, int] = {}  # last journal position that touched a collection
        self._captured: bytes | None = None
        self._capturing = False
        self._undetermined: set[str] = set()  # unregistered roots of no single kind
        self._roots_checked: frozenset[str] = frozenset()  # registered, reserved or invalid
        self._texts: dict[str, tuple[str, int]] = {}  # see _texts_cached
        self._texts_at = -1  # self._transactions when self._texts was last right
        self._transactions = 0  # transactions that changed the document
        self._colls: dict[str, str] = {}  # see collections()
        self._colls_at = (-1, -1)  # (self._transactions, len(self.registry)) it was right at
        self._txn_cm: Any = None
        # apply_external: the map entries of the document by item id (see _key_index), the
        # state vector it covers and self._transactions when it covered the whole document
        self._keys: KeyIndex | None = None
        self._keys_sv: dict[int, int] = {}
        self._keys_at = -1
        self._deletes_wanted = False
        self._captured_deletes: bytes | None = None
        self._wtxn: Any = None  # the transaction object local_set reuses (see there)
        self.partial_update: bytes | None = None
        self._capture: Any = self.capture_transactions()

    def capture_transactions(self) -> Any:
        """Observe this replica's document for the capture (:meth:`_on_transaction`): on the
        yrs document itself when it can (see ``_direct_insert_works``), through a weak
        reference to the replica. A bound method given to yrs is held from the Rust side,
        where the garbage collector cannot see it: the replica and its document were never
        freed (every record closed, every scratch copy and replay leaked its document).
        Returns the subscription (it lives as long as the document)."""
        ref = weakref.ref(self)

        def on_transaction(event: Any) -> None:
            replica = ref()
            if replica is not None:
                replica._on_transaction(event)

        return (
            self.doc._doc.observe(on_transaction)
            if _DIRECT_INSERT
            else self.doc.observe(on_transaction)
        )

    # -- collections --------------------------------------------------------------------------

    def kind_of(self, name: str) -> str | None:
        """The kind the registry gives ``name`` (None when unregistered or not a kind)."""
        kind = self._kinds.get(name)
        if kind is None:
            kind = self.registry.get(name)
            if kind not in KINDS:
                return None
            self._kinds[name] = kind
        return kind

    def root(self, name: str, kind: str) -> Any:
        """The root shared type of a collection, checking its kind against the registry.

        Raises:
            CollectionKindMismatch: the name is registered as another kind.
        """
        existing = self.kind_of(name)
        if existing is not None and existing != kind:
            raise CollectionKindMismatch(name, existing, kind)
        got = self._roots.get((name, kind))
        if got is None:
            got = self._roots[(name, kind)] = self.doc.get(name, type=KINDS[kind])
        return got

    def collections(self) -> dict[str, str]:
        """Registered collections: name -> kind, sorted by name (entries that are not a known
        kind, which only a foreign or corrupted update can write, are left out).

        Cached: read from the registry again once a transaction changed the document since
        (or, inside a transaction still open, once the registry's size changed);
        :meth:`apply_external` keeps it across an update that leaves the registry alone. A
        new dict every call."""
        at = (self._transactions, len(self.registry))
        if at != self._colls_at:
            self._colls = self._read_collections()
            self._colls_at = at
        return dict(self._colls)

    def _read_collections(self) -> dict[str, str]:
        return dict(sorted((str(k), str(v)) for k, v in self.registry.items() if v in KINDS))

    def read(self, name: str, kind: str) -> Any:
        root = self.root(name, kind)
        if kind == "map":
            return {k: from_stored(v) for k, v in root.items()}
        if kind == "list":
            return list_values(root)
        return str(root)

    def to_dict(self) -> dict[str, Any]:
        return {name: self.read(name, kind) for name, kind in self.collections().items()}

    # -- local transactions -------------------------------------------------------------------

    def _on_transaction(self, event: Any) -> None:
        self._transactions += 1
        if self._capturing:
            self._captured = event.update
            if self._deletes_wanted:  # (apply_external: which items the update deleted)
                self._captured_deletes = event.delete_set

    def begin(self) -> None:
        """Open a local transaction whose update :meth:`end` returns."""
        self._captured = None
        self._capturing = True
        self._txn_cm = self.doc.transaction()
        self._txn_cm.__enter__()

    def do(self, ops: list[Op], apply: Callable[[], None], meta: Meta) -> None:
        """Inside :meth:`begin`/:meth:`end`: run ``apply`` (which makes exactly the changes
        described by ``ops``) and record provenance.

        Collections touched for the first time are registered in the same transaction, so
        the registry never names a collection whose first write is missing, or vice versa.
        """
        kinds = self._kinds
        for op in ops:
            if kinds.get(op[1]) != op[0]:
                self._register(op[1], op[0])
        apply()
        index = self.index
        for op in ops:
            if op[0] == "map":
                keys = index.get(op[1])
                if keys is None:
                    keys = index[op[1]] = {}
                keys[op[3]] = meta

    def journaled(self, ops: list[Op], meta: Meta, seq: int) -> None:
        """A local entry got its journal position: point its keys' provenance at it.

        One table row per entry (none if every key it wrote was overwritten since), and a
        dict store per key still pointing at ``meta``; no per-key tuple is rebuilt.
        """
        index = self.index
        if seq > self.head:
            self.head = seq
        coll_seq = self.coll_seq
        held = False
        for op in ops:
            coll_seq[op[1]] = seq
            if op[0] == "map":
                keys = index.get(op[1])
                if keys is not None and keys.get(op[3]) is meta:
                    keys[op[3]] = seq
                    held = True
        if held:
            self._remember(seq, meta.agent, meta.source, meta.wall_time, meta.run)

    def journaled_many(
        self, batch: Sequence[tuple[bytes, list[Op], Meta]], seqs: Sequence[int]
    ) -> None:
        """:meth:`journaled` for a committed batch of ``(update, ops, meta)`` entries (the
        committer's path: the same work without a call per entry)."""
        index, coll_seq, table = self.index, self.coll_seq, self.table
        tseqs = table.seqs
        add_seq, add_wall, add_who = tseqs.append, table.walls.append, table.who.append
        names = table.names
        last = tseqs[-1] if tseqs else 0  # the table's last position
        name: Any = None  # the collection of the last map op, and its keys
        keys: dict[str, Any] | None = None
        agent_, source_, run_, who_ = "", "", "", ("", "", "")  # the last entry's names
        for (_, ops, meta), seq in zip(batch, seqs, strict=True):
            held = False
            for op in ops:
                coll_seq[op[1]] = seq
                if op[0] == "map":
                    if op[1] is not name:
                        name = op[1]
                        keys = index.get(name)
                    if keys is not None and keys.get(op[3]) is meta:
                        keys[op[3]] = seq
                        held = True
            if held:
                agent, source, wall, _, run, _ = meta
                if seq <= last:
                    table.add(seq, agent, source, wall, run)
                else:  # the usual case: append, the (agent, source, run) shared
                    if agent is not agent_ or source is not source_ or run is not run_:
                        agent_, source_, run_ = agent, source, run
                        who_ = names(agent, source, run)
                    add_seq(seq)
                    add_wall(wall)
                    add_who(who_)
                    last = seq
        if seqs:
            self.head = max(self.head, max(seqs))
        if len(tseqs) > table.sweep_at:
            table.keep(self._live_seqs())

    def adopt(self, collection: str, key: str, seq: int, agent: str, source: str,
              wall: float, run: str) -> None:
        """Name entry ``seq`` (written by ``agent``...) as the provenance of ``collection[key]``:
        when two entries left the same value (or both deleted the key), which one is named is
        not decided by the document, and the journal's authority has the last word (a guarded
        write refused by a server names the version it holds; see ``Record``)."""
        self._remember(seq, agent, source, wall, run)
        keys = self.index.get(collection)
        if keys is None:
            keys = self.index[collection] = {}
        keys[key] = seq

    def _remember(self, seq: int, agent: str, source: str, wall: float, run: str) -> None:
        table = self.table
        table.add(seq, agent, source, wall, run)
        if len(table) > table.sweep_at:
            table.keep(self._live_seqs())

    def _live_seqs(self) -> set[Any]:
        """The journal positions some key's provenance points at (plus the ``Meta`` of
        entries not journaled yet: harmless in a set of positions, and leaving them in lets
        the values go in at C speed)."""
        live: set[Any] = set()
        for keys in self.index.values():
            try:
                live.update(keys.values())
            except TypeError:  # an older snapshot's [seq, agent, ...] lists: unhashable
                live.update(v for v in keys.values() if type(v) is int)
        for settled in self._settled.values():
            live.update(settled.seqs)
        return live

    def _settle(self, *, every: bool = False) -> None:
        """After a bulk load: move the journaled positions of collections with many keys
        (``every``: of all collections) from their dict into their :class:`_Settled` run
        (amortised: a collection's dict is settled when it has grown to half the settled
        run)."""
        for name, keys in self.index.items():
            settled = self._settled.get(name)
            if not every and len(keys) < max(_SETTLE_MIN, len(settled) // 2 if settled else 0):
                continue
            journaled = {k: v for k, v in keys.items() if type(v) is int}
            if not journaled:
                continue
            if settled is None:
                settled = self._settled[name] = _Settled()
            settled.merge(journaled)
            self.index[name] = {k: v for k, v in keys.items() if type(v) is not int}

    def end(self) -> bytes | None:
        """Commit the local transaction; return its update (None when nothing changed).

        There is no rollback in pycrdt: whatever was applied before an error is committed
        (and must be journaled by the caller).
        """
        cm, self._txn_cm = self._txn_cm, None
        try:
            if cm is not None:
                cm.__exit__(None, None, None)
        finally:
            self._capturing = False
        update, self._captured = self._captured, None
        return update

    def local(self, ops: list[Op], apply: Callable[[], None], meta: Meta) -> bytes | None:
        """One local transaction (the hot path, equivalent to :meth:`begin`, :meth:`do`,
        :meth:`end`): return its update, None when nothing changed.

        If ``apply`` raises, what it applied is committed anyway (no rollback in pycrdt): the
        update is left in :attr:`partial_update` for the caller to journal, then the error
        propagates.
        """
        self._captured = None
        self._capturing = True
        kinds = self._kinds
        try:
            # (no transaction origin: nothing reads it, and pycrdt compares it on every
            # nested transaction that pycrdt's own setters open)
            with self.doc.transaction():
                for op in ops:
                    if kinds.get(op[1]) != op[0]:
                        self._register(op[1], op[0])
                apply()
        except BaseException:
            self.partial_update = self._captured
            raise
        finally:
            self._capturing = False
        index = self.index
        for op in ops:
            if op[0] == "map":
                keys = index.get(op[1])
                if keys is None:
                    keys = index[op[1]] = {}
                keys[op[3]] = meta
        update, self._captured = self._captured, None
        return update

    def local_set(self, root: Any, ops: list[Op], meta: Meta) -> bytes | None:
        """:meth:`local` of one map set, ``ops == [["map", name, "set", key, stored]]`` on the
        collection's root ``root``: the hot path of a local write.

        The value goes straight to yrs in a yrs transaction made, committed and dropped here
        while ``doc._txn`` names a pycrdt ``Transaction`` object kept for the document: what
        ``with doc.transaction(): root[key] = stored`` does when no transaction is open,
        without pycrdt's Python frames (see :func:`_direct_insert_works`; otherwise, or with a
        transaction open, or a collection not registered as a map yet, this is
        :meth:`local`). The update is captured as by :meth:`local`; an error leaves what was
        applied in :attr:`partial_update` as there.
        """
        _, name, _, key, stored = ops[0]
        doc = self.doc
        wtxn = self._wtxn
        if wtxn is None or wtxn._doc is not doc:  # (a simulation may swap the document)
            direct = _DIRECT_INSERT and not doc._allow_multithreading
            wtxn = self._wtxn = Transaction(doc) if direct else None
        if wtxn is None or doc._txn is not None or self._kinds.get(name) != "map":
            return self.local(ops, partial(root.__setitem__, key, stored), meta)
        self._captured = None
        self._capturing = True
        # what `with doc.transaction():` does when none is open, without its Python frames
        txn = doc._doc.create_transaction()
        wtxn._txn, wtxn._leases, doc._txn = txn, 1, wtxn
        try:
            try:
                root._integrated.insert(txn, key, stored)
            finally:
                txn.commit()  # (no rollback: what was applied is committed)
            if doc._exceptions:  # an observer failed (pycrdt's observe wrapper kept it)
                exceptions = tuple(doc._exceptions)
                doc._exceptions.clear()
                raise ExceptionGroup("Observer callback error", exceptions)
        except BaseException:
            self.partial_update = self._captured
            raise
        finally:
            txn.drop()
            wtxn._txn, wtxn._leases, doc._txn = None, 0, None
            self._capturing = False
        keys = self.index.get(name)
        if keys is None:
            keys = self.index[name] = {}
        keys[key] = meta
        update, self._captured = self._captured, None
        return update

    @staticmethod
    def set_items(root: Any, items: list[tuple[str, Any]]) -> None:
        """``root[key] = stored`` for every pair of ``items``, inside the document's open
        transaction (an ``apply`` of :meth:`local` or :meth:`do`), each value going straight
        to yrs as in :meth:`local_set`."""
        txn = root.doc._txn
        if _DIRECT_INSERT and txn is not None and txn._txn is not None:
            insert, rtxn = root._integrated.insert, txn._txn
            for key, stored in items:
                insert(rtxn, key, stored)
        else:
            for key, stored in items:
                root[key] = stored

    def do_set(self, root: Any, name: str, key: str, stored: Any, meta: Meta) -> None:
        """:meth:`do` of one map set (``["map", name, "set", key, stored]`` on ``root``)
        inside :meth:`begin`/:meth:`end`, the value going straight to yrs as in
        :meth:`local_set`."""
        if self._kinds.get(name) != "map":
            self._register(name, "map")
        cm = self._txn_cm
        if _DIRECT_INSERT and cm is not None and cm._txn is not None:
            root._integrated.insert(cm._txn, key, stored)
        else:
            root[key] = stored
        keys = self.index.get(name)
        if keys is None:
            keys = self.index[name] = {}
        keys[key] = meta

    def _register(self, name: str, kind: str) -> None:
        current = self.registry.get(name)
        if current in KINDS and current != kind:
            raise CollectionKindMismatch(name, current, kind)
        if current != kind:
            self.registry[name] = kind
        self._kinds[name] = kind

    def entry(
        self,
        agent: str,
        source: str,
        update: bytes,
        ops: list[Op],
        wall: float,
        origin: str = "",
        call: str = "",
    ) -> NewEntry:
        return NewEntry(
            agent, source, self.client_id, wall, update, ops, checksum(update), origin, call
        )

    # -- applying entries from elsewhere -------------------------------------------------------

    def check_update(
        self, update: bytes, *, trial_decode: bool = True, size_limit: bool = True
    ) -> None:
        """Reject update bytes that cannot be right before they reach the document.

        Raises:
            PayloadTooLarge: larger than ``max_update``.
            InvalidUpdate: not bytes, or not decodable as a v1 update.
        """
        if not isinstance(update, bytes):
            raise InvalidUpdate(f"expected bytes, got {type(update).__name__}")
        if size_limit and len(update) > self.max_update:
            raise PayloadTooLarge("update", len(update), self.max_update)
        _check_counts(update)
        if not trial_decode:
            return
        try:
            # decoding the state vector parses the whole structure without touching the doc
            from pycrdt import get_state

            get_state(update)
        except BaseException as exc:  # pycrdt raises ValueError, RuntimeError or a panic
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise InvalidUpdate(f"{type(exc).__name__}: {exc}") from None

    def apply_update(
        self, update: bytes, *, trial_decode: bool = True, size_limit: bool = True
    ) -> None:
        """Apply raw update bytes (no provenance).

        Raises:
            PayloadTooLarge, InvalidUpdate: see :meth:`check_update`; the doc is unchanged.
        """
        self.check_update(update, trial_decode=trial_decode, size_limit=size_limit)
        # an update from elsewhere may register a name concurrently as another kind (the
        # registry's last writer wins): forget what was cached, the registry is the truth.
        # (Observing the registry instead would change how pycrdt encodes the document.)
        self._kinds.clear()
        try:
            self.doc.apply_update(update)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise InvalidUpdate(f"{type(exc).__name__}: {exc}") from None

    def apply_external(
        self,
        update: bytes,
        meta: Meta | None = None,
        *,
        register: bool = False,
        checked: bool = False,
    ) -> tuple[list[Op], bytes | None]:
        """Apply update bytes made outside the typed API; return their effect and the delta the
        document integrated (None if nothing was new), recording ``meta`` as the provenance of
        every map key whose value (or deletion) they leave in the document.

        The effect, per registered collection:

        - map ``set`` ops are read from the update's bytes: every entry it carries that the
          document did not hold (an entry it held already, a duplicate delivery, says
          nothing), *including a set that lost against a concurrent one*
          (LWW): that write is history too. The set that the document shows afterwards comes
          last for its key, so replaying the effect leaves that value; a set that lost against
          a value the document held already is listed although the key keeps that value, and
          provenance (``self.index``) names only the writer of what the document shows.
          Values are as pycrdt shows them (:func:`_plain`: ints as floats). A nested shared
          type written as a value (only a foreign client writes one) is read from the document
          when it won; when it lost it is recorded as an empty value of its kind (``{}``,
          ``[]``, ``""``; None for other content whose value the bytes do not give): its
          contents are other items, which are not decoded;
        - map ``del`` ops: a key whose visible entry the update deleted (found in the
          transaction's delete set) and that it did not set again;
        - list and text inserts and deletes from pycrdt's events (observers on the list and
          text roots the update touches, for this update only), each index counted after the
          ops before it (text indices in characters, as the typed API's ops; pycrdt's deltas
          count UTF-8 bytes);
        - for a collection the update registers, its whole content (``set`` of every key, or
          one ``ins`` at 0).

        An overwrite does not carry its key in the bytes (only its origin, the entry it
        replaces), nor does a deletion: the replica keeps a :class:`crdtstore._v1.KeyIndex`
        of the map entries by item id, filled from the updates applied here and, when other
        transactions (local writes, journal entries) changed the document since, from the
        document's encoding of what they added (each item decoded once: the first call on a
        large document pays for all of it, ~5 us per item on the 2-core dev VM, 0.5 s for
        100k entries; the index takes ~24 bytes per entry plus each key once). Whether an
        entry is new (a duplicate delivery says nothing) is whether the index knew it.
        Updates this decoder cannot read take the old way (observers on every collection,
        which see only what changed the visible document, so LWW losers are missing).

        ``register``: also register the root types the document holds that the registry does
        not name (what a plain Yjs client's ``doc.getMap("notes")`` writes): their kind is
        read from the items of ``update`` (:func:`crdtstore._v1.root_kinds`), or of the
        whole document for a root the update only appends to. They are registered in a
        transaction of this replica whose update is merged into the returned delta, so the
        entry journaled with it registers them for every replica. A name registered already
        (whatever its kind), reserved (``__``), invalid, or whose items show no single kind
        is left alone.

        ``checked``: the caller passed ``update`` through :meth:`check_update` already (with
        its size limit and trial decode); only the cheap count check is made again.

        Raises:
            PayloadTooLarge, InvalidUpdate: see :meth:`check_update`; the doc is unchanged.
        """
        if not checked:
            self.check_update(update)
        # (outside any transaction, as always here: no transaction since the cache was
        # made means no change to the registry since, without asking its size)
        before = self._colls if self._colls_at[0] == self._transactions else self.collections()
        try:
            decoded: Decoded | None = decode_update(update)
        except UpdateDecodeError as exc:
            log.warning("cannot decode an external update, effect from events: %s", exc)
            decoded = None
        kinds_held = before.values()
        lists_or_texts = "list" in kinds_held or "text" in kinds_held
        plan = None if decoded is None else self._plan(decoded, lists_or_texts)
        if plan is None:
            return self._apply_observed(update, meta, before, register=register)
        refs, fresh, others, registry_touched = plan
        ops: list[Op] = []
        texts_after: dict[str, tuple[str, int] | None] = {}
        watched = [
            (name, kind)
            for name, kind in before.items()
            if kind != "map" and (others is None or name in others)
        ]
        cached = self._texts_cached() if any(k == "text" for _, k in watched) else None
        subs = self._observe(watched, ops, cached, texts_after)
        kinds = self._kinds
        self._kinds = {}  # (apply_update empties the cache; it is kept if the registry is)
        self._captured = self._captured_deletes = None
        self._capturing = self._deletes_wanted = True
        synced = self._keys_at == self._transactions
        try:
            self.apply_update(update, trial_decode=False, size_limit=False)
        except BaseException:
            # the index took in entries the document refused: rebuild it from the document
            self._keys, self._keys_sv, self._keys_at = None, {}, -1
            raise
        finally:
            self._capturing = self._deletes_wanted = False
            for root, sub in subs:
                root.unobserve(sub)
        delta, self._captured = self._captured, None
        deleted, self._captured_deletes = self._captured_deletes, None
        if synced:  # what the update wrote is in the key index: it covers the document still
            self._keys_at = self._transactions
        assert decoded is not None
        map_ops, unregistered = self._map_ops(update, decoded, refs, fresh, deleted, before, meta)
        registry_touched = registry_touched or unregistered
        registered = self._register_roots(update, decoded, refs, others) if register else None
        if registered is not None:
            delta = registered if delta is None else merge_updates(delta, registered)
        changed = registry_touched or registered is not None
        self._after_external(ops, before, kinds, changed, cached, texts_after, meta)
        if map_ops:
            ops[:0] = map_ops
        return ops, delta

    def trial_copy(self) -> Replica:
        """A scratch replica holding this one's document, to try an external update on (its
        effect judged by policies) before it reaches this one; it gets a copy of the key index
        (:meth:`apply_external`), so that it does not decode the whole document again."""
        scratch = Replica(max_update=self.max_update)
        scratch.apply_update(self.doc.get_update())
        if self._keys is not None:
            try:
                self._catch_up()
            except UpdateDecodeError:
                return scratch
            scratch._keys = self._keys.copy()
            scratch._keys_sv = dict(self._keys_sv)
            scratch._keys_at = scratch._transactions
        return scratch

    def _key_index(self) -> KeyIndex:
        keys = self._keys
        if keys is None:
            keys = self._keys = KeyIndex()
        return keys

    def _catch_up(self) -> bool:
        """Add the map entries of what other transactions wrote since the key index covered
        the whole document (the document's encoding of it, decoded once); False if it covers
        it already.

        Raises:
            UpdateDecodeError: the document holds content this decoder cannot read.
        """
        if self._keys_at == self._transactions:
            return False
        diff = self.doc.get_update(write_state_vector(self._keys_sv))
        self._key_index().index(decode_update(diff))
        self._keys_sv = read_state_vector(self.doc.get_state())
        self._keys_at = self._transactions
        return True

    def _plan(
        self, decoded: Decoded, lists_or_texts: bool
    ) -> tuple[list[Any], list[bool], set[str] | None, bool] | None:
        """Before applying ``decoded``: index its map entries; return the ``(parent, key)`` of
        each (None: its origin is not in the document), whether each is new to the document,
        the list and text roots the update may touch (None: any; only looked for when
        ``lists_or_texts`` are registered) and whether its entries write to the registry.
        None when the document holds what this decoder cannot read."""
        keys = self._key_index()
        if self._keys_at != self._transactions:
            try:
                self._catch_up()
            except UpdateDecodeError as exc:
                log.warning("cannot decode the map entries held (effect from events): %s", exc)
                return None
        refs, fresh = keys.index(decoded)
        others = decoded.others
        registry_touched = False
        for ref in refs:
            if ref is None or ref[0] == REGISTRY:
                registry_touched = True
                break
        if others is not None and lists_or_texts:
            for client, clock, length in decoded.deletes:
                if not keys.covers(client, clock, length):
                    # not (only) map entries: list or text content, or not in the document
                    others = None
                    break
        # (a deletion of a registry entry is found in the transaction's delete set, which
        # holds only what the update deleted: its own delete set may hold a whole history)
        return refs, fresh, others, registry_touched

    def _map_ops(
        self,
        update: bytes,
        decoded: Decoded,
        refs: list[Any],
        fresh: list[bool],
        deleted: bytes | None,
        before: dict[str, str],
        meta: Meta | None,
    ) -> tuple[list[Op], bool]:
        """The map ops of an applied update (see :meth:`apply_external`): sets that lost, then
        sets that won, then deletes; ``meta`` becomes the provenance of the won and deleted
        keys. ``deleted``: the transaction's delete set. Also whether it deleted a registry
        entry."""
        gone: list[tuple[int, int, int]] = []
        if deleted is not None:
            if decoded.deletes and update.endswith(deleted):
                gone = decoded.deletes  # (the usual case: it deleted what the update says)
            else:
                try:
                    gone = read_delete_set(deleted)
                except UpdateDecodeError:  # pragma: no cover - pycrdt's own encoding
                    log.warning("cannot read a transaction's delete set")
        lost: list[Op] = []
        won: list[Op] = []
        won_keys: set[tuple[str, str]] = set()
        new_ids: list[tuple[int, int, int]] = []
        for item, ref, new in zip(decoded.entries, refs, fresh, strict=True):
            if not new:  # (also every entry whose origin is unknown: ref None)
                continue
            client, clock = item.client, item.clock
            new_ids.append((client, clock, clock + item.length))
            name, key = ref
            if item.content == 1 or before.get(name) != "map":  # (1: deleted content)
                continue
            alive = True
            for c, a, n in gone:
                if c == client and a <= clock < a + n:
                    alive = False
                    break
            if item.content == 8:
                value = item.value
            elif alive:
                value = _plain(self.root(name, "map").get(key))
            elif item.content == 7:
                empty = _EMPTY_OF.get(TYPE_REFS.get(item.value, ""))
                value = None if empty is None else empty()
            else:  # string content, or content the bytes do not give as a value
                value = item.value
            if alive:
                won.append(["map", name, "set", key, value])
                won_keys.add(ref)
            else:
                lost.append(["map", name, "set", key, value])
        dels: list[Op] = []
        unregistered = False
        if gone:
            keys = self._key_index()
            for client, a, n in gone:
                for start, end, ref in keys.overlapping(client, a, n):
                    if ref[0] == REGISTRY:
                        unregistered = True
                    # an entry of the document before the update (so its visible one, as it
                    # was not deleted), not one of the update's own sets that lost
                    if (
                        ref not in won_keys
                        and before.get(ref[0]) == "map"
                        and not _within(client, max(start, a), min(end, a + n), new_ids)
                    ):
                        won_keys.add(ref)  # (once)
                        dels.append(["map", ref[0], "del", ref[1]])
        if meta is not None:
            index = self.index
            for op in won:
                keys_of = index.get(op[1])
                if keys_of is None:
                    keys_of = index[op[1]] = {}
                keys_of[op[3]] = meta
            for op in dels:
                index.setdefault(op[1], {})[op[3]] = meta
        if lost:
            return lost + won + dels, unregistered
        return (won + dels if dels else won), unregistered

    def _observe(
        self,
        watched: list[tuple[str, str]],
        ops: list[Op],
        cached: dict[str, tuple[str, int]] | None,
        texts_after: dict[str, tuple[str, int] | None],
    ) -> list[tuple[Any, Any]]:
        """Subscribe the effect observers of the ``(name, kind)`` collections for one update."""
        subs = []
        roots = self._roots
        for name, kind in watched:
            root = roots.get((name, kind))
            if root is None:
                root = self.root(name, kind)  # (the registry gives it this kind: no mismatch)
            if kind == "map":
                observer = _map_effect(name, ops)
            elif kind == "list":
                observer = _list_effect(name, ops)
            else:
                assert cached is not None
                old = cached.get(name)
                size = len(root)  # (UTF-8 bytes)
                if old is None or old[1] != size:
                    old = cached[name] = (str(root), size)
                observer = _text_effect(name, ops, old, texts_after)
            subs.append((root, root.observe(observer)))
        return subs

    def _after_external(
        self,
        ops: list[Op],
        before: dict[str, str],
        kinds: dict[str, str],
        registry_changed: bool,
        cached: dict[str, tuple[str, int]] | None,
        texts_after: dict[str, tuple[str, int] | None],
        meta: Meta | None,
    ) -> None:
        """After an external update: restore or refresh the collection caches, take in the
        texts' new values, and add the whole content of the collections it registered to
        ``ops`` (recording ``meta`` as the provenance of their keys)."""
        if registry_changed:
            now = self.collections()
        else:  # the registry is as it was: so are the collections and their kinds
            now = before
            kinds.update(self._kinds)
            self._kinds = kinds
            self._colls, self._colls_at = before, (self._transactions, self._colls_at[1])
        if cached is not None:
            for name, after in texts_after.items():
                if after is None:
                    cached.pop(name, None)
                else:
                    cached[name] = after
            self._texts_at = self._transactions
        for name, kind in now.items():
            if name in before:
                continue
            root = self.root(name, kind)
            if kind == "map":
                added = [["map", name, "set", k, _plain(v)] for k, v in root.items()]
                ops.extend(added)
                if meta is not None:
                    keys = self.index.setdefault(name, {})
                    for op in added:
                        keys[op[3]] = meta
            elif kind == "list":
                values = [_plain(v) for v in root]
                if values:
                    ops.append(["list", name, "ins", 0, values])
            else:
                text = str(root)
                if text:
                    ops.append(["text", name, "ins", 0, text])

    def _apply_observed(
        self, update: bytes, meta: Meta | None, before: dict[str, str], *, register: bool
    ) -> tuple[list[Op], bytes | None]:
        """:meth:`apply_external` with every effect from pycrdt's events (observers on every
        collection and the registry): for updates the decoder cannot read. A map set that lost
        LWW makes no event, so it is missing from this effect."""
        ops: list[Op] = []
        texts_after: dict[str, tuple[str, int] | None] = {}
        cached = self._texts_cached() if "text" in before.values() else None
        registry_events: list[Any] = []

        def on_registry(event: Any) -> None:
            registry_events.append(event)

        subs = [(self.registry, self.registry.observe(_signed(on_registry)))]
        subs += self._observe(list(before.items()), ops, cached, texts_after)
        self._captured = None
        self._capturing = True
        kinds = self._kinds
        self._kinds = {}
        try:
            self.apply_update(update, trial_decode=False, size_limit=False)
        finally:
            self._capturing = False
            for root, sub in subs:
                root.unobserve(sub)
        delta, self._captured = self._captured, None
        self._keys_at = -1  # not decoded: the key index no longer covers the document
        registered = self._register_roots(update) if register else None
        if registered is not None:
            delta = registered if delta is None else merge_updates(delta, registered)
        if meta is not None:
            for op in ops:
                if op[0] == "map":
                    self.index.setdefault(op[1], {})[op[3]] = meta
        changed = bool(registry_events) or registered is not None
        self._after_external(ops, before, kinds, changed, cached, texts_after, meta)
        return ops, delta

    def _texts_cached(self) -> dict[str, tuple[str, int]]:
        """The text collections (text, UTF-8 length) as of the last :meth:`apply_external`,
        kept so that deriving a text effect does not read a long text whole on every update
        (``str`` of a 1 MB text typed in 20,000 pieces takes 5.6 ms). Valid while no other
        transaction changed the document since (and, per text, checked again against its
        UTF-8 length); emptied otherwise."""
        if self._transactions != self._texts_at:
            self._texts.clear()
        return self._texts

    def _register_roots(
        self,
        update: bytes,
        decoded: Decoded | None = None,
        refs: list[Any] | None = None,
        others: set[str] | None = None,
    ) -> bytes | None:
        """Register the unregistered root types of the document whose kind the items show (see
        :meth:`apply_external`); return the update of that transaction (None: none).

        With the update's ``decoded`` entries, their ``refs`` and the ``others`` roots it
        names (see :meth:`_plan`): when every root it writes to is known to be checked, the
        document's roots are not listed at all (the usual case)."""
        if decoded is not None and refs is not None and others is not None:
            checked = self._roots_checked
            if (
                not self._undetermined
                and others <= checked
                and all(ref is not None and ref[0] in checked for ref in refs)
            ):
                return None
        names = set(self.doc.keys())
        if names <= self._roots_checked and not self._undetermined:
            return None  # the usual case: no root the registry does not name
        registry = self.registry
        unknown = [n for n in names if n != REGISTRY and n not in registry]
        unknown = [n for n in unknown if _collection_name(n)]
        if not unknown:
            self._roots_checked = frozenset(names)
            return None
        try:
            found = root_kinds(update)
            fresh = [n for n in unknown if n not in self._undetermined]
            if any(len(found.get(n, ())) != 1 for n in fresh):
                # a root the update only appends to: its first items are in the document
                whole = root_kinds(self.doc.get_update())
                found = {n: found.get(n) or whole.get(n, set()) for n in unknown}
        except UpdateDecodeError as exc:
            log.warning("cannot read the roots of an external update: %s", exc)
            return None
        kinds: dict[str, str] = {}
        for name in unknown:
            shown = found.get(name, set())
            if len(shown) == 1:
                kinds[name] = next(iter(shown))
                self._undetermined.discard(name)
            else:
                # empty, only deleted items, or several kinds: left alone, and the whole
                # document is not decoded for it again (only the updates that come)
                if len(shown) > 1:
                    log.warning("root %r holds items of kinds %s: not registered", name, shown)
                self._undetermined.add(name)
        self._roots_checked = frozenset(n for n in names if n not in self._undetermined)
        if not kinds:
            return None
        self._captured = None
        self._capturing = True
        try:
            with self.doc.transaction():
                for name, kind in sorted(kinds.items()):
                    self._register(name, kind)
        finally:
            self._capturing = False
        registered, self._captured = self._captured, None
        return registered

    def apply_rows(self, rows: Iterable[Row], run: str = "") -> None:
        """Apply journal entries in the given (causal) order, keeping provenance exact.

        Applied in pycrdt transactions of up to ``_APPLY_GROUP`` entries each (see
        :meth:`_apply_rows`): yrs commits a big transaction of interleaved list appends
        slowly (1,000 appends by 3 writers in one transaction: 5x the time of applying them
        one by one), while groups of 8-32 entries are the fastest for maps, lists and texts
        alike (20k journal entries of the resume benchmark's workloads: 0.5-0.8x the time of
        one by one, 0.2x that of one transaction per 1,000 for the log workload).
        """
        if not isinstance(rows, list):
            rows = list(rows)
        if len(rows) <= _APPLY_GROUP:
            self._apply_rows(rows, run)
            return
        for i in range(0, len(rows), _APPLY_GROUP):
            self._apply_rows(rows[i : i + _APPLY_GROUP], run)

    def _apply_rows(self, rows: list[Row], run: str) -> None:
        """:meth:`apply_rows` of one group of entries, in one pycrdt transaction.

        Provenance follows what the document did, not what the entry wanted: an entry whose
        write to a key lost to a concurrent one (LWW by client id) does not become that key's
        provenance. After the batch, each key it touched is read once and attributed to the
        last entry of the batch whose write left exactly that value (or that delete); when
        none did, a write from before the batch won and keeps its provenance. (Map observers
        would say the same, at several times the cost of the apply itself.) Two concurrent
        writes of the same value are indistinguishable; the later one is named.

        The batch is applied and read back in one pycrdt transaction (pycrdt otherwise opens
        and commits one per update applied and several per key read); the entries are still
        integrated one by one, in the given order.

        An entry that fails its checksum or does not decode (a torn or corrupted entry) is
        skipped, never applied, and recorded in :attr:`skipped` as a :class:`JournalCorrupt`;
        the entries around it are applied as usual (DESIGN I4: a torn tail is skipped and
        never corrupts earlier entries).
        """
        touched: dict[tuple[str, str], list[tuple[Op, Row]]] = {}
        coll_seq = self.coll_seq
        doc = self.doc
        with doc.transaction() as txn:
            # an update from elsewhere may register a name concurrently as another kind:
            # forget what was cached (see apply_update), the registry is the truth
            self._kinds.clear()
            for row in rows:
                update = row.update
                if checksum(update) != row.checksum:
                    self._skip(JournalCorrupt(run, row.seq, "checksum mismatch"))
                    continue
                try:
                    # journal entries passed their checksum: skip the trial decode that
                    # untrusted bytes get (pycrdt leaves the doc intact on bytes it rejects)
                    self.check_update(update, trial_decode=False, size_limit=False)
                    doc.apply_update(update)
                except InvalidUpdate as exc:
                    self._skip(JournalCorrupt(run, row.seq, exc.reason))
                    continue
                except BaseException as exc:  # pycrdt raises ValueError, RuntimeError or a panic
                    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                        raise
                    self._skip(JournalCorrupt(run, row.seq, f"{type(exc).__name__}: {exc}"))
                    continue
                if row.seq > self.head:
                    self.head = row.seq
                effect = row.effect
                if effect:
                    for op in effect:
                        coll_seq[op[1]] = row.seq
                        if op[0] == "map":
                            writes = touched.get((op[1], op[3]))
                            if writes is None:
                                touched[(op[1], op[3])] = [(op, row)]
                            else:
                                writes.append((op, row))
            if not touched:
                return
            winners = self._winners(touched, txn._txn)
        for seq in sorted(winners):  # in journal order: the table appends
            row = winners[seq]
            self._remember(seq, row.agent, row.source, row.wall_time, row.origin)
        # only a collection this batch grew can have reached the size _settle acts on
        index = self.index
        if any(len(index.get(name, ())) >= _SETTLE_MIN for name, _ in touched):
            self._settle()

    def _winners(
        self, touched: dict[tuple[str, str], list[tuple[Op, Row]]], raw: Any
    ) -> dict[int, Row]:
        """For :meth:`apply_rows`, inside its transaction (``raw`` is pycrdt's transaction
        object): index each touched key under the last entry whose write left its current
        value; return those entries by position.

        Reads through the integrated (Rust) objects with the open transaction: pycrdt's
        ``Map.get`` opens a nested transaction three times and checks the key twice, which
        made it the largest part of applying a one-key entry.
        """
        winners: dict[int, Row] = {}
        kinds = self._kinds
        registry = self.registry.integrated
        index = self.index
        name = ""
        root: Any = None
        for (coll, key), writes in touched.items():
            if coll != name:
                name = coll
                kind = kinds.get(coll)
                if kind is None:
                    kind = registry.get(raw, coll) if registry.has(raw, coll) else None
                    if kind in KINDS:
                        kinds[coll] = kind
                if kind in KINDS and kind != "map":
                    root = None  # registered as another kind: not a map key (see root())
                else:
                    root = self._roots.get((coll, "map"))
                    if root is None:
                        root = self.root(coll, "map")
            if root is None:
                continue
            integrated = root.integrated
            if integrated.has(raw, key):
                current = root._maybe_as_type_or_doc(integrated.get(raw, key))
                value = from_stored(current)
            else:
                current = _ABSENT
            winner = None
            for op, row in reversed(writes):
                if current is _ABSENT:
                    if op[2] != "set":
                        winner = row
                        break
                elif op[2] == "set" and from_stored(op[4]) == value:
                    winner = row
                    break
            if winner is not None:  # else a write from before this batch is still current
                keys = index.get(coll)
                if keys is None:
                    keys = index[coll] = {}
                keys[key] = winner.seq
                winners[winner.seq] = winner
        return winners

    def _skip(self, error: JournalCorrupt) -> None:
        log.error("%s; entry skipped", error)
        self.skipped.append(error)

    def meta(self, collection: str, key: str) -> Meta | None:
        """The provenance of the current value of ``collection[key]`` (None if unknown)."""
        keys = self.index.get(collection)
        value: Any = None if keys is None else keys.get(key)
        if value is None:
            settled = self._settled.get(collection)
            seq = None if settled is None else settled.get(key)
            return None if seq is None else self.table.get(seq)
        if type(value) is int:
            return self.table.get(value)
        if isinstance(value, Meta):
            return value
        assert keys is not None
        seq, agent, source, wall, *rest = value  # as an older snapshot stored it
        meta = Meta(agent, source, wall, seq, rest[0] if rest else "")
        if type(seq) is int:
            self._remember(seq, agent, source, wall, meta.run)
            keys[key] = seq
        return meta

    def agent_of(self, collection: str, key: str) -> str | None:
        """``meta(collection, key).agent`` without building the ``Meta`` (the owner policy's
        lookup on every overwrite)."""
        keys = self.index.get(collection)
        value: Any = None if keys is None else keys.get(key)
        if value is None:
            settled = self._settled.get(collection)
            value = None if settled is None else settled.get(key)
            if value is None:
                return None
        if type(value) is int:
            table = self.table
            seqs = table.seqs
            i = bisect_left(seqs, value)
            if i == len(seqs) or seqs[i] != value:
                return None
            return table.who[i][0]
        if type(value) is Meta:
            agent: str = value[0]
            return agent
        meta = self.meta(collection, key)  # an older snapshot's list: converted once
        return None if meta is None else meta.agent

    def export_state(self) -> dict[str, Any]:
        """crdtstore's bookkeeping to store beside a snapshot's update.

        ``settled`` holds, per collection, the journaled keys sorted and their journal
        positions packed (see :func:`_pack`); ``index`` the other keys (an entry not yet
        journaled, or adopted from an older snapshot) as ``[seq, agent, source, wall, run]``;
        ``table`` the provenance of the positions (see :class:`_EntryTable`). Older
        snapshots, with every key in ``index``, are read as well.
        """
        self._settle(every=True)
        self.table.keep(self._live_seqs())
        return {
            "index": {
                name: {
                    key: meta.as_list() if isinstance(meta, Meta) else meta
                    for key, meta in keys.items()
                }
                for name, keys in self.index.items()
                if keys
            },
            "settled": {
                name: {"keys": settled.keys, "seqs": _pack(settled.seqs)}
                for name, settled in self._settled.items()
            },
            "table": self.table.export(),
            "head": self.head,
            "coll_seq": self.coll_seq,
        }

    def import_state(self, state: dict[str, Any]) -> None:
        self.head = max(self.head, int(state.get("head", 0)))
        for name, seq in state.get("coll_seq", {}).items():
            self.coll_seq[name] = max(self.coll_seq.get(name, 0), int(seq))
        # The index is adopted as parsed: key -> position (and the table's arrays at C
        # speed), or, from older snapshots, [seq, agent, source, wall, run] lists turned into
        # a position only when asked for (see meta()): building a tuple per key made resuming
        # a 100k-key snapshot spend half its time here.
        if "table" in state:
            self.table.load(state["table"])
        for name, run in state.get("settled", {}).items():
            skeys, sseqs = run["keys"], _unpack("q", run["seqs"])
            # str and other types do not compare: an increasing list opening with a str is
            # all str
            if len(skeys) != len(sseqs) or (skeys and type(skeys[0]) is not str):
                raise ValueError("inconsistent settled index")
            try:
                ordered = _increasing(skeys)
            except TypeError:
                raise ValueError("inconsistent settled index") from None
            if name not in self._settled and ordered:
                self._settled[name] = _Settled.of_sorted(skeys, sseqs)
            else:  # merge under what this replica knows already
                into = self.index.setdefault(name, {})
                for key, seq in zip(skeys, sseqs, strict=True):
                    if key not in into and self.meta(name, key) is None:
                        into[key] = seq
        for name, keys in state.get("index", {}).items():
            target = self.index.get(name)
            if target is None and name not in self._settled:
                self.index[name] = keys
            else:
                target = self.index.setdefault(name, {})
                for key, value in keys.items():
                    if key not in target and self.meta(name, key) is None:
                        target[key] = value
        self._settle()


# entries a bulk load merges into one apply: measured on 20k-100k entries, groups of 16-64
# apply in 0.6-0.7x the time of one apply per entry; much larger groups of list appends by
# several writers are slower than one by one (yrs integrates a big interleaved merge slowly)
_BULK_GROUP = 32
_APPLY_GROUP = 32  # journal entries Replica.apply_rows applies in one pycrdt transaction
_BULK_PENDING_KEYS = 10_000  # keys whose winner a bulk load holds before resolving them

# one journaled write a bulk load keeps per key and slot:
# seq, op, agent, source, wall time, origin, slot (see BulkLoad)
_Write = tuple[int, Op, str, str, float, str, int]
_DELETES = -(1 << 62)  # the slot of a key's deletes (a client id is >= 0, -seq is above it)


class _OneByOne(Exception):
    pass


class BulkLoad:
    """Apply many journal entries to a replica (compaction, replay) with the same document and
    provenance as :meth:`Replica.apply_rows`, at a fraction of its per-entry cost.

    The entries passed to :meth:`feed` are checked (CRC-32), merged in groups of
    ``_BULK_GROUP`` and each group applied to the document once (entry by entry only if the
    merge or the apply of a group is refused, so that a bad entry is skipped alone).
    Provenance is resolved as in :meth:`Replica.apply_rows`, but once for many chunks: per
    key only the last set of each writer (``client_id``; a writer's later set supersedes its
    own earlier ones) and the last delete are kept, and the keys are read from the document
    when :meth:`finish` runs (or when more than ``_BULK_PENDING_KEYS`` keys are pending, which
    bounds the memory held). Once an entry has been skipped, the rest is applied entry by
    entry (yrs integrates entries after a gap one by one differently from a merge of them)
    and every write is kept (a writer's entries after a skipped one may be left pending, so
    its earlier write may be the current one). Two writes of the same value are told apart as
    in :meth:`Replica.apply_rows`, except that a writer's superseded set is never named.
    """

    def __init__(self, replica: Replica, run: str = "") -> None:
        self.replica = replica
        self.run = run
        # (collection, key) -> the last write, or client id -> last write when several wrote
        self._pending: dict[tuple[str, str], _Write | dict[int, _Write]] = {}
        self._every_write = False  # set once an entry was skipped

    def feed(self, rows: Sequence[Row]) -> None:
        replica = self.replica
        good: list[Row] = []
        for row in rows:
            if checksum(row.update) != row.checksum:
                replica._skip(JournalCorrupt(self.run, row.seq, "checksum mismatch"))
                self._every_write = True
            else:
                good.append(row)
        applied: list[Row] = []
        for at in range(0, len(good), _BULK_GROUP):
            group = good[at : at + _BULK_GROUP]
            try:
                if self._every_write:  # after a skipped entry: one by one, as apply_rows
                    raise _OneByOne
                # our own journal's entries: no size limit, no trial decode (as in apply_rows)
                merged = merge_updates(*[row.update for row in group])
                replica.apply_update(merged, trial_decode=False, size_limit=False)
                applied.extend(group)
                continue
            except Exception:  # an entry is refused: apply them one by one, skipping it
                pass  # (also _OneByOne)
            for row in group:
                try:
                    replica.apply_update(row.update, trial_decode=False, size_limit=False)
                except (InvalidUpdate, PayloadTooLarge) as exc:
                    reason = exc.reason if isinstance(exc, InvalidUpdate) else str(exc)
                    replica._skip(JournalCorrupt(self.run, row.seq, reason))
                    self._every_write = True
                    continue
                applied.append(row)
        pending, coll_seq = self._pending, replica.coll_seq
        for row in applied:
            if row.seq > replica.head:
                replica.head = row.seq
            if not row.effect:
                continue
            # the slot a write replaces: the writer's last set, or the last delete (every
            # write its own slot once an entry was skipped)
            seq, client, every = row.seq, row.client_id, self._every_write
            agent, source, wall, origin = row.agent, row.source, row.wall_time, row.origin
            for op in row.effect:
                coll_seq[op[1]] = seq
                if op[0] != "map":
                    continue
                slot = -seq if every else client if op[2] == "set" else _DELETES
                write: _Write = (seq, op, agent, source, wall, origin, slot)
                where = (op[1], op[3])
                held = pending.get(where)
                if held is None:
                    pending[where] = write
                elif isinstance(held, dict):
                    held[slot] = write
                elif held[6] == slot:
                    pending[where] = write
                else:
                    pending[where] = {held[6]: held, slot: write}
        if len(pending) > _BULK_PENDING_KEYS:
            self.finish()

    def finish(self) -> None:
        """Attribute every pending key to the entry whose write the document kept."""
        replica, pending = self.replica, self._pending
        self._pending = {}
        by_name: dict[str, list[tuple[str, _Write | dict[int, _Write]]]] = {}
        for (name, key), held in pending.items():
            by_name.setdefault(name, []).append((key, held))
        del pending
        winners: dict[int, _Write] = {}
        for name, keyed in by_name.items():
            try:
                root = replica.root(name, "map")
            except CollectionKindMismatch:
                continue
            get: Callable[[str, Any], Any] = root.get
            if len(keyed) * 4 >= len(root):  # most of the map: read it in one call
                try:
                    get = json.loads(str(root)).get  # (its JSON: far cheaper than items())
                except ValueError:
                    get = dict(root.items()).get
            index = replica.index.setdefault(name, {})
            for key, held in keyed:
                current = get(key, _ABSENT)
                writes = (
                    sorted(held.values(), key=lambda w: w[0], reverse=True)
                    if isinstance(held, dict)
                    else (held,)
                )
                for write in writes:
                    op = write[1]
                    # (== compares 1.0 and 1 equal, as from_stored would make them)
                    if (current is _ABSENT and op[2] != "set") or (
                        current is not _ABSENT and op[2] == "set" and op[4] == current
                    ):
                        index[key] = write[0]
                        winners[write[0]] = write
                        break
                # no write matched: a write from before these entries is still current
        table = replica.table
        tseqs, walls, who, names = table.seqs, table.walls, table.who, table.names
        for seq in sorted(winners):  # in journal order: the table appends
            _, _, agent, source, wall, origin, _ = winners[seq]
            if tseqs and seq <= tseqs[-1]:
                table.add(seq, agent, source, wall, origin)
            else:  # the usual case (as in Replica.journaled_many)
                tseqs.append(seq)
                walls.append(wall)
                who.append(names(agent, source, origin))
        if len(tseqs) > table.sweep_at:
            table.keep(replica._live_seqs())
        if winners:
            replica._settle()


def now() -> float:
    return time.time()
