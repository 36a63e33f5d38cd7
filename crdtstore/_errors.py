"""The error tree of crdtstore: one root, :class:`CrdtStoreError`, whose docstring draws the tree.

Every error has a stable machine ``code`` (what agent tools and the sync hub return) and
composes its own message from its fields; an error subclasses a builtin where the meaning
matches (``InvalidName(ValueError)``, ``LeaseTimeout(TimeoutError)``), never shadows one.

Errors of the backends' libraries (sqlite3, ...) are translated into ``BackendError`` at the
backend boundary, so callers never have to catch a driver's exception type.

:func:`error_from_dict` turns ``to_dict()`` back into an error of the same class with the
same fields (how the ``ws://`` client re-raises the errors the hub answers with).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BackendError",
    "BudgetExceeded",
    "CollectionKindMismatch",
    "CrdtStoreError",
    "InvalidName",
    "InvalidResource",
    "InvalidUpdate",
    "InvalidValue",
    "JournalCorrupt",
    "LeaseError",
    "LeaseHeld",
    "LeaseLost",
    "LeaseNotFound",
    "LeaseTimeout",
    "NestedTransaction",
    "PayloadTooLarge",
    "PolicyViolation",
    "ReadOnlyAccess",
    "RunClosed",
    "SchemaInvalid",
    "StaleVersion",
    "StoreClosed",
    "UnknownRun",
    "UnsupportedOperation",
    "UnsupportedURL",
]


class CrdtStoreError(Exception):
    """Root of every error crdtstore raises on purpose.

    Every error has a stable machine ``code`` (the second column)::

        CrdtStoreError
        ├── InvalidName (ValueError)            INVALID_NAME
        ├── InvalidValue (ValueError)           INVALID_VALUE
        ├── InvalidUpdate (ValueError)          INVALID_UPDATE
        ├── PayloadTooLarge (ValueError)        PAYLOAD_TOO_LARGE
        ├── UnsupportedURL (ValueError)         UNSUPPORTED_URL
        ├── CollectionKindMismatch (TypeError)  COLLECTION_KIND
        ├── UnknownRun (LookupError)            UNKNOWN_RUN
        ├── StoreClosed (RuntimeError)          CLOSED
        ├── NestedTransaction (RuntimeError)    NESTED_TRANSACTION
        ├── RunClosed (PermissionError)         RUN_CLOSED
        │   └── ReadOnlyAccess                  READ_ONLY
        ├── UnsupportedOperation                UNSUPPORTED
        ├── SchemaInvalid (ValueError)          SCHEMA_INVALID
        ├── PolicyViolation (PermissionError)   POLICY_VIOLATION
        ├── StaleVersion                        STALE_VERSION
        ├── BudgetExceeded                      BUDGET_EXCEEDED
        ├── InvalidResource (ValueError)        INVALID_RESOURCE
        ├── LeaseError
        │   ├── LeaseHeld                       LEASE_HELD
        │   ├── LeaseLost                       LEASE_LOST
        │   ├── LeaseNotFound (LookupError)     LEASE_NOT_FOUND
        │   └── LeaseTimeout (TimeoutError)     LEASE_TIMEOUT
        └── BackendError (OSError)              BACKEND
            └── JournalCorrupt                  JOURNAL_CORRUPT

    The sync layer's token errors (``TokenError`` and below) hang under this root too.
    """

    code: str = "CRDTSTORE_ERROR"

    def to_dict(self) -> dict[str, object]:
        """A JSON-able form: ``{"code": ..., "message": ...}`` plus the error's fields."""
        out: dict[str, object] = {"code": self.code, "message": str(self)}
        for key, value in vars(self).items():
            if not key.startswith("_") and isinstance(value, (str, int, float, bool, type(None))):
                out[key] = value
        return out


class InvalidName(CrdtStoreError, ValueError):
    """A run, agent, tenant or collection name is not acceptable."""

    code = "INVALID_NAME"

    def __init__(self, kind: str, name: object, reason: str) -> None:
        self.kind = kind
        self.name = repr(name)
        self.reason = reason
        super().__init__(f"invalid {kind} name {name!r}: {reason}")


class InvalidValue(CrdtStoreError, ValueError):
    """A value cannot be stored in the record (not JSON-like, NaN, non-string key, ...)."""

    code = "INVALID_VALUE"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"invalid value: {reason}")


class InvalidUpdate(CrdtStoreError, ValueError):
    """Update bytes could not be decoded or applied; the record was left unchanged."""

    code = "INVALID_UPDATE"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"invalid update: {reason}")


class PayloadTooLarge(CrdtStoreError, ValueError):
    """A payload (update, value) is larger than the configured limit."""

    code = "PAYLOAD_TOO_LARGE"

    def __init__(self, what: str, size: int, limit: int) -> None:
        self.what = what
        self.size = size
        self.limit = limit
        super().__init__(f"{what} of {size} bytes exceeds the limit of {limit} bytes")


