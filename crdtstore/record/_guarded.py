"""Guarded, fenced and claimed writes: writes that the store's authority serialises.

A guarded write (``expected_version``, ``based_on``) and a fenced one (``lease``) are checked
and journaled inside one exclusive journal transaction (:meth:`GuardedWrites._write_guarded`):
entries not seen yet are applied, the record's own pending entries appended first (the
journal order stays causal), then the guard is checked, and only then is the write applied
and journaled; a refusal changes nothing. On a backend that decides the guard in its append
(Redis, ``crdtstore._guarded_append``) no transaction is held: the write is made on a scratch
copy and appended with its guard in one atomic step (:meth:`GuardedWrites._write_guarded_atomic`).
Behind a server (``ws://``) the write is made on a scratch copy and sent with its guard
(:meth:`GuardedWrites._write_guarded_remote`). A :class:`Claim` is a lease on a work item plus
a fenced entry in the ``claims`` map.
"""

from __future__ import annotations

import contextlib
from builtins import list as _List
from collections.abc import Callable
from time import time as _time
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import (
    BackendError,
    CollectionKindMismatch,
    CrdtStoreError,
    InvalidValue,
    LeaseHeld,
    LeaseLost,
    StaleVersion,
)
from .._guarded_append import (
    AtomicGuardedAppend,
    Fence,
    Guard,
    GuardMoved,
    RemoteGuardedAppend,
)
from .._journal import NewEntry, Op
from .._models import Version
from .._names import check_name
from .._remote_journal import RemoteJournal
from .._values import from_stored
from ._guarded_group import GuardedGroups
from ._pipeline import _TXN
from ._provenance import Meta
from ._replica import Replica

if TYPE_CHECKING:
    from .._leases import Lease

MAX_MOVES = 32  # guarded appends refused in a row (the key kept moving) before the authority


