"""The in-process backend (``memory://[NAME]``): the journal and the leases, shared by every
store of the same name in this process; nothing survives the process.

Modules: ``_journal`` (:class:`MemoryJournal`), ``_leases`` (:class:`MemoryLeases` and the
lease table a named store shares).
"""

from ._journal import MemoryJournal as MemoryJournal
from ._leases import MemoryLeaseData as MemoryLeaseData
from ._leases import MemoryLeases as MemoryLeases
from ._leases import memory_data_for as memory_data_for

__all__ = ["MemoryJournal", "MemoryLeaseData", "MemoryLeases", "memory_data_for"]
