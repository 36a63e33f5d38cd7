"""A collection model's write plan (crdtstore._model_plan): which models are flat, that the
one-encoding path gives exactly what validate + to_stored + value_size give (refusals
included), and that a budgeted collection's totals stay right when the write's size comes
from the plan (a stale or wrong size would show against a fresh measure of the document)."""

from __future__ import annotations

import math
from typing import Annotated, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    computed_field,
    field_serializer,
    field_validator,
    model_validator,
)

import crdtstore
from crdtstore import BudgetExceeded, CollectionSpec, InvalidValue, SchemaInvalid
from crdtstore._model_plan import ModelPlan, is_flat, strict_size
from crdtstore._semantics import measure, validate_value, value_size
from crdtstore._values import to_stored


class Flat(BaseModel):
    text: str
    confidence: float
    done: bool = False
    note: str | None = None
    limit: Annotated[float, Field(ge=0)] = 1.0


class WithInt(BaseModel):
    n: int


class WithList(BaseModel):
    tags: list[str]


class Nested(BaseModel):
    inner: Flat


class WithAny(BaseModel):
    x: Any


class Validated(BaseModel):
    text: str

    @field_validator("text")
    @classmethod
    def shout(cls, v: str) -> str:
        return v.upper()


class AfterAnnotated(BaseModel):
    text: Annotated[str, AfterValidator(str.upper)]


class Serialized(BaseModel):
    text: str

    @field_serializer("text")
    def ser(self, v: str) -> str:
        return v + "!"


class ModelValidated(BaseModel):
    text: str

    @model_validator(mode="after")
    def check(self) -> ModelValidated:
        return self


class Computed(BaseModel):
    text: str

    @computed_field  # type: ignore[prop-decorator]
    @property
    def size(self) -> int:
        return len(self.text)


class Extra(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: str


class Factory(BaseModel):
    text: str = Field(default_factory=lambda: "x")


class Aliased(BaseModel):
    text: str = Field(alias="t")


class Excluded(BaseModel):
    text: str
    secret: str = Field(default="", exclude=True)


class Frozen(BaseModel):
    text: str = Field(frozen=True)


class CustomInit(BaseModel):
    text: str

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)


class PostInit(BaseModel):
    text: str

    def model_post_init(self, context: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("model", "flat"),
    [
        (Flat, True),
        (WithInt, False),  # an int may be beyond 2**53: to_stored checks it
        (WithList, False),
        (Nested, False),
        (WithAny, False),
        (Validated, False),
        (AfterAnnotated, False),
        (Serialized, False),
        (ModelValidated, False),
        (Computed, False),
        (Extra, False),
        (Factory, False),
        (PostInit, False),
        (Aliased, False),
        (Excluded, False),
        (Frozen, False),
        (CustomInit, False),
    ],
)
def test_is_flat(model: type[BaseModel], flat: bool) -> None:
    assert is_flat(model) is flat
    assert ModelPlan(model).flat is flat


flat_values = st.fixed_dictionaries(
    {
        "text": st.text(),  # lone surrogates included
        "confidence": st.floats(allow_nan=True, allow_infinity=True),
    },
    optional={
        "done": st.booleans(),
        "note": st.none() | st.text(max_size=5),
        "limit": st.floats(min_value=0),
    },
)


def reference(value: Any) -> tuple[Any, int] | type[Exception]:
    """What the plain definitions give: to_stored(validate_value(...)) and its value_size."""
    try:
        stored = to_stored(validate_value(None, Flat, "m", "k", value))
    except (SchemaInvalid, InvalidValue) as exc:
        return type(exc)
    return stored, value_size(stored)


@settings(max_examples=500)
@given(flat_values)
def test_stored_sized_is_validate_to_stored_value_size(value: dict[str, Any]) -> None:
    plan = ModelPlan(Flat)
    want = reference(value)
    for _ in range(2):  # the plan's first value (its dump checked against pydantic's), then
        try:
            got: Any = plan.stored_sized("m", "k", value)
        except (SchemaInvalid, InvalidValue) as exc:
            got = type(exc)
        assert got == want
    assert plan.flat
    if isinstance(got, tuple):
        stored, size = got
        assert size == value_size(stored)
        assert all(type(v) in (str, float, bool, type(None)) for v in stored.values())
        assert plan.stored("m", "k", value) == stored


@pytest.mark.parametrize(
    "confidence",
    [0.0, -0.0, 1e-4, -1e-4, 9.99e-5, 1e-5, 1.5e-7, 5e-324, 0.1 + 0.2, 123.0, 1e15, 9.9e15,
     1e16, -1e16, 1.7976931348623157e308, 2.0**53, 1 / 3],
)  # fmt: skip
@pytest.mark.parametrize(
    "text", ["", "plain", 'quote " and \\ backslash', "\n\t\b\f\r\x00\x1f\x7f", "é日🙂\u2028"]
)
def test_stored_sized_at_the_edges_of_json_spelling(confidence: float, text: str) -> None:
    """Floats where pydantic's JSON and Python's part ways (exponents) and strings with every
    kind of escape: the size is still value_size's."""
    value = {"text": text, "confidence": confidence, "note": text, "limit": abs(confidence)}
    assert ModelPlan(Flat).stored_sized("m", "k", value) == reference(value)


@pytest.mark.parametrize(
    "value",
    [
        {"text": "a", "confidence": math.nan},
        {"text": "a", "confidence": math.inf},
        {"text": "a", "confidence": "-inf"},
        {"text": "a\ud800", "confidence": 0.5},
        {"text": "a", "confidence": 0.5, "note": "\udfff"},
    ],
)
def test_stored_sized_refuses_what_to_stored_refuses(value: dict[str, Any]) -> None:
    with pytest.raises(InvalidValue):
        ModelPlan(Flat).stored_sized("m", "k", value)
    assert strict_size(to_stored(validate_value(None, WithAny, "m", "k", {"x": 1}))) > 0


