"""The runs a hub has loaded (:class:`_Room`: a run's record and its connections) and the
loading and unloading of runs and of the tenants' stores (:class:`_RunLoader`).

**Document size.** A run whose document (its v1 encoding) is over
``HubLimits.max_document_bytes`` is not loaded (4414), and an update that would take it past
the limit is refused before it is applied or journaled (4414; an entry given to the journal
ops is answered with the error ``PAYLOAD_TOO_LARGE`` instead). The size is measured once when
the run is loaded (one full encoding, too costly per update), then kept as a bound by adding the
length of each transaction's update (+64 bytes) and reserving room for updates being
applied; it is measured again only when that bound would pass the limit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

import anyio
from anyio.abc import TaskGroup, TaskStatus
from websockets.protocol import State

from crdtstore import PayloadTooLarge, Record, Store, open_store
from crdtstore.record import LoopCommit

from ._document import ReplicaDocument
from ._hub_conn import _CURRENT, _wire
from ._hub_limits import HubLimits
from ._messages import Awareness, AwarenessEntry, Update, encode, encode_awareness_update
from ._tokens import TokenClaims

if TYPE_CHECKING:
    from ._hub_conn import _Conn

__all__ = ["HUB_AGENT", "_CheckingDocument", "_Room", "_RunLoader", "_TenantStore"]

log = logging.getLogger("sync.hub")

HUB_AGENT: Final = "hub"
_EMPTY_UPDATES: Final = (b"\x00\x00",)
_GROWTH_SLACK: Final = 64  # bytes counted per update on top of its length (see _Room.size)


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


class _Room:
    """A loaded run: its record and its connections."""

    def __init__(self, tenant: str, run: str) -> None:
        self.tenant = tenant
        self.run = run
        self.rec: Record | None = None
        self.commit: LoopCommit | None = None  # the record's group commit on the loop
        self.conns: set[_Conn] = set()  # (changed through join and leave)
        # the conns broadcast goes to, each with its socket's transport and protocol
        self._targets: tuple[tuple[_Conn, Any, Any], ...] | None = None
        self.awareness: dict[int, AwarenessEntry] = {}
        self.users = 0
        self.ready = anyio.Event()
        self.failed = False
        self.closing = False
        self.closed = anyio.Event()
        self._subscription: Any = None
        self._unsubscribe: Any = None  # (ends the subscription, see attach)
        # Size of the document's v1 encoding: exact when measured, then a bound kept by adding
        # the length of every transaction's update since plus _GROWTH_SLACK (an applied update
        # grew the encoding by at most its length + 37 bytes over 12,000 random map/text
        # edits); `reserved`: the bytes of updates checked against the limit, not yet applied.
        self.size = 0
        self.reserved = 0

    def attach(self, rec: Record, size: int) -> None:
        self.rec = rec
        self.size = size
        replica = rec.replica
        listen = getattr(replica, "listen", None)
        if listen is not None:
            # (the replica's capture encodes each transaction's update once, for both of us)
            self._subscription = listen(self._on_update)
            self._unsubscribe = replica.unlisten
        else:  # a document of its own (tests)
            self._subscription = replica.doc.observe(lambda event: self._on_update(event.update))
            self._unsubscribe = replica.doc.unobserve

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
            self._unsubscribe(self._subscription)
            self._subscription = None

    def _on_update(self, update: bytes) -> None:
        # A connection's update is broadcast by its own task (as received, to the others);
        # what else changes the document comes from the journal (other processes' writes).
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
            targets = self._targets = tuple(
                (c, c.ws.transport, c.ws.protocol) for c in self.conns if not c.journal_client
            )
        wire: bytes | None = None
        for conn, transport, protocol in targets:
            if conn is exclude:
                continue
            if (
                conn.close_with is None
                and not conn.queue
                and transport.get_write_buffer_size() < conn.high_water
            ):
                if protocol.state is State.OPEN:  # (see _Conn.write_now)
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


class _RunLoader:
    """The loaded runs of a :class:`~sync.Hub` and the tenants' stores they are on: a run is
    loaded by its first connection (:meth:`_acquire`) and unloaded after its last
    (:meth:`_release`); a tenant's store is opened for its first loaded run and closed
    ``limits.store_linger`` seconds after its last."""

    store_url: str
    limits: HubLimits
    _tg: TaskGroup | None
    _stopping: anyio.Event

    def _init_runs(self) -> None:
        self._stores: dict[str, _TenantStore] = {}  # open stores, by tenant
        self._tenants_seen: set[str] = {"default"}  # what the retention sweep visits
        self._store_locks: dict[str, anyio.Lock] = {}
        self._rooms: dict[tuple[str, str], _Room] = {}
        self._changed = anyio.Event()

    # -- changes (Hub.wait_until) ------------------------------------------------------------

    def _fire_changed(self) -> None:
        old, self._changed = self._changed, anyio.Event()
        old.set()

    # -- stores --------------------------------------------------------------------------------

    async def _store(self, tenant: str) -> Store:
        """The tenant's store, opened if need be, and counted as used until
        :meth:`_unstore` (a loaded run holds it)."""
        self._tenants_seen.add(tenant)
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

    # -- rooms ------------------------------------------------------------------------------------

    async def _acquire(
        self, tenant: str, run: str, claims: TokenClaims, *, create: bool = True
    ) -> _Room:
        key = (tenant, run)
        while True:
            room = self._rooms.get(key)
            if room is None:
                room = self._rooms[key] = _Room(tenant, run)
                stored = False
                try:
                    store = await self._store(tenant)
                    stored = True
                    rec = Record(
                        store, run, HUB_AGENT, "system", create=create and not claims.read_only
                    )
                    await rec.start()
                    room.commit = rec.commit_on_loop(self.limits.journal_window)
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
