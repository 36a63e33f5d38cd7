"""Guarded writes decided in groups: the guarded writes of a record that wait at the same time
share one authority transaction (issue 20).

A guarded write joins the record's queue; the first one finds no group under way and leads:
it opens the store's authority (SQLite: one ``BEGIN IMMEDIATE`` transaction), applies what
others journaled, and decides the waiting writes one by one in the order they came, each
against the version it names (``expected_version``, ``based_on``, a fence) as it stands
after the writes decided before it. A refused write is told at once, with the true current
version (:class:`~crdtstore.StaleVersion`), and blocks none of the others. When more than
one writer is about, the group then yields with its transaction open (a *window*): a write
that comes meanwhile (a refused writer's retry, the next read-increment-write of a writer
whose write was accepted: it read the version that write will have) is decided at once in
its own task (:meth:`GuardedGroups._join_window`), so one commit takes a chain of them. The
group commits once (SQLite: one sync of the log) when a window passes with no one coming.

An accepted write's position is known before the commit (``_inflight``, read by
:meth:`~._changes.Changes.version`). If the commit fails, every write of the group gets the
error, and what they applied to the document is journaled by the committer later (pycrdt
has no rollback), as a guarded write whose append fails always was.
"""

from __future__ import annotations

import asyncio
from builtins import list as _List
from collections.abc import Callable, Sequence
from time import time as _time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from .._errors import StaleVersion
from .._journal import Authority, NewEntry, Op
from .._models import Version
from ._pipeline import WritePipeline
from ._provenance import Meta

if TYPE_CHECKING:
    from .._leases import Lease

GROUP_ROUNDS = 8  # rounds of late-coming writes one transaction takes in (then it commits)

_Entry = tuple[bytes, _List[Op], Meta]


class _Waiting:
    """One guarded write in the queue, and its outcome (``seq`` or ``error``)."""

    __slots__ = (
        "apply",
        "based_on",
        "current",
        "done",
        "error",
        "event",
        "expected",
        "fence",
        "key",
        "lead",
        "meta",
        "name",
        "ops",
        "seq",
    )

    def __init__(
        self,
        name: str,
        key: str,
        expected: int | None,
        ops: _List[Op],
        apply: Callable[[], None],
        current: Callable[[], Any],
        based_on: Version | None,
        fence: tuple[Lease, str] | None,
        meta: Meta,
    ) -> None:
        self.name = name
        self.key = key
        self.expected = expected
        self.ops = ops
        self.apply = apply
        self.current = current
        self.based_on = based_on
        self.fence = fence
        self.meta = meta  # made in the writer's task: its attribution (Record.attributed)
        self.event: anyio.Event | None = None  # set when decided, or asked to lead
        self.done = False
        self.lead = False  # the group before ended: this write leads the next one
        self.seq = 0
        self.error: BaseException | None = None

    def settle(self, seq: int = 0, error: BaseException | None = None) -> None:
        self.seq, self.error, self.done = seq, error, True
        if self.event is not None:
            self.event.set()

    def outcome(self) -> int:
        if self.error is not None:
            raise self.error
        return self.seq


class _NothingAccepted(Exception):
    """Every write of a group was refused: its transaction is rolled back, so a refusal
    changes nothing (the record's pending entries it appended stay the committer's)."""


class _Txn:
    """What one group appended, in journal order: the record's own pending entries and the
    accepted guarded writes (with their waiting writes; None for a pending entry)."""

    def __init__(self) -> None:
        self.entries: _List[_Entry] = []
        self.seqs: _List[int] = []
        self.writes: _List[_Waiting | None] = []
        self.pending = 0  # how many of the record's pending entries are among them
        self.unchanged: _List[tuple[_Waiting, int]] = []  # accepted, nothing to write
        # a refused key's value at a version (writes that read together are refused together)
        self.current: dict[tuple[str, str], tuple[int, Any]] = {}


_SCALARS = (str, int, float, bool, bytes)  # values two refusals may share (immutable)