class UnsupportedURL(CrdtStoreError, ValueError):
    """``open_store`` was given a URL whose scheme no installed backend handles."""

    code = "UNSUPPORTED_URL"

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"cannot open store {url!r}: {reason}")


class CollectionKindMismatch(CrdtStoreError, TypeError):
    """A collection name is already used by a collection of another kind."""

    code = "COLLECTION_KIND"

    def __init__(self, name: str, existing: str, requested: str) -> None:
        self.collection = name
        self.existing = existing
        self.requested = requested
        super().__init__(f"collection {name!r} is a {existing}, not a {requested}")


class UnknownRun(CrdtStoreError, LookupError):
    """The run does not exist in the store (and creating it was not asked for)."""

    code = "UNKNOWN_RUN"

    def __init__(self, tenant: str, run: str) -> None:
        self.tenant = tenant
        self.run = run
        super().__init__(f"unknown run {run!r} in tenant {tenant!r}")


_HOW_TO_OPEN = {
    "store": "open it with `async with crdtstore.open_store(url) as store:` (or `await"
    " store.start()`)",
    "record": "open it with `async with store.open_record(run, agent) as rec:` (or"
    " `await rec.start()`)",
}


class StoreClosed(CrdtStoreError, RuntimeError):
    """The store or record was used after it was closed (or before it was started)."""

    code = "CLOSED"

    def __init__(self, what: str, state: str = "closed") -> None:
        self.what = what
        self.state = state
        if state == "new":
            how = _HOW_TO_OPEN.get(what, "start it first")
            super().__init__(f"{what} is not open yet: {how}")
        elif state == "open":
            super().__init__(f"{what} is open already: start it once")
        else:
            super().__init__(f"{what} is closed")


class NestedTransaction(CrdtStoreError, RuntimeError):
    """``rec.transaction()`` opened inside a transaction of the same record (by the same
    task): transactions do not nest; write inside the open one."""

    code = "NESTED_TRANSACTION"

    def __init__(self, run: str) -> None:
        self.run = run
        super().__init__(
            f"a transaction of run {run!r} is open in this task: transactions do not nest"
        )


class RunClosed(CrdtStoreError, PermissionError):
    """The run is closed or archived: its record can be read, not written."""

    code = "RUN_CLOSED"

    def __init__(self, tenant: str, run: str, state: str) -> None:
        self.tenant = tenant
        self.run = run
        self.state = state
        super().__init__(f"run {run!r} of tenant {tenant!r} is {state}: no more writes")


class ReadOnlyAccess(RunClosed):
    """The store was opened with read-only access to the run (a ``ro`` token): writes are
    refused, finally (like a closed run's)."""

    code = "READ_ONLY"

    def __init__(self, tenant: str, run: str) -> None:
        super().__init__(tenant, run, "read-only for this token")


class UnsupportedOperation(CrdtStoreError):
    """The backend cannot do this (``compact`` or ``delete_run`` through a ``ws://`` store)."""

    code = "UNSUPPORTED"

    def __init__(self, backend: str, operation: str, reason: str = "") -> None:
        self.backend = backend
        self.operation = operation
        self.reason = reason
        super().__init__(
            f"{backend} backend does not support {operation}" + (f": {reason}" if reason else "")
        )


class BackendError(CrdtStoreError, OSError):
    """The storage backend failed (disk full, database locked for too long, ...)."""

    code = "BACKEND"

    def __init__(self, backend: str, reason: str) -> None:
        self.backend = backend
        self.reason = reason
        super().__init__(f"{backend} backend failed: {reason}")


class JournalCorrupt(BackendError):
    """A journal entry failed its checksum; it was not applied."""

    code = "JOURNAL_CORRUPT"

    def __init__(self, run: str, seq: int, reason: str) -> None:
        self.run = run
        self.seq = seq
        super().__init__("journal", f"entry {seq} of run {run!r} is corrupt: {reason}")


class SchemaInvalid(CrdtStoreError, ValueError):
    """A value failed its collection's pydantic model; nothing was written.

    ``errors`` is pydantic's error list (JSON-able).
    """

    code = "SCHEMA_INVALID"

    def __init__(self, collection: str, key: str | None, errors: list[dict[str, Any]]) -> None:
        self.collection = collection
        self.key = key
        self.errors = errors
        where = f"{collection}[{key!r}]" if key is not None else collection
        first = errors[0] if errors else {}
        loc = ".".join(str(p) for p in first.get("loc", ())) or "value"
        super().__init__(
            f"value for {where} does not match its schema: {loc}: {first.get('msg', 'invalid')}"
            + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
        )

    def to_dict(self) -> dict[str, object]:
        out = super().to_dict()
        out["errors"] = self.errors
        return out


