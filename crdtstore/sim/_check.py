"""The invariants a simulation checks, as pure functions of a replica's state and the writes
it has integrated (:func:`check_state` defines them).

A replica's *state* is the simulator's canonical JSON view of a record: maps as
``{key: value}``, ``keep_all`` maps as ``{key: [sibling, ...]}`` (each sibling a
``{"token", "agent", "value"}``, sorted by token), lists as lists, texts as strings.

Pure functions, so that a violation can be replayed and explained from the trace alone, and
the checks themselves tested without a network.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ._trace import canon

SEP = "\x1f"  # between a keep_all key and its sibling token (crdtstore's KeepAllMap)


@dataclass(frozen=True)
class WriteRec:
    """One acknowledged write (journaled in its author's store), as the checks see it.

    ``kind`` is ``map`` (last-writer-wins), ``keep_all``, ``list`` or ``text``. ``deps`` counts
    the writes of each agent the author had integrated before it (its own: ``index - 1``).
    """

    id: int
    agent: int
    index: int
    tick: int
    kind: str
    collection: str
    key: str | None = None
    value: Any = None
    deleted: bool = False
    pkey: str | None = None  # keep_all: the physical key of the sibling it wrote
    resolved: tuple[str, ...] = ()  # keep_all: physical keys of the siblings it deleted
    supersedes: frozenset[int] = field(default_factory=frozenset)  # lww: writes it saw
    deps: tuple[int, ...] = ()
    seqs: tuple[int, ...] = ()  # its entries in its author's journal

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "agent": self.agent,
            "index": self.index,
            "tick": self.tick,
            "kind": self.kind,
            "collection": self.collection,
            "key": self.key,
            "value": self.value,
            "deleted": self.deleted,
            "token": None if self.pkey is None else self.pkey.rpartition(SEP)[2],
            "resolved": [p.rpartition(SEP)[2] for p in self.resolved],
            "supersedes": sorted(self.supersedes),
            "deps": list(self.deps),
            "seqs": list(self.seqs),
        }


@dataclass(frozen=True)
class Violation:
    """An invariant that did not hold: which, at which replica (None: between replicas),
    when, and why."""

    invariant: str
    agent: str | None
    tick: int
    detail: str
    final: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant,
            "agent": self.agent,
            "t": self.tick,
            "detail": self.detail,
            "final": self.final,
        }


def lww_frontier(writes: Iterable[WriteRec]) -> list[WriteRec]:
    """The writes to one key that no other of them supersedes."""
    ws = list(writes)
    superseded: set[int] = set()
    for w in ws:
        superseded |= w.supersedes
    return [w for w in ws if w.id not in superseded]


def check_state(
    state: dict[str, Any], writes: Iterable[WriteRec], kinds: dict[str, str]
) -> list[tuple[str, str]]:
    """Check a replica's ``state`` against the writes ``S`` it has integrated; return
    ``(invariant, detail)`` pairs for what fails. ``kinds`` gives each written collection's
    kind (``map``, ``keep_all``, ``list``, ``text``).

    Given the set S of writes a replica has integrated (causally closed: with every write it
    depends on), the invariants are:

    - **lost_write** (last-writer-wins maps): call a write to a key *superseded* when a later
      write to that key was made by an agent that had integrated it (every write supersedes
      the frontier of the key its author could see). The key must hold the value of one of
      the unsuperseded sets of S (a concurrent LWW loser stays in the writer's journal,
      DESIGN I2), or be absent when only deletes are unsuperseded. When both a set and a
      delete are unsuperseded the key may also be absent: Yjs deletes the loser of concurrent
      sets when it integrates them, so a set that lost to the value a concurrent delete
      removed is gone too (the set is still in its writer's journal and ``history``);
    - **keep_all_sibling**: a keep_all key holds exactly the siblings S wrote and no write of
      S resolved (deleted after seeing them): every concurrent sibling present, none invented;
    - **lost_append**: every append of S is in the list exactly once, each agent's appends in
      the order it made them, and nothing else is;
    - **lost_text**: the text holds exactly the characters S inserted (no character lost or
      duplicated; random scripts insert at token boundaries only, so tokens stay whole).
    """
    by_coll: dict[str, list[WriteRec]] = {}
    for w in writes:
        by_coll.setdefault(w.collection, []).append(w)
    out: list[tuple[str, str]] = []
    for name in sorted(set(by_coll) | {n for n in state if n in kinds}):
        ws = by_coll.get(name, [])
        kind = kinds.get(name, ws[0].kind if ws else "map")
        actual = state.get(name)
        if kind == "map":
            out += _check_lww(name, actual or {}, ws)
        elif kind == "keep_all":
            out += _check_keep_all(name, actual or {}, ws)
        elif kind == "list":
            out += _check_list(name, actual or [], ws)
        elif kind == "text":
            out += _check_text(name, actual or "", ws)
    return out


def _check_lww(name: str, actual: dict[str, Any], ws: list[WriteRec]) -> list[tuple[str, str]]:
    out = []
    by_key: dict[str, list[WriteRec]] = {}
    for w in ws:
        assert w.key is not None
        by_key.setdefault(w.key, []).append(w)
    for key, kws in sorted(by_key.items()):
        frontier = lww_frontier(kws)
        sets = [w for w in frontier if not w.deleted]
        if sets:
            allowed = {canon(w.value) for w in sets}
            if key not in actual:
                if len(sets) < len(frontier):
                    continue  # a concurrent delete may win (see the module docstring)
                out.append(
                    (
                        "lost_write",
                        f"{name}[{key!r}] is absent; expected one of the unsuperseded writes "
                        f"{sorted(w.id for w in sets)}",
                    )
                )
            elif canon(actual[key]) not in allowed:
                out.append(
                    (
                        "lost_write",
                        f"{name}[{key!r}] = {canon(actual[key])}, none of the unsuperseded "
                        f"writes {sorted(w.id for w in sets)} ({sorted(allowed)})",
                    )
                )
        elif key in actual:
            out.append(("lost_write", f"{name}[{key!r}] is present but was deleted"))
    for key in sorted(set(actual) - set(by_key)):
        out.append(("lost_write", f"{name}[{key!r}] holds a value no known write made"))
    return out


def _check_keep_all(name: str, actual: dict[str, Any], ws: list[WriteRec]) -> list[tuple[str, str]]:
    resolved: set[str] = set()
    for w in ws:
        resolved.update(w.resolved)
    expected: dict[str, dict[str, WriteRec]] = {}
    for w in ws:
        if w.pkey is not None and w.pkey not in resolved:
            assert w.key is not None
            expected.setdefault(w.key, {})[w.pkey.rpartition(SEP)[2]] = w
    out = []
    for key in sorted(set(expected) | set(actual)):
        want = expected.get(key, {})
        have = {s["token"]: s for s in actual.get(key, [])}
        for token in sorted(set(want) - set(have)):
            w = want[token]
            out.append(
                (
                    "keep_all_sibling",
                    f"{name}[{key!r}] lacks the sibling {token} (write {w.id}, "
                    f"value {canon(w.value)})",
                )
            )
        for token in sorted(set(have) - set(want)):
            out.append(
                (
                    "keep_all_sibling",
                    f"{name}[{key!r}] holds a sibling {token} that no unresolved write made",
                )
            )
        for token in sorted(set(have) & set(want)):
            if canon(have[token]["value"]) != canon(want[token].value):
                out.append(
                    ("keep_all_sibling", f"{name}[{key!r}] sibling {token} has a wrong value")
                )
    return out


def _check_list(name: str, actual: list[Any], ws: list[WriteRec]) -> list[tuple[str, str]]:
    out = []
    want = Counter(canon(w.value) for w in ws)
    have = Counter(canon(v) for v in actual)
    for v in sorted(want - have):
        out.append(("lost_append", f"{name} lacks the appended value {v}"))
    for v in sorted(have - want):
        out.append(("lost_append", f"{name} holds {v} more often than it was appended"))
    if not out:
        position: dict[str, list[int]] = {}
        for i, v in enumerate(actual):
            position.setdefault(canon(v), []).append(i)
        by_agent: dict[int, list[WriteRec]] = {}
        for w in ws:
            by_agent.setdefault(w.agent, []).append(w)
        for agent, aws in sorted(by_agent.items()):
            seen = [position[canon(w.value)][0] for w in sorted(aws, key=lambda w: w.index)]
            if seen != sorted(seen):
                out.append(("lost_append", f"{name}: the appends of agent {agent} are reordered"))
    return out


def _check_text(name: str, actual: str, ws: list[WriteRec]) -> list[tuple[str, str]]:
    want = Counter("".join(str(w.value) for w in ws))
    have = Counter(actual)
    if want == have:
        return []
    lost = "".join(sorted((want - have).elements()))
    extra = "".join(sorted((have - want).elements()))
    return [("lost_text", f"{name}: characters lost {lost!r}, unexpected {extra!r}")]
