"""Which item ids an update carries: per client, the clock ranges of its structs. No pycrdt.

The item provenance index (``crdtstore.record._item_provenance``) maps these ranges to the
journal entry that brought them, so "who wrote this list item / this span of text" is
answered per item. :func:`first_clock` reads only the header (a local transaction's update
holds one client's structs, contiguous); :func:`struct_ranges` walks every struct (the
content is skipped, not decoded), leaving out the gaps a merged update marks with ``Skip``.
"""

from __future__ import annotations

from ._lib0 import CodecError, Decoder, read_var_uint_at

__all__ = ["first_clock", "struct_ranges"]


def skip_item_header(r: Decoder, info: int) -> None:
    """Read past an item struct's origins and, when it names one, its parent and parent
    sub (the item's content follows)."""
    if info & 0x80:  # origin
        r.read_var_uint()
        r.read_var_uint()
    if info & 0x40:  # right origin
        r.read_var_uint()
        r.read_var_uint()
    if not info & 0xC0:  # the parent is written
        if r.read_var_uint() == 1:
            r.skip_var_string()
        else:
            r.read_var_uint()
            r.read_var_uint()
        if info & 0x20:
            r.skip_var_string()


def first_clock(update: bytes) -> tuple[int, int] | None:
    """``(client, clock)`` of an update holding the structs of exactly one client (None for
    none or several, or bytes too short to say). Reads four var-uints, inline (the write
    hot path)."""
    try:
        if update[0] != 1:  # one client (a count >= 128 is not one either)
            return None
        b = update[1]
        structs, pos = (b, 2) if b < 0x80 else read_var_uint_at(update, 1)
        if structs == 0:
            return None
        b = update[pos]
        client, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(update, pos)
        b = update[pos]
        clock = b if b < 0x80 else read_var_uint_at(update, pos)[0]
        return client, clock
    except (CodecError, IndexError):
        return None


def struct_ranges(update: bytes) -> list[tuple[int, int, int]]:
    """``(client, start, end)`` of every run of structs the update carries (``end``
    exclusive; clocks count items, and UTF-16 code units of strings).

    Raises:
        CodecError: the bytes are not a v1 update this reader understands.
    """
    try:
        return _ranges(update)
    except IndexError:
        raise CodecError("unexpected end of update") from None


def _ranges(data: bytes) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    r = Decoder(data)
    for _ in range(r.read_var_uint()):
        structs = r.read_var_uint()
        client = r.read_var_uint()
        clock = start = r.read_var_uint()
        for _ in range(structs):
            info = r.read_byte()
            ref = info & 0x1F
            if ref == 0 or ref == 10:  # GC, Skip
                n = r.read_var_uint()
                if ref == 10:  # a gap: what lies before it is one run
                    if clock > start:
                        out.append((client, start, clock))
                    start = clock + n
                clock += n
                continue
            skip_item_header(r, info)
            clock += _content_length(r, ref)
        if clock > start:
            out.append((client, start, clock))
    return out


def _content_length(r: Decoder, ref: int) -> int:
    """Skip one struct's content; return its length in clock units."""
    if ref == 8:  # ContentAny
        n = r.read_var_uint()
        for _ in range(n):
            r.skip_any()
        return n
    if ref == 1:  # ContentDeleted
        return r.read_var_uint()
    if ref == 4:  # ContentString: UTF-16 code units
        raw = r.read_var_uint8array()
        if raw.isascii():
            return len(raw)
        try:
            return len(raw.decode("utf-8").encode("utf-16-le")) // 2
        except UnicodeDecodeError as exc:
            raise CodecError(f"bad string: {exc}") from None
    if ref == 2:  # ContentJSON
        n = r.read_var_uint()
        for _ in range(n):
            r.skip_var_string()
        return n
    if ref == 3 or ref == 5:  # ContentBinary, ContentEmbed
        r.skip_var_string()
        return 1
    if ref == 6:  # ContentFormat
        r.skip_var_string()
        r.skip_var_string()
        return 1
    if ref == 7:  # ContentType
        if r.read_var_uint() in (3, 5):  # XmlElement, XmlHook: a name
            r.skip_var_string()
        return 1
    if ref == 9:  # ContentDoc
        r.skip_var_string()
        r.skip_any()
        return 1
    raise CodecError(f"unknown content ref {ref}")
