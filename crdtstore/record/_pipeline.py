"""The write pipeline: one path from a collection's write to the pending queue.

Every local write of a collection goes through :meth:`WritePipeline._stage`: the record must be
writable; the policies and budgets are checked (before the document is touched: pycrdt has
no rollback); the ops are applied with this writer's provenance (:meth:`_new_meta`, which
:meth:`~._record.Record.attributed` blocks change); and the update is queued for the
committer (:meth:`WritePipeline._enqueue`, the only way into the pending queue, which every
other writer of the record uses too). Inside the running task's ``rec.transaction()`` the
write joins that transaction's single entry instead. ``_stage`` is synchronous, so a usual
write is one coroutine (the collection's); it returns what the caller must await, if
anything (durable mode, backpressure, another task's transaction).
"""

from __future__ import annotations

from builtins import list as _List
from collections.abc import Callable, Coroutine
from contextvars import ContextVar, Token
from time import time as _time
from typing import Any, Generic, Self, TypeVar

import anyio

from .._errors import InvalidValue, NestedTransaction
from .._journal import SOURCES, Op, check_call
from .._semantics import BudgetDelta, SetDelta, apply_budgets, apply_set
from ._journal_link import JournalLink
from ._provenance import Meta, now

_tuple_new = tuple.__new__

_R = TypeVar("_R", bound="WritePipeline")


class WritePipeline(JournalLink):
    """The write pipeline of a record (see the module docstring)."""

    def transaction(self) -> _Transaction[Self]:
        """Group several writes into one journal entry (one update delta)::

            async with rec.transaction():
                await rec.map("a").set("x", 1)
                await rec.list("log").append("x set")

        Writes of other tasks wait until the transaction ends. There is no rollback (pycrdt
        has none): if the block raises, the writes made before the error stay and are
        journaled.
        """
        return _Transaction(self)

    def attributed(
        self, *, source: str | None = None, call: str | None = None
    ) -> _Attributed[Self]:
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

    def _attributed_meta(
        self, wall: float, attr: dict[WritePipeline, tuple[str | None, str]]
    ) -> Meta:
        got = attr.get(self)
        if got is None:  # a block of another record
            return Meta(self.agent, self.source, wall, None, self._origin)
        source, call = got
        if source is None or self._named_by_backend:
            source = self.source
        return Meta(self.agent, source, wall, None, self._origin, call)

    def _stage(
        self,
        ops: _List[Any],
        apply: Callable[[], None] | None = None,
        root: Any = None,
        size: int = -1,
    ) -> Coroutine[Any, Any, None] | None:
        """Check, apply and queue a local write (see the module docstring); return what the
        caller must await (None: nothing).

        ``ops`` are the write's ops and ``apply`` makes exactly the changes they describe. The
        hot path, a map set, passes no ``apply``: ``ops`` is then that one op alone
        (``["map", name, "set", key, stored]``, not in a list: inside a transaction no list
        is made for it; the entry queued holds it as a 1-tuple of a tuple) and ``root`` its map,
        and the replica applies it straight
        (:meth:`~._document.ReplicaDocument.local_set`, ``do_set``); ``size``, if not -1, is
        the stored value's ``value_size`` (which the budget check then need not compute)."""
        if self._state != "open" or self._failure is not None or self._read_only is not None:
            self._check_writable()
        # Policies and budgets are checked before the document is touched (no rollback).
        txn = self._txn_task
        if txn is not None:
            if _TXN.get() is not txn:  # another task's: wait for it to end
                return self._stage_after_txn(ops, apply, root, size)
            txn_meta = self._txn_meta
            assert txn_meta is not None
            if apply is None:  # ops: one map set
                one = self._enforce_set(ops, size) if self._specs else None
                self.replica.do_set(root, ops[1], ops[3], ops[4], txn_meta)
                self._txn_ops.append(tuple(ops))  # type: ignore[arg-type]  # (untracked)
                if one is not None:
                    apply_set(one)
                return None
            deltas = self._enforce(ops, conditional=False) if self._specs else None
            self.replica.do(ops, apply, txn_meta)
            self._txn_ops += ops
            if deltas:
                apply_budgets(deltas)
            return None
        delta: SetDelta | None = None
        usage: _List[BudgetDelta] | None = None
        if apply is None:
            if self._specs:
                delta = self._enforce_set(ops, size)
            # (one map set) Tuples, not lists: this entry waits in the pending queue and
            # the memory journal's newest rows, often long enough to reach the collector's
            # oldest generation, whose full passes then rescan it; a tuple of atoms is
            # untracked at the first pass it survives (the 1-tuple at the next one).
            ops = (tuple(ops),)  # type: ignore[assignment]
        elif self._specs:
            usage = self._enforce(ops, conditional=False)
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
        if update is not None:
            # (what _enqueue does, inlined: the hot path)
            stamps = self._stamps
            if stamps:
                for op in ops:
                    stamps[op[1]] = stamps.get(op[1], 0) + 1
            self._pending.append((update, ops, meta))
            self._written += 1
            policy = self._commit_policy
            if policy is not None:
                policy.queued()
            elif self._committer_idle:
                self._committer_idle = False
                self._pending_event.set()
            if self._subscribers:
                self._emit(ops, meta.agent, meta.source, None, local=True)
        if delta is not None:
            # (apply_set, inlined: the budget of a declared map's usual write)
            budget, sizes, key, nbytes, add_entries, add_bytes = delta
            budget.entries += add_entries
            budget.bytes += add_bytes
            sizes[key] = nbytes
        elif usage is not None:
            apply_budgets(usage)
        if self.durability == "durable" or len(self._pending) > self._max_pending:
            return self._after_write()
        return None

    async def _stage_after_txn(
        self, ops: _List[Any], apply: Callable[[], None] | None, root: Any, size: int
    ) -> None:
        """:meth:`_stage` once the open transaction (another task's) has ended."""
        while self._txn_task is not None:
            await self._txn_idle.wait()
        self._check_open()
        wait = self._stage(ops, apply, root, size)
        if wait is not None:
            await wait

    def _enqueue(self, update: bytes, ops: _List[Op], meta: Meta) -> None:
        """Queue a local entry (applied already) for the committer, or the commit policy
        (:meth:`commit_on_loop`): the pending queue's only way in (:meth:`_stage` has a copy
        of it inline: keep the two alike)."""
        if self._stamps:
            for op in ops:
                self._stamps[op[1]] = self._stamps.get(op[1], 0) + 1
        self._pending.append((update, ops, meta))
        self._written += 1
        policy = self._commit_policy
        if policy is not None:
            policy.queued()
        elif self._committer_idle:
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


