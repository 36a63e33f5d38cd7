"""Journal rows, entries and runs as the journal ops carry them in JSON (``sync._ops_journal``):
base64 update bytes, rows as lists (a tenth item, the call id, only when set)."""

from __future__ import annotations

import base64
from typing import Any

from pydantic import JsonValue

from crdtstore import BackendError
from crdtstore.backend import NewEntry, Row, RunRow

__all__ = ["_b64", "_entry_json", "_row", "_run_row"]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _row(item: Any) -> Row:
    try:
        # a tenth item, the call id, only when the entry has one (see sync._ops_journal)
        seq, agent, source, client_id, wall, update, effect, crc, origin, *rest = item
        if len(rest) > 1 or (rest and type(rest[0]) is not str):
            raise ValueError(f"a row has 9 or 10 items, the last a call id: {item!r}"[:200])
        return Row(
            int(seq),
            str(agent),
            str(source),
            int(client_id),
            float(wall),
            base64.b64decode(update),
            list(effect),
            int(crc),
            str(origin),
            rest[0] if rest else "",
        )
    except (TypeError, ValueError) as exc:
        raise BackendError("ws", f"malformed journal row from the hub: {exc}") from None


def _entry_json(entry: NewEntry) -> JsonValue:
    """An entry as ``journal.append`` sends it: the update and the client id, and the call id
    when it has one (the hub decides agent, source, time and effect itself)."""
    out: dict[str, JsonValue] = {"update": _b64(entry.update), "client_id": entry.client_id}
    if entry.call:
        out["call"] = entry.call
    return out


def _run_row(item: Any) -> RunRow:
    if not isinstance(item, dict):
        raise BackendError("ws", f"malformed run from the hub: {item!r}")
    try:
        return RunRow(**item)
    except TypeError as exc:
        raise BackendError("ws", f"malformed run from the hub: {exc}") from None
