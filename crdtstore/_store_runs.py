"""The life of a store's runs after they are made: close, archive (close and compact), a
retention deadline and the sweep that deletes runs past it, deletion of a run and its nested
runs, and redaction of one value from the record, its snapshots and its journal.

A mixin of :class:`~crdtstore._store.Store`, which sets the attributes it declares.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from ._errors import CrdtStoreError, InvalidValue
from ._journal import Durability, JournalBackend, NewEntry, RunInfo, RunRow, checksum
from ._names import check_key, check_name
from ._notify import Notifier
from ._remote_journal import RemoteJournal
from ._semantics import CollectionSpec
from .record._record import Record

if TYPE_CHECKING:
    from ._leases import Lease
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

        def lease(
            self, resources: Iterable[str], *, ttl: float = 30.0, owner: str | None = None
        ) -> Lease: ...

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
        self,
        run: str,
        collection: str,
        key: str | None = None,
        *,
        field: str | None = None,
        index: int | None = None,
        span: tuple[int, int] | None = None,
        agent: str = "crdtstore",
        reason: str = "",
    ) -> CompactionResult:
        """Remove one value from the live record, from the snapshots and from the journal,
        keeping every journal entry, and record the redaction (who, when, why).

        Name the value with one of: ``key`` (a map key of map ``collection``), ``key`` and
        ``field`` (field ``field`` of entry ``key`` of a ``merge="fields"`` map: the physical
        key ``key + "\x1e" + field``), ``index=`` (the list item at that index now), or
        ``span=(start, end)`` (characters ``start .. end - 1`` of the text now).

        The value is deleted through a record (other processes holding the record apply the
        delete and drop the value from memory), then every journal entry that carried it is
        rewritten in place: its update with that content blanked (same clocks), its effect's
        value replaced by ``{"$redacted": {"reason", "agent", "wall_time"}}``; so
        ``history`` and ``crdtstore journal`` still list every write and its agent. A
        ``redact`` entry is appended and the journal compacted into a fresh snapshot
        without the value (see :mod:`crdtstore._store_redact`).

        Through a hub (``ws://``) the hub redacts on its store, as the token's agent
        (``agent`` is not applied), if the token has the ``redact`` right.

        Raises:
            InvalidValue: not exactly one of a key, ``index`` or ``span``, or a bad one.
            IndexError: ``index`` or ``span`` out of range.
            UnsupportedOperation: the backend cannot rewrite entries.
            Forbidden: (``ws://``, code ``FORBIDDEN``) the token lacks the ``redact`` right.
        """
        from ._store_redact import check_target

        kind, physical = check_target(key, field, index, span)
        info = await self.run_info(run)
        root = info.run
        while info.parent is not None:
            info = await self.run_info(info.parent)
            root = info.run
        check_name("collection", collection)
        if key is not None:
            check_key(key)
        if physical is not None:
            check_key(physical)
        backend = self._backend
        if isinstance(backend, RemoteJournal):  # the server redacts (as the token's agent)
            result = await backend.redact(
                self.tenant,
                root,
                collection,
                key,
                field=field,
                index=index,
                span=span,
                reason=reason,
            )
            self._notifier.notify(self.tenant, root)  # this store's records read the delete
            return result
        if type(backend).rewrite_entries is JournalBackend.rewrite_entries:
            from ._errors import UnsupportedOperation

            raise UnsupportedOperation(backend.name, "redact")
        from ._leases import item_resource
        from ._store_redact import REDACTION_ITEMS

        # one redaction of a run at a time, across processes and hubs: two rewriting the
        # same entries from the same bytes would each put back what the other blanked
        resource = item_resource(REDACTION_ITEMS, root)
        async with self.lease([resource], ttl=30.0, owner="redactor"):
            return await self._redact_held(
                run, root, kind, collection, physical, index, span, agent, reason
            )

    async def _redact_held(
        self,
        run: str,
        root: str,
        kind: str,
        collection: str,
        physical: str | None,
        index: int | None,
        span: tuple[int, int] | None,
        agent: str,
        reason: str,
    ) -> CompactionResult:
        """:meth:`redact` of a local backend, holding the run's redaction lease."""
        from ._store_redact import delete_live, marker, rewrite_rows
        from .codec import KeyIndex, decode_update

        backend = self._backend
        async with self.open_record(
            root, agent, "system", durability="durable", create=False
        ) as rec:
            ids, value = await delete_live(rec, kind, collection, physical, index, span)
        now = time.time()
        mark = marker(agent, reason, now)
        keys = KeyIndex()
        snap = await backend.load_snapshot(self.tenant, root)
        if snap is not None and kind == "map":
            keys.index(decode_update(snap.update))
        del snap
        rewritten = []
        after = 0
        while True:
            rows = await backend.read(self.tenant, root, after)
            if not rows:
                break
            rewritten += rewrite_rows(rows, keys, kind, collection, physical, ids, value, mark)
            after = rows[-1].seq
        await backend.rewrite_entries(self.tenant, root, rewritten)
        empty = b"\x00\x00"  # an empty update: the entry only carries its effect
        origin = "" if run == root else run
        where: str | int
        if physical is not None:
            where = physical
        elif span is not None:
            where = span[0]
        else:
            assert index is not None
            where = index
        (seq,) = await backend.append(
            self.tenant,
            root,
            [
                NewEntry(
                    agent,
                    "system",
                    0,
                    now,
                    empty,
                    [[kind, collection, "redact", where, reason]],
                    checksum(empty),
                    origin,
                )
            ],
            durable=True,
        )
        # the run's config keeps every redaction too: a later compaction that drops the
        # journal prefix must not drop the record that a value was removed, and by whom
        note = {
            "seq": seq,
            "kind": kind,
            "collection": collection,
            "key": where,
            "agent": agent,
            "wall_time": now,
            "reason": reason,
            "run": origin or root,
        }
        await backend.update_config(
            self.tenant,
            root,
            lambda config: {**config, "redactions": [*config.get("redactions", []), note]},
        )
        result = await self.compact(root)
        checkpoint = getattr(backend, "checkpoint", None)
        if checkpoint is not None:
            await checkpoint()  # the old snapshot's pages were zeroed: empty the WAL too
        self._notifier.notify(self.tenant, root)
        return result