class PolicyViolation(CrdtStoreError, PermissionError):
    """A write (or read) was refused by a collection's policy or a scope; nothing was written."""

    code = "POLICY_VIOLATION"

    def __init__(self, policy: str, agent: str, collection: str, key: str | None, reason: str):
        self.policy = policy
        self.agent = agent
        self.collection = collection
        self.key = key
        self.reason = reason
        where = f"{collection}[{key!r}]" if key is not None else collection
        super().__init__(f"{policy} policy refuses {agent!r} on {where}: {reason}")


class StaleVersion(CrdtStoreError):
    """A guarded write's expected version is not current; nothing was written.

    Carries the current version and value so the caller can retry on fresh data.
    """

    code = "STALE_VERSION"

    def __init__(
        self,
        collection: str,
        key: str | None,
        expected: object,
        current_version: object,
        current_value: Any = None,
    ) -> None:
        self.collection = collection
        self.key = key
        self.expected_version = expected
        self.current_version = current_version
        self.current_value = current_value
        where = f"{collection}[{key!r}]" if key is not None else collection
        super().__init__(
            f"stale write to {where}: expected version {expected!r}, current is {current_version!r}"
        )

    def to_dict(self) -> dict[str, object]:
        out = super().to_dict()
        out["current_value"] = self.current_value
        return out


class BudgetExceeded(CrdtStoreError):
    """A write would take a collection past a size budget; nothing was written."""

    code = "BUDGET_EXCEEDED"

    def __init__(
        self, collection: str, budget: str, used: float, adding: float, limit: float
    ) -> None:
        self.collection = collection
        self.budget = budget
        self.used = used
        self.adding = adding
        self.limit = limit
        super().__init__(
            f"{collection}: {budget} budget exceeded ({used} used + {adding} > limit {limit})"
        )


class InvalidResource(CrdtStoreError, ValueError):
    """A lease resource is not acceptable (absolute path, escapes the repo, bad item id)."""

    code = "INVALID_RESOURCE"

    def __init__(self, resource: object, reason: str) -> None:
        self.resource = repr(resource)
        self.reason = reason
        super().__init__(f"invalid resource {resource!r}: {reason}")


class LeaseError(CrdtStoreError):
    """Root of lease errors."""

    code = "LEASE_ERROR"


class LeaseHeld(LeaseError):
    """The resource is held by someone else (and waiting was not asked for)."""

    code = "LEASE_HELD"

    def __init__(self, resource: str, holder: str, token: int | None = None) -> None:
        self.resource = resource
        self.holder = holder
        self.token = token
        super().__init__(f"{resource!r} is held by {holder!r}")


class LeaseLost(LeaseError):
    """The lease is no longer granted (expired, reaped, released) or its token is superseded."""

    code = "LEASE_LOST"

    def __init__(self, resource: str, reason: str, token: int | None = None) -> None:
        self.resource = resource
        self.reason = reason
        self.token = token
        super().__init__(f"lease on {resource!r} lost: {reason}")


class LeaseNotFound(LeaseError, LookupError):
    """No such lease or request (or it belongs to another owner)."""

    code = "LEASE_NOT_FOUND"

    def __init__(self, lease_id: object, reason: str = "no such lease") -> None:
        self.lease_id = repr(lease_id)
        self.reason = reason
        super().__init__(f"lease {lease_id!r}: {reason}")


class LeaseTimeout(LeaseError, TimeoutError):
    """Waiting for a lease passed its deadline; the request was withdrawn."""

    code = "LEASE_TIMEOUT"

    def __init__(self, resources: list[str], waited: float) -> None:
        self.resources = resources
        self.waited = waited
        super().__init__(f"timed out after {waited:.3f}s waiting for {resources!r}")


def _subclasses(cls: type[CrdtStoreError]) -> list[type[CrdtStoreError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_subclasses(sub))
    return out


def error_from_dict(data: dict[str, Any]) -> CrdtStoreError:
    """The error that ``to_dict()`` described: the crdtstore class of its ``code`` (a plain
    :class:`CrdtStoreError` carrying the code for codes of other packages) with the same
    message and fields. Its ``__init__`` is not called: the fields are taken as they are."""
    code = str(data.get("code", CrdtStoreError.code))
    by_code = {c.code: c for c in reversed(_subclasses(CrdtStoreError))}
    cls = by_code.get(code, CrdtStoreError)
    exc = cls.__new__(cls)
    Exception.__init__(exc, str(data.get("message", code)))
    for key, value in data.items():
        if key not in ("code", "message"):
            setattr(exc, key, value)
    if cls is CrdtStoreError:
        exc.code = code
    if isinstance(exc, StaleVersion) and not hasattr(exc, "current_value"):
        exc.current_value = None
    return exc
