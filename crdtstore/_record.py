"""The record: one run's CRDT document, opened as one writer, kept in step with the journal.

A :class:`Record` owns a :class:`~crdtstore._replica.Replica` and two background tasks:

- the *committer* appends local entries to the journal in the order they were made (group
  commit: whatever accumulated while the previous append ran goes in the next one);
- the *tail* applies entries other writers appended, in journal order, woken by the store's
  notifier (and by a slow poll, in case a wake-up was lost).

Reads are synchronous and local. Writes are ``async``: they apply to the local document at
once and then, in ``durable`` mode, wait for the journal commit; in ``batched`` mode they return
at once and :meth:`Record.flush` is the durability barrier.
"""

from __future__ import annotations

import contextlib
import logging
from builtins import list as _List
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar, Token
from time import time as _time
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskStatus
from pycrdt import merge_updates
from pydantic import BaseModel

from ._collections import KeepAllMap, ListCollection, MapCollection, TextCollection
from ._errors import (
    BackendError,
    CollectionKindMismatch,
    CrdtStoreError,
    InvalidValue,
    JournalCorrupt,
    LeaseHeld,
    LeaseLost,
    ReadOnlyAccess,
    RunClosed,
    StaleVersion,
    StoreClosed,
)
from ._heap import release_free_memory
from ._journal import (
    SOURCES,
    Authority,
    Durability,
    JournalEntry,
    NewEntry,
    Op,
    check_call,
    checksum,
)
from ._models import Change, HistoryEntry, Provenance, Version
from ._names import check_name
from ._semantics import (
    BYTES_PER_TOKEN,
    Budget,
    BudgetDelta,
    CollectionSpec,
    apply_budgets,
    budgeted,
    check_budget,
    check_effect,
    check_map_set,
    coerce_schema,
    measure,
    spec_from_declaration,
    value_size,
)
from ._values import from_stored
from .record._document import _EMPTY_UPDATES
from .record._effects import policed
from .record._provenance import Meta, now
from .record._replica import Replica

if TYPE_CHECKING:
    from ._leases import Lease
    from ._notify import Watch
    from ._store import Store
    from ._view import View

log = logging.getLogger("crdtstore.record")

READ_CHUNK = 10_000
# Opening reads the journal in smaller chunks: each chunk's decoded effects are garbage once
# applied, and 10,000 rows of them scattered the keys the index keeps over half-empty memory
# pools (100k keys resumed: 70 MiB RSS with 10,000-row chunks, 54 MiB with 1,000; same time).
LOAD_CHUNK = 1_000
_tuple_new = tuple.__new__
_DUPLICATE_WINDOW = 1_000  # entries searched for a retried external append
_ABSENT: Any = object()


class _Subscriber:
    __slots__ = ("event", "lost", "queue")

    def __init__(self, maxlen: int) -> None:
        self.queue: deque[Change] = deque(maxlen=maxlen)
        self.event = anyio.Event()
        self.lost = 0


class _FastAppend:
    """An append of :meth:`Record._append_fast` waiting for its entries' positions."""

    __slots__ = ("left", "seqs")

    def __init__(self, n: int) -> None:
        self.seqs = [0] * n  # the position of each entry once committed
        self.left = 0  # entries queued and not committed yet


