"""The simulator: N agents, each a real :class:`crdtstore.Record` on its own ``memory://``
store, connected by a simulated network; scripted or random writes; a trace; invariant checks.

Why real records, each on its own store: the point is to watch the record and journal code
merge, not a model of it, and a private store means a write reaches another agent only as a
message of the simulated network. Agents write through the public API in ``durable`` mode,
so a write that returned is acknowledged. A message carries the update bytes of the journal
entries the write made; a receiver merges them (``tree_merge``) and applies them with
``rec.apply_update`` (journaled again as relayed content, never forwarded: every write
travels from its author). At the end the network drains and the agents exchange state
vectors, as every reconnect of the sync layer does.

Determinism: every random choice comes from ``random.Random(SimConfig.seed)``, time is
simulated ticks, each agent's Doc gets a client id drawn from the seed (``_agent._seed_client_id``:
the higher id wins concurrent map writes), and the trace leaves out write times.

Causal delivery: out-of-order updates of one client can drop content (PYCRDT-NOTES hazard 1).
With ``causal=True`` (the default) a receiver holds a message back until it integrated every
write it depends on, and invariants are checked at every step; ``causal=False`` applies
messages as they arrive, to watch the hazard (only the final state is checked).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

import anyio

from .._errors import CrdtStoreError
from .._semantics import CollectionSpec
from .._store import open_store
from ..record._replay import tree_merge
from ._agent import _Agent, _seed_client_id, agent_state, decode_state_vector
from ._check import SEP, Violation, WriteRec, check_state, lww_frontier
from ._config import SimConfig, SimResult
from ._network import Event, Message, Network
from ._steps import (
    Append,
    Delete,
    Drain,
    Heal,
    InsertText,
    Partition,
    Set,
    Step,
    Wait,
    random_script,
    text_boundaries,
)
from ._trace import Trace, canon


class Simulation:
    """One simulation run. ``await Simulation(config, script).run()`` inside an event loop,
    or :func:`simulate` from synchronous code.

    Args:
        config: what to simulate (:class:`SimConfig`).
        script: the steps to execute; None draws a random script from the seed.
    """

    def __init__(self, config: SimConfig | None = None, script: Sequence[Step] | None = None):
        self.config = config = config or SimConfig()
        seed = config.seed
        if script is None:
            script = random_script(
                random.Random(f"{seed}:script"),
                config.agents,
                config.ops,
                max_wait=config.max_wait,
                partition_rate=config.partition_rate,
            )
        self.script = list(script)
        for step in self.script:
            agent = getattr(step, "agent", 0)
            if not 0 <= agent < config.agents:
                raise ValueError(f"step {step} names agent {agent} of {config.agents}")
        self.trace = Trace()
        self.network = Network(config.network, random.Random(f"{seed}:network"), self._emit_net)
        self.network.drop_message = config.drop_delivery
        self._choices = random.Random(f"{seed}:choices")  # picks made while executing steps
        self._client_ids = random.Random(f"{seed}:client-ids").sample(
            range(1, 2**31), config.agents
        )
        self.now = 0
        self.agents: list[_Agent] = []
        self.writes: list[WriteRec] = []
        self.violations: list[Violation] = []
        self._reported: set[tuple[str, str | None, str, bool]] = set()
        self.kinds: dict[str, str] = {}  # collection -> map / keep_all / list / text
        self._messages = 0
        self._ran = False

    # -- trace and checks -----------------------------------------------------------------------

    def _emit(self, event: dict[str, Any]) -> None:
        self.trace.emit(event)

    def _emit_net(self, event: dict[str, Any]) -> None:
        event["src"] = self.agents[event["src"]].name
        event["dst"] = self.agents[event["dst"]].name
        self.trace.emit(event)

    def _violate(self, invariant: str, agent: str | None, detail: str, final: bool = False) -> None:
        if (invariant, agent, detail, final) in self._reported:
            return  # a broken state stays broken: report it once, when first seen
        self._reported.add((invariant, agent, detail, final))
        v = Violation(invariant, agent, self.now, detail, final)
        self.violations.append(v)
        self._emit({"t": self.now, "ev": "violation", **v.to_json()})

    def _check(self, agent: _Agent, state: dict[str, Any]) -> None:
        if not (self.config.check_every_step and self.config.causal):
            return
        known = [self.writes[i] for i in sorted(agent.known)]
        for invariant, detail in check_state(state, known, self.kinds):
            self._violate(invariant, agent.name, detail)

    # -- running --------------------------------------------------------------------------------

    async def run(self) -> SimResult:
        """Execute the script, drain the network, exchange state vectors, check the final
        state; return the :class:`SimResult`. A simulation runs once."""
        if self._ran:
            raise RuntimeError("a Simulation runs once; make a new one")
        self._ran = True
        cfg = self.config
        schema = {name: CollectionSpec(kind="map", conflict="keep_all") for name in cfg.keep_all}
        self.kinds.update(dict.fromkeys(cfg.keep_all, "keep_all"))
        async with AsyncExitStack() as stack:
            for i in range(cfg.agents):
                store = await stack.enter_async_context(open_store("memory://"))
                rec = store.open_record(
                    cfg.run, f"a{i}", "model", durability="durable", schema=schema
                )
                _seed_client_id(rec, self._client_ids[i])
                await stack.enter_async_context(rec)
                self.agents.append(_Agent(i, store, rec, cfg.agents))
            self._emit({"t": 0, "ev": "config", "config": cfg.to_json()})
            self._emit({"t": 0, "ev": "script", "steps": [s.to_json() for s in self.script]})
            for n, step in enumerate(self.script):
                await self._step(n, step)
            converged = await self._finish()
            states = {a.name: agent_state(a.rec, cfg.keep_all) for a in self.agents}
        return SimResult(
            cfg, self.script, self.trace, self.violations, states, converged, self.now, self.writes
        )

    async def _step(self, n: int, step: Step) -> None:
        if isinstance(step, Wait):
            await self._advance(self.now + step.ticks)
        elif isinstance(step, Drain):
            await self._drain()
        elif isinstance(step, Partition):
            self.network.partition(step.groups, self.config.agents)
            self._emit({"t": self.now, "ev": "partition", "groups": step.to_json()["groups"]})
        elif isinstance(step, Heal):
            self.network.heal()
            self._emit({"t": self.now, "ev": "heal"})
        else:
            await self._write(n, step)

    async def _advance(self, until: int) -> None:
        while True:
            t = self.network.next_time()
            if t is None or t > until:
                break
            await self._event(self.network.pop())
        self.now = max(self.now, until)

    async def _drain(self) -> bool:
        while self.network and not self.network.blocked():
            event = self.network.pop()
            if event.time > self.config.max_ticks:
                self.now = event.time
                self._violate("drain", None, f"messages still in flight at tick {event.time}")
                return False
            await self._event(event)
        return True

    async def _event(self, event: Event) -> None:
        self.now = max(self.now, event.time)
        if event.kind == "retry":
            if not event.msg.dropped:
                self.network.transmit(self.now, event.msg)
        elif self.network.arrival(self.now, event):
            await self._arrive(event.msg, event.primary)

    # -- writes ---------------------------------------------------------------------------------

    async def _write(self, n: int, step: Step) -> None:
        cfg = self.config
        a = self.agents[getattr(step, "agent", 0)]
        rec = a.rec
        base = {"t": self.now, "agent": a.name, "step": n, "op": step.to_json()}
        kind = "map"
        supersedes: frozenset[int] = frozenset()
        try:
            if isinstance(step, (Set, Delete)):
                kind = "keep_all" if step.collection in cfg.keep_all else "map"
                coll = rec.map(step.collection)
                if kind == "map":
                    supersedes = frozenset(
                        w.id
                        for w in lww_frontier(
                            self.writes[i]
                            for i in a.known
                            if self.writes[i].collection == step.collection
                            and self.writes[i].key == step.key
                        )
                    )
                if isinstance(step, Set):
                    await coll.set(step.key, step.value)
                else:
                    await coll.delete(step.key)
            elif isinstance(step, Append):
                kind = "list"
                await rec.list(step.collection).append(step.value)
            elif isinstance(step, InsertText):
                kind = "text"
                text = rec.text(step.collection)
                current = text.read()
                if step.at == "end":
                    at = len(current)
                elif step.at == "boundary":
                    at = self._choices.choice(text_boundaries(current))
                else:
                    at = min(max(step.at, 0), len(current))
                base["at"] = at
                await text.insert(at, step.text)
            else:  # pragma: no cover - every step kind is handled above
                raise TypeError(f"not a step: {step!r}")
        except CrdtStoreError as exc:
            self._emit({**base, "ev": "refused", "error": type(exc).__name__, "reason": str(exc)})
            return
        entries = await a.new_entries(cfg.run)
        if not entries:
            self._emit({**base, "ev": "noop"})
            return
        self.kinds.setdefault(step.collection, kind)
        a.written += 1
        deps = tuple(a.clock)
        pkey = None
        resolved: list[str] = []
        if kind == "keep_all":
            for e in entries:
                for op in e.effect:
                    if op[0] == "map" and op[2] == "set" and SEP in op[3]:
                        pkey = op[3]
                    elif op[0] == "map" and op[2] == "del":
                        resolved.append(op[3])
        w = WriteRec(
            id=len(self.writes),
            agent=a.index,
            index=a.written,
            tick=self.now,
            kind=kind,
            collection=step.collection,
            key=getattr(step, "key", None),
            value=(step.text if isinstance(step, InsertText) else getattr(step, "value", None)),
            deleted=isinstance(step, Delete),
            pkey=pkey,
            resolved=tuple(sorted(resolved)),
            supersedes=supersedes,
            deps=deps,
            seqs=tuple(e.seq for e in entries),
        )
        self.writes.append(w)
        a.integrate(w)
        state = agent_state(rec, cfg.keep_all)
        self._emit({**base, "ev": "write", "write": w.to_json(), "state": state})
        self._check(a, state)
        updates = [e.update for e in entries]
        for dst in range(cfg.agents):
            if dst != a.index:
                msg = Message(self._messages, a.index, dst, w.id, w.index, deps, updates)
                self._messages += 1
                self.network.transmit(self.now, msg)

    # -- deliveries -----------------------------------------------------------------------------

    async def _arrive(self, msg: Message, primary: bool) -> None:
        a = self.agents[msg.dst]
        w = self.writes[msg.write]
        base = {"t": self.now, "msg": msg.id, "src": self.agents[msg.src].name, "dst": a.name}
        self._emit({**base, "ev": "arrive", "write": w.id, "duplicate": not primary})
        if not self.config.causal:
            dup = w.id in a.arrived
            a.arrived.add(w.id)
            self._promote(a)
            await self._apply(a, msg, dup)
            return
        if a.clock[msg.src] >= msg.index:
            await self._apply(a, msg, dup=True)
            return
        if not a.deliverable(msg):
            a.held[msg.id] = msg
            self._emit({**base, "ev": "held", "write": w.id, "clock": list(a.clock)})
            return
        a.integrate(w)
        await self._apply(a, msg, dup=False)
        released = True
        while released:
            released = False
            for held in sorted(a.held.values(), key=lambda m: m.id):
                if a.clock[held.src] >= held.index or a.deliverable(held):
                    del a.held[held.id]
                    dup = a.clock[held.src] >= held.index
                    if not dup:
                        a.integrate(self.writes[held.write])
                    await self._apply(a, held, dup=dup)
                    released = True
                    break

    def _promote(self, a: _Agent) -> None:
        """causal=False: count as integrated the arrived writes whose predecessors are too."""
        grown = True
        while grown:
            grown = False
            for wid in sorted(a.arrived - a.known):
                w = self.writes[wid]
                if a.clock[w.agent] == w.index - 1 and all(
                    have >= need
                    for i, (have, need) in enumerate(zip(a.clock, w.deps, strict=True))
                    if i != w.agent
                ):
                    a.integrate(w)
                    grown = True

    async def _apply(self, a: _Agent, msg: Message, dup: bool) -> None:
        base = {
            "t": self.now,
            "msg": msg.id,
            "src": self.agents[msg.src].name,
            "dst": a.name,
            "write": msg.write,
            "duplicate": dup,
        }
        try:
            await a.rec.apply_update(tree_merge(msg.updates))
        except CrdtStoreError as exc:
            # seen with causal=False: pycrdt 0.14 can panic on an update whose causal
            # predecessors are missing; the record refuses it (InvalidUpdate)
            await a.new_entries(self.config.run)
            self._emit({**base, "ev": "apply_refused", "error": f"{type(exc).__name__}: {exc}"})
            return
        relay = await a.new_entries(self.config.run)
        state = agent_state(a.rec, self.config.keep_all)
        self._emit(
            {
                **base,
                "ev": "apply",
                "relay_seqs": [e.seq for e in relay],
                "state": state,
            }
        )
        self._check(a, state)

    # -- the end --------------------------------------------------------------------------------

    def _state_vector(self, a: _Agent) -> dict[int, int]:
        return decode_state_vector(a.rec.replica.doc.get_state())

    async def _finish(self) -> bool:
        cfg = self.config
        self._emit({"t": self.now, "ev": "end_of_script"})
        if self.network.partitioned:
            self.network.heal()
            self._emit({"t": self.now, "ev": "heal"})
        await self._drain()
        for a in self.agents:
            for msg in sorted(a.held.values(), key=lambda m: m.id):
                self._violate(
                    "undelivered",
                    a.name,
                    f"message {msg.id} (write {msg.write} of {self.agents[msg.src].name}) "
                    "waits for a predecessor that never arrived",
                )
        drained = self._converged()
        self._emit({"t": self.now, "ev": "drained", "converged": drained})
        if cfg.causal and not drained and not self.violations:
            self._violate(
                "convergence", None, "every message was delivered but the replicas differ"
            )
        if cfg.final_exchange and cfg.drop_delivery is None:
            for src in self.agents:
                for dst in self.agents:
                    if src is dst:
                        continue
                    before = self._state_vector(dst)
                    doc = src.rec.replica.doc
                    await dst.rec.apply_update(doc.get_update(dst.rec.replica.doc.get_state()))
                    await dst.new_entries(cfg.run)
                    new = self._state_vector(dst) != before
                    self._emit(
                        {
                            "t": self.now,
                            "ev": "exchange",
                            "src": src.name,
                            "dst": dst.name,
                            "new": new,
                        }
                    )
        converged = self._converged()
        states = {a.name: agent_state(a.rec, cfg.keep_all) for a in self.agents}
        if not converged:
            groups: dict[str, list[str]] = {}
            for a in self.agents:
                key = canon([states[a.name], sorted(self._state_vector(a).items())])
                groups.setdefault(key, []).append(a.name)
            self._violate(
                "convergence",
                None,
                f"replicas differ after the network drained: {sorted(groups.values())}",
                final=True,
            )
        for a in self.agents:
            for invariant, detail in check_state(states[a.name], self.writes, self.kinds):
                self._violate(invariant, a.name, detail, final=True)
        self._emit(
            {
                "t": self.now,
                "ev": "final",
                "converged": converged,
                "states": states,
                "violations": len(self.violations),
            }
        )
        return converged

    def _converged(self) -> bool:
        first = self.agents[0]
        state = canon(agent_state(first.rec, self.config.keep_all))
        sv = self._state_vector(first)
        return all(
            canon(agent_state(a.rec, self.config.keep_all)) == state and self._state_vector(a) == sv
            for a in self.agents[1:]
        )


def simulate(
    config: SimConfig | None = None,
    script: Sequence[Step] | None = None,
    *,
    backend: str = "asyncio",
) -> SimResult:
    """Run a simulation from synchronous code (its own event loop; ``backend`` is an anyio
    backend name)."""
    sim = Simulation(config, script)
    return anyio.run(sim.run, backend=backend)
