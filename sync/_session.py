"""Sync sessions: the two ends of one connection as state machines with no I/O.

A driver (the hub's connection loop, the client provider) moves bytes; a session says what
they mean (a driver loop: :class:`ServerSession`). Without I/O, the protocol's rules are
tested by hypothesis without a server, and the hub and the client share them.

``receive`` either succeeds, or raises :class:`~sync.ProtocolError` having changed nothing:
neither the session nor the document. Messages are checked fully before the document is
touched, and the document refuses bad update bytes without applying them (see
:class:`~sync.Document`).

Read-only server sessions do not send sync step 1 (which would invite the peer's step 2),
and answer any step 2 or update with y-protocols' permission-denied message, applying
nothing; sync step 1, awareness and requests stay allowed (which requests a read-only
connection may make is the hub's decision).
"""

from __future__ import annotations

from dataclasses import dataclass

from crdtstore import InvalidUpdate, PayloadTooLarge

from ._document import Document
from ._errors import CloseCode, ProtocolError
from ._messages import (
    DEFAULT_MAX_MESSAGE_SIZE,
    Awareness,
    AwarenessEntry,
    Message,
    PermissionDenied,
    Push,
    QueryAwareness,
    Request,
    Response,
    SyncStep1,
    SyncStep2,
    Update,
    decode,
    decode_awareness_update,
    decode_state_vector,
    encode,
    encode_awareness_update,
)

__all__ = ["ClientSession", "Received", "ServerSession"]

DEFAULT_MAX_PENDING_REQUESTS = 64
DEFAULT_MAX_AWARENESS_CLIENTS = 1024
READ_ONLY_REASON = "read-only connection: document updates are refused"


@dataclass(frozen=True, slots=True)
class Received:
    """What one received frame meant.

    Attributes:
        message: the decoded message.
        replies: messages to send back on this connection, in order.
        applied: update bytes now applied to the document (journal them; broadcast them as an
            :class:`Update` to the other connections).
        refused: why a write was refused and not applied (read-only); the permission-denied
            reply is in ``replies``.
        synced: this frame completed the initial sync (the client received sync step 2).
        awareness: the entries of an awareness message (to relay ``message`` as is).
    """

    message: Message
    replies: tuple[Message, ...] = ()
    applied: bytes | None = None
    refused: str | None = None
    synced: bool = False
    awareness: tuple[AwarenessEntry, ...] = ()

    def reply_frames(self) -> list[bytes]:
        """``replies``, encoded."""
        return [encode(m) for m in self.replies]


def _apply(document: Document, update: bytes) -> None:
    try:
        document.apply_update(update)
    except (PayloadTooLarge, InvalidUpdate, ValueError) as exc:
        raise _refusal(exc) from None


def _refusal(exc: Exception) -> ProtocolError:
    """The :class:`ProtocolError` of a document's refusal of an update."""
    if isinstance(exc, PayloadTooLarge):
        code = (
            CloseCode.DOCUMENT_TOO_LARGE if exc.what == "document" else CloseCode.MESSAGE_TOO_LARGE
        )
        return ProtocolError(str(exc), code)
    return ProtocolError(f"update refused: {exc}", CloseCode.INVALID_UPDATE)


def _step2_for(document: Document, state_vector: bytes) -> SyncStep2:
    # parse the state vector ourselves first: the document's parser is not ours to trust
    decode_state_vector(state_vector)
    try:
        return SyncStep2(document.get_update(state_vector))
    except (InvalidUpdate, ValueError) as exc:
        raise ProtocolError(f"state vector refused: {exc}") from None


def _awareness(message: Awareness, max_clients: int) -> tuple[AwarenessEntry, ...]:
    entries = decode_awareness_update(message.payload)
    if len(entries) > max_clients:
        raise ProtocolError(
            f"awareness update of {len(entries)} clients (limit {max_clients})",
            CloseCode.TOO_MANY_REQUESTS,
        )
    return entries


class _Session:
    def __init__(
        self,
        document: Document,
        *,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS,
        max_awareness_clients: int = DEFAULT_MAX_AWARENESS_CLIENTS,
    ) -> None:
        self.document = document
        self.max_message_size = max_message_size
        self.max_pending_requests = max_pending_requests
        self.max_awareness_clients = max_awareness_clients
        self.frames_received = 0
        self.updates_applied = 0
        self._pending: dict[int | str, Request] = {}

    @property
    def pending(self) -> frozenset[int | str]:
        """Ids of the requests not answered yet."""
        return frozenset(self._pending)

    def _decode(self, frame: bytes) -> Message:
        return decode(frame, max_size=self.max_message_size)

    def update_frame(self, update: bytes) -> bytes:
        """The frame carrying a local ``update`` to the peer."""
        return encode(Update(update))


