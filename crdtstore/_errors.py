"""The error tree of crdtstore.

Every error has a stable machine ``code`` (what agent tools and the sync hub return) and
composes its own message from its fields::

    CrdtStoreError
    ├── InvalidName (ValueError)            INVALID_NAME
    ├── InvalidValue (ValueError)           INVALID_VALUE
    ├── InvalidUpdate (ValueError)          INVALID_UPDATE
    ├── PayloadTooLarge (ValueError)        PAYLOAD_TOO_LARGE
    ├── UnsupportedURL (ValueError)         UNSUPPORTED_URL
    ├── CollectionKindMismatch (TypeError)  COLLECTION_KIND
    ├── UnknownRun (LookupError)            UNKNOWN_RUN
    ├── StoreClosed (RuntimeError)          CLOSED
    └── BackendError (OSError)              BACKEND
        └── JournalCorrupt                  JOURNAL_CORRUPT

Errors of the backends' libraries (sqlite3, ...) are translated into ``BackendError`` at the
backend boundary, so callers never have to catch a driver's exception type.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "CollectionKindMismatch",
    "CrdtStoreError",
    "InvalidName",
    "InvalidUpdate",
    "InvalidValue",
    "JournalCorrupt",
    "PayloadTooLarge",
    "StoreClosed",
    "UnknownRun",
    "UnsupportedURL",
]


class CrdtStoreError(Exception):
    """Root of every error crdtstore raises on purpose."""

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


class StoreClosed(CrdtStoreError, RuntimeError):
    """The store or record was used after it was closed (or before it was started)."""

    code = "CLOSED"

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"{what} is closed")


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
