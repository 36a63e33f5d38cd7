"""Redaction that keeps the audit trail: remove one value (a map key, a map field, a list
item or a text span) from the live record, the journal and the snapshots, while every
journal entry stays, with its agent, source and time.

How (``Store.redact``):

1. the value is deleted through a record (a normal write: other processes holding the
   record apply the delete, and pycrdt's garbage collection drops the deleted content
   from their memory);
2. the ids of the items that ever held it are found (map keys: the codec's
   :class:`~crdtstore.codec.KeyIndex` over the snapshot and the journal; list items and
   text characters: their ids in the live document), and each journal entry that carried
   them is re-encoded with that content blanked (:func:`crdtstore.codec.blank_items`:
   same clocks, ``ContentDeleted``), its effect's value replaced by the marker
   ``{"$redacted": {"reason", "agent", "wall_time"}}``, and its checksum recomputed,
   in place (``JournalBackend.rewrite_entries``);
3. a ``redact`` entry is appended (``[kind, collection, "redact", key-or-index, reason]``)
   and the journal compacted into a fresh snapshot, built without the value; SQLite then
   checkpoints its WAL (``secure_delete`` zeroed the old pages).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ._errors import InvalidValue
from ._journal import Row, checksum
from .codec import KeyIndex, blank_items, decode_update

if TYPE_CHECKING:
    from .record._record import Record

MARKER = "$redacted"
REDACTION_ITEMS = "__crdtstore_redaction"
"""The collection of the work items whose leases are runs' redaction leases: one
redaction of a run at a time (see ``Store.redact``)."""
FIELD_SEP = "\x1e"  # a map field's physical key: entry + FIELD_SEP + field


def is_marker(value: Any) -> bool:
    """Whether ``value`` (an effect's value) is a redaction marker."""
    return type(value) is dict and len(value) == 1 and MARKER in value


def marker(agent: str, reason: str, wall_time: float) -> dict[str, Any]:
    return {MARKER: {"reason": reason, "agent": agent, "wall_time": wall_time}}


Target = tuple[int, int, int]  # (client, clock, length)


def _deleted(updates: list[bytes]) -> list[Target]:
    return [d for u in updates for d in decode_update(u).deletes]


async def delete_live(
    rec: Record, kind: str, collection: str, key: str | None, index: int | None, span: Any
) -> tuple[list[Target], Any]:
    """Delete the value through ``rec``; return the ids its deletion names (the delete sets
    of the transactions meanwhile: an id of content deleted by another writer at the same
    moment is blanked too, which changes no document) for a list item or a text span (none
    for a map key: those are found in the journal), and the value deleted (None if absent).
    """
    if kind == "map":
        assert key is not None
        m = rec.map(collection)
        entry, sep, field = key.partition(FIELD_SEP)
        spec = rec.spec(collection)
        if sep and spec is not None and spec.merge == "fields":
            # a field of a merge="fields" map: the map shows entries, not physical keys
            current = m.get(entry)
            if not (isinstance(current, dict) and field in current):
                return [], None
            await m.patch(entry, {}, remove=[field])
            return [], current[field]
        value = m.get(key)
        if key in m:
            await m.delete(key)
        return [], value
    updates: list[bytes] = []
    doc = rec.replica.doc
    sub = doc.observe(lambda event: updates.append(event.update))
    try:
        if kind == "list":
            assert index is not None
            lst = rec.list(collection)
            value = lst[index]  # IndexError when out of range
            await lst.delete(index)
        else:
            txt = rec.text(collection)
            start, end = span
            current = txt.read()
            if not 0 <= start < end <= len(current):
                raise IndexError(f"span {span!r} out of range for a text of {len(current)}")
            value = current[start:end]
            await txt.delete(start, end - start)
    finally:
        doc.unobserve(sub)
    return _deleted(updates), value


def map_targets(index: KeyIndex, update: bytes, collection: str, key: str) -> list[Target]:
    """Index the map entries of ``update``; return those that write ``collection[key]``."""
    decoded = decode_update(update)
    refs, _ = index.index(decoded)
    return [
        (item.client, item.clock, item.length)
        for item, ref in zip(decoded.entries, refs, strict=True)
        if ref == (collection, key) and item.content != 1
    ]


def redact_effect(
    effect: list[Any],
    kind: str,
    collection: str,
    key: str | None,
    value: Any,
    mark: dict[str, Any],
    touched: bool,
) -> list[Any]:
    """``effect`` with the redacted value replaced by ``mark``: a map op of the key; in an
    entry whose update carried the value (``touched``), list values equal to it and text
    inserts holding one of the strings of ``value`` (for text: the span and the pieces the
    entry carried, longest first; their characters become U+2588 and the marker is added as
    the op's sixth element)."""
    out: list[Any] = []
    for op in effect:
        if op[0] == "map" and kind == "map" and op[1] == collection and op[2] == "set":
            if op[3] == key:
                op = [*op[:4], mark]
        elif touched and op[0] == kind and op[1] == collection and op[2] == "ins":
            if kind == "list":
                op = [*op[:4], [mark if v == value else v for v in op[4]]]
            elif isinstance(op[4], str) and any(piece in op[4] for piece in value):
                text = op[4]
                for piece in value:  # the longest first
                    text = text.replace(piece, "\u2588" * len(piece))
                op = [*op[:4], text, mark]
        out.append(op)
    return out


def rewrite_rows(
    rows: list[Row],
    index: KeyIndex,
    kind: str,
    collection: str,
    key: str | None,
    ids: list[Target],
    value: Any,
    mark: dict[str, Any],
) -> list[Row]:
    """The rows of ``rows`` that held the value, rewritten (see the module docstring)."""
    out: list[Row] = []
    for row in rows:
        if kind == "map":
            assert key is not None
            targets = map_targets(index, row.update, collection, key) if row.update else []
        else:
            targets = ids
        texts: list[str] = []
        update, blanked = blank_items(row.update, targets, texts) if targets else (row.update, 0)
        # (a text span typed in pieces: each entry's effect loses the pieces it carried)
        found = sorted({t for t in [value, *texts] if isinstance(t, str) and t}, key=len)
        effect = redact_effect(
            row.effect,
            kind,
            collection,
            key,
            found[::-1] if kind == "text" else value,
            mark,
            blanked > 0,
        )
        # (ops compared as lists: a backend may hold them as tuples, memory:// does)
        if blanked or [list(op) for op in effect] != [list(op) for op in row.effect]:
            out.append(row._replace(update=update, effect=effect, checksum=checksum(update)))
    return out


def check_target(
    key: str | None, field: str | None, index: int | None, span: Any
) -> tuple[str, str | None]:
    """The kind of collection a redaction names and the physical map key (None for lists
    and text).

    Raises:
        InvalidValue: not exactly one of a key (with an optional field), ``index`` or
        ``span``; a field without a key; a bad index or span.
    """
    given = [x is not None for x in (key, index, span)]
    if sum(given) != 1:
        raise InvalidValue("redact takes one of a key (with an optional field), index= or span=")
    if field is not None and key is None:
        raise InvalidValue("redact: field= needs the map entry's key")
    if key is not None:
        if field is not None and (type(field) is not str or not field):
            raise InvalidValue(f"field must be a non-empty string, not {field!r}")
        return "map", key if field is None else key + FIELD_SEP + field
    if index is not None:
        if type(index) is not int:
            raise InvalidValue(f"index must be an int, not {type(index).__name__}")
        return "list", None
    if (
        not isinstance(span, tuple | list)
        or len(span) != 2
        or not all(type(x) is int for x in span)
        or not 0 <= span[0] < span[1]
    ):
        raise InvalidValue(f"span must be (start, end) with 0 <= start < end, not {span!r}")
    return "text", None


def now() -> float:
    return time.time()
