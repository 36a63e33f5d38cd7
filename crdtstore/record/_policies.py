"""Write policies and budgets: the checks a write's ops pass before the document is touched.

pycrdt has no rollback, so :meth:`Policies._enforce` runs the collection's declared write
policy (``open``, ``append_only``, ``owner``, ``guarded``) and budgets over a write's ops
first, and returns the budget deltas the pipeline accounts once it is applied. The record is
the :class:`~crdtstore._semantics.StateView` the policies read (``exists``, ``owner``,
``length``). Budgets are running totals, measured from the document again whenever a change
they cannot follow (a foreign update, a snapshot) arrives (:meth:`Policies._invalidate_all`).
"""

from __future__ import annotations

from builtins import list as _List

from .._counter_rules import MAX_SAFE, agent_of_key, is_number, total
from .._journal import Op
from .._semantics import (
    BYTES_PER_TOKEN,
    Budget,
    BudgetDelta,
    SetDelta,
    apply_budgets,
    budgeted,
    check_budget,
    check_effect,
    check_map_set,
    measure,
    set_as_budget_delta,
    value_size,
)
from ._state import RecordState


class Policies(RecordState):
    """Policies and budgets of a record (see the module docstring)."""

    def exists(self, collection: str, key: str) -> bool:
        """StateView: whether map ``collection`` has ``key`` now."""
        usage = self._usage.get(collection)
        if usage is not None and usage.sizes is not None:
            return key in usage.sizes  # a budgeted map's sizes: no read transaction
        return key in self.replica.root(collection, "map")

    def owner(self, collection: str, key: str) -> str | None:
        """StateView: the agent that created the entry. Under the owner policy only the creator
        can change an entry, so the writer of the current value is the creator."""
        return self.replica.agent_of(collection, key)

    def length(self, collection: str, kind: str) -> int:
        """StateView: entries of a list, characters of a text."""
        root = self.replica.root(collection, kind)
        return len(str(root)) if kind == "text" else len(root)

    def counter_total(self, collection: str) -> float:
        """StateView: the value of counter ``collection`` now."""
        return total(self.replica.root(collection, "map").values())

    def counter_part(self, collection: str, key: str) -> float:
        """StateView: the contribution under ``key`` of counter ``collection`` now."""
        v = self.replica.root(collection, "map").get(key)
        return v if is_number(v) else 0

    def _enforce(
        self, ops: _List[Op], *, conditional: bool, agent: str | None = None
    ) -> _List[BudgetDelta] | None:
        """Run the write policies and budgets over a write's effect, made by ``agent`` (None:
        this record's); return the budget deltas to account once it is applied (None when
        no budgeted collection is touched)."""
        specs = self._specs
        writer = self.agent if agent is None else agent
        if len(ops) == 1:  # the usual write: one op, one collection
            op = ops[0]
            name = op[1]
            spec = specs.get(name)
            if spec is None:  # undeclared: open, no budget
                return None
            usage = self._usage.get(name)  # only budgeted collections are there
            policy = spec.policy
            if policy != "open" or (
                spec.kind == "counter"
                and not (  # a plain add to the writer's own key needs no check
                    op[2] == "set"
                    and spec.max_value is None
                    and type(op[4]) in (int, float)
                    and -MAX_SAFE <= op[4] <= MAX_SAFE  # (NaN fails it)
                    and agent_of_key(op[3]) == writer
                )
            ):
                if op[0] == "map" and op[2] == "set" and policy in ("owner", "append_only"):
                    # the usual checks inline; check_effect decides (and words) any refusal
                    key = op[3]
                    sizes = None if usage is None else usage.sizes
                    if key in sizes if sizes is not None else self.exists(name, key):
                        owner = self.replica.agent_of(name, key) if policy == "owner" else None
                        if policy == "append_only" or (owner is not None and owner != writer):
                            check_effect(specs, ops, writer, self, conditional=conditional)
                else:
                    check_effect(specs, ops, writer, self, conditional=conditional)
            if usage is None:
                if not budgeted(spec):
                    return None
                usage = self._usage_of(name, spec.kind)
            if usage.sizes is not None:
                if op[0] == "map" and op[2] == "set":
                    return [set_as_budget_delta(check_map_set(spec, name, usage, op[3], op[4]))]
                return [check_budget(spec, name, usage, ops)]
            removed_bytes, removed_entries = self._removed(name, spec.kind, ops)
            return [check_budget(spec, name, usage, ops, removed_bytes, removed_entries)]
        check_effect(specs, ops, writer, self, conditional=conditional)
        out: _List[BudgetDelta] | None = None
        for name in (ops[0][1],) if len(ops) == 1 else dict.fromkeys(op[1] for op in ops):
            usage = self._usage.get(name)  # only budgeted collections are there
            if usage is None:
                spec = specs.get(name)
                if spec is None or not budgeted(spec):
                    continue
                usage = self._usage_of(name, spec.kind)
            else:
                spec = specs[name]
            if usage.sizes is not None:  # a map: what the write replaces is in the sizes
                delta = check_budget(spec, name, usage, ops)
            else:
                removed_bytes, removed_entries = self._removed(name, spec.kind, ops)
                delta = check_budget(spec, name, usage, ops, removed_bytes, removed_entries)
            if out is None:
                out = [delta]
            else:
                out.append(delta)
        return out

    def _enforce_set(self, op: Op, size: int = -1) -> SetDelta | None:
        """:meth:`_enforce` of a write that is one map set ``op`` (``["map", name, "set",
        key, stored]``, by this record): the write pipeline's hot path. ``size``: the stored
        value's ``value_size`` if the caller has it (-1: computed if a budget needs it).
        Returns the budget delta to account once the set is applied (None: no budget)."""
        name = op[1]
        spec = self._specs.get(name)
        if spec is None:  # undeclared: open, no budget
            return None
        usage = self._usage.get(name)  # only budgeted collections are there
        policy = spec.policy
        sizes = None if usage is None else usage.sizes
        if policy == "owner" or policy == "append_only":
            key = op[3]
            # (under owner only the creator changes an entry: the writer of the current
            # value is its creator; check_effect decides and words a refusal)
            if (key in sizes if sizes is not None else self.exists(name, key)) and (
                policy == "append_only"
                or ((owner := self.replica.agent_of(name, key)) is not None and owner != self.agent)
            ):
                check_effect(self._specs, [op], self.agent, self, conditional=False)
        elif spec.kind == "counter":  # (no budgets)
            value = op[4]
            if not (  # a plain add of a number needs no check (numbers, no deletes)
                spec.max_value is None
                and type(value) in (int, float)
                and -MAX_SAFE <= value <= MAX_SAFE  # (NaN fails it)
            ):
                check_effect(self._specs, [op], self.agent, self, conditional=False)
            return None
        elif policy != "open":  # guarded: refused (not a conditional write)
            check_effect(self._specs, [op], self.agent, self, conditional=False)
        if usage is None:
            if not budgeted(spec):
                return None
            usage = self._usage_of(name, spec.kind)
            sizes = usage.sizes
        if sizes is None:  # pragma: no cover - a map's budget has per-key sizes
            raise AssertionError(f"budget of map {name!r} without sizes")
        return check_map_set(spec, name, usage, op[3], op[4], size)

    @staticmethod
    def _account(usage: _List[BudgetDelta] | None) -> None:
        if usage:
            apply_budgets(usage)

    def _usage_of(self, name: str, kind: str) -> Budget:
        usage = self._usage.get(name)
        if usage is None:
            usage = self._usage[name] = measure(kind, self.replica.root(name, kind))
        return usage

    def _removed(self, name: str, kind: str, ops: _List[Op]) -> tuple[int, int]:
        """Bytes and entries that the deletes of ``ops`` remove from a list or a text (a map's
        are counted from its budget's per-key sizes, see ``check_budget``)."""
        root = self.replica.root(name, kind)
        nbytes = entries = 0
        for op in ops:
            if op[1] != name or op[2] != "del":
                continue
            if kind == "list":
                for v in root[op[3] : op[3] + op[4]]:
                    nbytes += value_size(v)
                entries += op[4]
            elif kind == "text":
                nbytes += len(str(root)[op[3] : op[3] + op[4]].encode())
        return nbytes, entries

    def size(self) -> dict[str, dict[str, int]]:
        """Entries, bytes (values as compact JSON) and estimated model tokens per collection,
        plus a ``"*"`` total, so a summariser can be scheduled before a budget is reached.

        A budgeted collection reports the running totals its budget is checked against (kept
        up to date by every write); the others are measured now, O(size)."""
        out: dict[str, dict[str, int]] = {}
        total = Budget(0, 0)
        kinds: dict[str, str] = {
            name: "map" if spec.kind == "counter" else spec.kind  # (a counter is a map)
            for name, spec in self._specs.items()
        }
        kinds.update(self.replica.collections())
        for name, kind in sorted(kinds.items()):
            spec = self._specs.get(name)
            if spec is not None and spec.kind == kind and budgeted(spec):
                b = self._usage_of(name, kind)
            else:
                b = measure(kind, self.replica.root(name, kind))
            total.entries += b.entries
            total.bytes += b.bytes
            out[name] = {
                "entries": b.entries,
                "bytes": b.bytes,
                "tokens": -(-b.bytes // BYTES_PER_TOKEN),
            }
        out["*"] = {
            "entries": total.entries,
            "bytes": total.bytes,
            "tokens": -(-total.bytes // BYTES_PER_TOKEN),
        }
        return out

    def _enforcing(self) -> bool:
        return any(
            spec.policy != "open"
            or spec.kind == "counter"  # (a counter's rule: numbers only, no deletes)
            or spec.max_entries is not None
            or spec.max_bytes is not None
            or spec.max_value_bytes is not None
            for spec in self._specs.values()
        )

    def _invalidate_all(self) -> None:
        self._usage.clear()
        for name in self._stamps:
            self._stamps[name] += 1

    def _stamp(self, name: str) -> int:
        return self._stamps.get(name, 0)
