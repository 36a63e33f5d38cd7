"""The effect of an update made outside the typed API, from pycrdt's events.

Observers that turn a map, list or text event into crdtstore ops (text indices in characters,
as the typed API's, where pycrdt counts UTF-8 bytes), and the small pure helpers of
:meth:`~crdtstore.record.Replica.apply_external`. No document state.
"""

from __future__ import annotations

import base64
import inspect
from collections.abc import Callable
from typing import Any

from .._errors import InvalidName
from .._journal import Op
from .._names import check_name


def policed(ops: list[Op]) -> list[Op]:
    """The part of an external update's effect (:meth:`Replica.apply_external`) that write
    policies and budgets judge: list and text inserts are left out. Their index is where the
    items landed in this document, and an append made concurrently elsewhere (legal under
    ``append_only``) lands anywhere among this replica's own appends, so an insert cannot be
    told from an append by it (the items' origins could tell; not implemented). Deletes and
    map ops are judged as usual."""
    return [op for op in ops if op[0] == "map" or op[2] != "ins"]


def _plain(value: Any) -> Any:
    """A value read from the document, as JSON (a nested shared type, which only a foreign
    client writes, as its Python form; binary content, which only a foreign client writes,
    as ``{"$bytes": "<base64>"}``: an effect is journaled as JSON)."""
    to_py = getattr(value, "to_py", None)
    if to_py is not None:
        value = to_py()
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict) and any(not _json_atom(v) for v in value.values()):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list) and any(not _json_atom(v) for v in value):
        return [_plain(v) for v in value]
    return value


def _json_atom(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _collection_name(name: str) -> bool:
    try:
        check_name("collection", name)
    except InvalidName:
        return False
    return True


# pycrdt's ``observe`` reads the callback's signature (``inspect.signature``: ~20 us, most of
# what subscribing costs); an effect observer carries it ready-made (one parameter: the event).
_EVENT_SIGNATURE = inspect.Signature(
    [inspect.Parameter("event", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
)


def _signed(on_event: Callable[[Any], None]) -> Callable[[Any], None]:
    on_event.__signature__ = _EVENT_SIGNATURE  # type: ignore[attr-defined]
    return on_event


def _map_effect(name: str, ops: list[Op]) -> Callable[[Any], None]:
    def on_event(event: Any) -> None:
        for key, change in event.keys.items():
            if change.get("action") == "delete":
                ops.append(["map", name, "del", key])
            else:
                ops.append(["map", name, "set", key, _plain(change.get("newValue"))])

    return _signed(on_event)


def _list_effect(name: str, ops: list[Op]) -> Callable[[Any], None]:
    def on_event(event: Any) -> None:
        at = 0
        for d in event.delta:
            if "retain" in d:
                at += d["retain"]
            elif "insert" in d:
                values = [_plain(v) for v in d["insert"]]
                ops.append(["list", name, "ins", at, values])
                at += len(values)
            elif "delete" in d:
                ops.append(["list", name, "del", at, d["delete"]])

    return _signed(on_event)


def _text_effect(
    name: str, ops: list[Op], old: tuple[str, int], after: dict[str, tuple[str, int] | None]
) -> Callable[[Any], None]:
    """Text ops in characters from a TextEvent delta, which counts UTF-8 bytes (retained and
    deleted spans are spans of ``old``: the text before the update and its UTF-8 length);
    the text after it (and its length) goes to ``after[name]`` (None when the delta holds an
    embed, which ``str`` leaves out)."""

    def on_event(event: Any) -> None:
        text_before, size = old
        ascii_only = text_before.isascii()
        at = 0  # character index in the text as edited so far
        char = 0  # character index into the text before
        pieces: list[str] = []
        embed = False
        for d in event.delta:
            if "retain" in d:
                n = d["retain"]
                k = n if ascii_only else _chars_in(text_before, char, n)
                pieces.append(text_before[char : char + k])
                at += k
                char += k
            elif "insert" in d:
                text = d["insert"]
                if isinstance(text, str):
                    if text:
                        ops.append(["text", name, "ins", at, text])
                        pieces.append(text)
                        at += len(text)
                        size += len(text.encode())
                else:
                    embed = True
            elif "delete" in d:
                n = d["delete"]
                k = n if ascii_only else _chars_in(text_before, char, n)
                ops.append(["text", name, "del", at, k])
                char += k
                size -= n
        pieces.append(text_before[char:])
        after[name] = None if embed else ("".join(pieces), size)

    return _signed(on_event)


def _chars_in(text: str, start: int, size: int) -> int:
    """How many characters of ``text`` from ``start`` make ``size`` UTF-8 bytes."""
    head = text[start : start + size].encode()  # at most size characters, >= size bytes
    return len(head[:size].decode("utf-8", errors="ignore"))


# the value recorded for a nested shared type written as a map value that lost LWW
_EMPTY_OF: dict[str, Callable[[], Any]] = {"map": dict, "list": list, "text": str}


def _within(client: int, a: int, b: int, ranges: list[tuple[int, int, int]]) -> bool:
    """Whether clocks ``a .. b - 1`` of ``client`` all lie in ``ranges`` (``(client, start,
    end)``, each client's sorted)."""
    for c, start, end in ranges:
        if c == client and start <= a < end:
            a = end
    return a >= b
