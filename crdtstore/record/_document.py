"""The replica's document: a pycrdt ``Doc``, its collection registry and local transactions.

:class:`ReplicaDocument` makes local transactions and captures each one's update (exactly one
per transaction), keeps the registry of collections *in the document* (so every replica and
every Yjs client agrees on which root is a map, a list or a text), and checks and applies
update bytes from elsewhere. The hot path of a local write (:meth:`ReplicaDocument.local_set`,
``do_set``, ``set_items``) goes straight to yrs through pycrdt's internals (all of them in
:mod:`._pycrdt`, checked at import); when they moved it takes pycrdt's public API.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import partial
from itertools import repeat
from operator import is_, itemgetter
from typing import Any

from pycrdt import Array, Doc, Map, Text, get_state

from .._errors import CollectionKindMismatch, InvalidUpdate, PayloadTooLarge
from .._journal import NewEntry, Op, checksum
from .._values import from_stored
from ..codec import CodecError, Decoded, check_update_counts, decode_update
from ._item_provenance import ItemIndex
from ._provenance import Meta, ProvenanceIndex, _increasing
from ._pycrdt import DirectTransaction, insert_all, insert_one, list_values, observe_updates

REGISTRY = "__crdtstore_collections"

KINDS: dict[str, type[Any]] = {"map": Map, "list": Array, "text": Text}

DEFAULT_MAX_UPDATE = 16 * 1024 * 1024

_EMPTY_UPDATES = (b"\x00\x00",)

# journaled_many's batches of at least this many entries try the run's path (_journaled_run)
_RUN_MIN = 8
_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)
_fourth, _fifth = itemgetter(3), itemgetter(4)


def _pycrdt_parse(update: bytes) -> None:
    """pycrdt's parse of ``update`` (decoding its state vector parses the whole structure
    without touching a document).

    Raises:
        InvalidUpdate: pycrdt refuses the bytes.
    """
    try:
        get_state(update)
    except BaseException as exc:  # pycrdt raises ValueError, RuntimeError or a panic
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise InvalidUpdate(f"{type(exc).__name__}: {exc}") from None


class ReplicaDocument(ProvenanceIndex):
    """The document of a :class:`~crdtstore.record.Replica` (see the module docstring)."""

    def __init__(self, *, max_update: int = DEFAULT_MAX_UPDATE) -> None:
        super().__init__()
        # A fresh random client id for every replica: a reused id makes peers drop writes
        # (PYCRDT-NOTES hazard 5). The agent identity lives in the journal, not here.
        self.doc: Doc[Any] = Doc()
        self.client_id: int = self.doc.client_id
        self.max_update = max_update
        self.registry: Map[Any] = self.doc.get(REGISTRY, type=Map)
        self._roots: dict[tuple[str, str], Any] = {}
        self._kinds: dict[str, str] = {}
        self._captured: bytes | None = None
        self._capturing = False
        self._transactions = 0  # transactions that changed the document
        self._colls: dict[str, str] = {}  # see collections()
        self._colls_at = (-1, -1)  # (self._transactions, len(self.registry)) it was right at
        self._txn_cm: Any = None
        self._deletes_wanted = False  # (apply_external: capture the delete set too)
        self._captured_deletes: bytes | None = None
        # the last update check_update decoded, and what it read (apply_external of the same
        # bytes, checked=True, does not decode them again)
        self.last_checked: tuple[bytes, Decoded] | None = None
        self._direct: DirectTransaction | None = None  # what local_set reuses (see there)
        self.partial_update: bytes | None = None
        self._listeners: tuple[Callable[[bytes], None], ...] = ()  # see listen()
        self._capture: Any = self.capture_transactions()
        self.items = ItemIndex()  # who brought each list or text item
        self._txn_items: Meta | None = None  # the open transaction wrote items (see do())

    def export_state(self) -> dict[str, Any]:
        state = super().export_state()
        state["items"] = self.items.export()
        return state

    def import_state(self, state: dict[str, Any]) -> None:
        super().import_state(state)
        self.items.load(state.get("items"))

    def journaled(self, ops: list[Op], meta: Meta, seq: int) -> None:
        super().journaled(ops, meta, seq)
        if self.items.unjournaled:
            self.items.journaled(meta, seq)

    def journaled_many(self, batch: Any, seqs: Any, columns: Any = None) -> None:
        """:meth:`ProvenanceIndex.journaled_many`; ``columns``, if not None, are the batch's
        journal entries by columns as the committer gave them to the backend (its
        ``_columns``: an item per entry, or one that every entry has)."""
        if len(batch) < _RUN_MIN or not self._journaled_run(batch, seqs, columns):
            super().journaled_many(batch, seqs)
        if self.items.unjournaled:
            journaled = self.items.journaled
            for (_, _, meta), seq in zip(batch, seqs, strict=True):
                journaled(meta, seq)

    def _journaled_run(
        self, batch: list[tuple[bytes, Any, Meta]], seqs: list[int], columns: Any = None
    ) -> bool:
        """:meth:`journaled_many` of a run of entries of one op each, on one map's keys (every
        key still pointing at its entry) by one writer, in increasing positions after every
        row of the table: the committer's usual batch of single sets, at C speed (no Python
        step per entry). Returns False, having changed nothing, for any other batch.
        ``columns`` (see :meth:`journaled_many`) spare taking the ops, names and times."""
        table = self.table
        if (table.seqs and seqs[0] <= table.seqs[-1]) or not _increasing(seqs):
            return False
        opss = list(map(_second, batch)) if columns is None else columns[5]
        if not all(opss) or sum(map(len, opss)) != len(opss):  # (not one op each)
            return False
        ops = list(map(_first, opss))
        kind, name = ops[0][0], ops[0][1]
        keys = self.index.get(name)
        metas = list(map(_third, batch))
        agent, source, _, _, run, _ = metas[0]
        n = len(ops)
        if columns is None:
            one_writer = (
                list(map(_first, metas)).count(agent) == n
                and list(map(_second, metas)).count(source) == n
                and list(map(_fifth, metas)).count(run) == n
            )
        else:  # (a column of one item: every entry has it)
            one_writer = len(columns[0]) == len(columns[1]) == len(columns[7]) == 1
        if (
            keys is None
            or kind != "map"
            or not one_writer
            or list(map(_first, ops)).count(kind) != n
            or list(map(_second, ops)).count(name) != n
        ):
            return False
        names = list(map(_fourth, ops))
        if not all(map(is_, map(keys.get, names), metas)):  # (a key written again since)
            return False
        keys.update(zip(names, seqs, strict=True))
        table.fit(seqs[-1])
        who = table.name_index(agent, source, run)
        tseqs = table.seqs
        tseqs.extend(seqs)
        table.walls.extend(map(_third, metas) if columns is None else columns[3])
        table.who.extend(repeat(who, n))
        self.coll_seq[name] = last = seqs[-1]
        if last > self.head:
            self.head = last
        self._settle_grown({name})
        if len(tseqs) > table.sweep_at:
            table.keep(self._live_seqs())
        return True

    def capture_transactions(self) -> Any:
        """Observe this replica's document for the capture: count every transaction that
        changed it and, while a local one is open (``_capturing``), keep its update (and,
        for ``apply_external``, its delete set). On the yrs document itself when it can (see
        :mod:`._pycrdt`), through a weak reference to the replica. A bound method given to
        yrs is held from the Rust side, where the garbage collector cannot see it: the
        replica and its document were never freed (every record closed, every scratch copy
        and replay leaked its document). Returns the subscription (it lives as long as the
        document)."""
        ref = weakref.ref(self)

        def on_transaction(event: Any) -> None:
            # (one Python frame per transaction: this runs on every local write)
            replica = ref()
            if replica is not None:
                replica._transactions += 1
                listeners = replica._listeners
                if replica._capturing:
                    update = replica._captured = event.update
                    if replica._deletes_wanted:  # (which items the update deleted)
                        replica._captured_deletes = event.delete_set
                    for listener in listeners:
                        listener(update)
                elif listeners:
                    update = event.update
                    for listener in listeners:
                        listener(update)

        return observe_updates(self.doc, on_transaction, self)

    def listen(self, listener: Callable[[bytes], None]) -> Callable[[bytes], None]:
        """Call ``listener(update)`` with the update of every transaction that changes the
        document, from the capture's observer (:meth:`capture_transactions`): the update is
        encoded once per transaction for the capture and every listener alike, where an
        observer of its own on the document would encode it again. Returns ``listener``,
        for :meth:`unlisten`."""
        self._listeners = (*self._listeners, listener)
        return listener

    def unlisten(self, listener: Callable[[bytes], None]) -> None:
        """Stop calling ``listener`` (given to :meth:`listen`; unknown: nothing happens)."""
        self._listeners = tuple(x for x in self._listeners if x is not listener)

    def kind_of(self, name: str) -> str | None:
        """The kind the registry gives ``name`` (None when unregistered or not a kind)."""
        kind = self._kinds.get(name)
        if kind is None:
            kind = self.registry.get(name)
            if kind not in KINDS:
                return None
            self._kinds[name] = kind
        return kind

    def root(self, name: str, kind: str) -> Any:
        """The root shared type of a collection, checking its kind against the registry.

        Raises:
            CollectionKindMismatch: the name is registered as another kind.
        """
        existing = self.kind_of(name)
        if existing is not None and existing != kind:
            raise CollectionKindMismatch(name, existing, kind)
        got = self._roots.get((name, kind))
        if got is None:
            got = self._roots[(name, kind)] = self.doc.get(name, type=KINDS[kind])
        return got

    def collections(self) -> dict[str, str]:
        """Registered collections: name -> kind, sorted by name (entries that are not a known
        kind, which only a foreign or corrupted update can write, are left out).

        Cached: read from the registry again once a transaction changed the document since
        (or, inside a transaction still open, once the registry's size changed);
        :meth:`apply_external` keeps it across an update that leaves the registry alone. A
        new dict every call."""
        at = (self._transactions, len(self.registry))
        if at != self._colls_at:
            self._colls = self._read_collections()
            self._colls_at = at
        return dict(self._colls)

    def _read_collections(self) -> dict[str, str]:
        return dict(sorted((str(k), str(v)) for k, v in self.registry.items() if v in KINDS))

    def read(self, name: str, kind: str) -> Any:
        root = self.root(name, kind)
        if kind == "map":
            return {k: from_stored(v) for k, v in root.items()}
        if kind == "list":
            return list_values(root)
        return str(root)

    def to_dict(self) -> dict[str, Any]:
        return {name: self.read(name, kind) for name, kind in self.collections().items()}

    def begin(self) -> None:
        """Open a local transaction whose update :meth:`end` returns."""
        self._captured = None
        self._capturing = True
        self._txn_cm = self.doc.transaction()
        self._txn_cm.__enter__()

    def do(self, ops: list[Op], apply: Callable[[], None], meta: Meta) -> None:
        """Inside :meth:`begin`/:meth:`end`: run ``apply`` (which makes exactly the changes
        described by ``ops``) and record provenance.

        Collections touched for the first time are registered in the same transaction, so
        the registry never names a collection whose first write is missing, or vice versa.
        """
        kinds = self._kinds
        for op in ops:
            if kinds.get(op[1]) != op[0]:
                self._register(op[1], op[0])
        apply()
        index = self.index
        for op in ops:
            if op[0] == "map":
                keys = index.get(op[1])
                if keys is None:
                    keys = index[op[1]] = {}
                keys[op[3]] = meta
            else:
                self._txn_items = meta

    def end(self) -> bytes | None:
        """Commit the local transaction; return its update (None when nothing changed).

        There is no rollback in pycrdt: whatever was applied before an error is committed
        (and must be journaled by the caller).
        """
        cm, self._txn_cm = self._txn_cm, None
        try:
            if cm is not None:
                cm.__exit__(None, None, None)
        finally:
            self._capturing = False
        update, self._captured = self._captured, None
        meta, self._txn_items = self._txn_items, None
        if update is not None and meta is not None:
            self.items.local(update, meta)
        return update

    def local(self, ops: list[Op], apply: Callable[[], None], meta: Meta) -> bytes | None:
        """One local transaction (the hot path, equivalent to :meth:`begin`, :meth:`do`,
        :meth:`end`): return its update, None when nothing changed.

        If ``apply`` raises, what it applied is committed anyway (no rollback in pycrdt): the
        update is left in :attr:`partial_update` for the caller to journal, then the error
        propagates.
        """
        self._captured = None
        self._capturing = True
        kinds = self._kinds
        try:
            # (no transaction origin: nothing reads it, and pycrdt compares it on every
            # nested transaction that pycrdt's own setters open)
            with self.doc.transaction():
                for op in ops:
                    if kinds.get(op[1]) != op[0]:
                        self._register(op[1], op[0])
                apply()
        except BaseException:
            self.partial_update = self._captured
            raise
        finally:
            self._capturing = False
        index = self.index
        items = False
        for op in ops:
            if op[0] == "map":
                keys = index.get(op[1])
                if keys is None:
                    keys = index[op[1]] = {}
                keys[op[3]] = meta
            else:
                items = True
        update, self._captured = self._captured, None
        if items and update is not None:
            self.items.local(update, meta)
        return update

    def local_set(self, root: Any, ops: list[Op], meta: Meta) -> bytes | None:
        """:meth:`local` of one map set, ``ops == [["map", name, "set", key, stored]]`` on the
        collection's root ``root``: the hot path of a local write.

        The value goes straight to yrs (:class:`._pycrdt.DirectTransaction`: what ``with
        doc.transaction(): root[key] = stored`` does when no transaction is open, without
        pycrdt's Python frames; otherwise, or with a transaction open, or a collection not
        registered as a map yet, this is :meth:`local`). The update is captured as by
        :meth:`local`; an error leaves what was applied in :attr:`partial_update` as there.
        """
        _, name, _, key, stored = ops[0]
        direct = self._direct
        if direct is None or direct.doc is not self.doc:  # (a simulation may swap the document)
            direct = self._direct = DirectTransaction(self.doc)
        if self._kinds.get(name) != "map":
            return self.local(ops, partial(root.__setitem__, key, stored), meta)
        self._captured = None
        self._capturing = True
        try:
            done = direct.set(root, key, stored)
        except BaseException:
            self.partial_update = self._captured
            raise
        finally:
            self._capturing = False
        if not done:  # (a transaction is open, or no internals: the public API)
            return self.local(ops, partial(root.__setitem__, key, stored), meta)
        keys = self.index.get(name)
        if keys is None:
            keys = self.index[name] = {}
        keys[key] = meta
        update, self._captured = self._captured, None
        return update

    @staticmethod
    def set_items(root: Any, items: list[tuple[str, Any]]) -> None:
        """``root[key] = stored`` for every pair of ``items``, inside the document's open
        transaction (an ``apply`` of :meth:`local` or :meth:`do`), each value going straight
        to yrs as in :meth:`local_set`."""
        insert_all(root, items)

    def do_set(self, root: Any, name: str, key: str, stored: Any, meta: Meta) -> None:
        """:meth:`do` of one map set (``["map", name, "set", key, stored]`` on ``root``)
        inside :meth:`begin`/:meth:`end`, the value going straight to yrs as in
        :meth:`local_set`."""
        if self._kinds.get(name) != "map":
            self._register(name, "map")
        insert_one(root, self._txn_cm, key, stored)
        keys = self.index.get(name)
        if keys is None:
            keys = self.index[name] = {}
        keys[key] = meta

    def _register(self, name: str, kind: str) -> None:
        current = self.registry.get(name)
        if current in KINDS and current != kind:
            raise CollectionKindMismatch(name, current, kind)
        if current != kind:
            self.registry[name] = kind
        self._kinds[name] = kind

    def entry(
        self,
        agent: str,
        source: str,
        update: bytes,
        ops: list[Op],
        wall: float,
        origin: str = "",
        call: str = "",
    ) -> NewEntry:
        return NewEntry(
            agent, source, self.client_id, wall, update, ops, checksum(update), origin, call
        )

    def check_update(
        self, update: bytes, *, trial_decode: bool = True, size_limit: bool = True
    ) -> Decoded | None:
        """Reject update bytes that cannot be right before they reach the document; return
        what the trial decode read (None without it).

        The trial decode is crdtstore's strict one (:func:`crdtstore.codec.decode_update`:
        canonical, no trailing bytes, no struct of length 0), which refuses bytes pycrdt
        would take into a document it can then no longer encode, and pycrdt's parse
        (``get_state``) unless that decode read every byte as yrs does (``Decoded.plain``:
        map entries with one value, strings, deletions; what a writer of map sets and text
        sends), so that the usual update is parsed once.

        Raises:
            PayloadTooLarge: larger than ``max_update``.
            InvalidUpdate: not bytes, or not decodable as a v1 update.
        """
        if not isinstance(update, bytes):
            raise InvalidUpdate(f"expected bytes, got {type(update).__name__}")
        if size_limit and len(update) > self.max_update:
            raise PayloadTooLarge("update", len(update), self.max_update)
        check_update_counts(update)
        if not trial_decode:
            return None
        try:
            decoded = decode_update(update)
        except (CodecError, PayloadTooLarge):
            _pycrdt_parse(update)  # (its refusal first, as it always came first)
            raise
        if not decoded.plain:  # content crdtstore's decoder skips, or clocks past u32
            _pycrdt_parse(update)
        self.last_checked = (update, decoded)
        return decoded

    def apply_update(
        self,
        update: bytes,
        *,
        trial_decode: bool = True,
        size_limit: bool = True,
        nested: bool | None = None,
    ) -> None:
        """Apply raw update bytes (no provenance).

        pycrdt refuses an item whose parent id is not a shared type only after integrating
        the items before it (pycrdt 0.14.13), so an update with an item that names a nested
        type as its parent is tried on a scratch copy of the document first: a refusal
        leaves this one as it was. ``nested`` says whether the caller's decode of ``update``
        found such an item (None: as the trial decode found, else assume not: bytes this
        store wrote or accepted before).

        Raises:
            PayloadTooLarge, InvalidUpdate: see :meth:`check_update`; the doc is unchanged.
        """
        decoded = self.check_update(update, trial_decode=trial_decode, size_limit=size_limit)
        if nested is None:
            nested = decoded is not None and decoded.nested
        # an update from elsewhere may register a name concurrently as another kind (the
        # registry's last writer wins): forget what was cached, the registry is the truth.
        # (Observing the registry instead would change how pycrdt encodes the document.)
        self._kinds.clear()
        try:
            if nested:
                trial: Doc[Any] = Doc()
                trial.apply_update(self.doc.get_update())
                trial.apply_update(update)
            self.doc.apply_update(update)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise InvalidUpdate(f"{type(exc).__name__}: {exc}") from None
