"""What a simulation is asked to do and what it gives back: :class:`SimConfig` (agents, seed,
operations, the network, causal delivery, ``keep_all`` collections) and :class:`SimResult`
(trace, violations, final states, acknowledged writes), both JSON-able (``to_json``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._check import Violation, WriteRec
from ._network import NetworkConfig
from ._steps import Step
from ._trace import Trace


@dataclass(frozen=True)
class SimConfig:
    """What to simulate.

    Args:
        agents: how many agents (each with its own record).
        seed: the seed of every random choice (script, network, client ids).
        network: links, partitions' retransmission (see :class:`NetworkConfig`).
        ops: the length (writes) of the random script used when no script is given.
        max_wait, partition_rate: shape of the random script (see :func:`random_script`).
        keep_all: map collections declared ``CollectionSpec(conflict="keep_all")``.
        causal: hold back messages until their causal predecessors are integrated
            (default); False applies them on arrival.
        final_exchange: end with a state-vector exchange between every pair of agents.
        check_every_step: check the invariants at the affected replica after every write
            and delivery (``causal`` only); the final check always runs.
        max_ticks: give up draining the network after this tick (a violation).
        drop_delivery: TEST ONLY: the message with this id is dropped permanently (never
            retransmitted) and the final exchange is skipped: a broken merge that the
            invariant check must catch.
        run: the run name the agents share.
    """

    agents: int = 3
    seed: int = 0
    network: NetworkConfig = field(default_factory=NetworkConfig)
    ops: int = 20
    max_wait: int = 3
    partition_rate: float = 0.1
    keep_all: tuple[str, ...] = ("k",)
    causal: bool = True
    final_exchange: bool = True
    check_every_step: bool = True
    max_ticks: int = 100_000
    drop_delivery: int | None = None
    run: str = "sim"

    def __post_init__(self) -> None:
        if self.agents < 1:
            raise ValueError("agents must be >= 1")

    def to_json(self) -> dict[str, Any]:
        return {
            "agents": self.agents,
            "seed": self.seed,
            "network": self.network.to_json(),
            "ops": self.ops,
            "max_wait": self.max_wait,
            "partition_rate": self.partition_rate,
            "keep_all": list(self.keep_all),
            "causal": self.causal,
            "final_exchange": self.final_exchange,
            "check_every_step": self.check_every_step,
            "max_ticks": self.max_ticks,
            "drop_delivery": self.drop_delivery,
            "run": self.run,
        }


@dataclass
class SimResult:
    """What a run produced: the trace, the violations (empty when every invariant held), the
    final canonical state of every agent, whether they converged, the acknowledged writes."""

    config: SimConfig
    script: list[Step]
    trace: Trace
    violations: list[Violation]
    states: dict[str, Any]
    converged: bool
    ticks: int
    writes: list[WriteRec]

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config.to_json(),
            "script": [s.to_json() for s in self.script],
            "trace": self.trace.events,
            "violations": [v.to_json() for v in self.violations],
            "states": self.states,
            "converged": self.converged,
            "ticks": self.ticks,
            "writes": [w.to_json() for w in self.writes],
        }
