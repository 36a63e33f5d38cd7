"""The interface for authors of backends and transports: journal and lease backends, and a
network layer that serves records to other processes (crdtstore's own ``sync`` package).

Everything here is documented and kept stable like the top-level API; ``sync`` imports
crdtstore only through ``crdtstore``, ``crdtstore.codec``, ``crdtstore.record`` and this module
(checked by tests/project/test_layering.py). What every journal backend implements is
:class:`JournalBackend` (with :class:`Authority`, the rows and entries it stores); a backend
that decides guarded writes in its append implements :class:`AtomicGuardedAppend` as well,
and a backend behind a server :class:`RemoteJournal` (what only a remote journal needs: the
server's attribution and read-only runs) and :class:`RemoteGuardedAppend`. Lease
backends implement :class:`LeaseBackend`; the checks of lease arguments and the fence error
are shared here so that a remote lease service refuses exactly what the local engine refuses.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._backends.sqlite import sqlite_path as _sqlite_path
from ._errors import error_from_dict as error_from_dict
from ._guarded_append import AtomicGuardedAppend as AtomicGuardedAppend
from ._guarded_append import Fence as Fence
from ._guarded_append import Guard as Guard
from ._guarded_append import GuardMoved as GuardMoved
from ._guarded_append import RemoteGuardedAppend as RemoteGuardedAppend
from ._journal import Authority as Authority
from ._journal import JournalBackend as JournalBackend
from ._journal import NewEntry as NewEntry
from ._journal import Row as Row
from ._journal import RunRow as RunRow
from ._journal import SnapshotRow as SnapshotRow
from ._journal import check_call as check_call
from ._leases import LeaseBackend as LeaseBackend
from ._leases import LeaseState as LeaseState
from ._leases import LeaseStatus as LeaseStatus
from ._leases import Proc as Proc
from ._leases import canonical_resources as canonical_resources
from ._leases import this_proc as this_proc
from ._leases._api import WAKE_KEY as LEASE_WAKE_KEY
from ._leases._engine import check_key as check_key
from ._leases._engine import check_owner as check_owner
from ._leases._engine import check_ttl as check_ttl
from ._leases._engine import fence_error as fence_error
from ._names import check_name as check_name
from ._remote_journal import RemoteJournal as RemoteJournal

if TYPE_CHECKING:
    from ._backends.redis import Persistence

__all__ = [
    "LEASE_WAKE_KEY",
    "AtomicGuardedAppend",
    "Authority",
    "Fence",
    "Guard",
    "GuardMoved",
    "JournalBackend",
    "LeaseBackend",
    "LeaseState",
    "LeaseStatus",
    "NewEntry",
    "Proc",
    "RemoteGuardedAppend",
    "RemoteJournal",
    "Row",
    "RunRow",
    "SnapshotRow",
    "canonical_resources",
    "check_call",
    "check_key",
    "check_name",
    "check_owner",
    "check_ttl",
    "error_from_dict",
    "fence_error",
    "redis_persistence",
    "sqlite_path",
    "this_proc",
]


def sqlite_path(url: str) -> Path:
    """The database file of a ``sqlite:///path`` store URL.

    Raises:
        UnsupportedURL: not a SQLite URL.
    """
    return _sqlite_path(url)


async def redis_persistence(url: str, **options: Any) -> Persistence:
    """How the Redis of a ``redis://`` store URL persists (append-only file, RDB save rules):
    what ``crdtstore serve`` checks before it serves on it. Needs the ``redis`` extra."""
    from ._backends.redis import persistence

    return await persistence(url, **options)
