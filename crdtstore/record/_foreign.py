"""Foreign writes: update bytes made outside the typed API, journaled by this record.

:meth:`ForeignWrites.apply_update` merges bytes made by another Yjs or pycrdt document, with
their effect (:meth:`~._replica.Replica.apply_external`) checked against the run's policies
first. :meth:`ForeignWrites.append_updates` is what a hub uses for a ``ws://`` client: it
journals the client's updates labelled with its id, guarded ones inside an authority
transaction (``_append_slow``) or, on a backend that decides guards in its append, through
it (``_append_atomic``: several hubs on one Redis), unguarded ones through the record's own
commit (``_append_fast``). All take the :class:`~._provenance.Writer` to attribute the bytes
to (the hub passes the token's), so one record journals many writers without changing its
own identity.
"""

from __future__ import annotations

from builtins import list as _List
from collections.abc import Sequence
from time import time as _time

from pycrdt import merge_updates

from .._errors import InvalidValue, StaleVersion, StoreClosed
from .._guarded_append import AtomicGuardedAppend, Fence, Guard, GuardMoved
from .._journal import SOURCES, Authority, NewEntry, Op, check_call, checksum
from .._names import check_name
from ._document import _EMPTY_UPDATES
from ._effects import policed
from ._guarded import MAX_MOVES, GuardedWrites
from ._provenance import Meta, Writer

_DUPLICATE_WINDOW = 1_000  # entries searched for a retried external append


class _FastAppend:
    """An append of :meth:`Record._append_fast` waiting for its entries' positions."""

    __slots__ = ("left", "seqs")

    def __init__(self, n: int) -> None:
        self.seqs = [0] * n  # the position of each entry once committed
        self.left = 0  # entries queued and not committed yet


def check_writer(writer: Writer) -> None:
    """Refuse a :class:`Writer` whose agent is not a name or whose source is not a kind."""
    if not isinstance(writer, tuple) or len(writer) != 2:
        raise InvalidValue(f"writer must be a Writer(agent, source), not {writer!r}")
    check_name("agent", writer[0])
    if writer[1] not in SOURCES:
        raise InvalidValue(f"source must be one of {sorted(SOURCES)}, not {writer[1]!r}")


