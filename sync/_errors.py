"""Errors of the sync protocol, and the WebSocket close codes the hub and provider use.

They hang under crdtstore's error tree (``crdtstore`` never imports ``sync``; the other way is
fine)::

    CrdtStoreError
    └── ProtocolError (ValueError)          PROTOCOL_ERROR
        └── MessageTooLarge                 MESSAGE_TOO_LARGE

A :class:`ProtocolError` means "close this connection with ``close_code``": the frame was not
applied, and the session and the document are as they were before it.
"""

from __future__ import annotations

from enum import IntEnum

from crdtstore import CrdtStoreError

__all__ = ["CloseCode", "MessageTooLarge", "ProtocolError"]


class CloseCode(IntEnum):
    """WebSocket close codes of the hub.

    The 44xx codes mean "do not retry as is": the request itself is wrong (bad frame, bad
    token, too large, too fast). Mnemonic: 4400 + the closest HTTP status. The standard 1xxx
    codes mean the connection may be retried.

    y-websocket's client 3.1.0 treats a close code in 4400-4499 as final by itself: it stops
    reconnecting and emits ``connection-close`` then ``status: disconnected`` (and ``closed``).
    Earlier versions (2.x, 3.0.0) reconnect after *any* close: there a JavaScript application
    listens to ``connection-close`` and calls ``provider.disconnect()`` for 4400 <= code < 4500.
    Every version retries an HTTP refusal of the upgrade forever (a browser sees close 1006),
    which is why the hub refuses a bad token with 4401/4403 after the upgrade by default.
    """

    NORMAL = 1000
    """The connection is done (client left, run document unloaded)."""
    GOING_AWAY = 1001
    """The hub is shutting down or restarting: reconnect with backoff."""
    INTERNAL_ERROR = 1011
    """The hub failed (backend error): reconnect with backoff."""

    MALFORMED = 4400
    """A frame could not be decoded, or a message was not expected from this peer."""
    UNAUTHORIZED = 4401
    """No token, a forged token, or an expired token."""
    FORBIDDEN = 4403
    """The token is valid but not for this tenant or run, or it was revoked."""
    UNKNOWN_RUN = 4404
    """The run does not exist (and the token does not allow creating it)."""
    SLOW_CONSUMER = 4408
    """The connection's send queue overflowed: the peer reads too slowly."""
    RUN_CLOSED = 4410
    """The run was closed, archived or deleted."""
    MESSAGE_TOO_LARGE = 4413
    """A frame was larger than the hub's maximum message size."""
    DOCUMENT_TOO_LARGE = 4414
    """Applying the update would take the run's document past its size limit."""
    INVALID_UPDATE = 4422
    """The frame was well formed but its update bytes were refused by the document."""
    TOO_MANY_REQUESTS = 4429
    """Too many requests in flight or per second."""


class ProtocolError(CrdtStoreError, ValueError):
    """A frame broke the protocol: malformed, truncated, too large or unexpected.

    Nothing of the frame was applied. ``close_code`` is the WebSocket close code to end the
    connection with.
    """

    code = "PROTOCOL_ERROR"

    def __init__(self, reason: str, close_code: int = CloseCode.MALFORMED) -> None:
        self.reason = reason
        self.close_code = int(close_code)
        super().__init__(f"protocol error: {reason}")


class MessageTooLarge(ProtocolError):
    """A frame (or a length inside it) is larger than the configured limit."""

    code = "MESSAGE_TOO_LARGE"

    def __init__(self, what: str, size: int, limit: int) -> None:
        self.what = what
        self.size = size
        self.limit = limit
        super().__init__(
            f"{what} of {size} bytes exceeds the limit of {limit} bytes",
            CloseCode.MESSAGE_TOO_LARGE,
        )