class Record:
    """A run's record opened as one writer. Use as ``async with store.open_record(...)``.

    Args:
        store: the open store.
        run: the run name.
        agent: the writer's agent id (goes into provenance).
        source: the writer's source kind: ``tool``, ``model``, ``user`` or ``system``.
        durability: ``batched`` (writes return at once, :meth:`flush` waits for the journal)
            or ``durable`` (each write returns once journaled). Defaults to the store's.
        create: create the run if it does not exist (else :class:`UnknownRun`).

    Raises:
        InvalidName: a bad run or agent name (nothing is created).
        InvalidValue: an unknown source kind or durability.
    """

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
        self._usage: dict[str, Budget] = {}  # budget totals of budgeted collections
        self._stamps: dict[str, int] = {}  # changes seen per collection (cache invalidation)
        self._tokens = 0
        self._collections: dict[tuple[str, str, Any], Any] = {}
        # (update, ops, meta) of local entries not yet journaled; entries are built at commit
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

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> Record:
        """Load the record (snapshot + journal) and start syncing. Prefer ``async with``.

        The background tasks run in the store's task group, so records may be started and
        closed in any order, from any task of the store's event loop.
        """
        if self._state != "new":
            raise StoreClosed("record")
        self._store._check_open()
        info = await self._backend.ensure_run(
            self.tenant, self.run, create=self._create, parent=self.parent
        )
        identity = await self._backend.identity(self.tenant, self.run)
        if identity is not None:  # the backend names the writer (ws://: the token's agent)
            self.agent, self.source = identity
            self._named_by_backend = True
        if await self._backend.read_only(self.tenant, self.run):
            self._read_only = ReadOnlyAccess(self.tenant, self.run)
        # a nested run shares the record of its root run, under its own attribution
        seen = {info.run}
        while info.parent is not None:
            info = await self._backend.ensure_run(self.tenant, info.parent, create=False)
            if info.run in seen:
                raise InvalidValue(f"run {self.run!r} has a cycle of parents")
            seen.add(info.run)
        self._jrun = info.run
        self._origin = "" if self._jrun == self.run else self.run
        if self._create:  # opened to write: every run of the chain must be open
            for name in seen:
                row = await self._backend.get_run(self.tenant, name)
                if row is not None and row.state != "open":
                    raise RunClosed(self.tenant, name, row.state)
        await self._load_specs(self._declare)
        await self._load()
        self._watch = self._store._notifier.watch(self.tenant, self._jrun)
        self._stopped = anyio.Event()
        await self._store._spawn(self._background)
        self._state = "open"
        self._store._records.add(self)
        self._backend.attach(self.tenant, self._jrun, self)
        return self

    async def aclose(self) -> None:
        """Flush what was written and stop syncing. Idempotent; always closes."""
        if self._state != "open":
            self._state = "closed"
            return
        try:
            with anyio.CancelScope(shield=True):
                try:
                    await self.flush()
                except CrdtStoreError as exc:
                    log.error(
                        "record %s/%s closed with unjournaled writes (not journaled: %d): %s",
                        self.tenant,
                        self.run,
                        self._written - self._committed,
                        exc,
                    )
        finally:
            self._state = "closed"
            self._store._records.discard(self)
            self._backend.detach(self.tenant, self._jrun, self)
            if self._watch is not None:
                self._store._notifier.unwatch(self.tenant, self._jrun)
            for sub in self._subscribers:
                sub.event.set()
            self._scope.cancel()
            with anyio.CancelScope(shield=True):
                await self._stopped.wait()

    async def _background(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            with self._scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._committer)
                    tg.start_soon(self._tail)
                    task_status.started()
        except Exception as exc:  # a bug must not take the store's other records down
            log.exception("record %s/%s stopped syncing", self.tenant, self.run)
            self._failure = exc
        finally:
            self._stopped.set()

    async def __aenter__(self) -> Record:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _check_open(self) -> None:
        if self._state != "open":
            raise StoreClosed("record")
        if self._failure is not None:
            raise self._failure

    def _check_writable(self) -> None:
        self._check_open()
        if self._read_only is not None:
            raise self._read_only

    async def _load_specs(self, declare: Mapping[str, CollectionSpec]) -> None:
        for name, spec in declare.items():
            check_name("collection", name)
            spec.check_declarable(name)
        if declare:

            def merge(config: dict[str, Any]) -> dict[str, Any]:
                cols = dict(config.get("collections", {}))
                for name, spec in declare.items():
                    new = spec.declaration()
                    cur = cols.get(name)
                    if cur is None:
                        cols[name] = new
                    elif cur != new:
                        raise InvalidValue(
                            f"collection {name!r} is declared as {cur}; cannot redeclare as {new}"
                        )
                return {**config, "collections": cols}

            config = await self._backend.update_config(self.tenant, self._jrun, merge)
        else:
            config = await self._backend.get_config(self.tenant, self._jrun)
        specs = {n: spec_from_declaration(d) for n, d in config.get("collections", {}).items()}
        for name, spec in {**self._specs, **declare}.items():
            if spec.model is not None and name in specs:
                specs[name] = specs[name].model_copy(update={"model": spec.model})
        self._specs = specs
        self._models = {n: spec.model for n, spec in specs.items() if spec.model is not None}

    async def declare(self, name: str, spec: CollectionSpec) -> None:
        """Declare a collection's kind, policies, budgets and model for the whole run.

        The first declaration of a name wins and every writer enforces it; declaring it again
        identically is a no-op.

        Raises:
            InvalidName: a bad collection name.
            InvalidValue: declared differently already, or an inapplicable policy.
        """
        self._check_open()
        await self._load_specs({name: spec})

    def spec(self, name: str) -> CollectionSpec | None:
        """The run's declaration of collection ``name`` (None when undeclared: open)."""
        return self._specs.get(name)

    async def _load(self) -> None:
        snap = await self._backend.load_snapshot(self.tenant, self._jrun)
        if snap is not None:
            self.replica.apply_update(
                snap.update, trial_decode=False, size_limit=False
            )  # our own snapshot
            self.replica.import_state(snap.state)
            self.applied_seq = snap.seq
            del snap  # (its update and state: freed before the pages are given back)
            release_free_memory()
        # Entry by entry (apply_rows), not BulkLoad: a bulk load holds every pending key's
        # writes until it resolves them, which costs resident memory that stays with the
        # record (100k keys: 2.4x a raw doc instead of 1.9x, bench/memory.py).
        while True:
            rows = await self._backend.read(self.tenant, self._jrun, self.applied_seq, LOAD_CHUNK)
            if not rows:
                break
            self.replica.apply_rows(rows, self._jrun)
            self.applied_seq = rows[-1].seq
        # A skipped entry at the end of the journal is a torn tail: nothing depends on it. One
        # in the middle may be the left origin of later items, which yrs then keeps pending,
        # invisible: refuse to open with a silently partial record, unless asked to salvage.
        buried = [e for e in self.replica.skipped if e.seq < self.applied_seq]
        if buried and not self._salvage:
            raise JournalCorrupt(
                self._jrun,
                buried[0].seq,
                f"{len(buried)} damaged entr{'y' if len(buried) == 1 else 'ies'} followed by"
                " entries that may depend on them; open_record(..., salvage=True) opens what"
                " can be read",
            )

    # -- collections ----------------------------------------------------------------------------

    def map(self, name: str, *, model: type[BaseModel] | None = None) -> MapCollection:
        """The map collection ``name`` (created on first write).

        Args:
            model: validate every value against this pydantic model and read values back as
                its instances (defaults to the model of the run's declaration, if any).

        Raises:
            InvalidName: a bad collection name.
            CollectionKindMismatch: ``name`` is a list or a text.
        """
        return self._collection(name, "map", MapCollection, model)  # type: ignore[no-any-return]

    def list(self, name: str, *, model: type[BaseModel] | None = None) -> ListCollection:
        """The list collection ``name`` (created on first write). Arguments as :meth:`map`."""
        return self._collection(name, "list", ListCollection, model)  # type: ignore[no-any-return]

    def text(self, name: str) -> TextCollection:
        """The text collection ``name`` (created on first write). Raises as :meth:`map`."""
        return self._collection(name, "text", TextCollection, None)  # type: ignore[no-any-return]

    def _collection(
        self, name: str, kind: str, cls: Callable[..., Any], model: type[BaseModel] | None
    ) -> Any:
        got = self._collections.get((name, kind, model))
        if got is None:
            check_name("collection", name)
            spec = self._specs.get(name)
            if spec is not None and spec.kind != kind:
                raise CollectionKindMismatch(name, spec.kind, kind)
            root = self.replica.root(name, kind)
            if spec is not None and spec.conflict == "keep_all":
                cls = KeepAllMap
                self._stamps.setdefault(name, 0)
            got = self._collections[(name, kind, model)] = cls(self, name, root, model)
        return got

    @property
    def skipped(self) -> _List[Any]:
        """Corrupt journal entries (:class:`JournalCorrupt`) that were skipped, not applied."""
        return self.replica.skipped

    def view(self, paths: Iterable[str]) -> View:
        """The part of the record a step needs: ``"collection"``, ``"collection/key"`` or
        ``"collection/prefix*"`` paths. ``view.data()`` is that slice as JSON with
        provenance; ``view.map(name)`` and friends are handles that raise
        ``PolicyViolation`` for anything outside it.

        Raises:
            InvalidName: a bad collection name in a path.
        """
        from ._view import View

        return View(self, paths)

    @property
    def store(self) -> Store:
        """The store this record is open on (its leases, its other runs)."""
        return self._store

    def collections(self) -> dict[str, str]:
        """Every collection of the record: name -> kind (``map``, ``list``, ``text``)."""
        return self.replica.collections()

    def to_dict(self) -> dict[str, Any]:
        """A plain JSON-able snapshot of the whole record: ``{collection: value}``.

        ``keep_all`` maps show each key's value, or ``{"__conflict__": [siblings...]}``.
        """
        out = self.replica.to_dict()
        for name, spec in self._specs.items():
            if spec.conflict == "keep_all" and name in out:
                out[name] = self.map(name).to_json()  # type: ignore[attr-defined]
        return out

    # -- writing --------------------------------------------------------------------------------

    def transaction(self) -> _Transaction:
        """Group several writes into one journal entry (one update delta)::

            async with rec.transaction():
                await rec.map("a").set("x", 1)
                await rec.list("log").append("x set")

        Writes of other tasks wait until the transaction ends. There is no rollback (pycrdt
        has none): if the block raises, the writes made before the error stay and are
        journaled.
        """
        return _Transaction(self)

    def attributed(self, *, source: str | None = None, call: str | None = None) -> _Attributed:
        """Attribute the writes made to this record inside the block to a source kind other
        than the record's, and to a tool call, in their journal entries::

            with rec.attributed(source="tool", call="call_1"):
                await rec.map("m").set("k", 1)

        A synchronous context manager over a context variable: it applies to the writes
        that the current task (and the tasks it starts inside the block) makes to this
        record while the block is open, whatever their kind (map, list and text writes,
        guarded and fenced writes, :meth:`claim` and :meth:`Claim.complete`,
        :meth:`apply_update`); writes of other tasks, and of other records, are not
        affected. A transaction's single entry carries the attribution in effect when the
        transaction opened. A block nested in another one of the same record keeps what it
        does not give (``source`` or ``call``) from the outer one.

        ``call`` lands in each entry's ``call`` (``journal()``, ``history()`` as
        ``provenance.call``); ``source`` replaces the record's source kind in the entry and
        in the provenance of what it wrote. On a store that names the writer itself
        (``ws://``: the token's agent and source) ``source`` is not applied: the hub
        journals the token's; ``call`` is sent with the entry and journaled.

        Args:
            source: one of ``tool``, ``model``, ``user``, ``system`` (None: the record's).
            call: the tool-call id: a string of at most 256 characters, no NUL (None: the
                outer block's, else none).

        Raises:
            InvalidValue: an unknown source kind or a bad call id (nothing changes).
        """
        if source is not None and (type(source) is not str or source not in SOURCES):
            raise InvalidValue(f"source must be one of {sorted(SOURCES)}, not {source!r}")
        if call is not None:
            check_call(call)
        return _Attributed(self, source, call)

    def _new_meta(self, wall: float) -> Meta:
        """The provenance of an entry this record makes now (see :meth:`attributed`)."""
        attr = _ATTR.get()
        if attr is None:
            return Meta(self.agent, self.source, wall, None, self._origin)
        return self._attributed_meta(wall, attr)

    def _attributed_meta(self, wall: float, attr: dict[Record, tuple[str | None, str]]) -> Meta:
        got = attr.get(self)
        if got is None:  # a block of another record
            return Meta(self.agent, self.source, wall, None, self._origin)
        source, call = got
        if source is None or self._named_by_backend:
            source = self.source
        return Meta(self.agent, source, wall, None, self._origin, call)

    async def _write(self, ops: _List[Op], apply: Callable[[], None]) -> None:
        """Apply a validated local write and queue its journal entry."""
        if self._state != "open" or self._failure is not None or self._read_only is not None:
            self._check_writable()
        if self._txn_task is not None:
            if _TXN.get() is self._txn_task:
                txn_meta = self._txn_meta
                assert txn_meta is not None
                if self._specs:
                    usage = self._enforce(ops, conditional=False)
                    self.replica.do(ops, apply, txn_meta)
                    self._txn_ops.extend(ops)
                    self._account(usage)
                else:
                    self.replica.do(ops, apply, txn_meta)
                    self._txn_ops.extend(ops)
                return
            while self._txn_task is not None:
                await self._txn_idle.wait()
            self._check_open()
        if self._write_now(ops, apply):
            await self._after_write()

    def _write_now(
        self, ops: _List[Op], apply: Callable[[], None] | None, root: Any = None
    ) -> bool:
        """The synchronous part of a write outside a transaction (callers check that
        ``_txn_task`` is None): check, apply, queue the journal entry. Return whether the
        caller must ``await self._after_write()`` (durable mode, or a full queue).

        A collection's write calls this directly when no transaction is open, which saves
        the ``_write`` coroutine on the hot path. ``apply`` None: ``ops`` is one map set
        and ``root`` that map's root (:meth:`Replica.local_set` applies it)."""
        if self._state != "open" or self._failure is not None or self._read_only is not None:
            self._check_writable()
        # Policies and budgets are checked before the document is touched (no rollback).
        usage = self._enforce(ops, conditional=False) if self._specs else None
        # tuple.__new__ skips the namedtuple's Python-level __new__ (a third of a write's
        # bookkeeping on this path)
        attr = _ATTR.get()  # (one context variable read per write: ~50 ns)
        if attr is None:
            meta: Meta = _tuple_new(
                Meta, (self.agent, self.source, _time(), None, self._origin, "")
            )
        else:
            meta = self._attributed_meta(_time(), attr)
        replica = self.replica
        try:
            if apply is None:
                update = replica.local_set(root, ops, meta)
            else:
                update = replica.local(ops, apply, meta)
        except BaseException:
            partial, replica.partial_update = replica.partial_update, None
            if partial is not None:
                self._enqueue(partial, ops, meta)
            raise
        pending = self._pending
        if update is not None:
            if self._stamps or self._subscribers:
                self._enqueue(update, ops, meta)
            else:  # _enqueue's work, inlined for the usual case
                pending.append((update, ops, meta))
                self._written += 1
                if self._committer_idle:
                    self._committer_idle = False
                    self._pending_event.set()
        if usage is not None:
            apply_budgets(usage)
        return self.durability == "durable" or len(pending) > self._max_pending

    def _set_in_txn(self, root: Any, op: Op) -> bool:
        """One map set ``op`` (``["map", name, "set", key, stored]`` on ``root``) inside the
        running task's open transaction: :meth:`_write`'s transaction branch without its
        coroutine. Return False, doing nothing, when the open transaction is another task's
        (the caller then awaits :meth:`_write`, which waits for it to end)."""
        if _TXN.get() is not self._txn_task:
            return False
        if self._state != "open" or self._failure is not None or self._read_only is not None:
            self._check_writable()
        txn_meta = self._txn_meta
        assert txn_meta is not None
        if self._specs:
            usage = self._enforce([op], conditional=False)
            self.replica.do_set(root, op[1], op[3], op[4], txn_meta)
            self._txn_ops.append(op)
            self._account(usage)
        else:
            self.replica.do_set(root, op[1], op[3], op[4], txn_meta)
            self._txn_ops.append(op)
        return True

    # -- policies, budgets, versions ------------------------------------------------------------

    def exists(self, collection: str, key: str) -> bool:
        """StateView: whether map ``collection`` has ``key`` now."""
        usage = self._usage.get(collection)
        if usage is not None and usage.sizes is not None:
            return key in usage.sizes  # a budgeted map's sizes: no read transaction
        return key in self.replica.root(collection, "map")

    def owner(self, collection: str, key: str) -> str | None:
        """StateView: the agent that created the entry. Under the owner policy only the creator
        can change an entry, so the writer of the current value is the creator."""
        return self.replica.agent_of(collection, key)

    def length(self, collection: str, kind: str) -> int:
        """StateView: entries of a list, characters of a text."""
        root = self.replica.root(collection, kind)
        return len(str(root)) if kind == "text" else len(root)

    def _enforce(self, ops: _List[Op], *, conditional: bool) -> _List[BudgetDelta] | None:
        """Run the write policies and budgets over a write's effect; return the budget deltas
        to account once it is applied (None when no budgeted collection is touched)."""
        specs = self._specs
        if len(ops) == 1:  # the usual write: one op, one collection
            op = ops[0]
            name = op[1]
            spec = specs.get(name)
            if spec is None:  # undeclared: open, no budget
                return None
            usage = self._usage.get(name)  # only budgeted collections are there
            policy = spec.policy
            if policy != "open":
                if op[0] == "map" and op[2] == "set" and policy in ("owner", "append_only"):
                    # the usual checks inline; check_effect decides (and words) any refusal
                    key = op[3]
                    sizes = None if usage is None else usage.sizes
                    if key in sizes if sizes is not None else self.exists(name, key):
                        owner = self.replica.agent_of(name, key) if policy == "owner" else None
                        if policy == "append_only" or (owner is not None and owner != self.agent):
                            check_effect(specs, ops, self.agent, self, conditional=conditional)
                else:
                    check_effect(specs, ops, self.agent, self, conditional=conditional)
            if usage is None:
                if not budgeted(spec):
                    return None
                usage = self._usage_of(name, spec.kind)
            if usage.sizes is not None:
                if op[0] == "map" and op[2] == "set":
                    return [check_map_set(spec, name, usage, op[3], op[4])]
                return [check_budget(spec, name, usage, ops)]
            removed_bytes, removed_entries = self._removed(name, spec.kind, ops)
            return [check_budget(spec, name, usage, ops, removed_bytes, removed_entries)]
        check_effect(specs, ops, self.agent, self, conditional=conditional)
        out: _List[BudgetDelta] | None = None
        for name in (ops[0][1],) if len(ops) == 1 else dict.fromkeys(op[1] for op in ops):
            usage = self._usage.get(name)  # only budgeted collections are there
            if usage is None:
                spec = specs.get(name)
                if spec is None or not budgeted(spec):
                    continue
                usage = self._usage_of(name, spec.kind)
            else:
                spec = specs[name]
            if usage.sizes is not None:  # a map: what the write replaces is in the sizes
                delta = check_budget(spec, name, usage, ops)
            else:
                removed_bytes, removed_entries = self._removed(name, spec.kind, ops)
                delta = check_budget(spec, name, usage, ops, removed_bytes, removed_entries)
            if out is None:
                out = [delta]
            else:
                out.append(delta)
        return out

    @staticmethod
    def _account(usage: _List[BudgetDelta] | None) -> None:
        if usage:
            apply_budgets(usage)

    def _usage_of(self, name: str, kind: str) -> Budget:
        usage = self._usage.get(name)
        if usage is None:
            usage = self._usage[name] = measure(kind, self.replica.root(name, kind))
        return usage

    def _removed(self, name: str, kind: str, ops: _List[Op]) -> tuple[int, int]:
        """Bytes and entries that the deletes of ``ops`` remove from a list or a text (a map's
        are counted from its budget's per-key sizes, see ``check_budget``)."""
        root = self.replica.root(name, kind)
        nbytes = entries = 0
        for op in ops:
            if op[1] != name or op[2] != "del":
                continue
            if kind == "list":
                for v in root[op[3] : op[3] + op[4]]:
                    nbytes += value_size(v)
                entries += op[4]
            elif kind == "text":
                nbytes += len(str(root)[op[3] : op[3] + op[4]].encode())
        return nbytes, entries

    def size(self) -> dict[str, dict[str, int]]:
        """Entries, bytes (values as compact JSON) and estimated model tokens per collection,
        plus a ``"*"`` total, so a summariser can be scheduled before a budget is reached.

        A budgeted collection reports the running totals its budget is checked against (kept
        up to date by every write); the others are measured now, O(size)."""
        out: dict[str, dict[str, int]] = {}
        total = Budget(0, 0)
        kinds: dict[str, str] = {name: spec.kind for name, spec in self._specs.items()}
        kinds.update(self.replica.collections())
        for name, kind in sorted(kinds.items()):
            spec = self._specs.get(name)
            if spec is not None and spec.kind == kind and budgeted(spec):
                b = self._usage_of(name, kind)
            else:
                b = measure(kind, self.replica.root(name, kind))
            total.entries += b.entries
            total.bytes += b.bytes
            out[name] = {
                "entries": b.entries,
                "bytes": b.bytes,
                "tokens": -(-b.bytes // BYTES_PER_TOKEN),
            }
        out["*"] = {
            "entries": total.entries,
            "bytes": total.bytes,
            "tokens": -(-total.bytes // BYTES_PER_TOKEN),
        }
        return out

    def version(self, collection: str, key: str) -> int | None:
        """The version of ``collection[key]``: the journal position of the write that made
        its current value (0 if never written; None while that write is not journaled yet,
        call :meth:`flush` first)."""
        meta = self.replica.meta(collection, key)
        return 0 if meta is None else meta.seq

    def current_version(self, collection: str | None = None) -> Version:
        """The version of the whole record (``collection=None``) or of one collection, as this
        replica knows it now. Pass it as ``based_on`` to refuse acting on a stale view."""
        if collection is None:
            return Version(scope="*", seq=max(self.replica.head, self.applied_seq))
        check_name("collection", collection)
        return Version(scope=collection, seq=self.replica.coll_seq.get(collection, 0))

    async def changes_since(self, version: Version | int) -> _List[Change]:
        """What changed after ``version`` (a :class:`Version` or a journal position): one
        :class:`Change` per collection per journal entry, oldest first, filtered to the
        version's collection when it has one. Flushes this record's writes first."""
        self._check_open()
        await self.flush()
        seq = version if isinstance(version, int) else version.seq
        scope = "*" if isinstance(version, int) else version.scope
        out: _List[Change] = []
        while True:
            rows = await self._backend.read(self.tenant, self._jrun, seq, READ_CHUNK)
            if not rows:
                return out
            for row in rows:
                own = row.client_id == self.replica.client_id
                for change in self._changes_of(row.effect, row.agent, row.source, row.seq, own):
                    if scope in ("*", change.collection):
                        out.append(change)
            seq = rows[-1].seq

    def _scope_seq(
        self, scope: str, batch: _List[tuple[bytes, _List[Op], Meta]], seqs: _List[int]
    ) -> int:
        if scope == "*":
            return max([self.replica.head, self.applied_seq, *seqs])
        best = self.replica.coll_seq.get(scope, 0)
        for (_, ops, _), seq in zip(batch, seqs, strict=True):
            if any(op[1] == scope for op in ops):
                best = max(best, seq)
        return best

    async def _write_guarded(
        self,
        name: str,
        key: str,
        expected: int | None,
        ops: _List[Op],
        apply: Callable[[], None],
        current: Callable[[], Any],
        based_on: Version | None = None,
        fence: tuple[Lease, str] | None = None,
    ) -> int:
        """A conditional write, serialised by the store's authority: apply every entry not yet
        seen, check that ``name[key]`` is still at version ``expected``, then apply and
        journal the write, all inside one exclusive journal transaction."""
        if self._state != "open" or self._failure is not None or self._read_only is not None:
            self._check_writable()
        if expected is not None and (type(expected) is not int or expected < 0):
            raise InvalidValue(f"expected_version must be an int >= 0, not {expected!r}")
        if based_on is not None and not isinstance(based_on, Version):
            raise InvalidValue("based_on must be a Version (rec.current_version(...))")
        while self._txn_task is not None:
            if _TXN.get() is self._txn_task:
                raise InvalidValue("a guarded write cannot be part of rec.transaction()")
            await self._txn_idle.wait()
        if self._backend.remote:
            return await self._write_guarded_remote(name, key, expected, ops, based_on, fence)
        meta: Meta | None = None
        update: bytes | None = None
        journaled = False
        async with self._commit_lock:
            try:
                async with self._backend.authority(self.tenant, self._jrun, durable=True) as auth:
                    # what others journaled is taken in before our own earlier writes are
                    # appended: a refusal below rolls that append back, and the journal
                    # position must never pass an entry that is then not there (its
                    # position is given to the next entry, which would be skipped)
                    rows = await auth.read(self.applied_seq)
                    if rows:
                        await self._apply_remote(rows)
                    # our own earlier writes go first: the journal order stays causal
                    batch = list(self._pending)
                    seqs = await auth.append(self._entries(batch)) if batch else []
                    if fence is not None:
                        await self._check_fence(auth, *fence)
                    version = self._version_with(name, key, batch, seqs)
                    if expected is not None and version != expected:
                        raise StaleVersion(name, key, expected, version, current())
                    if based_on is not None:
                        now_seq = self._scope_seq(based_on.scope, batch, seqs)
                        if now_seq != based_on.seq:
                            scope = None if based_on.scope == "*" else based_on.scope
                            raise StaleVersion(scope or "*", None, based_on.seq, now_seq)
                    usage = self._enforce(ops, conditional=True) if self._specs else None
                    meta = self._new_meta(_time())
                    try:
                        update = self.replica.local(ops, apply, meta)
                    except BaseException:
                        update, self.replica.partial_update = self.replica.partial_update, None
                        raise
                    finally:
                        self._account(usage)
                    own = await auth.append(self._entries([(update, ops, meta)])) if update else []
                    journaled = True
            except BaseException:
                if update is not None and meta is not None and not journaled:
                    # applied to the document but not journaled: keep it for the committer
                    self._enqueue(update, ops, meta)
                raise
            if batch:
                self._mark_committed(batch, seqs)
            if update is None or meta is None:
                return version or 0
            self._written += 1
            self._mark_committed_guarded(ops, meta, own[0])
            if self._subscribers:
                self._emit(ops, meta.agent, meta.source, own[0], local=True)
            return own[0]

    async def _write_guarded_remote(
        self,
        name: str,
        key: str,
        expected: int | None,
        ops: _List[Op],
        based_on: Version | None,
        fence: tuple[Lease, str] | None,
    ) -> int:
        """:meth:`_write_guarded` for a journal behind a server (``backend.remote``): no
        transaction can be held there, so the write is made on a scratch copy of the document
        (a fresh client id: it cannot clash with local writes made meanwhile) and sent with
        its guard; the server checks the guard and journals it (``append_guarded``), and
        only then is it applied here, with the journal position the server gave it. A
        refused write (``StaleVersion``, ``LeaseLost``, ...) changes nothing here. The entry
        carries the scratch copy's client id, so if the answer is lost the tail applies it
        like any other writer's entry; when the answer comes, the tail skips it.

        Guarded writes are map sets and deletes: ``ops`` says all there is to apply."""
        await self.flush()  # our earlier writes go first: the journal order stays causal
        async with self._commit_lock:
            usage = self._enforce(ops, conditional=True) if self._specs else None
            scratch = Replica(max_update=self.replica.max_update)
            scratch.apply_update(
                self.replica.doc.get_update(), trial_decode=False, size_limit=False
            )

            def apply() -> None:
                for op in ops:
                    root = scratch.root(op[1], "map")
                    if op[2] == "set":
                        root[op[3]] = op[4]
                    elif op[3] in root:
                        del root[op[3]]

            meta = self._new_meta(_time())
            update = scratch.local(ops, apply, meta)
            guard: dict[str, Any] = {}
            if expected is not None:
                guard["expected"] = (name, key, expected)
            if based_on is not None:
                guard["based_on"] = (based_on.scope, based_on.seq)
            if fence is not None:
                guard["fence"] = (fence[0].lease_id, fence[0].token, fence[1])
            empty = b"\x00\x00"  # nothing to change: the server only checks the guard
            entry = scratch.entry(
                meta.agent, meta.source, update or empty, ops, meta.wall_time, call=meta.call
            )
            try:
                seq: int = await self._backend.append_guarded(  # type: ignore[attr-defined]
                    self.tenant, self._jrun, entry, **guard
                )
            except StaleVersion as exc:
                await self._adopt_version(exc)
                raise
            if update is None:
                return seq
            while self._txn_task is not None:  # never mix it into a local transaction
                await self._txn_idle.wait()
            self._invalidate_all()
            self.replica.apply_external(update, meta)
            self._account(usage)
            if seq > self.applied_seq:  # the tail would apply it again, as a foreign entry
                self._applied_foreign.add(seq)
            self._written += 1
            self._mark_committed_guarded(ops, meta, seq)
            if self._subscribers:
                self._emit(ops, meta.agent, meta.source, seq, local=True)
            return seq

    async def _adopt_version(self, exc: StaleVersion) -> None:
        """A server refused a guarded write as stale although this replica holds the value
        it says is current: two entries left that same value (or both deleted the key), and
        this replica names the other one. The server's entry is the version everyone checks
        against, so name it here too; a retry that reads ``get_versioned`` again then
        succeeds instead of being refused forever."""
        name, key, current = exc.collection, exc.key, exc.current_version
        if key is None or type(current) is not int or self.version(name, key) == current:
            return
        if self._current_value(name, key) != exc.current_value:
            return  # this replica lags behind: its tail brings the newer entry
        try:
            rows = await self._backend.history(self.tenant, self._jrun, name, key)
        except CrdtStoreError:
            return
        for row in rows:
            if row.seq == current:
                self.replica.adopt(
                    name, key, current, row.agent, row.source, row.wall_time, row.origin
                )
                return

    async def _append_external(
        self,
        update: bytes,
        *,
        client_id: int,
        durable: bool = True,
        expected: tuple[str, str, int] | None = None,
        based_on: tuple[str, int] | None = None,
        fence: tuple[str, int, str] | None = None,
        call: str = "",
    ) -> int:
        """:meth:`_append_externals` of one update: its journal position."""
        (seq,) = await self._append_externals(
            [update],
            client_id=client_id,
            durable=durable,
            expected=expected,
            based_on=based_on,
            fence=fence,
            calls=[call],
        )
        return seq

    async def _append_externals(
        self,
        updates: Sequence[bytes],
        *,
        client_id: int,
        durable: bool = True,
        expected: tuple[str, str, int] | None = None,
        based_on: tuple[str, int] | None = None,
        fence: tuple[str, int, str] | None = None,
        calls: Sequence[str] | None = None,
    ) -> _List[int]:
        """Apply and journal update bytes made by another writer (a ``ws://`` client whose
        entries the hub journals), one entry each, as this record's agent; return their
        journal positions. ``calls`` (one per update, or None) are the tool-call ids the
        entries carry (the writer's say-so: a label, as ``client_id``; checked with
        :func:`~crdtstore._journal.check_call`).

        Like :meth:`_write_guarded`, inside one authority transaction: our pending entries
        go first, entries not seen yet are applied, then the guards are checked
        (``expected``: (collection, key, version); ``based_on``: (scope, seq); ``fence``:
        (lease id, token, resource)), the effect of each update is derived here and checked
        against the run's policies and budgets (all of them before any is applied), and the
        entries are appended, labelled with the writer's ``client_id`` (so that it can skip
        its own entries when tailing).

        Idempotent: bytes that add nothing to the document and are already journaled (a
        retry whose answer was lost) are not journaled again; the position of the entry
        that holds them is returned.

        **Unguarded appends take a fast path** (:meth:`_append_fast`): no authority
        transaction; the entries are applied at once and journaled as this record's own
        pending entries are (its group commit), labelled with ``client_id``, and the
        positions are returned once they are committed.

        Raises:
            InvalidUpdate, PayloadTooLarge: bad bytes (nothing changes).
            InvalidValue: a bad call id, or not one per update (nothing changes).
            StaleVersion, LeaseLost: a guard failed (nothing changes).
            PolicyViolation, BudgetExceeded: an effect is refused (nothing changes).
            BackendError: the journal could not be written (unguarded: the entries stay
                applied and queued, and are journaled once the journal recovers; a retry of
                the append journals nothing twice).
        """
        self._check_open()
        if calls is not None:
            if len(calls) != len(updates):
                raise InvalidValue(f"{len(calls)} call ids for {len(updates)} updates")
            for call in calls:
                check_call(call)
            if not any(calls):
                calls = None
        for update in updates:
            self.replica.check_update(update)
        if expected is None and based_on is None and fence is None:
            fast = await self._append_fast(updates, client_id, durable, calls)
            if fast is not None:
                return fast
        return await self._append_slow(
            updates,
            client_id=client_id,
            durable=durable,
            expected=expected,
            based_on=based_on,
            fence=fence,
            calls=calls,
        )

    async def _append_fast(
        self,
        updates: Sequence[bytes],
        client_id: int,
        durable: bool,
        calls: Sequence[str] | None = None,
    ) -> _List[int] | None:
        """An unguarded :meth:`_append_externals` as a local write: None if it cannot be
        taken (nothing done then; the caller takes the authority path).

        As :meth:`_apply_checked` writes: the effects are checked against the run's policies
        and budgets as this replica knows them (no catch-up read: its tail keeps it current;
        all updates on a scratch copy first), each update is applied and queued as a pending
        entry of this record, labelled with ``client_id`` (see :meth:`_entries`), which the
        record's commit (the committer, or a subclass's group commit) journals in order with
        its other pending entries. Returns their positions once they are committed; a failing
        commit raises its error (the entries stay queued: the committer retries them).
        Not taken: a ``durable`` append to a ``batched`` record, an open transaction, a
        journal failure being retried, a closed record. An update that adds nothing (a retry
        whose answer was lost) and the ones after it go through :meth:`_append_slow`, which
        finds the entry holding it (after journaling what is pending).
        """
        if (
            (durable and self.durability != "durable")
            or self._txn_task is not None
            or self._failure is not None
            or self._state != "open"
        ):
            return None
        if self._enforcing():
            scratch = self.replica.trial_copy()
            try:
                for update in updates:  # in order, each on top of the ones before
                    ops = policed(scratch.apply_external(update, checked=True)[0])
                    self._account(self._enforce(ops, conditional=False))
            finally:
                self._invalidate_all()  # budgets are measured again from the document
        wait = _FastAppend(len(updates))
        rest: _List[int] = []
        for i, update in enumerate(updates):
            if update in _EMPTY_UPDATES:  # nothing to journal (as _append_slow answers)
                wait.seqs[i] = 0
                continue
            call = "" if calls is None else calls[i]
            meta = Meta(self.agent, self.source, _time(), None, self._origin, call)
            before = self.replica.doc.get_state()
            self._invalidate_all()
            ops, delta = self.replica.apply_external(update, meta, checked=True)
            if delta is None and self.replica.doc.get_state() == before:
                # held already: a retry (its entry may be pending, or journaled) or bytes of
                # another writer; the authority path journals the queue and looks it up
                rest = await self._append_slow(
                    updates[i:],
                    client_id=client_id,
                    durable=durable,
                    calls=None if calls is None else calls[i:],
                )
                del wait.seqs[i:]
                break
            self._fast[id(meta)] = (wait, i, client_id)
            wait.left += 1
            self._enqueue(update, ops, meta)
        if wait.left:
            self.fast_appends += 1
        while wait.left:
            if self._failure is not None:
                raise self._failure
            if self._state == "closed":
                raise StoreClosed("record")
            await self._commit_wait()
        return wait.seqs + rest

    async def _append_slow(
        self,
        updates: Sequence[bytes],
        *,
        client_id: int,
        durable: bool = True,
        expected: tuple[str, str, int] | None = None,
        based_on: tuple[str, int] | None = None,
        fence: tuple[str, int, str] | None = None,
        calls: Sequence[str] | None = None,
    ) -> _List[int]:
        """:meth:`_append_externals` inside one authority transaction (its checks done)."""
        if expected is not None:
            name, key, version = expected
            check_name("collection", name)
            if type(version) is not int or version < 0:
                raise InvalidValue(f"expected_version must be an int >= 0, not {version!r}")
        while self._txn_task is not None:
            await self._txn_idle.wait()
        out: _List[int] = []
        done: _List[tuple[_List[Op], Meta, int]] = []
        async with (
            self._commit_lock,
            self._backend.authority(self.tenant, self._jrun, durable=durable) as auth,
        ):
            rows = await auth.read(self.applied_seq)  # first: see _write_guarded
            if rows:
                await self._apply_remote(rows)
            batch = list(self._pending)
            seqs = await auth.append(self._entries(batch)) if batch else []
            if fence is not None:
                await self._check_fence_ids(auth, *fence)
            if expected is not None:
                name, key, version = expected
                now_version = self._version_with(name, key, batch, seqs)
                if now_version != version:
                    raise StaleVersion(
                        name, key, version, now_version, self._current_value(name, key)
                    )
            if based_on is not None:
                now_seq = self._scope_seq(based_on[0], batch, seqs)
                if now_seq != based_on[1]:
                    raise StaleVersion(based_on[0], None, based_on[1], now_seq)
            if self._enforcing():
                guarded = expected is not None or based_on is not None or fence is not None
                scratch = self.replica.trial_copy()
                try:
                    for update in updates:  # in order, each on top of the ones before
                        ops = policed(scratch.apply_external(update, checked=True)[0])
                        self._account(self._enforce(ops, conditional=guarded))
                finally:
                    self._invalidate_all()  # budgets are measured again from the document
            for i, update in enumerate(updates):
                if update in _EMPTY_UPDATES:  # a guarded write that changes nothing
                    found = 0
                    if expected is not None:
                        found = self._version_with(expected[0], expected[1], batch, seqs) or 0
                    out.append(found)
                    continue
                call = "" if calls is None else calls[i]
                meta = Meta(self.agent, self.source, _time(), None, self._origin, call)
                before = self.replica.doc.get_state()
                self._invalidate_all()
                ops, delta = self.replica.apply_external(update, meta, checked=True)
                if delta is None and self.replica.doc.get_state() == before:
                    seq = await self._journaled_seq(auth, update, client_id)
                    if seq is not None:
                        out.append(seq)
                        continue
                entry = NewEntry(
                    meta.agent,
                    meta.source,
                    client_id,
                    meta.wall_time,
                    update,
                    ops,
                    checksum(update),
                    self._origin,
                    call,
                )
                (seq,) = await auth.append([entry])
                out.append(seq)
                done.append((ops, meta, seq))
        if batch:
            self._mark_committed(batch, seqs)
        for ops, meta, seq in done:
            self._written += 1
            self._mark_committed_guarded(ops, meta, seq)
            if self._subscribers:
                self._emit(ops, meta.agent, meta.source, seq, local=True)
        return out

    async def _journaled_seq(self, auth: Authority, update: bytes, client_id: int) -> int | None:
        """The position of a recent entry of ``client_id`` holding exactly ``update``."""
        start = max(0, self.applied_seq - _DUPLICATE_WINDOW)
        crc = checksum(update)
        for row in reversed(await auth.read(start)):
            if row.client_id == client_id and row.checksum == crc and row.update == update:
                return row.seq
        return None

    def _enforcing(self) -> bool:
        return any(
            spec.policy != "open"
            or spec.max_entries is not None
            or spec.max_bytes is not None
            or spec.max_value_bytes is not None
            for spec in self._specs.values()
        )

    def _current_value(self, name: str, key: str) -> Any:
        try:
            value = self.replica.root(name, "map").get(key)
        except CollectionKindMismatch:
            return None
        return from_stored(value)

    async def _check_fence(self, auth: Authority, lease: Lease, resource: str) -> None:
        """The lease fencing check, inside the authority transaction of the write it guards:
        the lease must still be granted, cover ``resource`` and hold the newest token."""
        await self._check_fence_ids(auth, lease.lease_id, lease.token, resource)

    async def _check_fence_ids(
        self, auth: Authority, lease_id: str, token: int, resource: str
    ) -> None:
        from ._leases import SQLiteLeases, check_fence

        backend = self._store.leases.backend
        tenant = self.tenant
        if isinstance(backend, SQLiteLeases):
            clock = backend.clock
            await auth.run_sync(
                lambda db: check_fence(db, lease_id, resource, token, tenant=tenant, clock=clock)
            )
        else:
            await backend.check(tenant, lease_id, resource, token)

    def fenced_resource(self, collection: str, key: str, lease: Lease) -> str:
        """The resource a fenced write of ``collection[key]`` is checked against: the key as a
        repo path if the lease covers it, else the work item ``item:<collection>/<key>``.

        Raises:
            LeaseLost: the lease covers neither.
        """
        from ._leases import canonical_resource, item_resource

        candidates = []
        with contextlib.suppress(CrdtStoreError):
            candidates.append(canonical_resource(key))
        with contextlib.suppress(CrdtStoreError):
            candidates.append(item_resource(collection, key))
        for res in candidates:
            if res in lease.resources:
                return res
        raise LeaseLost(key, f"the lease covers {list(lease.resources)}, not this key")

    async def claim(
        self,
        collection: str,
        item_id: str,
        *,
        ttl: float = 30.0,
        wait: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - withdraws the request: LeaseTimeout
    ) -> Claim:
        """Take the work item ``collection/item_id`` for this agent: a lease on
        ``item:<collection>/<item_id>`` plus a fenced entry in the map ``claims`` (key
        ``<collection>/<item_id>``: claimer, token, time, state) that every agent sees.

        Raises:
            LeaseHeld: someone else holds it (and ``wait`` is False), or it is already done;
                names the holder (or who completed it).
            LeaseTimeout: waited past ``timeout``.
            InvalidResource: a bad collection or item id.
        """
        from ._leases import item_resource

        self._check_open()
        check_name("collection", collection)
        resource = item_resource(collection, item_id)
        lease = self._store.lease([resource], ttl=ttl, owner=self.agent, wait=wait, timeout=timeout)
        await lease.acquire()
        claim = Claim(self, collection, item_id, lease)
        try:
            # a holder writes "done" before it releases: with the lease ours, a sync shows it
            await self.sync()
            prior = self.map("claims").get(claim.key)
            if isinstance(prior, dict) and prior.get("state") == "done":
                raise LeaseHeld(resource, str(prior.get("claimer")), prior.get("token"))
            await claim._record("claimed")
        except BaseException:
            with anyio.CancelScope(shield=True):
                await lease.release()
            raise
        return claim

    def _mark_committed_guarded(self, ops: _List[Op], meta: Meta, seq: int) -> None:
        self.replica.journaled(ops, meta, seq)
        self._committed += 1
        self._fire_commit()
        self._store._notifier.notify(self.tenant, self._jrun, seq)

    def _version_with(
        self,
        name: str,
        key: str,
        batch: _List[tuple[bytes, _List[Op], Meta]],
        seqs: _List[int],
    ) -> int | None:
        meta = self.replica.meta(name, key)
        if meta is None:
            return 0
        if meta.seq is not None:
            return meta.seq
        for (_, _, m), seq in zip(batch, seqs, strict=True):
            if m is meta:
                return seq
        return None

    def _invalidate_all(self) -> None:
        self._usage.clear()
        for name in self._stamps:
            self._stamps[name] += 1

    def _stamp(self, name: str) -> int:
        return self._stamps.get(name, 0)

    def _next_token(self) -> int:
        self._tokens += 1
        return self._tokens

    def _enqueue(self, update: bytes, ops: _List[Op], meta: Meta) -> None:
        if self._stamps:
            for op in ops:
                self._stamps[op[1]] = self._stamps.get(op[1], 0) + 1
        self._pending.append((update, ops, meta))
        self._written += 1
        if self._committer_idle:
            self._committer_idle = False
            self._pending_event.set()
        if self._subscribers:
            self._emit(ops, meta.agent, meta.source, None, local=True)

    async def _after_write(self) -> None:
        if self.durability == "durable":
            await self._wait_committed(self._written)
        elif len(self._pending) > self._max_pending:
            # backpressure: a writer far ahead of the journal waits for it
            await self._wait_committed(self._written - self._max_pending // 2)

    async def _wait_committed(self, target: int) -> None:
        while self._committed < target:
            if self._failure is not None:
                raise self._failure
            if self._state == "closed":
                raise StoreClosed("record")
            await self._commit_wait()
        if self._failure is not None and self._committed < target:
            raise self._failure

    async def flush(self) -> None:
        """Return once everything written through this record so far is in the journal.

        Raises:
            BackendError: the journal could not be written (the writes stay in the local
                document and are retried by the next flush).
        """
        if self._state == "new":
            raise StoreClosed("record")
        await self._wait_committed(self._written)

    async def _committer(self) -> None:
        backoff = 0.01
        while True:
            if not self._pending:
                self._pending_event = anyio.Event()
                self._committer_idle = True
                try:
                    await self._pending_event.wait()
                finally:
                    self._committer_idle = False
                continue
            async with self._commit_lock:
                batch = list(self._pending)
                if not batch:
                    continue
                try:
                    seqs = await self._backend.append(
                        self.tenant,
                        self._jrun,
                        self._entries(batch),
                        durable=self.durability == "durable",
                    )
                except RunClosed as exc:
                    # final: the entries stay in the document, never in the journal
                    log.error(
                        "run %s/%s is %s: writes are refused", self.tenant, self.run, exc.state
                    )
                    self._failure = exc
                    self._fire_commit()
                    await anyio.sleep_forever()
                except CrdtStoreError as exc:
                    # Keep the entries queued and retry: a locked or full disk may recover.
                    # Writers waiting for durability learn of the failure now.
                    log.warning("journal append failed (%s); retrying in %.2fs", exc, backoff)
                    self._failure = (
                        exc
                        if isinstance(exc, BackendError)
                        else BackendError(self._backend.name, str(exc))
                    )
                    self._fire_commit()
                    await anyio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
                backoff = 0.01
                self._failure = None
                self._mark_committed(batch, seqs)
                del batch, seqs  # do not hold the last batch while idle

    def _entries(self, batch: _List[tuple[bytes, _List[Op], Meta]]) -> _List[NewEntry]:
        cid, new, crc = self.replica.client_id, _tuple_new, checksum
        fast = self._fast
        if fast:  # entries of other writers queued by _append_fast carry their client id
            out = []
            for u, ops, meta in batch:
                hit = fast.get(id(meta))
                agent, source, wall, _, run, call = meta
                label = cid if hit is None else hit[2]
                out.append(new(NewEntry, (agent, source, label, wall, u, ops, crc(u), run, call)))
            return out
        return [
            new(NewEntry, (agent, source, cid, wall, u, ops, crc(u), run, call))
            for u, ops, (agent, source, wall, _, run, call) in batch
        ]

    def _mark_committed(
        self, batch: _List[tuple[bytes, _List[Op], Meta]], seqs: _List[int]
    ) -> None:
        pending = self._pending
        if len(pending) == len(batch):  # the usual case: nothing was written meanwhile
            pending.clear()
        else:
            for _ in batch:
                pending.popleft()
        self.replica.journaled_many(batch, seqs)
        if seqs and seqs[0] == self.applied_seq + 1 and seqs[-1] == seqs[0] + len(seqs) - 1:
            # nothing of another writer's lies before them: the tail, woken by the notify
            # below, need not read the journal for them (it skips its own entries anyway)
            self.applied_seq = seqs[-1]
        if self._fast:
            self._fast_committed(batch, seqs)
        self._committed += len(batch)
        self._fire_commit()
        last = seqs[-1] if seqs else None
        own = self._watch if last is not None and last == self.applied_seq else None
        self._store._notifier.notify(self.tenant, self._jrun, last, own=own)
        if seqs:  # automatic compaction (Store.auto_compact) once the journal has grown
            self._store._after_commit(self._jrun, seqs[-1])

    def _fast_committed(
        self, batch: _List[tuple[bytes, _List[Op], Meta]], seqs: _List[int]
    ) -> None:
        """Give the appends of :meth:`_append_fast` waiting on ``batch`` their positions. The
        tail reads those entries as another writer's (their client id is not this
        replica's): unless ``applied_seq`` passed them, they are marked applied already."""
        fast, applied = self._fast, self.applied_seq
        for (_, _, meta), seq in zip(batch, seqs, strict=True):
            hit = fast.pop(id(meta), None)
            if hit is not None:
                wait, index, _ = hit
                wait.seqs[index] = seq
                wait.left -= 1
                if seq > applied:
                    self._applied_foreign.add(seq)

    async def _commit_wait(self) -> None:
        """Wait for the next :meth:`_fire_commit`."""
        self._commit_waiters += 1
        try:
            await self._commit_event.wait()
        finally:
            self._commit_waiters -= 1

    def _fire_commit(self) -> None:
        if self._commit_waiters:  # (a new anyio Event costs ~10 us: only when one waits)
            old, self._commit_event = self._commit_event, anyio.Event()
            old.set()

    # -- reading others' writes -----------------------------------------------------------------

    async def _tail(self) -> None:
        assert self._watch is not None
        watch = self._watch
        # Small chunks: the SQLite backend reads up to 256 rows on the event loop thread
        # (no worker-thread hop); a backlog is taken in chunks, yielding between them.
        chunk = 256
        # Woken by this process's commits, other processes' datagrams and the store's poll
        # (Notifier.poll: when the run's head moved unannounced, a lost datagram).
        while True:
            event = watch.event  # take it before reading: no wake-up can fall between
            blind = watch.blind
            try:
                rows = await self._backend.read(
                    self.tenant,
                    self._jrun,
                    self.applied_seq,
                    chunk,
                    skip_client=self.replica.client_id,
                )
            except CrdtStoreError as exc:  # a busy or vanished database: try again later
                log.warning("reading the journal of %s/%s failed: %s", self.tenant, self.run, exc)
                # (the poll may not wake this record again: its change was seen already)
                await anyio.sleep(self._store.poll_interval)
                continue
            if rows:
                await self._apply_remote(rows)
                if len(rows) == chunk:
                    await anyio.lowlevel.checkpoint()
                    continue
            del rows  # do not hold the last chunk while idle
            while True:
                await event.wait()
                if watch.blind != blind or watch.head > self.applied_seq:
                    break
                # it announced entries this record has already taken in: keep waiting
                event = watch.event

    async def _apply_remote(self, rows: _List[Any]) -> None:
        while self._txn_task is not None:  # never mix a remote update into a local txn
            await self._txn_idle.wait()
        # the tail and a guarded write may both have read the same entries
        rows = [r for r in rows if r.seq > self.applied_seq]
        if not rows:
            return
        if rows[0].seq > self.applied_seq + 1:
            # the entries we missed were compacted away; the snapshot holds them
            snap = await self._backend.load_snapshot(self.tenant, self._jrun)
            if snap is not None:
                self.replica.apply_update(
                    snap.update, trial_decode=False, size_limit=False
                )  # our own snapshot
                # it may change any collection: budgets (and the key existence that policies
                # read from a budgeted map's sizes) and sibling groups are recomputed
                self._invalidate_all()
        own = self.replica.client_id
        foreign = [r for r in rows if r.client_id != own]
        if self._applied_foreign:
            foreign = [r for r in foreign if r.seq not in self._applied_foreign]
            self._applied_foreign = {s for s in self._applied_foreign if s > rows[-1].seq}
        if foreign:
            self.replica.apply_rows(foreign, self._jrun)
            if self._usage or self._stamps:
                for r in foreign:
                    for op in r.effect:
                        self._usage.pop(op[1], None)
                        self._stamps[op[1]] = self._stamps.get(op[1], 0) + 1
                    if not r.effect:  # raw bytes: anything may have changed
                        self._invalidate_all()
        self.applied_seq = max(self.applied_seq, rows[-1].seq)
        if self._subscribers:
            for r in foreign:
                self._emit(r.effect, r.agent, r.source, r.seq, local=False)

    async def apply_update(self, update: bytes) -> None:
        """Merge update bytes made elsewhere (another Yjs/pycrdt document) into the record,
        journaled as a write of this record's agent.

        The update is journaled (merged with what the document integrated from it) with its
        effect: every map set it carries that the document did not hold, a set that lost LWW
        against a concurrent one included (``history`` lists it; provenance names only the
        value the document shows), map deletes, list and text inserts and deletes; so
        provenance, history and ``changes()`` attribute what it wrote to this record's agent.
        Root types it writes that the collection registry does not name (a plain Yjs
        client's ``doc.getMap("notes")``) are registered with the kind their items show, in
        the same journaled entry (see :meth:`Replica.apply_external`). When the run declares
        policies or budgets, the update is first tried on a scratch copy and its effect
        checked against them.

        Raises:
            InvalidUpdate: bytes that do not decode as a v1 update (nothing changes).
            PayloadTooLarge: larger than the store's ``max_update`` (nothing changes).
            PolicyViolation, BudgetExceeded: the update's effect is refused (nothing changes).
            ReadOnlyAccess: the store has read-only access to the run (nothing changes).
        """
        self._check_writable()
        self.replica.check_update(update)
        await self._apply_checked(update)

    async def _apply_checked(self, update: bytes) -> None:
        """:meth:`apply_update` of bytes that passed ``self.replica.check_update`` already
        (the hub's session checks an update as it arrives: it is not checked again)."""
        self._check_writable()
        while self._txn_task is not None:
            await self._txn_idle.wait()
        if self._enforcing():
            scratch = self.replica.trial_copy()
            ops = policed(scratch.apply_external(update, register=True, checked=True)[0])
            self._enforce(ops, conditional=False)
        meta = self._new_meta(now())
        self._invalidate_all()
        ops, delta = self.replica.apply_external(update, meta, register=True, checked=True)
        # Journal what was given, not only the delta the document reports: pycrdt integrates
        # an update with a clock gap at once but leaves it out of the transaction's update,
        # and every replica must see what this one shows.
        if delta is not None or update not in _EMPTY_UPDATES:
            if delta is not None and delta != update:  # (usually the same bytes)
                update = merge_updates(update, delta)
            self._enqueue(update, ops, meta)
        await self._after_write()

    async def sync(self) -> int:
        """Apply every entry the journal holds now; return the journal position reached.

        Useful before a decision that must see the latest writes of other processes (the
        tail does this in the background within milliseconds anyway).
        """
        self._check_open()
        while True:
            rows = await self._backend.read(self.tenant, self._jrun, self.applied_seq, READ_CHUNK)
            if not rows:
                return self.applied_seq
            await self._apply_remote(rows)

    # -- change notification --------------------------------------------------------------------

    @staticmethod
    def _changes_of(
        ops: _List[Op], agent: str, source: str, seq: int | None, local: bool
    ) -> _List[Change]:
        if len(ops) == 1:  # the usual entry: one op, one change (no grouping)
            op = ops[0]
            return [
                Change(
                    collection=op[1],
                    kind=op[0],
                    keys=(op[3],) if op[0] == "map" else (),
                    agent=agent,
                    source=source,
                    seq=seq,
                    local=local,
                    ops=(tuple(op),),
                )
            ]
        grouped: dict[tuple[str, str], _List[Op]] = {}
        for op in ops:
            grouped.setdefault((op[1], op[0]), []).append(op)
        return [
            Change(
                collection=name,
                kind=kind,
                keys=tuple(dict.fromkeys(op[3] for op in cops)) if kind == "map" else (),
                agent=agent,
                source=source,
                seq=seq,
                local=local,
                ops=tuple(tuple(op) for op in cops),
            )
            for (name, kind), cops in grouped.items()
        ]

    def _emit(
        self, ops: _List[Op], agent: str, source: str, seq: int | None, *, local: bool
    ) -> None:
        for change in self._changes_of(ops, agent, source, seq, local):
            for sub in self._subscribers:
                if len(sub.queue) == sub.queue.maxlen:
                    sub.lost += 1
                sub.queue.append(change)
                sub.event.set()

    def changes(self, *, local: bool = True, buffer: int = 1024) -> ChangeStream:
        """Changes from the moment of this call on: a :class:`Change` per collection touched
        by each transaction, local (unless ``local=False``) and remote, until the record
        closes. Use ``async for change in rec.changes():``.

        The buffer is bounded: a consumer that falls more than ``buffer`` changes behind
        loses the oldest ones (``stream.lost`` counts them) rather than growing memory;
        re-read the record (``to_dict()``) after such a gap.
        """
        return ChangeStream(self, local, buffer)

    # -- provenance -----------------------------------------------------------------------------

    def provenance(self, collection: str, key: str) -> Provenance | None:
        """Who wrote the current value of ``collection[key]`` (None if never written).

        Without the tool-call id (``call`` is None): the live index does not keep call ids;
        :meth:`history` reads them from the journal."""
        meta = self.replica.meta(collection, key)
        if meta is None:
            return None
        return Provenance(
            run=meta.run or self._jrun,
            agent=meta.agent,
            source=meta.source,
            wall_time=meta.wall_time,
            seq=meta.seq,
        )

    async def history(self, collection: str, key: str) -> _List[HistoryEntry]:
        """Every journaled write to ``collection[key]``, overwritten ones included, oldest
        first. Call :meth:`flush` first to include this record's batched writes."""
        self._check_open()
        check_name("collection", collection)
        return await self._store.history(self._jrun, collection, key)

    async def journal(self, after: int = 0, limit: int = 1000) -> _List[JournalEntry]:
        """Journal entries of this run after position ``after``."""
        self._check_open()
        rows = await self._backend.read(self.tenant, self._jrun, after, limit)
        return [JournalEntry.from_row(self._jrun, r) for r in rows]

    def __repr__(self) -> str:
        return (
            f"<Record {self.tenant}/{self.run} agent={self.agent!r} {self._state}"
            f" seq={self.applied_seq}>"
        )


class ChangeStream(AsyncIterator[Change]):
    """An async iterator of :class:`Change`; subscribed from its creation until closed."""

    def __init__(self, rec: Record, local: bool, buffer: int) -> None:
        self._rec = rec
        self._local = local
        self._sub = _Subscriber(buffer)
        rec._subscribers.append(self._sub)

    @property
    def lost(self) -> int:
        """Changes dropped because the consumer fell more than ``buffer`` behind."""
        return self._sub.lost

    async def __anext__(self) -> Change:
        sub = self._sub
        while True:
            if not sub.queue:
                if self._rec._state != "open":
                    self.close()
                    raise StopAsyncIteration
                sub.event = anyio.Event()
                await sub.event.wait()
                continue
            change = sub.queue.popleft()
            if self._local or not change.local:
                return change

    def close(self) -> None:
        """Stop receiving changes. Idempotent."""
        if self._sub in self._rec._subscribers:
            self._rec._subscribers.remove(self._sub)

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> ChangeStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class Claim:
    """A work item taken by :meth:`Record.claim`. Use ``async with await rec.claim(...)``
    or call :meth:`complete` / :meth:`release`."""

    def __init__(self, rec: Record, collection: str, item_id: str, lease: Lease) -> None:
        self._rec = rec
        self.collection = collection
        self.item_id = item_id
        self.lease = lease
        self.key = f"{collection}/{item_id}"

    @property
    def token(self) -> int:
        """The claim's fencing token."""
        return self.lease.token

    async def _record(self, state: str, result: Any = None) -> None:
        entry = {
            "claimer": self._rec.agent,
            "token": self.lease.token,
            "time": _time(),
            "state": state,
        }
        if result is not None:
            entry["result"] = result
        await self._rec.map("claims").set(
            self.key, entry, lease=self.lease, resource=self.lease.resources[0]
        )

    async def complete(self, result: Any = None) -> None:
        """Mark the item done in the record (a fenced write), then release the lease.

        Raises:
            LeaseLost: the claim was lost (expired, reaped): nothing was written.
        """
        try:
            await self._record("done", result)
        finally:
            await self.lease.release()

    async def release(self) -> None:
        """Give the item back: mark it released in the record and release the lease."""
        if self.lease.granted:
            try:
                await self._record("released")
            finally:
                await self.lease.release()

    async def __aenter__(self) -> Claim:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.lease.granted:
            with anyio.CancelScope(shield=True):
                await self.release()


# Which transaction the running code is inside. A context variable, not the task: the check
# runs on every write of a transaction, and asking anyio for the current task costs more
# than the write itself. (Tasks started inside the block inherit it and join the
# transaction.)
_TXN: ContextVar[object | None] = ContextVar("crdtstore_transaction", default=None)

# The open attributed() blocks of the running code: record -> (source or None, call id).
# None (no block open) is what almost every write reads; a new dict per block entered.
_ATTR: ContextVar[dict[Record, tuple[str | None, str]] | None] = ContextVar(
    "crdtstore_attribution", default=None
)


class _Attributed:
    """The context manager of :meth:`Record.attributed`."""

    __slots__ = ("_call", "_rec", "_source", "_token")

    def __init__(self, rec: Record, source: str | None, call: str | None) -> None:
        self._rec = rec
        self._source = source
        self._call = call
        self._token: Token[dict[Record, tuple[str | None, str]] | None] | None = None

    def __enter__(self) -> Record:
        rec = self._rec
        outer = _ATTR.get()
        source, call = (None, "") if outer is None else outer.get(rec, (None, ""))
        if self._source is not None:
            source = self._source
        if self._call is not None:
            call = self._call
        self._token = _ATTR.set({**(outer or {}), rec: (source, call)})
        return rec

    def __exit__(self, *exc: object) -> None:
        token, self._token = self._token, None
        if token is not None:
            _ATTR.reset(token)


class _Transaction:
    def __init__(self, rec: Record) -> None:
        self._rec = rec
        self._token: Token[object | None] | None = None

    async def __aenter__(self) -> Record:
        rec = self._rec
        rec._check_open()
        if rec._txn_task is not None and _TXN.get() is rec._txn_task:
            raise RuntimeError("transactions do not nest")
        while rec._txn_task is not None:
            await rec._txn_idle.wait()
        rec._check_open()
        rec._txn_task = self
        self._token = _TXN.set(self)
        rec._txn_idle = anyio.Event()
        rec._txn_ops = []
        rec._txn_meta = rec._new_meta(now())  # (the attribution in effect when it opens)
        rec.replica.begin()
        return rec

    async def __aexit__(self, *exc: object) -> None:
        rec = self._rec
        try:
            update = rec.replica.end()
            if update is not None:
                assert rec._txn_meta is not None
                rec._enqueue(update, rec._txn_ops, rec._txn_meta)
        finally:
            rec._txn_task = None
            rec._txn_ops = []
            rec._txn_meta = None
            rec._txn_idle.set()
            if self._token is not None:
                _TXN.reset(self._token)
        if exc[0] is None:
            await rec._after_write()
