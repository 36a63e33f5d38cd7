"""The hub's extension ops (message type 100): a registry of request handlers.

A handler is ``async def handler(ctx: OpContext, params: dict) -> JsonValue``: it returns the
result, or raises a :class:`crdtstore.CrdtStoreError` (answered as an error response with
the error's stable code and fields). Handlers are registered with :func:`op`; modules that
define ops are imported by the hub (:mod:`sync._hub`) so that their registration runs.

An op declared ``write=True`` is refused for a read-only token (error ``READ_ONLY``) before
its handler runs; an op that needs a right of its own checks the claim first and refuses
with ``FORBIDDEN`` (``run.redact``: :mod:`sync._ops_redact`). Every handler acts on behalf
of the connection's token (``ctx.claims``): its agent and source, its tenant, and the run of
the connection (``ctx.run``); never on anything the client says about who it is.

An append frame (:class:`~sync._frames.Append`: ``journal.append`` with raw update bytes)
goes to the handler registered for its class with :func:`frame` (``sync._ops_journal``),
after the checks of its op. ``whoami`` tells a client which ops the hub takes as frames
(``frames``), so that it sends them only to a hub that does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from pydantic import JsonValue

from crdtstore import CrdtStoreError

from ._frames import APPEND_OP
from ._messages import ErrorInfo, Request, Response

if TYPE_CHECKING:
    from crdtstore import Record, Store

    from ._hub import Hub
    from ._hub_conn import _Conn
    from ._tokens import TokenClaims

__all__ = [
    "FRAMES",
    "FRAME_OPS",
    "OPS",
    "FrameHandler",
    "OpContext",
    "OpHandler",
    "dispatch",
    "frame",
    "op",
]

FRAMES: Final = (APPEND_OP,)  # the ops the hub also takes as binary frames (``whoami``)


@dataclass(frozen=True)
class OpContext:
    """What a handler acts on: the hub, the connection, its token, its run's record and the
    tenant's store."""

    hub: Hub
    conn: _Conn
    claims: TokenClaims
    tenant: str
    run: str
    rec: Record
    store: Store


OpHandler = Callable[[OpContext, dict[str, JsonValue]], Awaitable[JsonValue]]


@dataclass(frozen=True)
class _Op:
    handler: OpHandler
    write: bool


OPS: Final[dict[str, _Op]] = {}


def op(name: str, *, write: bool = False) -> Callable[[OpHandler], OpHandler]:
    """Register ``handler`` as the op ``name`` (``write``: refused for read-only tokens)."""

    def register(handler: OpHandler) -> OpHandler:
        if name in OPS:
            raise ValueError(f"op {name!r} is already registered")
        OPS[name] = _Op(handler, write)
        return handler

    return register


FrameHandler = Callable[[OpContext, Any], Awaitable[Response]]
FRAME_OPS: Final[dict[type[Request], FrameHandler]] = {}


def frame(kind: type[Request]) -> Callable[[FrameHandler], FrameHandler]:
    """Register ``handler`` for the binary frames of ``kind`` (a :class:`Request` of an op
    registered with :func:`op`): it runs after that op's checks and builds the response."""

    def register(handler: FrameHandler) -> FrameHandler:
        if kind in FRAME_OPS:
            raise ValueError(f"frame {kind.__name__} is already registered")
        FRAME_OPS[kind] = handler
        return handler

    return register


async def dispatch(ctx: OpContext, request: Request) -> Response:
    """Run the handler of ``request.op`` and build the response (never raises a crdtstore
    error: it becomes an error response)."""
    entry = OPS.get(request.op)
    if entry is None:
        return Response.failure(
            request.id,
            ErrorInfo(code="UNSUPPORTED_OP", message=f"the hub has no op {request.op!r}"),
        )
    if entry.write and ctx.claims.read_only:
        return Response.failure(
            request.id,
            ErrorInfo(code="READ_ONLY", message=f"op {request.op!r} needs a read-write token"),
        )
    try:
        handle_frame = FRAME_OPS.get(type(request))
        if handle_frame is not None:
            return await handle_frame(ctx, request)
        result: Any = await entry.handler(ctx, dict(request.params))
    except CrdtStoreError as exc:
        return Response.failure(request.id, exc)
    return Response.success(request.id, result)


@op("flush")
async def _flush(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    """Answered once everything the run's record holds is journaled."""
    await ctx.rec.flush()
    return None


@op("whoami")
async def _whoami(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    """The token's claims, and ``frames``: the ops the hub also takes as binary frames."""
    out: dict[str, JsonValue] = ctx.claims.model_dump()
    out["frames"] = list(FRAMES)
    return out
