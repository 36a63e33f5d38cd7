"""The toolset as an MCP server (``crdtstore mcp``), on the official ``mcp`` SDK's
``MCPServer``. Needs the optional extra: ``pip install 'crdtstore[mcp]'``.

- **Tools** are the toolset's, with its own input schemas (``toolset.schemas("mcp")``):
  :class:`RecordServer` overrides ``list_tools`` and ``call_tool`` instead of registering
  Python functions, so the SDK never derives a schema from a signature and a shell agent, a
  model and an MCP client see one contract. The call id journaled with each write names the
  server process and the MCP request (``mcp-<pid>-<n>-<id>``).
- **Resources**: each collection the toolset sees is ``crdtstore://<run>/<collection>``
  (``application/json``: what ``store_get(collection)`` returns, its first page).
- **Notifications**, driven by ``rec.changes()`` (local and remote writes alike), coalesced
  while a round is being sent, in both protocol eras of SDK 2.x: the 2026 subscription bus,
  and ``resources/subscribe`` for handshake-era connections (see :meth:`RecordServer.__init__`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import Iterable
from itertools import count
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.lowlevel import NotificationOptions
from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import ResourcesListChanged, ResourceUpdated
from mcp.types import (
    CallToolResult,
    EmptyResult,
    Resource,
    SubscribeRequestParams,
    TextContent,
    Tool,
    UnsubscribeRequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import AnyUrl

from .. import __version__

if TYPE_CHECKING:
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

    from ..record import Record
    from ._toolset import Toolset

__all__ = ["SCHEME", "RecordServer", "resource_uri"]

SCHEME = "crdtstore"
MIME = "application/json"
INSTRUCTIONS = (
    "A shared, journaled working record of one run, edited concurrently by several agents. "
    "Call store_describe first; echo the version a read returned into a write "
    "(expected_version / based_on) so it is refused with STALE_VERSION if someone moved it; "
    "edit text with store_text_edit, never by rewriting it."
)

logger = logging.getLogger("crdtstore.mcp")

MAX_SESSIONS = 256  # handshake-era connections remembered for notifications


def resource_uri(run: str, collection: str) -> str:
    """The MCP resource URI of a collection: ``crdtstore://<run>/<collection>``."""
    return f"{SCHEME}://{run}/{collection}"


def _dumps(result: dict[str, Any]) -> str:
    return json.dumps(result, ensure_ascii=False, separators=(",", ":"))


