"""The user-facing lease API: ``store.leases`` and ``async with store.lease([...]) as lease``.

A waiter does not poll the backend in a tight loop. It sleeps until the first of:

- a wake-up from the store's notifier (a release, reap or hand-off committed by any process
  on the store: the backend calls ``on_change`` after such a commit);
- the exit of a holder it waits behind, when that holder runs on this host (a ``pidfd``);
- the earliest deadline among the requests ahead of it (that one may then be reaped);
- its own heartbeat (a waiting request has a TTL too, so an abandoned one does not block the
  queue forever), which also serves as the slow fallback poll.

A holder renews its grant every ``ttl/3``. The renewing task is started only when the first
renewal is due: one scheduler task per store (:meth:`Leases._run_heartbeats`) keeps the due
times of the held leases, so a lease released sooner than ``ttl/3`` (the common case) costs
no task at all.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType

import anyio
from anyio.abc import TaskGroup

from .._errors import (
    BackendError,
    InvalidValue,
    LeaseLost,
    LeaseNotFound,
    LeaseTimeout,
    StoreClosed,
)
from .._notify import Notifier, Watch
from ._backend import Granted, LeaseBackend
from ._clock import Proc, this_proc
from ._engine import check_key, check_owner, check_ttl, granted_state
from ._models import MAX_TTL, MIN_TTL, LeaseState, LeaseStatus
from ._resources import _one_resource, canonical_resources

log = logging.getLogger("crdtstore.leases")

WAKE_KEY = "__leases__"  # notifier key (tenant slot) for lease hand-offs
FALLBACK_POLL = 2.0  # seconds: the longest a waiter sleeps without any other reason to wake
EXPIRY_MARGIN = 0.002


def default_owner() -> str:
    p = this_proc()
    if _OWNER[0] is not p:
        _OWNER[:] = [p, f"{p.host}:{p.pid}"]
    return _OWNER[1]  # type: ignore[return-value]


_OWNER: list[object] = [None, ""]  # (this_proc() it was made for, default_owner())


class Leases:
    """The leases of one store and tenant (``store.leases``)."""

    def __init__(
        self,
        backend: LeaseBackend | None,
        *,
        notifier: Notifier,
        tenant: str,
        check_open: Callable[[], None],
        task_group: Callable[[], TaskGroup | None],
    ) -> None:
        self._backend_or_none = backend
        self._notifier = notifier
        self.tenant = tenant
        self._check_open = check_open
        self._task_group = task_group
        # held leases whose heartbeat task is not started yet -> when the first beat is due
        # (time.monotonic()); the scheduler sleeps until _due_first, or until _due_wake is set
        self._due: dict[Lease, float] = {}
        self._due_first = math.inf
        self._due_wake: anyio.Event | None = None
        self._scheduler = False
        self._watch: Watch | None = None  # see _wake_watch
        if backend is not None:
            backend.on_change = self._changed

    def _changed(self) -> None:
        self._notifier.notify(WAKE_KEY, self.tenant)

    def _wake_watch(self) -> Watch:
        """The watch of lease hand-offs, taken once and kept while the store is open (a waiter
        reads its event before it asks, so no wake-up can fall between ask and wait)."""
        if self._watch is None:
            self._watch = self._notifier.watch(WAKE_KEY, self.tenant, polled=False)
        return self._watch

    @property
    def backend(self) -> LeaseBackend:
        """The lease backend.

        Raises:
            StoreClosed: the store is not open, or its backend has no leases.
        """
        self._check_open()
        if self._backend_or_none is None:
            raise StoreClosed("lease backend (this store's backend has none)")
        return self._backend_or_none

    def _spawn_group(self) -> TaskGroup:
        tg = self._task_group()
        if tg is None:
            raise StoreClosed("store")
        return tg

    def _schedule_heartbeat(self, lease: Lease, due: float) -> None:
        """Start ``lease``'s heartbeat task at ``due`` (unless it is released before)."""
        if not self._scheduler:
            self._spawn_group().start_soon(self._run_heartbeats)
            self._scheduler = True
        self._due[lease] = due
        if due < self._due_first:
            self._due_first = due
            if self._due_wake is not None:
                self._due_wake.set()

    async def _run_heartbeats(self) -> None:
        """Start the heartbeat tasks of held leases as their first beats come due."""
        try:
            while True:
                now = time.monotonic()
                first = math.inf
                for lease, due in list(self._due.items()):
                    if due <= now:
                        del self._due[lease]
                        lease._start_heartbeat_task()
                    elif due < first:
                        first = due
                self._due_first = first
                self._due_wake = wake = anyio.Event()
                with anyio.move_on_after(first - now):
                    await wake.wait()
        finally:
            self._scheduler = False
            self._due_wake = None
            self._due_first = math.inf

    async def status(self, *, reap: bool = True) -> LeaseStatus:
        """Holders and waiters of this tenant in rank order, with ranks, resources and ages.

        With ``reap`` (the default) expired grants and grants of dead processes are reaped
        first, so the status shows who really holds what.
        """
        backend = self.backend
        if reap:
            await backend.reap()
        return await backend.status(self.tenant)

    async def reap(self) -> int:
        """Reap expired grants and grants of dead processes now; return how many."""
        return await self.backend.reap()

    async def check(self, lease_id: str, resource: str, token: int) -> None:
        """The fencing check for ``resource`` (any spelling) under (``lease_id``, ``token``).

        Raises:
            LeaseLost: the lease is not granted, does not cover it, or the token is stale.
            InvalidResource: a malformed resource.
        """
        (res,) = canonical_resources([resource])
        await self.backend.check(self.tenant, lease_id, res, token)

    def lease(
        self,
        resources: Iterable[str],
        *,
        ttl: float = 30.0,
        owner: str | None = None,
        wait: bool = True,
        timeout: float | None = None,
        key: tuple[str, int] | None = None,
    ) -> Lease:
        """A lease on ``resources`` (repo-relative paths or ``item:<collection>/<id>``).

        Use as ``async with store.lease(["src/a.py"], ttl=30) as lease:``, or call
        :meth:`Lease.acquire` and :meth:`Lease.release`. Arguments are checked here, before
        anything reaches the backend.

        Args:
            resources: what to take, all or nothing.
            ttl: seconds a grant lives without a heartbeat (renewed every ``ttl/3`` while held).
            owner: who asks (default ``host:pid``); a re-attach needs the same owner.
            wait: queue and wait when not free at once (else raise ``LeaseHeld``).
            timeout: the longest wait in seconds (then ``LeaseTimeout``); None waits forever.
            key: idempotency key ``(step, attempt)``: asking again with the same owner and key
                re-attaches to the earlier request and keeps its place in the queue.

        Raises:
            InvalidResource: a bad path or item, or an empty set.
            InvalidValue: a TTL outside 0.05 s .. 1 day, a bad owner, key or timeout.
        """
        if type(resources) is list and len(resources) == 1 and type(resources[0]) is str:
            res = _one_resource(resources[0])  # canonical_resources' common case, inlined
        else:
            res = canonical_resources(resources)
        if timeout is not None:
            if (
                isinstance(timeout, bool)
                or not isinstance(timeout, (int, float))
                or math.isnan(timeout)
                or timeout < 0
            ):
                raise InvalidValue(f"lease timeout must be None or >= 0 seconds, not {timeout!r}")
            timeout = float(timeout)
        # the common values pass without a call (check_ttl and check_owner refuse the rest)
        if type(ttl) is not float or not MIN_TTL <= ttl <= MAX_TTL:
            ttl = check_ttl(ttl)
        if owner is None:
            owner = default_owner()
        if type(owner) is not str or not 0 < len(owner) <= 256 or "\x00" in owner:
            owner = check_owner(owner)
        if key is not None:
            key = check_key(key)
        return Lease(self, res, ttl, owner, wait if wait is True else bool(wait), timeout, key)


