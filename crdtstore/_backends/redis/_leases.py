"""The lease backend of ``redis://`` stores: the lease table of each tenant in its keys, every
transition one Lua script (``lua/lease.lua``: reap, change, grant rule, in one atomic step).

The table is kept in indexes (holder per resource, a queue per resource, deadlines, keys), so
that an uncontended acquire or release is one script call touching a few small keys, whatever
the number of leases of the tenant. Deadlines are measured on the **Redis server's clock**
(``TIME`` inside the script), so processes whose clocks disagree share one notion of expiry;
tests pass a clock (``RedisLeases(journal, clock=FakeClock())``) that the scripts use instead.

**Dead holders.** A holder's process can only be probed from its own machine: ``reap()`` asks
the process probe (``/proc``) about the granted requests of this host and boot, and removes
those provably dead (the script checks they are still the same grant); a holder on another
machine that dies is reaped by its TTL. ``reap()`` covers the tenants this backend served.

**Wake-ups.** A transition that grants someone else's request appends to the tenant's wake-up
stream; the store's stream read (its tail) wakes this process's waiters on it.
"""

from __future__ import annotations

import functools
import json
import secrets
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import anyio

from ..._errors import (
    BackendError,
    CrdtStoreError,
    InvalidResource,
    LeaseHeld,
    LeaseLost,
    LeaseNotFound,
)
from ..._leases._backend import LeaseBackend
from ..._leases._clock import Clock, Proc, ProcessProbe, SystemProbe
from ..._leases._engine import Req, Table, fence_error
from ..._leases._models import LeaseState, LeaseStatus, lease_state
from ._client import RedisError, mapped

if TYPE_CHECKING:
    from ._journal import RedisJournal

SERVER_BOOT = "redis"  # the boot id of the server's clock (it is a wall clock: no boots)


def _req(tenant: str, a: list[Any]) -> Req:
    """A request from its JSON list (the layout of ``decode`` in lease.lua)."""
    return Req(
        rank=int(float(a[0])),
        id=a[1],
        tenant=tenant,
        owner=a[2],
        step=a[3] or None,
        attempt=int(a[4]) if a[4] != "" else None,
        resources=tuple(a[5]),
        state=a[6],
        token=int(float(a[7])) if a[7] != "" else None,
        ttl=float(a[8]),
        proc=Proc(a[9], a[10], int(a[11]), int(a[12])) if a[9] else None,
        acked=a[13] == "1",
        created=float(a[14]),
        clock_boot=a[15],
        requested=float(a[16]),
        granted_at=float(a[17]) if a[17] != "" else None,
        expires=float(a[18]),
    )


def _table(tenant: str, raws: Iterable[bytes], next_token: int) -> Table:
    t = Table(next_token=next_token)
    for raw in raws:
        r = _req(tenant, json.loads(raw))
        t.reqs[r.rank] = r
    return t


def _state(tenant: str, got: list[Any], now: float) -> LeaseState:
    """The state of the request in a transition's answer (its JSON at ``got[10]``; when it
    waits, every request of the table follows: a waiter's hints look at the requests ahead
    of it)."""
    r = _req(tenant, json.loads(got[10]))
    t = Table(next_token=int(got[5]))
    if r.state != "granted":
        t = _table(tenant, got[11:], t.next_token)
    t.reqs[r.rank] = r
    return t.state_of(r, now)


@functools.lru_cache(maxsize=256)
def _proc_args(proc: Proc) -> tuple[bytes, ...]:
    return tuple(str(x).encode() for x in proc)


