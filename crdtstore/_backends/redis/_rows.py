"""Journal entries as the stream holds them: the fields an append writes (:func:`entry_args`,
the append script's arguments) and the :class:`~crdtstore._journal.Row` a stream entry reads
back as (:func:`row_of`), shared by the journal, its guarded appends and its stream read; and
the :class:`~crdtstore._journal.RunRow` of a run's hash (:func:`run_row`); the first position
an append script answers, or its refusal (:func:`first_appended`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from ..._errors import BackendError, RunClosed, UnknownRun
from ..._journal import NewEntry, Row, RunRow

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


# the fields of an entry in the order lua/append.lua writes them (then "x", the index keys)
_ORDER = [b"a", b"s", b"c", b"w", b"u", b"e", b"k", b"o", b"l"]
_decode = json.JSONDecoder().decode
_new = tuple.__new__
_intern = sys.intern


def row_of(entry: Any) -> Row:
    """A journal row from a stream entry ``[id, [field, value, ...]]`` (or ``(id, {field:
    value})``). An entry that is not one crdtstore wrote (a field missing or malformed) comes
    back empty with a checksum that cannot match, so the reader skips and reports it as it
    does a torn entry."""
    sid, fields = entry[0], entry[1]
    seq = int(sid.split(b"-", 1)[0])
    try:
        if type(fields) is list and fields[0:18:2] == _ORDER:  # as the append wrote it
            effect = fields[11]
            return _new(
                Row,
                (
                    seq,
                    _intern(fields[1].decode()),
                    _intern(fields[3].decode()),
                    int(fields[5]),
                    float(fields[7]),
                    fields[9],
                    _decode(effect.decode()) if effect else [],
                    int(fields[13]),
                    _intern(fields[15].decode()),
                    fields[17].decode(),
                ),
            )
        # (a dict: XREAD through redis-py's reply parser)
        f = (
            fields
            if isinstance(fields, dict)
            else dict(zip(fields[::2], fields[1::2], strict=False))
        )
        effect = f[b"e"]
        return Row(
            seq,
            _intern(f[b"a"].decode()),
            _intern(f[b"s"].decode()),
            int(f[b"c"]),
            float(f[b"w"]),
            f[b"u"],
            json.loads(effect) if effect else [],
            int(f[b"k"]),
            _intern(f[b"o"].decode()),
            f[b"l"].decode(),
        )
    except (KeyError, ValueError, UnicodeDecodeError):
        return Row(seq, "", "system", 0, 0.0, b"", [], -1)


def client_of(entry: Any) -> int | None:
    """The client id of a stream entry, without reading the rest (None: not readable)."""
    fields = entry[1]
    try:
        if type(fields) is list and fields[4] == b"c":
            return int(fields[5])
        return row_of(entry).client_id
    except (IndexError, ValueError):
        return None


def same_entry(row: Row, entry: Any) -> bool:
    """Whether stream entry ``entry`` is ``row`` (its client id and checksum: the copy an
    append of this store kept), without reading the rest."""
    fields = entry[1]
    try:
        return (
            type(fields) is list
            and fields[4] == b"c"
            and fields[12] == b"k"
            and int(fields[5]) == row.client_id
            and int(fields[13]) == row.checksum
        )
    except (IndexError, ValueError):
        return False


def may_redact(entry: Any) -> bool:
    """Whether a stream entry may hold a redaction (its effect names one; a key named
    ``redact`` also answers True)."""
    fields = entry[1]
    if type(fields) is list and fields[10:11] == [b"e"]:
        effect = fields[11]
        return isinstance(effect, bytes) and b'"redact"' in effect
    return True


def entry_args(entries: Sequence[NewEntry]) -> list[Any]:
    args: list[Any] = []
    for e in entries:
        prefixes = list(
            dict.fromkeys(f"{op[1]}\x00{op[3]}\x00" for op in e.effect if op[0] == "map")
        )
        args += [
            e.agent, e.source, e.client_id, repr(float(e.wall_time)), e.update,
            _dumps(e.effect), e.checksum, e.origin, e.call, len(prefixes), *prefixes,
        ]  # fmt: skip
    return args


def _text(raw: bytes | None) -> str:
    return "" if raw is None else raw.decode()


def run_row(tenant: str, run: str, v: Sequence[Any]) -> RunRow:
    """A run from its fields in the run's hash (created, head, snap, parent, state,
    delete_after)."""
    return RunRow(
        tenant,
        run,
        float(v[0]),
        int(v[1]),
        int(v[2]),
        _text(v[3]) or None,
        _text(v[4]) or "open",
        float(v[5]) if v[5] else None,
    )


def first_appended(tenant: str, run: str, got: Sequence[bytes], lock_ttl: float) -> int:
    """The first position of an append script's answer (or its refusal, raised)."""
    kind = got[0]
    if kind == b"ok":
        return int(got[1])
    if kind == b"unknown":
        raise UnknownRun(tenant, run)
    if kind == b"closed":
        raise RunClosed(tenant, run, got[1].decode())
    if kind == b"lost":
        raise BackendError(
            "redis",
            f"the authority of run {run!r} lost its lock (silent for more than "
            f"{lock_ttl:g} s); nothing of it was written",
        )
    if kind == b"moved":
        raise BackendError("redis", f"the journal of run {run!r} moved under its authority")
    raise BackendError("redis", f"append: unexpected answer {got!r}")
