"""Conversion of Python values to what the record stores, and back.

Values are JSON-like: ``None``, ``bool``, ``int``, ``float``, ``str``, and lists and dicts (with
string keys) of those. Dicts and lists are stored as atomic JSON values inside a map entry or
list item, never as nested shared types: concurrently created nested shared types lose each
other in Yrs (PYCRDT-NOTES hazard 3), while an atomic value simply follows the collection's
conflict rule.

Numbers follow JSON (and Yjs) semantics: Yrs stores integers below 2**53 as doubles, so an
integral number reads back as ``int`` (``5.0`` written reads back as ``5``). Integers beyond
±2**53 are refused: JavaScript peers could not read them exactly.
"""

from __future__ import annotations

import math
from typing import Any

from ._errors import InvalidValue

_MAX_SAFE_INT = MAX_SAFE_INT = 2**53  # the largest integer stored (exact in JSON/JavaScript)
_MAX_DEPTH = 64
_SCALARS = (bool, type(None))

JSONValue = Any  # a JSON-like value, see the module docstring


def to_stored(value: Any, _depth: int = 0) -> Any:
    """Validate ``value`` and return a fresh copy fit to be stored.

    Raises:
        InvalidValue: a type that is not JSON-like, a non-string dict key, NaN or infinity,
            an integer beyond ±2**53, nesting deeper than 64 levels, or a string with a lone
            surrogate (not valid Unicode: it has no UTF-8 encoding).
    """
    t = type(value)
    if t is str:
        if value.isascii() or encodable(value):
            return value
        raise InvalidValue("a string with a lone surrogate is not valid Unicode")
    if t in _SCALARS:
        return value
    if t is int:
        if -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT:
            return value
        raise InvalidValue(f"integer {value} is outside ±2**53 (not exact in JSON/JavaScript)")
    if t is float:
        if math.isfinite(value):
            return value
        raise InvalidValue(f"{value} is not a finite number")
    if _depth >= _MAX_DEPTH:
        raise InvalidValue(f"nesting deeper than {_MAX_DEPTH} levels")
    if t is dict or isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                raise InvalidValue(f"dict key {k!r} is not a str")
            if not k.isascii() and not encodable(k):
                raise InvalidValue("a dict key with a lone surrogate is not valid Unicode")
            out[k] = to_stored(v, _depth + 1)
        return out
    if t is list or t is tuple or isinstance(value, (list, tuple)):
        return [to_stored(v, _depth + 1) for v in value]
    if isinstance(value, bool | int | float | str):  # subclasses such as IntEnum
        return to_stored(_base(value), _depth)
    raise InvalidValue(f"type {t.__name__} is not JSON-like")


def encodable(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (a lone surrogate does not, and yrs refuses it)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _base(value: Any) -> Any:
    for base in (bool, int, float, str):
        if isinstance(value, base):
            return base(value)
    return value  # pragma: no cover - only called for those four


def from_stored(value: Any) -> Any:
    """Return the Python value for a value read from the document (see module docstring)."""
    t = type(value)
    if t is float:
        if value.is_integer() and -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT:
            return int(value)
        return value
    if t is dict:
        return {k: from_stored(v) for k, v in value.items()}
    if t is list:
        return [from_stored(v) for v in value]
    return value
