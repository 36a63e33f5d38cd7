"""Maps whose entries merge field by field (``CollectionSpec(kind="map", merge="fields")``).

An entry of an ordinary map is one atomic value, so two agents that change different fields
of it at once lose one change to last-writer-wins. Here every field is its own key of the
collection's root map, ``<key>\\x1e<field>`` (ASCII record separator): concurrent edits of
different fields never meet, and concurrent edits of one field follow the collection's
conflict policy per field (``lww``, or ``keep_all`` siblings ``<key>\\x1e<field>\\x1f<token>``
holding ``{"v", "a", "s", "t"}`` as :class:`~._maps.KeepAllMap`'s do). No nested shared
type is ever created (two writers creating the same nested ``Y.Map`` at once lose one of them,
PYCRDT-NOTES hazard 3). An entry that has no field is marked by ``<key>\\x1e`` (value
``true``). A plain Yjs client reads and writes these flat keys directly.

``set`` writes only the fields that differ from what this replica shows and deletes the
fields it shows that the new value lacks; ``patch`` writes the fields it names. A schema
validates the merged entry before anything is written. Provenance and ``history`` of a field
are those of its physical key.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Set
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from .._errors import InvalidName, InvalidValue
from .._history import with_value
from .._journal import Op
from .._models import Conflict, Sibling, Version
from .._names import MAX_KEY_LENGTH, check_key
from .._semantics import validate_value
from .._values import from_stored, to_stored
from ._maps import SEP, GroupedMap

if TYPE_CHECKING:
    from .._leases import Lease
    from .._models import HistoryEntry, Provenance

RS = "\x1e"  # between an entry's key and a field name (refused in keys and field names)
MARKER = ""  # the field name of the presence marker ``<key>\x1e``
_BAD = ("\x00", RS, SEP)  # never in a key or a field name of these collections


class _Delete:
    """The type of :data:`DELETE` (one instance: compared with ``is``)."""

    def __repr__(self) -> str:
        return "crdtstore.DELETE"


DELETE = _Delete()
"""A field value for :meth:`FieldMap.patch` that deletes the field."""

_Index = dict[str, dict[str, list[str]]]  # entry -> field -> physical keys (siblings)


def _read(root: Any, pkey: str) -> Any:
    """``root[pkey]``, None if absent: one read transaction (``Map.get`` takes three)."""
    try:
        return root[pkey]
    except KeyError:
        return None


def _same(a: Any, b: Any) -> bool:
    """Whether two stored values are the same JSON (``True == 1`` in Python, not in JSON;
    an int and the float the document gives back for it are the same)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return False
    return bool(a == b)


def check_field(field: object) -> str:
    """Return ``field`` if it can be a field name of a merge="fields" entry.

    Raises:
        InvalidName: not a non-empty str, or containing NUL, \\x1e or \\x1f.
    """
    if type(field) is not str:
        raise InvalidName("field", field, f"must be a str, not {type(field).__name__}")
    if not field or "\x00" in field or RS in field or SEP in field:
        raise InvalidName("field", field, "must be non-empty, without NUL, \\x1e or \\x1f")
    return field


