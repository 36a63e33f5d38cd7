"""The journal: update deltas with provenance, and the interface every backend implements.

A journal is, per run, a sequence of entries numbered 1, 2, 3, ... (the journal position,
``seq``). Each entry is one local transaction of one record: its pycrdt v1 update bytes, who
wrote it (agent, source kind, the writing Doc's client id, and the tool call it was made for,
if any: ``call``, see ``Record.attributed``), when (wall time), a checksum, and its *effect*:
the operations it made, as JSON (see :data:`Op`), so that history, change notification and
audit never decode update bytes.

The order of a run's journal is a causal order: a writer appends an entry only after the entries
it has applied, and its own entries in the order it made them. Applying entries one by one in
``seq`` order is therefore always safe (PYCRDT-NOTES hazard 1).

:class:`JournalBackend` keeps only what every backend needs; what only some backends can do
(guarded appends, remote state) is a separate interface (:mod:`crdtstore._guarded_append`).
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict

from ._errors import InvalidValue, UnsupportedOperation
from ._values import from_stored

T = TypeVar("T")

Source = Literal["tool", "model", "user", "system"]
SOURCES: frozenset[str] = frozenset(("tool", "model", "user", "system"))
Durability = Literal["durable", "batched"]
# An effect is a list of operations, each a list:
#
#   ["map", collection, "set", key, value]
#   ["map", collection, "del", key]
#   ["list", collection, "ins", index, [values...]]
#   ["list", collection, "del", index, count]
#   ["text", collection, "ins", index, text]
#   ["text", collection, "del", index, count]
Op = list[Any]


MAX_CALL = 256  # characters of a tool-call id (``call``)


def check_call(call: object) -> str:
    """A valid tool-call id (``""``: none): a string of at most :data:`MAX_CALL` characters
    without NUL.

    Raises:
        InvalidValue: anything else.
    """
    if type(call) is not str or len(call) > MAX_CALL or "\x00" in call:
        shown = repr(call) if len(repr(call)) <= 80 else repr(call)[:77] + "..."
        raise InvalidValue(
            f"call must be a string of at most {MAX_CALL} characters without NUL, not {shown}"
        )
    return call


checksum: Callable[[bytes], int] = zlib.crc32
"""The checksum stored with every journal entry (CRC-32 of the update bytes): ``zlib.crc32``
itself, without a Python frame around it (it runs once per entry on the write path)."""


class NewEntry(NamedTuple):
    """An entry about to be appended (no journal position yet).

    ``origin`` is the nested run that wrote it ("" for the journal's own run); ``call`` the
    tool-call id it was written for ("" for none).
    """

    agent: str
    source: str
    client_id: int
    wall_time: float
    update: bytes
    effect: list[Op]
    checksum: int
    origin: str = ""
    call: str = ""


class Row(NamedTuple):
    """An entry as a backend returns it (internal, cheap to build)."""

    seq: int
    agent: str
    source: str
    client_id: int
    wall_time: float
    update: bytes
    effect: list[Op]
    checksum: int
    origin: str = ""
    call: str = ""


class HistoryRow(NamedTuple):
    """An entry as :meth:`JournalBackend.history_rows` returns it: what ``history`` reads of
    it (no update bytes, no client id, no checksum)."""

    seq: int
    agent: str
    source: str
    wall_time: float
    origin: str
    call: str
    ops: list[Op]


class SnapshotRow(NamedTuple):
    """A compacted prefix of a run's journal: the merged update of entries ``1..seq``."""

    seq: int
    update: bytes
    state: dict[str, Any]  # crdtstore's own per-record state at that point (provenance index)
    created: float


RunState = Literal["open", "closed", "archived"]


class RunRow(NamedTuple):
    tenant: str
    run: str
    created: float
    head: int
    snapshot_seq: int
    parent: str | None = None
    state: str = "open"
    delete_after: float | None = None


def _ops_of(effect: list[Op], collection: str, key: str) -> list[Op]:
    """The map ops of ``effect`` that write ``collection[key]``, values normalised (new
    lists: a backend's rows may be shared)."""
    return [
        [*op[:4], from_stored(op[4])] if len(op) > 4 else op
        for op in effect
        if op[0] == "map" and op[1] == collection and op[3] == key
    ]


class JournalEntry(BaseModel):
    """One journal entry, as the public API returns it.

    ``call`` is the tool-call id the entry was written for (``Record.attributed``), ``""``
    when none.
    """

    model_config = ConfigDict(frozen=True)

    run: str
    seq: int
    agent: str
    source: str
    client_id: int
    wall_time: float
    size: int
    effect: list[Op]
    update: bytes
    origin_run: str
    call: str = ""

    @classmethod
    def from_row(cls, run: str, row: Row) -> JournalEntry:
        return cls(
            run=run,
            origin_run=row.origin or run,
            seq=row.seq,
            agent=row.agent,
            source=row.source,
            client_id=row.client_id,
            wall_time=row.wall_time,
            size=len(row.update),
            effect=row.effect,
            update=row.update,
            call=row.call,
        )


class RunInfo(BaseModel):
    """What a store knows about one run."""

    model_config = ConfigDict(frozen=True)

    tenant: str
    run: str
    created: float
    head: int
    snapshot_seq: int
    parent: str | None = None
    state: str = "open"
    delete_after: float | None = None


class Authority(ABC):
    """An open exclusive write transaction on one run's journal (see
    :meth:`JournalBackend.authority`)."""

    @abstractmethod
    async def read(self, after: int) -> list[Row]:
        """Every entry with ``seq > after``, in order."""

    @abstractmethod
    async def append(self, entries: Sequence[NewEntry]) -> list[int]:
        """Append inside the transaction (visible to others once it commits)."""

    async def run_sync(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(conn)`` inside the transaction (SQLite: the sqlite3 connection), for
        checks that must share it, such as lease fencing. Backends without a connection pass
        None."""
        return fn(None)

    async def append_last(self, entries: Sequence[NewEntry]) -> list[int]:
        """:meth:`append` as the transaction's last step: a backend may commit in the same
        step (SQLite: one worker-thread hop less per guarded write); leaving the context
        then only ends it. Nothing may be read or appended after it; whether an error raised
        after it still rolls it back is the backend's (SQLite: it does not)."""
        return await self.append(entries)


class JournalBackend(ABC):
    """Where journals live. One instance per open store, used from one event loop.

    Implementations translate their driver's errors into :class:`BackendError`. All methods
    take an already validated tenant and run name. A journal behind a server implements
    :class:`~crdtstore._remote_journal.RemoteJournal` as well.
    """

    name: str = "journal"
    # reads of a few hundred rows are served on the event loop thread, without a thread hop
    # or network wait (SQLite): a bulk replay may then read them with the GC paused
    small_reads_inline: bool = False

    def bind(self, wake: Callable[[str, str], None]) -> None:
        """Called by the store with its wake-up function (``wake(tenant, run)`` wakes the
        readers of the run) for backends that learn of new entries by other means than
        :meth:`notify_url` (Redis: its stream reads; ``ws://``: the hub's pushes). The
        default ignores it."""
        return None  # an optional hook (not abstract)

    def attach(self, tenant: str, run: str, record: Any) -> None:
        """Called by a record of ``run`` once it has loaded (and :meth:`detach` when it
        closes), for backends that follow or resync it themselves (Redis: the runs its
        stream reads watch; ``ws://``: the state-vector exchange on every reconnect). The
        default ignores it."""
        return None  # an optional hook (not abstract)

    def detach(self, tenant: str, run: str, record: Any) -> None:
        """The record given to :meth:`attach` closes. The default ignores it."""
        return None

    @abstractmethod
    async def open(self) -> None:
        """Connect (create files, tables) before first use."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release resources. Idempotent."""

    @abstractmethod
    async def ensure_run(
        self, tenant: str, run: str, *, create: bool, parent: str | None = None
    ) -> RunRow:
        """Return the run, creating it if ``create`` (as a child of ``parent``, which must
        exist); raise ``UnknownRun`` otherwise, ``InvalidValue`` if it exists with another
        parent."""

    @abstractmethod
    async def set_run(
        self,
        tenant: str,
        run: str,
        *,
        state: str | None = None,
        delete_after: float | Literal["keep"] | None = "keep",
    ) -> RunRow:
        """Change a run's state (``open``, ``closed``, ``archived``) or retention deadline
        (seconds since the epoch; None for none)."""

    @abstractmethod
    async def get_run(self, tenant: str, run: str) -> RunRow | None:
        """Return the run or None."""

    @abstractmethod
    async def list_runs(self, tenant: str) -> list[RunRow]:
        """Every run of the tenant, oldest first."""

    async def tenants(self) -> list[str] | None:
        """Every tenant with at least one run, sorted; None when the backend cannot tell.

        For operators that serve every tenant of one backend (the hub's retention sweep);
        a :class:`~crdtstore.Store` stays within its own tenant. The default: None."""
        return None

    @abstractmethod
    async def append(
        self, tenant: str, run: str, entries: Sequence[NewEntry], *, durable: bool
    ) -> list[int]:
        """Append entries atomically, in order; return their journal positions.

        With ``durable`` the call returns only once the entries survive power loss; without,
        once they survive the death of the calling process.
        """

    @abstractmethod
    async def read(
        self, tenant: str, run: str, after: int, limit: int = 10_000, *, skip_client: int = -1
    ) -> list[Row]:
        """Entries with ``seq > after`` in ``seq`` order (at most ``limit``).

        Entries of client ``skip_client`` may come back without their update and effect
        (a record tailing the journal already holds its own writes)."""

    @abstractmethod
    async def head(self, tenant: str, run: str) -> int:
        """The highest journal position of the run (0 when empty)."""

    @abstractmethod
    async def load_snapshot(self, tenant: str, run: str) -> SnapshotRow | None:
        """The newest snapshot of the run, or None."""

    @abstractmethod
    async def save_snapshot(
        self, tenant: str, run: str, snapshot: SnapshotRow, *, drop_journal: bool
    ) -> None:
        """Store a snapshot (replacing older ones) and optionally delete the entries it covers,
        in one transaction."""

    @abstractmethod
    async def history(self, tenant: str, run: str, collection: str, key: str) -> list[Row]:
        """Entries whose effect sets or deletes ``key`` of map ``collection``, oldest first."""

    async def history_rows(
        self, tenant: str, run: str, collection: str, key: str
    ) -> list[HistoryRow]:
        """The entries of :meth:`history` as ``Store.history`` reads them: ``ops`` holds the
        entry's ops of ``key`` (a backend may leave its other ops in), their values' numbers
        normalised as values read from the document are (``from_stored``: an integral float
        within ±2**53 is an int). The default derives them from :meth:`history`; a backend
        that can read less (no update bytes) overrides it."""
        return [
            HistoryRow(r.seq, r.agent, r.source, r.wall_time, r.origin, r.call, ops)
            for r in await self.history(tenant, run, collection, key)
            if (ops := _ops_of(r.effect, collection, key))
        ]

    @abstractmethod
    async def delete_run(self, tenant: str, run: str) -> bool:
        """Remove every byte of the run and of its nested runs; return whether it existed."""

    async def delete_run_if_due(self, tenant: str, run: str, now: float) -> bool:
        """Delete the run and its nested runs as :meth:`delete_run` does, but only if its
        retention deadline is set and ``<= now``, deciding and deleting in one atomic step (a
        ``set_retention`` or a write that lands first is seen); return whether it was deleted.

        What the store's retention sweep calls. The default refuses: a backend that cannot
        make the check and the delete one step must not pretend to.
        """
        raise UnsupportedOperation(self.name, "the retention sweep (delete_run_if_due)")

    async def rewrite_entries(self, tenant: str, run: str, rows: Sequence[Row]) -> None:
        """Replace, in one transaction, the update, effect and checksum of the entries at the
        positions of ``rows`` (every other field and every other entry stays; a position no
        longer in the journal is ignored), so that their old bytes leave the storage: the
        redaction that keeps the audit trail (``Store.redact``). The default refuses."""
        raise UnsupportedOperation(self.name, "rewrite_entries")

    @abstractmethod
    async def get_config(self, tenant: str, run: str) -> dict[str, Any]:
        """The run's declarations (collection specs, ...) as JSON; ``{}`` if none."""

    @abstractmethod
    async def update_config(
        self, tenant: str, run: str, update: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        """Atomically replace the run's config by ``update(current)``; return the new one.

        ``update`` runs inside the backend's write transaction and may raise to abort.
        """

    @abstractmethod
    def authority(
        self, tenant: str, run: str, *, durable: bool
    ) -> AbstractAsyncContextManager[Authority]:
        """An exclusive write transaction on the run's journal: the serialisation point of
        guarded writes. Nothing another writer appends can interleave until it ends; leaving
        with an exception rolls back what was appended in it."""

    def notify_url(self) -> str | None:
        """An identifier shared by every process that opens the same backend, used to wake
        readers in other processes; None when the backend lives in this process only."""
        return None

    def changes(self) -> int | None:
        """A number that changes whenever the journal may have grown by a write this store
        was not told of (another process's commit whose wake-up datagram got lost); None when
        the backend cannot tell. The store asks every ``poll_interval`` seconds, on the event
        loop thread; when the number moved (or is None) it asks :meth:`heads` and wakes the
        readers of the runs that moved: so an idle store costs one call per interval, not one
        read per record. Must be cheap and never block. The default: None."""
        return None

    def heads(self, tenant: str, runs: Sequence[str]) -> dict[str, int] | None:
        """The journal head of each of ``runs`` that exists, read now on the event loop
        thread without blocking; None when the backend cannot tell at once. When
        :meth:`changes` moved, the store asks this for the runs its records read and wakes
        only those whose head is past what they were told, instead of every record (a
        commit to one run must not make every loaded run re-read). The default: None (every
        reader is woken)."""
        return None
