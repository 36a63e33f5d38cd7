"""Map collections: last writer wins per key (:class:`MapCollection`), or every concurrent
value kept as a sibling until a later write resolves them (:class:`KeepAllMap`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from .._errors import InvalidValue
from .._journal import Op
from .._model_plan import ModelPlan
from .._models import Conflict, Sibling, Version
from .._names import MAX_KEY_LENGTH, check_key
from .._values import MAX_SAFE_INT, to_stored
from ._collections import _MISSING, CollectionHost, _Collection
from ._document import ReplicaDocument
from ._pycrdt import DirectRead

if TYPE_CHECKING:
    from .._leases import Lease
    from .._models import HistoryEntry, Provenance


class MapCollection(_Collection):
    """A map of string keys to JSON-like values (last writer wins per key)."""

    kind = "map"

    # -- reads --

    def get(self, key: str, default: Any = None) -> Any:
        """The value at ``key``, or ``default``."""
        value = self._read(key)
        return default if value is _MISSING else self._out(value)

    def _read(self, key: str) -> Any:
        """``self._root.get(key, _MISSING)``, in one yrs transaction (``DirectRead``)."""
        direct = self.__dict__.get("_direct")
        if direct is None or direct.root is not self._root:  # (kept per root)
            direct = self.__dict__["_direct"] = DirectRead(self._root)
        return direct.get(key, _MISSING)

    def __getitem__(self, key: str) -> Any:
        value = self._read(key)
        if value is _MISSING:
            raise KeyError(key)
        return self._out(value)

    def __contains__(self, key: object) -> bool:
        return key in self._root

    def __len__(self) -> int:
        return len(self._root)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._root.keys()))

    def keys(self) -> list[str]:
        return list(self._root.keys())

    def values(self) -> list[Any]:
        return [self._out(v) for v in self._root.values()]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self._out(v)) for k, v in self._root.items()]

    def current_version(self) -> Version:
        """This collection's version now (see :meth:`Record.current_version`)."""
        return self._rec.current_version(self.name)

    def get_versioned(self, key: str) -> tuple[Any, int | None]:
        """``(value, version)`` of ``key``: the version is the journal position of the write
        that made the current value, 0 if it was never written, None while that write is not
        yet journaled (flush first). Pass it as ``expected_version`` to a guarded write."""
        return self.get(key), self._rec.version(self.name, key)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.items())

    def provenance(self, key: str) -> Provenance | None:
        """Agent, source kind, time and journal position of the current value at ``key``."""
        return self._rec.provenance(self.name, key)

    async def history(self, key: str) -> list[HistoryEntry]:
        """Every journaled write to ``key``, overwritten ones included, oldest first."""
        return await self._rec.history(self.name, key)

    # -- writes --

    async def set(
        self,
        key: str,
        value: Any,
        *,
        expected_version: int | None = None,
        based_on: Version | None = None,
        lease: Lease | None = None,
        resource: str | None = None,
    ) -> None:
        """Set ``key`` to ``value``.

        Args:
            expected_version: make it a guarded write: it succeeds only if ``key`` is still at
                this version (see :meth:`get_versioned`; 0 = never written) at the store's
                authority, and returns once journaled.
            based_on: a :class:`Version` of the record or a collection that this write was
                decided on (``rec.current_version(...)``): refused with ``StaleVersion`` if
                that scope has changed since, checked at the store's authority.
            lease: a fenced write: checked in the same transaction as the write that the
                lease is still granted, covers ``resource`` (default: ``key`` as a repo path,
                else ``item:<collection>/<key>``) and holds the newest token.

        Raises:
            InvalidName: ``key`` is not a non-empty string of at most 1024 characters.
            InvalidValue: ``value`` is not JSON-like (see ``crdtstore._values``).
            SchemaInvalid: ``value`` fails the collection's model.
            PolicyViolation: the collection's write policy refuses it.
            BudgetExceeded: it would take the collection past a budget.
            StaleVersion: (guarded) the version moved; carries the current version and value.
            LeaseLost: (fenced) the lease is gone, superseded or does not cover the key.
        """
        if (
            type(key) is not str
            or not key
            or len(key) > MAX_KEY_LENGTH
            or "\x00" in key
            or not key.isascii()
        ):
            check_key(key)  # (what it checks, inlined for a usual key: the hot path)
        rec = self._rec
        name = self.name
        # (what _in does, inlined)
        model = self._model or rec._models.get(name)
        size = -1
        if model is None:
            t = type(value)
            if (t is str and value.isascii()) or (
                t is int and -MAX_SAFE_INT <= value <= MAX_SAFE_INT
            ):
                stored = value  # (what to_stored checks of a usual scalar, inlined)
            else:
                stored = to_stored(value)
        else:
            plan = self._plan
            if plan is None or plan.model is not model:
                plan = self._plan = ModelPlan(model)
            if plan.flat and type(value) is dict and name in rec._budgeted:
                # validated, stored and sized in one go; the budget check takes the size
                stored, size = plan.stored_sized(name, key, value)
            else:
                stored = plan.stored(name, key, value)
        if expected_version is None and based_on is None and lease is None:
            # the hot path: no second coroutine, no apply callable, the op alone (see _stage),
            # as the tuple the pending entry keeps (no list made and copied)
            one: Any = ("map", name, "set", key, stored)
            wait = rec._stage(one, None, self._root, size)
            if wait is not None:
                await wait
        else:
            apply = partial(self._root.__setitem__, key, stored)  # no Python frame of its own
            ops: list[Op] = [["map", name, "set", key, stored]]
            await self._rec._write_guarded(
                self.name,
                key,
                expected_version,
                ops,
                apply,
                lambda: self.get(key),
                based_on,
                self._fence(key, lease, resource),
            )

    def _fence(
        self, key: str, lease: Lease | None, resource: str | None
    ) -> tuple[Lease, str] | None:
        if lease is None:
            return None
        if resource is None:
            return lease, self._rec.fenced_resource(self.name, key, lease)
        from .._leases import canonical_resource

        return lease, canonical_resource(resource)

    async def update(self, values: Mapping[str, Any]) -> None:
        """Set several keys in one transaction (one journal entry)."""
        items = [(check_key(k), self._in(k, v)) for k, v in dict(values).items()]
        if not items:
            return
        name = self.name
        apply = partial(ReplicaDocument.set_items, self._root, items)
        await self._write([["map", name, "set", k, v] for k, v in items], apply)

    async def delete(
        self,
        key: str,
        *,
        expected_version: int | None = None,
        based_on: Version | None = None,
        lease: Lease | None = None,
        resource: str | None = None,
    ) -> bool:
        """Delete ``key``; return whether it was there (nothing is journaled if not).

        Raises as :meth:`set` (``expected_version``, ``based_on`` or ``lease`` make it a
        guarded delete).
        """
        check_key(key)
        root = self._root

        def apply() -> None:
            if key in root:
                del root[key]

        ops: list[Op] = [["map", self.name, "del", key]]
        if expected_version is not None or based_on is not None or lease is not None:
            await self._rec._write_guarded(
                self.name,
                key,
                expected_version,
                ops,
                apply,
                lambda: self.get(key),
                based_on,
                self._fence(key, lease, resource),
            )
            return True
        if key not in root:
            return False
        await self._write(ops, apply)
        return True

    async def patch(
        self,
        key: str,
        fields: Mapping[str, Any],
        *,
        remove: Iterable[str] = (),
        expected_version: int | None = None,
        based_on: Version | None = None,
        lease: Lease | None = None,
        resource: str | None = None,
    ) -> None:
        """Refused: an entry here is one atomic value, and a patch made by reading it,
        changing fields and writing it back would lose a concurrent patch. Declare the
        collection ``CollectionSpec(kind="map", merge="fields")`` (see ``_fields``).

        Raises:
            InvalidValue: always (nothing is written).
        """
        raise InvalidValue(
            f"patch needs a collection declared CollectionSpec(kind='map', merge='fields');"
            f" {self.name!r} is not (its entries are atomic values: use set)"
        )


