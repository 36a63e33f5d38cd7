"""What tools return: JSON-ready values, structured errors, cursors and the token budget.

A result is a dict that ``json.dumps`` accepts as it is. An expected failure is the dict
``{"error": {"code": ..., "message": ..., ...}}`` built from the library's error (its
``to_dict()``), so a model sees the same stable codes as a Python caller. Pages are cut to
``max_result_tokens`` (estimated as compact-JSON bytes / 4, as ``Record.size`` does) and say
so with a ``next_cursor``; nothing is dropped without one.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from pydantic import BaseModel, ValidationError

from .._errors import CrdtStoreError, StaleVersion
from .._models import Conflict, Provenance
from .._semantics import BYTES_PER_TOKEN

DEFAULT_MAX_RESULT_TOKENS = 4_000
DEFAULT_PAGE_SIZE = 100


class ToolFailure(Exception):
    """Raised inside a tool to return ``{"error": error}``; never leaves the toolset."""

    def __init__(self, code: str, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.error: dict[str, Any] = {"code": code, "message": message, **fields}


def jsonable(value: Any) -> Any:
    """A stored or model value as plain JSON (models dumped, conflicts as their siblings)."""
    if isinstance(value, BaseModel):
        if isinstance(value, Conflict):
            return {"conflict": [jsonable(s) for s in value.siblings]}
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def provenance(p: Provenance | None) -> dict[str, Any] | None:
    """Who wrote a value, as JSON (its journal position is the entry's ``version``)."""
    if p is None:
        return None
    out = {"run": p.run, "agent": p.agent, "source": p.source, "wall_time": p.wall_time}
    if p.call is not None:
        out["call"] = p.call
    return out


def error_result(exc: CrdtStoreError) -> dict[str, Any]:
    """``{"error": ...}`` for a library error; a stale write also names what is current."""
    err: dict[str, Any] = {k: jsonable(v) for k, v in exc.to_dict().items()}
    if isinstance(err.get("errors"), list):  # pydantic's list: drop the documentation links
        err["errors"] = [
            {k: v for k, v in e.items() if k != "url"} if isinstance(e, dict) else e
            for e in err["errors"]
        ]
    if isinstance(exc, StaleVersion):
        err.pop("current_value", None)
        err["current"] = {
            "version": exc.current_version,
            "value": jsonable(exc.current_value),
        }
    return {"error": err}


def validation_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """pydantic's error list, JSON-safe (no exception objects in ``ctx``, no URLs)."""
    out: list[dict[str, Any]] = []
    for e in exc.errors(include_url=False):
        item: dict[str, Any] = {"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
        if "input" in e:
            item["input"] = _safe(e["input"])
        out.append(item)
    return out


def _safe(value: Any) -> Any:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return repr(value)[:200]
    return value


def tokens_of(value: Any) -> int:
    """Estimated model tokens of ``value`` as compact JSON."""
    return -(-len(dumps(value).encode()) // BYTES_PER_TOKEN)


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def encode_cursor(kind: str, position: Any, version: int) -> str:
    """An opaque cursor: where the next page starts, and the version of the first page."""
    raw = dumps([kind, position, version]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, kind: str) -> tuple[Any, int]:
    """``(position, version)`` of a cursor made by :func:`encode_cursor` for ``kind``.

    Raises:
        ToolFailure: INVALID_ARGUMENTS, for a cursor that is not one of ours for ``kind``.
    """
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        got = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if isinstance(got, list) and len(got) == 3 and got[0] == kind and isinstance(got[2], int):
            return got[1], got[2]
    except (ValueError, binascii.Error, UnicodeError):
        pass
    raise ToolFailure(
        "INVALID_ARGUMENTS",
        f"cursor {cursor[:40]!r} is not a `next_cursor` of a {kind} page; omit it to start over",
    )


class Page:
    """Items gathered under a token budget: ``add`` returns False once the next item would
    pass it (the first item always fits, or is refused by the caller as too large)."""

    def __init__(self, budget: int, overhead: int, limit: int = DEFAULT_PAGE_SIZE) -> None:
        self.items: list[Any] = []
        self.budget = budget
        self.used = overhead
        self.limit = limit
        self.reserve = 0  # room the page must keep if this item ends it (its cursor)

    def add(self, item: Any) -> bool:
        cost = tokens_of(item)
        over = self.used + cost + self.reserve > self.budget
        if self.items and (over or len(self.items) >= self.limit):
            return False
        self.items.append(item)
        self.used += cost
        return True