class ForeignWrites(GuardedWrites):
    """Foreign writes of a record (see the module docstring)."""

    _writer_checked: Writer | None = None  # the last writer check_writer accepted

    async def apply_update(
        self, update: bytes, *, writer: Writer | None = None, checked: bool = False
    ) -> None:
        """Merge update bytes made elsewhere (another Yjs/pycrdt document) into the record,
        journaled as a write of this record's agent (or of ``writer``).

        The update is journaled (merged with what the document integrated from it) with its
        effect: every map set it carries that the document did not hold, a set that lost LWW
        against a concurrent one included (``history`` lists it; provenance names only the
        value the document shows), map deletes, list and text inserts and deletes; so
        provenance, history and ``changes()`` attribute what it wrote to this record's agent.
        Root types it writes that the collection registry does not name (a plain Yjs
        client's ``doc.getMap("notes")``) are registered with the kind their items show, in
        the same journaled entry (see :meth:`Replica.apply_external`). When the run declares
        policies or budgets, the update is first tried on a scratch copy and its effect
        checked against them (the owner policy as ``writer``'s agent).

        Args:
            writer: whom the entry and the provenance of what it wrote name (None: this
                record's agent and source, or an :meth:`attributed` block's).
            checked: the bytes passed ``rec.replica.check_update`` already (a hub's session
                checks an update as it arrives): they are not decoded twice.

        Raises:
            InvalidUpdate: bytes that do not decode as a v1 update (nothing changes).
            PayloadTooLarge: larger than the store's ``max_update`` (nothing changes).
            PolicyViolation, BudgetExceeded: the update's effect is refused (nothing changes).
            ReadOnlyAccess: the store has read-only access to the run (nothing changes).
            InvalidName, InvalidValue: a bad ``writer`` (nothing changes).
        """
        if self._state != "open" or self._failure is not None or self._read_only is not None:
            self._check_writable()  # (raises; tested inline: this runs for every hub update)
        if writer is not None and writer is not self._writer_checked:
            check_writer(writer)
            self._writer_checked = writer  # (a hub passes its connection's, every update)
        if not checked:
            self.replica.check_update(update)
        while self._txn_task is not None:
            await self._txn_idle.wait()
        agent = None if writer is None else writer.agent
        if self._specs and self._enforcing():  # (no spec: nothing to enforce)
            scratch = self.replica.trial_copy()
            ops = policed(scratch.apply_external(update, register=True, checked=True)[0])
            self._enforce(ops, conditional=False, agent=agent)
        meta = self._new_meta(_time())
        if writer is not None:
            meta = Meta(writer[0], writer[1], meta.wall_time, None, meta.run, meta.call)
        if self._usage or self._stamps:  # (else nothing to invalidate)
            self._invalidate_all()
        ops, delta = self.replica.apply_external(update, meta, register=True, checked=True)
        # Journal what was given, not only the delta the document reports: pycrdt integrates
        # an update with a clock gap at once but leaves it out of the transaction's update,
        # and every replica must see what this one shows. The delta adds to the bytes given
        # only the roots this replica registered (the rest of it is what they carried, or
        # what entries journaled before them held): merged only then.
        if delta is not None or update not in _EMPTY_UPDATES:
            if delta is not None and self.replica.external_registered and delta != update:
                update = merge_updates(update, delta)
            self._enqueue(update, ops, meta)
        if self.durability == "durable" or len(self._pending) > self._max_pending:
            await self._after_write()  # (its test here: a hub's usual update waits for nothing)

    async def append_update(
        self,
        update: bytes,
        *,
        client_id: int,
        writer: Writer | None = None,
        durable: bool = True,
        expected: tuple[str, str, int] | None = None,
        based_on: tuple[str, int] | None = None,
        fence: tuple[str, int, str] | None = None,
        call: str = "",
    ) -> int:
        """:meth:`append_updates` of one update: its journal position."""
        (seq,) = await self.append_updates(
            [update],
            client_id=client_id,
            writer=writer,
            durable=durable,
            expected=expected,
            based_on=based_on,
            fence=fence,
            calls=[call],
        )
        return seq

    async def append_updates(
        self,
        updates: Sequence[bytes],
        *,
        client_id: int,
        writer: Writer | None = None,
        durable: bool = True,
        expected: tuple[str, str, int] | None = None,
        based_on: tuple[str, int] | None = None,
        fence: tuple[str, int, str] | None = None,
        calls: Sequence[str] | None = None,
    ) -> _List[int]:
        """Apply and journal update bytes made by another writer (a ``ws://`` client whose
        entries the hub journals), one entry each, as ``writer`` (None: this record's agent
        and source); return their journal positions. ``calls`` (one per update, or None)
        are the tool-call ids the entries carry (the writer's say-so: a label, as
        ``client_id``; checked with :func:`~crdtstore._journal.check_call`).

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
        if writer is not None:
            check_writer(writer)
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
            fast = await self._append_fast(updates, client_id, durable, calls, writer)
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
            writer=writer,
        )

    async def _append_fast(
        self,
        updates: Sequence[bytes],
        client_id: int,
        durable: bool,
        calls: Sequence[str] | None = None,
        writer: Writer | None = None,
    ) -> _List[int] | None:
        """An unguarded :meth:`append_updates` as a local write: None if it cannot be
        taken (nothing done then; the caller takes the authority path).

        As :meth:`apply_update` writes: the effects are checked against the run's policies
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
        agent, source = (self.agent, self.source) if writer is None else writer
        if self._enforcing():
            scratch = self.replica.trial_copy()
            try:
                for update in updates:  # in order, each on top of the ones before
                    ops = policed(scratch.apply_external(update, checked=True)[0])
                    self._account(self._enforce(ops, conditional=False, agent=agent))
            finally:
                self._invalidate_all()  # budgets are measured again from the document
        wait = _FastAppend(len(updates))
        rest: _List[int] = []
        for i, update in enumerate(updates):
            if update in _EMPTY_UPDATES:  # nothing to journal (as _append_slow answers)
                wait.seqs[i] = 0
                continue
            call = "" if calls is None else calls[i]
            meta = Meta(agent, source, _time(), None, self._origin, call)
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
                    writer=writer,
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
        writer: Writer | None = None,
    ) -> _List[int]:
        """:meth:`append_updates` inside one authority transaction (its checks done), or
        on a backend that checks guards in its append, through it (:meth:`_append_atomic`)."""
        agent, source = (self.agent, self.source) if writer is None else writer
        if expected is not None:
            name, key, version = expected
            check_name("collection", name)
            if type(version) is not int or version < 0:
                raise InvalidValue(f"expected_version must be an int >= 0, not {version!r}")
        while self._txn_task is not None:
            await self._txn_idle.wait()
        atomic = None
        if expected is not None or based_on is not None or fence is not None:
            atomic = self._atomic_backend(fence is not None)
        if atomic is not None:
            got = await self._append_atomic(
                atomic, updates, client_id, durable, expected, based_on, fence, calls, writer
            )
            if got is not None:
                return got
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
                        self._account(self._enforce(ops, conditional=guarded, agent=agent))
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
                meta = Meta(agent, source, _time(), None, self._origin, call)
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

    async def _append_atomic(
        self,
        backend: AtomicGuardedAppend,
        updates: Sequence[bytes],
        client_id: int,
        durable: bool,
        expected: tuple[str, str, int] | None,
        based_on: tuple[str, int] | None,
        fence: tuple[str, int, str] | None,
        calls: Sequence[str] | None,
        writer: Writer | None = None,
    ) -> _List[int] | None:
        """Guarded :meth:`_append_slow` on a backend that checks the guard in its append (the
        hub on Redis: several hubs serve one run, the script decides). As
        :meth:`_write_guarded_atomic`: every entry journaled so far applied (position
        ``seen``), the guard decided by this replica, the updates tried on a copy for their
        effects (and the run's policies), then the backend appends them only if nothing after
        ``seen`` touches the guarded key or scope and the fence holds; only then are they
        applied here. None (nothing done) when the key kept moving or an update adds nothing
        to the document (a retry whose answer was lost): the authority path then decides."""
        agent, source = (self.agent, self.source) if writer is None else writer
        f = None
        if fence is not None:
            clock = getattr(self._store.leases.backend, "clock", None)
            f = Fence(fence[0], fence[1], fence[2], clock)
        guard_keys = ((expected[0], expected[1]),) if expected is not None else ()
        scopes = (based_on[0],) if based_on is not None else ()
        for _ in range(MAX_MOVES):
            await self.flush()  # our earlier writes go first: the journal order stays causal
            async with self._commit_lock:
                if self._pending:
                    continue
                while True:
                    rows = await self._backend.read(self.tenant, self._jrun, self.applied_seq)
                    if not rows:
                        break
                    await self._apply_remote(rows)
                seen = self.applied_seq
                found = 0
                if expected is not None:
                    name, key, version = expected
                    found = self.version(name, key) or 0
                    if found != version:
                        raise StaleVersion(
                            name, key, version, found, self._current_value(name, key)
                        )
                if based_on is not None:
                    now_seq = self._scope_seq(based_on[0], [], [])
                    if now_seq != based_on[1]:
                        raise StaleVersion(based_on[0], None, based_on[1], now_seq)
                trial = self.replica.trial_copy()
                entries: _List[NewEntry] = []
                metas: _List[Meta | None] = []
                try:
                    for i, update in enumerate(updates):
                        if update in _EMPTY_UPDATES:  # a guarded write that changes nothing
                            metas.append(None)
                            continue
                        call = "" if calls is None else calls[i]
                        meta = Meta(agent, source, _time(), None, self._origin, call)
                        before = trial.doc.get_state()
                        ops, delta = trial.apply_external(update, meta, checked=True)
                        if delta is None and trial.doc.get_state() == before:
                            return None  # held already: the authority path finds its entry
                        if self._enforcing():
                            self._account(
                                self._enforce(policed(ops), conditional=True, agent=agent)
                            )
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
                        entries.append(entry)
                        metas.append(meta)
                finally:
                    if self._enforcing():
                        self._invalidate_all()  # budgets are measured again from the document
                guard = Guard(seen, guard_keys, scopes, f)
                try:
                    seqs = await backend.append_guarded_at(
                        self.tenant, self._jrun, entries, guard, durable=durable
                    )
                except GuardMoved:
                    continue
                while self._txn_task is not None:  # never mix them into a local transaction
                    await self._txn_idle.wait()
                out: _List[int] = []
                at = iter(seqs)
                for update, m in zip(updates, metas, strict=True):
                    if m is None:
                        out.append(found)
                        continue
                    seq = next(at)
                    self._invalidate_all()
                    ops, _ = self.replica.apply_external(update, m, checked=True)
                    if seq > self.applied_seq:  # the tail would apply it again
                        self._applied_foreign.add(seq)
                    out.append(seq)
                    self._written += 1
                    self._mark_committed_guarded(ops, m, seq)
                    if self._subscribers:
                        self._emit(ops, m.agent, m.source, seq, local=True)
                return out
        return None

    async def _journaled_seq(self, auth: Authority, update: bytes, client_id: int) -> int | None:
        """The position of a recent entry of ``client_id`` holding exactly ``update``."""
        start = max(0, self.applied_seq - _DUPLICATE_WINDOW)
        crc = checksum(update)
        for row in reversed(await auth.read(start)):
            if row.client_id == client_id and row.checksum == crc and row.update == update:
                return row.seq
        return None
