"""The trace of a simulation: a list of JSON-able event records, in the order they happened.

Every record has ``ev`` (what happened) and ``t`` (the simulated tick). Kinds:

- ``config``, ``script``: what was run;
- ``write`` (an agent's write, with the state of its replica after it), ``refused`` (a write
  the record refused), ``noop`` (a write that changed nothing and journaled nothing);
- ``send``, ``duplicate``, ``lost`` (with ``reason`` and ``retry``), ``dropped`` (test hook),
  ``arrive``, ``held`` (waiting for its causal predecessors), ``apply_refused`` (the record
  refused the bytes; seen only with ``causal=False``), ``apply`` (with the receiver's
  state after it);
- ``partition``, ``heal``, ``drained``, ``exchange`` (the final state-vector exchange);
- ``violation`` (an invariant that failed) and ``final`` (the final states and verdict).

Nothing in it depends on the wall clock or on random client ids, so the same seed and
configuration give the same trace, byte for byte (:meth:`Trace.to_json`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def canon(value: Any) -> str:
    """A canonical JSON text of a value (sorted keys): equal values, equal texts."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class Trace:
    """The events of one simulation run."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def of(self, *kinds: str) -> list[dict[str, Any]]:
        """The events of the given kinds, in order."""
        return [e for e in self.events if e["ev"] in kinds]

    def to_json(self, indent: int | None = None) -> str:
        """The whole trace as JSON text (keys sorted: comparable across runs)."""
        return json.dumps(self.events, sort_keys=True, indent=indent, ensure_ascii=False)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)
