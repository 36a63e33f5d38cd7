"""The in-process lease backend of ``memory://`` stores."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from ..._leases._backend import TableBackend
from ..._leases._clock import Clock, ProcessProbe
from ..._leases._engine import Table, fence_error

T = TypeVar("T")


class MemoryLeaseData:
    """The lease table of one memory store, shared by every ``MemoryLeases`` opened on it."""

    def __init__(self) -> None:
        self.table = Table()
        # the blocking facade may drive a store from another thread's event loop
        self.lock = threading.Lock()


_ATTR = "_crdtstore_leases"


def memory_data_for(journal_data: object) -> MemoryLeaseData:
    """The lease data that goes with a memory journal's data (one per named store): kept on
    that object, so it lives exactly as long as the store's journal does."""
    got = getattr(journal_data, _ATTR, None)
    if not isinstance(got, MemoryLeaseData):
        got = MemoryLeaseData()
        setattr(journal_data, _ATTR, got)
    return got


class MemoryLeases(TableBackend):
    """Leases held in this process's memory."""

    name = "memory"

    def __init__(
        self,
        data: MemoryLeaseData | None = None,
        *,
        clock: Clock | None = None,
        probe: ProcessProbe | None = None,
    ) -> None:
        super().__init__(clock=clock, probe=probe)
        self.data = data if data is not None else MemoryLeaseData()

    async def open(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def _transact(self, fn: Callable[[Table], T], *, shield: bool = False) -> T:
        # never suspends: nothing can cancel it halfway, shielded or not
        with self.data.lock:
            t = self.data.table
            # work on a copy: an unexpected exception halfway leaves the table as it was,
            # the same all-or-nothing that the SQLite backend gets from ROLLBACK
            work = t.copy()
            out = fn(work)
            work.clean()
            self.data.table = work
            return out

    async def _view(self, fn: Callable[[Table], T]) -> T:
        with self.data.lock:
            return fn(self.data.table)

    def check_fence(self, tenant: str, lease_id: str, resource: str, token: int) -> None:
        """The fencing check, synchronous, for callers that hold their own critical section.

        Raises:
            LeaseLost: see :meth:`check`.
        """
        with self.data.lock:
            r = self.data.table.find(tenant, lease_id)
            err = fence_error(r, resource, token, self.clock.now(), self.clock.boot_id())
        if err is not None:
            raise err

    async def check(self, tenant: str, lease_id: str, resource: str, token: int) -> None:
        self.check_fence(tenant, lease_id, resource, token)

    def __repr__(self) -> str:  # pragma: no cover
        return f"<MemoryLeases {len(self.data.table.reqs)} requests>"
