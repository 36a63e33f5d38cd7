"""The merge simulator (crdtstore.sim): determinism, known scenarios, random runs over seeds
and network parameters without invariant violations, and a broken merge that is caught."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crdtstore import sim

LOSSY = sim.NetworkConfig(
    sim.LinkSpec(delay=(0, 5), loss=0.3, duplicate=0.3, reorder=0.3), retransmit_after=3
)
# a fraction of the profile's examples: each example runs a whole simulation
FEW = max(4, getattr(settings.default, "max_examples", 60) // 3)


def values(state: dict[str, Any], coll: str, key: str) -> list[Any]:
    return sorted(s["value"] for s in state[coll][key])


# -- determinism ---------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_trace() -> None:
    cfg = sim.SimConfig(agents=3, seed=11, ops=30, network=LOSSY)
    one, two = sim.simulate(cfg), sim.simulate(cfg)
    assert one.ok, one.violations
    assert one.trace.to_json() == two.trace.to_json()
    assert json.dumps(one.to_json(), sort_keys=True) == json.dumps(two.to_json(), sort_keys=True)
    # the trace has every kind of event the network produced, and states
    kinds = {e["ev"] for e in one.trace}
    assert {"write", "send", "arrive", "apply", "lost", "duplicate", "final"} <= kinds
    assert all("state" in e for e in one.trace.of("write", "apply"))
    other = sim.simulate(sim.SimConfig(agents=3, seed=12, ops=30, network=LOSSY))
    assert other.trace.to_json() != one.trace.to_json()


def test_the_trace_does_not_depend_on_the_event_loop() -> None:
    cfg = sim.SimConfig(agents=2, seed=3, ops=12, network=LOSSY)
    assert sim.simulate(cfg).trace.to_json() == sim.simulate(cfg, backend="trio").trace.to_json()


def test_a_script_round_trips_through_json_and_replays_identically() -> None:
    cfg = sim.SimConfig(agents=3, seed=5, ops=15, network=LOSSY)
    first = sim.simulate(cfg)
    script = [sim.step_from_json(s) for s in json.loads(json.dumps(first.trace.events[1]["steps"]))]
    assert script == first.script
    again = sim.simulate(cfg, script)
    assert again.trace.to_json() == first.trace.to_json()


# -- known scenarios -----------------------------------------------------------------------------


def test_partition_divergent_writes_to_different_keys_then_heal_keeps_both() -> None:
    script = [
        sim.Partition(((0,), (1,))),
        sim.Set(0, "m", "x", "from a0"),
        sim.Set(1, "m", "y", "from a1"),
        sim.Wait(20),
    ]
    during = sim.simulate(sim.SimConfig(agents=2, seed=1), [*script, sim.Drain()])
    # still partitioned at the end of the script: the simulator heals, then drains
    assert during.ok, during.violations
    applies_before_heal = [e for e in during.trace.of("apply") if e["t"] < 20]
    assert applies_before_heal == []
    assert {e["reason"] for e in during.trace.of("lost")} == {"partition"}

    healed = sim.simulate(sim.SimConfig(agents=2, seed=1), [*script, sim.Heal(), sim.Drain()])
    assert healed.ok, healed.violations
    assert healed.converged
    for state in healed.states.values():
        assert state["m"] == {"x": "from a0", "y": "from a1"}
    assert healed.ticks >= 20


def test_concurrent_keep_all_writes_become_a_conflict_with_both_siblings() -> None:
    script = [
        sim.Set(0, "k", "capital", "Sydney"),
        sim.Set(1, "k", "capital", "Canberra"),  # concurrent: neither saw the other
        sim.Drain(),
    ]
    result = sim.simulate(sim.SimConfig(agents=2, seed=2), script)
    assert result.ok, result.violations
    for state in result.states.values():
        assert values(state, "k", "capital") == ["Canberra", "Sydney"]
        assert sorted(s["agent"] for s in state["k"]["capital"]) == ["a0", "a1"]
    # a later write that saw both resolves them, everywhere
    resolved = sim.simulate(
        sim.SimConfig(agents=2, seed=2), [*script, sim.Set(1, "k", "capital", "Canberra")]
    )
    assert resolved.ok, resolved.violations
    for state in resolved.states.values():
        assert values(state, "k", "capital") == ["Canberra"]


def test_concurrent_lww_writes_keep_one_value_the_same_everywhere() -> None:
    script = [sim.Set(0, "m", "k", "v0"), sim.Set(1, "m", "k", "v1"), sim.Set(2, "m", "k", "v2")]
    result = sim.simulate(sim.SimConfig(agents=3, seed=4, network=LOSSY), script)
    assert result.ok, result.violations
    winners = {state["m"]["k"] for state in result.states.values()}
    assert len(winners) == 1 and winners <= {"v0", "v1", "v2"}
    # deterministic: client ids come from the seed
    again = sim.simulate(sim.SimConfig(agents=3, seed=4, network=LOSSY), script)
    assert again.states == result.states


def test_concurrent_appends_and_text_inserts_all_survive() -> None:
    script = [
        sim.Append(0, "l", "a0-1"),
        sim.Append(1, "l", "a1-1"),
        sim.InsertText(0, "t", "<hello>"),
        sim.InsertText(1, "t", "<world>", at=0),
        sim.Append(0, "l", "a0-2"),
    ]
    result = sim.simulate(sim.SimConfig(agents=2, seed=9, network=LOSSY), script)
    assert result.ok, result.violations
    state = result.states["a0"]
    assert sorted(state["l"]) == ["a0-1", "a0-2", "a1-1"]
    assert state["l"].index("a0-1") < state["l"].index("a0-2")
    assert sorted([state["t"][:7], state["t"][7:]]) == ["<hello>", "<world>"]


def test_a_write_the_record_refuses_is_traced_and_not_acknowledged() -> None:
    script = [sim.Append(0, "l", "x"), sim.Set(0, "l", "k", "not a map"), sim.Delete(1, "m", "x")]
    result = sim.simulate(sim.SimConfig(agents=2, seed=0), script)
    assert result.ok, result.violations
    (refused,) = result.trace.of("refused")
    assert refused["error"] == "CollectionKindMismatch"
    assert len(result.trace.of("noop")) == 1  # deleting a missing key journals nothing
    assert len(result.writes) == 1


def test_delayed_messages_are_held_until_their_predecessors_arrive() -> None:
    slow_first = sim.NetworkConfig(sim.LinkSpec(delay=(1, 1)), links={})
    script = [
        sim.Set(0, "m", "x", "first"),
        sim.Wait(2),  # a1 has it
        sim.Set(1, "m", "x", "second"),  # saw "first"
    ]
    # a0 -> a2 is slow, a1 -> a2 fast: "second" reaches a2 before "first"
    net = sim.NetworkConfig(
        slow_first.link, links={(0, 2): sim.LinkSpec(delay=(10, 10))}, retransmit_after=2
    )
    result = sim.simulate(sim.SimConfig(agents=3, seed=0, network=net), script)
    assert result.ok, result.violations
    held = result.trace.of("held")
    assert [(e["dst"], e["write"]) for e in held] == [("a2", 1)]
    assert all(s["m"] == {"x": "second"} for s in result.states.values())


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(ValueError, match="agent 5"):
        sim.Simulation(sim.SimConfig(agents=2), [sim.Set(5, "m", "x", 1)])
    with pytest.raises(ValueError, match="loss"):
        sim.LinkSpec(loss=1.0)
    with pytest.raises(ValueError, match="delay"):
        sim.LinkSpec(delay=(3, 1))


# -- a broken merge is caught --------------------------------------------------------------------


def test_a_permanently_dropped_delivery_is_caught() -> None:
    script = [sim.Append(0, "l", "x"), sim.Append(0, "l", "y"), sim.Set(1, "m", "k", "v")]
    cfg = sim.SimConfig(agents=3, seed=1, network=LOSSY)
    assert sim.simulate(cfg, script).ok
    broken = sim.simulate(sim.SimConfig(agents=3, seed=1, network=LOSSY, drop_delivery=0), script)
    assert not broken.ok
    assert not broken.converged
    found = {(v.invariant, v.agent) for v in broken.violations}
    assert ("lost_append", "a1") in found  # message 0 carried a0's first append to a1
    assert ("undelivered", "a1") in found  # and a0's second append waits for it forever
    assert ("convergence", None) in found
    assert broken.trace.of("dropped")[0]["msg"] == 0
    assert broken.trace.of("exchange") == []  # the hook disables the final exchange


@settings(max_examples=FEW)
@given(seed=st.integers(0, 10_000), drop=st.integers(0, 30))
def test_any_permanently_dropped_delivery_is_caught(seed: int, drop: int) -> None:
    """With causal delivery a dropped message is caught: its write is missing at the
    receiver, or the receiver holds its successors back forever. Except a dropped delete
    that a concurrent write made moot: a delete adds no struct (the state vector does not
    move), only a tombstone of a value that is gone anyway, so the replicas are equal.
    (With causal=False a drop may also be repaired for real: a local write's update can
    carry another agent's content that was pending at its author.)"""
    cfg = sim.SimConfig(agents=3, seed=seed, ops=12, network=LOSSY)
    result = sim.simulate(dataclasses.replace(cfg, drop_delivery=drop))
    dropped = result.trace.of("dropped")
    if dropped and not result.writes[dropped[0]["write"]].deleted:
        assert not result.ok
        assert any(v.invariant in ("convergence", "undelivered") for v in result.violations)


# -- random runs -----------------------------------------------------------------------------


links = st.builds(
    sim.LinkSpec,
    delay=st.tuples(st.integers(0, 3), st.integers(0, 6)).map(lambda d: (d[0], d[0] + d[1])),
    loss=st.floats(0, 0.6),
    duplicate=st.floats(0, 0.6),
    reorder=st.floats(0, 0.6),
    reorder_delay=st.integers(0, 10),
)


@settings(max_examples=FEW)
@given(
    seed=st.integers(0, 2**32),
    agents=st.integers(1, 4),
    ops=st.integers(0, 25),
    link=links,
    slow=links,
    retransmit=st.integers(1, 8),
    partition_rate=st.floats(0, 0.3),
)
def test_random_runs_never_violate_an_invariant(
    seed: int,
    agents: int,
    ops: int,
    link: sim.LinkSpec,
    slow: sim.LinkSpec,
    retransmit: int,
    partition_rate: float,
) -> None:
    net = sim.NetworkConfig(link, links={(0, agents - 1): slow}, retransmit_after=retransmit)
    cfg = sim.SimConfig(
        agents=agents, seed=seed, ops=ops, network=net, partition_rate=partition_rate
    )
    result = sim.simulate(cfg)
    assert result.ok, [v.to_json() for v in result.violations]
    assert result.converged
    assert result.trace.of("drained")[0]["converged"]  # causal delivery needs no repair


@pytest.mark.parametrize("seed", range(4))
def test_out_of_order_delivery_converges_after_the_state_vector_exchange(seed: int) -> None:
    """causal=False applies messages as they arrive (pycrdt hazard 1): the replicas may
    differ when the network drains; the final state-vector exchange makes them equal."""
    result = sim.simulate(sim.SimConfig(agents=3, seed=seed, ops=25, network=LOSSY, causal=False))
    assert result.converged, [v.to_json() for v in result.violations]


# -- the checks themselves ------------------------------------------------------------------------


def w(id: int, agent: int, kind: str, **kw: Any) -> sim.WriteRec:
    return sim.WriteRec(id=id, agent=agent, index=id + 1, tick=0, kind=kind, **kw)


def test_the_checks_flag_lost_writes_siblings_and_appends() -> None:
    kinds = {"m": "map", "k": "keep_all", "l": "list", "t": "text"}
    s1 = w(0, 0, "map", collection="m", key="x", value="old")
    s2 = w(1, 1, "map", collection="m", key="x", value="new", supersedes=frozenset({0}))
    concurrent = w(2, 2, "map", collection="m", key="x", value="other")
    assert sim.check_state({"m": {"x": "new"}}, [s1, s2], kinds) == []
    assert sim.check_state({"m": {"x": "old"}}, [s1, s2], kinds)[0][0] == "lost_write"
    assert sim.check_state({"m": {"x": "other"}}, [s1, s2, concurrent], kinds) == []
    assert sim.check_state({"m": {}}, [s1, s2], kinds)[0][0] == "lost_write"

    k1 = w(3, 0, "keep_all", collection="k", key="x", value=1, pkey="x\x1fa.1")
    k2 = w(4, 1, "keep_all", collection="k", key="x", value=2, pkey="x\x1fb.1")
    both = {"k": {"x": [{"token": "a.1", "agent": "a0", "value": 1}]}}
    assert sim.check_state(both, [k1, k2], kinds)[0][0] == "keep_all_sibling"
    k3 = w(
        5,
        0,
        "keep_all",
        collection="k",
        key="x",
        value=3,
        pkey="x\x1fa.2",
        resolved=("x\x1fa.1", "x\x1fb.1"),
    )
    one = {"k": {"x": [{"token": "a.2", "agent": "a0", "value": 3}]}}
    assert sim.check_state(one, [k1, k2, k3], kinds) == []

    a1 = w(6, 0, "list", collection="l", value="p")
    a2 = w(7, 0, "list", collection="l", value="q")
    assert sim.check_state({"l": ["p", "q"]}, [a1, a2], kinds) == []
    assert sim.check_state({"l": ["q", "p"]}, [a1, a2], kinds)[0][0] == "lost_append"
    assert sim.check_state({"l": ["p"]}, [a1, a2], kinds)[0][0] == "lost_append"
    assert sim.check_state({"l": ["p", "q", "q"]}, [a1, a2], kinds)[0][0] == "lost_append"

    t1 = w(8, 0, "text", collection="t", value="<ab>")
    assert sim.check_state({"t": "<ab>"}, [t1], kinds) == []
    assert sim.check_state({"t": "<a>"}, [t1], kinds)[0][0] == "lost_text"
