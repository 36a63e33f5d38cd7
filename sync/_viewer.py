"""The record viewer: a page the hub serves under ``/-/view/`` (``Hub.http_routes["view"]``).

::

    /-/view/<tenant>/<run>#token=<read-only token>   one run, live
    /-/view/<tenant>/#token=<read-only token>        the runs of the tenant the token may see
    /-/view/viewer.js, /-/view/viewer.css            the page's code and style

The page (``sync/viewer_static/``: one HTML file, one CSS file, one JavaScript bundle built
from ``viewer/`` by esbuild and committed, so no Node.js is needed at run time) joins the run
over the hub's own protocol with the token: a y-websocket provider for the record, and a
``crdtstore`` connection for the journal, leases and :func:`view.connections <_connections>`.
Those connections carry the same token checks as any client's. The token travels in the
address's fragment, which never reaches the server; the page takes only read-only tokens (a
read-write one is refused unused), and builds every value into the page as text. The HTML is
the same for every run: what a page shows comes only over the token-checked connections, except
the index of runs (:func:`_runs`). Every answer carries a strict Content-Security-Policy
(:func:`content_security_policy`).
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Final
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import JsonValue
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request as HttpRequest
from websockets.http11 import Response as HttpResponse

from crdtstore import CrdtStoreError, InvalidName
from crdtstore.backend import check_name

from ._ops import OpContext, op
from ._tokens import TokenError, verify

if TYPE_CHECKING:
    from ._hub import Hub

__all__ = ["PREFIX", "content_security_policy", "view_route"]

PREFIX: Final = "/-/view/"
_ASSETS: Final = {
    "viewer.js": "text/javascript; charset=utf-8",
    "viewer.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
_PAGE: Final = "index.html"
# a Host header as browsers send it: a name or an IPv4/IPv6 address, an optional port
_HOST_RE: Final = re.compile(r"^(?:[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?$")


@cache
def _asset(name: str) -> bytes:
    return resources.files("sync").joinpath("viewer_static", name).read_bytes()


def content_security_policy(host: str) -> str:
    """The page's policy: everything from the hub at ``host`` (its ``Host`` header) only.

    Every answer carries a strict Content-Security-Policy: scripts and styles from the hub only
    (no inline script or style, no ``eval``), connections to the hub only, no frames, no forms.
    """
    return (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        f"connect-src 'self' ws://{host} wss://{host}; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )


def _response(
    status: int, reason: str, body: bytes, content_type: str, host: str | None
) -> HttpResponse:
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
            ("X-Frame-Options", "DENY"),
            ("Connection", "close"),
        ]
    )
    if host is not None:
        headers["Content-Security-Policy"] = content_security_policy(host)
    return HttpResponse(status, reason, headers, body)


def _json(status: int, reason: str, value: JsonValue, host: str | None) -> HttpResponse:
    body = json.dumps(value, separators=(",", ":")).encode()
    return _response(status, reason, body, "application/json", host)


def _error(status: int, reason: str, code: str, message: str, host: str | None) -> HttpResponse:
    return _json(status, reason, {"error": {"code": code, "message": message}}, host)


async def view_route(hub: Hub, connection: ServerConnection, request: HttpRequest) -> HttpResponse:
    """Answer a request under ``/-/view/`` (see the module docstring)."""
    host = request.headers.get("Host", "")
    if not _HOST_RE.fullmatch(host):
        return connection.respond(400, "a Host header is needed\n")
    url = urlsplit(request.path)
    rest = url.path[len(PREFIX) :] if url.path.startswith(PREFIX) else ""
    if "/" not in rest:
        if rest == "":  # /-/view or /-/view/: the page finds the tenant in the token
            return _response(200, "OK", _asset(_PAGE), "text/html; charset=utf-8", host)
        content_type = _ASSETS.get(rest)
        if content_type is None:
            return connection.respond(404, f"no file {rest!r} in the viewer\n")
        return _response(200, "OK", _asset(rest), content_type, host)
    tenant = unquote(rest.split("/", 1)[0])
    try:
        check_name("tenant", tenant)
    except InvalidName as exc:
        return _error(400, "Bad Request", exc.code, str(exc), host)
    if parse_qs(url.query).get("list") == ["runs"]:
        return await _runs(hub, request, tenant, host)
    return _response(200, "OK", _asset(_PAGE), "text/html; charset=utf-8", host)


async def _runs(hub: Hub, request: HttpRequest, tenant: str, host: str) -> HttpResponse:
    """The runs of ``tenant`` that the request's read-only token covers.

    The HTML is the same for every run: what a page shows comes only over the token-checked
    connections. The one data answer given over plain HTTP is the index of runs (``?list=runs``
    with ``Authorization: Bearer <token>``): a read-only token's runs of its own tenant (a
    prefix token: every run it covers), refused (401/403) otherwise. The page also asks it why
    when its connection never opens and the hub said nothing (``refuse_with="http"`` refuses at
    the upgrade, which a browser's WebSocket cannot read).
    """
    auth = request.headers.get("Authorization", "")
    token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
    try:
        # (the hub's own secret, clock and revocation list: the checks of any connection)
        claims = verify(hub._secret, token, hub._clock(), revoked=hub.revoked)
    except TokenError as exc:
        return _error(exc.http_status, "Refused", exc.code, exc.reason, host)
    if claims.tenant != tenant:
        return _error(403, "Forbidden", "FORBIDDEN", f"the token is not for tenant {tenant}", host)
    if not claims.read_only:
        return _error(403, "Forbidden", "FORBIDDEN", "the viewer takes only read-only tokens", host)
    try:
        store = await hub._store(tenant)
        try:
            rows = await store.backend.list_runs(tenant)
        finally:
            hub._unstore(tenant)
    except CrdtStoreError as exc:
        return _error(503, "Service Unavailable", exc.code, str(exc), host)
    runs: list[JsonValue] = [
        {
            "run": r.run,
            "created": r.created,
            "head": r.head,
            "state": r.state,
            "parent": r.parent,
        }
        for r in sorted(rows, key=lambda r: r.run)
        if claims.allows(tenant, r.run)
    ]
    return _json(200, "OK", {"tenant": tenant, "runs": runs}, host)


@op("view.connections")
async def _connections(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    """Who is connected to the run: each connection's agent, token mode and protocol
    (``yjs`` or ``crdtstore``), in agent order."""
    conns = sorted(
        ctx.conn.room.conns, key=lambda c: (c.claims.agent, c.claims.mode, c.journal_client)
    )
    return [
        {
            "agent": c.claims.agent,
            "mode": c.claims.mode,
            "protocol": "crdtstore" if c.journal_client else "yjs",
        }
        for c in conns
    ]
