"""The lease backend interface, and the shared base of the backends that keep a lease table.

A backend is the authority that serializes lease transitions: the memory backend under a
lock, the SQLite backend inside ``BEGIN IMMEDIATE`` transactions on the store file, later a
Redis backend inside a script. All of them expose the same coroutine methods, take validated
arguments (canonical resources, a checked TTL, an owner) and pass
``crdtstore.testing.check_lease_backend``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, TypeVar

from .._errors import CrdtStoreError
from ._clock import Clock, Proc, ProcessProbe, SystemClock, SystemProbe
from ._engine import Table
from ._models import LeaseState, LeaseStatus

T = TypeVar("T")
# (tenant, owner, resources, ttl, key, proc, wait, wall time) of a request
RequestArgs = tuple[str, str, tuple[str, ...], float, tuple[str, int] | None, Proc, bool, float]
ReleaseArgs = tuple[str, str, str, int | None]  # (tenant, lease_id, owner, token)
# (lease id, rank, token, expires_in) of a grant made at once: the rest of its LeaseState is
# what was asked (see LeaseBackend.request_now)
Granted = tuple[str, int, int, float]
# what a transition gives back: its value, the error to raise, whether to wake waiters
Outcome = tuple[Any, CrdtStoreError | None, bool]


class LeaseBackend(ABC):
    """Where leases live. One instance per open store, used from one event loop.

    ``on_change`` (set by the store) is called after a committed transition that granted or
    removed a request, so that waiters in this and other processes wake up.
    """

    name: str = "leases"
    on_change: Callable[[], None] | None = None
    # True when release() and cancel() run to completion even if the caller's scope is
    # cancelled meanwhile (then the caller need not shield them)
    shields_cleanup: bool = False

    @abstractmethod
    async def open(self) -> None:
        """Connect (create tables) before first use."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release resources. Idempotent."""

    @abstractmethod
    async def request(
        self,
        tenant: str,
        owner: str,
        resources: tuple[str, ...],
        *,
        ttl: float,
        key: tuple[str, int] | None,
        proc: Proc,
        wait: bool,
    ) -> LeaseState:
        """Queue a request, or re-attach to the request with the same ``(owner, key)`` (which
        keeps its rank), and grant it if the grant rule allows.

        Raises:
            LeaseHeld: not ``wait`` and it cannot be granted now (the request is withdrawn).
            InvalidResource: ``key`` was used before for other resources.
        """

    @abstractmethod
    async def heartbeat(self, tenant: str, lease_id: str, owner: str, proc: Proc) -> LeaseState:
        """Renew the TTL of a granted or waiting request and attach it to ``proc``.

        Raises:
            LeaseNotFound: the request is gone (released, cancelled, reaped) or not ``owner``'s.
        """

    @abstractmethod
    async def release(self, tenant: str, lease_id: str, owner: str, token: int | None) -> None:
        """Release a grant; the next waiters are granted in the same transaction.

        Raises:
            LeaseNotFound: no such lease, or it is another owner's.
            LeaseLost: it is not granted, or ``token`` is not its token.
        """

    @abstractmethod
    async def cancel(self, tenant: str, lease_id: str, owner: str) -> bool:
        """Withdraw a waiting or granted request; False when it was already gone.

        Raises:
            LeaseNotFound: it is another owner's.
        """

    @abstractmethod
    async def reap(self) -> int:
        """Remove expired requests and grants of dead processes, grant what that frees;
        return how many were removed."""

    @abstractmethod
    async def status(self, tenant: str) -> LeaseStatus:
        """Holders and waiters of ``tenant`` in rank order (read-only: nothing is reaped)."""

    @abstractmethod
    async def check(self, tenant: str, lease_id: str, resource: str, token: int) -> None:
        """The fencing check, on its own.

        Raises:
            LeaseLost: the lease is not granted, does not cover ``resource``, its token is not
                ``token``, or it expired.
        """

    def request_now(
        self, tenant: str, owner: str, resources: tuple[str, ...], ttl: float, proc: Proc
    ) -> Granted | None:
        """A request without a key granted and committed without suspending, when the backend
        can do that at once (nothing else queued, its connection ready); else None, and the
        caller awaits :meth:`request`. It raises nothing: any refusal is :meth:`request`'s.
        The grant's :class:`LeaseState` is made from it only if someone reads it."""
        return None

    def release_now(self, tenant: str, lease_id: str, owner: str, token: int | None) -> bool:
        """:meth:`release` of the only request, committed without suspending, when the backend
        can do that at once; else False, nothing changed, and the caller awaits
        :meth:`release` (which raises what there is to raise)."""
        return False

    async def check_within(
        self, auth: Any, tenant: str, lease_id: str, resource: str, token: int
    ) -> None:
        """:meth:`check` for a fenced write inside the journal's authority transaction
        ``auth`` (an :class:`~crdtstore._journal.Authority`). A backend whose leases live in
        the journal's own database checks in that transaction, so that no lease transition
        can come between the check and the write; the default checks on its own."""
        await self.check(tenant, lease_id, resource, token)