class RecordServer(MCPServer[Any]):
    """An MCP server of one :class:`~crdtstore.tools.Toolset` (tools, collections as
    resources, change notifications). Serve it with :meth:`serve_stdio` or :meth:`serve_http`
    (each runs the change notifier too); the caller owns the toolset and its record.

    Args:
        toolset: the toolset whose tools it serves.
        name: the server name clients show.
    """

    def __init__(self, toolset: Toolset, *, name: str = "crdtstore") -> None:
        super().__init__(
            name,
            version=__version__,
            instructions=INSTRUCTIONS,
            log_level="WARNING",
        )
        self.toolset = toolset
        self._calls = count(1)
        self._call_prefix = f"mcp-{os.getpid()}"
        # handshake-era connections that asked about resources (they get list_changed), by
        # connection, at most MAX_SESSIONS (the oldest go first: a closed connection is not
        # announced), and the URIs each one subscribed to
        self._sessions: dict[int, ServerSession] = {}
        self._subscribed: dict[int, set[str]] = {}
        self._known = self._visible_collections()
        # Notifications in both protocol eras of SDK 2.x: 2026-07-28 connections get them
        # through the SDK's subscription bus (subscriptions/listen with resourceSubscriptions /
        # resourcesListChanged); handshake-era connections (ClientSession.initialize(), up to
        # 2025-11-25) through resources/subscribe and notifications/resources/updated, and
        # notifications/resources/list_changed to every session that listed or subscribed to
        # resources, when a collection appears. MCPServer does not serve the legacy
        # resources/subscribe itself; the SDK's advice for methods the 2026 revision removed
        # is the low-level Server.add_request_handler: this is the one place that reaches it.
        low = self._lowlevel_server
        low.add_request_handler("resources/subscribe", SubscribeRequestParams, self._subscribe)
        low.add_request_handler(
            "resources/unsubscribe", UnsubscribeRequestParams, self._unsubscribe
        )
        # handshake-era capabilities: resources.listChanged (the 2026 era derives it from the
        # listen handler); the streamable HTTP manager asks the server itself for them
        low.create_initialization_options = self._initialization_options  # type: ignore[method-assign]
        self.middleware.append(self._track_sessions)

    @property
    def record(self) -> Record:
        return self.toolset.record

    # -- tools ----------------------------------------------------------------------------------

    async def list_tools(self) -> list[Tool]:
        """The toolset's tools, with its own input schemas and annotations."""
        return [Tool.model_validate(schema) for schema in self.toolset.schemas("mcp")]

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult:
        """Run a tool; a structured error comes back as a result with ``is_error`` set.

        A result is ``structured_content`` (the result dict) plus one ``TextContent`` of its
        JSON. The toolset validates the arguments; the SDK's ``Mcp-Param-*`` header check
        (2026 HTTP) finds no schema of its own for these tools and is skipped, as it is for a
        schema that declares no header.
        """
        call_id = f"{self._call_prefix}-{next(self._calls)}"
        if context is not None:
            with contextlib.suppress(ValueError):  # ValueError: no request (in-process call)
                call_id = f"{call_id}-{context.request_id[:64]}"
        result = await self.toolset.call(name, arguments, call_id=call_id)
        return CallToolResult(
            content=[TextContent(type="text", text=_dumps(result))],
            structured_content=result,
            is_error=self.toolset.is_error(result),
        )

    # -- resources ------------------------------------------------------------------------------

    def _visible_collections(self) -> dict[str, str]:
        """The collections the toolset sees (all of them, or those its view names)."""
        kinds = self.record.collections()
        view = self.toolset.view
        if view is None:
            return dict(sorted(kinds.items()))
        return {n: k for n, k in sorted(kinds.items()) if view.covers(n)}

    async def list_resources(self) -> list[Resource]:
        """Every collection the toolset sees, as a resource."""
        await self.record.sync()
        run = self.record.run
        return [
            Resource(
                uri=resource_uri(run, name),
                name=name,
                title=f"{name} ({kind})",
                description=f"The {kind} collection {name!r} of run {run!r}: its first page, "
                "as store_get returns it.",
                mime_type=MIME,
            )
            for name, kind in self._visible_collections().items()
        ]

    def _collection_of(self, uri: str) -> str:
        prefix = f"{SCHEME}://{self.record.run}/"
        name = uri[len(prefix) :] if uri.startswith(prefix) else ""
        if not name or name not in self._visible_collections():
            raise ResourceNotFoundError(f"no collection resource {uri!r}")
        return name

    async def read_resource(
        self, uri: AnyUrl | str, context: Context[Any, Any] | None = None
    ) -> Iterable[ReadResourceContents]:
        """A collection's first page (``store_get(collection)``), as JSON."""
        await self.record.sync()
        name = self._collection_of(str(uri))
        result = await self.toolset.call("store_get", {"collection": name})
        return [ReadResourceContents(content=_dumps(result), mime_type=MIME)]

    # -- notifications --------------------------------------------------------------------------

    def _initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        low = self._lowlevel_server
        return type(low).create_initialization_options(
            low,
            notification_options or NotificationOptions(resources_changed=True),
            experimental_capabilities,
            extensions,
        )

    def _remember(self, session: ServerSession) -> int:
        """The key of ``session``'s connection (a new ``ServerSession`` is made per request,
        the connection's ``initialize`` params are one object), remembered as its latest."""
        key = id(session.client_params) if session.client_params is not None else id(session)
        self._sessions.pop(key, None)
        self._sessions[key] = session  # held: the key stays unique while it is in the dict
        while len(self._sessions) > MAX_SESSIONS:
            oldest = next(iter(self._sessions))
            del self._sessions[oldest]
            self._subscribed.pop(oldest, None)
        return key

    async def _track_sessions(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method == "resources/list" and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            self._remember(ctx.session)
        return await call_next(ctx)

    async def _subscribe(
        self, ctx: ServerRequestContext[Any, Any], params: SubscribeRequestParams
    ) -> EmptyResult:
        self._collection_of(params.uri)  # an unknown resource is refused
        self._subscribed.setdefault(self._remember(ctx.session), set()).add(params.uri)
        return EmptyResult()

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        self._subscribed.get(self._remember(ctx.session), set()).discard(params.uri)
        return EmptyResult()

    async def _announce(self, changed: set[str]) -> None:
        """One round of notifications: the collections that changed, and a list change when
        the set of visible collections did. (Sending to a closed connection drops it.)"""
        visible = self._visible_collections()
        run = self.record.run
        uris = {resource_uri(run, name) for name in changed if name in visible}
        for uri in sorted(uris):
            await self._subscriptions.publish(ResourceUpdated(uri=uri))
        for key, session in list(self._sessions.items()):
            for uri in sorted(uris & self._subscribed.get(key, set())):
                await session.send_resource_updated(uri)
        if visible.keys() != self._known.keys():
            self._known = visible
            await self._subscriptions.publish(ResourcesListChanged())
            for session in list(self._sessions.values()):
                await session.send_resource_list_changed()

    async def notify_changes(self) -> None:
        """Announce the record's changes until cancelled (or the record closes). Changes that
        arrive while a round is being sent are coalesced into the next round."""
        changed: set[str] = set()
        wake = anyio.Event()

        async def collect() -> None:
            nonlocal wake
            async with self.record.changes() as stream:
                async for change in stream:
                    changed.add(change.collection)
                    wake.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            while True:
                await wake.wait()
                wake = anyio.Event()
                batch = set(changed)
                changed.clear()
                await self._announce(batch)

    # -- transports -----------------------------------------------------------------------------

    async def serve_stdio(self) -> None:
        """Serve one client over standard input and output until it closes them."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.notify_changes)
            async with stdio_server() as (read_stream, write_stream):
                low = self._lowlevel_server
                await low.run(read_stream, write_stream, low.create_initialization_options())
            tg.cancel_scope.cancel()

    async def serve_http(self, sock: socket.socket) -> None:
        """Serve streamable HTTP (at ``/mcp``) on a bound, listening socket until uvicorn is
        told to stop (SIGINT, SIGTERM)."""
        import uvicorn

        host = sock.getsockname()[0]
        app = self.streamable_http_app(host=host)
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        server = uvicorn.Server(config)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.notify_changes)
            await server.serve(sockets=[sock])
            tg.cancel_scope.cancel()
