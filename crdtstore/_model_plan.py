"""A collection model's write plan: validate, dump, make storable and size a value in as few
steps as the model allows.

A write to a collection with a pydantic model validates the value and dumps it in JSON mode
(:func:`~._semantics.validate_value`), makes the dump storable (:func:`~._values.to_stored`)
and, when the collection is budgeted, sizes it (:func:`~._semantics.value_size`). For a *flat*
model (:func:`is_flat`: every field a ``str``, ``float``, ``bool`` or ``None``, and nothing
that could put anything else in the dump: no validator, serializer, alias, exclusion, default
factory, extra or computed field, custom ``__init__``), the JSON-mode dump of a validated dict
is a copy of the instance's ``__dict__``, of exactly those types, so all ``to_stored`` could
still refuse is a non-finite float or a string with a lone surrogate; and pydantic's own JSON
of the instance has the length ``value_size`` counts unless a float needs an exponent.
:meth:`ModelPlan.stored_sized` does those steps, checking what it skips, and falls back to the
plain definitions when a check fails. The plan holds the model's validator and serializers,
so a write does not look them up on the model class.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from annotated_types import BaseMetadata
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError, PydanticUndefined

from ._errors import SchemaInvalid
from ._semantics import value_size
from ._values import to_stored

_SCALARS = (str, float, bool, type(None))
# the keys a flat model's core schema, its fields' schema and each field's may have
_MODEL_KEYS = {"type", "cls", "schema", "custom_init", "root_model", "config", "ref", "metadata"}
_FIELDS_KEYS = {"type", "fields", "model_name", "computed_fields"}
_FIELD_KEYS = {"type", "schema", "metadata"}
_FLAT_SCHEMAS = ("str", "float", "bool", "none")

# value_size's C encoder, refusing NaN and infinities (ValueError) instead of writing them
_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)  # not in typeshed
_c_strict: Any = (
    None
    if _c_make_encoder is None
    else _c_make_encoder(
        None,  # markers (a dump is a fresh acyclic dict)
        json.JSONEncoder().default,  # unknown types: TypeError
        json.encoder.encode_basestring,  # ensure_ascii=False
        None,  # indent
        ":",
        ",",
        False,  # sort_keys
        False,  # skipkeys
        False,  # allow_nan
    )
)


def _flat_annotation(annotation: Any) -> bool:
    if annotation in _SCALARS:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return all(a in _SCALARS for a in typing.get_args(annotation))
    return False


def _flat_schema(schema: Any) -> bool:
    """Whether a field's core schema validates to one of the flat scalars and serializes it as
    it is (no function around it, no serializer of its own)."""
    while True:
        if "serialization" in schema:
            return False
        kind = schema.get("type")
        if kind in _FLAT_SCHEMAS:
            return True
        if kind == "default":
            if "default_factory" in schema or type(schema.get("default")) not in _SCALARS:
                return False
        elif kind != "nullable":
            return False
        schema = schema["schema"]


def is_flat(model: type[BaseModel]) -> bool:
    """Whether ``model`` is flat (see the module docstring). Conservative: anything it does
    not know makes it False (the plain path, always right)."""
    try:
        schema = model.__pydantic_core_schema__
        if (
            schema.get("type") != "model"  # (a model validator wraps the model's schema)
            or not set(schema) <= _MODEL_KEYS  # (a serializer, a post_init, ...)
            or schema.get("root_model")
            or schema.get("custom_init")
            or model.__pydantic_post_init__ is not None
            or model.model_config.get("extra") == "allow"
        ):
            return False
        decorators = model.__pydantic_decorators__
        if (
            decorators.validators
            or decorators.field_validators
            or decorators.root_validators
            or decorators.field_serializers
            or decorators.model_serializers
            or decorators.model_validators
            or decorators.computed_fields
        ):
            return False
        fields_schema = schema["schema"]
        if (
            fields_schema.get("type") != "model-fields"
            or not set(fields_schema) <= _FIELDS_KEYS
            or fields_schema.get("computed_fields")
            or fields_schema.get("extras_schema") is not None
            or fields_schema.get("extra_behavior") == "allow"
        ):
            return False
        fields = fields_schema["fields"]
        if set(fields) != set(model.model_fields):
            return False
        for name, info in model.model_fields.items():
            field = fields[name]
            if (
                field.get("type") != "model-field"
                # (no serializer, alias, exclusion or frozen flag: the dump is the field's
                # value under its name)
                or not set(field) <= _FIELD_KEYS
                or info.exclude
                or info.alias is not None
                or info.serialization_alias is not None
                or not _flat_annotation(info.annotation)
                or info.default_factory is not None
                or (info.default is not PydanticUndefined and type(info.default) not in _SCALARS)
                or not all(isinstance(m, BaseMetadata) for m in info.metadata)
                or not _flat_schema(field["schema"])
            ):
                return False
        return True
    except Exception:  # another pydantic: the plain path
        return False


def strict_size(value: Any) -> int:
    """:func:`~._semantics.value_size` of ``value``, or -1 when it holds a non-finite float or
    a string with a lone surrogate (what ``to_stored`` refuses of a flat dict)."""
    try:
        chunks = _c_strict(value, 0)
    except ValueError:  # NaN or an infinity
        return -1
    text = chunks[0] if len(chunks) == 1 else "".join(chunks)
    if text.isascii():
        return len(text)
    try:
        return len(text.encode())
    except UnicodeEncodeError:  # a lone surrogate
        return -1


class ModelPlan:
    """How writes to a collection with ``model`` make their stored value (see the module
    docstring). One per collection handle, made again when the handle's model changes."""

    __slots__ = ("_checked", "_dump", "_dump_json", "_floats", "_validate", "flat", "model")

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model
        self._validate = model.__pydantic_validator__.validate_python
        self._dump = model.__pydantic_serializer__.to_python
        self._dump_json = model.__pydantic_serializer__.to_json
        #: stored_sized's shortcut applies (a flat model, and the C JSON encoder is there)
        self.flat = _c_strict is not None and is_flat(model)
        self._checked = False  # stored_sized compared its dump with pydantic's (see there)
        # the fields that may hold a float (a flat model's dump is keyed by field name)
        self._floats = tuple(
            name
            for name, info in model.model_fields.items()
            if info.annotation is float or float in typing.get_args(info.annotation)
        )

    def stored(self, collection: str, key: str | None, value: Any) -> Any:
        """``to_stored(validate_value(None, model, collection, key, value))``.

        Raises:
            SchemaInvalid: the value fails the model.
            InvalidValue: its dump is not storable (see ``to_stored``).
        """
        model = self.model
        if type(value) is not dict and isinstance(value, model):  # (an ABC isinstance is slow)
            # the instance's own serializer (a subclass's), as validate_value does
            return to_stored(value.__pydantic_serializer__.to_python(value, mode="json"))
        instance = self._instance(collection, key, value)
        return to_stored(instance.__pydantic_serializer__.to_python(instance, mode="json"))

    def stored_sized(self, collection: str, key: str | None, value: dict[str, Any]) -> Any:
        """``(stored, value_size(stored))`` of a dict ``value``, for a flat model (``flat``):
        what :meth:`stored` returns, and its size (-1 if this pydantic dumps the model
        otherwise than the plan expects: the caller sizes it; the plan stops being flat).

        The size is the length of pydantic's own JSON of the instance (one call in Rust):
        it writes strings, ``true``/``false``/``null`` and keys as Python's compact JSON
        does, and floats alike unless one needs an exponent (``|x| < 1e-4`` or ``>= 1e16``,
        where the two spell it differently) or is not finite; then, or when a string has a
        lone surrogate (pydantic refuses it), the dump is encoded as ``value_size`` does.

        Raises:
            SchemaInvalid, InvalidValue: as :meth:`stored`.
        """
        # (_instance and strict_size, inlined: this is every write of a declared map)
        try:
            instance = self._validate(value)
        except ValidationError:
            instance = self._instance(collection, key, value)  # raises SchemaInvalid
        # a flat model's JSON-mode dump is its fields' values by name, as validated: a copy
        # of the instance's __dict__ (checked against the dump on the plan's first value)
        dumped = instance.__dict__.copy()
        if not self._checked:
            self._checked = True
            if list(self._dump(instance, mode="json").items()) != list(dumped.items()):
                self.flat = False  # pragma: no cover - another pydantic
                return self.stored(collection, key, value), -1  # pragma: no cover
        try:
            size = len(self._dump_json(instance))
        except PydanticSerializationError:  # a lone surrogate: the encoding below refuses it
            size = -1
        for name in self._floats:
            x = dumped[name]
            if x is not None and not (x == 0.0 or 1e-4 <= abs(x) < 1e16):
                size = -1  # an exponent, NaN or an infinity
        if size >= 0:
            return dumped, size
        try:
            chunks = _c_strict(dumped, 0)
            text = chunks[0] if len(chunks) == 1 else "".join(chunks)
            return dumped, len(text) if text.isascii() else len(text.encode())
        except ValueError:  # NaN or an infinity; a lone surrogate (a UnicodeEncodeError)
            stored = to_stored(dumped)  # raises InvalidValue (what the encoding refused)
            return stored, value_size(stored)  # pragma: no cover - to_stored raised

    def _instance(self, collection: str, key: str | None, value: Any) -> BaseModel:
        try:
            instance: BaseModel = self._validate(value)
        except ValidationError as exc:
            # (without the input: it can be what JSON cannot carry, NaN, and it is the caller's)
            errors = json.loads(exc.json(include_input=False, include_url=False))
            raise SchemaInvalid(collection, key, errors) from None
        return instance
