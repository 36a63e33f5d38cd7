"""The in-process journal backend behind ``memory://`` URLs.

``memory://`` opens a private, empty store; ``memory://NAME`` opens the store of that name
shared by every ``open_store`` call of this process (handy in notebooks and tests).
Nothing survives the process.
"""

from __future__ import annotations

import copy
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import anyio

from .._errors import InvalidValue, RunClosed, UnknownRun
from .._journal import Authority, JournalBackend, NewEntry, Row, RunRow, SnapshotRow


@dataclass
class _Run:
    created: float
    rows: list[Row] = field(default_factory=list)
    head: int = 0
    snapshot: SnapshotRow | None = None
    config: dict[str, Any] = field(default_factory=dict)
    lock: anyio.Lock | None = None
    parent: str | None = None
    state: str = "open"
    delete_after: float | None = None


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
        seqs = []
        for e in entries:
            r.head += 1
            r.rows.append(Row(r.head, *e))
            seqs.append(r.head)
        return seqs

    async def read(
        self, tenant: str, run: str, after: int, limit: int = 10_000, *, skip_client: int = -1
    ) -> list[Row]:
        rows = self._run(tenant, run).rows
        if not rows or rows[-1].seq <= after:
            return []
        # seqs are dense from the first kept row on, so the start index is arithmetic
        start = max(0, after - rows[0].seq + 1)
        return rows[start : start + limit]

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
            r.rows = [row for row in r.rows if row.seq > r.snapshot.seq]

    async def history(self, tenant: str, run: str, collection: str, key: str) -> list[Row]:
        return [
            row
            for row in self._run(tenant, run).rows
            if any(op[0] == "map" and op[1] == collection and op[3] == key for op in row.effect)
        ]

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
                r.rows = [row for row in r.rows if row.seq <= head]
                r.head = head
                raise

    async def delete_run(self, tenant: str, run: str) -> bool:
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
