"""Values that cross the lease layer's boundary (frozen pydantic models)."""

from __future__ import annotations

from collections.abc import Callable
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


_STATE_FIELDS = frozenset(LeaseState.model_fields)
_object_setattr = object.__setattr__


def _construct_state(values: dict[str, object]) -> LeaseState:
    # what ``model_construct`` does for a model without aliases, defaults to fill, extras or
    # private attributes, minus its generality (it costs more than validating)
    m = LeaseState.__new__(LeaseState)
    _object_setattr(m, "__dict__", values)
    _object_setattr(m, "__pydantic_fields_set__", set(_STATE_FIELDS))
    _object_setattr(m, "__pydantic_extra__", None)
    _object_setattr(m, "__pydantic_private__", None)
    return m


def _construct_ok() -> bool:
    values: dict[str, object] = {
        "lease_id": "0" * 16, "rank": 1, "owner": "o", "resources": ("a",), "state": "granted",
        "token": 1, "ttl": 1.0, "expires_in": 1.0, "key": ("s", 1), "wake_in": None,
        "watch_pids": (),
    }  # fmt: skip
    fast, slow = _construct_state(dict(values)), LeaseState.model_validate(values)
    return (
        set(values) == _STATE_FIELDS
        and fast == slow
        and fast.model_dump() == slow.model_dump()
        and fast.model_fields_set == slow.model_fields_set
    )


_CONSTRUCT_OK = _construct_ok()  # False only if a pydantic release changed its internals


def _validated_state(values: dict[str, object]) -> LeaseState:  # pragma: no cover
    return LeaseState.model_validate(values)


# A ``LeaseState`` from values the lease engine built itself (every field, of the right type),
# without validating them again: this is on the path of every lease transition (chosen once,
# not per call).
lease_state: Callable[[dict[str, object]], LeaseState] = (
    _construct_state if _CONSTRUCT_OK else _validated_state
)


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