def _current(txn: _Txn, w: _Waiting, version: int | None) -> Any:
    """The value of ``w``'s key at ``version`` for its refusal: read once per group (a
    read costs more than the rest of a refusal) while it is immutable."""
    if version is None:  # (not journaled yet: no name to share it by)
        return w.current()
    where = (w.name, w.key)
    seen = txn.current.get(where)
    if seen is not None and seen[0] == version:
        return seen[1]
    value = w.current()
    if value is None or type(value) in _SCALARS:
        txn.current[where] = (version, value)
    return value


def _task_id() -> int:
    """The current task's id (asyncio's own call: a fifth of what anyio's costs)."""
    try:
        return id(asyncio.current_task())
    except RuntimeError:  # not asyncio
        return anyio.get_current_task().id


class _Window:
    """An open group a guarded write may join at once (see :meth:`GuardedGroups._join_window`):
    its transaction, the authority's synchronous append, and the writes it took."""

    __slots__ = ("auth", "failed", "joined", "now", "taken", "txn")

    def __init__(
        self,
        auth: Authority,
        now: Callable[[Sequence[NewEntry]], _List[int]],
        txn: _Txn,
        taken: _List[_Waiting],
    ) -> None:
        self.auth = auth
        self.now = now
        self.txn = txn
        self.taken = taken
        self.joined = 0
        self.failed: BaseException | None = None  # a joiner's append failed


