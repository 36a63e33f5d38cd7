"""The ``ws://`` reader's hot path for head pushes (``sync._frames.decode_head_push`` and
``WsJournal.kept``).

- Hypothesis: a head push read without pydantic gives what :func:`sync.decode` gives, and a
  frame it takes (any JSON object, well formed or not) is one that ``decode`` reads as that
  head push: it never accepts what the :class:`~sync.Push` model refuses; one built without
  pydantic (``encode_head_push``, for the hub) is read by ``decode`` as the same push.
- Through a real hub: a reader's record applies pushed entries from the push itself (the
  store's notifier calls ``WsJournal.kept`` while the record's tail waits), in journal order,
  without a ``journal.read`` request.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sync import ProtocolError, Push, decode, encode
from sync._frames import decode_head_push, encode_head_push
from tests.network.test_sync_client import FAST, RUN, running_hub, token, until
from tests.network.test_sync_push import reader
from tests.strategies import json_values


def _frame(text: bytes) -> bytes:
    """``varUint(100) • varUint(2) • varString(text)``: a push frame around any bytes."""
    out = bytearray(b"\x64\x02")
    n = len(text)
    while n > 0x7F:
        out.append(0x80 | (n & 0x7F))
        n >>= 7
    out.append(n)
    return bytes(out + text)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**53 - 1),
    st.none() | st.lists(st.lists(json_values(), max_size=10), max_size=4),
)
def test_a_head_push_reads_as_decode_reads_it(seq: int, rows: list[Any] | None) -> None:
    frame = encode(Push(push="head", seq=seq, rows=rows))
    message = decode(frame)
    assert isinstance(message, Push)
    assert decode_head_push(frame) == (message.seq, message.rows) == (seq, rows)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**53 - 1),
    st.none() | st.lists(st.lists(json_values(), max_size=10), max_size=4),
)
def test_a_head_push_built_without_pydantic_is_the_push(seq: int, rows: list[Any] | None) -> None:
    frame = encode_head_push(seq, rows)
    assert decode(frame) == Push(push="head", seq=seq, rows=rows)
    assert decode(frame) == decode(encode(Push(push="head", seq=seq, rows=rows)))
    assert decode_head_push(frame) == (seq, rows)


@pytest.mark.parametrize(
    ("seq", "rows"),
    [
        (-1, None),
        (2**53, None),
        (True, None),
        (1, {}),
        (1, [float("nan")]),
        (1, [b"x"]),
        (1, ["\ud800"]),
    ],
)
def test_a_head_push_that_is_not_json_is_refused(seq: Any, rows: Any) -> None:
    with pytest.raises(ProtocolError):
        encode_head_push(seq, rows)


_fields = st.dictionaries(
    st.sampled_from(["push", "seq", "rows", "extra"]),
    st.one_of(
        st.sampled_from(["head", "leases", "Head", ""]),
        st.integers(-3, 2**54),
        st.booleans(),
        st.none(),
        st.floats(allow_nan=True),
        json_values(),
    ),
)


@settings(max_examples=500, deadline=None)
@given(_fields, st.integers(-2, 2))
def test_a_frame_taken_is_the_head_push_decode_reads(fields: dict[str, Any], cut: int) -> None:
    text = json.dumps(fields).encode()  # (NaN and Infinity as Python writes them: refused)
    frame = _frame(text)
    if cut < 0:  # a frame whose length prefix does not match its body
        frame = frame[:cut]
    elif cut > 0:
        frame = frame + b" " * cut
    fast = decode_head_push(frame)
    try:
        slow: Any = decode(frame)
    except ProtocolError:
        slow = None
    if fast is not None:
        assert isinstance(slow, Push) and slow.push == "head"
        assert (slow.seq, slow.rows) == fast
    elif cut == 0 and isinstance(slow, Push) and slow.push == "head":
        pytest.fail(f"a valid head push was not taken: {fields!r}")


def test_other_frames_are_not_taken() -> None:
    assert decode_head_push(encode(Push(push="leases"))) is None
    assert decode_head_push(b"\x00\x02\x01\x00") is None  # an update
    assert decode_head_push(b"\x64\x02") is None
    assert decode_head_push(_frame(b'{"push": "head", "seq": 1')) is None  # truncated JSON
    assert decode_head_push(_frame(b'{"push": "head", "seq": true}')) is None
    assert decode_head_push(_frame(b'{"push": "head", "seq": 1, "rows": {}}')) is None


@pytest.mark.anyio
async def test_pushed_entries_are_applied_from_the_push(tmp_path: Path) -> None:
    from crdtstore import open_store

    async with running_hub(tmp_path) as hub:
        async with open_store(hub.url(), token=token("w"), poll_interval=60.0, **FAST) as wstore:
            async with wstore.open_record(RUN, "w") as writer:
                await writer.map("m").set("start", 0)
                await writer.flush()
                async with reader(hub.url(), "r1") as (r1, j1):
                    await until(lambda: r1.map("m").get("start") == 0)
                    await writer.map("m").set("warm", 1)
                    await until(lambda: r1.map("m").get("warm") == 1)
                    link = j1._links[RUN]
                    taken: list[int] = []
                    kept = link.kept

                    def counted(after: int, limit: int) -> Any:
                        rows = kept(after, limit)
                        taken.extend(r.seq for r in rows or ())
                        return rows

                    link.kept = counted  # type: ignore[method-assign]
                    asked = j1.reads_asked
                    seen: list[int] = []
                    stream = r1.changes(local=False)
                    n = 12
                    for i in range(n):  # one at a time: each arrives by its own push
                        await writer.map("m").set(f"k{i}", i)
                        await writer.flush()
                        await until(lambda i=i: r1.map("m").get(f"k{i}") == i)
                    while len(seen) < n:
                        change = await stream.__anext__()
                        seen.extend(int(op[3][1:]) for op in change.ops if op[3][0] == "k")
                    await stream.aclose()
                    assert j1.reads_asked == asked  # no journal.read went out
                    assert len(taken) >= n - 1 and taken == sorted(set(taken))
                    assert seen == list(range(n))  # in journal order
