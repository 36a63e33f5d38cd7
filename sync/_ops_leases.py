"""The hub's lease ops: :class:`crdtstore.LeaseBackend` over the wire (message type 100).

Each op performs one operation of the tenant store's lease backend (the SQLite lease table in
the store file, shared with embedded stores on the same file) **on behalf of the connection's
token**:

- the owner of a request is the token's agent, never anything the client says (a client
  can heartbeat, release or cancel only its agent's requests: another owner's lease answers
  ``LEASE_NOT_FOUND``, as the backend does for a wrong owner);
- the tenant is the token's tenant; a ``tenant`` parameter naming another one is refused
  with ``FORBIDDEN`` (it is optional: the client states what it believes, the hub checks);
- ``lease.request``, ``lease.heartbeat``, ``lease.release`` and ``lease.cancel`` need a
  read-write token (``READ_ONLY`` otherwise); ``lease.status``, ``lease.check`` and
  ``lease.reap`` (which only applies the TTL rules the next transition would apply anyway)
  are open to read-only tokens.

A remote holder's liveness is its heartbeats, not its connection (why: :func:`connection_proc`).
The ops, their params, results and errors are drawn next to :data:`LEASE_OPS`.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Annotated, Any, Final, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictBool, ValidationError

from crdtstore import InvalidValue
from crdtstore.backend import (
    LeaseState,
    Proc,
    canonical_resources,
    check_key,
    check_owner,
    check_ttl,
    this_proc,
)
from crdtstore.codec import MAX_SAFE_INTEGER

from ._metrics import metrics_of
from ._ops import OpContext, op
from ._tokens import Forbidden

if TYPE_CHECKING:
    from crdtstore.backend import LeaseBackend

__all__ = [
    "LEASE_OPS",
    "CancelParams",
    "CheckParams",
    "HeartbeatParams",
    "ReleaseParams",
    "RequestParams",
    "StatusParams",
    "connection_proc",
    "lease_state_json",
]

# Ops, params and results (``LeaseState`` and ``LeaseStatus`` are crdtstore's models, as JSON;
# ``watch_pids`` is always empty: pids of the hub's host mean nothing to a client)::
#
#     lease.request   {resources: [str], ttl?: number = 30, key?: [step, attempt] | null,
#                      wait?: bool = true, tenant?: str, pid?: int}          -> LeaseState
#     lease.heartbeat {lease_id: str, tenant?: str, pid?: int}                -> LeaseState
#     lease.release   {lease_id: str, token: int | null, tenant?: str}        -> null
#     lease.cancel    {lease_id: str, tenant?: str}                           -> {"removed": bool}
#     lease.status    {tenant?: str}                                          -> LeaseStatus
#     lease.check     {lease_id: str, resource: str, token: int, tenant?: str} -> null
#     lease.reap      {}                                                      -> {"reaped": int}
#
# Errors are the lease layer's own, with their codes and fields (``LEASE_HELD`` with
# ``resource``, ``holder``, ``token``; ``LEASE_LOST``; ``LEASE_NOT_FOUND``; ``INVALID_RESOURCE``;
# ``INVALID_VALUE`` for a bad TTL or key, and for params that do not validate: unknown keys,
# wrong types); a refused call changes nothing. ``lease.request`` does not wait: with ``wait``
# it queues the request and answers its state (``waiting_on_lock``); the client waits by
# heartbeats (see :class:`sync._lease_rpc.RemoteLeases`).
LEASE_OPS: Final = (
    "lease.request",
    "lease.heartbeat",
    "lease.release",
    "lease.cancel",
    "lease.status",
    "lease.check",
    "lease.reap",
)
MAX_LIST: Final = 4096  # resources in one request's list (the lease layer allows 256 distinct)

# Strict scalars (no "3" for 3, no true for 1), lax containers (JSON arrays become tuples).
_CONFIG = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
_Str = Annotated[str, Field(strict=True, min_length=1, max_length=4096)]
_Id = Annotated[str, Field(strict=True, min_length=1, max_length=128)]
# integers stay within JavaScript's safe range (and far from SQLite's 64-bit limit)
_Int = Annotated[int, Field(strict=True, ge=0, le=MAX_SAFE_INTEGER)]
_Pid = Annotated[int, Field(strict=True, ge=0, le=2**32)]
_Ttl = Annotated[float, Field(strict=True)]
_Attempt = Annotated[int, Field(strict=True, ge=-MAX_SAFE_INTEGER, le=MAX_SAFE_INTEGER)]
_Key = tuple[Annotated[str, Field(strict=True)], _Attempt]
_Tenant = Annotated[str, Field(strict=True, min_length=1, max_length=256)] | None


class _Params(BaseModel):
    model_config = _CONFIG

    tenant: _Tenant = None
    """The tenant the client believes it acts in; refused (``FORBIDDEN``) unless the token's."""


class RequestParams(_Params):
    """``lease.request``: queue (or re-attach by ``key``) a request for ``resources``."""

    resources: Annotated[list[JsonValue], Field(max_length=MAX_LIST)]
    """Checked by the lease layer (``INVALID_RESOURCE``): repo paths or ``item:<c>/<id>``."""
    ttl: _Ttl = 30.0
    key: _Key | None = None
    wait: StrictBool = True
    pid: _Pid | None = None
    """The client's process id: shown by ``status``, never used to judge liveness."""


class HeartbeatParams(_Params):
    """``lease.heartbeat``: renew a request's TTL and attach it to this connection."""

    lease_id: _Id
    pid: _Pid | None = None


class ReleaseParams(_Params):
    """``lease.release``: release a grant (``token``: refuse unless it is the grant's)."""

    lease_id: _Id
    token: _Int | None


