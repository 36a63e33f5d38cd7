"""The record, as a package by capability: one module per concept.

A :class:`Record` is a run's document opened as one writer; a :class:`Replica` is a document
with crdtstore's bookkeeping and no I/O. Each is a stack of base classes, one module each; a
module imports only modules below it in this drawing (type-checking imports aside; checked by
tests/project/test_import_graph.py) and crdtstore's lower layers (``_journal``, ``_semantics``,
``_models``, ``_values``, ``_names``, ``_errors``, ``_leases``, ``_heap``, ``codec``,
``_counter_rules``)::

    _record         Record: lifecycle, declarations, collection handles, reads
      _foreign        foreign writes: apply_update, a ws:// client's appends (the hub's)
      _guarded        guarded, fenced, claimed writes; Claim
      _guarded_group  guarded writes waiting together, decided in one authority transaction
      _pipeline       the write pipeline: _stage -> _enqueue; transaction(), attributed()
      _journal_link   loading, the committer and the tail; flush(), sync(), commit_on_loop()
      _loop_commit    LoopCommit: the group commit on the event loop (a hub's commit policy)
      _changes        change streams and versions
      _policies       write policies and budgets
      _state          every attribute of a record, set in one place
    _view           View: the slice of a record a step sees, and its handles
    _fields         FieldMap: map entries merged field by field (merge="fields")
    _counter        CounterCollection: counter handles (their rules: ``_counter_rules``)
    _maps, _collections   handles; they use the record only through CollectionHost
    _replica        Replica
      _external       foreign updates and their effect (with _effects)
      _replay         journal entries applied (opening, compaction); tree_merge
      _bulk_load      BulkLoad: many entries applied at once, each key resolved once
      _document       the Doc, the registry, local transactions (the pycrdt fast path)
      _item_provenance  who brought each list item and text span (item id ranges)
        _text_ids       the exact item id of a text's character (block starts)
      _provenance     Meta and the provenance index
        _settled        its packed part: keys sorted in one byte string, positions in arrays
      _pycrdt         the one user of pycrdt's internals (off: CRDTSTORE_PYCRDT_INTERNALS=0)
    _textdiff       text_diff, apply_text_edits (pure)

Base classes, not components: a record's state stays one object, so the hot path reads it
without indirection. A process that journals other writers through one record (sync's
hub) does so through named extension points, not a subclass: ``apply_update(writer=...)``
and ``append_updates(...)`` (:mod:`._foreign`), ``commit_on_loop()`` (:mod:`._loop_commit`),
``reset_position()`` (:mod:`._journal_link`) and ``Store.notifier``.
"""

from ._bulk_load import BulkLoad as BulkLoad
from ._changes import ChangeStream as ChangeStream
from ._collections import CollectionHost as CollectionHost
from ._collections import ListCollection as ListCollection
from ._collections import TextCollection as TextCollection
from ._counter import CounterCollection as CounterCollection
from ._fields import FieldMap as FieldMap
from ._fields import KeepAllFieldMap as KeepAllFieldMap
from ._guarded import Claim as Claim
from ._loop_commit import LoopCommit as LoopCommit
from ._maps import KeepAllMap as KeepAllMap
from ._maps import MapCollection as MapCollection
from ._provenance import Writer as Writer
from ._record import Record as Record
from ._replay import tree_merge as tree_merge
from ._replica import Replica as Replica
from ._view import ScopedMap as ScopedMap
from ._view import View as View

__all__ = [
    "BulkLoad",
    "ChangeStream",
    "Claim",
    "CollectionHost",
    "FieldMap",
    "KeepAllFieldMap",
    "CounterCollection",
    "KeepAllMap",
    "LoopCommit",
    "ListCollection",
    "MapCollection",
    "Record",
    "Replica",
    "ScopedMap",
    "TextCollection",
    "View",
    "Writer",
    "tree_merge",
]
