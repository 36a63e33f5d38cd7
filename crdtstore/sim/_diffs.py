"""Diffs between two records, or between two positions of one run's journal: what changed,
key by key and collection by collection (lists and texts by a token diff), rendered as text
and as HTML in notebooks. Takes any *source* of :mod:`crdtstore.sim._views`.
"""

from __future__ import annotations

import difflib
import html
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._render import short as _short
from ._trace import canon
from ._views import Cell, Source, cells

if TYPE_CHECKING:
    from .._store import Store


@dataclass(frozen=True)
class DiffEntry:
    """One difference between two records.

    ``op`` is ``added``, ``removed`` or ``changed`` (map keys, keep_all keys, whole
    collections when ``key`` is None) or ``inserted``, ``deleted``, ``replaced`` (list items
    and text runs, at position ``key`` of the *before* side).
    """

    collection: str
    kind: str
    op: str
    key: str | None
    before: Any = None
    after: Any = None

    def __str__(self) -> str:
        where = self.collection if self.key is None else f"{self.collection}[{self.key}]"
        if self.op in ("added", "inserted"):
            return f"+ {where}: {_short(self.after, 60)}"
        if self.op in ("removed", "deleted"):
            return f"- {where}: {_short(self.before, 60)}"
        return f"~ {where}: {_short(self.before, 60)} -> {_short(self.after, 60)}"


@dataclass(frozen=True)
class RecordDiff:
    """The differences between two records (empty, and false, when they are equal)."""

    entries: tuple[DiffEntry, ...]

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.entries) if self.entries else "(no difference)"

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        colour = {"+": "#e6ffec", "-": "#ffebe9", "~": "#fff8c5"}
        lines = [
            f'<div style="background:{colour[str(e)[0]]};font-family:monospace">'
            f"{html.escape(str(e))}</div>"
            for e in self.entries
        ]
        return "".join(lines) or "<i>(no difference)</i>"


def _shape(cs: Iterable[Cell]) -> dict[str, tuple[str, Any]]:
    """Per collection: (kind, comparable content) with ``keep_all`` siblings as sorted value
    lists (a single value when resolved)."""
    out: dict[str, tuple[str, Any]] = {}
    for c in cs:
        if c.kind == "text":
            out[c.collection] = ("text", c.value)
        elif c.kind == "list":
            out.setdefault(c.collection, ("list", []))[1].append(c.value)
        elif c.kind == "keep_all":
            _, keys = out.setdefault(c.collection, ("keep_all", {}))
            keys.setdefault(c.key, []).append(c.value)
        else:
            out.setdefault(c.collection, ("map", {}))[1][c.key] = c.value
    for _name, (kind, content) in out.items():
        if kind == "keep_all":
            for key, values in content.items():
                values.sort(key=canon)
                content[key] = values[0] if len(values) == 1 else values
    return out


_TOKEN = re.compile(r"<[^<>]*>|\w+|\s+|[^\w\s]")


def _seq_diff(name: str, kind: str, a: Any, b: Any) -> list[DiffEntry]:
    """List items, or text runs compared token by token (words, spaces, punctuation and
    ``<...>`` tokens); ``key`` is the index (the character offset for texts) in ``a``."""
    if kind == "text":
        ta: list[Any] = _TOKEN.findall(a)
        tb: list[Any] = _TOKEN.findall(b)
        ka, kb = ta, tb
        offsets = [0]
        for t in ta:
            offsets.append(offsets[-1] + len(t))
    else:
        ta, tb = list(a), list(b)
        ka, kb = [canon(v) for v in ta], [canon(v) for v in tb]
        offsets = list(range(len(ta) + 1))
    out = []
    matcher = difflib.SequenceMatcher(None, ka, kb, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        op = {"insert": "inserted", "delete": "deleted", "replace": "replaced"}[tag]
        if kind == "text":
            before: Any = "".join(ta[i1:i2]) if i2 > i1 else None
            after: Any = "".join(tb[j1:j2]) if j2 > j1 else None
        else:
            before = ta[i1:i2] if i2 > i1 else None
            after = tb[j1:j2] if j2 > j1 else None
        out.append(DiffEntry(name, kind, op, str(offsets[i1]), before, after))
    return out


def diff(
    before: Source,
    after: Source,
    *,
    agent: str | None = None,
    keep_all: Iterable[str] = (),
) -> RecordDiff:
    """What changed from ``before`` to ``after`` (any two sources: records, replicas of two
    journal positions, two agents' states of a simulation, snapshots). ``agent`` picks the
    agent of a :class:`SimResult` source; use ``result.states[name]`` with
    ``keep_all=result.config.keep_all`` to compare two agents of one simulation."""
    keep = tuple(keep_all)
    sa = _shape(cells(before, agent=agent, keep_all=keep))
    sb = _shape(cells(after, agent=agent, keep_all=keep))
    out: list[DiffEntry] = []
    for name in sorted(set(sa) | set(sb)):
        if name not in sb:
            out.append(DiffEntry(name, sa[name][0], "removed", None, sa[name][1], None))
            continue
        if name not in sa:
            out.append(DiffEntry(name, sb[name][0], "added", None, None, sb[name][1]))
            continue
        (ka, va), (kb, vb) = sa[name], sb[name]
        if ka != kb and not {ka, kb} <= {"map", "keep_all"}:
            out.append(DiffEntry(name, kb, "changed", None, va, vb))
        elif kb in ("list", "text"):
            out += _seq_diff(name, kb, va, vb)
        else:
            for key in sorted(set(va) | set(vb)):
                if key not in vb:
                    out.append(DiffEntry(name, kb, "removed", key, va[key], None))
                elif key not in va:
                    out.append(DiffEntry(name, kb, "added", key, None, vb[key]))
                elif canon(va[key]) != canon(vb[key]):
                    out.append(DiffEntry(name, kb, "changed", key, va[key], vb[key]))
    return RecordDiff(tuple(out))


async def journal_diff(
    store: Store, run: str, before: int, after: int | None = None, *, keep_all: Iterable[str] = ()
) -> RecordDiff:
    """What the journal of ``run`` changed between positions ``before`` and ``after``
    (inclusive; None: the head), by replaying both (:meth:`Store.replay`)."""
    keep = tuple(keep_all)
    old = await store.replay(run, until=before)
    new = await store.replay(run, until=after)
    return diff(old, new, keep_all=keep)
