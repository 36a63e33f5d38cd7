"""Reading Yjs v1 updates: which root types they write to and as what kind
(:func:`root_kinds`), and which map keys they set and delete (:func:`decode_update`,
:class:`KeyIndex`). No I/O, no pycrdt.

pycrdt reports a root type that only arrived in an update (never asked for by this process)
without a type (``Doc.keys()`` lists it, ``Doc.items()`` gives ``None``), and asking for it as
the wrong type is unsafe (reading a text root as an ``Array`` never returns, pycrdt 0.14.13).
The update bytes say it, though: an item whose parent is a root names that root, and

- an item with a ``parentSub`` (a key) is a map entry;
- string, embed and format content is text;
- any other live content (JSON, binary, any, type, doc) is an array element;
- deleted content (and garbage-collected ranges) says nothing.

Only items that carry their parent (the first item of a run, with neither origin) name the root:
an item inserted next to another one inherits its parent, so an update that only appends to a
root created by an earlier update does not name it (decode the whole document for those).

A map entry (an item with a ``parentSub``) carries its root and key only when it has no origin:
an overwrite names the entry it replaces as its origin, and a delete set names item ids. So the
keys are found through a :class:`KeyIndex` of the entries a document holds, by id.

Format (y-protocols / Yjs ``UpdateEncoderV1``): ``numClients``, then per client ``numStructs,
client, clock`` and the structs; then the delete set. Integers are lib0 var-uints, strings a
var-uint length and UTF-8 bytes, ``any`` values lib0's tagged encoding.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_right
from typing import Any, NamedTuple

__all__ = [
    "Decoded",
    "KeyIndex",
    "MapItem",
    "UpdateDecodeError",
    "decode_update",
    "read_delete_set",
    "read_state_vector",
    "root_kinds",
    "write_state_vector",
]


class UpdateDecodeError(ValueError):
    """The bytes are not a v1 update this reader understands."""


_MAP, _LIST, _TEXT = "map", "list", "text"
_TEXT_CONTENT = frozenset({4, 5, 6})  # ContentString, ContentEmbed, ContentFormat
_F64, _F32, _I64 = struct.Struct(">d"), struct.Struct(">f"), struct.Struct(">q")


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise UpdateDecodeError("unexpected end of update")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def uint(self) -> int:
        data, pos = self.data, self.pos
        if pos < len(data) and data[pos] < 0x80:  # the usual case: one byte
            self.pos = pos + 1
            return data[pos]
        n = shift = 0
        while True:
            if pos >= len(data):
                raise UpdateDecodeError("unexpected end of update")
            b = data[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                self.pos = pos
                return n
            shift += 7
            if shift > 70:
                raise UpdateDecodeError("var-uint too long")

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.data):
            raise UpdateDecodeError("unexpected end of update")
        self.pos += n

    def string(self) -> str:
        n = self.uint()
        start = self.pos
        self.skip(n)
        try:
            return self.data[start : self.pos].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UpdateDecodeError(f"bad string: {exc}") from None

    def skip_string(self) -> None:
        self.skip(self.uint())

    def skip_int(self) -> None:  # lib0 signed var-int
        b = self.byte()
        while b & 0x80:
            b = self.byte()

    def skip_any(self, depth: int = 0) -> None:
        if depth > 256:
            raise UpdateDecodeError("value nested too deep")
        tag = self.byte()
        if tag in (127, 126, 121, 120):  # undefined, null, false, true
            return
        if tag == 125:
            self.skip_int()
        elif tag == 124:
            self.skip(4)
        elif tag in (123, 122):  # float64, bigint64
            self.skip(8)
        elif tag in (119, 116):  # string, Uint8Array
            self.skip_string()
        elif tag == 118:  # object
            for _ in range(self.uint()):
                self.skip_string()
                self.skip_any(depth + 1)
        elif tag == 117:  # array
            for _ in range(self.uint()):
                self.skip_any(depth + 1)
        else:
            raise UpdateDecodeError(f"unknown value tag {tag}")


def root_kinds(update: bytes) -> dict[str, set[str]]:
    """The roots that items of the v1 ``update`` name as their parent: name -> the kinds their
    items show (``"map"``, ``"list"``, ``"text"``; an empty set when they only hold deleted
    content). One pass over the bytes; strings and values are skipped, not decoded.

    Raises:
        UpdateDecodeError: the bytes are not a v1 update.
    """
    r = _Reader(update)
    found: dict[str, set[str]] = {}
    for _ in range(r.uint()):
        structs = r.uint()
        r.uint()  # client
        r.uint()  # clock
        for _ in range(structs):
            info = r.byte()
            ref = info & 0x1F
            if ref == 0 or ref == 10:  # GC, Skip
                r.uint()
                continue
            if info & 0x80:
                r.uint()
                r.uint()
            if info & 0x40:
                r.uint()
                r.uint()
            root: str | None = None
            sub = False
            if not info & 0xC0:
                if r.uint() == 1:
                    root = r.string()
                else:
                    r.uint()
                    r.uint()
                if info & 0x20:
                    r.skip_string()
                    sub = True
            kind: str | None
            if ref == 1:  # ContentDeleted
                r.uint()
                kind = None
            elif ref == 2:  # ContentJSON
                for _ in range(r.uint()):
                    r.skip_string()
                kind = _LIST
            elif ref == 3:  # ContentBinary
                r.skip_string()
                kind = _LIST
            elif ref == 4 or ref == 5:  # ContentString, ContentEmbed
                r.skip_string()
                kind = _TEXT
            elif ref == 6:  # ContentFormat
                r.skip_string()
                r.skip_string()
                kind = _TEXT
            elif ref == 7:  # ContentType
                if r.uint() in (3, 5):  # XmlElement, XmlHook: a name
                    r.skip_string()
                kind = _LIST
            elif ref == 8:  # ContentAny
                for _ in range(r.uint()):
                    r.skip_any()
                kind = _LIST
            elif ref == 9:  # ContentDoc
                r.skip_string()
                r.skip_any()
                kind = _LIST
            else:
                raise UpdateDecodeError(f"unknown content ref {ref}")
            if root is not None:
                kinds = found.setdefault(root, set())
                if sub:  # a map entry, even deleted
                    kinds.add(_MAP)
                elif kind is not None:
                    kinds.add(kind)
    return found


# -- map entries: which key of which map each item writes ----------------------------------------

CONTENT_DELETED, CONTENT_ANY, CONTENT_TYPE = 1, 8, 7
# the nested type a ContentType item creates (Yjs type refs): Array, Map, Text; XML types
# (3, 4, 5, 6) are read by pycrdt as XML objects
TYPE_REFS = {0: "list", 1: "map", 2: "text"}


class MapItem(NamedTuple):
    """One item of an update with a ``parentSub``: a write to one key of a map.

    ``parent`` is the root's name, or the ``(client, clock)`` of a nested type; ``key`` is the
    key. Both are None when the update does not carry them (an item with an origin inherits
    them from it: look the origin up, see :class:`KeyIndex`). ``content`` is the Yjs content
    ref (1 deleted, 8 any, 7 a nested type, ...); ``value`` is the value as pycrdt shows it for
    ``any`` content (ints as floats, ``undefined`` as None), the type ref for a nested type,
    else None.
    """

    client: int
    clock: int
    length: int
    origin: tuple[int, int] | None
    parent: str | tuple[int, int] | None
    key: str | None
    content: int
    value: Any


class Decoded(NamedTuple):
    """What :func:`decode_update` reads from an update."""

    entries: list[MapItem]  # items with a parentSub, in the order of the update
    # roots that other items (list or text content, or deletions of it) name as their parent;
    # None when some such item does not name it (it has an origin)
    others: set[str] | None
    deletes: list[tuple[int, int, int]]  # the delete set: (client, clock, length)


def _read_any(r: _Reader, depth: int = 0) -> Any:
    if depth > 256:
        raise UpdateDecodeError("value nested too deep")
    tag = r.byte()
    if tag == 119:
        return r.string()
    if tag == 125:  # signed var-int (pycrdt shows it as a float)
        b = r.byte()
        negative = b & 0x40
        n, shift = b & 0x3F, 6
        while b & 0x80:
            b = r.byte()
            n |= (b & 0x7F) << shift
            shift += 7
            if shift > 70:
                raise UpdateDecodeError("var-int too long")
        return float(-n if negative else n)
    if tag in (127, 126):
        return None
    if tag == 121:
        return False
    if tag == 120:
        return True
    if tag == 123:
        start = r.pos
        r.skip(8)
        return float(_F64.unpack_from(r.data, start)[0])
    if tag == 124:
        start = r.pos
        r.skip(4)
        return float(_F32.unpack_from(r.data, start)[0])
    if tag == 122:
        start = r.pos
        r.skip(8)
        return int(_I64.unpack_from(r.data, start)[0])
    if tag == 118:
        out: dict[str, Any] = {}
        for _ in range(r.uint()):
            k = r.string()
            out[k] = _read_any(r, depth + 1)
        return out
    if tag == 117:
        return [_read_any(r, depth + 1) for _ in range(r.uint())]
    if tag == 116:
        n = r.uint()
        start = r.pos
        r.skip(n)
        return bytearray(r.data[start : r.pos])
    raise UpdateDecodeError(f"unknown value tag {tag}")


_LONG: dict[bytes, int] = {}  # see _more


def _more(data: bytes, pos: int, b: int) -> tuple[int, int]:
    """The rest of a var-uint whose first byte ``b`` (>= 0x80) was read: (value, position).

    Long var-uints are mostly client ids (8 bytes for most of pycrdt's, 5 for most of Yjs'),
    the same few again and again: their values are kept by their bytes (bounded). A var-uint
    is prefix-free, so the 8 (or 5) bytes at ``pos - 1``, when they are one known var-uint,
    are the one here."""
    c = data[pos]
    if c < 0x80:  # two bytes
        return (b & 0x7F) | (c << 7), pos + 1
    start = pos - 1
    known = _LONG.get(data[start : start + 8])
    if known is not None:
        return known, start + 8
    known = _LONG.get(data[start : start + 5])
    if known is not None:
        return known, start + 5
    n, shift = b & 0x7F, 7
    while True:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            if pos - start in (5, 8):
                if len(_LONG) >= 4096:
                    _LONG.clear()
                _LONG[data[start:pos]] = n
            return n, pos
        shift += 7
        if shift > 70:
            raise UpdateDecodeError("var-uint too long")


def decode_update(update: bytes) -> Decoded:
    """Read the map entries, the other roots touched and the delete set of a v1 update (one
    pass; the values of map entries with ``any`` content are decoded, other content skipped).

    Raises:
        UpdateDecodeError: the bytes are not a v1 update this reader understands.
    """
    try:
        return _decode(update)
    except IndexError:
        raise UpdateDecodeError("unexpected end of update") from None


def _decode(data: bytes) -> Decoded:
    # var-uints are read inline (most are one byte; _more reads the rest), values and
    # strings through a _Reader at the same position
    entries: list[MapItem] = []
    others: set[str] | None = set()
    r = _Reader(data)
    b = data[0]
    pos = 1
    clients, pos = (b, pos) if b < 0x80 else _more(data, pos, b)
    for _ in range(clients):
        b = data[pos]
        pos += 1
        structs, pos = (b, pos) if b < 0x80 else _more(data, pos, b)
        b = data[pos]
        pos += 1
        client, pos = (b, pos) if b < 0x80 else _more(data, pos, b)
        b = data[pos]
        pos += 1
        clock, pos = (b, pos) if b < 0x80 else _more(data, pos, b)
        for _ in range(structs):
            info = data[pos]
            pos += 1
            ref = info & 0x1F
            if ref == 0 or ref == 10:  # GC, Skip
                b = data[pos]
                pos += 1
                n, pos = (b, pos) if b < 0x80 else _more(data, pos, b)
                clock += n
                continue
            origin: tuple[int, int] | None = None
            if info & 0xC0:
                b = data[pos]
                pos += 1
                oc, pos = (b, pos) if b < 0x80 else _more(data, pos, b)
                b = data[pos]
                pos += 1
                ok, pos = (b, pos) if b < 0x80 else _more(data, pos, b)
                origin = (oc, ok)
                if info & 0x80 and info & 0x40:  # a right origin too: not needed
                    b = data[pos]
                    pos += 1
                    _, pos = (b, pos) if b < 0x80 else _more(data, pos, b)
                    b = data[pos]
                    pos += 1
                    _, pos = (b, pos) if b < 0x80 else _more(data, pos, b)
            r.pos = pos
            parent: str | tuple[int, int] | None = None
            key: str | None = None
            if origin is None:
                parent = r.string() if r.uint() == 1 else (r.uint(), r.uint())
                if info & 0x20:
                    key = r.string()
            value: Any = None
            if ref == 8:  # ContentAny
                length = r.uint()
                if info & 0x20 and length:
                    value = _read_any(r)
                    for _ in range(length - 1):
                        r.skip_any()
                else:
                    for _ in range(length):
                        r.skip_any()
            elif ref == 1:  # ContentDeleted
                length = r.uint()
            elif ref == 4:  # ContentString: its length in UTF-16 code units
                n = r.uint()
                start = r.pos
                r.skip(n)
                raw = data[start : r.pos]
                if raw.isascii():  # (the usual case: one UTF-16 unit a byte)
                    length = n
                    value = raw.decode("ascii")
                else:
                    try:
                        text = raw.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise UpdateDecodeError(f"bad string: {exc}") from None
                    length = len(text.encode("utf-16-le")) // 2
                    value = text
            elif ref == 2:  # ContentJSON
                length = r.uint()
                for _ in range(length):
                    r.skip_string()
            elif ref == 3 or ref == 5:  # ContentBinary, ContentEmbed
                r.skip_string()
                length = 1
            elif ref == 6:  # ContentFormat
                r.skip_string()
                r.skip_string()
                length = 1
            elif ref == 7:  # ContentType
                value = r.uint()
                if value in (3, 5):  # XmlElement, XmlHook: a name
                    r.skip_string()
                length = 1
            elif ref == 9:  # ContentDoc
                r.skip_string()
                r.skip_any()
                length = 1
            else:
                raise UpdateDecodeError(f"unknown content ref {ref}")
            pos = r.pos
            if info & 0x20:
                entries.append(MapItem(client, clock, length, origin, parent, key, ref, value))
            elif others is not None:
                if isinstance(parent, str):
                    others.add(parent)
                elif parent is None:
                    others = None  # an item next to another one: its root is not named
            clock += length
    return Decoded(entries, others, _delete_set(data, pos))


def read_delete_set(data: bytes) -> list[tuple[int, int, int]]:
    """The ranges of a v1 delete set: ``(client, clock, length)``.

    Raises:
        UpdateDecodeError: not a delete set.
    """
    try:
        return _delete_set(data, 0)
    except IndexError:
        raise UpdateDecodeError("unexpected end of delete set") from None


def _delete_set(data: bytes, pos: int) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    b = data[pos]
    pos += 1
    clients, pos = (b, pos) if b < 0x80 else _more(data, pos, b)
    for _ in range(clients):
        b = data[pos]
        pos += 1
        client, pos = (b, pos) if b < 0x80 else _more(data, pos, b)
        b = data[pos]
        pos += 1
        ranges, pos = (b, pos) if b < 0x80 else _more(data, pos, b)
        for _ in range(ranges):
            b = data[pos]
            pos += 1
            clock, pos = (b, pos) if b < 0x80 else _more(data, pos, b)
            b = data[pos]
            pos += 1
            length, pos = (b, pos) if b < 0x80 else _more(data, pos, b)
            out.append((client, clock, length))
    if pos != len(data):
        raise UpdateDecodeError("bytes after the delete set")
    return out


def read_state_vector(state: bytes) -> dict[int, int]:
    """A v1 state vector: client -> the next clock expected from it.

    Raises:
        UpdateDecodeError: not a state vector.
    """
    r = _Reader(state)
    out: dict[int, int] = {}
    for _ in range(r.uint()):
        client = r.uint()
        out[client] = r.uint()
    return out


def write_state_vector(sv: dict[int, int]) -> bytes:
    """The v1 encoding of a state vector."""
    out = bytearray()
    for n in (len(sv), *(x for pair in sv.items() for x in pair)):
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
    return bytes(out)


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
