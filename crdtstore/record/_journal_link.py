"""The link to the journal: loading, the committer and the tail.

A record opens by applying its run's snapshot and journal (:meth:`JournalLink._load`), then
two background tasks keep it in step:

- the *committer* appends local entries to the journal in the order they were made (group
  commit: whatever accumulated while the previous append ran goes in the next one), and marks
  them committed (their journal positions become the keys' provenance);
- the *tail* applies entries other writers appended, in journal order, woken by the store's
  notifier (and by a slow poll, in case a wake-up was lost); while it waits, a wake-up whose
  entries the backend holds at hand applies them at once (:meth:`JournalLink._take_kept`).

``flush`` waits for the committer; ``sync`` does the tail's work now.
"""

from __future__ import annotations

import logging
import time
from builtins import list as _List
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from operator import itemgetter
from typing import Any

import anyio

from .._errors import (
    BackendError,
    CrdtStoreError,
    InvalidValue,
    JournalCorrupt,
    RunClosed,
    StoreClosed,
)
from .._gc_pause import collector_paused
from .._heap import release_free_memory
from .._journal import JournalEntry, NewEntry, Op, checksum
from ._changes import Changes
from ._loop_commit import CommitObserver, LoopCommit, loop_schedulers
from ._provenance import Meta
from ._state import READ_CHUNK, SYNC_FIRST

log = logging.getLogger("crdtstore.record")

# Opening reads the journal in small chunks: each chunk's decoded effects are garbage once
# applied, and 10,000 rows of them scattered the keys the index keeps over half-empty memory
# pools (bench/memory.py); and a read of at most the SQLite backend's INLINE_ROWS rows is
# served on the event loop thread, without a hop to a worker thread and back per chunk
# (which cost more CPU than the read itself on a loaded machine, bench/resume.py).
LOAD_CHUNK = 256

_tuple_new = tuple.__new__
_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)
# a Meta's agent, source, run and call
_META_NAMES = (itemgetter(0), itemgetter(1), itemgetter(4), itemgetter(5))


