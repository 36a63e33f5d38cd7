"""crdtstore: one shared, journaled CRDT working record per run, for concurrent AI agents.

Quick use::

    import crdtstore

    async with crdtstore.open_store("sqlite:///runs/store.db") as store:
        async with store.open_record(run="r1", agent="planner", source="model") as rec:
            await rec.map("findings").set("f1", {"text": "the cache is cold"})
            await rec.list("log").append("looked at the cache")
            await rec.flush()

Synchronous callers use :mod:`crdtstore.blocking`.
"""

from ._errors import BackendError as BackendError
from ._errors import BudgetExceeded as BudgetExceeded
from ._errors import CollectionKindMismatch as CollectionKindMismatch
from ._errors import CrdtStoreError as CrdtStoreError
from ._errors import InvalidName as InvalidName
from ._errors import InvalidResource as InvalidResource
from ._errors import InvalidUpdate as InvalidUpdate
from ._errors import InvalidValue as InvalidValue
from ._errors import JournalCorrupt as JournalCorrupt
from ._errors import LeaseError as LeaseError
from ._errors import LeaseHeld as LeaseHeld
from ._errors import LeaseLost as LeaseLost
from ._errors import LeaseNotFound as LeaseNotFound
from ._errors import LeaseTimeout as LeaseTimeout
from ._errors import NestedTransaction as NestedTransaction
from ._errors import PayloadTooLarge as PayloadTooLarge
from ._errors import PolicyViolation as PolicyViolation
from ._errors import ReadOnlyAccess as ReadOnlyAccess
from ._errors import RunClosed as RunClosed
from ._errors import SchemaInvalid as SchemaInvalid
from ._errors import StaleVersion as StaleVersion
from ._errors import StoreClosed as StoreClosed
from ._errors import UnknownRun as UnknownRun
from ._errors import UnsupportedOperation as UnsupportedOperation
from ._errors import UnsupportedURL as UnsupportedURL
from ._journal import JournalBackend as JournalBackend
from ._journal import JournalEntry as JournalEntry
from ._journal import RunInfo as RunInfo
from ._leases import Lease as Lease
from ._leases import LeaseInfo as LeaseInfo
from ._leases import Leases as Leases
from ._leases import LeaseStatus as LeaseStatus
from ._models import Change as Change
from ._models import Conflict as Conflict
from ._models import HistoryEntry as HistoryEntry
from ._models import Provenance as Provenance
from ._models import Sibling as Sibling
from ._models import Span as Span
from ._models import Version as Version
from ._semantics import CollectionSpec as CollectionSpec
from ._semantics import check_effect as check_effect
from ._store import CompactionResult as CompactionResult
from ._store import Store as Store
from ._store import open_store as open_store
from .record._collections import ListCollection as ListCollection
from .record._collections import TextCollection as TextCollection
from .record._counter import CounterCollection as CounterCollection
from .record._fields import DELETE as DELETE
from .record._fields import FieldMap as FieldMap
from .record._fields import KeepAllFieldMap as KeepAllFieldMap
from .record._guarded import Claim as Claim
from .record._maps import KeepAllMap as KeepAllMap
from .record._maps import MapCollection as MapCollection
from .record._provenance import Writer as Writer
from .record._record import Record as Record
from .record._replay import tree_merge as tree_merge
from .record._replica import Replica as Replica
from .record._view import ScopedMap as ScopedMap
from .record._view import View as View

__version__ = "0.1.0.dev0"

__all__ = [
    "BackendError",
    "BudgetExceeded",
    "Change",
    "Claim",
    "CollectionKindMismatch",
    "CollectionSpec",
    "CompactionResult",
    "Conflict",
    "CounterCollection",
    "CrdtStoreError",
    "DELETE",
    "FieldMap",
    "HistoryEntry",
    "InvalidName",
    "InvalidResource",
    "InvalidUpdate",
    "InvalidValue",
    "JournalBackend",
    "JournalCorrupt",
    "JournalEntry",
    "KeepAllFieldMap",
    "KeepAllMap",
    "Lease",
    "LeaseError",
    "LeaseHeld",
    "LeaseInfo",
    "LeaseLost",
    "LeaseNotFound",
    "LeaseStatus",
    "LeaseTimeout",
    "Leases",
    "ListCollection",
    "MapCollection",
    "NestedTransaction",
    "PayloadTooLarge",
    "PolicyViolation",
    "Provenance",
    "ReadOnlyAccess",
    "Record",
    "Replica",
    "RunClosed",
    "RunInfo",
    "SchemaInvalid",
    "ScopedMap",
    "Sibling",
    "Span",
    "StaleVersion",
    "Store",
    "StoreClosed",
    "TextCollection",
    "UnknownRun",
    "UnsupportedOperation",
    "UnsupportedURL",
    "Version",
    "View",
    "Writer",
    "check_effect",
    "open_store",
    "tree_merge",
]
