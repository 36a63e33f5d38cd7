"""Frozen values that the public API returns."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Provenance(BaseModel):
    """Who wrote a value, as what, when, and where it sits in the journal.

    ``seq`` is None while the write is not yet in the journal (a batched write before flush).
    ``call`` is the tool-call id the write was made for (``Record.attributed``), as the
    journal holds it: ``history`` sets it (None when the entry has none); the live
    provenance index (``Record.provenance``) does not keep call ids, so it is None there.
    """

    model_config = ConfigDict(frozen=True)

    run: str
    agent: str
    source: str
    wall_time: float
    seq: int | None
    call: str | None = None


class Span(BaseModel):
    """A span of a text written by one journal entry (``TextCollection.authorship``).

    ``start`` and ``end`` are character indices of the text as it reads now (``end``
    exclusive), ``text`` the characters; ``provenance`` the entry that wrote them (None for
    characters applied without provenance).
    """

    model_config = ConfigDict(frozen=True)

    start: int
    end: int
    text: str
    provenance: Provenance | None


class HistoryEntry(BaseModel):
    """One write to a map key, read from the journal."""

    model_config = ConfigDict(frozen=True)

    value: Any
    deleted: bool
    provenance: Provenance
    redacted: bool = False


class Change(BaseModel):
    """What one transaction changed in one collection.

    ``keys`` names the map keys written (maps only); ``ops`` is that part of the entry's
    effect. ``local`` is True for writes made through this record.
    """

    model_config = ConfigDict(frozen=True)

    collection: str
    kind: str
    keys: tuple[str, ...]
    agent: str
    source: str
    seq: int | None
    local: bool
    ops: tuple[tuple[Any, ...], ...]


class Sibling(BaseModel):
    """One of the concurrent values of a ``keep_all`` key."""

    model_config = ConfigDict(frozen=True)

    value: Any
    agent: str
    source: str
    wall_time: float
    token: str


class Conflict(BaseModel):
    """What reading a ``keep_all`` key returns while concurrent writes are unresolved.

    Every sibling is kept, with its provenance, until a write that has seen them all (any
    ``set`` or ``delete`` of the key made after they arrived) resolves them.
    """

    model_config = ConfigDict(frozen=True)

    key: str
    siblings: tuple[Sibling, ...]

    @property
    def values(self) -> list[Any]:
        return [s.value for s in self.siblings]

    def to_json(self) -> dict[str, Any]:
        return {"__conflict__": [s.model_dump(mode="json") for s in self.siblings]}


class Version(BaseModel):
    """A point in a record's history, for staleness checks.

    ``scope`` is ``"*"`` for the whole record or a collection name; ``seq`` is the journal
    position of the last entry that touched that scope when the version was taken.
    """

    model_config = ConfigDict(frozen=True)

    scope: str
    seq: int
