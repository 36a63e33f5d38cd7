"""Values that cross the lease layer's boundary (frozen pydantic models)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

LeaseStateName = Literal["granted", "waiting_on_lock"]

MIN_TTL = 0.05
MAX_TTL = 86_400.0


class LeaseState(BaseModel):
    """A request as its owner sees it after a request, re-attach or heartbeat."""

    model_config = ConfigDict(frozen=True)

    lease_id: str
    rank: int
    owner: str
    resources: tuple[str, ...]
    state: LeaseStateName
    token: int | None
    ttl: float
    expires_in: float
    key: tuple[str, int] | None = None
    # Hints for a waiter: seconds until the earliest deadline among the requests it waits
    # behind (when that one is reaped it may be granted), and pids of live holders on this
    # host that it can watch for exit.
    wake_in: float | None = None
    watch_pids: tuple[int, ...] = ()

    @property
    def granted(self) -> bool:
        return self.state == "granted"


class LeaseInfo(BaseModel):
    """One request in :class:`LeaseStatus`."""

    model_config = ConfigDict(frozen=True)

    lease_id: str
    rank: int
    owner: str
    key: tuple[str, int] | None
    resources: tuple[str, ...]
    state: LeaseStateName
    token: int | None
    ttl: float
    age: float  # seconds since the request was made
    held_for: float | None  # seconds since it was granted
    expires_in: float  # seconds until the TTL reaps it (negative: overdue, reaped next time)
    host: str | None
    pid: int | None
    blocked_by: tuple[int, ...] = ()  # ranks of the requests it waits behind


class LeaseStatus(BaseModel):
    """Every holder and waiter of one tenant, in rank order."""

    model_config = ConfigDict(frozen=True)

    holders: tuple[LeaseInfo, ...]
    waiters: tuple[LeaseInfo, ...]
    next_token: int

    def to_json_dict(self) -> dict[str, object]:
        return self.model_dump(mode="json")
