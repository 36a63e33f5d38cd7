"""Hypothesis strategies for the record's operations, and the two ways of executing them.

An operation (:class:`Op`) is drawn without knowing the state it will meet: positions are
plain non-negative integers, resolved against the collection's current length when the op is
executed (``pos % (len + 1)`` for an insert, ``pos % len`` for a delete; a delete on an empty
collection, or of a missing map key, does nothing, just as the collections journal nothing).

Two executors give an op the same meaning:

- :func:`apply_to_replica` drives a pure :class:`crdtstore.Replica` through
  ``replica.local(effect, apply, meta)`` exactly as the collections do, and returns the update
  bytes it captured (so a test controls their delivery);
- :func:`apply_to_record` calls the public collection API of a live :class:`crdtstore.Record`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from hypothesis import strategies as st

import crdtstore
from crdtstore._values import to_stored
from crdtstore.record._provenance import Meta
from crdtstore.record._replica import Replica
from crdtstore.record._textdiff import apply_text_edits, text_diff

MAX_SAFE_INT = 2**53

# Text that the convergence and replay properties edit: ASCII plus characters of every UTF-8
# length (pycrdt's Text counts UTF-8 bytes while text_diff and TextCollection count code
# points; apply_text_edits converts).
OP_TEXT_ALPHABET = "abcxyz .\né日🙂"
# Non-ASCII of every UTF-8 length (2, 3 and 4 bytes; 4 bytes is 2 UTF-16 units).
UNICODE_TEXT = st.characters(codec="utf-8", exclude_characters="\x00")
UNICODE_SAMPLES = "abc é日🙂\n"

MAP_NAMES = ("m0", "m1")
LIST_NAMES = ("l0",)
TEXT_NAMES = ("t0",)


# -- values -------------------------------------------------------------------------------------


def json_scalars() -> st.SearchStrategy[Any]:
    """None, bools, integers within ±2**53, finite floats and strings (what JSON can hold)."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-MAX_SAFE_INT, MAX_SAFE_INT),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    )


def json_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    """JSON-like values: scalars, and lists and str-keyed dicts of them (nested)."""
    return st.recursive(
        json_scalars(),
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(st.text(max_size=8), children, max_size=4),
        ),
        max_leaves=max_leaves,
    )


def map_keys() -> st.SearchStrategy[str]:
    """Mostly a few shared keys (so that writers collide), sometimes any valid key."""
    return st.one_of(
        st.sampled_from(["a", "b", "c", "status", "é"]),
        st.text(UNICODE_TEXT, min_size=1, max_size=10),
    )


# -- operations ---------------------------------------------------------------------------------


class Op(NamedTuple):
    """One write to one collection. ``args`` depends on ``kind`` and ``action``:

    - map ``set`` (key, value), ``del`` (key,)
    - list ``append`` (value,), ``insert`` (pos, value), ``del`` (pos, count)
    - text ``insert`` (pos, text), ``del`` (pos, count), ``splice`` ((pos, count, text), ...)
      (an agent's rewrite of a few places, applied by ``edit``), ``rewrite`` (new_text,)
      (``edit`` to an unrelated text)
    """

    kind: str
    name: str
    action: str
    args: tuple[Any, ...]


_POS = st.integers(0, 10_000)
_COUNT = st.integers(1, 4)


def map_ops(
    names: Sequence[str] = MAP_NAMES, values: st.SearchStrategy[Any] | None = None
) -> st.SearchStrategy[Op]:
    name = st.sampled_from(names)
    values = json_values() if values is None else values
    return st.one_of(
        st.builds(lambda n, k, v: Op("map", n, "set", (k, v)), name, map_keys(), values),
        st.builds(lambda n, k: Op("map", n, "del", (k,)), name, map_keys()),
    )


def list_ops(
    names: Sequence[str] = LIST_NAMES, values: st.SearchStrategy[Any] | None = None
) -> st.SearchStrategy[Op]:
    name = st.sampled_from(names)
    values = json_values(4) if values is None else values
    return st.one_of(
        st.builds(lambda n, v: Op("list", n, "append", (v,)), name, values),
        st.builds(lambda n, p, v: Op("list", n, "insert", (p, v)), name, _POS, values),
        st.builds(lambda n, p, c: Op("list", n, "del", (p, c)), name, _POS, _COUNT),
    )


def text_ops(
    names: Sequence[str] = TEXT_NAMES, alphabet: Any = OP_TEXT_ALPHABET
) -> st.SearchStrategy[Op]:
    name = st.sampled_from(names)
    chunk = st.text(alphabet, min_size=1, max_size=12)
    splice = st.tuples(_POS, st.integers(0, 6), st.text(alphabet, max_size=8))
    return st.one_of(
        st.builds(lambda n, p, s: Op("text", n, "insert", (p, s)), name, _POS, chunk),
        st.builds(lambda n, p, c: Op("text", n, "del", (p, c)), name, _POS, _COUNT),
        st.builds(
            lambda n, sp: Op("text", n, "splice", tuple(sp)),
            name,
            st.lists(splice, min_size=1, max_size=3),
        ),
        st.builds(
            lambda n, s: Op("text", n, "rewrite", (s,)), name, st.text(alphabet, max_size=30)
        ),
    )


def operations(
    alphabet: Any = OP_TEXT_ALPHABET, values: st.SearchStrategy[Any] | None = None
) -> st.SearchStrategy[Op]:
    """Any operation on the maps ``m0``/``m1``, the list ``l0`` and the text ``t0``."""
    return st.one_of(map_ops(values=values), list_ops(values=values), text_ops(alphabet=alphabet))


