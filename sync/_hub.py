"""The hub: a WebSocket server that shares each run's record with the agents connected to it.

::

    hub = Hub("sqlite:///runs/store.db", secret)
    async with anyio.create_task_group() as tg:
        port = await tg.start(hub.serve, "127.0.0.1", 8765)

Tokens are checked at the HTTP upgrade, before any document byte is sent; a connection's
frames are handled in order, one at a time, so a response acknowledges every update sent
before it. Updates are applied and journaled through the run's record as the token's agent,
never trusting the client, then relayed to the run's other connections (the connection
rules: :class:`Hub`).

Modules: ``_hub`` (this: serving, the upgrade, revocation, a connection's frames) ->
``_hub_runs`` (loaded runs, stores) -> ``_hub_conn`` (a connection's queue and limits),
``_hub_limits``; ``_metrics`` (``hub.metrics``: the counters the others bump, ``/-/metrics``
and ``/-/health``) and ``_logs`` (the tenant, run and agent of a connection's log lines) are
leaves. The run's record journals by a group commit on the event loop
(``Record.commit_on_loop``, :mod:`crdtstore.record._loop_commit`).
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Final, Literal
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
from anyio.abc import TaskGroup, TaskStatus
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request as HttpRequest
from websockets.http11 import Response as HttpResponse
from websockets.typing import Subprotocol

from crdtstore import (
    BudgetExceeded,
    CrdtStoreError,
    InvalidName,
    InvalidUpdate,
    InvalidValue,
    PayloadTooLarge,
    PolicyViolation,
    RunClosed,
    UnknownRun,
    open_store,
)
from crdtstore.backend import check_name

from ._errors import CloseCode, ProtocolError
from ._hub_conn import _CURRENT, _MAX_REASON, _Conn
from ._hub_limits import HubLimits
from ._hub_runs import _EMPTY_UPDATES, HUB_AGENT, _CheckingDocument, _RunLoader
from ._hub_sweep import sweep_forever
from ._logs import bind as bind_log_context
from ._messages import PermissionDenied, QueryAwareness, Request, Update, encode
from ._metrics import HubMetrics, operator_routes
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
from ._viewer import view_route  # the record viewer's pages, and its op view.connections

__all__ = ["HUB_AGENT", "SUBPROTOCOL", "Hub", "HubLimits"]

log = logging.getLogger("sync.hub")

#: A plain HTTP endpoint of the hub (``Hub.http_routes``): answers a request the hub got
#: under ``/-/<name>/`` (a coroutine on the hub's event loop: it must not block).
HttpRoute = Callable[["Hub", ServerConnection, HttpRequest], Awaitable[HttpResponse]]

SUBPROTOCOL: Final = "crdtstore"


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


class Hub(_RunLoader):
    """The sync hub over the store at ``store_url``, accepting tokens signed with ``secret``.

    A client connects to ``ws://host:port/<tenant>/<run>`` with a token (:mod:`sync._tokens`) as
    the ``token`` query parameter (what y-websocket's ``params`` option sends) or as the
    subprotocol ``crdtstore.token.<token>``. The token is checked at the HTTP upgrade
    (``process_request``) and a bad one is refused before any document byte is sent: by default
    (``refuse_with="close"``) the upgrade completes and the connection is closed at once with
    the token error's 44xx code and the reason ``"<CODE>: <reason>"`` (what ends a y-websocket
    client for good); with ``refuse_with="http"`` the upgrade itself is refused with HTTP 401 or
    403. A token is revoked by its id (``jti``): :meth:`Hub.revoke`, or a line in the revocation
    file, re-read when it changed (checked every ``HubLimits.revocation_poll``).

    An accepted connection speaks the y-protocols sync protocol (:class:`~sync.ServerSession`);
    its frames are handled in order, one at a time (so a response to a ``flush`` request
    acknowledges every update sent before it). Each update is applied and journaled through the
    run's record as the token's agent (``Record.apply_update(writer=...)``), then broadcast as
    is to every *other* connection of the run; awareness is relayed to every connection (echoed
    too, as y-websocket's server does). A read-only connection's writes are answered with
    permission-denied and never applied. A malformed frame closes that connection only (4400,
    4413 for a frame over the size limit, 4422 for update bytes the record refuses). Extension
    requests (type 100) go to the op registry of :mod:`sync._ops`.

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
        operator_token: serve ``/-/metrics`` and ``/-/health`` on the hub's port to requests
            carrying it (bearer or ``?token=``; see :mod:`sync._metrics`); None: not served
            there (:func:`sync._metrics.serve_operator` serves them on another address).

    Raises:
        SecretMissing: ``secret`` is too short.
        InvalidValue: ``refuse_with`` is neither ``"close"`` nor ``"http"``, or
            ``operator_token`` is too short.
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
        operator_token: str | None = None,
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
        self._init_runs()
        self._auth: weakref.WeakKeyDictionary[ServerConnection, tuple[TokenClaims, str, str, bool]]
        self._auth = weakref.WeakKeyDictionary()
        # connections whose token was refused (refuse_with="close"): (close code, reason)
        self._refused: weakref.WeakKeyDictionary[ServerConnection, tuple[int, str]]
        self._refused = weakref.WeakKeyDictionary()
        self._tg: TaskGroup | None = None
        self._stopping = anyio.Event()
        # plain HTTP endpoints under /-/<name>/... (the viewer, metrics, health): name -> handler
        self.http_routes: dict[str, HttpRoute] = {"view": view_route}
        self.metrics = HubMetrics(self)  # /-/metrics, /-/health (sync._metrics)
        if operator_token is not None:
            self.http_routes.update(operator_routes(operator_token))
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
                if self.limits.sweep_interval is not None:
                    tg.start_soon(
                        sweep_forever,
                        self.limits.sweep_interval,
                        lambda: self._tenants_seen,
                        self._store,
                        self._unstore,
                    )
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
                    ping_timeout=self.limits.ping_timeout,
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

    # -- the HTTP upgrade -------------------------------------------------------------------------

    async def _process_request(
        self, connection: ServerConnection, request: HttpRequest
    ) -> HttpResponse | None:
        url = urlsplit(request.path)
        if url.path.startswith("/-/"):
            return await self._http(connection, request)
        parts = url.path.split("/")
        if len(parts) != 3 or not parts[1] or not parts[2]:
            self.metrics.refused(404)
            return connection.respond(404, "expected a path /<tenant>/<run>\n")
        tenant, run = unquote(parts[1]), unquote(parts[2])
        try:
            check_name("tenant", tenant)
            check_name("run", run)
        except InvalidName as exc:
            self.metrics.refused(400)
            return connection.respond(400, f"{exc.code}: {exc}\n")
        bind_log_context(tenant=tenant, run=run)
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
                self.metrics.refused(exc.http_status)
                return connection.respond(exc.http_status, f"{exc.code}: {exc.reason}\n")
            # upgrade, then close with the 44xx code (the handler sends nothing before it)
            self._refused[connection] = (exc.close_code, f"{exc.code}: {exc.reason}"[:_MAX_REASON])
            return None
        # ``create=0`` (what a ws:// store's open_record(create=False) sends): never create the
        # run; a missing one is refused with 4404 (plain Yjs clients create it, token allowing)
        create = parse_qs(url.query).get("create", ["1"])[0] != "0"
        self._auth[connection] = (claims, tenant, run, create)
        bind_log_context(agent=claims.agent)
        return None

    async def _http(self, connection: ServerConnection, request: HttpRequest) -> HttpResponse:
        """Answer a plain HTTP request under ``/-/<name>/`` with the route named ``name``."""
        name = urlsplit(request.path).path.split("/")[2]
        route = self.http_routes.get(name)
        if route is None:
            return connection.respond(404, f"no endpoint /-/{name}\n")
        return await route(self, connection, request)

    # -- connections ------------------------------------------------------------------------------

    async def _handler(self, ws: ServerConnection) -> None:
        refused = self._refused.pop(ws, None)
        if refused is not None:  # a bad token (refuse_with="close"): no document byte
            await self._refuse(ws, *refused)
            return
        auth = self._auth.pop(ws, None)
        if auth is None:  # process_request refuses those; never serve without a token
            await self._refuse(ws, CloseCode.UNAUTHORIZED, "TOKEN_INVALID: no token")
            return
        claims, tenant, run, create = auth
        try:
            room = await self._acquire(tenant, run, claims, create=create)
        except UnknownRun as exc:
            await self._refuse(ws, CloseCode.UNKNOWN_RUN, f"{exc.code}: {exc}")
            return
        except RunClosed as exc:
            await self._refuse(ws, CloseCode.RUN_CLOSED, f"{exc.code}: {exc}")
            return
        except PayloadTooLarge as exc:
            log.warning("refused to load run %s/%s: %s", tenant, run, exc)
            await self._refuse(ws, CloseCode.DOCUMENT_TOO_LARGE, f"{exc.code}: {exc}")
            return
        except CrdtStoreError as exc:
            log.error("cannot load run %s/%s: %s", tenant, run, exc)
            await self._refuse(ws, CloseCode.INTERNAL_ERROR, exc.code)
            return
        assert room.rec is not None
        self.metrics.watch_record(room.rec)
        session = ServerSession(
            _CheckingDocument(room, self.limits.max_document_bytes),
            read_only=claims.read_only,
            max_message_size=self.limits.max_message_size,
        )
        conn = _Conn(ws, claims, room, session, self.limits, self.metrics)
        try:
            async with anyio.create_task_group() as tg:
                conn.scope = tg.cancel_scope
                tg.start_soon(conn.sender)
                tg.start_soon(conn.expire, claims.exp)
                tg.start_soon(conn.awareness_watchdog)
                room.join(conn)
                self.metrics.connected()
                self._fire_changed()
                if claims.jti is not None and claims.jti in self._revoked:  # since the upgrade
                    log.warning("%r: token %s revoked; closing", conn, claims.jti)
                    conn.close(CloseCode.FORBIDDEN, "TOKEN_REVOKED: token revoked")
                    return
                log.info("%r: connected (%s)", conn, claims.mode)
                if ws.subprotocol == SUBPROTOCOL:
                    conn.journal_client = True
                    room.retarget()
                    if room.commit is not None:
                        room.commit.readers += 1
                        room.commit.urge()  # it reads the journal: what is deferred is due now
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
            log.info("%r: disconnected", conn)
            room.leave(conn)
            if conn.journal_client and room.commit is not None:
                room.commit.readers -= 1
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
                # an update frame (most of them) is applied without building a Received
                update = session.receive_update(frame)
                received = session.receive(frame) if update is None else None
            except ProtocolError as exc:
                log.warning("%r: %s; closing with %d", conn, exc.reason, exc.close_code)
                conn.close(exc.close_code, exc.reason)
                return
            if received is None:
                assert update is not None
                await self._apply(conn, update, frame)  # (relayed as received)
                continue
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
                self.metrics.write_denied()
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
        metrics = self.metrics
        metrics.update_received()
        rec = conn.room.rec
        assert rec is not None
        token = _CURRENT.set(conn)
        try:
            # (the session's document checked the bytes already)
            await rec.apply_update(update, writer=conn.writer, checked=True)
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
        room = conn.room
        room.broadcast(encode(Update(update)) if frame is None else frame, exclude=conn)
        metrics.update_broadcast(max(0, len(room._targets or ()) - 1))
        if room.commit is not None and room.commit.ripe:  # (relayed: its batch is due)
            room.commit.ride()

    async def _refuse(self, ws: ServerConnection, code: int, reason: str) -> None:
        """Close a connection that is not served with ``code`` (counted in the metrics)."""
        self.metrics.refused(code)
        await ws.close(code, reason[:_MAX_REASON])

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
            store=rec.store,
        )
        conn.send(conn.session.respond(await dispatch(ctx, request)))
