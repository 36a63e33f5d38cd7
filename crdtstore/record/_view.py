"""Slices: the part of a record one step needs, and a handle that cannot reach past it.

A path is ``"collection"`` (all of it), ``"collection/key"`` (one map key) or
``"collection/prefix*"`` (map keys starting with ``prefix``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .._errors import PolicyViolation
from .._models import Conflict
from .._names import check_name
from ._collections import ListCollection, TextCollection
from ._maps import MapCollection

if TYPE_CHECKING:
    from ._record import Record


class _Rule:
    __slots__ = ("exact", "prefixes", "whole")

    def __init__(self) -> None:
        self.whole = False
        self.exact: set[str] = set()
        self.prefixes: list[str] = []

    def allows(self, key: str) -> bool:
        return self.whole or key in self.exact or any(key.startswith(p) for p in self.prefixes)


class View:
    """A slice of a record (see :meth:`Record.view`)."""

    def __init__(self, rec: Record, paths: Iterable[str]) -> None:
        self._rec = rec
        self._rules: dict[str, _Rule] = {}
        self._patterns: set[str] = set()
        for path in paths:
            if not isinstance(path, str):
                raise PolicyViolation("scope", rec.agent, str(path), None, "a path is a string")
            name, sep, key = path.partition("/")
            check_name("collection", name)
            rule = self._rules.setdefault(name, _Rule())
            self._patterns.add(path)
            if not sep:
                rule.whole = True
            elif key.endswith("*"):
                rule.prefixes.append(key[:-1])
            else:
                rule.exact.add(key)

    def allows(self, collection: str, key: str | None = None) -> bool:
        """Whether the view covers ``collection`` (all of it when ``key`` is None) or a key."""
        rule = self._rules.get(collection)
        if rule is None:
            return False
        return rule.whole if key is None else rule.allows(key)

    def covers(self, collection: str) -> bool:
        """Whether the view reaches into ``collection`` at all (all of it or some keys)."""
        return collection in self._rules

    @property
    def patterns(self) -> list[str]:
        """The view's paths, as given (sorted)."""
        return sorted(self._patterns)

    def _refuse(self, collection: str, key: str | None) -> PolicyViolation:
        return PolicyViolation("scope", self._rec.agent, collection, key, "outside this view")

    def data(self) -> dict[str, Any]:
        """The slice as JSON-able data; map entries carry their provenance."""
        out: dict[str, Any] = {}
        kinds = self._rec.collections()
        for name, rule in self._rules.items():
            kind = kinds.get(name)
            if kind is None:
                continue
            if kind == "counter":
                if rule.whole:
                    out[name] = self._rec.counter(name).value
                continue
            if kind != "map":
                if rule.whole:
                    out[name] = self._rec.replica.read(name, kind)
                continue
            m = self._rec.map(name)
            entries = {}
            for key, value in m.items():
                if not rule.allows(key):
                    continue
                prov = m.provenance(key)
                if isinstance(value, Conflict):
                    value = value.to_json()
                elif hasattr(value, "model_dump"):
                    value = value.model_dump(mode="json")
                entries[key] = {
                    "value": value,
                    "provenance": prov.model_dump(mode="json") if prov else None,
                }
            out[name] = entries
        return out

    def map(self, name: str) -> ScopedMap:
        """The map ``name`` restricted to this view's keys. Raises ``PolicyViolation``."""
        if name not in self._rules:
            raise self._refuse(name, None)
        return ScopedMap(self, self._rec.map(name))

    def list(self, name: str) -> ListCollection:
        """The whole list ``name`` if the view covers it. Raises ``PolicyViolation``."""
        if not self.allows(name):
            raise self._refuse(name, None)
        return self._rec.list(name)

    def text(self, name: str) -> TextCollection:
        """The whole text ``name`` if the view covers it. Raises ``PolicyViolation``."""
        if not self.allows(name):
            raise self._refuse(name, None)
        return self._rec.text(name)


class ScopedMap:
    """A map handle that refuses every key outside its view."""

    def __init__(self, view: View, inner: MapCollection) -> None:
        self._view = view
        self._inner = inner
        self.name = inner.name

    def _check(self, key: str) -> None:
        if not self._view.allows(self.name, key):
            raise self._view._refuse(self.name, key)

    def get(self, key: str, default: Any = None) -> Any:
        self._check(key)
        return self._inner.get(key, default)

    def __getitem__(self, key: str) -> Any:
        self._check(key)
        return self._inner[key]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._view.allows(self.name, key) and key in self._inner

    def keys(self) -> list[str]:
        return [k for k in list(self._inner) if self._view.allows(self.name, k)]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self._inner.get(k)) for k in self.keys()]

    def get_versioned(self, key: str) -> tuple[Any, int | None]:
        self._check(key)
        return self._inner.get_versioned(key)

    async def set(self, key: str, value: Any, **options: Any) -> None:
        """As :meth:`MapCollection.set`, for keys inside the view only."""
        self._check(key)
        await self._inner.set(key, value, **options)

    async def patch(self, key: str, fields: Any, **options: Any) -> None:
        """As :meth:`MapCollection.patch` (``merge="fields"`` maps), inside the view only."""
        self._check(key)
        await self._inner.patch(key, fields, **options)

    async def delete(self, key: str, **options: Any) -> bool:
        """As :meth:`MapCollection.delete`, for keys inside the view only."""
        self._check(key)
        return await self._inner.delete(key, **options)
