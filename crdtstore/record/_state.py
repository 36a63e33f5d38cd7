"""The record's state, declared in one place, and what every capability checks first.

:class:`RecordState.__init__` sets every attribute of a :class:`~._record.Record`; each
capability module (see the package docstring) owns some of them and reads the others. The few
methods a lower capability calls on a higher one are declared here, for the type checker.
"""

from __future__ import annotations

from builtins import list as _List
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
from pydantic import BaseModel

from .._errors import InvalidValue, ReadOnlyAccess, StoreClosed
from .._journal import SOURCES, Durability, Op
from .._names import check_name
from .._semantics import Budget, CollectionSpec, coerce_schema
from ._provenance import Meta
from ._replica import Replica

if TYPE_CHECKING:
    from .._notify import Watch
    from .._store import Store
    from ._changes import _Subscriber
    from ._foreign import _FastAppend
    from ._guarded_group import _Waiting
    from ._loop_commit import CommitObserver, LoopCommit
    from ._maps import MapCollection

READ_CHUNK = 10_000
SYNC_FIRST = 256  # a sync's first read: it usually finds few entries, and a small read is
# served on the event loop by the SQLite backend (a worker thread costs ~100-200 us)


class RecordState:
    """The state of a record (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        run: str,
        agent: str,
        source: str = "model",
        *,
        durability: Durability | None = None,
        create: bool = True,
        schema: Mapping[str, CollectionSpec] | None = None,
        parent: str | None = None,
        salvage: bool = False,
        max_pending: int = 2_000,
    ) -> None:
        self.run = check_name("run", run)
        self.parent = None if parent is None else check_name("run", parent)
        self._jrun = self.run  # the run whose journal holds the record (the root run)
        self._origin = ""  # what entries of this record carry as their nested run
        self.agent = check_name("agent", agent)
        if source not in SOURCES:
            raise InvalidValue(f"source must be one of {sorted(SOURCES)}, not {source!r}")
        durability = durability or store.durability
        if durability not in ("durable", "batched"):
            raise InvalidValue(f"durability must be 'durable' or 'batched', not {durability!r}")
        self.source = source
        self.durability: Durability = durability
        self.tenant = store.tenant
        self._store = store
        self._backend = store._backend
        self._create = create
        self._salvage = salvage
        self._max_pending = max_pending
        self.replica = Replica(max_update=store.max_update)
        self._declare = coerce_schema(schema)
        self._specs: dict[str, CollectionSpec] = {}  # the run's declarations (enforced)
        self._models: dict[str, type[BaseModel]] = {}  # the declared models, by collection
        # the declared collections with a budget (a write to them is sized): a collection
        # handle asks before sizing a value with its model's plan (see crdtstore._model_plan)
        self._budgeted: frozenset[str] = frozenset()
        self._usage: dict[str, Budget] = {}  # budget totals of budgeted collections
        self._stamps: dict[str, int] = {}  # changes seen per collection (cache invalidation)
        self._tokens = 0
        self._collections: dict[tuple[str, str, Any], Any] = {}
        # (update, ops, meta) of local entries not yet journaled; entries are built at commit
        # (a single map set's ops are a 1-tuple of a tuple: see WritePipeline._stage)
        self._pending: deque[tuple[bytes, _List[Op], Meta]] = deque()
        self._written = 0  # local entries made
        self._committed = 0  # local entries journaled
        self._commit_event = anyio.Event()
        self._commit_waiters = 0
        self._pending_event = anyio.Event()
        self._committer_idle = False  # waiting on _pending_event (cheaper than is_set())
        # one journal append of this record at a time (taken without a checkpoint when free:
        # the committer takes it once per batch, and a flush waits for that)
        self._commit_lock = anyio.Lock(fast_acquire=True)
        # who journals the pending entries instead of the committer (Record.commit_on_loop)
        self._commit_policy: LoopCommit | None = None
        # called after each journal commit of this record (Record.observe_commits)
        self._commit_observer: CommitObserver | None = None
        self._failure: BaseException | None = None
        self._read_only: ReadOnlyAccess | None = None  # writes refused before any change
        # the backend attributes every write itself (ws://: the token's agent and source):
        # a source given to attributed() is not applied (the hub journals the token's)
        self._named_by_backend = False
        # journal positions of entries made on a scratch copy (remote guarded writes) that
        # are applied already: the tail must not apply them again (see _write_guarded_remote)
        self._applied_foreign: set[int] = set()
        # pending entries of other writers queued by _append_fast, by id() of their Meta:
        # (the append waiting for their positions, the entry's index in it, its client_id)
        self._fast: dict[int, tuple[_FastAppend, int, int]] = {}
        self.fast_appends = 0  # external appends journaled without an authority txn (tests)
        self.applied_seq = 0  # highest journal position this replica has taken in
        # guarded writes waiting for their group, whether one is under way, and the journal
        # positions an open group gave its entries, by id() of their Meta (_guarded_group)
        self._guard_queue: deque[_Waiting] = deque()
        self._guard_leading = False
        self._inflight: dict[int, int] = {}
        self._subscribers: _List[_Subscriber] = []
        self._txn_task: object | None = None  # the marker of the open transaction
        self._txn_ops: _List[Op] = []
        self._txn_meta: Meta | None = None
        self._txn_idle = anyio.Event()
        self._txn_idle.set()
        self._scope = anyio.CancelScope()
        self._stopped = anyio.Event()
        self._watch: Watch | None = None
        self._state = "new"

    def _check_open(self) -> None:
        if self._state != "open":
            raise StoreClosed("record", "new" if self._state == "new" else "closed")
        if self._failure is not None:
            raise self._failure

    def _check_writable(self) -> None:
        self._check_open()
        if self._read_only is not None:
            raise self._read_only

    if TYPE_CHECKING:  # implemented above (see the package docstring)

        async def flush(self) -> None: ...

        def map(self, name: str, *, model: type[BaseModel] | None = None) -> MapCollection: ...
