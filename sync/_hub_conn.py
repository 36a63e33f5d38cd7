"""One accepted connection of the hub (:class:`_Conn`): its claims and session, its bounded
send queue, its token bucket and its awareness timeout.

Frames to a connection are written to its socket at once when it can take them, else go
through a bounded send queue; a client that reads too slowly to keep it under its bound is
disconnected (4408) rather than growing the hub's memory. A connection sending frames faster
than its token bucket allows (``rate_per_second``, ``rate_burst``) is closed (4429); one whose
token expires is closed (4401). A connection that sent no frame for
``HubLimits.awareness_timeout`` (30 s) has its awareness clients removed for everyone (it
stays connected; its next announcement brings them back).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from contextvars import ContextVar
from typing import TYPE_CHECKING, Final

import anyio
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.protocol import State

from crdtstore import Writer

from ._errors import CloseCode
from ._hub_limits import HubLimits
from ._messages import Awareness, AwarenessEntry, encode, encode_awareness_update
from ._metrics import HubMetrics, metrics_of
from ._session import ServerSession
from ._tokens import TokenClaims

if TYPE_CHECKING:
    from ._hub_runs import _Room

__all__ = ["_CURRENT", "_MAX_REASON", "_Conn", "_wire"]

log = logging.getLogger("sync.hub")

_MAX_REASON: Final = 120  # a close reason is at most 123 bytes of UTF-8

# The connection whose frame the current task is applying to the run's record: the room
# broadcasts what changes the document outside of one (other processes' writes, read from
# the journal); a connection's own update is broadcast by its task, to the others.
_CURRENT: ContextVar[_Conn | None] = ContextVar("sync_hub_connection", default=None)


def _wire(frame: bytes) -> bytes:
    """The WebSocket binary frame (server side: unmasked, no extension) carrying ``frame``."""
    return Frame(Opcode.BINARY, frame).serialize(mask=False, extensions=())


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
        metrics: HubMetrics | None = None,
    ) -> None:
        self.metrics = metrics if metrics is not None else metrics_of(None)
        self.ws = ws
        self.claims = claims
        # whom its writes are journaled as: the token's agent and source, never the client's say
        self.writer = Writer(claims.agent, claims.source)
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
            self.metrics.queue_overflow(len(self.queue) + 1)
            self.close(CloseCode.SLOW_CONSUMER, "send queue overflow: reading too slowly")
            return
        self.queue.append(frame)
        self.queued_bytes += len(frame)
        self.wakeup.set()

    def close(self, code: int, reason: str) -> None:
        """End the connection with ``code`` (from any task); the first code given wins."""
        if self.close_with is None:
            self.close_with = (int(code), reason[:_MAX_REASON])
            self.metrics.refused(code)
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