SEP = "\x1f"  # between a keep_all key and its sibling token (refused in user keys)


class GroupedMap(MapCollection):
    """A map whose entries each gather several physical keys of the root map (a
    ``keep_all`` key's siblings, a ``merge="fields"`` entry's fields): the mapping methods,
    read from one index of entry key -> its group (:meth:`_grouped`)."""

    def _grouped(self) -> Mapping[str, Any]:
        """Entry key -> its group of physical keys (never empty)."""
        raise NotImplementedError

    def _value_of(self, key: str, group: Any) -> Any:
        """What reading entry ``key`` (of group ``group``) returns."""
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        group = self._grouped().get(key)
        if group is None:
            raise KeyError(key)
        return self._value_of(key, group)

    def __contains__(self, key: object) -> bool:
        return key in self._grouped()

    def __len__(self) -> int:
        return len(self._grouped())

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._grouped()))

    def keys(self) -> list[str]:
        return list(self._grouped())

    def values(self) -> list[Any]:
        return [self._value_of(k, g) for k, g in self._grouped().items()]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self._value_of(k, g)) for k, g in self._grouped().items()]


class KeepAllMap(GroupedMap):
    """A map whose keys are multi-value registers (the ``keep_all`` conflict policy).

    Each write of key ``k`` stores its value under its own physical key ``k<US>token`` (flat
    composite keys on the root map: no nested shared types, which would lose each other
    when created concurrently) and deletes the siblings it has seen. Concurrent writes never
    see each other, so both survive; a later write sees both and resolves them.
    """

    def __init__(
        self, rec: CollectionHost, name: str, root: Any, model: type[BaseModel] | None
    ) -> None:
        super().__init__(rec, name, root, model)
        self._index: dict[str, dict[str, dict[str, Any]]] | None = None  # key -> pkey -> entry
        self._dirty: set[str] = set()  # physical keys changed since the index last looked
        self._reads: dict[str, Any] = {}  # key -> what get() returns, when immutable
        self._sibs: dict[str, Sibling] = {}  # pkey -> its Sibling, when immutable
        self._sub: Any = None

    def _on_change(self, event: Any) -> None:
        # every transaction that touches the root map, whatever its origin (local write,
        # remote entry, snapshot, raw update): only the names of the changed physical keys
        self._dirty.update(event.keys)

    def _groups(self) -> dict[str, dict[str, Any]]:
        """The sibling groups, kept up to date incrementally: a change costs the keys it
        touched (from the root map's events), not a rebuild of every group."""
        index = self._index
        if index is None:
            index = {}
            if self._sub is None:
                self._sub = self._root.observe(self._on_change)
            self._dirty.clear()
            for pkey, entry in self._root.items():
                key, sep, _ = pkey.rpartition(SEP)
                if sep and isinstance(entry, dict):
                    index.setdefault(key, {})[pkey] = entry
            self._index = index
            self._reads.clear()
            self._sibs.clear()
        elif self._dirty:
            dirty = list(self._dirty)  # (cleared in place: write closures hold the set)
            self._dirty.clear()
            root, reads = self._root, self._reads
            for pkey in dirty:
                key, sep, _ = pkey.rpartition(SEP)
                if not sep:
                    continue
                reads.pop(key, None)
                self._sibs.pop(pkey, None)
                entry = root.get(pkey)
                group = index.get(key)
                if isinstance(entry, dict):
                    if group is None:
                        group = index[key] = {}
                    group[pkey] = entry
                elif group is not None:
                    group.pop(pkey, None)
                    if not group:
                        del index[key]
        return index

    def _sibling(self, pkey: str, entry: dict[str, Any]) -> Sibling:
        return Sibling(
            value=self._out(entry.get("v")),
            agent=str(entry.get("a")),
            source=str(entry.get("s")),
            wall_time=float(entry.get("t", 0)),
            token=pkey.rpartition(SEP)[2],
        )

    def get(self, key: str, default: Any = None) -> Any:
        """The value, a :class:`Conflict` when siblings are unresolved, or ``default``."""
        group = self._groups().get(key)
        if not group:
            return default
        if len(group) == 1:
            ((_, entry),) = group.items()
            return self._out(entry.get("v"))
        got = self._reads.get(key)
        if got is not None:
            return got
        cache = self._sibs
        sibs = []
        for p, e in group.items():
            sib = cache.get(p)
            if sib is None:
                sib = self._sibling(p, e)
                if type(sib.value) in _IMMUTABLE:
                    cache[p] = sib  # frozen, nothing mutable inside: safe to hand out again
            sibs.append(sib)
        sibs.sort(key=_sibling_order)
        got = Conflict(key=key, siblings=tuple(sibs))
        if all(type(s.value) in _IMMUTABLE for s in sibs):
            self._reads[key] = got
        return got

    _grouped = _groups

    def _value_of(self, key: str, group: Any) -> Any:
        return self.get(key)

    def siblings(self, key: str) -> list[Sibling]:
        """Every current sibling of ``key`` (one when resolved, none when absent)."""
        group = self._groups().get(key, {})
        return sorted(
            (self._sibling(p, e) for p, e in group.items()), key=lambda s: (s.wall_time, s.token)
        )

    def provenance(self, key: str) -> Provenance | None:
        meta = None
        for pkey in self._groups().get(key, {}):
            meta = self._rec.provenance(self.name, pkey) or meta
        return meta

    async def set(
        self,
        key: str,
        value: Any,
        *,
        expected_version: int | None = None,
        based_on: Version | None = None,
        lease: Lease | None = None,
        resource: str | None = None,
    ) -> None:
        """Write ``key``, resolving every sibling this replica has seen.

        Raises as :meth:`MapCollection.set`; ``expected_version`` is not supported here.
        """
        if expected_version is not None or based_on is not None or lease is not None:
            raise InvalidValue("guarded writes are not available on keep_all collections")
        check_key(key)
        if SEP in key:
            raise InvalidValue("keys of keep_all collections must not contain \\x1f")
        stored = self._in(key, value)
        rec = self._rec
        pkey = f"{key}{SEP}{rec._next_token()}"
        entry = {"v": stored, "a": rec.agent, "s": rec.source, "t": time.time()}
        seen = list(self._groups().get(key, {}))
        root = self._root

        dirty = self._dirty

        def apply() -> None:
            for old in seen:
                del root[old]
            root[pkey] = entry
            # the root map's event comes when the transaction ends: a read inside it (a
            # rec.transaction() block) must already see this write
            dirty.update(seen)
            dirty.add(pkey)

        ops: list[Op] = [["map", self.name, "del", old] for old in seen]
        ops.append(["map", self.name, "set", pkey, entry])
        await self._write(ops, apply)

    async def resolve(self, key: str, value: Any) -> None:
        """Resolve the siblings of ``key`` to ``value`` (a write that has seen them all)."""
        await self.set(key, value)

    async def delete(
        self,
        key: str,
        *,
        expected_version: int | None = None,
        based_on: Version | None = None,
        lease: Lease | None = None,
        resource: str | None = None,
    ) -> bool:
        """Delete every sibling of ``key`` this replica has seen; return whether any."""
        if expected_version is not None or based_on is not None or lease is not None:
            raise InvalidValue("guarded writes are not available on keep_all collections")
        check_key(key)
        seen = list(self._groups().get(key, {}))
        if not seen:
            return False
        root = self._root
        dirty = self._dirty

        def apply() -> None:
            for old in seen:
                del root[old]
            dirty.update(seen)  # (as in set)

        await self._write([["map", self.name, "del", old] for old in seen], apply)
        return True

    async def update(self, values: Mapping[str, Any]) -> None:
        for k, v in dict(values).items():
            await self.set(k, v)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in self._groups():
            v = self.get(k)
            out[k] = v.to_json() if isinstance(v, Conflict) else _jsonable(v)
        return out


_IMMUTABLE = (str, int, float, bool, type(None))


def _sibling_order(s: Sibling) -> tuple[float, str]:
    return s.wall_time, s.token


def _jsonable(v: Any) -> Any:
    return v.model_dump(mode="json") if isinstance(v, BaseModel) else v
