"""Reading which root types a Yjs v1 update writes to, and as what kind. No I/O, no pycrdt.

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

Format (y-protocols / Yjs ``UpdateEncoderV1``): ``numClients``, then per client ``numStructs,
client, clock`` and the structs; then the delete set. Integers are lib0 var-uints, strings a
var-uint length and UTF-8 bytes, ``any`` values lib0's tagged encoding.
"""

from __future__ import annotations

__all__ = ["UpdateDecodeError", "root_kinds"]


class UpdateDecodeError(ValueError):
    """The bytes are not a v1 update this reader understands."""


_MAP, _LIST, _TEXT = "map", "list", "text"
_TEXT_CONTENT = frozenset({4, 5, 6})  # ContentString, ContentEmbed, ContentFormat


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
        data, pos, n, shift = self.data, self.pos, 0, 0
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
