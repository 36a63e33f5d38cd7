"""The hub's redaction op: ``store.redact`` of a ``ws://`` store, performed by the hub.

::

    run.redact {collection: str, key?: str, field?: str, index?: int, span?: [start, end],
                reason?: str}                 -> CompactionResult (as JSON)      (write)

The hub runs :meth:`crdtstore.Store.redact` on its own (backing) store, for the connection's
run, as the token's agent (``agent`` of the client's call is not taken): the value is deleted
through a record, every journal entry that held it is rewritten in place, a ``redact`` entry
is appended and the run compacted. The run's hub record and its connections drop the value as
they do any delete: crdtstore clients read the new entries (head push), plain Yjs clients get
the delete as an update. Only a token with the ``redact`` right (:class:`TokenClaims`) may
redact: any other is refused with ``FORBIDDEN`` (``READ_ONLY`` for a read-only one) before
anything is read or written. Bad params are refused as the store refuses them
(``INVALID_VALUE``, ``INVALID_NAME``, ``UNKNOWN_RUN``, ...); an index or span out of range
with ``INDEX_OUT_OF_RANGE``, which the client raises as the ``IndexError`` a local store raises.
"""

from __future__ import annotations

import logging
import weakref
from typing import Annotated, Final

import anyio
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from crdtstore import CrdtStoreError, InvalidValue

from ._ops import OpContext, op
from ._redact_rpc import INDEX_OUT_OF_RANGE, REDACT_OP
from ._tokens import Forbidden

__all__ = ["MAX_REASON", "REDACT_OP", "RedactParams"]

log = logging.getLogger("sync.hub")

MAX_REASON: Final = 1024  # characters of a redaction's reason

_Int = Annotated[int, Field(strict=True)]
_Str = Annotated[str, Field(strict=True, max_length=4096)]


class RedactParams(BaseModel):
    """``run.redact``'s params: the value, named as ``Store.redact`` names it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    collection: _Str
    key: _Str | None = None
    field: _Str | None = None
    index: _Int | None = None
    span: Annotated[list[_Int], Field(min_length=2, max_length=2)] | None = None
    reason: Annotated[str, Field(strict=True, max_length=MAX_REASON)] = ""


class _OutOfRange(CrdtStoreError):
    """The wire form of the ``IndexError`` of an index or span out of range."""

    code = INDEX_OUT_OF_RANGE


# One redaction at a time per loaded run: each rewrites entries the next one reads again.
_LOCKS: weakref.WeakKeyDictionary[object, anyio.Lock] = weakref.WeakKeyDictionary()


@op(REDACT_OP, write=True)
async def _redact(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    if not ctx.claims.redact:
        raise Forbidden(
            f"the token of agent {ctx.claims.agent!r} does not grant redaction "
            "(a token minted with redact=True does)"
        )
    try:
        p = RedactParams.model_validate(params)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "params"
        raise InvalidValue(f"{REDACT_OP}: {loc}: {first['msg']}") from None
    lock = _LOCKS.setdefault(ctx.conn.room, anyio.Lock())
    async with lock:
        # what the hub's record holds (plain Yjs clients' updates) is journaled first: the
        # redaction reads the journal, and must find the value wherever it was written
        await ctx.rec.flush()
        try:
            result = await ctx.store.redact(
                ctx.run,
                p.collection,
                p.key,
                field=p.field,
                index=p.index,
                span=None if p.span is None else (p.span[0], p.span[1]),
                agent=ctx.claims.agent,
                reason=p.reason,
            )
        except IndexError as exc:
            raise _OutOfRange(str(exc)) from None
    where = p.key if p.index is None and p.span is None else (p.index, p.span)
    log.info(  # (never the value: only where it was)
        "%s/%s: %s redacted %s %r%s (%s)",
        ctx.tenant,
        ctx.run,
        ctx.claims.agent,
        p.collection,
        where,
        "" if p.field is None else f" field {p.field!r}",
        p.reason,
    )
    # the hub's record of the run has applied the delete (and sent it to the run's plain Yjs
    # connections) before the answer
    await ctx.rec.sync()
    out: JsonValue = result.model_dump(mode="json")
    return out
