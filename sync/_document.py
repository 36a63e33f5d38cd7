"""What a sync session needs from a document, and adapters for a pycrdt Doc and a Replica.

A session never touches pycrdt itself: it calls a :class:`Document`. The hub plugs in a
document that journals what it applies; tests plug in a bare ``pycrdt.Doc``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pycrdt import Doc, get_state

from crdtstore import InvalidUpdate, PayloadTooLarge, Replica
from crdtstore.codec import check_update_counts, decode_update

__all__ = ["Document", "PycrdtDocument", "ReplicaDocument"]

DEFAULT_MAX_UPDATE = 16 * 1024 * 1024


@runtime_checkable
class Document(Protocol):
    """The document behind a session.

    ``apply_update`` must leave the document unchanged when it refuses bytes, and refuse
    them with :class:`crdtstore.InvalidUpdate` (or ``ValueError``), or with
    :class:`crdtstore.PayloadTooLarge` (``what="document"`` when the document would grow past
    its limit). Any other error propagates out of the session as is (a backend failure is
    not the peer's fault).
    """

    def get_state(self) -> bytes:
        """The document's state vector (v1)."""
        ...

    def get_update(self, state_vector: bytes) -> bytes:
        """The update (v1) holding what a peer at ``state_vector`` misses."""
        ...

    def apply_update(self, update: bytes) -> None:
        """Apply an update (v1) from the peer."""
        ...


def _is_fatal(exc: BaseException) -> bool:
    return isinstance(exc, (KeyboardInterrupt, SystemExit, MemoryError))


class PycrdtDocument:
    """A bare ``pycrdt.Doc`` as a session's document.

    Update bytes are parsed (``pycrdt.get_state``) before they are applied, and pycrdt's
    failures (``ValueError``, ``RuntimeError``, Rust panics, which are ``BaseException``) are
    turned into :class:`crdtstore.InvalidUpdate`.
    """

    def __init__(self, doc: Doc[Any] | None = None, *, max_update: int = DEFAULT_MAX_UPDATE):
        self.doc: Doc[Any] = doc if doc is not None else Doc()
        self.max_update = max_update

    def get_state(self) -> bytes:
        return bytes(self.doc.get_state())

    def get_update(self, state_vector: bytes) -> bytes:
        try:
            return bytes(self.doc.get_update(state_vector))
        except BaseException as exc:
            if _is_fatal(exc):
                raise
            raise InvalidUpdate(f"state vector refused: {type(exc).__name__}: {exc}") from None

    def apply_update(self, update: bytes) -> None:
        if len(update) > self.max_update:
            raise PayloadTooLarge("update", len(update), self.max_update)
        check_update_counts(update)  # (an InvalidUpdate: pycrdt pre-allocates for the counts)
        try:
            get_state(update)
        except BaseException as exc:
            if _is_fatal(exc):
                raise
            raise InvalidUpdate(f"{type(exc).__name__}: {exc}") from None
        # the strict decode (a CodecError is an InvalidUpdate): bytes pycrdt would take into
        # a document it can no longer encode (a struct of length 0) are refused
        decoded = decode_update(update)
        try:
            if decoded.nested:
                # pycrdt refuses an item whose parent id is not a shared type after
                # integrating the items before it: try such an update on a copy first
                trial: Doc[Any] = Doc()
                trial.apply_update(self.doc.get_update())
                trial.apply_update(update)
            self.doc.apply_update(update)
        except BaseException as exc:
            if _is_fatal(exc):
                raise
            raise InvalidUpdate(f"{type(exc).__name__}: {exc}") from None


class ReplicaDocument:
    """A :class:`crdtstore.Replica` as a session's document (it checks updates itself)."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica

    def get_state(self) -> bytes:
        return bytes(self.replica.doc.get_state())

    def get_update(self, state_vector: bytes) -> bytes:
        try:
            return bytes(self.replica.doc.get_update(state_vector))
        except BaseException as exc:
            if _is_fatal(exc):
                raise
            raise InvalidUpdate(f"state vector refused: {type(exc).__name__}: {exc}") from None

    def apply_update(self, update: bytes) -> None:
        self.replica.apply_update(update)