class RedisLeases(LeaseBackend):
    """Leases in the Redis of ``journal`` (see the module docstring)."""

    name = "redis"
    shields_cleanup = True  # release and cancel are shielded here

    def __init__(
        self,
        journal: RedisJournal,
        *,
        clock: Clock | None = None,
        probe: ProcessProbe | None = None,
    ) -> None:
        self.journal = journal
        self.clock = clock  # None: the server's clock
        self.probe: ProcessProbe = probe if probe is not None else SystemProbe()
        self._tenants: set[str] = set()
        self._watched: dict[str, object] = {}  # tenant -> the tail that watches its hand-offs
        self._keys: dict[str, list[bytes]] = {}  # tenant -> the keys of its lease table
        self._opened_journal = False

    async def open(self) -> None:
        if self.journal._client is None:
            await self.journal.open()
            self._opened_journal = True

    async def aclose(self) -> None:
        if self._opened_journal:
            self._opened_journal = False
            await self.journal.aclose()

    # -- plumbing -----------------------------------------------------------------------------

    def _lease_keys(self, tenant: str) -> list[bytes]:
        keys = self._keys.get(tenant)
        if keys is None:
            keys = self._keys[tenant] = [k.encode() for k in self.journal.keys.leases(tenant)]
        return keys

    async def _watch(self, tenant: str) -> None:
        """Have the store's tail wake this process's waiters on the tenant's hand-offs."""
        tail = self.journal.tail
        if tail is not None and self._watched.get(tenant) is tail:
            return
        self._tenants.add(tenant)
        if tail is None:
            return
        ev = self.journal.keys.leases(tenant).events
        if not tail.watching_stream(ev):
            with mapped("leases"):
                last = await self.journal.client.xrevrange(ev, count=1)
            from ..._leases._api import WAKE_KEY

            wake = self.journal._wake
            tail.watch_stream(ev, last[0][0] if last else b"0-0", lambda: wake(WAKE_KEY, tenant))
        self._watched[tenant] = tail

    async def _op(
        self, tenant: str, op: bytes, args: list[Any], *, shield: bool = False
    ) -> tuple[list[Any], float]:
        """Run one transition; return (its answer's fields, now) or raise its refusal (after
        the transition committed what its reap did)."""
        scripts = self.journal.scripts
        keys = self._lease_keys(tenant)
        clock = self.clock
        if clock is None:
            args = [op, b"", b"", *args]
        else:
            args = [op, repr(float(clock.now())), clock.boot_id(), *args]
        # a resent release (its reply lost with its connection) may find its request gone
        again = [*args, b"1"] if op == b"release" else None
        try:
            if shield:
                with anyio.CancelScope(shield=True):
                    got = await scripts.call("lease", keys, args, resend_args=again)
            else:
                got = await scripts.call("lease", keys, args, resend_args=again)
        except (TimeoutError, RedisError, OSError) as exc:
            raise BackendError(
                "redis", f"lease {op.decode()}: {type(exc).__name__}: {exc}"
            ) from exc
        if got[3] != b"0" and self.on_change is not None:
            self.on_change()
        if got[0] == b"err":
            raise self._refusal(got[4:])
        return got, float(got[1])

    @staticmethod
    def _refusal(err: list[bytes]) -> CrdtStoreError:
        kind, args = err[0], [x.decode() for x in err[1:]]
        if kind == b"held":
            return LeaseHeld(args[0], args[1], int(float(args[2])) if args[2] else None)
        if kind == b"lost":
            return LeaseLost(args[0], args[1], int(args[2]) if args[2] else None)
        if kind == b"not_found":
            return LeaseNotFound(args[0])
        if kind == b"not_owner":
            return _NotOwner(args[0])
        if kind == b"invalid_resource":
            return InvalidResource(json.loads(args[0]), "this key already requested them")
        return LeaseLost("?", f"unexpected answer {err!r}")  # pragma: no cover

    async def _read(self, tenant: str) -> tuple[Table, float, str]:
        """The tenant's table, now and the boot id (a consistent read, changing nothing)."""
        keys = self.journal.keys.leases(tenant)
        q, n = keys.requests, keys.counters
        with mapped("leases"):
            pipe = self.journal.client.pipeline(transaction=True)
            pipe.hgetall(q)
            pipe.hget(n, "token")
            pipe.time()
            raw, token, (sec, usec) = await pipe.execute()
        t = _table(tenant, list(raw.values()), int(float(token)) if token else 1)
        if self.clock is None:
            return t, sec + usec / 1e6, SERVER_BOOT
        return t, self.clock.now(), self.clock.boot_id()

    # -- the interface --------------------------------------------------------------------------

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
        await self._watch(tenant)
        args = [
            owner,
            key[0] if key else b"",
            str(key[1]) if key else b"",
            repr(float(ttl)),
            *_proc_args(proc),
            b"1" if wait else b"0",
            secrets.token_hex(8),
            repr(time.time()),
            *resources,
        ]
        try:
            got, now = await self._op(tenant, b"request", args)
        except InvalidResource as exc:
            raise InvalidResource(
                list(resources), f"key {key!r} already requested {exc.resource}"
            ) from None
        if got[7] != b"granted":
            return _state(tenant, got, now)
        # granted: what Table.state_of gives a holder, from the answer's fields and the
        # arguments (a re-attached request has these resources, owner, key and TTL)
        return lease_state(
            {
                "lease_id": got[6].decode(),
                "rank": int(got[4]),
                "owner": owner,
                "resources": resources,
                "state": "granted",
                "token": int(got[8]),
                "ttl": ttl,
                "expires_in": float(got[9]) - now,
                "key": key,
                "wake_in": None,
                "watch_pids": (),
            }
        )

    async def heartbeat(self, tenant: str, lease_id: str, owner: str, proc: Proc) -> LeaseState:
        self._tenants.add(tenant)
        try:
            got, now = await self._op(tenant, b"heartbeat", [lease_id, owner, *_proc_args(proc)])
        except _NotOwner as exc:
            raise LeaseNotFound(lease_id, f"belongs to another owner, not {owner!r}") from exc
        return _state(tenant, got, now)

    async def release(self, tenant: str, lease_id: str, owner: str, token: int | None) -> None:
        args = [lease_id, owner, b"" if token is None else str(token)]
        try:
            await self._op(tenant, b"release", args, shield=True)
        except _NotOwner as exc:
            raise LeaseNotFound(lease_id, f"belongs to another owner, not {owner!r}") from exc

    async def cancel(self, tenant: str, lease_id: str, owner: str) -> bool:
        try:
            got, _ = await self._op(tenant, b"cancel", [lease_id, owner], shield=True)
        except _NotOwner as exc:
            raise LeaseNotFound(lease_id, f"belongs to another owner, not {owner!r}") from exc
        return bool(got[4] == b"1")

    async def reap(self) -> int:
        removed = 0
        for tenant in sorted(self._tenants):
            t, _, _ = await self._read(tenant)
            if not t.reqs:
                continue
            dead: list[str] = []
            for r in t.reqs.values():
                proc = r.proc
                probed = r.state == "granted" and r.acked and proc is not None
                if probed and proc is not None and self.probe.is_dead(proc):
                    dead += [r.id, str(proc.pid)]
            got, _ = await self._op(tenant, b"reap", dead)
            removed += int(float(got[4]))
        return removed

    async def status(self, tenant: str) -> LeaseStatus:
        self._tenants.add(tenant)
        t, now, _ = await self._read(tenant)
        return t.status(tenant, now, time.time())

    async def check(self, tenant: str, lease_id: str, resource: str, token: int) -> None:
        with mapped("leases"):
            pipe = self.journal.client.pipeline(transaction=True)
            pipe.hget(self.journal.keys.leases(tenant).requests, lease_id)
            pipe.time()
            raw, (sec, usec) = await pipe.execute()
        r = None if raw is None or not isinstance(lease_id, str) else _req(tenant, json.loads(raw))
        if self.clock is None:
            now, boot = sec + usec / 1e6, SERVER_BOOT
        else:
            now, boot = self.clock.now(), self.clock.boot_id()
        err = fence_error(r, resource, token, now, boot)
        if err is not None:
            raise err

    def __repr__(self) -> str:  # pragma: no cover
        return f"<RedisLeases {self.journal!r}>"


class _NotOwner(LeaseNotFound):
    """A request of another owner (the caller's message names the owner)."""
