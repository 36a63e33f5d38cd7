"""What a newcomer trips on says what to do: a store or record used before it is opened, a
transaction opened inside another."""

from __future__ import annotations

import pytest

import crdtstore
from crdtstore import NestedTransaction, StoreClosed

pytestmark = pytest.mark.anyio


async def test_a_store_used_before_it_is_opened_says_how_to_open_it() -> None:
    store = crdtstore.open_store("memory://")
    with pytest.raises(StoreClosed, match=r"not open yet: open it with `async with") as info:
        await store.open_record(run="r", agent="a").start()
    assert info.value.code == "CLOSED" and info.value.state == "new"
    async with store:
        with pytest.raises(StoreClosed, match="open already"):
            await store.start()
    with pytest.raises(StoreClosed, match="store is closed"):
        await store.open_record(run="r", agent="a").start()


async def test_a_record_used_before_it_is_opened_says_how_to_open_it() -> None:
    async with crdtstore.open_store("memory://") as store:
        rec = store.open_record(run="r", agent="a")
        with pytest.raises(StoreClosed, match=r"record is not open yet: .*open_record"):
            await rec.map("m").set("k", 1)
        with pytest.raises(StoreClosed, match="not open yet"):
            await rec.flush()
        async with rec:
            await rec.map("m").set("k", 1)
        with pytest.raises(StoreClosed, match="record is closed"):
            await rec.map("m").set("k", 2)


async def test_a_nested_transaction_is_a_typed_error_and_the_outer_one_goes_on() -> None:
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a") as rec:
            async with rec.transaction():
                await rec.map("m").set("a", 1)
                with pytest.raises(NestedTransaction) as info:
                    async with rec.transaction():
                        pass
                assert isinstance(info.value, RuntimeError)
                assert info.value.to_dict()["code"] == "NESTED_TRANSACTION"
                await rec.map("m").set("b", 2)
            await rec.flush()
            assert rec.map("m").to_dict() == {"a": 1, "b": 2}