class FieldMap(GroupedMap):
    """A map of dict entries merged field by field, last writer wins per field.

    Reads return the entry as a dict (a model instance when the collection has a model and
    the merged entry validates; a merge no writer validated, e.g. a field patched while
    another writer deleted the entry, reads as the plain dict).
    """

    keep_all = False

    def __init__(self, rec: Any, name: str, root: Any, model: type[BaseModel] | None) -> None:
        super().__init__(rec, name, root, model)
        self._index_cache: tuple[int, _Index] | None = None

    # -- the index of physical keys --

    def _index(self) -> _Index:
        stamp = self._rec._stamp(self.name)
        cache = self._index_cache
        if cache is not None and cache[0] == stamp:
            return cache[1]
        index: _Index = {}
        keep_all = self.keep_all
        for pkey in self._root:
            key, rs, rest = pkey.partition(RS)
            if not rs or not key:
                continue  # not of this layout (a plain client's key): raw only
            if rest and keep_all:
                field, us, token = rest.partition(SEP)
                if not us or not token:
                    continue
            elif SEP in rest:
                continue
            else:
                field = rest
            index.setdefault(key, {}).setdefault(field, []).append(pkey)
        self._index_cache = (stamp, index)
        return index

    def _grouped(self) -> _Index:
        return self._index()

    def _note(self, index: _Index, key: str, ops: list[Op]) -> None:
        """Account this replica's own applied ops in ``index``."""
        fields = index.setdefault(key, {})
        for op in ops:
            pkey = op[3]
            field = pkey[len(key) + 1 :].partition(SEP)[0]
            pkeys = fields.setdefault(field, [])
            if op[2] == "set":
                if pkey not in pkeys:
                    pkeys.append(pkey)
            else:
                if pkey in pkeys:
                    pkeys.remove(pkey)
                if not pkeys:
                    del fields[field]
        if not fields:
            del index[key]

    # -- reads --

    def _field(self, key: str, field: str, pkeys: list[str]) -> Any:
        root = self._root
        if not self.keep_all:
            return from_stored(_read(root, pkeys[0]))
        sibs = [self._sibling(p, _read(root, p)) for p in pkeys]
        if len(sibs) == 1:
            return sibs[0].value
        sibs.sort(key=lambda s: (s.wall_time, s.token))
        return Conflict(key=f"{key}/{field}", siblings=tuple(sibs))

    def _sibling(self, pkey: str, entry: Any) -> Sibling:
        entry = entry if isinstance(entry, dict) else {"v": entry}
        return Sibling(
            value=from_stored(entry.get("v")),
            agent=str(entry.get("a")),
            source=str(entry.get("s")),
            wall_time=float(entry.get("t", 0)),
            token=pkey.rpartition(SEP)[2],
        )

    def _entry(self, key: str, fields: dict[str, list[str]]) -> dict[str, Any]:
        if len(fields) < 2:
            return {f: self._field(key, f, p) for f, p in fields.items() if f != MARKER}
        with self._root.doc.transaction():  # one read transaction for every field, not one each
            return {f: self._field(key, f, p) for f, p in fields.items() if f != MARKER}

    def _out_entry(self, entry: dict[str, Any]) -> Any:
        model = self.model
        if model is None or any(isinstance(v, Conflict) for v in entry.values()):
            return entry
        try:
            return model.__pydantic_validator__.validate_python(entry)
        except ValidationError:
            return entry

    def get(self, key: str, default: Any = None) -> Any:
        """The entry at ``key`` (a dict, or a model instance), or ``default``.

        In a ``keep_all`` collection a field with unresolved siblings reads as a
        :class:`Conflict` (and the entry then as a plain dict)."""
        fields = self._index().get(key)
        return default if fields is None else self._out_entry(self._entry(key, fields))

    def _value_of(self, key: str, group: Any) -> Any:
        return self._out_entry(self._entry(key, group))

    def fields(self, key: str) -> list[str]:
        """The field names of entry ``key`` (empty when absent)."""
        return [f for f in self._index().get(key, {}) if f != MARKER]

    def siblings(self, key: str, field: str) -> list[Sibling]:
        """The current siblings of one field (``keep_all``; one for a resolved field)."""
        pkeys = self._index().get(key, {}).get(field, [])
        root = self._root
        if not self.keep_all:
            return [self._sibling(p, {"v": _read(root, p)}) for p in pkeys]
        return sorted(
            (self._sibling(p, _read(root, p)) for p in pkeys), key=lambda s: (s.wall_time, s.token)
        )

    def to_json(self) -> dict[str, Any]:
        """Every entry as JSON (a field's unresolved siblings as ``{"__conflict__": ...}``)."""
        out: dict[str, Any] = {}
        for key, fields in self._index().items():
            entry = self._entry(key, fields)
            out[key] = {f: v.to_json() if isinstance(v, Conflict) else v for f, v in entry.items()}
        return out

    def physical_key(self, key: str, field: str) -> str:
        """The root-map key that field ``field`` of entry ``key`` lives under (``lww``)."""
        return f"{key}{RS}{field}"

    def get_versioned(self, key: str, field: str | None = None) -> tuple[Any, int | None]:
        """``(value, version)`` of field ``field`` of entry ``key`` (pass the version as a
        one-field patch's ``expected_version``; 0 = never written, None = not yet
        journaled), or without ``field`` of the entry: the newest version of its fields."""
        if field is not None:
            check_field(field)
            pkey = self.physical_key(key, field)
            value = from_stored(_read(self._root, pkey))
            return value, self._rec.version(self.name, pkey)
        fields = self._index().get(key)
        if fields is None:
            return None, self._rec.version(self.name, self.physical_key(key, MARKER))
        versions = [self._rec.version(self.name, p) for ps in fields.values() for p in ps]
        if any(v is None for v in versions):
            return self.get(key), None
        return self.get(key), max(v for v in versions if v is not None)

    def provenance(self, key: str, field: str | None = None) -> Provenance | None:
        """Who wrote field ``field`` of entry ``key`` (its newest sibling's writer), or
        without ``field`` the newest write of any of its fields."""
        fields = self._index().get(key, {})
        pkeys = (
            fields.get(field, [])
            if field is not None
            else [p for ps in fields.values() for p in ps]
        )
        best = None
        for pkey in pkeys:
            prov = self._rec.provenance(self.name, pkey)
            if prov is not None and (
                best is None or (prov.seq or 0, prov.wall_time) > (best.seq or 0, best.wall_time)
            ):
                best = prov
        return best

    async def history(self, key: str, field: str | None = None) -> list[HistoryEntry]:
        """Every journaled write to field ``field`` of entry ``key`` (overwritten ones
        included, oldest first); without ``field``, of every field it has now. In a
        ``keep_all`` collection only the current siblings' physical keys are read."""
        if field is not None:
            check_field(field)
            if not self.keep_all:
                return await self._rec.history(self.name, self.physical_key(key, field))
            pkeys = self._index().get(key, {}).get(field, [])
        else:
            pkeys = [p for ps in self._index().get(key, {}).values() for p in ps]
        out: list[HistoryEntry] = []
        for pkey in pkeys:
            for h in await self._rec.history(self.name, pkey):
                if self.keep_all and isinstance(h.value, dict) and "v" in h.value:
                    h = with_value(h, h.value["v"])  # a sibling's value
                out.append(h)
        out.sort(key=lambda h: h.provenance.seq or 0)
        return out

    # -- writes --

    def _check_key(self, key: object) -> str:
        check_key(key)
        assert isinstance(key, str)
        if RS in key or SEP in key:
            raise InvalidName("key", key, "must not contain \\x1e or \\x1f (merge='fields')")
        return key

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
        """Set the fields ``fields`` names (a value :data:`DELETE` deletes the field) and
        delete the fields ``remove`` names, leaving every other field of the entry as it
        is; concurrent patches of other fields all survive. Creates the entry if absent.

        Args:
            based_on, lease, resource: as :meth:`MapCollection.set`.
            expected_version: a patch of one field (``lww``) succeeds only if that field is
                still at this version (``get_versioned(key, field)``), checked at the store's
                authority; for several fields use ``based_on``.

        Raises:
            InvalidName: a bad key or field name.
            InvalidValue: ``fields`` is not a dict, a value is not JSON-like, a field is both
                set and removed, or ``expected_version`` on a patch of several fields.
            SchemaInvalid: the merged entry fails the collection's model (nothing written).
            PolicyViolation, BudgetExceeded, StaleVersion, LeaseLost: as ``set``.
        """
        if (
            type(fields) is dict
            and len(fields) == 1
            and remove == ()
            and expected_version is None
            and based_on is None
            and lease is None
            and not self.keep_all
            and self.model is None
        ):
            # the usual patch, one field of an unvalidated lww entry: one map set
            ((field, value),) = fields.items()
            if (
                type(key) is str
                and type(field) is str
                and value is not DELETE
                and key
                and field
                and len(key) + len(field) < MAX_KEY_LENGTH
                and key.isascii()
                and field.isascii()
                and not any(c in key or c in field for c in _BAD)
            ):
                await self._set_one(key, f"{key}{RS}{field}", field, to_stored(value))
                return
        key = self._check_key(key)
        if not isinstance(fields, Mapping):
            raise InvalidValue(f"patch takes a dict of fields, not {type(fields).__name__}")
        if isinstance(remove, str) or not isinstance(remove, Iterable):
            raise InvalidValue("remove takes a list of field names")
        removes = {check_field(f) for f in remove}
        sets: dict[str, Any] = {}
        for field, value in fields.items():
            check_field(field)
            if value is DELETE:
                removes.add(field)
            elif field in removes:
                raise InvalidValue(f"field {field!r} is both set and removed")
            else:
                sets[field] = value
        await self._commit(key, sets, removes, False, expected_version, based_on, lease, resource)

    async def _set_one(self, key: str, pkey: str, field: str, stored: Any) -> None:
        """Set one field (checked, stored form): the record's map-set fast path."""
        rec = self._rec
        name = self.name
        before = rec._stamp(name)
        cache = self._index_cache
        wait = rec._stage(["map", name, "set", pkey, stored], None, self._root)
        if cache is not None and cache[0] == before and rec._stamp(name) == before + 1:
            fields = cache[1].get(key)
            if fields is None:
                cache[1][key] = {field: [pkey]}
            elif field not in fields:
                fields[field] = [pkey]
            self._index_cache = (before + 1, cache[1])
        else:
            self._index_cache = None
        if wait is not None:
            await wait

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
        """Make entry ``key`` equal ``value`` (a dict or a model instance) by field writes:
        only the fields that differ from this replica's copy are written, the fields it
        shows that ``value`` lacks are deleted; fields others add concurrently survive.

        Raises as :meth:`patch`; ``InvalidValue`` for a value that is not a dict.
        """
        key = self._check_key(key)
        if isinstance(value, BaseModel):
            sets = value.__pydantic_serializer__.to_python(value, mode="json", exclude_unset=True)
        elif isinstance(value, Mapping):
            sets = dict(value)
        else:
            raise InvalidValue(
                f"entries of merge='fields' collections are dicts, not {type(value).__name__}"
            )
        for field in sets:
            check_field(field)
        await self._commit(key, sets, set(), True, expected_version, based_on, lease, resource)

    async def update(self, values: Mapping[str, Any]) -> None:
        """:meth:`set` each entry (one journal entry each)."""
        for key, value in dict(values).items():
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
        """Delete every field of entry ``key`` this replica shows; return whether any. A
        field another writer patches concurrently survives (the entry then holds it alone).
        Raises as :meth:`patch`."""
        key = self._check_key(key)
        fields = self._index().get(key)
        if fields is None:
            return False
        ops: list[Op] = [["map", self.name, "del", p] for ps in fields.values() for p in ps]
        await self._stage_ops(key, ops, expected_version, based_on, lease, resource)
        return True

    def _current(self, fields: dict[str, list[str]]) -> dict[str, Any]:
        """Stored values of an entry's fields (a keep_all field: its newest sibling's)."""
        if len(fields) > 1:
            with self._root.doc.transaction():  # one read transaction, not one per field
                return self._current_in(fields)
        return self._current_in(fields)

    def _current_in(self, fields: dict[str, list[str]]) -> dict[str, Any]:
        root = self._root
        out: dict[str, Any] = {}
        for field, pkeys in fields.items():
            if field == MARKER:
                continue
            if not self.keep_all:
                out[field] = _read(root, pkeys[0])
            else:
                sibs = [_read(root, p) for p in pkeys]
                sibs = [s for s in sibs if isinstance(s, dict)]
                if sibs:
                    out[field] = max(sibs, key=lambda s: float(s.get("t", 0))).get("v")
        return out

    async def _commit(
        self,
        key: str,
        sets: dict[str, Any],
        removes: Set[str],
        replace: bool,
        expected_version: int | None,
        based_on: Version | None,
        lease: Lease | None,
        resource: str | None,
    ) -> None:
        """Validate the merged entry, then write the ops that make it (nothing on refusal)."""
        guard = None
        if expected_version is not None:
            touched = set(sets) | set(removes)
            if replace or self.keep_all or len(touched) != 1:
                raise InvalidValue(
                    "expected_version guards a patch of one field of an lww merge='fields'"
                    " collection: for an entry (several keys) pass based_on=m.current_version()"
                )
            guard = self.physical_key(key, next(iter(touched)))
        name = self.name
        fields = self._index().get(key) or {}
        model = self.model
        current = self._current(fields) if (model is not None or replace) else {}
        if replace:
            removes = {f for f in fields if f != MARKER and f not in sets}
        if model is not None:
            merged = {f: v for f, v in current.items() if f not in removes}
            merged.update(sets)
            dumped = validate_value(None, model, name, key, merged)
            sets = {f: dumped[f] for f in sets if f in dumped}
        stored = {f: to_stored(v) for f, v in sets.items()}
        ops: list[Op] = []
        for field, value in stored.items():
            pkeys = fields.get(field, [])
            if replace and field in current and len(pkeys) == 1 and _same(current[field], value):
                continue  # unchanged: not written, so a concurrent write of it wins
            ops += self._field_ops(key, field, value, pkeys)
        for field in removes:
            ops += [["map", name, "del", p] for p in fields.get(field, [])]
        left = {f for f in fields if f not in removes} | set(stored)
        if not left:  # an entry with no field: the marker keeps it present
            marker = self.physical_key(key, MARKER)
            ops.append(["map", name, "set", marker, True])
        for op in ops:
            check_key(op[3])  # (the key and field together must fit a key's length)
        if not ops:
            return
        await self._stage_ops(key, ops, expected_version, based_on, lease, resource, guard)

    def _field_ops(self, key: str, field: str, value: Any, seen: list[str]) -> list[Op]:
        name = self.name
        if not self.keep_all:
            return [["map", name, "set", self.physical_key(key, field), value]]
        rec = self._rec
        pkey = f"{key}{RS}{field}{SEP}{rec._next_token()}"
        entry = {"v": value, "a": rec.agent, "s": rec.source, "t": time.time()}
        ops: list[Op] = [["map", name, "del", old] for old in seen]
        ops.append(["map", name, "set", pkey, entry])
        return ops

    async def _stage_ops(
        self,
        key: str,
        ops: list[Op],
        expected_version: int | None,
        based_on: Version | None,
        lease: Lease | None,
        resource: str | None,
        guard: str | None = None,
    ) -> None:
        if expected_version is not None and guard is None:
            raise InvalidValue(
                "expected_version is not available on a whole entry of a merge='fields'"
                " collection (several keys): pass based_on=m.current_version() instead"
            )
        root = self._root

        def apply() -> None:
            for op in ops:
                if op[2] == "set":
                    root[op[3]] = op[4]
                elif op[3] in root:
                    del root[op[3]]

        rec = self._rec
        if based_on is not None or lease is not None or guard is not None:
            self._index_cache = None
            current = (lambda: self.get(key)) if guard is None else (lambda: _read(root, guard))
            try:
                await rec._write_guarded(
                    self.name,
                    guard or key,
                    expected_version,
                    ops,
                    apply,
                    current,
                    based_on,
                    self._fence(key, lease, resource),
                )
            finally:
                self._index_cache = None
            return
        before = rec._stamp(self.name)
        cache = self._index_cache
        if len(ops) == 1 and ops[0][2] == "set":
            # one field set (the usual patch): the record's map-set fast path (see _stage)
            wait = rec._stage(ops[0], None, root)
        else:
            wait = rec._stage(ops, apply)
        # Applied at once, unless it waits for another task's transaction: the stamp then
        # did not move by exactly our ops, and the index is rebuilt on the next read.
        if cache is not None and cache[0] == before and rec._stamp(self.name) == before + len(ops):
            self._note(cache[1], key, ops)
            self._index_cache = (before + len(ops), cache[1])
        else:
            self._index_cache = None
        if wait is not None:
            await wait


class KeepAllFieldMap(FieldMap):
    """A merge="fields" map whose fields are multi-value registers (``keep_all``): each
    concurrent write of a field is kept as a sibling until a write that saw them resolves
    them (any later ``patch`` or ``set`` of that field)."""

    keep_all = True