class ServerSession(_Session):
    """The hub's end of one connection.

    A driver moves the bytes; the session says what they mean::

        session = ServerSession(document, read_only=token.ro)
        for frame in session.start():            # the hub's sync step 1
            await ws.send(frame)
        async for frame in ws:
            try:
                received = session.receive(frame)
            except ProtocolError as exc:
                await ws.close(exc.close_code, exc.reason)
                break
            for reply in received.reply_frames():
                await ws.send(reply)
            if received.applied is not None:
                ...  # journal it, broadcast encode(Update(received.applied)) to the others
            if isinstance(received.message, Request):
                ...  # perform it, then await ws.send(session.respond(response))

    Args:
        document: the run's document.
        read_only: refuse the peer's sync step 2 and updates.
        max_message_size: frames longer than this raise :class:`~sync.MessageTooLarge`.
        max_pending_requests: requests in flight beyond this raise a
            :class:`~sync.ProtocolError` (``TOO_MANY_REQUESTS``).
        max_awareness_clients: the most awareness clients one update may carry.
    """

    def __init__(
        self,
        document: Document,
        *,
        read_only: bool = False,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS,
        max_awareness_clients: int = DEFAULT_MAX_AWARENESS_CLIENTS,
    ) -> None:
        super().__init__(
            document,
            max_message_size=max_message_size,
            max_pending_requests=max_pending_requests,
            max_awareness_clients=max_awareness_clients,
        )
        self.read_only = read_only
        self.refused = 0
        # awareness client id -> clock, of the clients this connection announced: the hub
        # removes them for everyone when the connection ends (as y-websocket's server does)
        self._awareness_clients: dict[int, int] = {}

    @property
    def awareness_clients(self) -> dict[int, int]:
        """Awareness clients announced on this connection (client id -> last clock)."""
        return dict(self._awareness_clients)

    def start(self) -> list[bytes]:
        """Frames to send when the connection opens: sync step 1, unless read-only."""
        if self.read_only:
            return []
        return [encode(SyncStep1(self.document.get_state()))]

    def receive(self, frame: bytes) -> Received:
        """Interpret one frame from the client.

        Raises:
            ProtocolError: the frame was refused; nothing changed. Close with ``close_code``.
        """
        message = self._decode(frame)
        out: Received
        if isinstance(message, (Update, SyncStep2)):
            if self.read_only:
                self.refused += 1
                out = Received(
                    message, (PermissionDenied(READ_ONLY_REASON),), refused=READ_ONLY_REASON
                )
            else:
                _apply(self.document, message.update)
                self.updates_applied += 1
                out = Received(message, applied=message.update)
        elif isinstance(message, SyncStep1):
            out = Received(message, (_step2_for(self.document, message.state_vector),))
        elif isinstance(message, Awareness):
            entries = _awareness(message, self.max_awareness_clients)
            self._track_awareness(entries)
            out = Received(message, awareness=entries)
        elif isinstance(message, QueryAwareness):
            out = Received(message)  # the hub holds the awareness states and answers
        elif isinstance(message, Request):
            if message.id in self._pending:
                raise ProtocolError(f"request id {message.id!r} is already in flight")
            if len(self._pending) >= self.max_pending_requests:
                raise ProtocolError(
                    f"more than {self.max_pending_requests} requests in flight",
                    CloseCode.TOO_MANY_REQUESTS,
                )
            self._pending[message.id] = message
            out = Received(message)
        else:  # PermissionDenied, Response, Push: only the hub sends those
            raise ProtocolError(f"a client does not send {type(message).__name__}")
        self.frames_received += 1
        return out

    def receive_update(self, frame: bytes) -> bytes | None:
        """:meth:`receive` for the hub's most frequent frame, without a :class:`Received`: if
        ``frame`` is an update frame whose length takes one or two bytes, and the session is
        not read-only, apply it (as :meth:`receive` would) and return the update bytes;
        else return None having done nothing (give the frame to :meth:`receive`).

        Raises:
            ProtocolError: the update was refused; nothing changed.
        """
        # the header as decode's fast path reads it; any other frame takes the general way
        size = len(frame)
        if (
            self.read_only
            or size <= 3
            or size > self.max_message_size
            or frame[0] != 0  # MessageType.SYNC
            or frame[1] != 2  # SyncType.UPDATE
        ):
            return None
        first = frame[2]
        if first < 0x80:
            if size != 3 + first:
                return None
            update = bytes(frame[3:])
        else:
            second = frame[3]
            if not second or second >= 0x80 or size != 4 + ((first & 0x7F) | (second << 7)):
                return None
            update = bytes(frame[4:])
        try:
            self.document.apply_update(update)
        except (PayloadTooLarge, InvalidUpdate, ValueError) as exc:
            raise _refusal(exc) from None
        self.updates_applied += 1
        self.frames_received += 1
        return update

    def _track_awareness(self, entries: tuple[AwarenessEntry, ...]) -> None:
        clients = dict(self._awareness_clients)
        for entry in entries:
            if entry.removed:
                clients.pop(entry.client_id, None)
            else:
                clients[entry.client_id] = entry.clock
        if len(clients) > self.max_awareness_clients:
            raise ProtocolError(
                f"more than {self.max_awareness_clients} awareness clients on one connection",
                CloseCode.TOO_MANY_REQUESTS,
            )
        self._awareness_clients = clients

    def respond(self, response: Response) -> bytes:
        """The frame answering a pending request.

        Raises:
            ValueError: no request with ``response.id`` is pending (a bug of the driver).
        """
        if response.id not in self._pending:
            raise ValueError(f"no pending request with id {response.id!r}")
        frame = encode(response)
        del self._pending[response.id]
        return frame

    def awareness_removal(self) -> Awareness | None:
        """The awareness message removing this connection's clients (to broadcast when it
        closes), or None if it announced none."""
        if not self._awareness_clients:
            return None
        entries = [
            AwarenessEntry(client, clock + 1, "null")
            for client, clock in sorted(self._awareness_clients.items())
        ]
        return Awareness(encode_awareness_update(entries))


