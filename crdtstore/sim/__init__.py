"""A deterministic simulator of concurrent agents merging one crdtstore record.

N agents, each with a real :class:`crdtstore.Record` on its own ``memory://`` store, write
through the public API; their writes travel as journal-entry update bytes over a simulated
network (per-link delay, loss with retransmission, duplication, reordering, partitions that
heal); every operation, delivery and state goes into a JSON-able trace; invariants
(convergence, no acknowledged write lost, every ``keep_all`` sibling kept) are checked after
every step and at the end. The same seed gives the same trace.

Quick use::

    from crdtstore import sim

    result = sim.simulate(sim.SimConfig(agents=3, seed=7, ops=30))
    assert result.ok, result.violations
    script = [sim.Partition(((0,), (1,))), sim.Set(0, "m", "x", "a0"), sim.Heal()]
    result = sim.simulate(sim.SimConfig(agents=2), script)

See ``crdtstore/sim/_sim.py`` for why the simulator drives real records and how delivery is
ordered.
"""

from ._agent import agent_state as agent_state
from ._agent import decode_state_vector as decode_state_vector
from ._check import Violation as Violation
from ._check import WriteRec as WriteRec
from ._check import check_state as check_state
from ._config import SimConfig as SimConfig
from ._config import SimResult as SimResult
from ._conflicts import Contest as Contest
from ._conflicts import CountPoint as CountPoint
from ._conflicts import conflict_counts as conflict_counts
from ._conflicts import contests as contests
from ._conflicts import convergence_time as convergence_time
from ._conflicts import plot_counts as plot_counts
from ._diffs import DiffEntry as DiffEntry
from ._diffs import RecordDiff as RecordDiff
from ._diffs import diff as diff
from ._diffs import journal_diff as journal_diff
from ._network import LinkSpec as LinkSpec
from ._network import Message as Message
from ._network import NetworkConfig as NetworkConfig
from ._sim import Simulation as Simulation
from ._sim import simulate as simulate
from ._steps import Append as Append
from ._steps import Delete as Delete
from ._steps import Drain as Drain
from ._steps import Heal as Heal
from ._steps import InsertText as InsertText
from ._steps import Partition as Partition
from ._steps import Set as Set
from ._steps import Step as Step
from ._steps import Wait as Wait
from ._steps import random_script as random_script
from ._steps import step_from_json as step_from_json
from ._steps import text_boundaries as text_boundaries
from ._timeline import Delivery as Delivery
from ._timeline import Timeline as Timeline
from ._timeline import WriteMark as WriteMark
from ._timeline import timeline as timeline
from ._timeline import timeline_data as timeline_data
from ._trace import Trace as Trace
from ._trace import canon as canon
from ._views import Cell as Cell
from ._views import RecordTable as RecordTable
from ._views import cells as cells
from ._views import record_table as record_table
from ._views import record_tree as record_tree

__all__ = [
    "Append",
    "Cell",
    "Contest",
    "CountPoint",
    "Delete",
    "Delivery",
    "DiffEntry",
    "Drain",
    "Heal",
    "InsertText",
    "LinkSpec",
    "Message",
    "NetworkConfig",
    "Partition",
    "RecordDiff",
    "RecordTable",
    "Set",
    "SimConfig",
    "SimResult",
    "Simulation",
    "Step",
    "Timeline",
    "Trace",
    "Violation",
    "Wait",
    "WriteMark",
    "WriteRec",
    "agent_state",
    "canon",
    "cells",
    "check_state",
    "conflict_counts",
    "contests",
    "convergence_time",
    "decode_state_vector",
    "diff",
    "journal_diff",
    "plot_counts",
    "random_script",
    "record_table",
    "record_tree",
    "simulate",
    "step_from_json",
    "text_boundaries",
    "timeline",
    "timeline_data",
]
