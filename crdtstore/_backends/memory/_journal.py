"""The in-process journal backend behind ``memory://`` URLs.

``memory://`` opens a private, empty store; ``memory://NAME`` opens the store of that name
shared by every ``open_store`` call of this process (handy in notebooks and tests).
Nothing survives the process.

The newest entries of small appends (about a thousand) are kept as the :class:`NewEntry`
tuples appended, numbered from ``recent_first``: appending builds nothing per entry, and a
reader gets them without decoding anything (a :class:`Row` is made per entry read). Older
entries, and at once a record's group commit (many entries, handed over by columns:
:meth:`MemoryJournal.append_columns`; the writing record itself rarely reads its own), are
packed by blocks of up to 512 into one ``marshal`` blob each (by columns) and decoded again
when read. A long run's journal is then a few untracked bytes objects instead of several
GC-tracked containers per entry, which every full collection of the cyclic GC would rescan.
"""

from __future__ import annotations

import copy
import marshal
import time
from bisect import bisect_right
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, ClassVar, Literal

import anyio

from ..._errors import InvalidValue, RunClosed, UnknownRun
from ..._journal import Authority, JournalBackend, NewEntry, Row, RunRow, SnapshotRow

_tuple_new = tuple.__new__
_dumps = marshal.dumps
_loads = marshal.loads

_RECENT = 1024  # newest rows kept as Row objects (between _RECENT and _RECENT + _BLOCK)
_BLOCK = 512  # older rows: packed by blocks of this many
# An append of at least this many entries (a record's group commit) goes into blocks at once,
# with the recent entries before it: its entries are freed while still in the CPU's caches,
# not a thousand appends later (a reader of them, rarely any, decodes their blocks).
_DIRECT = 256
_NAMES = (0, 1, 2, 7, 8)  # agent, source, client_id, origin, call
_COLUMNS = [itemgetter(i) for i in range(len(NewEntry._fields))]

# A block of consecutive rows: (first seq, last seq, the rows' columns as plain tuples in one
# marshal blob), or, if marshal cannot hold them (values that are not JSON-like builtins, which
# crdtstore never journals), the Row objects themselves.
_Block = tuple[int, int, Any]


def _rows(first: int, entries: Sequence[tuple[Any, ...]]) -> list[Row]:
    """Rows of ``entries``, the first at journal position ``first``."""
    # ((seq,) + e builds a row's items faster than (seq, *e))
    seqs = range(first, first + len(entries))
    return [_tuple_new(Row, (seq,) + e) for seq, e in zip(seqs, entries, strict=True)]  # noqa: RUF005


def _pack_block(first: int, entries: Sequence[NewEntry]) -> _Block:
    """A block of ``entries``, the first at journal position ``first``."""
    n = len(entries)
    blob: Any
    try:
        # by columns (taken at C speed, one pass a column: zip(*entries) would hold an
        # iterator per entry at once, enough to start a collection of the cyclic GC; marshal's
        # references share repeated strings), a column of the writer's names or client id
        # that holds one value as that value alone
        cols = [list(map(get, entries)) for get in _COLUMNS]
        for i in _NAMES:
            col = cols[i]
            if type(col[0]) in (str, int) and col.count(col[0]) == n:
                cols[i] = col[:1]
        blob = _dumps(tuple(cols))
    except ValueError:
        blob = _rows(first, entries)
    return (first, first + n - 1, blob)


def _entries_of(n: int, cols: Sequence[list[Any]]) -> list[NewEntry]:
    """The ``n`` entries given by columns (see :meth:`MemoryJournal.append_columns`)."""
    full = [col if len(col) == n else col * n for col in cols]
    return [_tuple_new(NewEntry, e) for e in zip(*full, strict=True)]


def _pack_columns(first: int, n: int, cols: list[list[Any]]) -> _Block:
    """A block of the ``n`` entries given by columns (see
    :meth:`MemoryJournal.append_columns`), the first at journal position ``first``."""
    try:
        return (first, first + n - 1, _dumps(tuple(cols)))
    except ValueError:
        return _pack_block(first, _entries_of(n, cols))


