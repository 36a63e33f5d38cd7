"""Validation of the names that scope data: tenants, runs, agents and collections.

Names end up in URL paths, file names and SQL keys, so they are checked once, strictly, at the
public boundary: a bad name raises :class:`InvalidName` before anything is created.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from ._errors import InvalidName
from ._values import encodable

MAX_NAME_LENGTH = 128
MAX_KEY_LENGTH = 1024

NameKind = Literal["tenant", "run", "agent", "collection"]

# Collection names starting with this prefix belong to crdtstore itself (the collection
# registry, and in later layers provenance and registers).
RESERVED_PREFIX = "__"


@lru_cache(maxsize=4096)
def _check(kind: str, name: str) -> str:
    if not name:
        raise InvalidName(kind, name, "must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName(kind, name, f"longer than {MAX_NAME_LENGTH} characters")
    if name != name.strip():
        raise InvalidName(kind, name, "must not start or end with whitespace")
    for ch in name:
        if ch in "/\\":
            raise InvalidName(kind, name, "must not contain a path separator")
        if ord(ch) < 0x20 or ord(ch) == 0x7F:
            raise InvalidName(kind, name, "must not contain NUL or control characters")
    if not name.isascii() and not encodable(name):
        raise InvalidName(kind, name, "must be valid Unicode (no lone surrogates)")
    if ".." in name or name == ".":
        raise InvalidName(kind, name, "must not be '.' or contain '..'")
    if kind == "collection" and name.startswith(RESERVED_PREFIX):
        raise InvalidName(kind, name, f"names starting with {RESERVED_PREFIX!r} are reserved")
    return name


def check_name(kind: NameKind, name: object) -> str:
    """Return ``name`` if it is a valid name of that kind.

    Raises:
        InvalidName: not a string, empty, too long, with a path separator, NUL or control
            character, ``..``, or (collections) a reserved ``__`` prefix.
    """
    if not isinstance(name, str):
        raise InvalidName(kind, name, f"must be a str, not {type(name).__name__}")
    return _check(kind, name)


def check_key(key: object) -> str:
    """Return ``key`` if it can be a map key (any non-empty bounded string without NUL or
    lone surrogates).

    Raises:
        InvalidName: not a string, empty, too long, containing NUL or a lone surrogate.
    """
    if type(key) is not str:
        raise InvalidName("key", key, f"must be a str, not {type(key).__name__}")
    if not key or len(key) > MAX_KEY_LENGTH or "\x00" in key:
        raise InvalidName("key", key, f"must be 1 to {MAX_KEY_LENGTH} characters without NUL")
    if not key.isascii() and not encodable(key):
        raise InvalidName("key", key, "must be valid Unicode (no lone surrogates)")
    return key
