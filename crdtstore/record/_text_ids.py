"""The exact item id ``(client, clock)`` of a character of a text, in a few pycrdt calls.

pycrdt (0.14.13) names the character at a UTF-8 byte offset as its block's first clock plus
the byte offset into the block, where clocks count UTF-16 units: exact at a block's first
character and wherever the block is ASCII up to it, too high after a non-ASCII character of
the same block. Blocks of one client that follow each other with a clock gap equal to that
excess (a map write between two text edits after an "é") read exactly like one block, so
sticky indexes alone cannot place block starts. Here they come from the document: the
client's structs from the first clock in question on (``doc.get_update`` of a state vector
that holds every other client as it is), whose string lengths say where each block ends.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from typing import Any

from ..codec import CodecError, Decoder
from ..codec._ranges import skip_item_header
from ..codec._v1 import decode_state_vector, encode_state_vector


def item_id(root: Any, index: int) -> tuple[int, int] | None:
    """The id ``(client, clock)`` of the item at ``index`` of a list (None if pycrdt does
    not say)."""
    try:
        item = root.sticky_index(index).to_json().get("item")
    except BaseException as exc:  # a pycrdt panic is a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return None
    if not isinstance(item, dict):
        return None
    return int(item["client"]), int(item["clock"])


def utf8_offset(text: str, index: int) -> int:
    """The UTF-8 byte offset of character ``index`` of ``text``."""
    return index if text.isascii() else len(text[:index].encode("utf-8", "surrogatepass"))


def _utf8(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _utf16(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-16-le", "surrogatepass")) // 2


def char_id(root: Any, text: str, index: int) -> tuple[int, int] | None:
    """The id of character ``index`` of the text ``root`` (whose string is ``text``), None
    if pycrdt does not say. One sticky index when the text is ASCII up to ``index``; else
    a bisection for the first character of the same apparent block and a decode of that
    client's structs from there."""
    with root.doc.transaction():
        return _char_id(root, text, index)


def _char_id(root: Any, text: str, index: int) -> tuple[int, int] | None:
    got = item_id(root, utf8_offset(text, index))
    if got is None or text[:index].isascii():
        return got  # (a block's prefix up to the character is ASCII: the clock is exact)
    lo = _run_start(root, text, index, got)
    if text[lo:index].isascii():
        return got
    blocks = _blocks(root, text, got[0], lo, index + 1, got[1])
    if not blocks:  # (the bisection met a coincidence: walk back instead)
        lo = _run_start(root, text, index, got, walk=True)
        blocks = _blocks(root, text, got[0], lo, index + 1, got[1])
        if not blocks:
            return got
    at, clock, _ = blocks[-1]  # the block holding the character
    return got[0], clock + _utf16(text[at:index])


def _run_start(
    root: Any, text: str, index: int, got: tuple[int, int], *, walk: bool = False
) -> int:
    """The first character that reads as of the block of character ``index`` (id ``got``
    as pycrdt names it), bisected: a block's first character. The bisection can land too
    early where characters of other clients between two of this client's happen to make
    the clocks line up again; ``walk``: step back one character at a time instead, to the
    first that does not read as of the block (what a bisection's result failing to chain
    into blocks falls back to)."""
    client, raw = got
    pos = utf8_offset(text, index)
    if walk:
        at, back = index, 0
        while at > 0:
            back += _utf8(text[at - 1])
            if item_id(root, pos - back) != (client, raw - back):
                break
            at -= 1
        return at
    lo, hi = 0, index
    while lo < hi:
        mid = (lo + hi) // 2
        back = _utf8(text[mid:index])
        if item_id(root, pos - back) == (client, raw - back):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _blocks(
    root: Any,
    text: str,
    client: int,
    at: int,
    end: int,
    raw: int,
    known: tuple[list[int], list[int]] | None = None,
    offset: Callable[[int], int] | None = None,
) -> list[tuple[int, int, int]] | None:
    """From character ``at``, the first of a block of ``client``, each block up to character
    ``end`` as ``(first character, its clock, characters)``, hopping block by block with
    their lengths from the document (``known``: its string blocks of ``client``, read
    already) (None if it does not show that chain)."""
    offset = offset or (lambda i: utf8_offset(text, i))
    first = item_id(root, offset(at))  # a block's first character: exact
    if first is None or first[0] != client:
        return None
    clock = first[1]
    starts, lengths = known if known is not None else string_blocks(root.doc, client, clock, raw)
    out: list[tuple[int, int, int]] = []
    while at < end:
        i = bisect_right(starts, clock) - 1
        if i < 0 or starts[i] != clock:
            return None
        n = len(_take16(text, at, lengths[i]))
        if n == 0:
            return None
        out.append((at, clock, n))
        at += n
        if at < end:
            nxt = item_id(root, offset(at))
            if nxt is None or nxt[0] != client:
                return None
            clock = nxt[1]  # the next block's first character: exact
    return out