def test_strict_size_is_value_size_or_refuses() -> None:
    for value in [{"a": "é日🙂", "b": 1e-7, "c": 1e16, "d": None}, {"a": "x" * 300}]:
        assert strict_size(value) == value_size(value)
    assert strict_size({"a": math.nan}) == -1
    assert strict_size({"a": "\ud800"}) == -1


def test_stored_sized_refuses_a_bad_value_with_pydantic_errors() -> None:
    with pytest.raises(SchemaInvalid) as err:
        ModelPlan(Flat).stored_sized("m", "k", {"text": 3})
    assert {tuple(e["loc"]) for e in err.value.errors} == {("text",), ("confidence",)}


# -- through a record ------------------------------------------------------------------------


def spec(**kw: Any) -> CollectionSpec:
    return CollectionSpec(
        kind="map", model=Flat, policy="owner", max_entries=5, max_bytes=600, **kw
    )


async def check_totals(rec: crdtstore.Record) -> dict[str, int]:
    """The running totals equal a fresh measure of the document."""
    usage = rec._usage["m"]
    fresh = measure("map", rec.replica.root("m", "map"))
    assert (usage.entries, usage.bytes, usage.sizes) == (fresh.entries, fresh.bytes, fresh.sizes)
    assert fresh.sizes is not None
    return fresh.sizes


@pytest.mark.anyio
async def test_sized_writes_keep_the_budget_right() -> None:
    """Fresh keys, overwrites by a larger and a smaller value, inside and outside a
    transaction, instances and dicts: after each, the totals equal the document's."""
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record(run="r", agent="a", schema={"m": spec(max_value_bytes=120)}) as rec,
    ):
        m = rec.map("m")
        await m.set("k", {"text": "short", "confidence": 0.5})
        await check_totals(rec)
        await m.set("k", {"text": "a much longer text é日🙂", "confidence": 1e-7, "note": "n"})
        sizes = await check_totals(rec)
        assert sizes["k"] == value_size(m.get("k").model_dump(mode="json"))
        await m.set("k", {"text": "", "confidence": 0})
        await check_totals(rec)
        async with rec.transaction():
            await m.set("t1", {"text": "in a transaction", "confidence": 0.25})
            await m.set("t1", {"text": "again", "confidence": 0.75})
        await check_totals(rec)
        await m.set("i", Flat(text="an instance", confidence=0.1))
        sizes = await check_totals(rec)
        assert set(sizes) == {"k", "t1", "i"}
        with pytest.raises(BudgetExceeded, match="value bytes"):
            await m.set("big", {"text": "x" * 150, "confidence": 0.5})
        with pytest.raises(InvalidValue):
            await m.set("nan", {"text": "x", "confidence": math.nan})
        with pytest.raises(SchemaInvalid):
            await m.set("bad", {"text": 1, "confidence": 0.5})
        assert set(m.keys()) == {"k", "t1", "i"}
        await check_totals(rec)
        rec._invalidate_all()  # measured again from the document: the same totals
        assert rec.size()["m"]["bytes"] == sum(sizes.values())


@pytest.mark.anyio
async def test_budget_refusal_with_the_plan_size() -> None:
    """max_bytes and max_entries refuse on the size the plan computed, nothing lands."""
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record(run="r", agent="a", schema={"m": spec()}) as rec,
    ):
        m = rec.map("m")
        value = {"text": "y" * 40, "confidence": 0.5}
        for i in range(5):
            await m.set(f"k{i}", value)
        with pytest.raises(BudgetExceeded, match="entries"):
            await m.set("k5", value)
        with pytest.raises(BudgetExceeded, match="bytes"):
            await m.set("k0", {"text": "y" * 200, "confidence": 0.5})
        assert len(m) == 5 and m.get("k0").text == "y" * 40
        await check_totals(rec)


@pytest.mark.anyio
async def test_a_handle_follows_a_declaration_made_after_it() -> None:
    """A handle made before the run declares the collection writes unvalidated and unsized;
    once declared (model and budgets), the same handle validates with the new model's plan
    and sizes its writes into the budget."""
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record(run="r", agent="a") as rec,
    ):
        m = rec.map("m")
        await m.set("before", {"text": "x", "confidence": 1, "extra": [1, 2]})
        await rec.declare("m", spec())
        with pytest.raises(SchemaInvalid):
            await m.set("k", {"text": 1, "confidence": 0.5})
        await m.set("k", {"text": "declared", "confidence": 0.5})
        usage = rec._usage["m"]
        assert usage.sizes is not None
        declared = {"text": "declared", "confidence": 0.5, "done": False, "note": None}
        assert usage.sizes["k"] == value_size({**declared, "limit": 1.0})
        before = {"text": "x", "confidence": 1.0, "extra": [1.0, 2.0]}  # (as the doc reads)
        assert usage.sizes["before"] == value_size(before)


@pytest.mark.anyio
async def test_a_non_flat_model_takes_the_plain_path() -> None:
    """A model with an int field: a value beyond 2**53 is refused by to_stored as before,
    and the budget sizes what is stored."""
    s = CollectionSpec(kind="map", model=WithInt, max_bytes=100)
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record(run="r", agent="a", schema={"m": s}) as rec,
    ):
        m = rec.map("m")
        with pytest.raises(InvalidValue, match="2\\*\\*53"):
            await m.set("k", {"n": 2**60})
        await m.set("k", {"n": 7})
        usage = rec._usage["m"]
        assert (usage.entries, usage.bytes, usage.sizes) == (1, 7, {"k": 7})  # {"n":7}
