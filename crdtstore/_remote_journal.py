"""What a journal behind a server needs beyond :class:`~crdtstore._journal.JournalBackend`.

A remote journal (``ws://``: crdtstore's own ``sync`` client) lets the server decide who a
write is attributed to (the token's agent) and whether a run may be written at all, and it
cannot hold a transaction for a guarded write: it sends the guard to the server instead
(:class:`~crdtstore._guarded_append.RemoteGuardedAppend`). Local backends (memory, SQLite,
Redis) implement none of this; the record asks these questions only of a backend that is a
:class:`RemoteJournal`. (Hearing of new entries by other means than the store's datagrams,
and following the records of a run, are :meth:`JournalBackend.bind` / ``attach``: Redis
needs them too.)
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class RemoteJournal(ABC):
    """The questions a record asks of a journal behind a server (see the module docstring)."""

    @abstractmethod
    async def identity(self, tenant: str, run: str) -> tuple[str, str]:
        """The (agent, source) the server attributes every write of ``run`` to (the
        token's); the record takes it as its own."""

    @abstractmethod
    async def read_only(self, tenant: str, run: str) -> bool:
        """Whether the server will refuse writes to ``run`` (a ``ro`` token): the record then
        refuses them before touching its document."""
