"""The life of a store's runs after they are made: close, archive (close and compact), a
retention deadline and the sweep that deletes runs past it, deletion of a run and its nested
runs, and redaction of one value from the record, its snapshots and its journal.

A mixin of :class:`~crdtstore._store.Store`, which sets the attributes it declares.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ._errors import CrdtStoreError, InvalidValue
from ._journal import Durability, JournalBackend, NewEntry, RunInfo, RunRow, checksum
from ._names import check_key, check_name
from ._notify import Notifier
from ._semantics import CollectionSpec
from .record._record import Record

if TYPE_CHECKING:
    from ._store_compaction import CompactionResult

log = logging.getLogger("crdtstore.retention")


def _info(row: RunRow) -> RunInfo:
    return RunInfo(**row._asdict())


class _RunLifecycle:
    """Closing, archiving, retention, deletion and redaction of runs (see the module
    docstring)."""

    tenant: str
    _backend: JournalBackend
    _records: set[Record]
    _notifier: Notifier

    if TYPE_CHECKING:  # of Store

        def _check_open(self) -> None: ...

        async def run_info(self, run: str) -> RunInfo: ...

        async def compact(
            self,
            run: str,
            *,
            drop_journal: bool = False,
            progress: Callable[[int, int], None] | None = None,
        ) -> CompactionResult: ...

        def open_record(
            self,
            run: str,
            agent: str,
            source: str = "model",
            *,
            durability: Durability | None = None,
            create: bool = True,
            schema: Mapping[str, CollectionSpec] | None = None,
            parent: str | None = None,
            salvage: bool = False,
        ) -> Record: ...

    async def delete_run(self, run: str) -> bool:
        """Delete every byte of ``run`` and of the runs nested in it (journal, snapshots,
        keys, config); return whether it existed.

        Records of those runs open in this process are closed first. On SQLite the freed
        pages are zeroed (``secure_delete``) and the WAL is checkpointed, so the values do not
        linger in the file.
        """
        self._check_open()
        check_name("run", run)
        for rec in [r for r in self._records if run in (r.run, r._jrun)]:
            await rec.aclose()
        return await self._backend.delete_run(self.tenant, run)

    async def close_run(self, run: str) -> RunInfo:
        """Close a run: its record stays readable, every further write is refused with
        :class:`RunClosed` (open records learn it at their next journal append)."""
        await self.run_info(run)
        return _info(await self._backend.set_run(self.tenant, run, state="closed"))

    async def archive_run(self, run: str) -> RunInfo:
        """Close a run and compact its journal into a snapshot (the journal is kept)."""
        await self.close_run(run)
        await self.compact(run)
        return _info(await self._backend.set_run(self.tenant, run, state="archived"))

    async def set_retention(self, run: str, *, delete_after: float | None) -> RunInfo:
        """Delete ``run`` (and its nested runs) once ``delete_after`` seconds from now have
        passed, at the next :meth:`sweep`; None removes the deadline."""
        await self.run_info(run)
        if delete_after is not None and not (delete_after >= 0):
            raise InvalidValue(f"delete_after must be >= 0 seconds, not {delete_after!r}")
        deadline = None if delete_after is None else time.time() + delete_after
        return _info(await self._backend.set_run(self.tenant, run, delete_after=deadline))

    async def sweep(self, *, now: float | None = None) -> list[str]:
        """Delete every run of this tenant whose retention deadline has passed; return
        their names.

        The backend decides each deletion again, atomically with it
        (``JournalBackend.delete_run_if_due``): a run whose deadline a concurrent
        ``set_retention`` moved past ``now`` is kept, and nothing is deleted of a run that
        was not expired. Records of a deleted run open in this process are closed after it
        (what they had not journaled went with the run).

        Raises:
            UnsupportedOperation: the backend cannot sweep (``ws://``: the hub sweeps).
        """
        self._check_open()
        now = time.time() if now is None else now
        due = [
            r.run
            for r in await self._backend.list_runs(self.tenant)
            if r.delete_after is not None and r.delete_after <= now
        ]
        deleted = []
        for run in due:
            if not await self._backend.delete_run_if_due(self.tenant, run, now):
                continue
            deleted.append(run)
            for rec in [r for r in self._records if run in (r.run, r._jrun)]:
                try:
                    await rec.aclose()
                except CrdtStoreError as exc:  # its run is gone: nothing left to flush to
                    log.info("closed a record of swept run %s/%s: %s", self.tenant, run, exc)
        return deleted

    async def redact(
        self, run: str, collection: str, key: str, *, agent: str = "crdtstore", reason: str = ""
    ) -> CompactionResult:
        """Remove a value from the live record, from snapshots and from the journal, and
        record the redaction (who, when, why) in the journal.

        The key is deleted through the record, then the journal is compacted into a snapshot
        that no longer holds the value and the journal prefix that did is dropped (that part
        of the audit trail goes with it), then a ``redact`` entry is appended. Records of the
        run open in other processes keep what they hold in memory until they reopen.
        """
        info = await self.run_info(run)
        root = info.run
        while info.parent is not None:
            info = await self.run_info(info.parent)
            root = info.run
        check_name("collection", collection)
        check_key(key)
        async with self.open_record(
            root, agent, "system", durability="durable", create=False
        ) as rec:
            await rec.map(collection).delete(key)
        result = await self.compact(root, drop_journal=True)
        marker = b"\x00\x00"  # an empty update: the entry only carries its effect
        now = time.time()
        origin = "" if run == root else run
        (seq,) = await self._backend.append(
            self.tenant,
            root,
            [
                NewEntry(
                    agent,
                    "system",
                    0,
                    now,
                    marker,
                    [["map", collection, "redact", key, reason]],
                    checksum(marker),
                    origin,
                )
            ],
            durable=True,
        )
        # the run's config keeps every redaction too: a later compaction that drops the
        # journal prefix must not drop the record that a value was removed, and by whom
        note = {
            "seq": seq,
            "collection": collection,
            "key": key,
            "agent": agent,
            "wall_time": now,
            "reason": reason,
            "run": origin or root,
        }
        await self._backend.update_config(
            self.tenant,
            root,
            lambda config: {**config, "redactions": [*config.get("redactions", []), note]},
        )
        self._notifier.notify(self.tenant, root)
        return result