def _unpack_block(block: _Block) -> list[Row]:
    first, last, blob = block
    if type(blob) is not bytes:
        return list(blob)
    n = last - first + 1
    cols = [col if len(col) == n else col * n for col in _loads(blob)]
    return _rows(first, list(zip(*cols, strict=True)))


def _block_last(block: _Block) -> int:
    return block[1]


@dataclass
class _Run:
    created: float
    blocks: list[_Block] = field(default_factory=list)  # older rows, oldest first
    # the newest entries, after the blocks, as appended: recent[i] is at position
    # recent_first + i (no Row built for an entry nobody reads)
    recent: list[NewEntry] = field(default_factory=list)
    recent_first: int = 1
    head: int = 0
    snapshot: SnapshotRow | None = None
    config: dict[str, Any] = field(default_factory=dict)
    lock: anyio.Lock | None = None
    parent: str | None = None
    state: str = "open"
    delete_after: float | None = None

    @property
    def rows(self) -> list[Row]:
        """Every kept row, oldest first (the packed ones decoded afresh)."""
        out: list[Row] = []
        for block in self.blocks:
            out.extend(_unpack_block(block))
        out.extend(_rows(self.recent_first, self.recent))
        return out

    def set_rows(self, rows: list[Row], head: int) -> None:
        """Keep ``rows`` (consecutive positions, ending at ``head`` unless empty) only."""
        self.blocks = []
        self.recent = [_tuple_new(NewEntry, tuple(row)[1:]) for row in rows]
        self.recent_first = rows[0].seq if rows else head + 1
        self.head = head
        self.pack()

    def pack(self) -> None:
        """Move the oldest of the recent entries into blocks, keeping at least ``_RECENT``."""
        recent = self.recent
        n = (len(recent) - _RECENT) // _BLOCK * _BLOCK
        if n <= 0:
            return
        first = self.recent_first
        for at in range(0, n, _BLOCK):
            self.blocks.append(_pack_block(first + at, recent[at : at + _BLOCK]))
        del recent[:n]
        self.recent_first = first + n

    def pack_all(self, entries: Sequence[NewEntry]) -> None:
        """Append ``entries`` (positions from ``head + 1`` on) and move every recent entry
        into blocks of at most ``_BLOCK``."""
        recent = self.recent
        if not recent:
            self.recent_first = self.head + 1
        recent.extend(entries)
        first = self.recent_first
        for at in range(0, len(recent), _BLOCK):
            self.blocks.append(_pack_block(first + at, recent[at : at + _BLOCK]))
        self.recent = []
        self.recent_first = first + len(recent)


class _MemoryAuthority(Authority):
    def __init__(self, journal: MemoryJournal, tenant: str, run: str) -> None:
        self._j = journal
        self._tenant = tenant
        self._run = run
        self.appended: list[int] = []

    async def read(self, after: int) -> list[Row]:
        return await self._j.read(self._tenant, self._run, after, limit=1 << 62)

    async def append(self, entries: Sequence[NewEntry]) -> list[int]:
        seqs = self._j._append(self._tenant, self._run, entries)
        self.appended.extend(seqs)
        return seqs


@dataclass
class _Data:
    runs: dict[tuple[str, str], _Run] = field(default_factory=dict)