class JournalLink(Changes):
    """The journal side of a record (see the module docstring)."""

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
        # record (100k keys: 2.4x a raw doc instead of 1.9x, bench/memory.py). Each chunk is
        # read and applied with the cyclic collector paused: its rows, effects and
        # bookkeeping, none in a cycle, otherwise start collections whose survivors start
        # full ones (a tenth of a 100k-entry resume, bench/resume.py); one pause for both,
        # or the first allocation between them collects the chunk's rows. The read is in the
        # pause only where the backend serves it on the loop thread (``small_reads_inline``:
        # SQLite), so no other task runs in it; a read over the network is not paused for.
        # The provenance index is packed once at the end.
        read_pause = collector_paused if self._backend.small_reads_inline else nullcontext
        while True:
            with read_pause():
                rows = await self._backend.read(
                    self.tenant, self._jrun, self.applied_seq, LOAD_CHUNK
                )
                if not rows:
                    break
                with collector_paused():  # (nothing more if the read's pause holds)
                    self.replica.apply_rows(rows, self._jrun, settle=False, own=False)
                self.applied_seq = rows[-1].seq
                del rows
            await anyio.lowlevel.checkpoint()  # let other tasks run
        self.replica._settle()  # (packed once, see apply_rows)
        # the chunks' rows and effects are freed: give their pages back to the system
        release_free_memory()
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

    def commit_on_loop(self, journal_window: float = 0.0) -> LoopCommit | None:
        """Journal this record's entries by a group commit on the running event loop from
        now on (:mod:`._loop_commit`: what a hub does for the many writers of one record),
        if the record is ``batched`` and its backend can append at once; else leave them to
        the committer and return None. Call from the loop's thread, after ``start()``.

        Args:
            journal_window: seconds a batch may wait for more updates to share its commit
                while nobody waits for it (asyncio only; 0: commit in the same iteration).
        """
        append_now = getattr(self._backend, "append_now", None)
        if self.durability != "batched" or append_now is None:
            return None
        call_soon, call_later = loop_schedulers()
        if call_soon is None:
            return None
        self._commit_policy = LoopCommit(self, append_now, call_soon, call_later, journal_window)
        return self._commit_policy

    def observe_commits(self, observer: CommitObserver | None) -> None:
        """Call ``observer(path, entries, seconds)`` after each journal commit of this record
        (``path``: ``"loop"`` for :meth:`commit_on_loop`'s group commit, ``"committer"`` for
        the committer task's); None stops. A hub's metrics time commits with it. Guarded
        writes, which append inside an authority transaction, are not reported."""
        self._commit_observer = observer

    @property
    def is_open(self) -> bool:
        """Started and not closed (writes and reads work)."""
        return self._state == "open"

    @property
    def pending_writes(self) -> int:
        """Local entries written and not journaled yet."""
        return len(self._pending)

    async def reset_position(self, seq: int, *, missing: bytes | None = None) -> bool:
        """Move this record's journal position back to ``seq`` (if it is past it), so that
        its tail reads again what the journal holds after ``seq``; first merge ``missing``,
        bytes the journal holds that the document lacks (applied as they are: they are not
        journaled again). Waits for an open transaction to end. A ``ws://`` link does this
        when its hub lost entries the record took in (a restored backup). Returns whether
        the position moved.

        Raises:
            InvalidValue: ``seq`` is not an int >= 0.
        """
        if type(seq) is not int or seq < 0:
            raise InvalidValue(f"seq must be an int >= 0, not {seq!r}")
        while self._txn_task is not None:  # never inside a local transaction
            await self._txn_idle.wait()
        if missing is not None and missing not in (b"", b"\x00\x00"):
            self.replica.apply_update(missing, trial_decode=False, size_limit=False)
            self._invalidate_all()
        if seq >= self.applied_seq:
            return False
        self.applied_seq = seq
        self._applied_foreign = {s for s in self._applied_foreign if s <= seq}
        return True

    @property
    def commit_policy(self) -> LoopCommit | None:
        """The group commit installed by :meth:`commit_on_loop` (None: the committer's)."""
        return self._commit_policy

    async def _wait_committed(self, target: int) -> None:
        policy = self._commit_policy
        if policy is not None and self._committed < target:
            policy.urge()
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
            raise StoreClosed("record", "new")
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
                started = time.perf_counter()
                durable = self.durability == "durable"
                by_columns = getattr(self._backend, "append_columns", None)
                columns = None
                try:
                    if by_columns is not None and not self._fast:
                        columns = self._columns(batch)
                        seqs = await by_columns(self.tenant, self._jrun, columns, durable=durable)
                    else:
                        seqs = await self._backend.append(
                            self.tenant, self._jrun, self._entries(batch), durable=durable
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
                self._mark_committed(batch, seqs, columns)
                observer = self._commit_observer
                if observer is not None:
                    observer("committer", len(seqs), time.perf_counter() - started)
                del batch, seqs, columns  # do not hold the last batch while idle

    def _columns(self, batch: _List[tuple[bytes, _List[Op], Meta]]) -> _List[_List[Any]]:
        """The journal entries of ``batch`` (of this record's own, none of ``_fast``) by
        columns, for a backend's ``append_columns``: :class:`NewEntry`'s fields in order, each
        a list with an item per entry or, when every entry has the same, that one item (the
        writer's names, the client id). Taken at C speed, without a tuple per entry."""
        n = len(batch)
        updates = list(map(_first, batch))
        metas = list(map(_third, batch))
        agents, sources, runs, calls = (list(map(get, metas)) for get in _META_NAMES)
        agents, sources, runs, calls = (
            col[:1] if col.count(col[0]) == n else col for col in (agents, sources, runs, calls)
        )
        walls = list(map(_third, metas))
        crcs = list(map(checksum, updates))
        ops = list(map(_second, batch))
        return [agents, sources, [self.replica.client_id], walls, updates, ops, crcs, runs, calls]

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
        self,
        batch: _List[tuple[bytes, _List[Op], Meta]],
        seqs: _List[int],
        columns: _List[_List[Any]] | None = None,
    ) -> None:
        """Mark ``batch`` journaled at ``seqs``; ``columns``, if not None, is what
        :meth:`_columns` made of it (the replica reads its columns instead of taking them
        again)."""
        pending = self._pending
        if len(pending) == len(batch):  # the usual case: nothing was written meanwhile
            pending.clear()
        else:
            for _ in batch:
                pending.popleft()
        self.replica.journaled_many(batch, seqs, columns)
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

    async def _tail(self) -> None:
        assert self._watch is not None
        watch = self._watch
        kept = getattr(self._backend, "kept", None)  # (see _take_kept)
        direct = None if kept is None else partial(self._take_kept, kept)
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
            watch.direct = direct
            try:
                while True:
                    await event.wait()
                    if watch.blind != blind or watch.head > self.applied_seq:
                        break
                    # it announced entries this record has already taken in: keep waiting
                    event = watch.event
            finally:
                watch.direct = None

    def _take_kept(self, kept: Callable[[str, str, int, int], _List[Any] | None]) -> bool:
        """A wake-up while the tail waits: apply the entries it announces here and now when
        the backend has them at hand (``kept``: the redis stream read's entries), no local
        transaction is open, and they continue from this record's position; True when done
        (the tail task is not woken: one task hop less per entry of another process)."""
        if self._txn_task is not None or self._state != "open":
            return False
        try:
            rows = kept(self.tenant, self._jrun, self.applied_seq, 256)
            if not rows or len(rows) == 256 or rows[0].seq != self.applied_seq + 1:
                return False  # (nothing new here, a backlog, or a gap: the tail task reads)
            self._apply_now(rows)
        except Exception:  # (the tail task reads them again, and reports what fails)
            log.exception("applying the entries of %s/%s failed", self.tenant, self.run)
            return False
        return True

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
        self._apply_now(rows)

    def _apply_now(self, rows: _List[Any]) -> None:
        """Apply ``rows`` (past this record's position, outside a local transaction)."""
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

    async def sync(self) -> int:
        """Apply every entry the journal holds now; return the journal position reached.

        Useful before a decision that must see the latest writes of other processes (the
        tail does this in the background within milliseconds anyway).
        """
        self._check_open()
        # a checkpoint whatever the backend does: a task that syncs in a loop (claim, sync,
        # claim again) lets the others run (the lease holder it waits for among them)
        await anyio.lowlevel.checkpoint()
        limit = SYNC_FIRST
        while True:
            rows = await self._backend.read(self.tenant, self._jrun, self.applied_seq, limit)
            if not rows:
                return self.applied_seq
            await self._apply_remote(rows)
            limit = READ_CHUNK

    async def journal(self, after: int = 0, limit: int = 1000) -> _List[JournalEntry]:
        """Journal entries of this run after position ``after``."""
        self._check_open()
        rows = await self._backend.read(self.tenant, self._jrun, after, limit)
        return [JournalEntry.from_row(self._jrun, r) for r in rows]
