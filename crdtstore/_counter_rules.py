"""The rules of counter collections (``CollectionSpec(kind="counter")``), pure.

A counter is a root map with one key per writing replica, ``<agent>\\x1f<client id>``,
holding that replica's running total: no two replicas ever write one key (every Doc has a
fresh random client id), so concurrent adds never overwrite each other and merge in any
order, and the counter's value is the sum of its entries. A replica that reopens the run
gets a new client id, hence a new key; the old key keeps what it added.

What a write to a counter may do (checked for every writer, plain Yjs clients through the
hub included): set a key that names the writer (``<agent>\x1f...``, or ``<agent>``) to a
finite number; never delete one. A key is owned by the agent it names, as a map entry under
the ``owner`` policy by its creator: another agent's write of it (which could undo what that
agent added) is refused with the owner policy's ``PolicyViolation``. So a counter takes no
policy of its own. With ``max_value`` a write that raises the value past it is refused
(``BudgetExceeded``); lowering it is always allowed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Protocol

from ._errors import BudgetExceeded, InvalidValue, PolicyViolation

SEP = "\x1f"
MAX_SAFE = 2**53  # beyond it a number is not exact in JSON/JavaScript


class CounterState(Protocol):
    def counter_total(self, collection: str) -> float: ...

    def counter_part(self, collection: str, key: str) -> float: ...


def contribution_key(agent: str, client_id: int) -> str:
    """The key a replica (``client_id``) writing as ``agent`` adds under."""
    return f"{agent}{SEP}{client_id}"


def agent_of_key(key: str) -> str:
    """The agent a contribution key names (a plain client's own key: all of it)."""
    return key.rsplit(SEP, 1)[0]


def is_number(value: Any) -> bool:
    t = type(value)
    return (t is int or t is float) and math.isfinite(value)


def number(value: float) -> int | float:
    """``value`` as an int when integral (pycrdt gives every number back as a float)."""
    if type(value) is float and value.is_integer() and -MAX_SAFE <= value <= MAX_SAFE:
        return int(value)
    return value


def total(values: Iterable[Any]) -> int | float:
    """The counter's value: the sum of its numeric entries (others are ignored: only a
    corrupt or foreign update can store them). Integral sums are ints."""
    acc: float = 0
    exact = True  # ints summed exactly while every entry is integral
    iacc = 0
    for v in values:
        if not is_number(v):
            continue
        if exact and float(v).is_integer():
            iacc += int(v)
        else:
            exact = False
        acc += v
    return iacc if exact else number(acc)


def check_counter_spec(
    name: str,
    *,
    policy: str,
    conflict: str,
    budgets: tuple[int | None, ...],
    model: object,
    max_value: float | None,
) -> None:
    """Raises ``InvalidValue`` for a counter declaration that cannot hold."""
    if policy == "owner":
        raise InvalidValue(
            f"collection {name!r}: a counter takes no owner policy: it always applies the"
            " owner rule, per key (each key belongs to the agent it names, and only that"
            " agent writes it); declare it with the default policy"
        )
    if policy != "open" or conflict != "lww":
        raise InvalidValue(f"collection {name!r}: a counter takes the open policy and lww only")
    if any(b is not None for b in budgets) or model is not None:
        raise InvalidValue(
            f"collection {name!r}: a counter takes no entry or byte budgets and no model"
            " (its budget is max_value)"
        )
    if max_value is not None and (not is_number(max_value) or type(max_value) is bool):
        raise InvalidValue(f"collection {name!r}: max_value must be a finite number")


def check_amount(amount: object) -> int | float:
    """``amount`` if it can be added to a counter.

    Raises:
        InvalidValue: not an int or float, not finite, or beyond ±2**53.
    """
    if type(amount) not in (int, float) or not math.isfinite(amount):  # type: ignore[arg-type]
        raise InvalidValue(f"a counter adds finite numbers, not {amount!r}")
    assert isinstance(amount, int | float)
    if abs(amount) > MAX_SAFE:
        raise InvalidValue(f"{amount} is outside ±2**53 (not exact in JSON/JavaScript)")
    return amount


def check_counter_op(op: list[Any], agent: str, max_value: float | None, state: Any) -> None:
    """Refuse an op on a counter that is not a numeric set of a key of ``agent``'s own, or
    that passes ``max_value``.

    Raises:
        PolicyViolation: a delete, a list or text op, a value that is not a number, or a
            key that names another agent (policy ``owner``, as a map entry's).
        BudgetExceeded: the write raises the counter past ``max_value``.
    """
    name = op[1]
    if op[0] != "map" or op[2] != "set":
        raise PolicyViolation(
            "counter", agent, name, op[3] if op[0] == "map" else None, "may only add"
        )
    key, value = op[3], op[4]
    owner = agent_of_key(key)
    if owner != agent:
        raise PolicyViolation("owner", agent, name, key, f"the entry belongs to {owner!r}")
    if not is_number(value) or type(value) is bool or abs(value) > MAX_SAFE:
        raise PolicyViolation("counter", agent, name, key, f"holds numbers, not {value!r}")
    if max_value is None:
        return
    old = state.counter_part(name, key)
    adding = value - old
    if adding <= 0:
        return
    now = state.counter_total(name)
    if now + adding > max_value:
        raise BudgetExceeded(name, "value", number(now), number(adding), max_value)