# Which transaction the running code is inside. A context variable, not the task: the check
# runs on every write of a transaction, and asking anyio for the current task costs more
# than the write itself. (Tasks started inside the block inherit it and join the
# transaction.)
_TXN: ContextVar[object | None] = ContextVar("crdtstore_transaction", default=None)

# The open attributed() blocks of the running code: record -> (source or None, call id).
# None (no block open) is what almost every write reads; a new dict per block entered.
_ATTR: ContextVar[dict[WritePipeline, tuple[str | None, str]] | None] = ContextVar(
    "crdtstore_attribution", default=None
)


class _Attributed(Generic[_R]):
    """The context manager of :meth:`Record.attributed`."""

    __slots__ = ("_call", "_rec", "_source", "_token")

    def __init__(self, rec: _R, source: str | None, call: str | None) -> None:
        self._rec = rec
        self._source = source
        self._call = call
        self._token: Token[dict[WritePipeline, tuple[str | None, str]] | None] | None = None

    def __enter__(self) -> _R:
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


class _Transaction(Generic[_R]):
    """The async context manager of :meth:`Record.transaction`."""

    def __init__(self, rec: _R) -> None:
        self._rec = rec
        self._token: Token[object | None] | None = None

    async def __aenter__(self) -> _R:
        rec = self._rec
        rec._check_open()
        if rec._txn_task is not None and _TXN.get() is rec._txn_task:
            raise NestedTransaction(rec.run)
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
