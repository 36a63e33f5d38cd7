"""The limits of the hub (:class:`HubLimits`): message, queue and document sizes, rates,
timeouts, and the journal window of its group commit."""

from __future__ import annotations

import math
from dataclasses import dataclass

from crdtstore import InvalidValue

from ._messages import DEFAULT_MAX_MESSAGE_SIZE

__all__ = ["HubLimits"]


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
        ping_timeout: seconds a ping may wait for its pong before the connection is closed
            as dead (1011; a cut network shows up this way; None: never).
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
        sweep_interval: seconds between retention sweeps (runs whose ``set_retention``
            deadline passed are deleted and logged, see :mod:`sync._hub_sweep`). None: the
            hub does not sweep.

    Raises:
        InvalidValue: a limit that is not > 0 (``journal_window``, ``store_linger``: < 0 or
            not finite).
    """

    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_queue_frames: int = 4096
    max_queue_bytes: int = 64 * 1024 * 1024
    close_timeout: float = 5.0
    ping_interval: float | None = 20.0
    ping_timeout: float | None = 20.0
    awareness_timeout: float = 30.0
    max_document_bytes: int | None = 256 * 1024 * 1024
    rate_per_second: float | None = 2000.0
    rate_burst: int = 10_000
    revocation_poll: float = 0.5
    journal_window: float = 0.02
    store_linger: float = 5.0
    sweep_interval: float | None = 60.0

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
            "ping_interval": self.ping_interval,
            "ping_timeout": self.ping_timeout,
            "max_document_bytes": self.max_document_bytes,
            "rate_per_second": self.rate_per_second,
            "rate_burst": self.rate_burst,
            "revocation_poll": self.revocation_poll,
            "sweep_interval": self.sweep_interval,
        }
        for name, value in positive.items():
            if value is not None and not value > 0:
                raise InvalidValue(f"HubLimits.{name} must be > 0, not {value!r}")
        if self.sweep_interval is not None and not self.sweep_interval < math.inf:
            raise InvalidValue("HubLimits.sweep_interval must be finite (None: no sweeps)")
