"""A list is read in one call (``crdtstore.record._pycrdt.list_values``, yrs writing the array as
JSON) with exactly the values the item by item read gives for everything crdtstore stores."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycrdt import Array, Doc, Map, Text

import crdtstore
from crdtstore._values import from_stored
from crdtstore.record._pycrdt import list_values

pytestmark = pytest.mark.anyio

_SAFE = 2**53
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-_SAFE, _SAFE)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_values, max_size=20))
def test_one_call_read_equals_the_item_by_item_read(values: list[Any]) -> None:
    doc: Doc[Any] = Doc()
    arr = doc.get("a", type=Array)
    arr.extend(values)
    got = list_values(arr)
    assert got == [from_stored(v) for v in arr]
    # and the types too (1 and 1.0 compare equal)
    assert repr(got) == repr([from_stored(v) for v in arr])


def test_what_only_a_plain_yjs_client_stores_comes_out_as_json() -> None:
    doc: Doc[Any] = Doc()
    arr = doc.get("a", type=Array)
    arr.extend([b"\x00\x01", Map({"x": 1}), Array([1, 2]), Text("hi")])
    assert list_values(arr) == [[0, 1], {"x": 1}, [1, 2], "hi"]


async def test_a_records_list_reads_the_same_through_every_path() -> None:
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record("r", "a") as rec:
            log = rec.list("log")
            await log.extend([{"n": i, "ok": i % 2 == 0, "w": i / 4} for i in range(3000)])
            expected = [{"n": i, "ok": i % 2 == 0, "w": i / 4} for i in range(3000)]
            assert log.to_list() == expected
            assert list(log) == expected
            assert rec.to_dict()["log"] == expected
            assert [log[i] for i in (0, 1, 2999)] == [expected[0], expected[1], expected[2999]]
            assert type(log.to_list()[4]["w"]) is int and type(log.to_list()[1]["w"]) is float