class MemoryJournal(JournalBackend):
    """A journal held in this process's memory."""

    name = "memory"
    _shared: ClassVar[dict[str, _Data]] = {}

    def __init__(self, url: str) -> None:
        rest = url.split("://", 1)[1] if "://" in url else ""
        self._name = rest.strip("/")
        self._data = self._shared.setdefault(self._name, _Data()) if self._name else _Data()

    def lease_backend(self) -> Any:
        """The lease backend of this store (leases shared by every store of the same name)."""
        from ._leases import MemoryLeases, memory_data_for

        return MemoryLeases(memory_data_for(self._data))

    async def open(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def ensure_run(
        self, tenant: str, run: str, *, create: bool, parent: str | None = None
    ) -> RunRow:
        r = self._data.runs.get((tenant, run))
        if r is None:
            if not create:
                raise UnknownRun(tenant, run)
            if parent is not None and (tenant, parent) not in self._data.runs:
                raise UnknownRun(tenant, parent)
            r = self._data.runs[(tenant, run)] = _Run(created=time.time(), parent=parent)
        elif parent is not None and r.parent != parent:
            raise InvalidValue(f"run {run!r} exists with parent {r.parent!r}, not {parent!r}")
        return self._info(tenant, run, r)

    async def set_run(
        self,
        tenant: str,
        run: str,
        *,
        state: str | None = None,
        delete_after: float | Literal["keep"] | None = "keep",
    ) -> RunRow:
        r = self._run(tenant, run)
        if state is not None:
            r.state = state
        if delete_after != "keep":
            r.delete_after = delete_after
        return self._info(tenant, run, r)

    def _info(self, tenant: str, run: str, r: _Run) -> RunRow:
        return RunRow(
            tenant,
            run,
            r.created,
            r.head,
            r.snapshot.seq if r.snapshot else 0,
            r.parent,
            r.state,
            r.delete_after,
        )

    async def get_run(self, tenant: str, run: str) -> RunRow | None:
        r = self._data.runs.get((tenant, run))
        return None if r is None else self._info(tenant, run, r)

    async def tenants(self) -> list[str]:
        return sorted({t for t, _ in self._data.runs})

    async def list_runs(self, tenant: str) -> list[RunRow]:
        out = [self._info(t, n, r) for (t, n), r in self._data.runs.items() if t == tenant]
        return sorted(out, key=lambda i: i.created)

    def _run(self, tenant: str, run: str) -> _Run:
        r = self._data.runs.get((tenant, run))
        if r is None:
            raise UnknownRun(tenant, run)
        return r

    async def append(
        self, tenant: str, run: str, entries: Sequence[NewEntry], *, durable: bool
    ) -> list[int]:
        r = self._run(tenant, run)
        if r.lock is not None and r.lock.locked():
            async with r.lock:  # wait for an open authority transaction to end
                pass
        return self._append(tenant, run, entries)

    def _append(self, tenant: str, run: str, entries: Sequence[NewEntry]) -> list[int]:
        r = self._run(tenant, run)
        if r.state != "open":
            raise RunClosed(tenant, run, r.state)
        recent = r.recent
        head = r.head
        if len(entries) >= _DIRECT:
            r.pack_all(entries)
        else:
            if not recent:
                r.recent_first = head + 1
            recent.extend(entries)
            if len(recent) >= _RECENT + _BLOCK:
                r.pack()
        r.head = head + len(entries)
        return list(range(head + 1, r.head + 1))

    async def append_columns(
        self, tenant: str, run: str, columns: Sequence[list[Any]], *, durable: bool
    ) -> list[int]:
        """:meth:`append` of entries given by columns: :class:`NewEntry`'s fields in order,
        each a list with an item per entry, or one item that every entry has (what a record's
        committer hands over: a group commit goes into blocks without a tuple per entry)."""
        r = self._run(tenant, run)
        if r.lock is not None and r.lock.locked():
            async with r.lock:  # wait for an open authority transaction to end
                pass
        return self._append_columns(tenant, run, columns)

    def _append_columns(self, tenant: str, run: str, columns: Sequence[list[Any]]) -> list[int]:
        n = max(map(len, columns))
        if n < _DIRECT:  # (a few entries: kept as tuples among the recent ones)
            return self._append(tenant, run, _entries_of(n, columns))
        r = self._run(tenant, run)
        if r.state != "open":
            raise RunClosed(tenant, run, r.state)
        if r.recent:
            r.pack_all(())
        head = r.head
        for at in range(0, n, _BLOCK):
            part = [col if len(col) == 1 else col[at : at + _BLOCK] for col in columns]
            r.blocks.append(_pack_columns(head + 1 + at, min(_BLOCK, n - at), part))
        r.head = head + n
        r.recent_first = r.head + 1
        return list(range(head + 1, r.head + 1))

    async def read(
        self, tenant: str, run: str, after: int, limit: int = 10_000, *, skip_client: int = -1
    ) -> list[Row]:
        r = self._run(tenant, run)
        recent, first = r.recent, r.recent_first
        if recent and first <= after + 1:  # the usual tail read: nothing to decode
            if r.head <= after:
                return []
            start = after + 1 - first
            return _rows(after + 1, recent[start : start + limit])
        # an older position: decode the blocks from the one holding after + 1 on
        blocks = r.blocks
        out: list[Row] = []
        for block in blocks[bisect_right(blocks, after, key=_block_last) :]:
            out.extend(row for row in _unpack_block(block) if row.seq > after)
            if len(out) >= limit:
                return out[:limit]
        out.extend(_rows(first, recent[: limit - len(out)]))
        return out

    async def head(self, tenant: str, run: str) -> int:
        return self._run(tenant, run).head

    async def load_snapshot(self, tenant: str, run: str) -> SnapshotRow | None:
        return self._run(tenant, run).snapshot

    async def save_snapshot(
        self, tenant: str, run: str, snapshot: SnapshotRow, *, drop_journal: bool
    ) -> None:
        r = self._run(tenant, run)
        if r.snapshot is None or r.snapshot.seq < snapshot.seq:
            r.snapshot = snapshot  # else a newer snapshot is already there: keep it
        if drop_journal:
            r.set_rows([row for row in r.rows if row.seq > r.snapshot.seq], r.head)

    async def history(self, tenant: str, run: str, collection: str, key: str) -> list[Row]:
        return [
            row
            for row in self._run(tenant, run).rows
            if any(op[0] == "map" and op[1] == collection and op[3] == key for op in row.effect)
        ]

    async def rewrite_entries(self, tenant: str, run: str, rows: Sequence[Row]) -> None:
        r = self._run(tenant, run)
        new = {row.seq: row for row in rows}
        if new:
            kept = [new.get(row.seq, row) for row in r.rows]
            r.set_rows(kept, r.head)

    async def get_config(self, tenant: str, run: str) -> dict[str, Any]:
        return copy.deepcopy(self._run(tenant, run).config)

    async def update_config(
        self, tenant: str, run: str, update: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        r = self._run(tenant, run)
        r.config = copy.deepcopy(update(copy.deepcopy(r.config)))
        return copy.deepcopy(r.config)

    @asynccontextmanager
    async def authority(self, tenant: str, run: str, *, durable: bool) -> AsyncIterator[Authority]:
        r = self._run(tenant, run)
        if r.lock is None:
            r.lock = anyio.Lock()
        async with r.lock:
            auth = _MemoryAuthority(self, tenant, run)
            head = r.head
            try:
                yield auth
            except BaseException:
                # roll back what this transaction appended
                if r.recent and r.recent_first <= head + 1:
                    del r.recent[head + 1 - r.recent_first :]
                elif r.head != head:
                    r.set_rows([row for row in r.rows if row.seq <= head], head)
                r.head = head
                raise

    async def delete_run_if_due(self, tenant: str, run: str, now: float) -> bool:
        # no await between the check and the delete: one step on the event loop
        r = self._data.runs.get((tenant, run))
        if r is None or r.delete_after is None or r.delete_after > now:
            return False
        return self._delete(tenant, run)

    async def delete_run(self, tenant: str, run: str) -> bool:
        return self._delete(tenant, run)

    def _delete(self, tenant: str, run: str) -> bool:
        if (tenant, run) not in self._data.runs:
            return False
        doomed = {run}
        grew = True
        while grew:  # the run and every run nested in it, however deep
            children = {
                n for (t, n), r in self._data.runs.items() if t == tenant and r.parent in doomed
            }
            grew = not children <= doomed
            doomed |= children
        for name in doomed:
            self._data.runs.pop((tenant, name), None)
        return True
