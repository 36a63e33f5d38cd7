"""The hub: a WebSocket server that shares each run's record with the agents connected to it.

::

    hub = Hub("sqlite:///runs/store.db", secret)
    async with anyio.create_task_group() as tg:
        port = await tg.start(hub.serve, "127.0.0.1", 8765)

A client connects to ``ws://host:port/<tenant>/<run>`` with a token (:mod:`sync._tokens`) as
the ``token`` query parameter (what y-websocket's ``params`` option sends) or as the
subprotocol ``crdtstore.token.<token>``. The token is checked at the HTTP upgrade
(``process_request``) and a bad one is refused before any document byte is sent. By default
(``Hub(refuse_with="close")``) the upgrade completes and the connection is closed at once with
the token error's 44xx code and the reason ``"<CODE>: <reason>"``: 4401 for a missing,
malformed, forged or expired token, 4403 for one of another tenant or run, or a revoked one.
That is what ends a y-websocket client for good (3.1 stops by itself on 4400-4499; every
version retries an HTTP refusal forever, which a browser sees as close 1006 and cannot even
read). With ``refuse_with="http"`` the upgrade itself is refused with HTTP 401 or 403 and the
same text as body. An accepted connection speaks the y-protocols sync protocol
(:class:`~sync.ServerSession`).

**Revocation.** A token is revoked by its id (``jti``): :meth:`Hub.revoke`, or a line in the
revocation file (``crdtstore token revoke``; by default ``store.db.revoked`` next to a SQLite
store), whose ``stat`` the hub checks every ``HubLimits.revocation_poll`` (0.5 s) and which it
re-reads when it changed. Connections using a revoked token are closed with 4403
(``TOKEN_REVOKED``), new ones refused with 4403 (or HTTP 403).

**One record per loaded run, provenance per connection.** The first connection to a run opens
the run's record on the tenant's store (a :class:`crdtstore.Record` opened as agent ``hub``,
source ``system``); its document is the one every connection of the run syncs with, and the
last connection to leave closes it (after flushing it to the journal). Every update a
connection sends (its sync step 2, which after a reconnect carries its offline edits, and
its updates) is applied through :meth:`Record.apply_update`, which journals it: the updates
applied in one iteration of the event loop (by every connection whose frames arrived
together) are appended in one SQLite commit by a callback at the end of that iteration, on
the loop thread, or by the record's committer when the write lock is not free at once (see
:class:`_HubRecord`); while nobody waits for a commit, a run commits plain Yjs clients'
updates at most once per ``HubLimits.journal_window`` (20 ms), so that updates arriving
within it share one commit. The update is broadcast when applied, before that commit; a ``flush``
request is answered once everything applied before it is committed, and with an error
(nothing acknowledged) while the journal cannot be written. The record is
a subclass whose ``agent`` and ``source`` are read from a context variable that the
connection's task sets around that call: the journal entry, the provenance of the keys it
wrote and the change events carry the agent and source of the *token* of the connection that
sent the bytes (never anything the client says, and never ``hub``). A context variable is
per task, so connections of one run writing at the same time cannot swap identities, and
the effect of each update is derived against the one shared document (exact provenance, one
copy of the document in memory). Entries other processes append to the run's journal reach
the record through its tail and are broadcast to every connection.

**Per connection:** frames are handled in order, one at a time (so a response to a ``flush``
request acknowledges every update the client sent before it); each update is broadcast as is
to every *other* connection of the run once the record took it; awareness messages are
relayed to every connection (echoed too, as y-websocket's server does), the hub answers
query-awareness and sends the run's awareness states to a new connection, and removes a
leaving connection's clients for everyone; a connection that sent no frame for
``HubLimits.awareness_timeout`` (30 s) has its clients removed for everyone too (it stays
connected; its next announcement brings them back). A read-only connection's sync step 2 and
updates are answered with permission-denied and never applied. Frames to a connection go
through a bounded send queue; a client that reads too slowly to keep it under its bound is
disconnected (4408) rather than growing the hub's memory. A malformed frame closes that
connection only (4400, or 4413 for a frame over the size limit, 4422 for update bytes the
record refuses): the session and the record are untouched. A connection whose token expires
is closed (4401). A connection sending frames faster than its token bucket allows
(``rate_per_second``, ``rate_burst``) is closed (4429).

**Document size.** A run whose document (its v1 encoding) is over
``HubLimits.max_document_bytes`` is not loaded (4414), and an update that would take it past the
limit is refused before it is applied or journaled (4414; an entry given to the journal ops
is answered with the error ``PAYLOAD_TOO_LARGE`` instead). The size is measured once when the
run is loaded (one full encoding, 4-11 ms per MB), then kept as a bound by adding the length of
each transaction's update (+64 bytes) and reserving room for updates being applied; it is
measured again only when that bound would pass the limit.

Extension requests (message type 100) are dispatched to the op registry of :mod:`sync._ops`
(``flush``: answered once everything the run's record holds is journaled; ``whoami``: the
token's claims; ...); an unknown op is answered with the error ``UNSUPPORTED_OP``.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import math
import os
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
from anyio.abc import TaskGroup, TaskStatus

try:
    import sniffio
except ImportError:  # pragma: no cover - anyio runs without it (and then assumes asyncio)
    sniffio = None  # type: ignore[assignment]
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.http11 import Request as HttpRequest
from websockets.http11 import Response as HttpResponse
from websockets.protocol import State
from websockets.typing import Subprotocol

from crdtstore import (
    BudgetExceeded,
    CrdtStoreError,
    InvalidName,
    InvalidUpdate,
    InvalidValue,
    PayloadTooLarge,
    PolicyViolation,
    Record,
    RunClosed,
    Store,
    UnknownRun,
    open_store,
)
from crdtstore._journal import NewEntry, Op
from crdtstore._names import check_name
from crdtstore._replica import Meta

from ._document import ReplicaDocument
from ._errors import CloseCode, ProtocolError
from ._messages import (
    DEFAULT_MAX_MESSAGE_SIZE,
    Awareness,
    AwarenessEntry,
    PermissionDenied,
    QueryAwareness,
    Request,
    Update,
    encode,
    encode_awareness_update,
)
from ._ops import OpContext, dispatch
from ._ops_journal import (  # registers the journal ops (the ws:// client's)
    push_heads,
    push_leases,
)
from ._ops_leases import LEASE_OPS as LEASE_OPS  # registers the lease ops
from ._session import ServerSession
from ._tokens import (
    TOKEN_SUBPROTOCOL_PREFIX,
    RevocationFileError,
    TokenClaims,
    TokenError,
    _check_secret,
    append_revoked,
    check_jti,
    default_revoked_file,
    read_revoked,
    verify,
)

__all__ = ["HUB_AGENT", "SUBPROTOCOL", "Hub", "HubLimits"]

log = logging.getLogger("sync.hub")

HUB_AGENT: Final = "hub"
SUBPROTOCOL: Final = "crdtstore"
_EMPTY_UPDATES: Final = (b"\x00\x00",)
_MAX_REASON: Final = 120  # a close reason is at most 123 bytes of UTF-8
_GROWTH_SLACK: Final = 64  # bytes counted per update on top of its length (see _Room.size)


@dataclass(frozen=True)
class HubLimits:
    """Limits of the hub.

    Attributes:
        max_message_size: frames longer than this close the connection with 4413. (Frames
            over twice this are cut off by the WebSocket layer itself, with 1009.)
        max_queue_frames, max_queue_bytes: bound of a connection's send queue; past either,
            the connection is closed with 4408 (slow consumer).
        close_timeout: seconds to wait for the peer's close frame.
        ping_interval: seconds between keepalive pings (None: no pings).
        awareness_timeout: a connection that sent no frame for this many seconds has its
            awareness states removed for everyone (y-protocols' ``outdatedTimeout``; Yjs
            clients renew their state every 15 s). They come back with its next announcement.
        max_document_bytes: the largest a run's document may get (its v1 encoding, as a new
            client downloads it); an update that would take it past is refused with 4414, and
            a run already past it is not loaded (4414). None: no limit.
        rate_per_second, rate_burst: token bucket on the frames a connection sends: it may
            send ``rate_burst`` frames at once and ``rate_per_second`` on average; past that
            it is closed with 4429 (frames are not queued or answered with an error first: a
            client that floods the hub is misbehaving, and y-websocket treats 44xx as final).
            None: no limit.
        revocation_poll: seconds between checks of the revocation file for changes.
        store_linger: seconds a tenant's store stays open after the last of its runs is
            unloaded (a store holds three SQLite connections, a lease connection and a
            notification socket: some 9 file descriptors); a run of the tenant loaded
            meanwhile reuses it. 0: closed at once.
        journal_window: how long the updates of plain Yjs clients may wait to be journaled
            (seconds; 0: journaled at the end of the event loop iteration that applied them).
            A run's record commits at most once per window while nobody waits for a commit:
            the updates that arrive meanwhile share the next commit. A ``flush`` request, a
            ``ws://`` client's append, a ``ws://`` client connected to the run (it reads the
            journal), or another store object having the store open (another process, seen
            from the notification sockets next to a SQLite store) makes the commit happen in
            that iteration. The hub relays updates before journaling them either way; a Yjs
            client is never told that its update is journaled, and after a hub crash it
            sends what the hub lacks on reconnect.

    Raises:
        InvalidValue: a limit that is not > 0 (``journal_window``, ``store_linger``: < 0 or
            not finite).
    """

    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_queue_frames: int = 4096
    max_queue_bytes: int = 64 * 1024 * 1024
    close_timeout: float = 5.0
    ping_interval: float | None = 20.0
    awareness_timeout: float = 30.0
    max_document_bytes: int | None = 256 * 1024 * 1024
    rate_per_second: float | None = 2000.0
    rate_burst: int = 10_000
    revocation_poll: float = 0.5
    journal_window: float = 0.02
    store_linger: float = 5.0

    def __post_init__(self) -> None:
        for name in ("journal_window", "store_linger"):
            value = getattr(self, name)
            if not 0.0 <= value < math.inf:
                raise InvalidValue(f"HubLimits.{name} must be >= 0 and finite, not {value!r}")
        positive: dict[str, float | None] = {
            "max_message_size": self.max_message_size,
            "max_queue_frames": self.max_queue_frames,
            "max_queue_bytes": self.max_queue_bytes,
            "awareness_timeout": self.awareness_timeout,
            "max_document_bytes": self.max_document_bytes,
            "rate_per_second": self.rate_per_second,
            "rate_burst": self.rate_burst,
            "revocation_poll": self.revocation_poll,
        }
        for name, value in positive.items():
            if value is not None and not value > 0:
                raise InvalidValue(f"HubLimits.{name} must be > 0, not {value!r}")


# The connection whose frame the current task is applying; the hub's records attribute
# writes to its token's agent (see the module docstring).
_CURRENT: ContextVar[_Conn | None] = ContextVar("sync_hub_connection", default=None)


def _loop_schedulers() -> tuple[
    Callable[[Callable[[], None]], object] | None,
    Callable[[float, Callable[[], None]], Any] | None,
]:
    """``(call_soon, call_later)`` for the running event loop's thread: ``call_soon(f)``
    runs the synchronous callback ``f`` after the tasks that are ready now, ``call_later(d,
    f)`` runs it in ``d`` seconds and returns a handle with ``cancel()`` (asyncio:
    ``loop.call_soon``/``loop.call_later``, in a context that names the library to anyio;
    trio: ``run_sync_soon``, and no ``call_later``); ``(None, None)`` on another loop."""
    try:
        import asyncio

        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        ctx = contextvars.Context()  # (a callback has no task: anyio learns the library here)
        if sniffio is not None:
            ctx.run(sniffio.current_async_library_cvar.set, "asyncio")
        return (
            functools.partial(loop.call_soon, context=ctx),
            functools.partial(loop.call_later, context=ctx),
        )
    try:
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon, None
    except (ImportError, RuntimeError):
        return None, None


class _HubRecord(Record):
    """A run's record opened by the hub: its writes are attributed to the agent and source of
    the token of the connection that the current task serves (``hub``/``system`` outside of
    one). ``Record`` reads ``self.agent``/``self.source`` when it builds a journal entry.

    **Group commit on the loop.** A ``batched`` hub record on a backend that can append at
    once on the event loop thread (SQLite's ``append_now``) journals its entries itself
    instead of waking the record's committer task: the first entry queued in an iteration of
    the event loop schedules one callback (:meth:`_journal`) that runs once the tasks ready in
    that iteration (every connection whose frames arrived together) have run, and appends
    every entry queued by then in one transaction (``synchronous=NORMAL``, as the committer's
    batched appends), then marks them committed (waking ``flush`` waiters). No task switch,
    no anyio lock. When it cannot append at once (the write lock is held by another process
    or another append of this record, the journal is failing, the run's id is not cached),
    it appends nothing and wakes the committer, which journals them as it would any entry
    (retrying, reporting failures to ``flush``).

    **Journal window** (asyncio): when nobody waits for a commit (:meth:`_deferral`), the
    callback runs one ``journal_window`` after the last commit instead (``call_later``), so
    the updates that arrive meanwhile share its commit; a waiter that appears meanwhile
    (:meth:`_urge`) brings it forward to the current iteration.

    The entries of a ``ws://`` client's unguarded ``journal.append`` ride the same group
    commit (``Record._append_fast``: queued as pending entries labelled with the client's
    id; the append is answered with their positions once committed, or with the commit's
    error).
    """

    _hub_agent: str
    _hub_source: str
    _call_soon: Callable[[Callable[[], None]], object] | None = None
    _call_later: Callable[[float, Callable[[], None]], Any] | None = None
    _append_now: Callable[[str, str, Sequence[NewEntry]], list[int] | None] | None = None
    _journal_due = False
    _timer: Any = None  # the handle of a deferred _journal (call_later)
    _last_commit = -math.inf  # time.monotonic() of the last group commit
    journal_window = 0.0
    readers = 0  # connections that read from the journal (ws:// clients): never defer then
    group_commits = 0  # commits made by _journal (tests, metrics)

    def bind_loop(self, journal_window: float = 0.0) -> None:
        """Journal on the running event loop from now on (see the class docstring), if the
        record is ``batched`` and its backend can append at once; else leave it to the
        committer. Call from the loop's thread. ``journal_window``: see
        :attr:`HubLimits.journal_window`."""
        append_now = getattr(self._backend, "append_now", None)
        if self.durability == "batched" and append_now is not None:
            self._append_now = append_now
            self._call_soon, self._call_later = _loop_schedulers()
            self.journal_window = journal_window

    def _enqueue(self, update: bytes, ops: list[Op], meta: Meta) -> None:
        call_soon = self._call_soon
        if call_soon is None:
            super()._enqueue(update, ops, meta)
            return
        idle, self._committer_idle = self._committer_idle, False  # not woken: _journal is
        try:
            super()._enqueue(update, ops, meta)
        finally:
            self._committer_idle = idle
        if self._journal_due:
            if self._timer is not None and (self._fast or self.readers):
                self._urge()  # a ws:// append waits for its answer, or a ws:// client reads
            return
        self._journal_due = True
        delay = self._deferral()
        if delay > 0.0:
            assert self._call_later is not None
            self._timer = self._call_later(delay, self._journal)
        else:
            call_soon(self._journal)

    def _deferral(self) -> float:
        """How long the entries queued now may wait for their commit: until one
        ``journal_window`` after the last commit, when nobody waits for it (no ``flush``, no
        ``ws://`` append, no connection reading the journal, no other process with the store
        open: it may be reading the run); else 0 (this iteration)."""
        window = self.journal_window
        if (
            window <= 0.0
            or self._call_later is None
            or self._fast
            or self.readers
            or self._store._notifier.others_listening()
        ):
            return 0.0
        return self._last_commit + window - time.monotonic()

    def _urge(self) -> None:
        """Journal a deferred batch in this iteration instead of when its timer runs out."""
        timer, self._timer = self._timer, None
        if timer is not None and self._call_soon is not None:
            timer.cancel()
            self._call_soon(self._journal)

    async def _wait_committed(self, target: int) -> None:
        if self._committed < target:
            self._urge()
        await super()._wait_committed(target)

    def _journal(self) -> None:
        """Append every queued entry now in one commit; else leave them to the committer."""
        self._journal_due = False
        self._timer = None
        try:
            if self._commit_now():
                return
        except Exception:  # a bug: never into the loop (trio would stop); the committer retries
            log.exception("group commit of %s/%s failed", self.tenant, self.run)
        if self._committer_idle:
            self._committer_idle = False
            self._pending_event.set()

    def _commit_now(self) -> bool:
        pending = self._pending
        if not pending:
            return True
        append_now = self._append_now
        if (
            append_now is None
            or self._state != "open"
            or self._failure is not None  # the committer is retrying: it keeps the order
            or self._commit_lock.locked()  # an append of this record is under way
        ):
            return False
        batch = list(pending)
        try:
            seqs = append_now(self.tenant, self._jrun, self._entries(batch))
        except CrdtStoreError as exc:
            log.debug("group commit %s/%s: %s (the committer retries)", self.tenant, self.run, exc)
            return False
        if seqs is None:
            return False
        self.group_commits += 1
        self._last_commit = time.monotonic()
        self._mark_committed(batch, seqs)
        return True

    @property
    def agent(self) -> str:
        conn = _CURRENT.get()
        return self._hub_agent if conn is None else conn.claims.agent

    @agent.setter
    def agent(self, value: str) -> None:
        self._hub_agent = value

    @property
    def source(self) -> str:
        conn = _CURRENT.get()
        return self._hub_source if conn is None else conn.claims.source

    @source.setter
    def source(self, value: str) -> None:
        self._hub_source = value

    async def _append_externals(self, updates: Sequence[bytes], **kwargs: Any) -> list[int]:
        # journal ops (sync._ops_journal) apply a connection's entries through here
        # (``_append_external`` too): hold them to the run's document size limit as well
        # (refused: PayloadTooLarge, as an error response; nothing applied or journaled)
        conn = _CURRENT.get()
        if conn is None:
            return await super()._append_externals(updates, **kwargs)
        room, limit = conn.room, conn.limits.max_document_bytes
        reserved = 0
        try:
            for update in updates:  # (the record refuses what is not bytes)
                size = len(update) if isinstance(update, bytes) else 0
                reserved += room.reserve(size, limit)
            return await super()._append_externals(updates, **kwargs)
        finally:
            room.release(reserved)


class _CheckingDocument(ReplicaDocument):
    """The session's view of the run's record: reads are the record's document; ``apply_update``
    only checks the bytes and reserves their room under the run's document size limit
    (:meth:`_Room.reserve`), the hub then applies and journals them through the record (which
    is async, and attributes them to the connection's agent)."""

    def __init__(self, room: _Room, max_document_bytes: int | None) -> None:
        assert room.rec is not None
        super().__init__(room.rec.replica)
        self.room = room
        self.max_document_bytes = max_document_bytes
        self.reservation = 0  # of the update just checked; the hub releases it (Hub._apply)

    def apply_update(self, update: bytes) -> None:
        self.replica.check_update(update)
        self.reservation = self.room.reserve(len(update), self.max_document_bytes)


def _wire(frame: bytes) -> bytes:
    """The WebSocket binary frame (server side: unmasked, no extension) carrying ``frame``."""
    return Frame(Opcode.BINARY, frame).serialize(mask=False, extensions=())


class _Room:
    """A loaded run: its record and its connections."""

    def __init__(self, tenant: str, run: str) -> None:
        self.tenant = tenant
        self.run = run
        self.rec: _HubRecord | None = None
        self.conns: set[_Conn] = set()  # (changed through join and leave)
        self._targets: tuple[_Conn, ...] | None = None  # the conns broadcast goes to
        self.awareness: dict[int, AwarenessEntry] = {}
        self.users = 0
        self.ready = anyio.Event()
        self.failed = False
        self.closing = False
        self.closed = anyio.Event()
        self._subscription: Any = None
        # Size of the document's v1 encoding: exact when measured, then a bound kept by adding
        # the length of every transaction's update since plus _GROWTH_SLACK (an applied update
        # grew the encoding by at most its length + 37 bytes over 12,000 random map/text
        # edits); `reserved`: the bytes of updates checked against the limit, not yet applied.
        self.size = 0
        self.reserved = 0

    def attach(self, rec: _HubRecord, size: int) -> None:
        self.rec = rec
        self.size = size
        self._subscription = rec.replica.doc.observe(self._on_transaction)

    def measure(self) -> int:
        """The exact encoded size of the document (one full encoding: 4-11 ms per MB)."""
        assert self.rec is not None
        self.size = len(self.rec.replica.doc.get_update())
        return self.size

    def reserve(self, update_size: int, limit: int | None) -> int:
        """Reserve room for an update of ``update_size`` bytes under the document size
        ``limit`` until it is applied (or refused): give the result to :meth:`release` then.
        The size is measured exactly only when the running bound would pass the limit.

        Raises:
            PayloadTooLarge: (``what="document"``) the document would pass ``limit``.
        """
        if limit is None:
            return 0
        grow = update_size + _GROWTH_SLACK
        if self.size + self.reserved + grow > limit:
            self.measure()
            if self.size + self.reserved + grow > limit:
                raise PayloadTooLarge("document", self.size + self.reserved + grow, limit)
        self.reserved += grow
        return grow

    def release(self, reservation: int) -> None:
        """End a reservation (the update is applied and counted in ``size``, or refused)."""
        self.reserved -= reservation

    def detach(self) -> None:
        if self.rec is not None and self._subscription is not None:
            self.rec.replica.doc.unobserve(self._subscription)
            self._subscription = None

    def _on_transaction(self, event: Any) -> None:
        # A connection's update is broadcast by its own task (as received, to the others);
        # what else changes the document comes from the journal (other processes' writes).
        update = bytes(event.update)
        if update in _EMPTY_UPDATES:
            return
        self.size += len(update) + _GROWTH_SLACK
        if _CURRENT.get() is None:
            self.broadcast(encode(Update(update)))

    def join(self, conn: _Conn) -> None:
        self.conns.add(conn)
        self._targets = None

    def leave(self, conn: _Conn) -> None:
        self.conns.discard(conn)
        self._targets = None

    def retarget(self) -> None:
        """A connection became a crdtstore client (it gets pushes, not broadcasts)."""
        self._targets = None

    def broadcast(self, frame: bytes, exclude: _Conn | None = None) -> None:
        """Send ``frame`` to every connection but ``exclude`` (and the crdtstore clients, which
        get pushes instead): the WebSocket frame is built once (:func:`_wire`) and written to
        the socket of every connection that can take it at once (:meth:`_Conn.writable`,
        inlined: this loop runs once per update per observer); the others get it through
        :meth:`_Conn.send` (their send queue)."""
        targets = self._targets
        if targets is None:
            targets = self._targets = tuple(c for c in self.conns if not c.journal_client)
        wire: bytes | None = None
        for conn in targets:
            if conn is exclude:
                continue
            ws = conn.ws
            transport = ws.transport
            if (
                conn.close_with is None
                and not conn.queue
                and transport.get_write_buffer_size() < conn.high_water
            ):
                if ws.protocol.state is State.OPEN:  # (see _Conn.write_now)
                    if wire is None:
                        wire = _wire(frame)
                    transport.write(wire)
            else:
                conn.send(frame)

    def update_awareness(self, entries: Iterable[AwarenessEntry]) -> None:
        for entry in entries:
            if entry.removed:
                self.awareness.pop(entry.client_id, None)
                continue
            current = self.awareness.get(entry.client_id)
            if current is None or entry.clock >= current.clock:
                self.awareness[entry.client_id] = entry

    def awareness_frame(self) -> bytes | None:
        if not self.awareness:
            return None
        return encode(Awareness(encode_awareness_update(list(self.awareness.values()))))


class _Conn:
    """One accepted connection: its claims, session and bounded send queue."""

    # a crdtstore client (subprotocol ``crdtstore``): it tails the journal (journal ops) and
    # gets head and lease pushes, never Yjs sync or update frames (see sync._ops_journal)
    journal_client = False

    def __init__(
        self,
        ws: ServerConnection,
        claims: TokenClaims,
        room: _Room,
        session: ServerSession,
        limits: HubLimits,
    ) -> None:
        self.ws = ws
        self.claims = claims
        self.room = room
        self.session = session
        self.limits = limits
        self.queue: deque[bytes] = deque()
        self.queued_bytes = 0
        self.high_water = ws.transport.get_write_buffer_limits()[1]
        self.wakeup = anyio.Event()
        self.close_with: tuple[int, str] | None = None
        self.scope: anyio.CancelScope | None = None
        now = time.monotonic()
        # token bucket of received frames (HubLimits.rate_per_second, rate_burst)
        self.rate = limits.rate_per_second
        self.burst = float(limits.rate_burst)
        self.allowance = self.burst
        self.allowance_at = now
        # awareness timeout: when the last frame arrived; the watchdog waits on `heard` once it
        # removed the connection's awareness clients (client id -> clock it removed)
        self.last_heard = now
        self.heard: anyio.Event | None = None
        self.awareness_expired: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"<connection {self.claims.agent}@{self.room.tenant}/{self.room.run}>"

    def writable(self) -> bool:
        """Whether a frame may be written to the socket at once: the connection is not
        closing, nothing is queued (order), and the socket's write buffer is under its
        high-water mark."""
        return (
            self.close_with is None
            and not self.queue
            and self.ws.transport.get_write_buffer_size() < self.high_water
        )

    def write_now(self, wire: bytes) -> None:
        """Write a whole WebSocket frame (:func:`_wire`) to the socket now, if the connection
        is open (as ``websockets.broadcast`` does, which builds the frame again for every
        connection). Only when :meth:`writable`. The hub sends no fragmented message and
        negotiates no extension (``compression=None``), so the bytes of a frame are the same
        for every connection and nothing of websockets' own can be half-written meanwhile:
        it writes whole frames to the transport, on this thread, as they are sent."""
        ws = self.ws
        if ws.protocol.state is State.OPEN:
            ws.transport.write(wire)

    def send(self, frame: bytes) -> None:
        """Send a frame without blocking: written to the socket at once when
        :meth:`writable` (as ``ws.send`` would, without waking the sender task: the broadcast
        path's main cost), else queued for :meth:`sender`, in order; a full queue closes the
        connection (4408)."""
        if self.close_with is not None:
            return
        if self.writable():
            self.write_now(_wire(frame))
            return
        limits = self.limits
        if (
            len(self.queue) >= limits.max_queue_frames
            or self.queued_bytes + len(frame) > limits.max_queue_bytes
        ):
            log.warning(
                "%r: send queue full (%d frames, %d bytes); disconnecting a slow consumer",
                self,
                len(self.queue),
                self.queued_bytes,
            )
            self.close(CloseCode.SLOW_CONSUMER, "send queue overflow: reading too slowly")
            return
        self.queue.append(frame)
        self.queued_bytes += len(frame)
        self.wakeup.set()

    def close(self, code: int, reason: str) -> None:
        """End the connection with ``code`` (from any task); the first code given wins."""
        if self.close_with is None:
            self.close_with = (int(code), reason[:_MAX_REASON])
        self.queue.clear()
        self.queued_bytes = 0
        if self.scope is not None:
            self.scope.cancel()

    async def sender(self) -> None:
        try:
            while True:
                if not self.queue:
                    self.wakeup = anyio.Event()
                    await self.wakeup.wait()
                    continue
                frame = self.queue.popleft()
                self.queued_bytes -= len(frame)
                await self.ws.send(frame)
        except ConnectionClosed:
            if self.scope is not None:
                self.scope.cancel()

    async def expire(self, exp: int) -> None:
        await anyio.sleep(max(0.0, exp - time.time()))
        log.info("%r: token expired", self)
        self.close(CloseCode.UNAUTHORIZED, "TOKEN_EXPIRED: token expired")

    def heard_from(self) -> bool:
        """Note that a frame arrived; False if it is one too many for the rate limit."""
        now = time.monotonic()
        self.last_heard = now
        if self.heard is not None:
            self.heard.set()
            self.heard = None
        if self.rate is None:
            return True
        allowance = self.allowance + (now - self.allowance_at) * self.rate
        if allowance > self.burst:
            allowance = self.burst
        self.allowance_at = now
        if allowance < 1.0:
            self.allowance = allowance
            return False
        self.allowance = allowance - 1.0
        return True

    def awareness_removal(self) -> bytes | None:
        """Remove this connection's awareness clients from the run's states (those not removed
        already by the awareness timeout); the frame telling the others, if any."""
        entries = [
            AwarenessEntry(client, clock + 1, "null")
            for client, clock in sorted(self.session.awareness_clients.items())
            if self.awareness_expired.get(client) != clock
        ]
        if not entries:
            return None
        for entry in entries:
            self.room.awareness.pop(entry.client_id, None)
            self.awareness_expired[entry.client_id] = entry.clock - 1
        return encode(Awareness(encode_awareness_update(entries)))

    async def awareness_watchdog(self) -> None:
        """Remove the connection's awareness clients for everyone once it has been silent for
        ``awareness_timeout`` seconds (its next announcement brings them back)."""
        timeout = self.limits.awareness_timeout
        while True:
            silent = time.monotonic() - self.last_heard
            if silent < timeout:
                await anyio.sleep(timeout - silent)
                continue
            removal = self.awareness_removal()
            if removal is not None:
                log.info("%r: silent for %.1f s; its awareness states are removed", self, silent)
                self.room.broadcast(removal)
            self.heard = anyio.Event()
            await self.heard.wait()


def _offered_subprotocols(headers: Headers) -> list[str]:
    return [
        p.strip()
        for value in headers.get_all("Sec-WebSocket-Protocol")
        for p in value.split(",")
        if p.strip()
    ]


def _select_subprotocol(
    connection: ServerConnection, offered: Sequence[Subprotocol]
) -> Subprotocol | None:
    if SUBPROTOCOL in offered:
        return Subprotocol(SUBPROTOCOL)
    for p in offered:
        if p.startswith(TOKEN_SUBPROTOCOL_PREFIX):
            return Subprotocol(p)
    return None


class _TenantStore:
    """A tenant's open store in the hub: used by its loaded runs (:meth:`Hub._store`,
    :meth:`Hub._unstore`); closed by its task (:meth:`Hub._run_store`) when ``done`` is set."""

    __slots__ = ("closed", "done", "idle_since", "store", "users")

    def __init__(self, store: Store) -> None:
        self.store = store
        self.users = 0
        self.idle_since: float | None = None
        self.done = anyio.Event()
        self.closed = anyio.Event()


class Hub:
    """The sync hub over the store at ``store_url``, accepting tokens signed with ``secret``.

    Args:
        store_url: the store (``sqlite:///path/store.db``); a store object is opened per
            tenant while runs of it are loaded, and closed ``limits.store_linger`` seconds
            after the last one is unloaded.
        secret: the token signing secret (at least 16 bytes).
        limits: message size, send queue, document size, rate and timeout limits.
        clock: the time tokens are checked against (seconds since the epoch).
        revoked_file: the revocation list (:func:`sync._tokens.read_revoked`), re-read when it
            changes (checked every ``limits.revocation_poll`` seconds); default: next to a
            SQLite store's database (``store.db.revoked``), none for other stores.
        refuse_with: how a bad token is refused: ``"close"`` (default) completes the upgrade
            and closes at once with 4401/4403, ``"http"`` answers the upgrade with 401/403.

    Raises:
        SecretMissing: ``secret`` is too short.
        InvalidValue: ``refuse_with`` is neither ``"close"`` nor ``"http"``.
        RevocationFileError: the revocation file exists but cannot be read.
    """

    def __init__(
        self,
        store_url: str,
        secret: bytes,
        *,
        limits: HubLimits | None = None,
        clock: Callable[[], float] = time.time,
        revoked_file: str | Path | None = None,
        refuse_with: Literal["close", "http"] = "close",
    ) -> None:
        if refuse_with not in ("close", "http"):
            raise InvalidValue(f"refuse_with must be 'close' or 'http', not {refuse_with!r}")
        self.refuse_with = refuse_with
        self.store_url = store_url
        self._secret = secret
        self.limits = limits or HubLimits()
        self._clock = clock
        self.revoked_file = (
            Path(revoked_file) if revoked_file is not None else default_revoked_file(store_url)
        )
        self._revoked_here: set[str] = set()  # by Hub.revoke
        self._revoked_listed: frozenset[str] = frozenset()  # in the revocation file
        self._revoked: frozenset[str] = frozenset()  # the union
        self._revoked_file_stamp: tuple[int, int, int] | None = None
        self._stores: dict[str, _TenantStore] = {}  # open stores, by tenant
        self._store_locks: dict[str, anyio.Lock] = {}
        self._rooms: dict[tuple[str, str], _Room] = {}
        self._auth: weakref.WeakKeyDictionary[ServerConnection, tuple[TokenClaims, str, str]]
        self._auth = weakref.WeakKeyDictionary()
        # connections whose token was refused (refuse_with="close"): (close code, reason)
        self._refused: weakref.WeakKeyDictionary[ServerConnection, tuple[int, str]]
        self._refused = weakref.WeakKeyDictionary()
        self._tg: TaskGroup | None = None
        self._stopping = anyio.Event()
        self._changed = anyio.Event()
        _check_secret(secret)  # fail now, not at the first connection
        self._read_revoked_file(strict=True)  # an unreadable list: fail now, not serve without

    # -- introspection (tests, metrics) -----------------------------------------------------------

    def loaded_runs(self) -> dict[tuple[str, str], int]:
        """The loaded runs: (tenant, run) -> number of connections."""
        return {key: len(room.conns) for key, room in self._rooms.items()}

    def open_tenants(self) -> dict[str, int]:
        """The tenants whose store is open: tenant -> number of its loaded runs (0: the store
        lingers, see :attr:`HubLimits.store_linger`)."""
        return {tenant: held.users for tenant, held in self._stores.items()}

    async def wait_until(self, predicate: Callable[[Hub], bool]) -> None:
        """Return once ``predicate(hub)`` holds; it is re-checked whenever a run is loaded or
        unloaded, or a connection joins or leaves one."""
        while not predicate(self):
            await self._changed.wait()

    def _fire_changed(self) -> None:
        old, self._changed = self._changed, anyio.Event()
        old.set()

    # -- revocation -------------------------------------------------------------------------------

    def revoke(self, jti: str) -> int:
        """Revoke the token with id ``jti``: it is refused at the upgrade from now on, and the
        connections using it are closed with 4403 (``TOKEN_REVOKED``). It is added to the
        revocation file too, if the hub has one (so that other hubs and a restart know).
        Returns the number of connections closed.

        Raises:
            InvalidValue: ``jti`` is not a token id.
            RevocationFileError: the revocation file cannot be written (the token is revoked
                in this hub all the same).
        """
        check_jti(jti)
        self._revoked_here.add(jti)
        closed = self._set_revoked(self._revoked_listed)
        if self.revoked_file is not None:
            append_revoked(self.revoked_file, jti, f"revoked by the hub at {int(time.time())}")
        return closed

    @property
    def revoked(self) -> frozenset[str]:
        """The token ids the hub refuses."""
        return self._revoked

    def _set_revoked(self, listed: frozenset[str]) -> int:
        self._revoked_listed = listed
        before, self._revoked = self._revoked, listed | self._revoked_here
        closed = 0
        if self._revoked - before:
            for room in list(self._rooms.values()):
                for conn in list(room.conns):
                    if conn.claims.jti is not None and conn.claims.jti in self._revoked:
                        log.warning("%r: token %s revoked; closing", conn, conn.claims.jti)
                        conn.close(CloseCode.FORBIDDEN, "TOKEN_REVOKED: token revoked")
                        closed += 1
        return closed

    def _read_revoked_file(self, *, strict: bool = False) -> None:
        """Re-read the revocation file if it changed (size, mtime or inode) since last time.
        If it cannot be read, the ids read before stay revoked (``strict``: raise
        :class:`RevocationFileError` instead: the hub does not start)."""
        if self.revoked_file is None:
            return
        try:
            try:
                st = os.stat(self.revoked_file)
                stamp: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
            except FileNotFoundError:
                stamp = None
            except OSError as exc:
                raise RevocationFileError(self.revoked_file, exc) from None
            if stamp == self._revoked_file_stamp:
                return
            listed = read_revoked(self.revoked_file)
        except RevocationFileError as exc:
            if strict:
                raise
            log.error("%s; the %d ids read before stay revoked", exc, len(self._revoked_listed))
            return
        self._revoked_file_stamp = stamp
        if listed != self._revoked_listed:
            log.info("revocation file %s: %d token ids", self.revoked_file, len(listed))
        self._set_revoked(listed)

    async def _watch_revocations(self) -> None:
        while True:
            await anyio.sleep(self.limits.revocation_poll)
            self._read_revoked_file()

    # -- serving ----------------------------------------------------------------------------------

    async def serve(
        self,
        host: str = "127.0.0.1",
        port: int = 8765,
        *,
        task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until cancelled; ``task_status.started`` gets the port (useful with port 0).

        On the way out, connections are closed with 1001 (going away), every loaded run is
        flushed to the journal and closed, then the stores.
        """
        async with anyio.create_task_group() as tg:
            self._tg = tg
            server: Server | None = None
            try:
                # fail at start on a bad store URL; not kept open: every store object has a
                # cross-process notifier, which every commit on the file tells (a datagram
                # and a wake-up of this loop per commit, for a tenant no client may use)
                async with open_store(self.store_url, tenant="default"):
                    pass
                self._read_revoked_file()
                tg.start_soon(self._watch_revocations)
                server = await serve(
                    self._handler,
                    host,
                    port,
                    process_request=self._process_request,
                    select_subprotocol=_select_subprotocol,
                    compression=None,
                    max_size=2 * self.limits.max_message_size,
                    max_queue=64,
                    close_timeout=self.limits.close_timeout,
                    ping_interval=self.limits.ping_interval,
                    logger=logging.getLogger("sync.hub.websockets"),
                )
                bound = server.sockets[0].getsockname()[1]
                log.info("hub serving %s on %s:%d", self.store_url, host, bound)
                task_status.started(bound)
                await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
                    if server is not None:
                        server.close()
                        await server.wait_closed()
                    self._stopping.set()
                    for held in self._stores.values():  # (unused but lingering ones)
                        held.done.set()

    async def _store(self, tenant: str) -> Store:
        """The tenant's store, opened if need be, and counted as used until
        :meth:`_unstore` (a loaded run holds it)."""
        lock = self._store_locks.setdefault(tenant, anyio.Lock())
        async with lock:
            held = self._stores.get(tenant)
            if held is None:
                assert self._tg is not None
                held = await self._tg.start(self._run_store, tenant)
                self._stores[tenant] = held
            held.users += 1
            held.idle_since = None
            return held.store

    def _unstore(self, tenant: str) -> None:
        """A run of the tenant was unloaded (or failed to load): when no run uses the store
        any more, close it after ``limits.store_linger`` seconds (unless a run of the tenant
        is loaded meanwhile)."""
        held = self._stores[tenant]
        held.users -= 1
        if held.users == 0:
            held.idle_since = since = time.monotonic()
            assert self._tg is not None
            self._tg.start_soon(self._close_store, tenant, held, since)

    async def _close_store(self, tenant: str, held: _TenantStore, since: float) -> None:
        if self.limits.store_linger > 0 and not self._stopping.is_set():
            await anyio.sleep(self.limits.store_linger)
        lock = self._store_locks.setdefault(tenant, anyio.Lock())
        async with lock:
            # still unused since then (a run loaded meanwhile resets idle_since)
            if self._stores.get(tenant) is held and held.idle_since == since:
                del self._stores[tenant]
                held.done.set()
                await held.closed.wait()
                if not lock.statistics().tasks_waiting:
                    del self._store_locks[tenant]  # (a waiter would reopen the store with it)
                log.info("closed the store of tenant %s", tenant)
                self._fire_changed()

    async def _run_store(self, tenant: str, *, task_status: TaskStatus[_TenantStore]) -> None:
        # Shielded: a store closes after the connections (and the records on it) are gone.
        with anyio.CancelScope(shield=True):
            held: _TenantStore | None = None
            try:
                async with open_store(self.store_url, tenant=tenant) as store:
                    held = _TenantStore(store)
                    task_status.started(held)
                    if self._stopping.is_set():
                        held.done.set()
                    await held.done.wait()
            finally:
                if held is not None:
                    held.closed.set()

    # -- the HTTP upgrade -------------------------------------------------------------------------

    def _process_request(
        self, connection: ServerConnection, request: HttpRequest
    ) -> HttpResponse | None:
        url = urlsplit(request.path)
        parts = url.path.split("/")
        if len(parts) != 3 or not parts[1] or not parts[2]:
            return connection.respond(404, "expected a path /<tenant>/<run>\n")
        tenant, run = unquote(parts[1]), unquote(parts[2])
        try:
            check_name("tenant", tenant)
            check_name("run", run)
        except InvalidName as exc:
            return connection.respond(400, f"{exc.code}: {exc}\n")
        tokens = parse_qs(url.query).get("token")
        token = tokens[0] if tokens else None
        if token is None:
            for p in _offered_subprotocols(request.headers):
                if p.startswith(TOKEN_SUBPROTOCOL_PREFIX):
                    token = p[len(TOKEN_SUBPROTOCOL_PREFIX) :]
                    break
        try:
            claims = verify(
                self._secret, token, self._clock(), tenant=tenant, run=run, revoked=self._revoked
            )
        except TokenError as exc:
            log.info("refused a connection to %s/%s: %s (%s)", tenant, run, exc.code, exc.reason)
            if self.refuse_with == "http":
                return connection.respond(exc.http_status, f"{exc.code}: {exc.reason}\n")
            # upgrade, then close with the 44xx code (the handler sends nothing before it)
            self._refused[connection] = (exc.close_code, f"{exc.code}: {exc.reason}"[:_MAX_REASON])
            return None
        self._auth[connection] = (claims, tenant, run)
        return None

    # -- rooms ------------------------------------------------------------------------------------

    async def _acquire(self, tenant: str, run: str, claims: TokenClaims) -> _Room:
        key = (tenant, run)
        while True:
            room = self._rooms.get(key)
            if room is None:
                room = self._rooms[key] = _Room(tenant, run)
                stored = False
                try:
                    store = await self._store(tenant)
                    stored = True
                    rec = _HubRecord(store, run, HUB_AGENT, "system", create=not claims.read_only)
                    await rec.start()
                    rec.bind_loop(self.limits.journal_window)
                    size = len(rec.replica.doc.get_update())
                    limit = self.limits.max_document_bytes
                    if limit is not None and size > limit:
                        with anyio.CancelScope(shield=True):
                            await rec.aclose()
                        raise PayloadTooLarge("document", size, limit)
                except BaseException:
                    room.failed = True
                    del self._rooms[key]
                    room.ready.set()
                    if stored:
                        self._unstore(tenant)
                    raise
                room.attach(rec, size)
                room.users += 1
                room.ready.set()
                log.info("loaded run %s/%s", tenant, run)
                self._fire_changed()
                return room
            await room.ready.wait()
            if room.failed:
                continue
            if room.closing:
                await room.closed.wait()
                continue
            room.users += 1
            return room

    async def _release(self, room: _Room) -> None:
        room.users -= 1
        if room.users > 0:
            self._fire_changed()
            return
        room.closing = True
        try:
            room.detach()
            if room.rec is not None:
                await room.rec.aclose()
        finally:
            if self._rooms.get((room.tenant, room.run)) is room:
                del self._rooms[(room.tenant, room.run)]
            room.closed.set()
            log.info("unloaded run %s/%s", room.tenant, room.run)
            self._fire_changed()
            self._unstore(room.tenant)

    # -- connections ------------------------------------------------------------------------------

    async def _handler(self, ws: ServerConnection) -> None:
        refused = self._refused.pop(ws, None)
        if refused is not None:  # a bad token (refuse_with="close"): no document byte
            await ws.close(*refused)
            return
        auth = self._auth.pop(ws, None)
        if auth is None:  # process_request refuses those; never serve without a token
            await ws.close(CloseCode.UNAUTHORIZED, "TOKEN_INVALID: no token")
            return
        claims, tenant, run = auth
        try:
            room = await self._acquire(tenant, run, claims)
        except UnknownRun as exc:
            await ws.close(CloseCode.UNKNOWN_RUN, f"{exc.code}: {exc}"[:_MAX_REASON])
            return
        except RunClosed as exc:
            await ws.close(CloseCode.RUN_CLOSED, f"{exc.code}: {exc}"[:_MAX_REASON])
            return
        except PayloadTooLarge as exc:
            log.warning("refused to load run %s/%s: %s", tenant, run, exc)
            await ws.close(CloseCode.DOCUMENT_TOO_LARGE, f"{exc.code}: {exc}"[:_MAX_REASON])
            return
        except CrdtStoreError as exc:
            log.error("cannot load run %s/%s: %s", tenant, run, exc)
            await ws.close(CloseCode.INTERNAL_ERROR, exc.code)
            return
        assert room.rec is not None
        session = ServerSession(
            _CheckingDocument(room, self.limits.max_document_bytes),
            read_only=claims.read_only,
            max_message_size=self.limits.max_message_size,
        )
        conn = _Conn(ws, claims, room, session, self.limits)
        try:
            async with anyio.create_task_group() as tg:
                conn.scope = tg.cancel_scope
                tg.start_soon(conn.sender)
                tg.start_soon(conn.expire, claims.exp)
                tg.start_soon(conn.awareness_watchdog)
                room.join(conn)
                self._fire_changed()
                if claims.jti is not None and claims.jti in self._revoked:  # since the upgrade
                    log.warning("%r: token %s revoked; closing", conn, claims.jti)
                    conn.close(CloseCode.FORBIDDEN, "TOKEN_REVOKED: token revoked")
                    return
                log.info("%r: connected (%s)", conn, claims.mode)
                if ws.subprotocol == SUBPROTOCOL:
                    conn.journal_client = True
                    room.retarget()
                    room.rec.readers += 1
                    room.rec._urge()  # it reads the journal: what is deferred is due now
                    tg.start_soon(push_heads, conn)
                    tg.start_soon(push_leases, conn)
                else:
                    for frame in session.start():
                        conn.send(frame)
                    states = room.awareness_frame()
                    if states is not None:
                        conn.send(states)
                await self._receive(conn)
                tg.cancel_scope.cancel()
        finally:
            room.leave(conn)
            if conn.journal_client:
                room.rec.readers -= 1
            removal = conn.awareness_removal()
            if removal is not None:
                room.broadcast(removal)
            with anyio.CancelScope(shield=True):
                await self._release(room)
                if conn.close_with is not None:
                    code, reason = conn.close_with
                    log.info("%r: closing with %d (%s)", conn, code, reason)
                    await ws.close(code, reason)

    async def _receive(self, conn: _Conn) -> None:
        ws, session, room = conn.ws, conn.session, conn.room
        while conn.close_with is None:
            try:
                frame = await ws.recv()
            except ConnectionClosed:
                return
            if not conn.heard_from():
                log.warning(
                    "%r: more than %d frames at once or %g per second; closing with %d",
                    conn,
                    self.limits.rate_burst,
                    self.limits.rate_per_second,
                    CloseCode.TOO_MANY_REQUESTS,
                )
                conn.close(CloseCode.TOO_MANY_REQUESTS, "RATE_LIMITED: too many frames per second")
                return
            if isinstance(frame, str):
                log.warning("%r: a text frame; closing with %d", conn, CloseCode.MALFORMED)
                conn.close(CloseCode.MALFORMED, "frames are binary, not text")
                return
            try:
                received = session.receive(frame)
            except ProtocolError as exc:
                log.warning("%r: %s; closing with %d", conn, exc.reason, exc.close_code)
                conn.close(exc.close_code, exc.reason)
                return
            for reply in received.reply_frames():
                conn.send(reply)
            message = received.message
            if received.applied is not None:
                # an update frame is relayed as received (it is what encode(Update(..)) gives)
                await self._apply(
                    conn, received.applied, frame if type(message) is Update else None
                )
            elif received.refused is not None:
                log.info("%r: refused a write (read-only)", conn)
            elif received.awareness:
                room.update_awareness(received.awareness)
                room.broadcast(frame)
            elif isinstance(message, QueryAwareness):
                states = room.awareness_frame()
                if states is not None:
                    conn.send(states)
            elif isinstance(message, Request):
                await self._request(conn, message)

    async def _apply(self, conn: _Conn, update: bytes, frame: bytes | None = None) -> None:
        """Apply and journal a connection's update as its token's agent, then broadcast it (as
        ``frame``, the update's :class:`Update` frame, when given)."""
        document = conn.session.document
        assert isinstance(document, _CheckingDocument)
        reservation, document.reservation = document.reservation, 0
        if update in _EMPTY_UPDATES:
            conn.room.release(reservation)
            return
        rec = conn.room.rec
        assert rec is not None
        token = _CURRENT.set(conn)
        try:
            await rec._apply_checked(update)  # (the session's document checked the bytes)
        except (PolicyViolation, BudgetExceeded) as exc:
            conn.send(encode(PermissionDenied(f"{exc.code}: {exc}")))
            conn.close(CloseCode.INVALID_UPDATE, f"{exc.code}: {exc}")
            return
        except PayloadTooLarge as exc:
            conn.close(CloseCode.MESSAGE_TOO_LARGE, f"{exc.code}: {exc}")
            return
        except InvalidUpdate as exc:
            conn.close(CloseCode.INVALID_UPDATE, f"{exc.code}: {exc}")
            return
        except RunClosed as exc:
            conn.close(CloseCode.RUN_CLOSED, f"{exc.code}: {exc}")
            return
        except CrdtStoreError as exc:
            log.error("%r: applying an update failed: %s", conn, exc)
            conn.close(CloseCode.INTERNAL_ERROR, exc.code)
            return
        finally:
            _CURRENT.reset(token)
            conn.room.release(reservation)
        conn.room.broadcast(encode(Update(update)) if frame is None else frame, exclude=conn)

    async def _request(self, conn: _Conn, request: Request) -> None:
        rec = conn.room.rec
        assert rec is not None
        ctx = OpContext(
            hub=self,
            conn=conn,
            claims=conn.claims,
            tenant=conn.room.tenant,
            run=conn.room.run,
            rec=rec,
            store=rec._store,
        )
        conn.send(conn.session.respond(await dispatch(ctx, request)))
