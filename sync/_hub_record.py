"""A run's record as the hub holds it (:class:`_HubRecord`): writes attributed to the token
of the connection being served, and the group commit of the event loop's iteration (with the
journal window).

**One record per loaded run, provenance per connection.** Every update a connection sends
is applied through the run's one record, which journals it: the updates applied in one
iteration of the event loop (by every connection whose frames arrived together) are
appended in one SQLite commit by a callback at the end of that iteration, on the loop
thread, or by the record's committer when the write lock is not free at once; while nobody
waits for a commit, a run commits plain Yjs clients' updates at most once per
``HubLimits.journal_window`` (20 ms). The record's ``agent`` and ``source`` are read from a
context variable that the connection's task sets around that call, so the journal entry,
the provenance of the keys it wrote and the change events carry the agent and source of the
*token* of the connection that sent the bytes (never anything the client says, and never
``hub``); a context variable is per task, so connections of one run writing at the same
time cannot swap identities.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

try:
    import sniffio
except ImportError:  # pragma: no cover - anyio runs without it (and then assumes asyncio)
    sniffio = None  # type: ignore[assignment]

from crdtstore import CrdtStoreError, Record
from crdtstore._journal import NewEntry, Op
from crdtstore._replica import Meta

if TYPE_CHECKING:
    from ._hub_conn import _Conn

__all__ = ["_CURRENT", "_HubRecord"]

log = logging.getLogger("sync.hub")


# The connection whose frame the current task is applying; the hub's records attribute
# writes to its token's agent (see the module docstring).
_CURRENT: ContextVar[_Conn | None] = ContextVar("sync_hub_connection", default=None)


def _loop_schedulers() -> tuple[
    Callable[[Callable[[], None]], object] | None,
    Callable[[float, Callable[[], None]], Any] | None,
]:
    """``(call_soon, call_later)`` for the running event loop's thread: ``call_soon(f)``
    runs the synchronous callback ``f`` after the tasks that are ready now, ``call_later(d,
    f)`` runs it in ``d`` seconds and returns a handle with ``cancel()`` (asyncio:
    ``loop.call_soon``/``loop.call_later``, in a context that names the library to anyio;
    trio: ``run_sync_soon``, and no ``call_later``); ``(None, None)`` on another loop."""
    try:
        import asyncio

        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        ctx = contextvars.Context()  # (a callback has no task: anyio learns the library here)
        if sniffio is not None:
            ctx.run(sniffio.current_async_library_cvar.set, "asyncio")
        return (
            functools.partial(loop.call_soon, context=ctx),
            functools.partial(loop.call_later, context=ctx),
        )
    try:
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon, None
    except (ImportError, RuntimeError):
        return None, None


class _HubRecord(Record):
    """A run's record opened by the hub: its writes are attributed to the agent and source of
    the token of the connection that the current task serves (``hub``/``system`` outside of
    one). ``Record`` reads ``self.agent``/``self.source`` when it builds a journal entry.

    **Group commit on the loop.** A ``batched`` hub record on a backend that can append at
    once on the event loop thread (SQLite's ``append_now``) journals its entries itself
    instead of waking the record's committer task: the first entry queued in an iteration of
    the event loop schedules one callback (:meth:`_journal`) that runs once the tasks ready in
    that iteration (every connection whose frames arrived together) have run, and appends
    every entry queued by then in one transaction (``synchronous=NORMAL``, as the committer's
    batched appends), then marks them committed (waking ``flush`` waiters). No task switch,
    no anyio lock. When it cannot append at once (the write lock is held by another process
    or another append of this record, the journal is failing, the run's id is not cached),
    it appends nothing and wakes the committer, which journals them as it would any entry
    (retrying, reporting failures to ``flush``).

    **Journal window** (asyncio): when nobody waits for a commit (:meth:`_deferral`), the
    callback runs one ``journal_window`` after the last commit instead (``call_later``), so
    the updates that arrive meanwhile share its commit; a waiter that appears meanwhile
    (:meth:`_urge`) brings it forward to the current iteration.

    The entries of a ``ws://`` client's unguarded ``journal.append`` ride the same group
    commit (``Record._append_fast``: queued as pending entries labelled with the client's
    id; the append is answered with their positions once committed, or with the commit's
    error).
    """

    _hub_agent: str
    _hub_source: str
    _call_soon: Callable[[Callable[[], None]], object] | None = None
    _call_later: Callable[[float, Callable[[], None]], Any] | None = None
    _append_now: Callable[[str, str, Sequence[NewEntry]], list[int] | None] | None = None
    _journal_due = False
    _timer: Any = None  # the handle of a deferred _journal (call_later)
    _last_commit = -math.inf  # time.monotonic() of the last group commit
    journal_window = 0.0
    readers = 0  # connections that read from the journal (ws:// clients): never defer then
    group_commits = 0  # commits made by _journal (tests, metrics)

    def bind_loop(self, journal_window: float = 0.0) -> None:
        """Journal on the running event loop from now on (see the class docstring), if the
        record is ``batched`` and its backend can append at once; else leave it to the
        committer. Call from the loop's thread. ``journal_window``: see
        :attr:`HubLimits.journal_window`."""
        append_now = getattr(self._backend, "append_now", None)
        if self.durability == "batched" and append_now is not None:
            self._append_now = append_now
            self._call_soon, self._call_later = _loop_schedulers()
            self.journal_window = journal_window

    def _enqueue(self, update: bytes, ops: list[Op], meta: Meta) -> None:
        call_soon = self._call_soon
        if call_soon is None:
            super()._enqueue(update, ops, meta)
            return
        idle, self._committer_idle = self._committer_idle, False  # not woken: _journal is
        try:
            super()._enqueue(update, ops, meta)
        finally:
            self._committer_idle = idle
        if self._journal_due:
            if self._timer is not None and (self._fast or self.readers):
                self._urge()  # a ws:// append waits for its answer, or a ws:// client reads
            return
        self._journal_due = True
        delay = self._deferral()
        if delay > 0.0:
            assert self._call_later is not None
            self._timer = self._call_later(delay, self._journal)
        else:
            call_soon(self._journal)

    def _deferral(self) -> float:
        """How long the entries queued now may wait for their commit: until one
        ``journal_window`` after the last commit, when nobody waits for it (no ``flush``, no
        ``ws://`` append, no connection reading the journal, no other process with the store
        open: it may be reading the run); else 0 (this iteration)."""
        window = self.journal_window
        if (
            window <= 0.0
            or self._call_later is None
            or self._fast
            or self.readers
            or self._store._notifier.others_listening()
        ):
            return 0.0
        return self._last_commit + window - time.monotonic()

    def _urge(self) -> None:
        """Journal a deferred batch in this iteration instead of when its timer runs out."""
        timer, self._timer = self._timer, None
        if timer is not None and self._call_soon is not None:
            timer.cancel()
            self._call_soon(self._journal)

    async def _wait_committed(self, target: int) -> None:
        if self._committed < target:
            self._urge()
        await super()._wait_committed(target)

    def _journal(self) -> None:
        """Append every queued entry now in one commit; else leave them to the committer."""
        self._journal_due = False
        self._timer = None
        try:
            if self._commit_now():
                return
        except Exception:  # a bug: never into the loop (trio would stop); the committer retries
            log.exception("group commit of %s/%s failed", self.tenant, self.run)
        if self._committer_idle:
            self._committer_idle = False
            self._pending_event.set()

    def _commit_now(self) -> bool:
        pending = self._pending
        if not pending:
            return True
        append_now = self._append_now
        if (
            append_now is None
            or self._state != "open"
            or self._failure is not None  # the committer is retrying: it keeps the order
            or self._commit_lock.locked()  # an append of this record is under way
        ):
            return False
        batch = list(pending)
        try:
            seqs = append_now(self.tenant, self._jrun, self._entries(batch))
        except CrdtStoreError as exc:
            log.debug("group commit %s/%s: %s (the committer retries)", self.tenant, self.run, exc)
            return False
        if seqs is None:
            return False
        self.group_commits += 1
        self._last_commit = time.monotonic()
        self._mark_committed(batch, seqs)
        return True

    @property
    def agent(self) -> str:
        conn = _CURRENT.get()
        return self._hub_agent if conn is None else conn.claims.agent

    @agent.setter
    def agent(self, value: str) -> None:
        self._hub_agent = value

    @property
    def source(self) -> str:
        conn = _CURRENT.get()
        return self._hub_source if conn is None else conn.claims.source

    @source.setter
    def source(self, value: str) -> None:
        self._hub_source = value

    async def _append_externals(self, updates: Sequence[bytes], **kwargs: Any) -> list[int]:
        # journal ops (sync._ops_journal) apply a connection's entries through here
        # (``_append_external`` too): hold them to the run's document size limit as well
        # (refused: PayloadTooLarge, as an error response; nothing applied or journaled)
        conn = _CURRENT.get()
        if conn is None:
            return await super()._append_externals(updates, **kwargs)
        room, limit = conn.room, conn.limits.max_document_bytes
        reserved = 0
        try:
            for update in updates:  # (the record refuses what is not bytes)
                size = len(update) if isinstance(update, bytes) else 0
                reserved += room.reserve(size, limit)
            return await super()._append_externals(updates, **kwargs)
        finally:
            room.release(reserved)
