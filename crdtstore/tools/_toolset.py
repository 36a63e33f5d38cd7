"""The record as tools an LLM agent calls: :class:`Toolset`.

A toolset is bound to one open :class:`~crdtstore.Record` (one agent), optionally restricted
to a slice (a :class:`~crdtstore.View`). ``await toolset.call(name, arguments)`` validates the
arguments against the tool's pydantic model, runs it and returns a JSON-ready dict; expected
failures come back as ``{"error": {"code": ..., "message": ...}}`` and change nothing.

Writes are journaled before a tool returns (the result carries the new version to echo back),
take in other writers' entries first where a read decides something, and carry the toolset's
source kind and the caller's tool-call id into the journal (``Record.attributed``). Leases and
claims taken through the tools are held by the toolset between calls, renewed while held,
fence every write to a key they cover, and are released by :meth:`Toolset.aclose`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from .._errors import (
    CrdtStoreError,
    InvalidValue,
    LeaseHeld,
    LeaseTimeout,
    StoreClosed,
)
from .._journal import SOURCES
from .._leases import canonical_resource, canonical_resources, item_resource
from .._models import Version
from ..record import View
from . import _args as A
from ._edits import plan_edits
from ._reads import Reads
from ._results import (
    DEFAULT_MAX_RESULT_TOKENS,
    DEFAULT_PAGE_SIZE,
    ToolFailure,
    error_result,
    validation_errors,
)
from ._schemas import FORMATS, tool_annotations, tool_schema

if TYPE_CHECKING:
    from .._leases import Lease
    from ..record import Claim, Record

MAX_ARGUMENT_BYTES = 1_000_000


class Toolset(Reads):
    """The agent tools (``store_get``, ``store_put``, ...) bound to an open record.

    Args:
        rec: the record, opened as the agent whose tools these are.
        view: restrict every tool to a slice: a :class:`~crdtstore.View` of ``rec`` or its
            paths (``["findings/net/*", "log"]``); None for the whole record.
        source: the source kind every write carries (``tool``, ``model``, ``user``,
            ``system``). Through a hub the token's source is journaled instead.
        read_only: refuse every tool that changes the record or takes a lease (READ_ONLY).
        max_result_tokens: the estimated size a result is cut to (pages, chunks).
        page_size: the most items one page of a collection lists.

    Raises:
        InvalidValue: an unknown source kind, or a bad budget.
        PolicyViolation, InvalidName: a malformed view path.
    """

    def __init__(
        self,
        rec: Record,
        view: View | Iterable[str] | None = None,
        source: str = "model",
        read_only: bool = False,
        *,
        max_result_tokens: int = DEFAULT_MAX_RESULT_TOKENS,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> None:
        if source not in SOURCES:
            raise InvalidValue(f"source must be one of {sorted(SOURCES)}, not {source!r}")
        if type(max_result_tokens) is not int or max_result_tokens < 100:
            raise InvalidValue(f"max_result_tokens must be an int >= 100: {max_result_tokens!r}")
        if type(page_size) is not int or page_size < 1:
            raise InvalidValue(f"page_size must be an int >= 1, not {page_size!r}")
        if isinstance(view, str):
            raise InvalidValue("view is a list of paths (or a View), not one string")
        self.record = rec
        self.view: View | None = (
            view if isinstance(view, View) or view is None else rec.view(list(view))
        )
        self.source = source
        self.read_only = bool(read_only)
        self.max_result_tokens = max_result_tokens
        self.page_size = page_size
        self._leases: dict[str, Lease] = {}
        self._claims: dict[tuple[str, str], Claim] = {}
        self._lent: dict[str, Lease] = {}  # leases the caller owns (fence_with)
        self._closed = False

    # -- the tool list --------------------------------------------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        """The tools' names (a contract: they never change)."""
        return A.TOOL_NAMES

    def schemas(self, format: str = "openai") -> list[dict[str, Any]]:
        """Every tool in a vendor's format: ``openai`` (function tools), ``anthropic``
        (``input_schema``) or ``mcp`` (``inputSchema``).

        Raises:
            InvalidValue: an unknown format.
        """
        if format not in FORMATS:
            raise InvalidValue(f"format must be one of {list(FORMATS)}, not {format!r}")
        return [tool_schema(spec, format) for spec in A.TOOLS.values()]

    @staticmethod
    def annotations(name: str) -> dict[str, bool]:
        """MCP hints for tool ``name`` (``readOnlyHint``, ``destructiveHint``, ...)."""
        return tool_annotations(A.TOOLS[name])

    @staticmethod
    def is_error(result: Mapping[str, Any]) -> bool:
        """Whether a result is a structured error."""
        return "error" in result

    # -- dispatch -------------------------------------------------------------------------------

    async def call(
        self, name: str, arguments: Mapping[str, Any] | str | bytes | None = None,
        *, call_id: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Run tool ``name`` with ``arguments`` (a dict, or its JSON text) and return the
        result. Expected failures are returned as ``{"error": {...}}``, never raised, and a
        refused call writes nothing. ``call_id`` (the model's tool-call id) is journaled with
        every write the call makes."""
        spec = A.TOOLS.get(name) if isinstance(name, str) else None
        if spec is None:
            return _failure(
                "UNKNOWN_TOOL", f"no tool named {str(name)[:80]!r}", tools=list(A.TOOL_NAMES)
            )
        try:
            args = spec.args.model_validate(_arguments(arguments))
        except ToolFailure as exc:
            return {"error": exc.error}
        except ValidationError as exc:
            return _failure(
                "INVALID_ARGUMENTS",
                f"arguments of {name} do not match its schema: {_first_error(exc)}",
                errors=validation_errors(exc),
            )
        if self._closed:
            return error_result(StoreClosed("toolset"))
        if spec.writes and self.read_only:
            return _failure(
                "READ_ONLY",
                f"{name} changes the record; this agent's tools are read-only",
                tool=name, run=self.record.run,
            )  # fmt: skip
        run = getattr(self, f"_{name}")
        try:
            if spec.writes:
                with self.record.attributed(source=self.source, call=call_id):
                    result: dict[str, Any] = await run(args)
            else:
                result = await run(args)
        except ToolFailure as exc:
            return {"error": exc.error}
        except CrdtStoreError as exc:
            return error_result(exc)
        return result

    def fence_with(self, lease: Lease) -> None:
        """Fence every write of the tools to a key ``lease`` covers, as if the agent had taken
        it with ``lease_acquire``; the caller keeps owning it (``aclose`` does not release
        it). How a kernel hands a step's file lease to the step's tools."""
        self._lent[lease.lease_id] = lease

    async def aclose(self) -> None:
        """Release every claim and lease the toolset took (not those lent by
        :meth:`fence_with`). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._lent.clear()
        claims, self._claims = list(self._claims.values()), {}
        leases, self._leases = list(self._leases.values()), {}
        for claim in claims:
            try:
                await claim.release()
            except CrdtStoreError:
                await claim.lease.release()  # lost already, or the record is closed
        for lease in leases:
            await lease.release()

    async def __aenter__(self) -> Toolset:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- helpers --------------------------------------------------------------------------------

    def _fence(self, collection: str, key: str) -> Lease | None:
        """The held lease (or claim) covering ``collection[key]``, if any: the write is fenced
        by it, so a lease lost meanwhile refuses the write (LEASE_LOST)."""
        if not self._leases and not self._claims and not self._lent:
            return None
        wanted: set[str] = set()
        with contextlib.suppress(CrdtStoreError):
            wanted.add(canonical_resource(key))  # the key as a repo path
        with contextlib.suppress(CrdtStoreError):
            wanted.add(item_resource(collection, key))  # the key as a work item
        held = [*self._leases.values(), *self._lent.values()]
        for lease in [*held, *(c.lease for c in self._claims.values())]:
            if wanted.intersection(lease.resources):
                return lease
        return None

    async def _held(self, exc: LeaseHeld | LeaseTimeout, resources: Iterable[str]) -> ToolFailure:
        """LEASE_HELD with who holds the resources and how many wait for them."""
        wanted = set(resources)
        status = await self._store.leases.status(reap=False)
        holders = [
            {"owner": h.owner, "resources": list(h.resources), "token": h.token,
             "expires_in": round(h.expires_in, 3)}
            for h in status.holders if wanted.intersection(h.resources)
        ]  # fmt: skip
        waiting = sum(1 for w in status.waiters if wanted.intersection(w.resources))
        fields = exc.to_dict()
        fields.pop("code", None)
        message = str(fields.pop("message", exc))
        if isinstance(exc, LeaseTimeout):
            message = f"still held after waiting {exc.waited:.1f} s: {message}"
        if "holder" not in fields and holders:
            fields["holder"] = holders[0]["owner"]
        return ToolFailure(
            "LEASE_HELD", message, **fields, holders=holders, waiting=waiting,
            queue_position=waiting + 1,
        )  # fmt: skip

    # -- writes ---------------------------------------------------------------------------------

    async def _store_put(self, a: A.StorePut) -> dict[str, Any]:
        self._see(a.collection, a.key)
        rec = self.record
        m = rec.map(a.collection)
        await rec.sync()  # policies and budgets decide on what others wrote, too
        based = None if a.based_on is None else Version(scope=a.collection, seq=a.based_on)
        await m.set(
            a.key, a.value, expected_version=a.expected_version, based_on=based,
            lease=self._fence(a.collection, a.key),
        )  # fmt: skip
        await rec.flush()
        return self._written(a.collection, a.key)

    async def _store_delete(self, a: A.StoreDelete) -> dict[str, Any]:
        self._see(a.collection, a.key)
        rec = self.record
        await rec.sync()  # "deleted" must tell whether the entry was there, not in this replica
        existed = await rec.map(a.collection).delete(
            a.key, expected_version=a.expected_version, lease=self._fence(a.collection, a.key)
        )
        await rec.flush()
        out = self._written(a.collection, a.key)
        out["deleted"] = existed
        return out

    def _written(self, collection: str, key: str) -> dict[str, Any]:
        return {
            "ok": True,
            "collection": collection,
            "key": key,
            "version": self.record.version(collection, key) or 0,
            "collection_version": self._coll_version(collection),
        }

    async def _store_append(self, a: A.StoreAppend) -> dict[str, Any]:
        self._see_all(a.collection)
        rec = self.record
        lst = rec.list(a.collection)
        await rec.sync()  # append after what others appended so far, not beside it
        await lst.append(a.value)
        await rec.flush()
        return {
            "ok": True,
            "collection": a.collection,
            "collection_version": self._coll_version(a.collection),
        }

    async def _store_text_edit(self, a: A.StoreTextEdit) -> dict[str, Any]:
        self._see_all(a.collection)
        rec = self.record
        text = rec.text(a.collection)
        await rec.sync()  # edit what is there now, not what this replica saw last
        before = text.read()
        after = plan_edits(before, a.edits, self._coll_version(a.collection))
        await text.edit(after)  # one write: the minimal character edits, checked as one
        await rec.flush()
        return {
            "ok": True,
            "collection": a.collection,
            "edits": len(a.edits),
            "length": len(after),
            "collection_version": self._coll_version(a.collection),
        }

    # -- claims and leases ----------------------------------------------------------------------

    async def _store_claim(self, a: A.StoreClaim) -> dict[str, Any]:
        self._see(a.collection, a.item)
        held = self._claims.get((a.collection, a.item))
        if held is None or not held.lease.granted:
            resource = item_resource(a.collection, a.item)
            try:
                held = await self.record.claim(a.collection, a.item, ttl=a.ttl)
            except LeaseHeld as exc:
                refusal = await self._held(exc, [resource])
                prior = self.record.map("claims").get(f"{a.collection}/{a.item}")
                if isinstance(prior, dict) and prior.get("state") == "done":
                    refusal.error.update(
                        message=f"{a.collection}/{a.item} is done (by {prior.get('claimer')!r})",
                        state="done", result=prior.get("result"),
                    )  # fmt: skip
                raise refusal from None
            self._claims[(a.collection, a.item)] = held
        await self.record.flush()
        return {
            "ok": True,
            "collection": a.collection,
            "item": a.item,
            "token": held.token,
            "ttl": held.lease.ttl,
        }

    def _claim_of(self, collection: str, item: str) -> Claim:
        claim = self._claims.pop((collection, item), None)
        if claim is None:
            raise ToolFailure(
                "LEASE_NOT_FOUND",
                f"this agent holds no claim on {collection}/{item}: store_claim it first",
                collection=collection, item=item,
            )  # fmt: skip
        return claim

    async def _store_complete(self, a: A.StoreComplete) -> dict[str, Any]:
        claim = self._claim_of(a.collection, a.item)
        await claim.complete(a.result)
        await self.record.flush()
        return {"ok": True, "collection": a.collection, "item": a.item, "state": "done"}

    async def _store_release(self, a: A.StoreRelease) -> dict[str, Any]:
        claim = self._claim_of(a.collection, a.item)
        await claim.release()
        await self.record.flush()
        return {"ok": True, "collection": a.collection, "item": a.item, "state": "released"}

    async def _lease_acquire(self, a: A.LeaseAcquire) -> dict[str, Any]:
        wanted = set(canonical_resources(a.resources))
        for lid, mine in self._leases.items():
            if wanted.intersection(mine.resources):  # waiting for itself would time out
                raise ToolFailure(
                    "LEASE_HELD",
                    f"this agent holds {sorted(wanted.intersection(mine.resources))} already"
                    f" (lease {lid}): release it first, or use it",
                    holder=self.record.agent, lease_id=lid, resources=list(mine.resources),
                )  # fmt: skip
        lease = self._store.lease(
            a.resources, ttl=a.ttl, owner=self.record.agent, wait=a.wait_seconds > 0,
            timeout=a.wait_seconds if a.wait_seconds > 0 else None,
        )  # fmt: skip
        try:
            await lease.acquire()
        except (LeaseHeld, LeaseTimeout) as exc:
            raise await self._held(exc, lease.resources) from None
        self._leases[lease.lease_id] = lease
        return {
            "ok": True,
            "lease_id": lease.lease_id,
            "resources": list(lease.resources),
            "token": lease.token,
            "ttl": lease.ttl,
            "waited": round(lease.waited, 3),
        }

    async def _lease_release(self, a: A.LeaseRelease) -> dict[str, Any]:
        lease = self._leases.pop(a.lease_id, None)
        if lease is None:
            raise ToolFailure(
                "LEASE_NOT_FOUND", f"this agent holds no lease {a.lease_id[:80]!r}",
                held=list(self._leases),
            )  # fmt: skip
        await lease.release()
        return {"ok": True, "lease_id": a.lease_id, "released": list(lease.resources)}


# -- pure helpers --------------------------------------------------------------------------------


def _failure(code: str, message: str, **fields: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **fields}}


def _arguments(arguments: Mapping[str, Any] | str | bytes | None) -> Any:
    if arguments is None:
        return {}
    if isinstance(arguments, (str, bytes)):
        if len(arguments) > MAX_ARGUMENT_BYTES:
            raise ToolFailure(
                "PAYLOAD_TOO_LARGE", f"arguments over {MAX_ARGUMENT_BYTES} bytes",
                limit=MAX_ARGUMENT_BYTES,
            )  # fmt: skip
        try:
            arguments = json.loads(arguments)
        except (ValueError, UnicodeError) as exc:
            raise ToolFailure("INVALID_ARGUMENTS", f"arguments are not JSON: {exc}") from None
    if not isinstance(arguments, Mapping):
        raise ToolFailure(
            "INVALID_ARGUMENTS", f"arguments must be a JSON object, not {type(arguments).__name__}"
        )
    return dict(arguments)


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    if not errors:
        return str(exc)
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"]) or "arguments"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{loc}: {first['msg']}{more}"
