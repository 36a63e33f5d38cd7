"""What a journal behind a server needs beyond :class:`~crdtstore._journal.JournalBackend`.

A remote journal (``ws://``: crdtstore's own ``sync`` client) learns of new entries from the
server's pushes rather than from the store's wake-up datagrams, resyncs its records itself on
every reconnect, decides who a write is attributed to (the token's agent) and whether a run
may be written at all, and cannot hold a transaction for a guarded write (it sends the guard
to the server: :class:`~crdtstore._guarded_append.RemoteGuardedAppend`). Local backends
(memory, SQLite, Redis) implement none of this; the store and the record call these hooks only
on a backend that is a :class:`RemoteJournal`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any


class RemoteJournal(ABC):
    """The hooks of a journal behind a server (see the module docstring)."""

    @abstractmethod
    def bind(self, wake: Callable[[str, str], None]) -> None:
        """Called once by the store with its wake-up function: ``wake(tenant, run)`` wakes
        the readers of the run (call it when the server pushes an entry)."""

    @abstractmethod
    def attach(self, tenant: str, run: str, record: Any) -> None:
        """A record of ``run`` has loaded: resync it on every reconnect (the state-vector
        exchange) until :meth:`detach`."""

    @abstractmethod
    def detach(self, tenant: str, run: str, record: Any) -> None:
        """The record given to :meth:`attach` closes."""

    @abstractmethod
    async def identity(self, tenant: str, run: str) -> tuple[str, str]:
        """The (agent, source) the server attributes every write of ``run`` to (the
        token's); the record takes it as its own."""

    @abstractmethod
    async def read_only(self, tenant: str, run: str) -> bool:
        """Whether the server will refuse writes to ``run`` (a ``ro`` token): the record then
        refuses them before touching its document."""
