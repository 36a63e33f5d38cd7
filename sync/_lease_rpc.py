"""The client side of the hub's lease ops: :class:`RemoteLeases`, a lease backend whose table
is the hub's (the lease table of the store the hub serves).

::

    leases = RemoteLeases(call)   # call(op, params) -> result, raising the hub's errors
    state = await leases.request("acme", "me", ("src/a.py",), ttl=30, key=None,
                                 proc=this_proc(), wait=False)

A lease backend rather than a lease layer of its own, so that ``store.leases``,
``store.lease(...)`` and ``rec.claim(...)`` work on a ``ws://`` store unchanged; what differs
from an embedded backend (owner, tenant, liveness, wake-ups) is in :class:`RemoteLeases`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, JsonValue, ValidationError

from crdtstore import BackendError, CrdtStoreError, StoreClosed
from crdtstore.backend import (
    LeaseBackend,
    LeaseState,
    LeaseStatus,
    Proc,
    check_ttl,
    error_from_dict,
)

from ._messages import ErrorInfo, Response

__all__ = ["Call", "RemoteLeases", "error_from_info", "result_or_raise"]

Call = Callable[[str, dict[str, JsonValue]], Awaitable[JsonValue]]
"""``await call(op, params)``: the result of the hub's op, or its error raised."""

M = TypeVar("M", bound=BaseModel)


def error_from_info(info: ErrorInfo) -> CrdtStoreError:
    """The crdtstore error a hub's error response stands for: the class of its ``code``
    with the same message and fields (a plain ``CrdtStoreError`` carrying the code for a
    code without a class, e.g. ``UNSUPPORTED_OP``)."""
    return error_from_dict({**info.details, "code": info.code, "message": info.message})


def result_or_raise(response: Response) -> JsonValue:
    """The result of ``response``, or its error raised as a crdtstore error."""
    if response.error is not None:
        raise error_from_info(response.error)
    return response.result


def _model(model: type[M], op: str, result: Any) -> M:
    try:
        return model.model_validate(result)
    except ValidationError as exc:
        raise BackendError(
            "ws leases", f"malformed {op} result: {exc.errors()[0]['msg']}"
        ) from None


class RemoteLeases(LeaseBackend):
    """Leases kept by the hub, reached through ``call``.

    ``store.leases`` / ``store.lease(...)`` / ``rec.claim(...)`` work on top of it unchanged:
    the ``Lease`` object waits by heartbeats and renews the grant every ``ttl/3``, each a
    request to the hub. What differs from an embedded backend (see :mod:`sync._ops_leases`):

    - **the owner is the token's agent.** The ``owner`` arguments are not sent: the hub takes
      the owner from the connection's token, so ``LeaseState.owner`` and the holders in
      ``status`` name the agent, whatever owner the caller chose;
    - the ``tenant`` argument is sent and checked by the hub: a tenant other than the token's is
      refused (``FORBIDDEN``);
    - of ``proc`` only the pid is sent (a label in ``status``): the hub attaches the request to
      the connection, and a remote holder lapses by its TTL only (never "provably dead"), also
      when its connection closes;
    - a waiter is woken at once by releases made through this backend (``on_change`` fires after
      them) and by the hub's lease push (``{"push": "leases"}``, sent on every lease change the
      hub's store sees: other clients' releases, embedded processes' on the same SQLite file,
      reaps), which the transport passes to :meth:`RemoteLeases.pushed`. A push is a hint: if
      one is lost, a waiter still re-checks at its heartbeat (``ttl/3``), at the earliest
      deadline ahead of it (``wake_in``), or after the lease layer's fallback poll (2 s).

    ``call`` is the transport (bound by the ``ws://`` provider to its connection): it sends the
    request and returns the response's ``result``, or raises the crdtstore error the hub
    answered (:func:`result_or_raise` and :func:`error_from_info` rebuild one from a
    ``Response``). A result that does not have the expected shape raises ``BackendError``.
    """

    name = "ws"
    # Lease.release shields its backend call itself: a request in flight cannot be taken back
    shields_cleanup = False

    def __init__(self, call: Call) -> None:
        self._call = call
        self._closed = False

    def _changed(self) -> None:
        # a removal may have granted a waiter of this store: wake its waiters now
        if self.on_change is not None:
            self.on_change()

    def pushed(self) -> None:
        """The hub says the tenant's leases changed: wake this store's waiters (they ask the
        hub again)."""
        if not self._closed:
            self._changed()

    async def _do(self, op: str, params: dict[str, JsonValue]) -> JsonValue:
        if self._closed:
            raise StoreClosed("lease backend")
        return await self._call(op, params)

    async def open(self) -> None:
        self._closed = False

    async def aclose(self) -> None:
        self._closed = True

    async def request(
        self,
        tenant: str,
        owner: str,
        resources: tuple[str, ...],
        *,
        ttl: float,
        key: tuple[str, int] | None,
        proc: Proc,
        wait: bool,
    ) -> LeaseState:
        """Queue a request as the token's agent (``owner`` is not sent); see
        :meth:`LeaseBackend.request`."""
        params: dict[str, JsonValue] = {
            "tenant": tenant,
            "resources": list(resources),
            "ttl": check_ttl(ttl),  # also keeps NaN and infinities, which JSON lacks, off the wire
            "key": None if key is None else [key[0], key[1]],
            "wait": wait,
            "pid": proc.pid,
        }
        return _model(LeaseState, "lease.request", await self._do("lease.request", params))

    async def heartbeat(self, tenant: str, lease_id: str, owner: str, proc: Proc) -> LeaseState:
        params: dict[str, JsonValue] = {"tenant": tenant, "lease_id": lease_id, "pid": proc.pid}
        return _model(LeaseState, "lease.heartbeat", await self._do("lease.heartbeat", params))

    async def release(self, tenant: str, lease_id: str, owner: str, token: int | None) -> None:
        params: dict[str, JsonValue] = {"tenant": tenant, "lease_id": lease_id, "token": token}
        await self._do("lease.release", params)
        self._changed()

    async def cancel(self, tenant: str, lease_id: str, owner: str) -> bool:
        result = await self._do("lease.cancel", {"tenant": tenant, "lease_id": lease_id})
        removed = result.get("removed") if isinstance(result, dict) else None
        if not isinstance(removed, bool):
            raise BackendError("ws leases", f"malformed lease.cancel result: {result!r}")
        if removed:
            self._changed()
        return removed

    async def reap(self) -> int:
        result = await self._do("lease.reap", {})
        reaped = result.get("reaped") if isinstance(result, dict) else None
        if not isinstance(reaped, int) or isinstance(reaped, bool):
            raise BackendError("ws leases", f"malformed lease.reap result: {result!r}")
        if reaped:
            self._changed()
        return reaped

    async def status(self, tenant: str) -> LeaseStatus:
        return _model(
            LeaseStatus, "lease.status", await self._do("lease.status", {"tenant": tenant})
        )

    async def check(self, tenant: str, lease_id: str, resource: str, token: int) -> None:
        params: dict[str, JsonValue] = {
            "tenant": tenant,
            "lease_id": lease_id,
            "resource": resource,
            "token": token,
        }
        await self._do("lease.check", params)