class ClientSession(_Session):
    """A client's end of one connection (a new session for every connection).

    Args:
        document: the local replica.
        max_message_size, max_pending_requests, max_awareness_clients: as for
            :class:`ServerSession`.
    """

    def __init__(
        self,
        document: Document,
        *,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS,
        max_awareness_clients: int = DEFAULT_MAX_AWARENESS_CLIENTS,
    ) -> None:
        super().__init__(
            document,
            max_message_size=max_message_size,
            max_pending_requests=max_pending_requests,
            max_awareness_clients=max_awareness_clients,
        )
        self.synced = False
        self.refused = 0  # permission-denied messages received
        self.last_denied: str | None = None
        self._next_id = 1

    def start(self) -> list[bytes]:
        """Frames to send when the connection opens: sync step 1 (the hub answers with what
        this replica misses, and its own step 1 asks for what the hub misses)."""
        return [encode(SyncStep1(self.document.get_state()))]

    def request(self, op: str, params: dict[str, object] | None = None) -> tuple[Request, bytes]:
        """A new request with a fresh id, and its frame.

        Raises:
            ProtocolError: ``TOO_MANY_REQUESTS`` if ``max_pending_requests`` are in flight;
                ``op`` or ``params`` are not valid.
        """
        if len(self._pending) >= self.max_pending_requests:
            raise ProtocolError(
                f"more than {self.max_pending_requests} requests in flight",
                CloseCode.TOO_MANY_REQUESTS,
            )
        try:
            request = Request.model_validate(
                {"id": self._next_id, "op": op, "params": params or {}}
            )
        except ValueError as exc:
            raise ProtocolError(f"invalid request: {exc}") from None
        frame = encode(request)
        self._next_id += 1
        self._pending[request.id] = request
        return request, frame

    def receive(self, frame: bytes) -> Received:
        """Interpret one frame from the hub.

        Raises:
            ProtocolError: the frame was refused; nothing changed. Close with ``close_code``.
        """
        message = self._decode(frame)
        out: Received
        if isinstance(message, Update):
            _apply(self.document, message.update)
            self.updates_applied += 1
            out = Received(message, applied=message.update)
        elif isinstance(message, SyncStep2):
            _apply(self.document, message.update)
            self.updates_applied += 1
            out = Received(message, applied=message.update, synced=not self.synced)
            self.synced = True
        elif isinstance(message, SyncStep1):
            out = Received(message, (_step2_for(self.document, message.state_vector),))
        elif isinstance(message, Awareness):
            out = Received(message, awareness=_awareness(message, self.max_awareness_clients))
        elif isinstance(message, QueryAwareness):
            out = Received(message)  # the provider answers with its awareness states
        elif isinstance(message, PermissionDenied):
            self.refused += 1
            self.last_denied = message.reason
            out = Received(message, refused=message.reason)
        elif isinstance(message, Response):
            if message.id not in self._pending:
                raise ProtocolError(f"response to unknown request id {message.id!r}")
            del self._pending[message.id]
            out = Received(message)
        elif isinstance(message, Push):
            out = Received(message)  # the provider acts on it (head: read the journal)
        else:  # Request: the hub does not make requests
            raise ProtocolError(f"the hub does not send {type(message).__name__}")
        self.frames_received += 1
        return out
