"""The tools' arguments: one pydantic model per tool, the single source of its JSON schema.

Every model refuses unknown fields, so a model that misspells an argument is told so instead
of having it ignored. Descriptions are written for the model that reads them.
"""

from __future__ import annotations

from typing import Annotated, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

Collection = Annotated[
    StrictStr,
    Field(min_length=1, max_length=128, description="Name of a collection of the record."),
]
Key = Annotated[StrictStr, Field(min_length=1, max_length=1024, description="A map key.")]
Version = Annotated[StrictInt, Field(ge=0)]
Seconds = Annotated[float, Field(gt=0, le=86_400)]

MAX_EDITS = 100
MAX_RESOURCES = 64


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoreGet(_Args):
    """Read one map entry (value, version, who wrote it), or a page of a collection (map,
    list or text) with the collection's version. Echo a version back to a write
    (`expected_version`, `based_on`) so it is refused if someone else moved it meanwhile."""

    collection: Collection
    key: Key | None = Field(
        default=None, description="A map key: read that entry. Omit to read a page of entries."
    )
    cursor: StrictStr | None = Field(
        default=None, description="The `next_cursor` of an earlier page, to read the next one."
    )


class StorePut(_Args):
    """Set a map entry. With `expected_version` (the entry's `version` from store_get, 0 if
    it must not exist yet) the write succeeds only if nobody changed the entry since;
    otherwise STALE_VERSION comes back with the current version and value: re-read, decide
    again, retry."""

    collection: Collection
    key: Key
    value: Any = Field(description="Any JSON value (validated against the collection's model).")
    expected_version: Version | None = Field(
        default=None, description="Refuse the write unless the entry is still at this version."
    )
    based_on: Version | None = Field(
        default=None,
        description="The collection `version` your decision was based on: refuse the write "
        "if anything in the collection changed since.",
    )


class StoreDelete(_Args):
    """Delete a map entry (optionally only if it is still at `expected_version`)."""

    collection: Collection
    key: Key
    expected_version: Version | None = Field(
        default=None, description="Refuse the delete unless the entry is still at this version."
    )


class StoreAppend(_Args):
    """Append a value to a list collection. Concurrent appends by other agents all survive."""

    collection: Collection
    value: Any = Field(description="Any JSON value (validated against the collection's model).")


class FindReplace(_Args):
    """Replace the one occurrence of `find` by `replace`."""

    find: StrictStr = Field(min_length=1, description="Text that occurs exactly once.")
    replace: StrictStr = Field(description="What replaces it (may be empty).")


class Splice(_Args):
    """At character offset `at`, delete `delete` characters, then insert `insert`."""

    at: StrictInt = Field(ge=0, description="Character offset in the text.")
    delete: StrictInt = Field(default=0, ge=0, description="Characters to delete at `at`.")
    insert: StrictStr = Field(default="", description="Text to insert at `at`.")


class StoreTextEdit(_Args):
    """Edit a text collection by small edits, applied in order as one change; never rewrite
    the whole text (others' concurrent edits elsewhere survive). An edit whose `find` is
    absent or occurs more than once is refused and nothing is changed: re-read and retry."""

    collection: Collection
    edits: list[FindReplace | Splice] = Field(min_length=1, max_length=MAX_EDITS)


class StoreChanges(_Args):
    """What moved in the record since a version (the `version` of an earlier read or
    describe): one line per change, oldest first. Call it before acting on an old read."""

    since_version: Version = Field(description="A record version from an earlier result.")


class StoreClaim(_Args):
    """Claim a work item so that no other agent does it. LEASE_HELD if someone else has it
    (or it is done). Keep it with store_complete when done, or give it back with
    store_release."""

    collection: Collection
    item: Key = Field(description="The work item's id.")
    ttl: Seconds = Field(default=60.0, description="Seconds the claim lives if not renewed.")


class StoreComplete(_Args):
    """Mark a claimed item done, with its result, and release the claim."""

    collection: Collection
    item: Key
    result: Any = Field(default=None, description="Any JSON value: what came of the item.")


class StoreRelease(_Args):
    """Give a claimed item back without completing it."""

    collection: Collection
    item: Key


class LeaseAcquire(_Args):
    """Take exclusive leases on files (repo-relative paths) or items, all or nothing. Held
    for you between calls and renewed until lease_release; writes to a key the lease covers
    are fenced by it. LEASE_HELD names the holder when not free (after `wait_seconds`)."""

    resources: list[StrictStr] = Field(min_length=1, max_length=MAX_RESOURCES)
    ttl: Seconds = Field(default=60.0, description="Seconds the lease lives if not renewed.")
    wait_seconds: float = Field(
        default=0, ge=0, le=600, description="How long to wait in line (FIFO) if taken."
    )


class LeaseRelease(_Args):
    """Release a lease taken with lease_acquire."""

    lease_id: StrictStr = Field(min_length=1, max_length=256)


class StoreHistory(_Args):
    """Every value a map entry ever held, oldest first, with who wrote each (and by which
    tool call)."""

    collection: Collection
    key: Key
    cursor: StrictStr | None = Field(default=None, description="`next_cursor` of a page.")


class StoreDescribe(_Args):
    """The record's collections: kind, model (JSON schema), write and conflict policies,
    budgets and current size (with a token estimate), and its version. Call it first."""


class ToolSpec(NamedTuple):
    """A tool: its name, argument model, and whether it changes shared state (the record, or
    leases others wait on): a read-only toolset refuses those."""

    name: str
    args: type[_Args]
    writes: bool
    idempotent: bool = False
    destructive: bool = False


TOOLS: dict[str, ToolSpec] = {
    t.name: t
    for t in (
        ToolSpec("store_get", StoreGet, writes=False, idempotent=True),
        ToolSpec("store_put", StorePut, writes=True, idempotent=True, destructive=True),
        ToolSpec("store_delete", StoreDelete, writes=True, idempotent=True, destructive=True),
        ToolSpec("store_append", StoreAppend, writes=True),
        ToolSpec("store_text_edit", StoreTextEdit, writes=True, destructive=True),
        ToolSpec("store_changes", StoreChanges, writes=False, idempotent=True),
        ToolSpec("store_claim", StoreClaim, writes=True),
        ToolSpec("store_complete", StoreComplete, writes=True),
        ToolSpec("store_release", StoreRelease, writes=True),
        ToolSpec("lease_acquire", LeaseAcquire, writes=True),
        ToolSpec("lease_release", LeaseRelease, writes=True, idempotent=True),
        ToolSpec("store_history", StoreHistory, writes=False, idempotent=True),
        ToolSpec("store_describe", StoreDescribe, writes=False, idempotent=True),
    )
}
"""Every tool, in the order the schemas list them. Names are a contract: never rename."""

TOOL_NAMES: tuple[str, ...] = tuple(TOOLS)
