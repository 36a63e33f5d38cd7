"""Group commit on the event loop: a record's commit policy for a process that journals many
writers' updates through one record (the hub).

By default a record's committer task journals its pending entries (:mod:`._journal_link`).
:meth:`~._record.Record.commit_on_loop` installs a :class:`LoopCommit` instead, when the record
is ``batched`` and its backend can append at once on the event loop's thread (SQLite's
``append_now``): the first entry queued in an iteration schedules one callback that runs after
the tasks ready in that iteration and appends every entry queued by then in one transaction,
then marks them committed (waking ``flush`` waiters). No task switch, no lock. When it cannot
append at once (write lock held elsewhere, journal failing, run id not cached), it wakes the
committer instead, which journals them as it would any entry.

**Journal window** (asyncio, :meth:`LoopCommit.deferral`): while nobody waits for a commit and
the last one is less than a ``journal_window`` old, a batch waits one window from its first
entry, so the updates arriving meanwhile share its commit (at most one commit per window, no
entry waiting longer). A waiter (a ``flush``, an unguarded ``append_updates``, a reader in
:attr:`LoopCommit.readers`, another process with the store open) brings it forward to the
current iteration. An entry queued once the batch is nearly due makes it ripe: the caller
commits it with :meth:`LoopCommit.ride` once done with it (the hub: relayed), without a
wake-up of its own; else its timer does, after the tasks its wake-up made ready.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

try:
    import sniffio
except ImportError:  # pragma: no cover - anyio runs without it (and then assumes asyncio)
    sniffio = None  # type: ignore[assignment]

from .._errors import CrdtStoreError
from .._journal import NewEntry

if TYPE_CHECKING:
    from ._journal_link import JournalLink

log = logging.getLogger("crdtstore.record")

# A deferred batch that has waited this share of its window (and a window since the last
# commit) is committed with the next entry's iteration (see LoopCommit._ripe)
_RIDE = 0.75

AppendNow = Callable[[str, str, Sequence[NewEntry]], "list[int] | None"]
# (tenant, journal run, the entries, their positions): see LoopCommit.on_committed
Committed = Callable[[str, str, Sequence[NewEntry], "list[int]"], None]

#: ``observer(path, entries, seconds)`` after a journal commit of a record: ``path`` is
#: ``"loop"`` (this module's group commit) or ``"committer"`` (the record's committer task),
#: ``entries`` how many it appended, ``seconds`` how long the append took (see
#: :meth:`~._journal_link.JournalLink.observe_commits`). It runs on the event loop: keep it cheap.
CommitObserver = Callable[[str, int, float], None]


def loop_schedulers() -> tuple[
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


class LoopCommit:
    """The group commit of one record on the event loop (see the module docstring).

    Attributes:
        journal_window: seconds a batch may wait for company when nobody waits for it.
        readers: connections that read the record's journal as it grows (a hub's ``ws://``
            clients): while there are any, nothing is deferred. The owner counts them.
        group_commits: commits made on the loop (tests, metrics).
        ripe: the deferred batch is about due (see :meth:`_ripe`): :meth:`ride` commits it.
    """

    def __init__(
        self,
        rec: JournalLink,
        append_now: AppendNow,
        call_soon: Callable[[Callable[[], None]], object],
        call_later: Callable[[float, Callable[[], None]], Any] | None,
        journal_window: float,
    ) -> None:
        self._rec = rec
        self._append_now = append_now
        self._call_soon = call_soon
        self._call_later = call_later
        self.journal_window = journal_window
        self.readers = 0
        self.group_commits = 0
        self.ripe = False
        self._due = False
        self._timer: Any = None  # the handle of a deferred commit (call_later)
        self._deferred_at = 0.0  # time.monotonic() when the deferred batch's first entry came
        self._last_commit = -math.inf  # time.monotonic() of the last group commit
        self._listeners: list[Committed] = []

    def on_committed(self, listener: Committed) -> Callable[[], None]:
        """Call ``listener(tenant, run, entries, seqs)`` after each group commit, once the
        journal committed ``entries`` at ``seqs`` and before the record marks them committed:
        sync's hub pushes them to its clients from here, without reading them back. A
        listener that raises is logged; the commit stands. Returns a function removing it."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    @property
    def deferred(self) -> bool:
        """A batch waits for its window to end (a timer is set)."""
        return self._timer is not None

    def queued(self) -> None:
        """The record queued an entry: schedule its commit (the record's ``_enqueue``)."""
        if self._due:
            if self._timer is not None:
                if self._rec._fast or self.readers:
                    # a ws:// append waits for its answer, or a ws:// client reads
                    self.urge()
                elif not self.ripe and self._ripe():
                    # the batch is about due: committed by :meth:`ride` after this arrival is
                    # relayed, else (nobody rides) when its timer runs out
                    self.ripe = True
            return
        self._due = True
        delay = self.deferral()
        if delay > 0.0:
            assert self._call_later is not None
            self._deferred_at = time.monotonic()
            self._timer = self._call_later(delay, self._window_end)
        else:
            self._call_soon(self._commit)

    def deferral(self) -> float:
        """How long the first entry of a batch, queued now, may wait for its commit: one
        ``journal_window`` when the last commit is less than a window old and nobody waits
        for it (no ``flush``, no ``ws://`` append, no reader, no other process with the store
        open: it may be reading the run); else 0 (this iteration)."""
        window = self.journal_window
        if (
            window <= 0.0
            or self._call_later is None
            or self._rec._fast
            or self.readers
            or time.monotonic() - self._last_commit >= window
            or self._rec._store.notifier.others_listening()
        ):
            return 0.0
        return window

    def _ripe(self) -> bool:
        """The deferred batch has waited most of its window (``_RIDE``) and the last commit
        is a window old: committing it now keeps one commit per window at most."""
        now = time.monotonic()
        window = self.journal_window
        return now - self._deferred_at >= window * _RIDE and now - self._last_commit >= window

    def urge(self) -> None:
        """Commit a deferred batch in this iteration instead of when its timer runs out."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            self._call_soon(self._commit)

    def ride(self) -> None:
        """Commit a deferred batch now if it is about due (:attr:`ripe`): for the caller that
        queued an entry and is done with what must come before the commit (the hub, after it
        relayed the update). No callback of its own, no event loop iteration: the commit rides
        on the arrival's."""
        if self.ripe:
            timer, self._timer = self._timer, None
            if timer is not None:
                timer.cancel()
                self._commit()
            self.ripe = False

    def _window_end(self) -> None:
        """The deferred batch's timer ran out: commit it after what the same wake-up of the
        loop made ready. An update that arrived as the window ended is in that commit: asyncio
        runs the timer before the task that receives the frame, which would else start a batch
        of its own (a commit more, and a wake-up more, every time they meet)."""
        if self._timer is not None:
            self._timer = None
            self._call_soon(self._commit)

    def _commit(self) -> None:
        """Append every queued entry now in one commit; else leave them to the committer."""
        self._due = self.ripe = False
        self._timer = None
        rec = self._rec
        try:
            if self._commit_now():
                return
        except Exception:  # a bug: never into the loop (trio would stop); the committer retries
            log.exception("group commit of %s/%s failed", rec.tenant, rec.run)
        if rec._committer_idle:
            rec._committer_idle = False
            rec._pending_event.set()

    def _commit_now(self) -> bool:
        rec = self._rec
        pending = rec._pending
        if not pending:
            return True
        if (
            rec._state != "open"
            or rec._failure is not None  # the committer is retrying: it keeps the order
            or rec._commit_lock.locked()  # an append of this record is under way
        ):
            return False
        batch = list(pending)
        started = time.perf_counter()
        try:
            entries = rec._entries(batch)
            seqs = self._append_now(rec.tenant, rec._jrun, entries)
        except CrdtStoreError as exc:
            log.debug("group commit %s/%s: %s (the committer retries)", rec.tenant, rec.run, exc)
            return False
        if seqs is None:
            return False
        for listener in tuple(self._listeners):
            try:
                listener(rec.tenant, rec._jrun, entries, seqs)
            except Exception:  # never into the commit: it stands
                log.exception("a listener of the group commit of %s/%s", rec.tenant, rec.run)
        self.group_commits += 1
        self._last_commit = time.monotonic()
        rec._mark_committed(batch, seqs)
        observer = rec._commit_observer
        if observer is not None:
            observer("loop", len(seqs), time.perf_counter() - started)
        return True
