"""Fuzz target: the lib0 / Yjs v1 decoder (crdtstore.codec).

Two modes, chosen by the low bit of the first byte:

- raw (even): the rest is untrusted bytes, read as an update, a delete set, a state vector,
  a varUint and an ``any`` value. Only ``CodecError`` (an ``InvalidUpdate``) may escape;
  what decodes re-encodes to the same bytes (state vectors, varUints: the decoder is
  canonical); ``skip_any`` and ``read_any`` agree; what ``decode_update`` reads,
  ``root_kinds`` reads too and names the same roots; ``check_update_counts`` passes every
  update that decodes.
- structured (odd): the rest drives edits of a pycrdt document (map sets and deletes, list
  and text inserts and deletes); its real update must decode, naming every key ever set,
  and its state vector must round trip.
"""

from __future__ import annotations

import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.fuzz._harness import instrumented, main

with instrumented():
    from pycrdt import Array, Doc, Map, Text

    from crdtstore import InvalidUpdate
    from crdtstore.codec import (
        CodecError,
        Decoder,
        check_update_counts,
        decode_delete_set,
        decode_state_vector,
        decode_update,
        decode_var_uint,
        encode_state_vector,
        encode_var_uint,
        root_kinds,
    )


def _raw(data: bytes) -> None:
    try:
        decoded = decode_update(data)
    except CodecError:
        decoded = None
    if decoded is not None:
        check_update_counts(data)  # (a decodable update passes the cheap pre-check)
        kinds = root_kinds(data)
        for entry in decoded.entries:
            assert entry.key is None or isinstance(entry.parent, (str, tuple)), entry
            if isinstance(entry.parent, str):
                assert "map" in kinds[entry.parent], (entry, kinds)
        if decoded.others is not None:
            assert decoded.others <= kinds.keys(), (decoded.others, kinds)
        for client, clock, length in decoded.deletes:
            assert client >= 0 and clock >= 0 and length >= 0
    else:
        with suppress(CodecError):
            check_update_counts(data)
        with suppress(CodecError):
            root_kinds(data)
    with suppress(CodecError):
        decode_delete_set(data)
    try:
        sv = decode_state_vector(data)
    except CodecError:
        pass
    else:
        assert encode_state_vector(sv) == data, (sv, data)
    try:
        n = decode_var_uint(data)
    except CodecError:
        pass
    else:
        assert encode_var_uint(n) == data
    _any(data)


def _any(data: bytes) -> None:
    read, skipped = Decoder(data), Decoder(data)
    try:
        value: Any = read.read_any()
    except CodecError as exc:
        failed: CodecError | None = exc
    else:
        failed = None
    try:
        skipped.skip_any()
    except CodecError:
        assert failed is not None, f"skip_any refused what read_any read: {value!r}"
        assert read.pos == 0 and skipped.pos == 0, "a failed read moved the position"
        return
    assert failed is None, f"read_any refused what skip_any skipped: {failed}"
    assert read.pos == skipped.pos, (read.pos, skipped.pos)


def _text(data: bytes, pos: int) -> str:
    return data[pos : pos + 3].decode("utf-8", "replace") or "k"


def _structured(data: bytes) -> None:
    doc: Doc[Any] = Doc(client_id=7 + data[0] if data else 7)
    m = doc.get("m", type=Map)
    arr = doc.get("a", type=Array)
    txt = doc.get("t", type=Text)
    keys: set[str] = set()
    values: list[Any] = [None, True, 1.5, -3, "s", "é€😀", [1, "x"], {"n": {"d": [None]}}]
    for i in range(1, min(len(data), 96), 3):
        op, arg, extra = data[i], data[i + 1 : i + 2], data[i + 2 : i + 3]
        a = arg[0] if arg else 0
        e = extra[0] if extra else 0
        kind = op % 7
        if kind == 0:
            key = _text(data, i + 1)
            m[key] = values[a % len(values)]
            keys.add(key)
        elif kind == 1 and len(m):
            del m[sorted(m.keys())[a % len(m)]]
        elif kind == 2:
            arr.insert(a % (len(arr) + 1), values[e % len(values)])
        elif kind == 3 and len(arr):
            del arr[a % len(arr)]
        elif kind == 4:
            s = str(txt)
            txt.insert(len(s[: a % (len(s) + 1)].encode()), _text(data, i + 2))
        elif kind == 5 and str(txt):
            s = str(txt)
            start = a % len(s)
            del txt[len(s[:start].encode()) : len(s[: start + 1 + e % 3].encode())]
        elif kind == 6:
            key = _text(data, i + 1)
            inner = Map({"x": float(a)})
            m[key] = inner
            keys.add(key)
    update = bytes(doc.get_update())
    check_update_counts(update)
    decoded = decode_update(update)
    named = {e.key for e in decoded.entries if e.parent == "m"}
    assert keys <= named, (keys, named)
    kinds = root_kinds(update)
    if keys:
        assert "map" in kinds["m"], kinds
    state = bytes(doc.get_state())
    sv = decode_state_vector(state)
    assert encode_state_vector(sv) == state
    assert set(sv) <= {doc.client_id}
    # and the same update through a second document gives the same state
    other: Doc[Any] = Doc()
    other.apply_update(update)
    assert bytes(other.get_state()) == state


def check(data: bytes) -> None:
    if not data:
        return
    try:
        if data[0] & 1:
            _structured(data[1:])
        else:
            _raw(data[1:])
    except CodecError as exc:
        assert isinstance(exc, InvalidUpdate) and isinstance(exc, ValueError)
        if data[0] & 1:
            raise  # a real update must decode


if __name__ == "__main__":
    main(check)
