"""Replay and compaction of a store's runs: rebuild a run's record from its snapshot and
journal (:meth:`Store.replay`), merge the journal into a new snapshot (:meth:`Store.compact`,
one compactor of a run at a time where the backend asks for a lease), and the automatic
compaction a record's commits start in the background (``auto_compact``).

A mixin of :class:`~crdtstore._store.Store`, which sets the attributes it declares.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup
from pydantic import BaseModel, ConfigDict

from ._errors import LeaseHeld
from ._gc_pause import collector_paused
from ._heap import release_free_memory
from ._journal import JournalBackend, RunInfo, SnapshotRow
from ._leases import Lease
from .record._replica import Replica
from .record._state import READ_CHUNK

log = logging.getLogger("crdtstore.store")

# journal entries a replay reads and applies between two yields to other tasks: small reads
# where the backend serves them on the event loop thread (``small_reads_inline``: SQLite;
# compaction then takes 0.85x the CPU time of reads of 10,000 entries in a worker thread,
# bench/resume.py), else READ_CHUNK (one round trip to a server each)
_READ = 256
_PROGRESS = 10_000  # entries between two calls of a replay's ``progress`` (and at the end)

_SNAPSHOT_BYTES_PER_ENTRY = 1000
"""Automatic compaction waits for one journal entry per this many bytes of the run's last
snapshot when that is more than ``auto_compact``: a compaction costs about as much as
applying the snapshot, so the journal tail then costs about as much at open as the snapshot
(the per-byte and per-entry costs are in bench/README.md, ``resume.py``), and compacting
does not grow with the square of the run."""


class CompactionResult(BaseModel):
    """What :meth:`Store.compact` did."""

    model_config = ConfigDict(frozen=True)

    run: str
    seq: int
    entries: int
    snapshot_bytes: int
    journal_dropped: bool
    seconds: float


COMPACTION_ITEMS = "__crdtstore_compaction"
"""The collection of the work items whose leases are runs' compaction leases (see
:meth:`Store.compact`)."""


class _Compaction:
    """Replay and compaction (see the module docstring)."""

    tenant: str
    max_update: int
    auto_compact: int | None
    _backend: JournalBackend
    _compacting: set[str]
    _snapshot_at: dict[str, int]
    _snapshot_bytes: dict[str, int]
    _head_seen: dict[str, int]
    _tg: TaskGroup | None
    _state: str

    if TYPE_CHECKING:  # of Store

        async def run_info(self, run: str) -> RunInfo: ...

        def lease(
            self,
            resources: Iterable[str],
            *,
            ttl: float = 30.0,
            owner: str | None = None,
            wait: bool = True,
            timeout: float | None = None,
            key: tuple[str, int] | None = None,
        ) -> Lease: ...

    async def replay(
        self,
        run: str,
        *,
        until: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> Replica:
        """Rebuild the run's record from its journal up to position ``until`` (inclusive;
        None for all) into a detached replica, for inspection and time travel.

        Starts from the newest snapshot when it does not pass ``until``. If the journal
        prefix being read is dropped meanwhile (a compaction with ``drop_journal``, a
        redaction), the replay starts again from the newer snapshot.
        """
        info = await self.run_info(run)
        target = info.head if until is None else min(until, info.head)
        for _ in range(3):
            replica, from_seq, gap = await self._replay_once(run, target, progress)
            if not gap:
                break
            now = await self.run_info(run)
            if now.snapshot_seq == from_seq or (until is not None and now.snapshot_seq > until):
                break  # the gap predates this replay (a prefix dropped long ago): as before
            log.info("journal of %s/%s dropped during replay; replaying again", self.tenant, run)
            if until is None:
                target = now.head
        return replica

    async def _replay_once(
        self, run: str, target: int, progress: Callable[[int, int], None] | None
    ) -> tuple[Replica, int, bool]:
        """One replay; return the replica, the snapshot position it started from and whether
        the journal had a gap (entries missing between two positions read)."""
        replica = Replica(max_update=self.max_update)
        seq = start = 0
        snap = await self._backend.load_snapshot(self.tenant, run)
        if snap is not None and snap.seq <= target:
            replica.apply_update(
                snap.update, trial_decode=False, size_limit=False
            )  # our own snapshot
            replica.import_state(snap.state)
            seq = start = replica.seq = snap.seq
        del snap
        # Entry by entry in journal order (apply_rows, as a record's opening), not a
        # BulkLoad: in groups of one transaction it applies faster than merging groups,
        # and a key's provenance read once per group costs less than holding every write
        # of it until the end (bench/resume.py). The replica is new: nothing of its own.
        gap = False
        reported = seq
        chunk = READ_CHUNK
        inline = self._backend.small_reads_inline
        if inline:
            chunk = min(chunk, _READ)
        read_pause = collector_paused if inline else nullcontext  # (as JournalLink._load)
        while seq < target:
            with read_pause():
                rows = await self._backend.read(self.tenant, run, seq, min(chunk, target - seq))
                if not rows:
                    break
                gap = gap or rows[0].seq != seq + 1
                with collector_paused():
                    replica.apply_rows(rows, run, settle=False, own=False)
                seq = replica.seq = rows[-1].seq
                del rows
            await anyio.lowlevel.checkpoint()  # let other tasks run
            if progress is not None and (seq - reported >= _PROGRESS or seq >= target):
                progress(seq, target)
                reported = seq
        replica._settle()  # (packed once: see apply_rows)
        return replica, start, gap

    async def compact(
        self,
        run: str,
        *,
        drop_journal: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> CompactionResult:
        """Merge the run's journal into a snapshot, so that opening it reads the snapshot and
        only the entries after it.

        Processes that are tailing the run keep working: the journal entries stay (they are
        the audit trail) unless ``drop_journal``; a reader that falls behind a dropped prefix
        takes the snapshot instead.

        On a backend shared by many processes that asks for it (``compaction_lease``:
        Redis), the compaction holds the run's compaction lease (the work item
        ``__crdtstore_compaction/<run>``), waiting for another process's compaction of the
        run to end first: one compactor of a run at a time.
        """
        return await self._compact(run, drop_journal, progress, wait=True)

    async def _compact(
        self,
        run: str,
        drop_journal: bool,
        progress: Callable[[int, int], None] | None,
        *,
        wait: bool,
    ) -> CompactionResult:
        """:meth:`compact`; ``wait``: False to raise ``LeaseHeld`` at once when another
        process compacts the run (the automatic compaction then leaves it to that one)."""
        lease: Lease | None = None
        if getattr(self._backend, "compaction_lease", False):
            from ._leases import item_resource

            resource = item_resource(COMPACTION_ITEMS, run)
            lease = self.lease([resource], ttl=30.0, owner="compactor", wait=wait)
            await lease.acquire()
        try:
            return await self._compact_held(run, drop_journal, progress)
        finally:
            if lease is not None:
                with anyio.CancelScope(shield=True):
                    await lease.release()

    async def _compact_held(
        self, run: str, drop_journal: bool, progress: Callable[[int, int], None] | None
    ) -> CompactionResult:

        started = time.perf_counter()
        info = await self.run_info(run)
        replica = await self.replay(run, progress=progress)
        update = replica.doc.get_update()
        await self._backend.save_snapshot(
            self.tenant,
            run,
            SnapshotRow(replica.seq, update, replica.export_state(), time.time()),
            drop_journal=drop_journal,
        )
        result = CompactionResult(
            run=run,
            seq=replica.seq,
            entries=replica.seq - info.snapshot_seq,
            snapshot_bytes=len(update),
            journal_dropped=drop_journal,
            seconds=time.perf_counter() - started,
        )
        del replica, update  # the scratch document: its pages go back to the system
        release_free_memory()
        return result

    def _after_commit(self, run: str, head: int) -> None:
        """A record of ``run`` (the journal's run) committed entries up to ``head``: start a
        background compaction when more than ``auto_compact`` entries (or one per
        ``_SNAPSHOT_BYTES_PER_ENTRY`` bytes of the last snapshot this store made, if more)
        follow the snapshot last seen, unless one of this store is already running for it.

        Across processes, a compactor that finds a fresh snapshot does nothing, and saving
        keeps whichever snapshot covers more (one short write transaction).
        """
        limit = self.auto_compact
        if limit is None:
            return
        if head > self._head_seen.get(run, 0):
            self._head_seen[run] = head
        if self._state != "open" or run in self._compacting:
            return
        limit = max(limit, self._snapshot_bytes.get(run, 0) // _SNAPSHOT_BYTES_PER_ENTRY)
        if head - self._snapshot_at.get(run, 0) <= limit:
            return
        assert self._tg is not None
        self._compacting.add(run)
        self._tg.start_soon(self._auto_compact, run, limit, head)

    async def _auto_compact(self, run: str, limit: int, head: int) -> None:
        done = False
        try:
            info = await self.run_info(run)
            self._snapshot_at[run] = info.snapshot_seq
            if info.head - info.snapshot_seq > limit:  # else another process compacted it
                result = await self._compact(run, False, None, wait=False)
                self._snapshot_at[run] = result.seq
                self._snapshot_bytes[run] = result.snapshot_bytes
                log.debug(
                    "auto-compacted %s/%s up to %d in %.2fs (%d bytes)",
                    self.tenant,
                    run,
                    result.seq,
                    result.seconds,
                    result.snapshot_bytes,
                )
                done = True
        except LeaseHeld:  # another process compacts it now
            self._snapshot_at[run] = max(self._snapshot_at.get(run, 0), head)
        except Exception as exc:  # background work must not take the store down
            # do not retry before another ``limit`` entries
            self._snapshot_at[run] = max(self._snapshot_at.get(run, 0), head)
            log.warning("automatic compaction of %s/%s failed: %s", self.tenant, run, exc)
        finally:
            self._compacting.discard(run)
        if done:  # entries committed while it ran may call for the next one already
            self._after_commit(run, self._head_seen.get(run, 0))