def splice_text(old: str, splices: Sequence[tuple[int, int, str]]) -> str:
    """Apply ``(pos, count, text)`` replacements one after another, positions taken modulo."""
    new = old
    for pos, count, text in splices:
        at = pos % (len(new) + 1)
        new = new[:at] + text + new[at + count :]
    return new


# -- delivery schedules ---------------------------------------------------------------------------


class Local(NamedTuple):
    """Replica ``replica`` makes the local write ``op``."""

    replica: int
    op: Op


class Log(NamedTuple):
    """Replica ``replica`` appends a value unique in the whole schedule to the list ``log``
    and sets a key of the map ``own`` that nobody else writes (nobody deletes either)."""

    replica: int


class Deliver(NamedTuple):
    """Replica ``target`` receives the updates ``picks`` (indices into the updates made so far,
    taken modulo their number: repeats are duplicates), as one batch, in that order."""

    target: int
    picks: tuple[int, ...]


class Flood(NamedTuple):
    """Replica ``target`` receives every update made so far, plus ``extra`` duplicates, in the
    order a ``random.Random(seed)`` shuffle gives, cut into batches at the positions ``cuts``
    (taken modulo the number of updates)."""

    target: int
    seed: int
    extra: int
    cuts: tuple[int, ...]


@st.composite
def schedules(
    draw: st.DrawFn, min_replicas: int = 2, max_replicas: int = 6, max_steps: int = 40
) -> tuple[int, list[Local | Log | Deliver | Flood]]:
    """A number of replicas and an interleaving of their writes with random deliveries, ending
    with a flood to every replica (so that most end up having received everything)."""
    n = draw(st.integers(min_replicas, max_replicas))
    who = st.integers(0, n - 1)

    def flood(target: st.SearchStrategy[int]) -> st.SearchStrategy[Flood]:
        return st.builds(
            Flood,
            target,
            st.integers(0, 2**32),
            st.integers(0, 3),
            st.lists(st.integers(0, 1000), max_size=4).map(tuple),
        )

    step = st.one_of(
        st.builds(Local, who, operations(values=json_values(3))),
        st.builds(Log, who),
        st.builds(Deliver, who, st.lists(st.integers(0, 1000), min_size=1, max_size=8).map(tuple)),
        flood(who),
    )
    steps: list[Local | Log | Deliver | Flood] = draw(
        st.lists(step, min_size=1, max_size=max_steps)
    )
    steps += [draw(flood(st.just(i))) for i in range(n)]
    return n, steps


# -- executing operations -----------------------------------------------------------------------


def _plan(op: Op, current: Any) -> tuple[list[list[Any]], Callable[[Any], None]] | None:
    """The effect and the root mutation of ``op`` against the collection's current value
    (``current``: a dict, a list or a str), or None when the op does nothing."""
    kind, name, action, args = op
    if kind == "map":
        key = args[0]
        if action == "set":
            stored = to_stored(args[1])

            def set_(root: Any) -> None:
                root[key] = stored

            return [["map", name, "set", key, stored]], set_
        if key not in current:
            return None

        def del_(root: Any) -> None:
            del root[key]

        return [["map", name, "del", key]], del_
    if kind == "list":
        n = len(current)
        if action in ("append", "insert"):
            at = n if action == "append" else args[0] % (n + 1)
            stored = to_stored(args[-1])

            def ins(root: Any) -> None:
                if at == len(root):
                    root.extend([stored])  # as ListCollection.extend
                else:
                    root.insert(at, stored)

            return [["list", name, "ins", at, [stored]]], ins
        if n == 0:
            return None
        at = args[0] % n
        count = min(args[1], n - at)

        def ldel(root: Any) -> None:
            del root[at : at + count]

        return [["list", name, "del", at, count]], ldel
    # text: every change goes through text_diff, as TextCollection.edit does
    old = current
    if action == "insert":
        at = args[0] % (len(old) + 1)
        new = old[:at] + args[1] + old[at:]
    elif action == "del":
        if not old:
            return None
        at = args[0] % len(old)
        new = old[:at] + old[at + args[1] :]
    elif action == "splice":
        new = splice_text(old, args)
    else:
        new = args[0]
    edits = text_diff(old, new)
    if not edits:
        return None

    def edit(root: Any) -> None:
        apply_text_edits(root, old, edits)

    return [["text", name, w, at, arg] for w, at, arg in edits], edit


def apply_to_replica(replica: Replica, op: Op, meta: Meta) -> bytes | None:
    """Make ``op`` a local transaction of ``replica``; return the update it produced."""
    root = replica.root(op.name, op.kind)
    plan = _plan(op, replica.read(op.name, op.kind))
    if plan is None:
        return None
    effect, mutate = plan
    return replica.local(effect, lambda: mutate(root), meta)


async def apply_to_record(rec: crdtstore.Record, op: Op) -> None:
    """Make ``op`` through the public collection API of ``rec``."""
    kind, name, action, args = op
    if kind == "map":
        m = rec.map(name)
        if action == "set":
            await m.set(args[0], args[1])
        else:
            await m.delete(args[0])
        return
    if kind == "list":
        lst = rec.list(name)
        n = len(lst)
        if action == "append":
            await lst.append(args[0])
        elif action == "insert":
            await lst.insert(args[0] % (n + 1), args[1])
        elif n:
            at = args[0] % n
            await lst.delete(at, min(args[1], n - at))
        return
    text = rec.text(name)
    old = text.read()
    if action == "insert":
        await text.insert(args[0] % (len(old) + 1), args[1])
    elif action == "del":
        if old:
            at = args[0] % len(old)
            await text.delete(at, min(args[1], len(old) - at))
    elif action == "splice":
        await text.edit(splice_text(old, args))
    else:
        await text.edit(args[0])
