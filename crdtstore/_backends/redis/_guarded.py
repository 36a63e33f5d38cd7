"""Guarded and fenced appends on Redis: the guard checked by the append script itself
(``lua/append.lua``), so that the check and the write are one atomic step on the server (see
:mod:`crdtstore._guarded_append` for what a guard is and who decides what).

A fenced append reads the tenant's lease table in the same script that appends (the lease
scripts and this one run one at a time on the server): a lease reaped, released or handed on
by a lease script can never be followed by a write fenced with its old token, and the TTL is
measured on the server's clock (``TIME``), as the lease scripts measure it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..._errors import LeaseLost
from ..._guarded_append import Guard, GuardMoved
from ..._journal import NewEntry
from ._authority import Backoff
from ._client import mapped

if TYPE_CHECKING:
    from ._journal import RedisJournal


def guard_arg(guard: Guard) -> str:
    """The guard as the append script reads it (JSON)."""
    fence: list[Any] | None = None
    if guard.fence is not None:
        f = guard.fence
        now, boot = "", ""
        if f.clock is not None:  # a test clock: the lease scripts use its readings too
            now, boot = repr(float(f.clock.now())), f.clock.boot_id()
        fence = [f.lease_id, str(int(f.token)), f.resource, now, boot]
    return json.dumps(
        {
            "seen": int(guard.seen),
            "keys": [list(k) for k in guard.keys],
            "scopes": list(guard.scopes),
            "fence": fence,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )


async def append_guarded_at(
    journal: RedisJournal,
    tenant: str,
    run: str,
    entries: Sequence[NewEntry],
    entry_args: list[Any],
    guard: Guard,
    *,
    durable: bool,
) -> list[int]:
    """:meth:`AtomicGuardedAppend.append_guarded_at` on Redis (one script call; a run locked
    by an authority is waited for, as a plain append waits); ``entry_args``: the entries as
    the append script takes them."""
    keys = journal.keys.run_keys(tenant, run)
    local = journal._locks.get((tenant, run))
    if local is not None and local.locked():
        async with local:  # this store's own open authority ends first
            pass
    args = ["", "", len(entries), guard_arg(guard), *entry_args]
    backoff = Backoff("guarded append")
    while True:
        with mapped("guarded append"):
            got = await journal.scripts.call("append", journal._append_keys(keys), args)
        if got[0] != b"locked":
            break
        await backoff.wait()
    if got[0] == b"stale":
        raise GuardMoved(int(got[1]))
    if got[0] == b"fence":
        assert guard.fence is not None
        raise await _fence_error(journal, tenant, guard)
    first = journal._appended(tenant, run, keys, got)
    if journal.tail is not None and entries:
        journal.tail.wrote(keys.stream, first, entries)
    if durable:
        await journal._durable()
    return list(range(first, first + len(entries)))


async def _fence_error(journal: RedisJournal, tenant: str, guard: Guard) -> LeaseLost:
    """The ``LeaseLost`` of a fence the script refused, with the reason the lease table gives
    now (a lost lease stays lost: its reason does not change after the refusal)."""
    from ._leases import RedisLeases

    f = guard.fence
    assert f is not None
    leases = RedisLeases(journal, clock=f.clock)
    try:
        await leases.check(tenant, f.lease_id, f.resource, f.token)
    except LeaseLost as exc:
        return exc
    return LeaseLost(f.resource, "the lease did not hold when the write was checked", f.token)
