"""The history of one map key: the journal entries that wrote it, as :class:`HistoryEntry`
values, oldest first (``Store.history``).

A key can have tens of thousands of journaled writes, so this path reads little and builds
cheaply: the backend returns the entries without their update bytes and with numbers already
normalised (``JournalBackend.history_rows``), and the frozen models are built without
validation, as pydantic's ``model_construct`` builds them but without its per-call work
(aliases, defaults): every field comes from the journal's own columns, already of its type.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

from ._gc_pause import collector_paused
from ._journal import HistoryRow
from ._models import HistoryEntry, Provenance
from ._store_redact import MARKER

M = TypeVar("M", bound=BaseModel)

_new = object.__new__
_put = object.__setattr__


_FIELDS = {cls: set(cls.model_fields) for cls in (Provenance, HistoryEntry)}
# the setters of BaseModel's three slots (a member descriptor each)
_SLOTS = tuple(
    BaseModel.__dict__[name].__set__
    for name in ("__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")
)


def built(cls: type[M], fields: dict[str, Any]) -> M:
    """An instance of ``cls`` holding ``fields`` (every field of it, each already valid),
    made without validation; equal to ``cls(**fields)``."""
    model = _new(cls)
    _put(model, "__dict__", fields)
    _put(model, "__pydantic_fields_set__", set(fields))
    _put(model, "__pydantic_extra__", None)
    _put(model, "__pydantic_private__", None)
    return model


def with_value(entry: HistoryEntry, value: Any) -> HistoryEntry:
    """``entry`` with another ``value`` (``model_copy(update=...)`` without its copies)."""
    return built(HistoryEntry, {**entry.__dict__, "value": value})


def redaction_rows(
    notes: Iterable[Mapping[str, Any]], run: str, collection: str, key: str, seen: set[int]
) -> list[HistoryRow]:
    """The redactions of ``collection[key]`` noted in the run's config whose ``redact``
    entry is not in the journal any more (compacted away): each as the entry it was."""
    return [
        HistoryRow(
            note["seq"],
            note["agent"],
            "system",
            note["wall_time"],
            "" if note["run"] == run else note["run"],
            "",
            [["map", collection, "redact", key, note.get("reason", "")]],
        )
        for note in notes
        if note.get("kind", "map") == "map"
        and note["collection"] == collection
        and note["key"] == key
        and note["seq"] not in seen
    ]


def entries(run: str, collection: str, key: str, rows: Iterable[HistoryRow]) -> list[HistoryEntry]:
    """One :class:`HistoryEntry` per op of ``rows`` that writes ``collection[key]``, in the
    order of ``rows``. A ``del`` or ``redact`` op is a deletion; a ``set`` whose value was
    redacted since (a redaction marker) keeps the write, not its value."""
    rows = rows if isinstance(rows, list) else list(rows)
    if len(rows) < _PAUSE_FROM:
        return _entries(run, collection, key, rows)
    # two models per write, none in a reference cycle: see crdtstore._gc_pause
    with collector_paused():
        return _entries(run, collection, key, rows)


_PAUSE_FROM = 1000  # rows: below this the collector costs less than its pause is worth


def _entries(run: str, collection: str, key: str, rows: list[HistoryRow]) -> list[HistoryEntry]:
    out: list[HistoryEntry] = []
    append = out.append
    # built() inlined, with the slots set through their descriptors (one C call each), and
    # one fields set shared by all (a frozen model never changes its own; model_copy copies
    # it first): the loop runs once per journaled write
    new, put = _new, _put
    prov_cls, entry_cls = Provenance, HistoryEntry
    set_fields, set_extra, set_private = _SLOTS
    prov_set, entry_set = _FIELDS[Provenance], _FIELDS[HistoryEntry]
    marker = MARKER
    for seq, agent, source, wall_time, origin, call, ops in rows:
        prov = None
        for op in ops:
            if op[3] != key or op[1] != collection or op[0] != "map":
                continue
            if prov is None:
                prov = new(prov_cls)
                put(
                    prov,
                    "__dict__",
                    {
                        "run": origin or run,
                        "agent": agent,
                        "source": source,
                        "wall_time": wall_time,
                        "seq": seq,
                        "call": call or None,
                    },
                )
                set_fields(prov, prov_set)
                set_extra(prov, None)
                set_private(prov, None)
            entry = new(entry_cls)
            if op[2] == "set":
                value = op[4]
                if type(value) is dict and len(value) == 1 and marker in value:
                    put(
                        entry,
                        "__dict__",
                        {"value": None, "deleted": False, "provenance": prov, "redacted": True},
                    )
                else:
                    put(
                        entry,
                        "__dict__",
                        {"value": value, "deleted": False, "provenance": prov, "redacted": False},
                    )
            else:  # "del", or "redact" (the value is gone)
                redacted = op[2] == "redact"
                put(
                    entry,
                    "__dict__",
                    {"value": None, "deleted": True, "provenance": prov, "redacted": redacted},
                )
            set_fields(entry, entry_set)
            set_extra(entry, None)
            set_private(entry, None)
            append(entry)
    return out
