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

An append frame (:class:`~sync._messages.Append`: ``journal.append`` with raw update bytes)
is dispatched here to the same append as the JSON op (``sync._ops_journal._append``), with
the same checks and errors; its success is answered as a binary
:class:`~sync._messages.Appended`. ``whoami`` tells a client which ops the hub takes as
frames (``frames``), so that it sends them only to a hub that does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from pydantic import JsonValue

from crdtstore import CrdtStoreError
from crdtstore.backend import check_call

from ._messages import APPEND_OP, Append, Appended, ErrorInfo, Request, Response

if TYPE_CHECKING:
    from crdtstore import Record, Store

    from ._hub import Hub
    from ._hub_conn import _Conn
    from ._tokens import TokenClaims

__all__ = ["FRAMES", "OPS", "OpContext", "OpHandler", "dispatch", "op"]

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
        if type(request) is Append:
            return Appended.of(request.id, await _append_frame(ctx, request))
        result: Any = await entry.handler(ctx, dict(request.params))
    except CrdtStoreError as exc:
        return Response.failure(request.id, exc)
    return Response.success(request.id, result)


async def _append_frame(ctx: OpContext, request: Append) -> list[int]:
    """``journal.append`` of an append frame: as the JSON op does it (one transaction per run
    of entries of one client id, every entry checked before any is journaled)."""
    from ._ops_journal import _append  # (that module imports this one)

    entries = request.entries
    calls = [check_call(e.call) for e in entries]
    seqs: list[int] = []
    start = 0
    while start < len(entries):
        client_id = entries[start].client_id
        end = start + 1
        while end < len(entries) and entries[end].client_id == client_id:
            end += 1
        updates = [e.update for e in entries[start:end]]
        seqs.extend(
            await _append(ctx, updates, client_id, calls[start:end], durable=request.durable)
        )
        start = end
    return seqs


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