class Lease:
    """A lease on a set of resources; see :meth:`Leases.lease`."""

    # Defaults until set on the instance (fewer stores per lease: one is made per acquire).
    _state: LeaseState | None = None
    _now: Granted | None = None  # a grant made at once, until ``state`` is read
    lost = False
    lost_reason: str | None = None
    waited = 0.0
    _hb: anyio.CancelScope | None = None  # see _hb_scope
    _released = False

    def __init__(
        self,
        leases: Leases,
        resources: tuple[str, ...],
        ttl: float,
        owner: str,
        wait: bool,
        timeout: float | None,
        key: tuple[str, int] | None,
    ) -> None:
        self._leases = leases
        self.resources = resources
        self.ttl = ttl
        self.owner = owner
        self.wait = wait
        self.timeout = timeout
        self.key = key
        self._proc: Proc = this_proc()

    # -- what a holder reads ----------------------------------------------------------------

    @property
    def state(self) -> LeaseState | None:
        """The request as the backend last reported it (None before :meth:`acquire`)."""
        st = self._state
        if st is None and self._now is not None:
            # made on first read: most leases granted at once are released unread
            lease_id, rank, token, expires_in = self._now
            st = self._state = granted_state(
                lease_id, rank, self.owner, self.resources, token, self.ttl, expires_in, None
            )
        return st

    @state.setter
    def state(self, value: LeaseState | None) -> None:
        self._state, self._now = value, None

    @property
    def lease_id(self) -> str:
        return self._granted().lease_id

    @property
    def rank(self) -> int:
        return self._granted().rank

    @property
    def token(self) -> int:
        """The fencing token (strictly increasing per resource across the store's life): pass
        it to any external system, which must refuse a token lower than the highest it saw."""
        tok = self._granted().token
        assert tok is not None
        return tok

    @property
    def tokens(self) -> dict[str, int]:
        """The fencing token per resource (one grant carries one token for all of them)."""
        return dict.fromkeys(self.resources, self.token)

    @property
    def granted(self) -> bool:
        return self.state is not None and self.state.granted and not self._released

    def _granted(self) -> LeaseState:
        if self.state is None or not self.state.granted:
            raise LeaseNotFound(self.resources, "not acquired yet")
        return self.state

    async def check(self, resource: str | None = None) -> None:
        """Raise ``LeaseLost`` unless this lease still holds ``resource`` (default: all)."""
        st = self._granted()
        assert st.token is not None
        for res in (resource,) if resource is not None else self.resources:
            await self._leases.check(st.lease_id, res, st.token)

    # -- acquiring ----------------------------------------------------------------------------

    async def acquire(self) -> Lease:
        """Take the lease: at once, or after waiting in FIFO order.

        Raises:
            LeaseHeld: ``wait`` is False and a resource is taken (or queued for).
            LeaseTimeout: the wait passed ``timeout``; the request was withdrawn.
        """
        leases = self._leases
        leases._check_open()
        backend = leases._backend_or_none
        if backend is None:
            backend = leases.backend  # raises
        # granted at once, without a coroutine, when the backend can (nothing waited)
        got = None
        if self.key is None:
            got = backend.request_now(
                leases.tenant, self.owner, self.resources, self.ttl, self._proc
            )
        if got is None:
            await self._request(backend)
        else:
            self._state, self._now = None, got
        due = time.monotonic() + self.ttl / 3
        if leases._scheduler and due >= leases._due_first:
            leases._due[self] = due  # what _schedule_heartbeat does then, without the call
        else:
            leases._schedule_heartbeat(self, due)
        return self

    async def _request(self, backend: LeaseBackend) -> None:
        """Ask ``backend`` (the awaited way), and wait in the queue when not granted at once."""
        leases = self._leases
        started = time.monotonic()
        watch = leases._watch
        if watch is None:
            watch = leases._wake_watch()
        event = watch.event  # read before asking: no wake-up falls between ask and wait
        try:
            st = self.state = await backend.request(
                leases.tenant, self.owner, self.resources, ttl=self.ttl, key=self.key,
                proc=self._proc, wait=self.wait,
            )  # fmt: skip
        except BaseException:
            self.state = None
            raise
        if st.state != "granted":
            await self._wait(backend, st, started, watch, event)
        self.waited = time.monotonic() - started

    async def _wait(
        self, backend: LeaseBackend, st: LeaseState, started: float, watch: Watch,
        event: anyio.Event,
    ) -> None:  # fmt: skip
        """Wait in the queue until ``st`` (our waiting request) is granted."""
        tenant = self._leases.tenant
        deadline = None if self.timeout is None else started + self.timeout
        try:
            while not st.granted:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise LeaseTimeout(list(self.resources), now - started)
                delay = min(self.ttl / 3, FALLBACK_POLL)
                if st.wake_in is not None:
                    delay = min(delay, st.wake_in + EXPIRY_MARGIN)
                if deadline is not None:
                    delay = min(delay, deadline - now)
                await _wait_any(event, st.watch_pids, delay)
                event = watch.event
                try:
                    st = self.state = await backend.heartbeat(
                        tenant, st.lease_id, self.owner, self._proc
                    )
                except LeaseNotFound:
                    # our waiting request expired (this process was stopped past its TTL):
                    # ask again; the place in the queue is lost
                    st = self.state = await backend.request(
                        tenant, self.owner, self.resources, ttl=self.ttl, key=self.key,
                        proc=self._proc, wait=self.wait,
                    )  # fmt: skip
        except BaseException:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await backend.cancel(tenant, st.lease_id, self.owner)
            self.state = None
            raise

    @property
    def _hb_scope(self) -> anyio.CancelScope:
        """The heartbeat task's scope: cancelling it stops the renewals (made on first use)."""
        if self._hb is None:
            self._hb = anyio.CancelScope()
        return self._hb

    def _start_heartbeat_task(self) -> None:
        """The first beat is due: start the task that renews the grant from now on."""
        scope = self._hb_scope
        if self._released or scope.cancel_called:
            return
        self._leases._spawn_group().start_soon(
            self._heartbeat, scope, self._leases.backend, self._granted()
        )

    async def _heartbeat(
        self, scope: anyio.CancelScope, backend: LeaseBackend, st: LeaseState
    ) -> None:
        # the scope may have been cancelled (released) before this task first ran
        with scope:
            interval = 0.0  # the first beat is due when the task starts
            while True:
                await anyio.sleep(interval)
                try:
                    await backend.heartbeat(
                        self._leases.tenant, st.lease_id, self.owner, self._proc
                    )
                    interval = self.ttl / 3
                except LeaseNotFound:
                    self._mark_lost("reaped or expired before a heartbeat renewed it")
                    return
                except BackendError as exc:
                    # transient (database locked for long): retry sooner, the TTL still runs
                    log.warning("lease heartbeat failed (%s); retrying", exc)
                    interval = min(self.ttl / 10, 1.0)
                except Exception:
                    log.exception("lease heartbeat crashed; the lease will expire")
                    return

    def _mark_lost(self, reason: str) -> None:
        if not self.lost:
            self.lost, self.lost_reason = True, reason
            log.warning("lease on %s lost: %s", list(self.resources), reason)

    async def release(self) -> None:
        """Release the lease (idempotent); the next waiters are granted at once.

        Raises:
            LeaseLost: it was lost while held (expired or reaped): the work done under it was
                not exclusive, and fenced writes were refused.
        """
        await self.__aexit__(None, None, None)

    __aenter__ = acquire  # the same coroutine: one less per ``async with``

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # release() itself (one coroutine less per ``async with``), except that a loss is not
        # raised over the body's own error, which is the one to report (the loss is logged)
        if self._released:
            return
        got = self._now
        token: int | None
        if got is not None:
            lease_id, token = got[0], got[2]
        else:
            st = self._state
            if st is None:
                return
            lease_id, token = st.lease_id, st.token
        self._released = True
        leases = self._leases
        leases._due.pop(self, None)
        if self._hb is not None:
            self._hb.cancel()
        leases._check_open()
        backend = leases._backend_or_none
        if backend is None:
            backend = leases.backend  # raises
        try:
            # the release must run to the end even when our caller is being cancelled
            if backend.release_now(leases.tenant, lease_id, self.owner, token):
                pass
            elif backend.shields_cleanup:
                await backend.release(leases.tenant, lease_id, self.owner, token)
            else:
                with anyio.CancelScope(shield=True):
                    await backend.release(leases.tenant, lease_id, self.owner, token)
        except (LeaseNotFound, LeaseLost):
            self._mark_lost("it was gone at release (expired or reaped)")
        if self.lost and exc is None:
            raise LeaseLost(self.resources[0], self.lost_reason or "lost", token)

    def __repr__(self) -> str:
        state = "lost" if self.lost else (self.state.state if self.state else "new")
        return f"<Lease {list(self.resources)} owner={self.owner!r} {state}>"


async def _wait_any(event: anyio.Event, pids: Sequence[int], delay: float) -> None:
    """Return when ``event`` is set, one of ``pids`` exits, or ``delay`` seconds pass."""
    if event.is_set() or delay <= 0:
        return
    fds: list[int] = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                return  # already gone: the caller re-checks at once
            except (OSError, AttributeError):
                break  # no pidfd here: the deadline and notifications still wake us
        async with anyio.create_task_group() as tg:

            async def fire(waiter: Callable[[], Awaitable[object]]) -> None:
                await waiter()
                tg.cancel_scope.cancel()

            tg.start_soon(fire, event.wait)
            for fd in fds:
                tg.start_soon(fire, lambda fd=fd: anyio.wait_readable(fd))
            tg.start_soon(fire, lambda: anyio.sleep(delay))
    finally:
        for fd in fds:
            os.close(fd)
