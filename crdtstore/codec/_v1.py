"""Yjs v1 structures over lib0: state vectors, delete sets, and the structs of updates (which
roots they write to and as what kind, :func:`root_kinds`; which map keys they set and
delete, :func:`decode_update`). No I/O, no pycrdt.

Update format (Yjs ``UpdateEncoderV1``): ``numClients``, then per client ``numStructs, client,
clock`` and the structs; then the delete set (``numClients``, per client ``client,
numRanges`` and ``clock, length`` per range). A state vector is ``numClients`` then
``client, clock`` pairs.

pycrdt reports a root type that only arrived in an update without a type, and asking for it
as the wrong type is unsafe (pycrdt 0.14.13): the update bytes say what it is. Only items
that carry their parent (the first item of a run, with neither origin) name the root; an
item inserted next to another one inherits it (decode the whole document for those). A map
entry carries its root and key only when it has no origin: an overwrite names the entry it
replaces as its origin, and a delete set names item ids, hence :class:`~crdtstore.codec.KeyIndex`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._lib0 import CodecError, Decoder, Encoder, read_var_uint_at

__all__ = [
    "CONTENT_ANY",
    "CONTENT_DELETED",
    "CONTENT_TYPE",
    "TYPE_REFS",
    "Decoded",
    "MapItem",
    "check_update_counts",
    "decode_delete_set",
    "decode_state_vector",
    "decode_update",
    "encode_state_vector",
    "names_nested_parent",
    "root_kinds",
]

_MAP, _LIST, _TEXT = "map", "list", "text"

CONTENT_DELETED, CONTENT_ANY, CONTENT_TYPE = 1, 8, 7
# the nested type a ContentType item creates (Yjs type refs): Array, Map, Text; XML types
# (3, 4, 5, 6) are read by pycrdt as XML objects
TYPE_REFS = {0: "list", 1: "map", 2: "text"}

# Yjs and yrs never write a GC or skip struct of length 0; pycrdt 0.14.13 takes a GC struct of
# length 0 after a clock gap, and every later ``get_update`` of the document panics (division
# by zero). (Items of length 0 do occur: yrs writes a string item split inside a surrogate
# pair as an empty string.)
_EMPTY_STRUCT = "a GC or skip struct of length 0"

_U32 = 2**32 - 1  # yrs reads clocks and lengths as u32

_STATE_VECTOR_ENTRY_MIN = 2  # a client id and a clock take a byte each at least


# -- state vectors --------------------------------------------------------------------------


def decode_state_vector(state_vector: bytes) -> dict[int, int]:
    """A v1 state vector (``varUint(n) • n * (varUint(client) • varUint(clock))``): client ->
    the next clock expected from it.

    Raises:
        CodecError: truncated, trailing bytes, or a client listed twice.
    """
    dec = Decoder(state_vector)
    count = dec.read_var_uint()
    if count > dec.remaining // _STATE_VECTOR_ENTRY_MIN:
        raise CodecError(f"state vector claims {count} clients in {len(state_vector)} bytes")
    out: dict[int, int] = {}
    for _ in range(count):
        client = dec.read_var_uint()
        clock = dec.read_var_uint()
        if client in out:
            raise CodecError(f"state vector lists client {client} twice")
        out[client] = clock
    dec.end("state vector")
    return out


def encode_state_vector(sv: dict[int, int]) -> bytes:
    """The v1 encoding of a state vector (clients in the dict's order).

    Raises:
        CodecError: a client or clock out of ``0 .. 2**53 - 1``.
    """
    enc = Encoder()
    enc.write_var_uint(len(sv))
    for client, clock in sv.items():
        enc.write_var_uint(client)
        enc.write_var_uint(clock)
    return enc.to_bytes()


# -- checks before pycrdt sees the bytes ----------------------------------------------------


def check_update_counts(update: bytes) -> None:
    """Refuse an update whose leading counts cannot fit in its bytes, before pycrdt's decoder
    pre-allocates for them (4 bytes claiming 2**28 clients made it allocate about 500 MiB).
    Each client and each struct takes at least one byte.

    Raises:
        CodecError: a count the bytes cannot hold, or a bad varUint.
    """
    size = len(update)
    if size >= 2 and update[0] < 0x80 and update[1] < 0x80:
        # both counts fit in one byte (the usual case): the same checks, without the decoder
        if update[0] > size - 1:
            raise CodecError(f"claims {update[0]} clients in {size} bytes")
        if update[0] and update[1] > size - 2:
            raise CodecError(f"claims {update[1]} structs in {size} bytes")
        return
    clients, pos = read_var_uint_at(update, 0)
    if clients > size - pos:
        raise CodecError(f"claims {clients} clients in {size} bytes")
    if clients:
        structs, pos = read_var_uint_at(update, pos)
        if structs > size - pos:
            raise CodecError(f"claims {structs} structs in {size} bytes")


# -- delete sets ----------------------------------------------------------------------------


def decode_delete_set(data: bytes) -> list[tuple[int, int, int]]:
    """The ranges of a v1 delete set: ``(client, clock, length)``.

    Raises:
        CodecError: not a delete set.
    """
    try:
        return _delete_set(data, 0)
    except IndexError:
        raise CodecError("unexpected end of delete set") from None


def _delete_set(data: bytes, pos: int) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    b = data[pos]
    clients, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)
    for _ in range(clients):
        b = data[pos]
        client, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)
        b = data[pos]
        ranges, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)
        for _ in range(ranges):
            b = data[pos]
            clock, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)
            b = data[pos]
            length, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)
            out.append((client, clock, length))
    if pos != len(data):
        raise CodecError("bytes after the delete set")
    return out


# -- the roots an update writes to ----------------------------------------------------------


def root_kinds(update: bytes) -> dict[str, set[str]]:
    """The roots that items of the v1 ``update`` name as their parent: name -> the kinds their
    items show (``"map"``: an item with a ``parentSub``; ``"text"``: string, embed and format
    content; ``"list"``: any other live content; an empty set when they only hold deleted
    content). One pass; strings and values are skipped, not decoded.

    Raises:
        CodecError: the bytes are not a v1 update.
    """
    r = Decoder(update)
    found: dict[str, set[str]] = {}
    for _ in range(r.read_var_uint()):
        structs = r.read_var_uint()
        r.read_var_uint()  # client
        r.read_var_uint()  # clock
        for _ in range(structs):
            info = r.read_byte()
            ref = info & 0x1F
            if ref == 0 or ref == 10:  # GC, Skip
                r.read_var_uint()
                continue
            if info & 0x80:
                r.read_var_uint()
                r.read_var_uint()
            if info & 0x40:
                r.read_var_uint()
                r.read_var_uint()
            root: str | None = None
            sub = False
            if not info & 0xC0:
                if r.read_var_uint() == 1:
                    root = r.read_var_string()
                else:
                    r.read_var_uint()
                    r.read_var_uint()
                if info & 0x20:
                    r.skip_var_string()
                    sub = True
            kind: str | None
            if ref == 1:  # ContentDeleted
                r.read_var_uint()
                kind = None
            elif ref == 2:  # ContentJSON
                for _ in range(r.read_var_uint()):
                    r.skip_var_string()
                kind = _LIST
            elif ref == 3:  # ContentBinary
                r.skip_var_string()
                kind = _LIST
            elif ref == 4 or ref == 5:  # ContentString, ContentEmbed
                r.skip_var_string()
                kind = _TEXT
            elif ref == 6:  # ContentFormat
                r.skip_var_string()
                r.skip_var_string()
                kind = _TEXT
            elif ref == 7:  # ContentType
                if r.read_var_uint() in (3, 5):  # XmlElement, XmlHook: a name
                    r.skip_var_string()
                kind = _LIST
            elif ref == 8:  # ContentAny
                for _ in range(r.read_var_uint()):
                    r.skip_any()
                kind = _LIST
            elif ref == 9:  # ContentDoc
                r.skip_var_string()
                r.skip_any()
                kind = _LIST
            else:
                raise CodecError(f"unknown content ref {ref}")
            if root is not None:
                kinds = found.setdefault(root, set())
                if sub:  # a map entry, even deleted
                    kinds.add(_MAP)
                elif kind is not None:
                    kinds.add(kind)
    return found


# -- map entries: which key of which map each item writes -----------------------------------


class MapItem(NamedTuple):
    """One item of an update with a ``parentSub``: a write to one key of a map.

    ``parent`` is the root's name, or the ``(client, clock)`` of a nested type; ``key`` is the
    key. Both are None when the update does not carry them (an item with an origin inherits
    them from it: look the origin up, see :class:`~crdtstore.codec.KeyIndex`). ``content``
    is the Yjs content ref (1 deleted, 8 any, 7 a nested type, ...); ``value`` is the value as
    pycrdt shows it for ``any`` content (ints as floats, ``undefined`` as None), the type ref
    for a nested type, else None.
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
    # some item names a nested type (an item id) as its parent: pycrdt refuses such an item
    # when the id is not a shared type, after integrating the items before it
    nested: bool = False
    # every byte was read as yrs reads it (see :func:`fully_read`): only map entries with one
    # ``any`` value, strings, deletions and GC/skip structs, every clock within yrs' u32
    plain: bool = False


def decode_update(update: bytes) -> Decoded:
    """Read the map entries, the other roots touched and the delete set of a v1 update (one
    pass; the values of map entries with ``any`` content are decoded, other content skipped).

    Raises:
        CodecError: the bytes are not a v1 update this reader understands.
    """
    try:
        return _decode(update)
    except IndexError:
        raise CodecError("unexpected end of update") from None


def names_nested_parent(update: bytes) -> bool:
    """Whether some item of ``update`` names a nested type (an item id) as its parent, or the
    bytes do not decode here (then it cannot be told: True)."""
    try:
        return _decode(update).nested
    except (CodecError, IndexError):
        return True


def _decode(data: bytes) -> Decoded:
    # var-uints are read inline (most are one byte; read_var_uint_at reads the others), values
    # and strings through a Decoder at the same position
    entries: list[MapItem] = []
    others: set[str] | None = set()
    nested = False
    skipped = False  # some content was skipped, not read (see Decoded.plain)
    top = 0  # the highest clock reached
    r = Decoder(data)
    b = data[0]
    clients, pos = (b, 1) if b < 0x80 else read_var_uint_at(data, 0)
    for _ in range(clients):
        b = data[pos]
        structs, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)
        b = data[pos]
        client, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)
        b = data[pos]
        clock, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)
        for _ in range(structs):
            info = data[pos]
            pos += 1
            ref = info & 0x1F
            if ref == 0 or ref == 10:  # GC, Skip
                b = data[pos]
                n, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)
                if not n:
                    raise CodecError(_EMPTY_STRUCT)
                clock += n
                continue
            origin: tuple[int, int] | None = None
            if info & 0xC0:
                b = data[pos]
                oc, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)
                b = data[pos]
                ok, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)
                origin = (oc, ok)
                if ok > top:
                    top = ok
                if info & 0x80 and info & 0x40:  # a right origin too: only its clock checked
                    b = data[pos]
                    _, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)
                    b = data[pos]
                    rk, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)
                    if rk > top:
                        top = rk
            r.pos = pos
            parent: str | tuple[int, int] | None = None
            key: str | None = None
            if origin is None:
                if r.read_var_uint() == 1:
                    parent = r.read_var_string()
                else:
                    parent = (r.read_var_uint(), r.read_var_uint())
                    nested = True
                if info & 0x20:
                    key = r.read_var_string()
            value: Any = None
            if ref == 8:  # ContentAny
                length = r.read_var_uint()
                if info & 0x20 and length:
                    value = r.read_any()
                    if length > 1:
                        skipped = True
                        for _ in range(length - 1):
                            r.skip_any()
                else:
                    skipped = skipped or length > 0
                    for _ in range(length):
                        r.skip_any()
            elif ref == 1:  # ContentDeleted
                length = r.read_var_uint()
            elif ref == 4:  # ContentString: its length in UTF-16 code units
                raw = r.read_var_uint8array()
                if raw.isascii():  # (the usual case: one UTF-16 unit a byte)
                    length = len(raw)
                    value = raw.decode("ascii")
                else:
                    try:
                        text = raw.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise CodecError(f"bad string: {exc}") from None
                    length = len(text.encode("utf-16-le")) // 2
                    value = text
            elif ref == 2:  # ContentJSON
                skipped = True
                length = r.read_var_uint()
                for _ in range(length):
                    r.skip_var_string()
            elif ref == 3 or ref == 5:  # ContentBinary, ContentEmbed
                r.skip_var_string()
                length = 1
            elif ref == 6:  # ContentFormat
                r.skip_var_string()
                r.skip_var_string()
                length = 1
            elif ref == 7:  # ContentType
                value = r.read_var_uint()
                if value in (3, 5):  # XmlElement, XmlHook: a name
                    r.skip_var_string()
                length = 1
            elif ref == 9:  # ContentDoc
                r.skip_var_string()
                r.skip_any()
                length = 1
            else:
                raise CodecError(f"unknown content ref {ref}")
            if ref != 1 and ref != 4 and ref != 8:
                skipped = True
            pos = r.pos
            if info & 0x20:
                entries.append(MapItem(client, clock, length, origin, parent, key, ref, value))
            elif others is not None:
                if isinstance(parent, str):
                    others.add(parent)
                elif parent is None:
                    others = None  # an item next to another one: its root is not named
            clock += length
        if clock > top:
            top = clock
    deletes = _delete_set(data, pos)
    plain = not skipped and not nested and top <= _U32
    if plain:
        for _, at, length in deletes:
            if at + length > _U32:
                plain = False
                break
    return Decoded(entries, others, deletes, nested, plain)