class GuardedWrites(GuardedGroups):
    """Guarded, fenced and claimed writes of a record (see the module docstring)."""

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
        backend = self._backend
        route = self.__dict__.get("_guard_route")
        if route is None or route[0] is not backend:  # (the checks cost more than the write)
            route = self.__dict__["_guard_route"] = (
                backend,
                isinstance(backend, RemoteJournal),
                bool(getattr(backend, "guard_in_append", False)),
            )
        if route[1]:
            return await self._write_guarded_remote(name, key, expected, ops, based_on, fence)
        atomic = self._atomic_backend(fence is not None) if route[2] else None
        if atomic is not None:
            seq = await self._write_guarded_atomic(
                atomic, name, key, expected, ops, current, based_on, fence
            )
            if seq is not None:
                return seq
        return await self._write_grouped(name, key, expected, ops, apply, current, based_on, fence)

    def _atomic_backend(self, fenced: bool) -> AtomicGuardedAppend | None:
        """The journal as an :class:`AtomicGuardedAppend` when it can decide this write's
        guard in its append (a fenced one: when the store's leases live in it); else None."""
        backend = self._backend
        # (the attribute first: a Protocol's isinstance check costs tens of microseconds)
        if not getattr(backend, "guard_in_append", False):
            return None
        if not isinstance(backend, AtomicGuardedAppend):
            return None
        if fenced and not backend.hosts_leases(self._store.leases.backend):
            return None
        return backend

    async def _write_guarded_atomic(
        self,
        backend: AtomicGuardedAppend,
        name: str,
        key: str,
        expected: int | None,
        ops: _List[Op],
        current: Callable[[], Any],
        based_on: Version | None,
        fence: tuple[Lease, str] | None,
    ) -> int | None:
        """:meth:`_write_guarded` on a backend that checks the guard in its append (see
        :mod:`crdtstore._guarded_append`): no lock is held. The record applies every entry
        journaled so far (position ``seen``), decides the guard with its replica, builds the
        write on a scratch copy (as :meth:`_write_guarded_remote`), and the backend appends
        it only if no entry after ``seen`` touches the key or scope and the fence holds, in
        one atomic step; when one does (``GuardMoved``) the record reads it and decides again.
        Only after the append is the write applied here, so a refusal changes nothing.

        Returns None after :data:`MAX_MOVES` moves in a row (a key written without pause):
        the caller then takes the authority, which no plain writer can interleave with."""
        f = None
        if fence is not None:
            clock = getattr(self._store.leases.backend, "clock", None)
            f = Fence(fence[0].lease_id, fence[0].token, fence[1], clock)
        guard_keys = ((name, key),) if expected is not None else ()
        scopes = (based_on.scope,) if based_on is not None else ()
        for _ in range(MAX_MOVES):
            await self.flush()  # our earlier writes go first: the journal order stays causal
            async with self._commit_lock:
                if self._pending:
                    continue  # written meanwhile: journal that first
                while True:  # every entry journaled so far (what sync() does)
                    rows = await self._backend.read(self.tenant, self._jrun, self.applied_seq)
                    if not rows:
                        break
                    await self._apply_remote(rows)
                seen = self.applied_seq
                version = self.version(name, key)
                if expected is not None and version != expected:
                    raise StaleVersion(name, key, expected, version, current())
                if based_on is not None:
                    now_seq = self._scope_seq(based_on.scope, [], [])
                    if now_seq != based_on.seq:
                        scope = None if based_on.scope == "*" else based_on.scope
                        raise StaleVersion(scope or "*", None, based_on.seq, now_seq)
                usage = self._enforce(ops, conditional=True) if self._specs else None
                update, meta, entry, scratch = self._scratch_write(ops)
                guard = Guard(seen, guard_keys, scopes, f)
                try:
                    got = await backend.append_guarded_at(
                        self.tenant, self._jrun, [entry] if update else [], guard, durable=True
                    )
                except GuardMoved:
                    continue
                self._keep_scratch(scratch)
                if update is None:
                    return version or 0
                return await self._take_in_accepted(update, ops, meta, usage, got[0])
        return None

    def _scratch_write(self, ops: _List[Op]) -> tuple[bytes | None, Meta, NewEntry, Replica]:
        """A guarded map write made on a scratch copy of the document (a fresh client id: it
        cannot clash with local writes made meanwhile): its update (None: it changes
        nothing), its provenance, its journal entry and the copy. Guarded writes are map sets
        and deletes: ``ops`` says all there is to apply.

        The copy of the last journaled guarded write is kept (:meth:`_keep_scratch`) and
        brought up to date with what the document gained since (an update against its state
        vector: the size of the change, not of the document); a refused or unanswered write
        drops it, since its next write would follow an item nobody else has."""
        scratch: Replica | None = self.__dict__.pop("_scratch", None)
        if scratch is None:
            scratch = Replica(max_update=self.replica.max_update)
            scratch.apply_update(
                self.replica.doc.get_update(), trial_decode=False, size_limit=False
            )
        else:
            diff = self.replica.doc.get_update(scratch.doc.get_state())
            scratch.apply_update(diff, trial_decode=False, size_limit=False)
        copy = scratch

        def apply() -> None:
            for op in ops:
                root = copy.root(op[1], "map")
                if op[2] == "set":
                    root[op[3]] = op[4]
                elif op[3] in root:
                    del root[op[3]]

        meta = self._new_meta(_time())
        update = scratch.local(ops, apply, meta)
        empty = b"\x00\x00"  # nothing to change: only the guard is checked
        entry = scratch.entry(
            meta.agent, meta.source, update or empty, ops, meta.wall_time, call=meta.call
        )
        return update, meta, entry, scratch

    def _keep_scratch(self, scratch: Replica) -> None:
        """Keep the copy of a guarded write that was journaled (see :meth:`_scratch_write`)."""
        self.__dict__["_scratch"] = scratch

    async def _write_guarded_remote(
        self,
        name: str,
        key: str,
        expected: int | None,
        ops: _List[Op],
        based_on: Version | None,
        fence: tuple[Lease, str] | None,
    ) -> int:
        """:meth:`_write_guarded` for a journal behind a server (a :class:`RemoteJournal`): no
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
            update, meta, entry, scratch = self._scratch_write(ops)
            guard: dict[str, Any] = {}
            if expected is not None:
                guard["expected"] = (name, key, expected)
            if based_on is not None:
                guard["based_on"] = (based_on.scope, based_on.seq)
            if fence is not None:
                guard["fence"] = (fence[0].lease_id, fence[0].token, fence[1])
            remote = self._backend
            if not isinstance(remote, RemoteGuardedAppend):
                raise BackendError(remote.name, "a remote journal without append_guarded")
            try:
                seq = await remote.append_guarded(self.tenant, self._jrun, entry, **guard)
            except StaleVersion as exc:
                await self._adopt_version(exc)
                raise
            self._keep_scratch(scratch)
            if update is None:
                return seq
            return await self._take_in_accepted(update, ops, meta, usage, seq)

    async def _take_in_accepted(
        self, update: bytes, ops: _List[Op], meta: Meta, usage: Any, seq: int
    ) -> int:
        """Apply a guarded write built on a scratch copy that the journal accepted at ``seq``
        (outside any local transaction), as this record's own journaled write."""
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

    def _current_value(self, name: str, key: str) -> Any:
        try:
            value = self.replica.root(name, "map").get(key)
        except CollectionKindMismatch:
            return None
        return from_stored(value)

    def fenced_resource(self, collection: str, key: str, lease: Lease) -> str:
        """The resource a fenced write of ``collection[key]`` is checked against: the key as a
        repo path if the lease covers it, else the work item ``item:<collection>/<key>``.

        Raises:
            LeaseLost: the lease covers neither.
        """
        from .._leases import canonical_resource, item_resource

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
        from .._leases import item_resource

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


class Claim:
    """A work item taken by :meth:`Record.claim`. Use ``async with await rec.claim(...)``
    or call :meth:`complete` / :meth:`release`."""

    def __init__(self, rec: GuardedWrites, collection: str, item_id: str, lease: Lease) -> None:
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
