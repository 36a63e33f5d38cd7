"""The declared-collection write path: budgets counted incrementally (per-key sizes of a map
kept from each write's effect) agree with the state, policies read existence from them, and
the fast value sizing and model validation give what the plain definitions give."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

import crdtstore
from crdtstore import BudgetExceeded, CollectionSpec, PolicyViolation, SchemaInvalid
from crdtstore._semantics import measure, validate_value, value_size
from tests.strategies import json_values

MAX_ENTRIES, MAX_BYTES, MAX_VALUE = 5, 90, 30


def json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


@given(json_values())
def test_value_size_is_compact_utf8_json(value: Any) -> None:
    assert value_size(value) == json_size(value)


def test_value_size_refuses_what_json_refuses() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        value_size({"a": object()})


class Inner(BaseModel):
    n: int = 0


class Finding(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    text: str
    confidence: float = Field(alias="conf")
    tags: list[str] = []
    inner: Inner = Inner()


class Loud(Finding):
    extra: str = "x"


@pytest.mark.parametrize(
    "value",
    [
        {"text": "a", "conf": 1},  # int coerced to float, defaults filled
        {"text": "a", "confidence": "0.5", "inner": {"n": "3"}},  # lax coercion, by name
        Finding(text="b", conf=0.25, tags=["t"]),  # an instance is taken as it is
        Loud(text="c", conf=0.5),  # a subclass instance dumps its own fields
    ],
)
def test_validate_value_is_model_validate_then_dump(value: Any) -> None:
    instance = value if isinstance(value, Finding) else Finding.model_validate(value)
    assert validate_value(None, Finding, "m", "k", value) == instance.model_dump(mode="json")


def test_validate_value_carries_pydantic_errors() -> None:
    with pytest.raises(SchemaInvalid) as err:
        validate_value(None, Finding, "m", "k", {"text": 3})
    assert {tuple(e["loc"]) for e in err.value.errors} == {("text",), ("conf",)}


# -- budgets and policies over random writes, against a model -----------------------------------

texts = st.text(alphabet="ab é日🙂", max_size=12)
values = st.one_of(texts, st.lists(texts, max_size=3), st.none(), st.booleans())
keys = st.sampled_from(["k0", "k1", "k2", "k3", "k4", "k5", "k6"])
writes = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 1), keys, values),
    st.tuples(st.just("del"), st.integers(0, 1), keys, st.none()),
    st.tuples(
        st.just("update"), st.integers(0, 1), st.dictionaries(keys, values, max_size=3), st.none()
    ),
)


def expected_outcome(
    model: dict[str, tuple[Any, str]], policy: str, agent: str, changes: dict[str, Any]
) -> type[Exception] | None:
    """What the store must do with ``changes`` (key -> value, or a delete marker)."""
    for key in changes:
        if policy == "owner" and key in model and model[key][1] != agent:
            return PolicyViolation
    entries = len(model)
    nbytes = sum(json_size(v) for v, _ in model.values())
    add_entries = add_bytes = 0
    for key, value in changes.items():
        old = json_size(model[key][0]) if key in model else None
        if value is DELETE:
            if old is not None:
                add_entries, add_bytes = add_entries - 1, add_bytes - old
            continue
        size = json_size(value)
        if size > MAX_VALUE:
            return BudgetExceeded
        add_entries += old is None
        add_bytes += size - (old or 0)
    if add_entries > 0 and entries + add_entries > MAX_ENTRIES:
        return BudgetExceeded
    if add_bytes > 0 and nbytes + add_bytes > MAX_BYTES:
        return BudgetExceeded
    return None


DELETE: Any = object()


@pytest.mark.anyio
@given(policy=st.sampled_from(["open", "owner"]), steps=st.lists(writes, max_size=14))
async def test_budgets_and_policies_match_a_model(
    policy: str, steps: list[tuple[str, int, Any, Any]]
) -> None:
    """Two records of one run write (sets, deletes, multi-key updates) to a budgeted map;
    each write is refused exactly when the model says so (policy first, then budgets),
    nothing of a refused write lands, and each record's running totals (its per-key sizes
    included) equal the state, whether kept up from its own writes or re-measured after the
    other's."""
    spec = CollectionSpec(
        kind="map",
        policy=policy,  # type: ignore[arg-type]
        max_entries=MAX_ENTRIES,
        max_bytes=MAX_BYTES,
        max_value_bytes=MAX_VALUE,
    )
    model: dict[str, tuple[Any, str]] = {}  # key -> (value, creator)
    async with crdtstore.open_store("memory://") as store:
        recs = [
            await store.open_record(run="r", agent=f"a{i}", schema={"m": spec}).start()
            for i in range(2)
        ]
        try:
            for kind, who, arg, value in steps:
                rec, other = recs[who], recs[1 - who]
                m = rec.map("m")
                if kind == "set":
                    changes = {arg: value}
                elif kind == "del":
                    changes = {arg: DELETE} if arg in model else {}
                else:
                    changes = dict(arg)
                want = expected_outcome(model, policy, rec.agent, changes)
                before = m.to_dict()
                try:
                    if kind == "set":
                        await m.set(arg, value)
                    elif kind == "del":
                        assert await m.delete(arg) == (arg in model)
                    else:
                        await m.update(arg)
                except (PolicyViolation, BudgetExceeded) as exc:
                    assert type(exc) is want, (exc, want)
                    assert m.to_dict() == before
                else:
                    assert want is None, (kind, arg, value, want)
                    for key, new in changes.items():
                        if new is DELETE:
                            del model[key]
                        else:
                            creator = model[key][1] if key in model else rec.agent
                            model[key] = (new, creator)
                await rec.flush()
                await other.sync()
                for r in recs:
                    assert r.map("m").to_dict() == {k: v for k, (v, _) in model.items()}
                    sizes = {k: json_size(v) for k, (v, _) in model.items()}
                    got = r.size()["m"]
                    assert (got["entries"], got["bytes"]) == (len(sizes), sum(sizes.values()))
                    usage = r._usage["m"]
                    assert usage.sizes == sizes
                    fresh = measure("map", r.replica.root("m", "map"))
                    assert (fresh.entries, fresh.bytes, fresh.sizes) == (
                        usage.entries,
                        usage.bytes,
                        sizes,
                    )
        finally:
            for r in recs:
                await r.aclose()


