"""Blank the content of chosen items in a v1 update, keeping every clock: the rewriter behind
redaction that keeps the audit trail (``Store.redact``).

:func:`blank_items` re-encodes an update with the content of the item ids it is given
replaced by ``ContentDeleted`` of the same length (an item partly chosen is split, the way
Yjs itself splits items) and those ids added to the update's delete set. The update keeps
its clients, clocks and structure, so a replica that applied the original is unaffected by
the rewritten one and a resume from rewritten updates gives the same document with those
items deleted. Items not chosen are copied byte for byte. No I/O, no pycrdt.
"""

from __future__ import annotations

from collections.abc import Iterable

from ._lib0 import CodecError, Decoder, encode_var_uint
from ._v1 import _delete_set

__all__ = ["blank_items"]

Ranges = dict[int, list[tuple[int, int]]]  # client -> sorted, merged (start, end) clocks


def _ranges(targets: Iterable[tuple[int, int, int]]) -> Ranges:
    out: Ranges = {}
    for client, clock, length in targets:
        if length > 0:
            out.setdefault(client, []).append((clock, clock + length))
    for client, spans in out.items():
        spans.sort()
        merged: list[tuple[int, int]] = []
        for s, e in spans:
            if merged and s <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], e))
            else:
                merged.append((s, e))
        out[client] = merged
    return out


def _cuts(spans: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int, bool]]:
    """``start .. end`` cut into pieces ``(start, end, chosen)`` by ``spans``."""
    pieces: list[tuple[int, int, bool]] = []
    at = start
    for s, e in spans:
        if e <= at or s >= end:
            continue
        if s > at:
            pieces.append((at, s, False))
        pieces.append((max(s, at), min(e, end), True))
        at = min(e, end)
    if at < end:
        pieces.append((at, end, False))
    return pieces


def _units(r: Decoder, data: bytes, ref: int) -> tuple[list[bytes] | str | None, int]:
    """The content at ``r`` (reading ``data``): its splittable units (raw ``any``/JSON
    values, or the string) and length; ``None`` units for a content of length 1 (copied or
    blanked whole)."""
    if ref == 8 or ref == 2:  # ContentAny, ContentJSON
        n = r.read_var_uint()
        units: list[bytes] = []
        for _ in range(n):
            at = r.pos
            if ref == 8:
                r.skip_any()
            else:
                r.skip_var_string()
            units.append(data[at : r.pos])
        return units, n
    if ref == 4:  # ContentString: UTF-16 code units
        text = r.read_var_string()
        return text, len(text.encode("utf-16-le")) // 2
    if ref == 1:
        return None, r.read_var_uint()
    if ref == 3 or ref == 5:
        r.skip_var_string()
    elif ref == 6:
        r.skip_var_string()
        r.skip_var_string()
    elif ref == 7:
        if r.read_var_uint() in (3, 5):
            r.skip_var_string()
    elif ref == 9:
        r.skip_var_string()
        r.skip_any()
    else:
        raise CodecError(f"unknown content ref {ref}")
    return None, 1


def _uint(out: bytearray, value: int) -> None:
    out += encode_var_uint(value)


def _write_piece(
    out: bytearray, ref: int, units: list[bytes] | str | None, raw: bytes, s: int, e: int
) -> None:
    if isinstance(units, str):
        utf16 = units.encode("utf-16-le")
        piece = utf16[2 * s : 2 * e].decode("utf-16-le", "replace").encode()
        _uint(out, len(piece))
        out += piece
    elif isinstance(units, list):
        _uint(out, e - s)
        for u in units[s:e]:
            out += u
    else:
        out += raw


def blank_items(
    update: bytes, targets: Iterable[tuple[int, int, int]], texts: list[str] | None = None
) -> tuple[bytes, int]:
    """``update`` with the content of the ids ``(client, clock, length)`` of ``targets``
    that it carries replaced by ``ContentDeleted`` and added to its delete set; and how many
    ids it blanked (0: the update is returned unchanged). The strings blanked (pieces of
    ``ContentString``) are appended to ``texts`` when given.

    Raises:
        CodecError: the bytes are not a v1 update.
    """
    chosen = _ranges(targets)
    try:
        return _blank(update, chosen, [] if texts is None else texts)
    except IndexError:
        raise CodecError("unexpected end of update") from None


def _blank(data: bytes, chosen: Ranges, texts: list[str]) -> tuple[bytes, int]:
    r = Decoder(data)
    out = bytearray()
    blanked: list[tuple[int, int, int]] = []
    clients = r.read_var_uint()
    _uint(out, clients)
    for _ in range(clients):
        structs = r.read_var_uint()
        client = r.read_var_uint()
        clock = r.read_var_uint()
        first_clock = clock
        spans = chosen.get(client, [])
        body = bytearray()
        count = 0
        for _ in range(structs):
            start = r.pos
            info = r.read_byte()
            ref = info & 0x1F
            if ref == 0 or ref == 10:  # GC, Skip
                clock += r.read_var_uint()
                body.extend(data[start : r.pos])
                count += 1
                continue
            origin = right = None
            if info & 0x80:
                origin = (r.read_var_uint(), r.read_var_uint())
            if info & 0x40:
                right = (r.read_var_uint(), r.read_var_uint())
            parent_at = r.pos
            if not info & 0xC0:
                if r.read_var_uint() == 1:
                    r.skip_var_string()
                else:
                    r.read_var_uint()
                    r.read_var_uint()
                if info & 0x20:
                    r.skip_var_string()
            parent = data[parent_at : r.pos]
            content_at = r.pos
            units, length = _units(r, data, ref)
            raw = data[content_at : r.pos]
            pieces = _cuts(spans, clock, clock + length)
            if ref == 1 or not any(c for _, _, c in pieces):
                body.extend(data[start : r.pos])
                count += 1
                clock += length
                continue
            for s, e, blank in pieces:
                if s == clock:  # the item's own head: its origins and parent as they were
                    head = info & 0xE0
                    o, ro, par = origin, right, parent
                else:  # a piece split off: it follows the previous piece
                    head = 0x80 | (info & 0x40)
                    o, ro, par = (client, s - 1), right, b""
                body.append(head | (1 if blank else ref))
                if o is not None:
                    _uint(body, o[0])
                    _uint(body, o[1])
                if ro is not None and head & 0x40:
                    _uint(body, ro[0])
                    _uint(body, ro[1])
                body.extend(par)
                if blank:
                    _uint(body, e - s)
                    blanked.append((client, s, e - s))
                    if isinstance(units, str):
                        utf16 = units.encode("utf-16-le")
                        piece = utf16[2 * (s - clock) : 2 * (e - clock)]
                        texts.append(piece.decode("utf-16-le", "replace"))
                else:
                    _write_piece(body, ref, units, raw, s - clock, e - clock)
                count += 1
            clock += length
        _uint(out, count)
        _uint(out, client)
        _uint(out, first_clock)
        out += body
    deletes = _delete_set(data, r.pos)
    if not blanked:
        return data, 0
    merged = _ranges([*deletes, *blanked])
    _uint(out, len(merged))
    for client, spans in merged.items():
        _uint(out, client)
        _uint(out, len(spans))
        for s, e in spans:
            _uint(out, s)
            _uint(out, e - s)
    return bytes(out), sum(n for _, _, n in blanked)
