"""Counter collections: ``await rec.counter("tokens_used").add(5)``; ``.value`` is the sum.

A counter is a root map with one key per writing replica (``<agent>\\x1f<client id>``, see
:mod:`crdtstore._counter_rules`) holding that replica's running total, so increments from
any number of agents merge without a guarded write and none is lost; plain Yjs clients read
it as a ``Y.Map`` of numbers (and count by setting a key of their own to their running
total). Each add is one journal entry whose effect is a map ``set`` of the replica's key.

``max_value`` (the budget) is exact: with it, every add is decided at the store's authority
(a guarded write based on the counter's version, as ``based_on`` of a map write), so two
processes adding at once cannot pass the budget together; the add that would is refused
with ``BudgetExceeded`` and changes nothing. Without a budget, adds take the plain write path.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

from .._counter_rules import (
    MAX_SAFE,
    agent_of_key,
    check_amount,
    contribution_key,
    number,
    total,
)
from .._errors import CollectionKindMismatch, InvalidValue, StaleVersion
from .._journal import Op
from .._models import Version
from .._semantics import CollectionSpec


class CounterHost(Protocol):
    """What a counter uses of its record (:class:`~._record.Record` implements it)."""

    run: str
    agent: str

    @property
    def replica(self) -> Any: ...

    def spec(self, name: str) -> CollectionSpec | None: ...

    def collections(self) -> dict[str, str]: ...

    async def declare(self, name: str, spec: CollectionSpec) -> None: ...

    async def _load_specs(self, declare: Mapping[str, CollectionSpec]) -> None: ...

    def current_version(self, collection: str | None = None) -> Version: ...

    async def sync(self) -> int: ...

    def _stage(
        self, ops: Any, apply: Callable[[], None] | None = None, root: Any = None
    ) -> Coroutine[Any, Any, None] | None: ...

    async def _write_guarded(
        self,
        name: str,
        key: str,
        expected: int | None,
        ops: list[Op],
        apply: Callable[[], None],
        current: Callable[[], Any],
        based_on: Version | None = None,
    ) -> int: ...


MAX_RETRIES = 64  # budgeted adds refused in a row because the counter moved meanwhile


class CounterCollection:
    """A counter: adds from every replica merge; ``value`` is their sum (see the module)."""

    kind = "counter"

    def __init__(self, rec: CounterHost, name: str, root: Any) -> None:
        self._rec = rec
        self.name = name
        self._root = root
        self._own: tuple[str, int | float] | None = None  # (own key, its total) last written

    @property
    def value(self) -> int | float:
        """The counter's value as this replica knows it: an int when integral."""
        return total(self._root.values())

    def contributions(self) -> dict[str, int | float]:
        """What each agent added (summed over its replicas), by agent, sorted."""
        out: dict[str, float] = {}
        for key, v in self._root.items():
            if type(v) in (int, float):
                agent = agent_of_key(key)
                out[agent] = out.get(agent, 0) + v
        return {a: number(v) for a, v in sorted(out.items())}

    def entries(self) -> dict[str, int | float]:
        """The raw entries: contribution key -> that replica's running total."""
        return {k: number(v) for k, v in sorted(self._root.items()) if type(v) in (int, float)}

    @property
    def max_value(self) -> float | None:
        """The declared budget (None: no budget)."""
        spec = self._rec.spec(self.name)
        return None if spec is None else spec.max_value

    async def add(self, amount: int | float = 1) -> None:
        """Add ``amount`` (may be negative); read the result with :attr:`value` (summing
        every replica's entry costs more than the add, so the add does not).

        Declares the collection as a counter on first use if the run has not.

        Raises:
            InvalidValue: ``amount`` is not a finite number within ±2**53.
            CollectionKindMismatch: the name is (or meanwhile became) a map, list or text.
            BudgetExceeded: the add would take the counter past ``max_value``; nothing was
                written.
        """
        amount = check_amount(amount)
        rec = self._rec
        spec = rec.spec(self.name)
        if spec is None:
            await rec._load_specs({})  # declared since this record opened?
            spec = rec.spec(self.name)
        if spec is None:
            existing = rec.collections().get(self.name)
            if existing is not None:  # an undeclared map, list or text
                raise CollectionKindMismatch(self.name, existing, "counter")
            await rec.declare(self.name, CollectionSpec(kind="counter"))
            spec = rec.spec(self.name)
        assert spec is not None
        if spec.kind != "counter":
            raise CollectionKindMismatch(self.name, spec.kind, "counter")
        root = self._root
        key = contribution_key(rec.agent, rec.replica.client_id)  # (the replica's own)
        if spec.max_value is None:
            own = self._own
            # this replica's running total: only this replica writes its key, so the total
            # it last wrote is the one the document holds
            new = (own[1] if own is not None and own[0] == key else self._part(key)) + amount
            if not -MAX_SAFE <= new <= MAX_SAFE:
                raise InvalidValue(f"the total {new} is outside ±2**53 (not exact in JSON)")
            op: Op = ["map", self.name, "set", key, new]
            wait = rec._stage(op, None, root)  # the plain write path (one op, no callable)
            self._own = (key, new)  # (applied to the document: _stage raises before, or not)
            if wait is not None:
                await wait
            return
        moved: StaleVersion | None = None
        for _ in range(MAX_RETRIES):
            based_on = rec.current_version(self.name)
            new = number(self._part(key) + amount)
            check_amount(new)
            ops: list[Op] = [["map", self.name, "set", key, new]]

            def apply(value: int | float = new) -> None:
                root[key] = value

            try:
                # the budget is checked (``check_counter_op``) at the authority, on the state
                # every other writer's adds are in; a counter that moved since ``based_on``
                # is refused and the add decided again
                await rec._write_guarded(
                    self.name, key, None, ops, apply, lambda: self.value, based_on
                )
            except StaleVersion as exc:
                moved = exc
                await rec.sync()
                continue
            self._own = (key, new)
            return
        assert moved is not None
        raise moved

    def _part(self, key: str) -> int | float:
        v = self._root.get(key)
        return v if type(v) in (int, float) else 0

    def to_json(self) -> int | float:
        return self.value

    def __repr__(self) -> str:
        return f"<CounterCollection {self.name!r} = {self.value} of run {self._rec.run!r}>"