class TableBackend(LeaseBackend):
    """A backend that applies :class:`Table` transitions inside its own transactions."""

    shields_cleanup = True  # _transact(..., shield=True) for release and cancel

    def __init__(self, *, clock: Clock | None = None, probe: ProcessProbe | None = None) -> None:
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.probe: ProcessProbe = probe if probe is not None else SystemProbe()

    @abstractmethod
    async def _transact(self, fn: Callable[[Table], T], *, shield: bool = False) -> T:
        """Run ``fn`` on the current table atomically and persist what it changed; with
        ``shield``, a cancellation of the caller does not interrupt it."""

    @abstractmethod
    async def _view(self, fn: Callable[[Table], T]) -> T:
        """Run ``fn`` on a consistent, read-only view of the table."""

    async def _change(self, op: Callable[[Table, float], T], *, shield: bool = False) -> T:
        """Reap, apply ``op``, evaluate the grant rule, in one transaction.

        An error of ``op`` is raised after the transaction commits what the reap did (the
        operation itself changes nothing before it raises).
        """

        def tx(t: Table) -> tuple[T | None, CrdtStoreError | None, bool]:
            now, boot = self.clock.now(), self.clock.boot_id()
            first_token = t.next_token
            if t.reqs:
                t.reap(now, boot, self.probe)
            value: T | None = None
            error: CrdtStoreError | None = None
            try:
                value = op(t, now)
            except CrdtStoreError as exc:
                error = exc
            t.grant(now)
            # Wake waiters only when one of them was granted: a removal that grants nobody
            # changes nothing they wait for, and the caller knows about its own grant. Every
            # grant takes the next token and none is undone later in the transaction, so the
            # tokens taken since ``first_token`` count this transaction's grants.
            grants = t.next_token - first_token
            if (
                isinstance(value, LeaseState)
                and value.token is not None
                and value.token >= first_token
            ):
                grants -= 1
            return value, error, grants > 0

        value, error, changed = await self._transact(tx, shield=shield)
        if changed and self.on_change is not None:
            self.on_change()
        if error is not None:
            raise error
        return value  # type: ignore[return-value]

    # The two transitions of every acquire+release, written out rather than through _change:
    # a backend that can run a transition without suspending (SQLite) calls them directly.

    def _request_tx(self, t: Table, args: RequestArgs) -> Outcome:
        tenant, owner, resources, ttl, key, proc, wait, wall = args
        clock = self.clock
        now, boot = clock.now(), clock.boot_id()
        first_token = t.next_token
        if t.reqs:
            t.reap(now, boot, self.probe)
        try:
            r = t.request(tenant, owner, resources, ttl, key, proc, wait, now, boot, wall)[0]
        except CrdtStoreError as exc:
            t.grant(now)  # a withdrawn request may have kept later ones waiting
            return None, exc, t.next_token != first_token
        # Table.request applied the grant rule after its last change: nothing more to grant.
        # Wake waiters only when another request was granted (see _change).
        state = t.state_of(r, now)
        grants = t.next_token - first_token
        if state.token is not None and state.token >= first_token:
            grants -= 1
        return state, None, grants > 0

    def _release_tx(self, t: Table, args: ReleaseArgs) -> Outcome:
        tenant, lease_id, owner, token = args
        clock = self.clock
        now = clock.now()
        first_token = t.next_token
        if t.reqs:
            t.reap(now, clock.boot_id(), self.probe)
        error: CrdtStoreError | None = None
        try:
            t.release(tenant, lease_id, owner, token)
        except CrdtStoreError as exc:
            error = exc
        t.grant(now)
        return None, error, t.next_token != first_token

    def _outcome(self, out: Outcome) -> Any:
        value, error, wake = out
        if wake and self.on_change is not None:
            self.on_change()
        if error is not None:
            raise error
        return value

    async def request(
        self,
        tenant: str,
        owner: str,
        resources: tuple[str, ...],
        *,
        ttl: float,
        key: tuple[str, int] | None,
        proc: Proc,
        wait: bool,
    ) -> LeaseState:
        args = (tenant, owner, resources, ttl, key, proc, wait, time.time())
        out = await self._transact(lambda t: self._request_tx(t, args))
        return self._outcome(out)  # type: ignore[no-any-return]

    async def heartbeat(self, tenant: str, lease_id: str, owner: str, proc: Proc) -> LeaseState:
        def op(t: Table, now: float) -> LeaseState:
            r = t.heartbeat(tenant, lease_id, owner, proc, now)
            t.grant(now)
            if r.state == "granted":
                r.acked = True
            return t.state_of(r, now)

        return await self._change(op)

    async def release(self, tenant: str, lease_id: str, owner: str, token: int | None) -> None:
        args = (tenant, lease_id, owner, token)
        self._outcome(await self._transact(lambda t: self._release_tx(t, args), shield=True))

    async def cancel(self, tenant: str, lease_id: str, owner: str) -> bool:
        return await self._change(
            lambda t, now: t.cancel(tenant, lease_id, owner) is not None, shield=True
        )

    async def reap(self) -> int:
        if await self._view(lambda t: not t.reqs):
            return 0  # nothing to reap: spare the write transaction

        def tx(t: Table) -> tuple[int, bool]:
            now = self.clock.now()
            reaped = t.reap(now, self.clock.boot_id(), self.probe)
            granted = t.grant(now)
            return len(reaped), bool(reaped or granted)

        n, changed = await self._transact(tx)
        if changed and self.on_change is not None:
            self.on_change()
        return n

    async def status(self, tenant: str) -> LeaseStatus:
        now, wall = self.clock.now(), time.time()
        return await self._view(lambda t: t.status(tenant, now, wall))