class CancelParams(_Params):
    """``lease.cancel``: withdraw a waiting or granted request."""

    lease_id: _Id


class StatusParams(_Params):
    """``lease.status``: the holders and waiters of the token's tenant."""


class CheckParams(_Params):
    """``lease.check``: the fencing check of (``lease_id``, ``resource``, ``token``)."""

    lease_id: _Id
    resource: _Str
    token: _Int


class ReapParams(BaseModel):
    """``lease.reap``: remove expired requests now."""

    model_config = _CONFIG


P = TypeVar("P", bound=BaseModel)


def _parse(model: type[P], op_name: str, params: dict[str, JsonValue]) -> P:
    """``params`` validated by ``model``.

    Raises:
        InvalidValue: they do not validate (names the first wrong field).
    """
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "params"
        raise InvalidValue(f"{op_name}: {loc}: {first['msg']}") from None


def _tenant(ctx: OpContext, params: _Params) -> str:
    if params.tenant is not None and params.tenant != ctx.tenant:
        raise Forbidden(
            f"this connection's token is for tenant {ctx.tenant!r}, not {params.tenant!r}"
        )
    return ctx.tenant


def _backend(ctx: OpContext) -> LeaseBackend:
    return ctx.store.leases.backend


_PEERS: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()


def connection_proc(ctx: OpContext, pid: int | None) -> Proc:
    """The ``Proc`` a request made through ``ctx``'s connection is attached to: the peer's
    address as a host no probe can find dead, the hub's boot, and the client's ``pid`` as a
    label.

    **Liveness of a remote holder is its heartbeats, not its connection.** A local holder is
    attached to its process (``Proc``): a holder that provably died is reaped at once. A remote
    client's process cannot be probed from here, so a request made through the hub is attached
    to the *connection*: ``Proc(host="ws:<peer address>:<port>", boot=<hub boot>, pid=<the pid
    the client reports, a label for status displays>, start=0)``. That host never names a real
    host, so no probe ever finds it provably dead: such a request is reaped only by its TTL.
    When a connection closes, its leases are neither released nor cancelled: they stop being
    renewed and lapse one TTL after the last heartbeat. Releasing them on close would be faster
    for a client that crashed, but the hub cannot tell a crash from a network cut, and the
    client provider reconnects with backoff: a holder that comes back within its TTL re-attaches
    its grant with the next heartbeat (through the new connection) and keeps its fencing token
    and its work, and a waiter keeps its place in the queue. A crashed remote client then holds
    its resources for at most one TTL, exactly like an embedded holder on another host. Fenced
    writes are checked against the lease table at write time, so a lapsed lease can never be
    written under.
    """
    host = _PEERS.get(ctx.conn)
    if host is None:
        address: Any = getattr(getattr(ctx.conn, "ws", None), "remote_address", None)
        if isinstance(address, tuple) and len(address) >= 2:
            host = f"ws:{address[0]}:{address[1]}"
        else:
            host = f"ws:connection-{id(ctx.conn):x}"
        _PEERS[ctx.conn] = host
    return Proc(host, this_proc().boot, pid or 0, 0)


def lease_state_json(state: LeaseState) -> JsonValue:
    """A lease state as the JSON a client gets (without the hub host's pids to watch)."""
    out: dict[str, JsonValue] = state.model_dump(mode="json")
    out["watch_pids"] = []
    return out


@op("lease.request", write=True)
async def _request(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    p = _parse(RequestParams, "lease.request", params)
    tenant = _tenant(ctx, p)
    resources = canonical_resources(p.resources)
    ttl, key = check_ttl(p.ttl), check_key(p.key)
    owner = check_owner(ctx.claims.agent)
    state = await _backend(ctx).request(
        tenant, owner, resources, ttl=ttl, key=key, proc=connection_proc(ctx, p.pid), wait=p.wait
    )
    metrics_of(ctx.hub).lease_state(state)
    return lease_state_json(state)


@op("lease.heartbeat", write=True)
async def _heartbeat(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    p = _parse(HeartbeatParams, "lease.heartbeat", params)
    tenant = _tenant(ctx, p)
    state = await _backend(ctx).heartbeat(
        tenant, p.lease_id, ctx.claims.agent, connection_proc(ctx, p.pid)
    )
    metrics_of(ctx.hub).lease_state(state)
    return lease_state_json(state)


@op("lease.release", write=True)
async def _release(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    p = _parse(ReleaseParams, "lease.release", params)
    await _backend(ctx).release(_tenant(ctx, p), p.lease_id, ctx.claims.agent, p.token)
    metrics_of(ctx.hub).lease_gone(p.lease_id)
    return None


@op("lease.cancel", write=True)
async def _cancel(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    p = _parse(CancelParams, "lease.cancel", params)
    removed = await _backend(ctx).cancel(_tenant(ctx, p), p.lease_id, ctx.claims.agent)
    return {"removed": removed}


@op("lease.status")
async def _status(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    p = _parse(StatusParams, "lease.status", params)
    status = await _backend(ctx).status(_tenant(ctx, p))
    out: JsonValue = status.model_dump(mode="json")
    return out


@op("lease.check")
async def _check(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    p = _parse(CheckParams, "lease.check", params)
    tenant = _tenant(ctx, p)
    (resource,) = canonical_resources([p.resource])
    await _backend(ctx).check(tenant, p.lease_id, resource, p.token)
    return None


@op("lease.reap")
async def _reap(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    _parse(ReapParams, "lease.reap", params)
    reaped = await _backend(ctx).reap()
    metrics_of(ctx.hub).leases_reaped(reaped)
    return {"reaped": reaped}
