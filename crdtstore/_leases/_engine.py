"""The lease table and its transitions, without I/O.

Both backends keep the same rows and apply the same transitions: the memory backend on a table
held in memory, the SQLite backend on the rows it loads inside a ``BEGIN IMMEDIATE``
transaction and writes back (only what changed) before ``COMMIT``. Every state-changing
transition first reaps, then does its own change, then evaluates the grant rule, so that a
hand-off happens in the same transaction as the release or reap that made it possible, even
when the next waiter's process is not running.

Ranks and fencing tokens come from two counters that never go back. The token counter is one
for the whole store: a token is then strictly increasing per resource (what fencing needs), and
a multi-resource grant carries one token for all its resources.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field, replace
from typing import Literal

from .._errors import InvalidResource, InvalidValue, LeaseHeld, LeaseLost, LeaseNotFound
from ._clock import Proc, ProcessProbe
from ._models import MAX_TTL, MIN_TTL, LeaseInfo, LeaseState, LeaseStatus, lease_state
from ._rule import QueueEntry, blockers, grant_order

State = Literal["waiting", "granted"]
MAX_WATCH = 16

# Lease ids need to be unique, not secret (status shows them to every caller; release and
# heartbeat also check the owner): 64 bits from a generator seeded from os.urandom, seeded
# again in a forked child, cost a fifth of secrets.token_hex (a system call per id).
_ids = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids.seed)
_id_bits = _ids.getrandbits  # a lease id: f"{_id_bits(64):016x}"


@dataclass(slots=True)
class Req:
    """One row of the lease table."""

    rank: int
    id: str
    tenant: str
    owner: str
    step: str | None
    attempt: int | None
    resources: tuple[str, ...]
    state: State
    token: int | None
    ttl: float
    proc: Proc | None
    acked: bool  # the holder's process has seen the grant (only then may pid death reap it)
    created: float  # wall time, for display only
    clock_boot: str  # the boot in which the clock readings below were taken
    requested: float
    granted_at: float | None
    expires: float

    @property
    def key(self) -> tuple[str, int] | None:
        if self.step is None or self.attempt is None:
            return None
        return (self.step, self.attempt)


def _rank(r: Req) -> int:
    return r.rank


def check_ttl(ttl: object) -> float:
    """Raises ``InvalidValue`` unless ``MIN_TTL <= ttl <= MAX_TTL`` (seconds)."""
    if type(ttl) is float and MIN_TTL <= ttl <= MAX_TTL:
        return ttl  # the common case (NaN and infinities fail the comparison)
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise InvalidValue(f"lease ttl must be a number of seconds, not {ttl!r}")
    if not math.isfinite(ttl) or not MIN_TTL <= ttl <= MAX_TTL:
        raise InvalidValue(f"lease ttl must be between {MIN_TTL} and {MAX_TTL} s, not {ttl!r}")
    return float(ttl)


def check_key(key: object) -> tuple[str, int] | None:
    if key is None:
        return None
    if (
        isinstance(key, tuple)
        and len(key) == 2
        and isinstance(key[0], str)
        and isinstance(key[1], int)
        and not isinstance(key[1], bool)
        and 0 < len(key[0]) <= 256
        and "\x00" not in key[0]
    ):
        return (key[0], key[1])
    raise InvalidValue(f"lease key must be (step: str, attempt: int), not {key!r}")


def check_owner(owner: object) -> str:
    if not isinstance(owner, str) or not 0 < len(owner) <= 256 or "\x00" in owner:
        raise InvalidValue(f"lease owner must be a non-empty string, not {owner!r}")
    return owner


@dataclass
class Table:
    """The lease rows plus the two counters, with change tracking for write-back."""

    reqs: dict[int, Req] = field(default_factory=dict)
    next_rank: int = 1
    next_token: int = 1
    dirty: set[int] = field(default_factory=set)
    removed: set[int] = field(default_factory=set)
    meta_dirty: bool = False

    def clean(self) -> None:
        self.dirty.clear()
        self.removed.clear()
        self.meta_dirty = False

    def _remove(self, r: Req) -> None:
        del self.reqs[r.rank]
        self.dirty.discard(r.rank)
        self.removed.add(r.rank)

    def find(self, tenant: str, lease_id: str) -> Req | None:
        for r in self.reqs.values():
            if r.id == lease_id and r.tenant == tenant:
                return r
        return None

    def _mine(self, tenant: str, lease_id: object, owner: str) -> Req:
        for r in self.reqs.values():  # find(), inlined: this is on every release
            if r.id == lease_id and r.tenant == tenant:
                break
        else:
            raise LeaseNotFound(lease_id)
        if r.owner != owner:
            raise LeaseNotFound(lease_id, f"belongs to another owner, not {owner!r}")
        return r

    # -- the transitions every state change starts and ends with ----------------------------

    def reap(self, now: float, boot: str, probe: ProcessProbe) -> list[Req]:
        """Remove expired requests and grants of provably dead processes (returned in rank
        order)."""
        out = []
        for r in self.reqs.values():
            if r.clock_boot != boot:
                if r.state == "granted":
                    out.append(r)
                    continue
                # A waiter's place survives a reboot: its deadline restarts on this boot's
                # clock, giving its owner one TTL to come back and re-attach.
                r.clock_boot, r.requested, r.expires = boot, now, now + r.ttl
                self.dirty.add(r.rank)
            elif r.expires <= now or (
                r.state == "granted" and r.acked and r.proc is not None and probe.is_dead(r.proc)
            ):
                out.append(r)
        if out:
            if len(out) > 1:
                out.sort(key=_rank)
            for r in out:
                self._remove(r)
        return out

    def grant(self, now: float) -> list[Req]:
        """Apply the grant rule; newly granted requests get the next tokens in rank order."""
        w = None
        for r in self.reqs.values():  # a loop, not a list: this runs in every transition
            if r.state != "granted":
                if w is not None:
                    break
                w = r
        else:
            if w is None:
                return []
            # the common case (a new request, nobody else waiting): what grant_order decides
            # for a lone waiter, that it is granted unless a holder of its tenant has one of
            # its resources
            mine: set[str] | None = None
            for o in self.reqs.values():
                if o is not w and o.tenant == w.tenant:
                    if mine is None:
                        mine = set(w.resources)
                    if not mine.isdisjoint(o.resources):
                        return []
            return [self._grant_one(w, now)]
        queue = [
            QueueEntry(
                r.rank, frozenset(f"{r.tenant}\x00{x}" for x in r.resources), r.state == "granted"
            )
            for r in self.reqs.values()
        ]
        return [self._grant_one(self.reqs[rank], now) for rank in grant_order(queue)]

    def _grant_one(self, r: Req, now: float) -> Req:
        r.state, r.token, r.granted_at = "granted", self.next_token, now
        # the holder has one TTL from the hand-off to notice (it may be restarting)
        r.expires = now + r.ttl
        r.acked = False
        self.next_token += 1
        self.meta_dirty = True
        self.dirty.add(r.rank)
        return r

    # -- operations -----------------------------------------------------------------------------

    def request(
        self,
        tenant: str,
        owner: str,
        resources: tuple[str, ...],
        ttl: float,
        key: tuple[str, int] | None,
        proc: Proc,
        wait: bool,
        now: float,
        boot: str,
        wall: float,
    ) -> tuple[Req, bool]:
        """Queue a request (or re-attach to the one with the same key); return it and whether
        the request was new.

        Raises:
            InvalidResource: the key is already used for other resources.
            LeaseHeld: not ``wait`` and it cannot be granted now (it was withdrawn).
        """
        existing = None
        if key is not None:
            for r in self.reqs.values():
                if (r.tenant, r.owner, r.key) == (tenant, owner, key):
                    existing = r
                    break
        new = existing is None
        if existing is not None:
            if existing.resources != resources:
                raise InvalidResource(
                    list(resources), f"key {key!r} already requested {list(existing.resources)}"
                )
            r = existing
            r.proc, r.ttl, r.expires = proc, ttl, now + ttl
            self.dirty.add(r.rank)
        else:
            # positional: this is on every request (in the order of Req's fields)
            r = Req(
                self.next_rank, f"{_id_bits(64):016x}", tenant, owner,
                key[0] if key else None, key[1] if key else None,
                resources, "waiting", None, ttl, proc, False, wall, boot, now, None, now + ttl,
            )  # fmt: skip
            self.next_rank += 1
            self.meta_dirty = True
            self.reqs[r.rank] = r
            self.dirty.add(r.rank)
        self.grant(now)
        if r.state == "granted":
            r.acked = True
        elif not wait:
            held = self._conflict(r)
            self._remove(r)
            raise held
        return r, new

    # -- the fast paths of an uncontended acquire+release --------------------------------------

    def request_alone(
        self,
        tenant: str,
        owner: str,
        resources: tuple[str, ...],
        ttl: float,
        key: tuple[str, int] | None,
        proc: Proc,
        now: float,
        boot: str,
        wall: float,
    ) -> Req:
        """A request on an empty table, granted at once: what reap, :meth:`request` and
        :meth:`grant` decide there (nothing to reap, re-attach to or wait behind), in one step
        (its state is :func:`granted_state`). The caller checks that the table is empty, and
        marks the row dirty if it writes back through the change tracking."""
        rank, token = self.next_rank, self.next_token
        step, attempt = key if key is not None else (None, None)
        r = self.reqs[rank] = Req(
            rank, f"{_id_bits(64):016x}", tenant, owner, step, attempt,
            resources, "granted", token, ttl, proc, True, wall, boot, now, now, now + ttl,
        )  # fmt: skip
        self.next_rank, self.next_token = rank + 1, token + 1
        return r

    def release_only(
        self,
        tenant: str,
        lease_id: str,
        owner: str,
        token: int | None,
        now: float,
        boot: str,
        probe: ProcessProbe,
    ) -> Req | None:
        """The release of the table's only request, a live grant: what reap, :meth:`release`
        and :meth:`grant` decide there (nothing to reap, nobody to hand off to); the removed
        row, which the caller marks removed if it writes back through the change tracking.
        None, with nothing changed, for anything else: the caller then takes the general
        path."""
        if len(self.reqs) != 1:
            return None
        (r,) = self.reqs.values()
        if (
            r.id != lease_id
            or r.tenant != tenant
            or r.owner != owner
            or r.state != "granted"
            or (token is not None and token != r.token)
            or r.clock_boot != boot
            or r.expires <= now
            or (r.acked and r.proc is not None and probe.is_dead(r.proc))
        ):
            return None
        self.reqs.clear()
        return r

    def _conflict(self, r: Req) -> LeaseHeld:
        mine = set(r.resources)
        for other in sorted(self.reqs.values(), key=lambda o: (o.state != "granted", o.rank)):
            if other is r or other.tenant != r.tenant:
                continue
            common = sorted(mine.intersection(other.resources))
            if common:
                if other.state == "granted":
                    return LeaseHeld(common[0], other.owner, other.token)
                return LeaseHeld(common[0], f"{other.owner} (queued earlier, rank {other.rank})")
        return LeaseHeld(r.resources[0], "unknown")  # pragma: no cover - the rule granted it

    def heartbeat(self, tenant: str, lease_id: str, owner: str, proc: Proc, now: float) -> Req:
        """Renew a request's TTL (granted or waiting) and attach it to ``proc``.

        Raises:
            LeaseNotFound: no such request (released, reaped, expired) or not ``owner``'s.
        """
        r = self._mine(tenant, lease_id, owner)
        r.proc, r.expires = proc, now + r.ttl
        if r.state == "granted":
            r.acked = True
        self.dirty.add(r.rank)
        return r

    def release(self, tenant: str, lease_id: str, owner: str, token: int | None) -> Req:
        """Release a grant.

        Raises:
            LeaseNotFound: no such lease, or another owner's.
            LeaseLost: not granted, or ``token`` is not the grant's token.
        """
        for r in self.reqs.values():  # _mine() and _remove(), inlined: on every release
            if r.id == lease_id and r.tenant == tenant:
                break
        else:
            raise LeaseNotFound(lease_id)
        if r.owner != owner:
            raise LeaseNotFound(lease_id, f"belongs to another owner, not {owner!r}")
        if r.state != "granted":
            raise LeaseLost(r.resources[0], "not granted (still waiting); cancel it instead")
        if token is not None and token != r.token:
            raise LeaseLost(r.resources[0], f"token {token} is not this grant's token", token)
        rank = r.rank
        del self.reqs[rank]
        self.dirty.discard(rank)
        self.removed.add(rank)
        return r

    def cancel(self, tenant: str, lease_id: str, owner: str) -> Req | None:
        """Withdraw a request (waiting or granted); None when it is already gone.

        Raises:
            LeaseNotFound: it is another owner's.
        """
        try:
            r = self._mine(tenant, lease_id, owner)
        except LeaseNotFound as exc:
            if exc.reason == "no such lease":
                return None
            raise
        self._remove(r)
        return r

    # -- views ------------------------------------------------------------------------------------

    def state_of(self, r: Req, now: float) -> LeaseState:
        wake_in = None
        watch: list[int] = []
        if r.state == "waiting":
            ahead = [
                o
                for o in self.reqs.values()
                if o.tenant == r.tenant and (o.state == "granted" or o.rank < r.rank)
            ]
            if ahead:
                wake_in = max(0.0, min(o.expires for o in ahead) - now)
            for o in ahead:
                p = o.proc
                if (
                    o.state == "granted"
                    and o.acked
                    and p is not None
                    and r.proc is not None
                    and (p.host, p.boot) == (r.proc.host, r.proc.boot)
                    and p.pid != r.proc.pid
                ):
                    watch.append(p.pid)
        return lease_state(
            {
                "lease_id": r.id,
                "rank": r.rank,
                "owner": r.owner,
                "resources": r.resources,
                "state": "granted" if r.state == "granted" else "waiting_on_lock",
                "token": r.token,
                "ttl": r.ttl,
                "expires_in": r.expires - now,
                "key": None if r.step is None or r.attempt is None else (r.step, r.attempt),
                "wake_in": wake_in,
                "watch_pids": tuple(sorted(set(watch))[:MAX_WATCH]) if watch else (),
            }
        )

    def status(self, tenant: str, now: float, wall: float) -> LeaseStatus:
        rows = sorted((r for r in self.reqs.values() if r.tenant == tenant), key=lambda r: r.rank)
        queue = [QueueEntry(r.rank, frozenset(r.resources), r.state == "granted") for r in rows]
        infos = [
            LeaseInfo(
                lease_id=r.id,
                rank=r.rank,
                owner=r.owner,
                key=r.key,
                resources=r.resources,
                state="granted" if r.state == "granted" else "waiting_on_lock",
                token=r.token,
                ttl=r.ttl,
                age=max(0.0, wall - r.created),
                held_for=None if r.granted_at is None else max(0.0, now - r.granted_at),
                expires_in=r.expires - now,
                host=r.proc.host if r.proc else None,
                pid=r.proc.pid if r.proc else None,
                blocked_by=tuple(blockers(queue, r.rank)),
            )
            for r in rows
        ]
        return LeaseStatus(
            holders=tuple(i for i in infos if i.state == "granted"),
            waiters=tuple(i for i in infos if i.state != "granted"),
            next_token=self.next_token,
        )

    def copy(self) -> Table:
        return Table({k: replace(v) for k, v in self.reqs.items()}, self.next_rank, self.next_token)


def granted_state(
    lease_id: str,
    rank: int,
    owner: str,
    resources: tuple[str, ...],
    token: int | None,
    ttl: float,
    expires_in: float,
    key: tuple[str, int] | None,
) -> LeaseState:
    """:meth:`Table.state_of` for a grant (no hints for a waiter), in one step."""
    return lease_state(
        {
            "lease_id": lease_id, "rank": rank, "owner": owner, "resources": resources,
            "state": "granted", "token": token, "ttl": ttl, "expires_in": expires_in, "key": key,
            "wake_in": None, "watch_pids": (),
        }
    )  # fmt: skip


def fence_error(
    r: Req | None, resource: str, token: int, now: float, boot: str
) -> LeaseLost | None:
    """Why a write fenced by (lease, resource, token) must be refused; None when it may go."""
    if r is None:
        return LeaseLost(resource, "no such lease (released, reaped or never granted)", token)
    if r.state != "granted":
        return LeaseLost(resource, "the request is not granted", token)
    if resource not in r.resources:
        return LeaseLost(resource, "the lease does not cover this resource", token)
    if r.token != token:
        return LeaseLost(resource, f"token {token} is not the current token", token)
    if r.clock_boot != boot or r.expires <= now:
        return LeaseLost(resource, "the lease expired (TTL passed without a heartbeat)", token)
    return None