class _Offsets:
    """UTF-8 offsets of characters of one text, asked mostly in increasing order (each
    answer advances from the last one: linear over a walk of the text, not quadratic)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.ascii = text.isascii()
        self.char = self.byte = 0

    def __call__(self, index: int) -> int:
        if self.ascii:
            return index
        if index < self.char:
            self.char = self.byte = 0
        self.byte += _utf8(self.text[self.char : index])
        self.char = index
        return self.byte


def exact_runs(
    root: Any, text: str, runs: list[tuple[int, int, int]], end: int
) -> list[tuple[int, int, int]]:
    """``runs`` as :func:`~.record._item_provenance.text_runs` gives them (``(first character,
    client, clock)``, up to ``end``) with exact clocks: a run that is not ASCII is split
    into its blocks, and a first run that starts inside a block is placed in it. Each
    client's string blocks are read from the document once."""
    bounds = [r[0] for r in runs[1:]] + [end]
    todo: list[tuple[int, int, int, int, int]] = []  # (run, block start, stop, client, raw)
    span: dict[int, tuple[int, int]] = {}  # client -> (lowest, highest) clock asked
    for n, (at, client, raw) in enumerate(runs):
        stop = bounds[n]
        inside = n == 0 and at > 0  # (every other run starts where a block does)
        if client < 0 or (text[: stop - 1] if inside else text[at : stop - 1]).isascii():
            continue
        lo = _run_start(root, text, at, (client, raw)) if inside else at
        low = raw - _utf8(text[lo:at])  # (the run's clocks as pycrdt names them)
        high = raw + _utf8(text[at:stop])
        todo.append((n, lo, stop, client, raw))
        was = span.get(client)
        span[client] = (low, high) if was is None else (min(was[0], low), max(was[1], high))
    if not todo:
        return runs
    known = {c: string_blocks(root.doc, c, lo, hi) for c, (lo, hi) in span.items()}
    offset = _Offsets(text)
    out: list[tuple[int, int, int]] = []
    done = 0
    for n, lo, stop, client, raw in todo:
        out += runs[done:n]
        done = n + 1
        at = runs[n][0]
        blocks = _blocks(root, text, client, lo, stop, raw, known[client], offset)
        if blocks is None and lo < at:  # (see _run_start)
            lo = _run_start(root, text, at, (client, raw), walk=True)
            blocks = _blocks(root, text, client, lo, stop, raw, known[client], offset)
        if blocks is None:
            out.append(runs[n])
            continue
        for first, clock, count in blocks:
            if first + count <= at:
                continue
            if first < at:
                clock += _utf16(text[first:at])
                first = at
            out.append((first, client, clock))
    out += runs[done:]
    return out


def _take16(text: str, at: int, units: int) -> str:
    """The characters of ``text`` from ``at`` that make ``units`` UTF-16 units."""
    piece = text[at : at + units]
    if piece.isascii():
        return piece
    out = []
    left = units
    for ch in piece:
        if left <= 0:
            break
        out.append(ch)
        left -= 2 if ord(ch) > 0xFFFF else 1
    return "".join(out)


def string_blocks(doc: Any, client: int, lo: int, hi: int) -> tuple[list[int], list[int]]:
    """The first clock and the UTF-16 length of each live string struct of ``client`` that
    starts in ``[lo, hi]``, in clock order, read from the document's update since a state
    vector holding ``client`` at ``lo`` and every other client at its clock."""
    sv = decode_state_vector(doc.get_state())
    if sv.get(client, 0) <= lo:
        return [], []
    sv[client] = lo
    try:
        return _strings(doc.get_update(encode_state_vector(sv)), client, hi)
    except (CodecError, IndexError):
        return [], []


def _strings(update: bytes, client: int, hi: int) -> tuple[list[int], list[int]]:
    starts: list[int] = []
    lengths: list[int] = []
    r = Decoder(update)
    for _ in range(r.read_var_uint()):
        structs = r.read_var_uint()
        who = r.read_var_uint()
        clock = r.read_var_uint()
        for _ in range(structs):
            if clock > hi:
                return starts, lengths  # (past what is asked: the rest is not read)
            info = r.read_byte()
            ref = info & 0x1F
            if ref == 0 or ref == 10:  # GC, Skip
                clock += r.read_var_uint()
                continue
            skip_item_header(r, info)
            if ref == 4:  # ContentString
                n = _utf16(r.read_var_string())
                if who == client:
                    starts.append(clock)
                    lengths.append(n)
                clock += n
            else:
                clock += _skip_content(r, ref)
    return starts, lengths


def _skip_content(r: Decoder, ref: int) -> int:
    """Skip one struct's content (not a string); return its length in clock units."""
    if ref == 8:  # ContentAny
        n = r.read_var_uint()
        for _ in range(n):
            r.skip_any()
        return n
    if ref == 1:  # ContentDeleted
        return r.read_var_uint()
    if ref == 2:  # ContentJSON
        n = r.read_var_uint()
        for _ in range(n):
            r.skip_var_string()
        return n
    if ref == 3 or ref == 5:  # ContentBinary, ContentEmbed
        r.skip_var_string()
    elif ref == 6:  # ContentFormat
        r.skip_var_string()
        r.skip_var_string()
    elif ref == 7:  # ContentType
        if r.read_var_uint() in (3, 5):
            r.skip_var_string()
    elif ref == 9:  # ContentDoc
        r.skip_var_string()
        r.skip_any()
    else:
        raise CodecError(f"unknown content ref {ref}")
    return 1
