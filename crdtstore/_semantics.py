"""Record semantics that the store enforces: collection specs, write policies and budgets.

Everything here is pure: :func:`check_effect` decides, from a transaction's *effect* (the
operations it makes, see ``_journal``), its author and a read-only view of the current state,
whether the write is allowed. The record runs it before touching the document (pycrdt has no
rollback); the sync hub can run the same function on every update from an untrusted client.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ._counter_rules import check_counter_op, check_counter_spec
from ._errors import BudgetExceeded, InvalidValue, PolicyViolation, SchemaInvalid
from ._journal import Op

Policy = Literal["open", "append_only", "owner", "guarded"]
Conflict = Literal["lww", "keep_all"]
Merge = Literal["value", "fields"]
Kind = Literal["map", "list", "text", "counter"]

# A common rule of thumb for English text and JSON: about four bytes per model token.
BYTES_PER_TOKEN = 4

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
# The C encoder that ``_dumps`` builds on every call, built once: ``JSONEncoder.encode`` pays
# more to set it up than to encode a small value. No circular-reference markers: stored values
# are fresh acyclic copies (``to_stored``) or values read from the document.
_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)  # not in typeshed
_c_encode: Any = (
    None
    if _c_make_encoder is None
    else _c_make_encoder(
        None,  # markers
        json.JSONEncoder().default,  # unknown types: the TypeError JSONEncoder raises
        json.encoder.encode_basestring,  # ensure_ascii=False
        None,  # indent
        ":",
        ",",
        False,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )
)


def value_size(value: Any) -> int:
    """Bytes of a stored value as compact UTF-8 JSON (what budgets count)."""
    if _c_encode is None:
        text = _dumps(value)
    else:
        chunks = _c_encode(value, 0)
        text = chunks[0] if len(chunks) == 1 else "".join(chunks)
    return len(text) if text.isascii() else len(text.encode())


class CollectionSpec(BaseModel):
    """How a collection behaves. Declared once per run, enforced for every writer.

    Args:
        kind: ``map``, ``list`` or ``text``.
        policy: ``open`` (anyone), ``append_only`` (no overwrite, no delete, no insert in the
            middle), ``owner`` (maps: only the agent that created an entry may change or
            delete it) or ``guarded`` (only conditional writes, with ``expected_version``).
        conflict: ``lww`` (last writer wins; losers stay in history) or ``keep_all`` (maps: a
            multi-value register; concurrent writes are all kept as siblings until a write
            that has seen them resolves them).
        max_entries, max_bytes: budgets for the whole collection (entries; bytes of its
            values as compact JSON).
        max_value_bytes: the largest single value.
        model: a pydantic model every value must validate against (kept in this process; the
            model's name is recorded with the declaration).
        merge: ``value`` (an entry is one atomic value) or ``fields`` (maps: an entry is a
            dict merged field by field; ``set`` and ``patch`` write only the fields they
            change, so concurrent edits of different fields all survive; see
            ``crdtstore.record._fields``). Policies, conflicts and budgets then apply per field.
        max_value: counters: the budget of the counter's value; an add that would take it
            past is refused with ``BudgetExceeded`` (see ``crdtstore.record._counter``).

    A ``counter`` is a map in the document (a plain Yjs client sees a ``Y.Map`` of numbers:
    one key per writing replica, holding that replica's running total; the value is their
    sum); it takes the ``open`` policy and ``lww`` only, no entry or byte budgets, no model.
    Each of its keys belongs to the agent it names: another agent's write of one is refused
    as the ``owner`` policy refuses it on a map.

    Raises:
        InvalidValue: an option this class does not have (``owner=...``, a misspelling).
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    kind: Kind = "map"
    policy: Policy = "open"
    conflict: Conflict = "lww"
    max_entries: int | None = Field(default=None, ge=0)
    max_bytes: int | None = Field(default=None, ge=0)
    max_value_bytes: int | None = Field(default=None, ge=0)
    model: type[BaseModel] | None = Field(default=None, exclude=True)
    merge: Merge = "value"
    max_value: int | float | None = None

    if not TYPE_CHECKING:  # (the checker sees pydantic's own signature of the fields)

        def __init__(self, **data: Any) -> None:
            # pydantic ignores unknown keywords: CollectionSpec(owner="a") would declare an
            # open collection; a misspelt or imagined option is refused instead
            unknown = sorted(k for k in data if k not in _SPEC_FIELDS)
            if unknown:
                hint = " (for owned entries: policy='owner')" if "owner" in unknown else ""
                raise InvalidValue(f"CollectionSpec has no option {', '.join(unknown)}{hint}")
            super().__init__(**data)

    def declaration(self) -> dict[str, Any]:
        """The JSON form persisted in the run's config (``merge`` only when not the default,
        so declarations persisted before it existed still compare equal)."""
        out = self.model_dump(mode="json", exclude={"model"})
        if out.get("merge") == "value":
            del out["merge"]
        if out.get("max_value") is None:
            out.pop("max_value", None)  # (declarations made before counters compare equal)
        out["model_name"] = self.model.__qualname__ if self.model is not None else None
        return out

    def check_declarable(self, name: str) -> None:
        if self.kind == "counter":
            check_counter_spec(
                name,
                policy=self.policy,
                conflict=self.conflict,
                budgets=(self.max_entries, self.max_bytes, self.max_value_bytes),
                model=self.model,
                max_value=self.max_value,
            )
        elif self.max_value is not None:
            raise InvalidValue(f"collection {name!r}: max_value applies to counters only")
        if self.policy == "owner" and self.kind != "map":
            raise InvalidValue(f"collection {name!r}: the owner policy applies to maps only")
        if self.policy == "guarded" and self.kind != "map":
            raise InvalidValue(f"collection {name!r}: the guarded policy applies to maps only")
        if self.conflict == "keep_all" and (self.kind != "map" or self.policy == "guarded"):
            raise InvalidValue(
                f"collection {name!r}: keep_all applies to maps that are not guarded"
            )
        if self.merge == "fields" and self.kind != "map":
            raise InvalidValue(f"collection {name!r}: merge='fields' applies to maps only")


_SPEC_FIELDS = frozenset(CollectionSpec.model_fields)


def spec_from_declaration(data: Mapping[str, Any]) -> CollectionSpec:
    """The spec a run's config declares (its ``model_name``, and any option a later version
    may persist, left out: a declaration already made is read, not refused)."""
    return CollectionSpec.model_validate({k: v for k, v in data.items() if k in _SPEC_FIELDS})


class StateView(Protocol):
    """What :func:`check_effect` may ask about the state a write would apply to."""

    def exists(self, collection: str, key: str) -> bool: ...

    def owner(self, collection: str, key: str) -> str | None: ...

    def length(self, collection: str, kind: str) -> int: ...

    def counter_total(self, collection: str) -> float:
        """The value of counter ``collection`` now (the sum of its contributions)."""
        ...

    def counter_part(self, collection: str, key: str) -> float:
        """The contribution under ``key`` of counter ``collection`` now (0 if none)."""
        ...


def check_effect(
    specs: Mapping[str, CollectionSpec],
    effect: Sequence[Op],
    agent: str,
    state: StateView,
    *,
    conditional: bool = False,
) -> None:
    """Refuse an effect that a collection's write policy forbids.

    Args:
        specs: the run's declared collections (undeclared ones are ``open``).
        effect: the operations of one transaction.
        agent: who makes it.
        state: the state it would apply to.
        conditional: the write is a guarded write (checked against a version).

    Raises:
        PolicyViolation: naming the policy, the agent and the key.
    """
    lengths: dict[str, int] | None = None  # of lists and texts, as the effect goes
    for op in effect:
        kind, name, action = op[0], op[1], op[2]
        spec = specs.get(name)
        if spec is None:
            continue
        if spec.kind == "counter":
            check_counter_op(op, agent, spec.max_value, state)
            continue
        if spec.policy == "open":
            continue
        policy = spec.policy
        if kind == "map":
            key = op[3]
            if policy == "guarded" and not conditional:
                raise PolicyViolation(
                    policy,
                    agent,
                    name,
                    key,
                    "only guarded writes (with expected_version) are allowed",
                )
            exists = state.exists(name, key)
            if policy == "append_only" and (action == "del" or exists):
                what = "delete" if action == "del" else "overwrite"
                raise PolicyViolation(policy, agent, name, key, f"may not {what} an entry")
            if policy == "owner" and exists:
                owner = state.owner(name, key)
                if owner is not None and owner != agent:
                    raise PolicyViolation(
                        policy, agent, name, key, f"the entry belongs to {owner!r}"
                    )
            continue
        # lists and texts: append_only is the only policy that applies
        if lengths is None:
            lengths = {}
        n = lengths.get(name)
        if n is None:
            n = state.length(name, kind)
        if action == "del":
            raise PolicyViolation(policy, agent, name, None, "may not delete")
        if op[3] != n:
            raise PolicyViolation(
                policy, agent, name, None, f"may only append (insert at {op[3]}, length {n})"
            )
        lengths[name] = n + len(op[4])  # items of a list insert, characters of a text one


def validate_value(
    spec: CollectionSpec | None,
    model: type[BaseModel] | None,
    collection: str,
    key: str | None,
    value: Any,
) -> Any:
    """Validate ``value`` against the collection's model; return its JSON-able form.

    The same as ``model.model_validate(value).model_dump(mode="json")`` (an instance of the
    model is taken as it is), calling pydantic-core's validator and serializer directly:
    ``model_validate``/``model_dump`` add more Python overhead than the validation itself
    costs for a small model.

    Raises:
        SchemaInvalid: carrying pydantic's error list.
    """
    model = model or (spec.model if spec is not None else None)
    if model is None:
        return value
    if type(value) is not dict and isinstance(value, model):  # (an ABC isinstance is slow)
        instance = value
    else:
        try:
            instance = model.__pydantic_validator__.validate_python(value)
        except ValidationError as exc:
            # (without the input: it can be what JSON cannot carry, NaN, and it is the caller's own)
            errors = json.loads(exc.json(include_input=False, include_url=False))
            raise SchemaInvalid(collection, key, errors) from None
    # the instance's own serializer, as ``instance.model_dump`` would use (a subclass's)
    return instance.__pydantic_serializer__.to_python(instance, mode="json")


class Budget:
    """Running totals of one collection, kept up to date by the record.

    For a map, ``sizes`` holds the size of each key's value too: a write then learns whether
    its key exists and how many bytes it replaces from this dict, without asking the
    document (a read transaction per lookup, and a JSON encode of the old value).
    """

    __slots__ = ("bytes", "entries", "sizes")

    def __init__(self, entries: int, nbytes: int, sizes: dict[str, int] | None = None) -> None:
        self.entries = entries
        self.bytes = nbytes
        self.sizes = sizes


def budgeted(spec: CollectionSpec) -> bool:
    """Whether ``spec`` sets any budget (else writes to it are never sized)."""
    return (
        spec.max_entries is not None
        or spec.max_bytes is not None
        or spec.max_value_bytes is not None
    )


# What a write does to a budget: (budget, entries added, bytes added, new sizes of map keys,
# None for a key it deletes; None for a list or a text).
BudgetDelta = tuple[Budget, int, int, "dict[str, int | None] | None"]


def check_budget(
    spec: CollectionSpec,
    name: str,
    usage: Budget,
    effect: Sequence[Op],
    removed_bytes: int = 0,
    removed_entries: int = 0,
) -> BudgetDelta:
    """Refuse an effect that would take the collection past a budget.

    For a map whose ``usage`` has per-key sizes, what the effect removes is taken from them
    (``removed_*`` are ignored); for a list or a text the caller passes it.

    Returns the delta to apply to ``usage`` once the effect is applied (see
    :func:`apply_budgets`); the entries and bytes it adds may be negative.

    Raises:
        BudgetExceeded: with the figures.
    """
    max_value = spec.max_value_bytes
    sizes = usage.sizes
    changed: dict[str, int | None] | None = None
    if sizes is not None:
        add_entries = add_bytes = 0
        changed = {}
        for op in effect:
            if op[1] != name or op[0] != "map":
                continue
            key = op[3]
            old = changed[key] if key in changed else sizes.get(key)
            if op[2] == "del":
                if old is not None:
                    add_entries -= 1
                    add_bytes -= old
                changed[key] = None
                continue
            size = value_size(op[4])
            if max_value is not None and size > max_value:
                raise BudgetExceeded(name, "value bytes", 0, size, max_value)
            if old is None:
                add_entries += 1
            else:
                add_bytes -= old
            add_bytes += size
            changed[key] = size
    else:
        add_entries = -removed_entries
        add_bytes = -removed_bytes
        for op in effect:
            if op[1] != name or op[2] == "del":
                continue
            values = op[4] if op[0] == "list" else [op[4]]
            for v in values:
                size = value_size(v) if op[0] != "text" else len(v.encode())
                if max_value is not None and size > max_value:
                    raise BudgetExceeded(name, "value bytes", 0, size, max_value)
                add_bytes += size
            add_entries += len(values) if op[0] != "text" else 0
    if (
        spec.max_entries is not None
        and add_entries > 0
        and (usage.entries + add_entries > spec.max_entries)
    ):
        raise BudgetExceeded(name, "entries", usage.entries, add_entries, spec.max_entries)
    if spec.max_bytes is not None and add_bytes > 0 and usage.bytes + add_bytes > spec.max_bytes:
        raise BudgetExceeded(name, "bytes", usage.bytes, add_bytes, spec.max_bytes)
    return usage, add_entries, add_bytes, changed


# What one ``set`` of a map key does to its budget: (budget, its per-key sizes, key, the
# value's size, entries added, bytes added), see check_map_set.
SetDelta = tuple[Budget, dict[str, int], str, int, int, int]


def check_map_set(
    spec: CollectionSpec, name: str, usage: Budget, key: str, value: Any, size: int = -1
) -> SetDelta:
    """:func:`check_budget` for an effect that is one ``set`` of ``key`` in map ``name``
    whose ``usage`` has per-key sizes (the usual declared write), without its loop.
    ``size``: ``value_size(value)`` if the caller has it already (-1: computed here).

    Returns the delta to apply to ``usage`` once the set is applied (:func:`apply_set`).

    Raises:
        BudgetExceeded: with the figures.
    """
    sizes = usage.sizes
    assert sizes is not None
    if size < 0:
        size = value_size(value)
    max_value = spec.max_value_bytes
    if max_value is not None and size > max_value:
        raise BudgetExceeded(name, "value bytes", 0, size, max_value)
    old = sizes.get(key)
    if old is None:
        if spec.max_entries is not None and usage.entries + 1 > spec.max_entries:
            raise BudgetExceeded(name, "entries", usage.entries, 1, spec.max_entries)
        add_entries, add_bytes = 1, size
    else:
        add_entries, add_bytes = 0, size - old
    if spec.max_bytes is not None and add_bytes > 0 and usage.bytes + add_bytes > spec.max_bytes:
        raise BudgetExceeded(name, "bytes", usage.bytes, add_bytes, spec.max_bytes)
    return usage, sizes, key, size, add_entries, add_bytes


def apply_set(delta: SetDelta) -> None:
    """Account an applied set's :func:`check_map_set` delta in its budget."""
    usage, sizes, key, size, add_entries, add_bytes = delta
    usage.entries += add_entries
    usage.bytes += add_bytes
    sizes[key] = size


def set_as_budget_delta(delta: SetDelta) -> BudgetDelta:
    """The :data:`BudgetDelta` form of a :func:`check_map_set` delta (for ``apply_budgets``)."""
    usage, _, key, size, add_entries, add_bytes = delta
    return usage, add_entries, add_bytes, {key: size}


def apply_budgets(deltas: Iterable[BudgetDelta]) -> None:
    """Account an applied effect's :func:`check_budget` deltas in their budgets."""
    for usage, add_entries, add_bytes, changed in deltas:
        usage.entries += add_entries
        usage.bytes += add_bytes
        if changed:
            sizes = usage.sizes
            assert sizes is not None
            for key, size in changed.items():
                if size is None:
                    sizes.pop(key, None)
                else:
                    sizes[key] = size


def measure(kind: str, root: Any) -> Budget:
    """Entries and bytes of a collection as it is now, with a map's per-key sizes (O(size);
    cached by the record and kept up to date from each write's effect)."""
    if kind == "map":
        sizes = {k: value_size(v) for k, v in root.items()}
        return Budget(len(sizes), sum(sizes.values()), sizes)
    if kind == "list":
        items = list(root)
        return Budget(len(items), sum(value_size(v) for v in items))
    text = str(root)
    return Budget(1 if text else 0, len(text.encode()))


def coerce_schema(schema: Mapping[str, CollectionSpec] | None) -> dict[str, CollectionSpec]:
    if schema is None:
        return {}
    out = {}
    for name, spec in schema.items():
        if not isinstance(spec, CollectionSpec):
            raise InvalidValue(f"collection {name!r}: expected a CollectionSpec")
        out[name] = spec
    return out
