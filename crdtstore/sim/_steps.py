"""The steps of a simulation script: writes of agents, and network events.

A script is a plain list of steps, executed in order on simulated time. Writes are
instantaneous; :class:`Wait` lets simulated time pass (messages arrive meanwhile). Every step
has a JSON form (``to_json``) that goes into the trace.

:func:`random_script` draws a script from a ``random.Random``: the same seed, the same script.
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal

#: default collection names of random scripts: a last-writer-wins map, a keep_all map (declared
#: by ``SimConfig.keep_all``), a list and a text.
LWW_MAP = "m"
KEEP_ALL_MAP = "k"
LIST = "l"
TEXT = "t"
KEYS = ("x", "y", "z")


@dataclass(frozen=True)
class Step:
    """Base of every script step."""

    kind: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        return {"step": self.kind, **asdict(self)}


@dataclass(frozen=True)
class Set(Step):
    """Agent ``agent`` sets ``collection[key] = value`` (``rec.map(collection).set``). On a
    ``keep_all`` collection the write resolves every sibling the agent has seen."""

    kind: ClassVar[str] = "set"
    agent: int
    collection: str
    key: str
    value: Any


@dataclass(frozen=True)
class Delete(Step):
    """Agent ``agent`` deletes ``collection[key]`` (a no-op, journaling nothing, if absent)."""

    kind: ClassVar[str] = "delete"
    agent: int
    collection: str
    key: str


@dataclass(frozen=True)
class Append(Step):
    """Agent ``agent`` appends ``value`` to the list ``collection``."""

    kind: ClassVar[str] = "append"
    agent: int
    collection: str
    value: Any


@dataclass(frozen=True)
class InsertText(Step):
    """Agent ``agent`` inserts ``text`` into the text ``collection`` at character ``at``
    (clamped to the text's length), at the end (``"end"``), or at a token boundary of the
    agent's current text drawn from the seed (``"boundary"``, see :func:`text_boundaries`)."""

    kind: ClassVar[str] = "insert_text"
    agent: int
    collection: str
    text: str
    at: int | Literal["end", "boundary"] = "end"


@dataclass(frozen=True)
class Wait(Step):
    """Let ``ticks`` ticks of simulated time pass, delivering what arrives meanwhile."""

    kind: ClassVar[str] = "wait"
    ticks: int


@dataclass(frozen=True)
class Drain(Step):
    """Let time pass until no message is in flight, or only messages across a partition
    are left (they keep being retransmitted, and get through after a :class:`Heal`)."""

    kind: ClassVar[str] = "drain"


@dataclass(frozen=True)
class Partition(Step):
    """Cut the network into ``groups`` of agent indices: messages between groups are lost
    (and retransmitted later). Agents in no group form one more group."""

    kind: ClassVar[str] = "partition"
    groups: tuple[tuple[int, ...], ...]

    def to_json(self) -> dict[str, Any]:
        return {"step": self.kind, "groups": [list(g) for g in self.groups]}


@dataclass(frozen=True)
class Heal(Step):
    """Heal every partition."""

    kind: ClassVar[str] = "heal"


WRITE_STEPS = (Set, Delete, Append, InsertText)


def step_from_json(data: dict[str, Any]) -> Step:
    """The step of a ``to_json`` form (so a trace's script can be replayed)."""
    fields = {k: v for k, v in data.items() if k != "step"}
    kind = data["step"]
    if kind == "partition":
        return Partition(tuple(tuple(g) for g in fields["groups"]))
    for cls in (*WRITE_STEPS, Wait, Drain, Heal):
        if cls.kind == kind:
            return cls(**fields)
    raise ValueError(f"unknown step {kind!r}")


_BOUNDARY = re.compile(">")


def text_boundaries(text: str) -> list[int]:
    """Positions between the ``<...>`` tokens random scripts insert (0 and after each ``>``):
    inserting there never splits another agent's token."""
    return [0, *(m.end() for m in _BOUNDARY.finditer(text))]


def random_script(
    rng: random.Random,
    agents: int,
    ops: int,
    *,
    max_wait: int = 3,
    partition_rate: float = 0.1,
) -> list[Step]:
    """``ops`` random writes by ``agents`` agents to the default collections, with waits of
    0..``max_wait`` ticks between them and, at rate ``partition_rate``, partitions that heal
    later. Values are unique (``"a<agent>.<n>"``), so the invariant check can tell every
    write apart; text inserts go to a token boundary (``at="boundary"``)."""
    steps: list[Step] = []
    partitioned = False
    for n in range(ops):
        if agents > 1 and rng.random() < partition_rate:
            if partitioned:
                steps.append(Heal())
            else:
                members = list(range(agents))
                rng.shuffle(members)
                cut = rng.randrange(1, agents)
                steps.append(
                    Partition((tuple(sorted(members[:cut])), tuple(sorted(members[cut:]))))
                )
            partitioned = not partitioned
        a = rng.randrange(agents)
        value = f"a{a}.{n}"
        roll = rng.random()
        if roll < 0.3:
            steps.append(Set(a, LWW_MAP, rng.choice(KEYS), value))
        elif roll < 0.4:
            steps.append(Delete(a, LWW_MAP, rng.choice(KEYS)))
        elif roll < 0.6:
            steps.append(Set(a, KEEP_ALL_MAP, rng.choice(KEYS), value))
        elif roll < 0.65:
            steps.append(Delete(a, KEEP_ALL_MAP, rng.choice(KEYS)))
        elif roll < 0.85:
            steps.append(Append(a, LIST, value))
        else:
            steps.append(InsertText(a, TEXT, f"<{value}>", at="boundary"))
        wait = rng.randint(0, max_wait)
        if wait:
            steps.append(Wait(wait))
    if partitioned:
        steps.append(Heal())
    return steps