class GuardedGroups(WritePipeline):
    """The grouped decision of a record's guarded writes (see the module docstring)."""

    _guard_window: _Window | None = None  # the group under way, while writers may join it
    _guard_crowd = 0  # writes the last group decided (more than one: wait for joiners)
    _guard_writer = 0  # the task that queued the last guarded write (its id)

    async def _write_grouped(
        self,
        name: str,
        key: str,
        expected: int | None,
        ops: _List[Op],
        apply: Callable[[], None],
        current: Callable[[], Any],
        based_on: Version | None,
        fence: tuple[Lease, str] | None,
    ) -> int:
        """Queue a guarded write and return its journal position once its group committed
        (or raise its refusal); lead the group if none is under way."""
        w = _Waiting(
            name, key, expected, ops, apply, current, based_on, fence, self._new_meta(_time())
        )
        window = self._guard_window
        if window is not None and fence is None and self._txn_task is None:
            return await self._join_window(window, w)
        me = _task_id()
        if me != self._guard_writer:  # another writer than the last: more may come
            self._guard_writer = me
            self._guard_crowd = 2
        self._guard_queue.append(w)
        if self._guard_leading:
            w.event = anyio.Event()
            try:
                await w.event.wait()
            except BaseException:
                self._leave_queue(w)
                raise
            if w.done:
                return w.outcome()
        self._guard_leading = True  # (asked to lead: it is set already)
        try:
            while not w.done:
                while self._txn_task is not None:  # never inside a local transaction
                    await self._txn_idle.wait()
                await self._decide_group()
        except BaseException:
            if w in self._guard_queue:
                self._guard_queue.remove(w)
            raise
        finally:
            w.lead = False
            self._hand_over()
        return w.outcome()

    def _leave_queue(self, w: _Waiting) -> None:
        """A waiting write gives up (cancelled): out of the queue, and if it was asked to lead,
        the next one leads. One already taken into a group is decided all the same."""
        queue = self._guard_queue
        if w in queue:
            queue.remove(w)
        if w.lead and not w.done:
            w.lead = False
            self._hand_over()

    def _hand_over(self) -> None:
        """The group ended: the first waiting write leads the next one, if any."""
        queue = self._guard_queue
        for nxt in queue:
            if not nxt.done:
                nxt.lead = True
                if nxt.event is not None:
                    nxt.event.set()
                return
        self._guard_leading = False

    async def _decide_group(self) -> None:
        """One group: decide the queued writes inside one authority transaction, then commit
        (see the module docstring)."""
        txn = _Txn()
        taken: _List[_Waiting] = []
        lock = self._commit_lock
        try:  # (free: taken without a checkpoint, as the authority's own lock is)
            lock.acquire_nowait()
        except anyio.WouldBlock:
            await lock.acquire()
        try:
            async with self._backend.authority(self.tenant, self._jrun, durable=True) as auth:
                # what others journaled is taken in before our own writes are appended: see
                # test_guarded_rollback (a position must never pass an entry not there)
                rows = await auth.read(self.applied_seq)
                if rows:
                    await self._apply_remote(rows)
                lone = self._decide_lone(auth, txn, taken)
                if lone is not True:
                    # from the first write applied on, the group is seen through: no
                    # cancellation between a write applied to the document and its entry
                    with anyio.CancelScope(shield=True):
                        await self._decide_rounds(auth, txn, taken, lone is False)
        except _NothingAccepted:
            self._inflight.clear()  # (the committer journals the pending entries)
            return
        except BaseException as exc:
            self._inflight.clear()
            self._requeue(txn)
            for w in taken:
                if not w.done:
                    w.settle(error=exc)
            raise
        finally:
            lock.release()
        self._inflight.clear()
        self._committed_group(txn)

    def _decide_lone(self, auth: Authority, txn: _Txn, taken: _List[_Waiting]) -> bool | None:
        """Decide the group's one write with no await when it is alone (no other writer about,
        nothing pending, no fence) and the authority appends synchronously: True, accepted
        (the group is done: nothing can cancel it between its apply and its append, so no
        shield is needed); False, refused (the rounds follow: its retry may join); None, not
        a lone write (the rounds decide it)."""
        queue = self._guard_queue
        if self._guard_crowd > 1 or len(queue) != 1 or self._pending or self._txn_task is not None:
            return None
        now = getattr(auth, "append_now", None)
        w = queue[0]
        if now is None or w.fence is not None or w.done:
            return None
        queue.clear()
        taken.append(w)
        made = self._made(txn, w)
        if made is None:
            return False
        update, version = made
        if update is None:  # it changes nothing: only the guard was checked
            txn.unchanged.append((w, version))
        else:
            entry = (update, w.ops, w.meta)
            try:
                (seq,) = now(self._entries([entry]))
            except BaseException:  # in the document: the committer journals it
                self._enqueue(update, w.ops, w.meta)
                raise
            self._took(txn, w, entry, seq)
        self._guard_crowd = 1
        return True

    async def _decide_rounds(
        self, auth: Authority, txn: _Txn, taken: _List[_Waiting], refused_first: bool
    ) -> None:
        """The rounds of a group (see the module docstring), shielded by the caller: decide the
        queued writes, and those that come while the transaction waits open (a window).
        ``refused_first``: the group's lone write was refused already (:meth:`_decide_lone`)."""
        queue = self._guard_queue
        window: _Window | None = None  # (made when a group first waits)
        crowd = self._guard_crowd > 1
        rounds = 0
        while rounds < GROUP_ROUNDS and self._txn_task is None:
            batch = [w for w in queue if not w.done]
            queue.clear()
            taken += batch
            refused, refused_first = refused_first, False
            for w in batch:
                await self._append_pending(auth, txn)
                if not await self._decide(auth, txn, w):
                    refused = True
            if not (refused or crowd or queue):
                break
            # the refused writers read again and retry, and writers that come
            # now (a success's next read) decide at once: into this transaction;
            # until two rounds pass with no one (a writer woken with us may run
            # after us: trio's order)
            quiet = 0
            if window is None:
                now = getattr(auth, "append_now", None)
                if now is not None:
                    window = _Window(auth, now, txn, taken)
            while rounds < GROUP_ROUNDS and quiet < 2 and not queue:
                rounds += 1
                joined = 0 if window is None else window.joined
                self._guard_window = window
                try:
                    await anyio.lowlevel.checkpoint()
                finally:
                    self._guard_window = None
                if window is not None and window.failed is not None:
                    raise window.failed
                # (no window: no one can join, the queue is all)
                quiet = 2 if window is None else 0 if window.joined > joined else quiet + 1
            if not queue:
                break
            crowd = False
        self._guard_crowd = len(taken)
        if txn.pending == len(txn.entries) and not txn.unchanged:
            raise _NothingAccepted  # every write refused: the append is undone
        await self._append_pending(auth, txn)  # plain writes made meanwhile

    async def _join_window(self, window: _Window, w: _Waiting) -> int:
        """Decide ``w`` at once in the group under way (the writer read the state that group
        has reached, with nothing in between: a success's next read-increment-write chains
        on it in the same transaction), then wait for the group's commit."""
        window.taken.append(w)
        window.joined += 1
        self._append_pending_now(window)
        made = self._made(window.txn, w)
        if made is not None:
            update, version = made
            if update is None:
                window.txn.unchanged.append((w, version))
            else:
                entry = (update, w.ops, w.meta)
                try:
                    (seq,) = window.now(self._entries([entry]))
                except BaseException as exc:  # in the document: the committer journals it
                    self._enqueue(update, w.ops, w.meta)
                    window.failed = exc  # and the group fails (see _decide_group)
                    w.settle(error=exc)
                else:
                    self._took(window.txn, w, entry, seq)
        if not w.done:
            w.event = anyio.Event()
            await w.event.wait()  # (cancelled: the group decides it all the same)
        return w.outcome()

    def _append_pending_now(self, window: _Window) -> None:
        """:meth:`_append_pending` with the authority's synchronous append."""
        txn = window.txn
        pending = self._pending
        if len(pending) > txn.pending:
            new = list(pending)[txn.pending :]
            self._took_pending(txn, new, window.now(self._entries(new)))

    async def _append_pending(self, auth: Authority, txn: _Txn) -> None:
        """Append the record's own entries made since the group's last append (plain writes,
        and what a failed apply left): the journal order stays the order they were made in."""
        pending = self._pending
        if len(pending) <= txn.pending:
            return
        new = list(pending)[txn.pending :]
        self._took_pending(txn, new, await auth.append(self._entries(new)))

    def _took_pending(self, txn: _Txn, new: _List[_Entry], seqs: _List[int]) -> None:
        txn.pending += len(new)
        inflight = self._inflight
        for entry, seq in zip(new, seqs, strict=True):
            inflight[id(entry[2])] = seq
        txn.entries += new
        txn.seqs += seqs
        txn.writes += [None] * len(new)

    async def _decide(self, auth: Authority, txn: _Txn, w: _Waiting) -> bool:
        """Decide one write against the state the transaction has reached: refuse it (told at
        once; False), or apply and append it (True)."""
        if w.fence is not None:
            try:
                await self._check_fence(auth, *w.fence)
            except Exception as exc:
                w.settle(error=exc)
                return False
        made = self._made(txn, w)
        if made is None:
            return False
        update, version = made
        if update is None:  # it changes nothing: only the guard was checked
            txn.unchanged.append((w, version))
            return True
        entry = (update, w.ops, w.meta)
        (seq,) = await auth.append(self._entries([entry]))
        self._took(txn, w, entry, seq)
        return True

    def _made(self, txn: _Txn, w: _Waiting) -> tuple[bytes | None, int] | None:
        """Check ``w``'s guard against the state the transaction has reached and apply it: its
        update (None: it changes nothing) and the version it was decided on; or None, and
        ``w`` refused (settled with its error)."""
        usage = None
        try:
            version = self.version(w.name, w.key)
            if w.expected is not None and version != w.expected:
                raise StaleVersion(w.name, w.key, w.expected, version, _current(txn, w, version))
            based_on = w.based_on
            if based_on is not None:
                now_seq = self._scope_seq(based_on.scope, txn.entries, txn.seqs)
                if now_seq != based_on.seq:
                    scope = None if based_on.scope == "*" else based_on.scope
                    raise StaleVersion(scope or "*", None, based_on.seq, now_seq)
            ops = w.ops
            usage = self._enforce(ops, conditional=True) if self._specs else None
            replica = self.replica
            try:
                if len(ops) == 1 and ops[0][0] == "map" and ops[0][2] == "set":
                    # one map set (``apply`` does what the op says): straight to yrs, as a
                    # plain write's, without pycrdt's Python frames
                    update = replica.local_set(replica.root(ops[0][1], "map"), ops, w.meta)
                else:
                    update = replica.local(ops, w.apply, w.meta)
            except BaseException:
                partial, replica.partial_update = replica.partial_update, None
                if partial is not None:  # applied in part: journaled (no rollback)
                    self._enqueue(partial, ops, w.meta)
                raise
            finally:
                self._account(usage)
        except Exception as exc:
            w.settle(error=exc)
            return None
        return update, version or 0

    def _took(self, txn: _Txn, w: _Waiting, entry: _Entry, seq: int) -> None:
        self._inflight[id(w.meta)] = seq
        txn.entries.append(entry)
        txn.seqs.append(seq)
        txn.writes.append(w)

    def _requeue(self, txn: _Txn) -> None:
        """The group failed: nothing of it was journaled. Queue its accepted writes (they are
        in the document) for the committer, in the group's order and before what was written
        after it, so that the journal order stays causal."""
        accepted = [e for e, w in zip(txn.entries, txn.writes, strict=True) if w is not None]
        if not accepted:
            return
        pending = self._pending
        later = list(pending)[txn.pending :]  # (its first txn.pending are the group's)
        pending.clear()
        pending.extend(txn.entries)
        pending.extend(later)
        self._written += len(accepted)
        stamps = self._stamps
        if stamps:
            for _, ops, _ in accepted:
                for op in ops:
                    stamps[op[1]] = stamps.get(op[1], 0) + 1
        if self._committer_idle:
            self._committer_idle = False
            self._pending_event.set()

    def _committed_group(self, txn: _Txn) -> None:
        """The group committed: mark its entries journaled (as the committer's
        ``_mark_committed`` does), and give the writes their positions."""
        entries, seqs = txn.entries, txn.seqs
        if entries:
            pending = self._pending
            for _ in range(txn.pending):
                pending.popleft()
            self.replica.journaled_many(entries, seqs)
            if self._fast and txn.pending:  # (appends of other writers among them)
                mine = [i for i, w in enumerate(txn.writes) if w is None]
                self._fast_committed([entries[i] for i in mine], [seqs[i] for i in mine])
            accepted = len(entries) - txn.pending
            self._written += accepted
            self._committed += len(entries)
            # the group's positions follow one another from the head it read
            if seqs[0] == self.applied_seq + 1:
                self.applied_seq = seqs[-1]
            self._fire_commit()
            last = seqs[-1]
            own_watch = self._watch if last == self.applied_seq else None
            self._store._notifier.notify(self.tenant, self._jrun, last, own=own_watch)
            self._store._after_commit(self._jrun, last)
        for entry, seq, w in zip(entries, seqs, txn.writes, strict=True):
            if w is None:
                continue
            if self._subscribers:
                self._emit(entry[1], entry[2].agent, entry[2].source, seq, local=True)
            w.settle(seq)
        for w, version in txn.unchanged:
            w.settle(version)

    async def _check_fence(self, auth: Authority, lease: Lease, resource: str) -> None:
        """The lease fencing check, inside the authority transaction of the write it guards:
        the lease must still be granted, cover ``resource`` and hold the newest token."""
        await self._check_fence_ids(auth, lease.lease_id, lease.token, resource)

    async def _check_fence_ids(
        self, auth: Authority, lease_id: str, token: int, resource: str
    ) -> None:
        await self._store.leases.backend.check_within(auth, self.tenant, lease_id, resource, token)