@pytest.mark.anyio
async def test_owner_policy_sees_a_key_deleted_and_recreated_by_another() -> None:
    """Existence comes from the budget's sizes: after another agent deletes and re-creates a
    key, the owner check follows (the other's remote writes re-measure the sizes)."""
    spec = CollectionSpec(kind="map", policy="owner", max_entries=10)
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record(run="r", agent="a", schema={"m": spec}) as a,
        store.open_record(run="r", agent="b", schema={"m": spec}) as b,
    ):
        await a.map("m").set("x", 1)
        await a.flush()
        await b.sync()
        with pytest.raises(PolicyViolation):
            await b.map("m").set("x", 2)
        assert await a.map("m").delete("x")
        await a.flush()
        await b.sync()
        await b.map("m").set("x", 3)  # gone: b may create it, and now owns it
        await b.flush()
        await a.sync()
        with pytest.raises(PolicyViolation):
            await a.map("m").set("x", 4)
        assert a.map("m").get("x") == 3
        assert a.size()["m"]["entries"] == b.size()["m"]["entries"] == 1


@pytest.mark.anyio
async def test_transaction_accounts_each_write() -> None:
    """Writes inside one transaction see each other's sizes: a budget counts them all."""
    spec = CollectionSpec(kind="map", max_entries=2)
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record(run="r", agent="a", schema={"m": spec}) as rec,
    ):
        m = rec.map("m")
        async with rec.transaction():
            await m.set("a", "1")
            await m.set("a", "22")  # an overwrite: still one entry
            await m.set("b", "3")
            with pytest.raises(BudgetExceeded):
                await m.set("c", "4")  # the third entry is refused
        assert m.to_dict() == {"a": "22", "b": "3"}  # the refused write changed nothing
        assert rec.size()["m"]["entries"] == 2
        assert rec.size()["m"]["bytes"] == len('"22"') + len('"3"')
