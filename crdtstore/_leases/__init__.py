"""Leases: exclusive, fenced, FIFO ownership of files and work items (see shared/DESIGN.md).

Modules: ``_resources`` (canonical names), ``_rule`` (the grant rule, pure), ``_engine`` (the
lease table's transitions, pure), ``_clock`` (boot clock, process identity), ``_backend`` (the
interface; the backends live with their journals in ``crdtstore/_backends/``), ``_api``
(``store.leases``, ``store.lease``), ``_conformance`` (``check_lease_backend``).
"""

from __future__ import annotations

from typing import Any

from .._journal import JournalBackend
from ._api import Lease as Lease
from ._api import Leases as Leases
from ._backend import LeaseBackend as LeaseBackend
from ._clock import Clock as Clock
from ._clock import FakeClock as FakeClock
from ._clock import Proc as Proc
from ._clock import ProcessProbe as ProcessProbe
from ._clock import SystemClock as SystemClock
from ._clock import SystemProbe as SystemProbe
from ._clock import this_proc as this_proc
from ._models import LeaseInfo as LeaseInfo
from ._models import LeaseState as LeaseState
from ._models import LeaseStatus as LeaseStatus
from ._resources import canonical_resource as canonical_resource
from ._resources import canonical_resources as canonical_resources
from ._resources import item_resource as item_resource
from ._rule import QueueEntry as QueueEntry
from ._rule import grant_order as grant_order


def lease_backend_for(journal: JournalBackend) -> LeaseBackend | None:
    """The lease backend that goes with a journal backend (same store), or None.

    A journal backend offers leases by defining ``lease_backend()`` (every built-in one does).
    """
    factory: Any = getattr(journal, "lease_backend", None)
    if callable(factory):
        backend = factory()
        if isinstance(backend, LeaseBackend):
            return backend
    return None


__all__ = [
    "Clock",
    "FakeClock",
    "Lease",
    "LeaseBackend",
    "LeaseInfo",
    "LeaseState",
    "LeaseStatus",
    "Leases",
    "Proc",
    "ProcessProbe",
    "QueueEntry",
    "SystemClock",
    "SystemProbe",
    "canonical_resource",
    "canonical_resources",
    "grant_order",
    "item_resource",
    "lease_backend_for",
    "this_proc",
]
