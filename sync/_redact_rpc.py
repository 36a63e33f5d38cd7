"""Redaction over the wire, the client's side: ``store.redact`` of a ``ws://`` store sends the
op ``run.redact`` and the hub redacts on its own store (:mod:`sync._ops_redact`).

Why it is shaped so: a redaction rewrites journal entries of other agents, which a client is
not trusted to do (it could rewrite anything); the hub performs it, as the token's agent, and
only for a token with the ``redact`` right. The errors are the local store's: the hub answers
with their codes; an index or span out of range travels as ``INDEX_OUT_OF_RANGE`` (an
``IndexError`` is no crdtstore error) and is raised as the ``IndexError`` a local store raises.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from pydantic import JsonValue, ValidationError

from crdtstore import BackendError, CompactionResult, CrdtStoreError

if TYPE_CHECKING:
    from crdtstore.backend import Row

    from ._link import _Link

__all__ = ["INDEX_OUT_OF_RANGE", "REDACT_OP", "forget_redacted", "request_redact"]

REDACT_OP: Final = "run.redact"
INDEX_OUT_OF_RANGE: Final = "INDEX_OUT_OF_RANGE"


async def request_redact(
    call: Callable[[str, dict[str, JsonValue]], Awaitable[JsonValue]],
    collection: str,
    key: str | None,
    field: str | None,
    index: int | None,
    span: tuple[int, int] | None,
    reason: str,
) -> CompactionResult:
    """Ask the hub (``call(op, params)`` on the run's connection) to redact one value; the
    hub's compaction result. Not sent again when the answer is lost (an index names another
    item once one is gone): ``BackendError`` then.

    Raises:
        Forbidden: the token lacks the ``redact`` right (``ReadOnlyAccess``: read-only).
        IndexError: ``index`` or ``span`` out of range.
        BackendError: the connection was lost before the answer, or a malformed answer.
    """
    params: dict[str, JsonValue] = {"collection": collection, "reason": reason}
    named: dict[str, JsonValue] = {
        "key": key,
        "field": field,
        "index": index,
        "span": None if span is None else [span[0], span[1]],
    }
    params.update({k: v for k, v in named.items() if v is not None})
    try:
        got = await call(REDACT_OP, params)
    except CrdtStoreError as exc:
        if exc.code == INDEX_OUT_OF_RANGE:
            raise IndexError(str(exc)) from None
        raise
    try:
        return CompactionResult.model_validate(got)
    except ValidationError:
        raise BackendError("ws", f"malformed {REDACT_OP} answer {got!r}") from None


def forget_redacted(link: _Link, rows: list[Row]) -> list[Row]:
    """``rows`` (what a read answers); when one is a ``redact`` entry, the entries the link
    kept from pushes up to it are dropped: a redaction rewrote entries before it, and those
    kept may hold the value's old bytes (a later read of them asks the hub)."""
    for row in rows:
        if any(len(op) > 2 and op[2] == "redact" for op in row.effect):
            link._trim(row.seq)
    return rows
