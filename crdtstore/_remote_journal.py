"""What a journal behind a server needs beyond :class:`~crdtstore._journal.JournalBackend`.

A remote journal (``ws://``: crdtstore's own ``sync`` client) lets the server decide who a
write is attributed to (the token's agent) and whether a run may be written at all, and it
cannot hold a transaction for a guarded write: it sends the guard to the server instead
(:class:`~crdtstore._guarded_append.RemoteGuardedAppend`). Local backends (memory, SQLite,
Redis) implement none of this; the record asks these questions only of a backend that is a
:class:`RemoteJournal`. (Hearing of new entries by other means than the store's datagrams,
and following the records of a run, are :meth:`JournalBackend.bind` / ``attach``: Redis
needs them too.) Redaction (``Store.redact``) rewrites entries that a client cannot be trusted
to rewrite: a remote journal sends it to the server instead (:meth:`RemoteJournal.redact`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from ._errors import UnsupportedOperation

if TYPE_CHECKING:
    from ._store_compaction import CompactionResult


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

    async def redact(
        self,
        tenant: str,
        run: str,
        collection: str,
        key: str | None,
        *,
        field: str | None,
        index: int | None,
        span: tuple[int, int] | None,
        reason: str,
    ) -> CompactionResult:
        """Have the server redact one value of ``run`` (what ``Store.redact`` does on a local
        store, the arguments already checked as it checks them), as the server's identity
        for the caller (the token's agent); return the server's compaction result. The
        server's records and every client holding the record drop the value as they apply
        the delete. The default refuses.

        Raises:
            UnsupportedOperation: the server does not redact.
            IndexError: ``index`` or ``span`` out of range (as on a local store).
        """
        raise UnsupportedOperation(getattr(self, "name", type(self).__name__), "redact")
