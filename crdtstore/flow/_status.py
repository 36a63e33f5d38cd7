"""A run's workflow state as readers see it: :func:`flow_status` (what ``crdtstore flow
status`` prints), from the kernel's state map and the live lease queue."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from .._errors import CrdtStoreError
from ._state import RUN_KEY, STATE_COLLECTION, RunEntry, StepEntry, Waiter

if TYPE_CHECKING:
    from .._leases import LeaseStatus
    from .._store import Store
    from ..record import Record

__all__ = ["FlowStatus", "StepStatus", "flow_status", "status_of"]

READER_AGENT = "flow-status"


class StepStatus(BaseModel):
    """One step in tree order: its recorded entry, its depth, and for a waiting step who is
    ahead of it now (``ahead``, from the lease table; the entry's ``waiting.ahead`` is who
    was ahead when it queued)."""

    model_config = ConfigDict(frozen=True)

    depth: int
    entry: StepEntry
    ahead: list[Waiter] | None = None


class FlowStatus(BaseModel):
    """The workflow of one run: ``run`` (its ``@run`` entry, None before a kernel started)
    and ``steps`` in tree order (parents first, siblings in spec order)."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    run: RunEntry | None
    steps: list[StepStatus]

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def step(self, path: str) -> StepStatus | None:
        for s in self.steps:
            if s.entry.path == path:
                return s
        return None


def _tree(entries: dict[str, StepEntry]) -> list[tuple[int, StepEntry]]:
    children: dict[str, list[StepEntry]] = {}
    for e in entries.values():
        children.setdefault(e.parent, []).append(e)
    out: list[tuple[int, StepEntry]] = []

    def walk(parent: str, depth: int) -> None:
        for e in sorted(children.get(parent, ()), key=lambda e: (e.index, e.path)):
            out.append((depth, e))
            walk(e.path, depth + 1)

    walk("", 0)
    seen = {e.path for _, e in out}
    out.extend((0, e) for p, e in sorted(entries.items()) if p not in seen)  # orphans
    return out


def status_of(rec: Record, leases: LeaseStatus | None = None) -> FlowStatus:
    """The status from an open record of the run (and the store's lease status, to tell who
    is ahead of each waiting step now)."""
    m = rec.map(STATE_COLLECTION) if STATE_COLLECTION in rec.collections() else None
    entries: dict[str, StepEntry] = {}
    run: RunEntry | None = None
    for key, value in m.items() if m is not None else ():
        try:
            if key == RUN_KEY:
                run = RunEntry.model_validate(value)
            else:
                entries[key] = StepEntry.model_validate(value)
        except ValueError:
            continue  # an entry of a newer kernel, or damaged: not shown
    owner = f"flow:{rec.run}"
    requests = [*leases.holders, *leases.waiters] if leases is not None else []
    by_rank = {r.rank: r for r in requests}
    steps = []
    for depth, e in _tree(entries):
        ahead: list[Waiter] | None = None
        if e.state == "waiting_on_lock" and leases is not None:
            mine = next(
                (r for r in requests if r.owner == owner and r.key == (e.path, e.attempt)), None
            )
            if mine is not None:
                ahead = []
                for rank in mine.blocked_by:
                    r = by_rank.get(rank)
                    if r is not None:
                        ahead.append(Waiter(
                            rank=r.rank, owner=r.owner, state=r.state,
                            key=list(r.key) if r.key is not None else None,
                            resources=sorted(set(r.resources).intersection(mine.resources)),
                        ))  # fmt: skip
        steps.append(StepStatus(depth=depth, entry=e, ahead=ahead))
    return FlowStatus(run_id=rec.run, run=run, steps=steps)


async def flow_status(store: Store, run: str) -> FlowStatus:
    """The workflow state of ``run``: every step's entry in tree order, with who is ahead of
    each ``waiting_on_lock`` step now.

    Raises:
        UnknownRun: the run does not exist.
    """
    async with store.open_record(run, READER_AGENT, "system", create=False) as rec:
        try:
            leases = await store.leases.status()
        except CrdtStoreError:  # a backend without leases, or unreachable: no queue shown
            leases = None
        return status_of(rec, leases)
