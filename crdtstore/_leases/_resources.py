"""Lease resources: repo-relative file paths and work items, in one canonical spelling.

Two requests conflict when they name the same canonical resource, so every spelling of a file
must map to one string: ``./a/../b``, ``b/`` and ``b`` are all ``b``. Work items are written
``item:<collection>/<id>``.
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Iterable

from .._errors import InvalidResource

ITEM_PREFIX = "item:"
MAX_RESOURCE = 4096
MAX_RESOURCES = 256


def canonical_resource(resource: object) -> str:
    """The canonical form of one resource.

    Raises:
        InvalidResource: not a string, empty, NUL, absolute, escaping the repo, or a malformed
            work item.
    """
    if not isinstance(resource, str):
        raise InvalidResource(resource, "expected a string")
    if not resource or not resource.strip():
        raise InvalidResource(resource, "empty")
    if "\x00" in resource:
        raise InvalidResource(resource, "NUL character")
    if len(resource) > MAX_RESOURCE:
        raise InvalidResource(resource[:64] + "...", f"longer than {MAX_RESOURCE} characters")
    if resource.startswith(ITEM_PREFIX):
        collection, sep, item = resource[len(ITEM_PREFIX) :].partition("/")
        if not sep or not collection or not item or "/" in collection:
            raise InvalidResource(resource, "expected item:<collection>/<id>")
        return resource
    if "\\" in resource:
        # a Windows spelling would name a different file on POSIX; refuse rather than guess
        raise InvalidResource(resource, "backslash in path; use '/'")
    if resource.startswith("/"):
        raise InvalidResource(resource, "absolute path; expected a repo-relative path")
    norm = posixpath.normpath(resource)
    if norm == ".":
        raise InvalidResource(resource, "names the repo root, not a file")
    if norm == ".." or norm.startswith("../"):
        raise InvalidResource(resource, "escapes the repo")
    return norm


def canonical_resources(resources: Iterable[object] | str) -> tuple[str, ...]:
    """The canonical, sorted, de-duplicated resources of one request.

    Raises:
        InvalidResource: the set is empty or too large, or one resource is invalid.
    """
    if isinstance(resources, str):
        # a bare string would iterate as characters: a classic, silent mistake
        raise InvalidResource(resources, "expected a list of resources, not a string")
    if isinstance(resources, (list, tuple)) and len(resources) == 1:
        (one,) = resources
        if type(one) is str:
            return _one_resource(one)  # the common case, cached
    out = sorted({canonical_resource(r) for r in resources})
    if not out:
        raise InvalidResource([], "empty resource set")
    if len(out) > MAX_RESOURCES:
        raise InvalidResource(f"{len(out)} resources", f"more than {MAX_RESOURCES} in one request")
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def _one_resource(resource: str) -> tuple[str, ...]:
    return (canonical_resource(resource),)


def item_resource(collection: str, item_id: str) -> str:
    """The resource naming work item ``item_id`` of ``collection``."""
    return canonical_resource(f"{ITEM_PREFIX}{collection}/{item_id}")
