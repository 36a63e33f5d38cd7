"""The one place crdtstore reaches into pycrdt's private internals, and the switch that turns
that off.

The record's hottest paths (a local map set, a list read, the capture of every transaction's
update, the reads of bulk replay) skip pycrdt's Python frames and talk to yrs directly. That
works only while pycrdt is built as this module expects, so it is checked once at import on
scratch documents (:func:`_internals_work`); when the check fails, or the environment sets
``CRDTSTORE_PYCRDT_INTERNALS=0``, :data:`INTERNALS` is false and every function here takes
pycrdt's public API instead, with the same results. CI runs the record's tests a second time
with the switch off so the public path stays correct.

Nothing outside this module may touch a pycrdt attribute whose name starts with ``_``
(``tests/project/test_layering.py`` checks the source).
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from pycrdt import Array, Doc, Map, Transaction

from .._values import from_stored

ENV = "CRDTSTORE_PYCRDT_INTERNALS"

ABSENT: Any = object()  # what map_get gives for a key that is not there


def _json_number(text: str) -> Any:
    return from_stored(float(text))


def _internals_work() -> bool:
    """Whether this pycrdt's internals are as the shortcuts below expect:

    - a map set goes straight to yrs, ``root._integrated.insert(txn, key, value)``, which is
      what ``root[key] = value`` ends in for a value that is not a shared type;
    - a transaction is a yrs transaction made, committed and dropped while ``doc._txn`` names
      a pycrdt ``Transaction`` holding it, which is what ``with doc.transaction():`` does
      when none is open (:class:`DirectTransaction`);
    - a callback given to the yrs document's ``observe`` gets every committed transaction's
      event with its ``update`` (the capture, without pycrdt's wrapper frame).
    """
    try:
        doc: Doc[Any] = Doc()
        root = doc.get("m", type=Map)
        seen: list[bytes] = []
        sub = doc._doc.observe(lambda event: seen.append(event.update))
        with doc.transaction() as outer:
            root._integrated.insert(outer._txn, "a", 1)
        wtxn = Transaction(doc)
        txn = doc._doc.create_transaction()
        wtxn._txn, wtxn._leases, doc._txn = txn, 1, wtxn
        root._integrated.insert(txn, "k", {"v": [1]})
        txn.commit()
        txn.drop()
        wtxn._txn, wtxn._leases, doc._txn = None, 0, None
        other: Doc[Any] = Doc()
        for update in seen:
            other.apply_update(update)
        want = {"a": 1.0, "k": {"v": [1.0]}}
        with doc.transaction() as check:
            raw_get = root._maybe_as_type_or_doc(root._integrated.get(check._txn, "k"))
        ok = (
            len(seen) == 2
            and dict(root.items()) == want
            and dict(other.get("m", type=Map).items()) == want
            and raw_get == {"v": [1.0]}
            and doc._allow_multithreading is False
            and doc._exceptions == []
            and doc._txn is None
        )
        del sub
        return ok
    except Exception:  # pragma: no cover - another pycrdt
        return False


INTERNALS: bool = os.environ.get(ENV, "1") != "0" and _internals_work()


def observe_updates(doc: Doc[Any], callback: Callable[[Any], None], owner: object) -> Any:
    """Subscribe ``callback`` to every committed transaction of ``doc`` (its event has
    ``update``) for as long as ``owner`` lives; returns the subscription.

    Through the public API the subscription ends when ``owner`` is freed: pycrdt's
    ``Doc.observe`` gives yrs a callback holding the document, which the garbage collector
    cannot see from the Rust side, so the document would never be freed otherwise.
    """
    if INTERNALS:
        return doc._doc.observe(callback)
    subscription = doc.observe(callback)
    weakref.finalize(owner, doc.unobserve, subscription)
    return subscription


def list_values(root: Array[Any]) -> list[Any]:
    """Every value of the list ``root``, as :func:`from_stored` gives them, read in one call.

    pycrdt reads an array item by item, each in a transaction of its own that seeks to the
    index; yrs can write the whole array as JSON instead (``to_json`` of the integrated
    array), parsed with every number made what :func:`from_stored` makes of the float yrs
    holds. Values crdtstore writes are JSON already; what only a plain Yjs client can store
    comes out as JSON too: a nested shared type as its plain content, binary as a list of
    byte values, a big integer beyond 2**53 as a float.
    """
    integrated = getattr(root, "_integrated", None) if INTERNALS else None
    if integrated is None or not hasattr(integrated, "to_json"):
        return [_plain(from_stored(v)) for v in root]
    with root.doc.transaction() as txn:
        rtxn = txn._txn
        assert rtxn is not None
        text = integrated.to_json(rtxn)
    values: list[Any] = json.loads(text, parse_int=_json_number, parse_float=_json_number)
    return values


def _plain(value: Any) -> Any:
    """A value read through pycrdt's public API as ``to_json`` writes it: a nested shared
    type (only a plain Yjs client stores one) as its plain content, binary as byte values."""
    if isinstance(value, (Map, Array)):
        return from_stored(value.to_py())
    if isinstance(value, (bytes, bytearray)):
        return list(value)
    if hasattr(value, "to_py"):  # a nested text or another shared type
        return from_stored(value.to_py())
    return value


def raw(txn: Any) -> Any:
    """The yrs transaction inside pycrdt's transaction object ``txn`` (None: use the public
    API; every function below taking ``raw`` accepts that None)."""
    return txn._txn if INTERNALS and txn is not None else None


# what yrs returns for a map value that is not a shared type (read as is: pycrdt's
# _maybe_as_type_or_doc tries every shared type first)
_PLAIN = frozenset((float, str, bool, type(None), dict, list, int, bytes))


def map_reader(root: Map[Any], rtxn: Any) -> Callable[[str], Any]:
    """A function reading ``root[key]`` inside the open transaction (``rtxn`` from
    :func:`raw`) as pycrdt gives it, or :data:`ABSENT`. pycrdt's ``Map.get`` opens a nested
    transaction three times and checks the key twice: the largest part of applying a
    one-key entry, and of attributing the keys of a bulk load."""
    if rtxn is None:
        get_public = root.get
        return lambda key: get_public(key, ABSENT)
    integrated = root.integrated
    has, get, wrap = integrated.has, integrated.get, root._maybe_as_type_or_doc

    def read(key: str) -> Any:
        if not has(rtxn, key):
            return ABSENT
        value = get(rtxn, key)
        return value if type(value) in _PLAIN else wrap(value)

    return read


def map_get(root: Map[Any], rtxn: Any, key: str) -> Any:
    """One read of :func:`map_reader`."""
    return map_reader(root, rtxn)(key)


def update_applier(doc: Doc[Any], rtxn: Any) -> Callable[[bytes], None]:
    """``doc.apply_update`` inside its open transaction (``rtxn`` from :func:`raw`): straight
    to yrs (pycrdt's ``apply_update`` opens a nested transaction per update)."""
    if rtxn is None:
        return doc.apply_update
    direct = doc._doc.apply_update
    return lambda update: direct(rtxn, update)


def insert_all(root: Any, items: Iterable[tuple[str, Any]]) -> None:
    """``root[key] = value`` for every pair, inside the document's open transaction, each
    value going straight to yrs (values that are not shared types)."""
    txn = root.doc._txn
    rtxn = txn._txn if INTERNALS and txn is not None else None
    if rtxn is not None:
        insert = root._integrated.insert
        for key, value in items:
            insert(rtxn, key, value)
    else:
        for key, value in items:
            root[key] = value


def insert_one(root: Any, txn: Any, key: str, value: Any) -> None:
    """``root[key] = value`` inside pycrdt's open transaction object ``txn``."""
    rtxn = txn._txn if INTERNALS and txn is not None else None
    if rtxn is not None:
        root._integrated.insert(rtxn, key, value)
    else:
        root[key] = value


def _raise_observer_failures(doc: Any) -> None:
    """Raise what observers of ``doc`` failed with, as pycrdt does after a transaction (one
    ``ExceptionGroup``), and forget it."""
    exceptions = tuple(doc._exceptions)
    doc._exceptions.clear()
    raise ExceptionGroup("Observer callback error", exceptions)


class DirectRead:
    """``root.get(key, missing)`` of a map in one yrs transaction when none is open (as
    :class:`DirectTransaction` writes): pycrdt's ``Map.get`` nests three and checks the key
    twice, most of a read-increment-write's read. Else the public API."""

    __slots__ = ("_wtxn", "doc", "root")

    def __init__(self, root: Map[Any]) -> None:
        self.root = root
        doc: Any = root._doc  # (None: not in a document)
        self.doc = doc
        usable = INTERNALS and doc is not None and not doc._allow_multithreading
        self._wtxn: Any = Transaction(doc) if usable else None

    def get(self, key: str, missing: Any) -> Any:
        doc, wtxn, root = self.doc, self._wtxn, self.root
        if wtxn is None or doc._txn is not None or type(key) is not str:
            return root.get(key, missing)
        txn = doc._doc.create_transaction()
        wtxn._txn, wtxn._leases, doc._txn = txn, 1, wtxn
        try:
            try:
                integrated: Any = root._integrated
                if not integrated.has(txn, key):
                    return missing
                value = integrated.get(txn, key)
                return value if type(value) in _PLAIN else root._maybe_as_type_or_doc(value)
            finally:
                txn.commit()
                if doc._exceptions:  # (an observer failed: as pycrdt raises it)
                    _raise_observer_failures(doc)
        finally:
            txn.drop()
            wtxn._txn, wtxn._leases, doc._txn = None, 0, None


class DirectTransaction:
    """What ``with doc.transaction(): root[key] = value`` does when no transaction is open,
    without pycrdt's Python frames: a yrs transaction made, committed and dropped while
    ``doc._txn`` names a pycrdt ``Transaction`` kept for the document.

    :meth:`set` runs one insert when it can (the internals are there, the document is
    single-threaded and no transaction is open), and says whether it did.
    """

    __slots__ = ("_wtxn", "doc")

    def __init__(self, doc: Doc[Any]) -> None:
        self.doc = doc
        self._wtxn = Transaction(doc) if INTERNALS and not doc._allow_multithreading else None

    def set(self, root: Any, key: str, value: Any) -> bool:
        """Insert, commit and return True; or, if it cannot now, change nothing and return
        False (the caller takes the public API). Re-raises an observer's failure as pycrdt
        does (an ``ExceptionGroup``); what was applied is committed either way (no
        rollback). (One call, no separate check: this is every local map set.)"""
        doc, wtxn = self.doc, self._wtxn
        if wtxn is None or doc._txn is not None:
            return False
        txn = doc._doc.create_transaction()
        wtxn._txn, wtxn._leases, doc._txn = txn, 1, wtxn
        try:
            try:
                root._integrated.insert(txn, key, value)
            finally:
                txn.commit()
            if doc._exceptions:  # an observer failed (pycrdt's observe wrapper kept it)
                _raise_observer_failures(doc)
        finally:
            txn.drop()
            wtxn._txn, wtxn._leases, doc._txn = None, 0, None
        return True

    def apply(self, update: bytes) -> bool:
        """``doc.apply_update(update)`` as :meth:`set` inserts: applied, committed and True;
        or, if it cannot now, nothing done and False. Raises what yrs or an observer raised
        (what was integrated is committed either way, as pycrdt's)."""
        doc, wtxn = self.doc, self._wtxn
        if wtxn is None or doc._txn is not None:
            return False
        txn = doc._doc.create_transaction()
        wtxn._txn, wtxn._leases, doc._txn = txn, 1, wtxn
        try:
            try:
                doc._doc.apply_update(txn, update)
            finally:
                txn.commit()
            if doc._exceptions:
                _raise_observer_failures(doc)
        finally:
            txn.drop()
            wtxn._txn, wtxn._leases, doc._txn = None, 0, None
        return True
