"""Guarded appends decided by the backend: the interfaces a journal backend offers beyond
:class:`~crdtstore._journal.JournalBackend` when it can check a write's guard and append it in
one atomic step (what only some backends can do is a separate, typed interface).

Two kinds, one per way of deciding a guard:

- :class:`AtomicGuardedAppend` (SQLite, Redis): the **writer** decides the guard with its own
  replica, which has applied every entry up to position ``seen``, and the backend appends
  only if no entry journaled after ``seen`` touches a guarded map key or scope and the
  fencing lease still holds, in one step (SQLite: one ``BEGIN IMMEDIATE`` transaction; Redis:
  one Lua script); otherwise :class:`GuardMoved` (read, decide again, retry) or ``LeaseLost``.
  The version a guard compares is the replica's (Yjs conflict resolution included), which no
  server-side index can compute: the backend checks only that the decision is still current.
- :class:`RemoteGuardedAppend` (``ws://``): a **server** holds the replica, decides the
  guard and journals the entry (``journal.append_guarded`` of the hub).

No lock is held between the writer's read and the append: a writer that dies in between
blocks nobody.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from ._journal import NewEntry

if TYPE_CHECKING:
    from ._leases._clock import Clock


class Fence(NamedTuple):
    """A fenced write's lease: the write goes only while lease ``lease_id`` is granted, covers
    ``resource`` and holds token ``token`` (and its TTL has not passed on ``clock``: None for
    the backend's own clock, the Redis server's ``TIME``)."""

    lease_id: str
    token: int
    resource: str
    clock: Clock | None = None


class Guard(NamedTuple):
    """What an :class:`AtomicGuardedAppend` checks in the step that appends.

    ``seen``: the journal position up to which the writer applied every entry when it decided.
    ``keys``: (collection, key) map keys whose version the writer compared. ``scopes``:
    collections (``"*"``: the whole run) whose position it compared. ``fence``: the lease
    the write is fenced by, or None.
    """

    seen: int
    keys: tuple[tuple[str, str], ...] = ()
    scopes: tuple[str, ...] = ()
    fence: Fence | None = None


class GuardMoved(Exception):
    """An entry journaled after ``Guard.seen`` touches a guarded key or scope (or the entries
    after it were compacted away): the writer's decision is stale, nothing was appended.
    ``head``: the run's journal head when the backend looked."""

    def __init__(self, head: int) -> None:
        super().__init__(f"the journal moved to {head} under a guarded write")
        self.head = head


@runtime_checkable
class AtomicGuardedAppend(Protocol):
    """A journal backend that checks a :class:`Guard` and appends in one atomic step."""

    guard_in_append: bool
    """Whether a record decides its guarded writes through :meth:`append_guarded_at` (True:
    Redis, whose authority is a lock held over three round trips that blocks every plain
    writer of the run) or through the authority (False: SQLite, whose authority is one
    database transaction with the guard and the fence checked inside it already, and which
    spares the record the scratch copy of its document an append decided here needs)."""

    def hosts_leases(self, leases: object) -> bool:
        """Whether this backend can check fences of the lease backend ``leases`` inside its
        append (the leases live in the same database); a fenced write through another lease
        backend takes the store's authority path instead."""
        ...

    async def append_guarded_at(
        self,
        tenant: str,
        run: str,
        entries: Sequence[NewEntry],
        guard: Guard,
        *,
        durable: bool,
    ) -> list[int]:
        """Append ``entries`` (in order, at the next dense positions) if the guard holds.

        Raises:
            GuardMoved: an entry after ``guard.seen`` touches a guarded key or scope, or
                entries after it were compacted away (nothing appended).
            LeaseLost: the fence does not hold (nothing appended).
            UnknownRun, RunClosed, BackendError: as :meth:`JournalBackend.append`.
        """
        ...


@runtime_checkable
class RemoteGuardedAppend(Protocol):
    """A journal behind a server that decides a guarded write itself (``ws://``)."""

    async def append_guarded(
        self,
        tenant: str,
        run: str,
        entry: NewEntry,
        *,
        expected: tuple[str, str, int] | None = None,
        based_on: tuple[str, int] | None = None,
        fence: tuple[str, int, str] | None = None,
    ) -> int:
        """Send ``entry`` with its guard (``expected``: collection, key, version;
        ``based_on``: scope, position; ``fence``: lease id, token, resource): its journal
        position, or the guard's error (``StaleVersion``, ``LeaseLost``)."""
        ...


def touches(effect: Sequence[Sequence[object]], guard: Guard) -> bool:
    """Whether an entry with ``effect`` may change the decision of ``guard`` (the check that
    every :class:`AtomicGuardedAppend` makes of the entries after ``guard.seen``)."""
    if "*" in guard.scopes or not effect:  # no effect: raw bytes, anything may have changed
        return True
    for op in effect:
        if op[1] in guard.scopes:
            return True
        if op[0] == "map" and (op[1], op[3]) in guard.keys:
            return True
    return False
