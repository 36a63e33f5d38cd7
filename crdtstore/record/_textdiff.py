"""The text diff: the character edits that turn one text into another.

A text collection is changed by edits, never by a whole rewrite (the ``rewrite-drop`` failure
mode): :func:`text_diff` finds them, :func:`apply_text_edits` applies them to a pycrdt
``Text``. Pure functions; no document state.
"""

from __future__ import annotations

import difflib
from typing import Any

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
