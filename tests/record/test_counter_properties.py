"""Counters converge and lose no increment (issue 19 part 2), by hypothesis.

Pure replicas (2 to 6) add random amounts to one counter in the form counters take (one key
per replica, ``crdtstore._counter_rules``); their updates reach each other in random order,
duplicated, in random batches (each merged and applied once), with some replicas cut off for
a while (a partition: they get nothing until it heals). Replicas are resumed (replaced by a
fresh Doc, a new client id, loaded from what they had) and the log is compacted (replaced by
one merged snapshot) at random moments. After a final state-vector exchange every replica
holds the same entries, and the counter's value is the sum of every add ever made, as an int
when all adds were ints. The last test does the same through real records of one store:
random adds, records closed and reopened (resumed), the run compacted (journal kept or
dropped), and every record, and a fresh one, reads the sum.
"""

from __future__ import annotations

import itertools
import random
import time
from typing import Any, NamedTuple

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

import crdtstore
from crdtstore import Replica, tree_merge
from crdtstore._counter_rules import contribution_key, number, total
from crdtstore.record._provenance import Meta

NAME = "tokens_used"


class Add(NamedTuple):
    replica: int
    amount: int | float


class Deliver(NamedTuple):
    target: int
    seed: int  # which updates (a random subset, with duplicates) in which order
    batches: int


class Partition(NamedTuple):
    replica: int  # cut off (True) or healed (False)
    cut: bool


class Resume(NamedTuple):
    replica: int


class Compact(NamedTuple):
    pass


Step = Add | Deliver | Partition | Resume | Compact


class Net:
    def __init__(self, n: int) -> None:
        self.replicas = [Replica() for _ in range(n)]
        self.updates: list[bytes] = []
        self.cut: set[int] = set()
        self.added: list[int | float] = []

    def add(self, i: int, amount: int | float) -> None:
        r = self.replicas[i]
        root = r.root(NAME, "map")
        key = contribution_key(f"agent{i}", r.client_id)
        new = number((root.get(key) or 0) + amount)

        def apply() -> None:
            root[key] = new

        update = r.local(
            [["map", NAME, "set", key, new]], apply, Meta(f"agent{i}", "tool", 0.0, None)
        )
        assert update is not None
        self.updates.append(update)
        self.added.append(amount)

    def deliver(self, step: Deliver) -> None:
        if step.target in self.cut or not self.updates:
            return
        rnd = random.Random(step.seed)
        picks = rnd.choices(self.updates, k=rnd.randint(1, 2 * len(self.updates)))
        cuts = sorted({0, len(picks), *(rnd.randrange(len(picks)) for _ in range(step.batches))})
        for a, b in itertools.pairwise(cuts):
            self.replicas[step.target].apply_update(tree_merge(picks[a:b]))

    def resume(self, i: int) -> None:
        """The replica's process restarts: a fresh Doc (new client id) loaded from its state."""
        fresh = Replica()
        fresh.apply_update(self.replicas[i].doc.get_update())
        self.replicas[i] = fresh

    def compact(self) -> None:
        """The log becomes one snapshot of everything (what ``store.compact`` does)."""
        if self.updates:
            self.updates = [tree_merge(self.updates)]

    def heal_and_exchange(self) -> None:
        self.cut.clear()
        for _ in range(2):
            for a, b in itertools.permutations(self.replicas, 2):
                a.apply_update(b.doc.get_update(a.doc.get_state()))

    def run(self, steps: list[Step]) -> None:
        for step in steps:
            if isinstance(step, Add):
                self.add(step.replica, step.amount)
            elif isinstance(step, Deliver):
                self.deliver(step)
            elif isinstance(step, Partition):
                (self.cut.add if step.cut else self.cut.discard)(step.replica)
            elif isinstance(step, Resume):
                self.resume(step.replica)
            else:
                self.compact()


@st.composite
def schedules(draw: st.DrawFn, floats: bool = False) -> tuple[int, list[Step]]:
    n = draw(st.integers(2, 6))
    who = st.integers(0, n - 1)
    amounts: st.SearchStrategy[Any] = st.integers(-5, 1000)
    if floats:
        amounts = st.one_of(amounts, st.sampled_from([0.5, 0.25, 1.5, -0.75]))
    step = st.one_of(
        st.builds(Add, who, amounts),
        st.builds(Add, who, amounts),
        st.builds(Deliver, who, st.integers(0, 2**32), st.integers(0, 3)),
        st.builds(Partition, who, st.booleans()),
        st.builds(Resume, who),
        st.just(Compact()),
    )
    return n, draw(st.lists(step, min_size=1, max_size=40))


def _entries(r: Replica) -> dict[str, Any]:
    return dict(r.root(NAME, "map").items())


@given(schedule=schedules())
def test_counter_replicas_converge_and_lose_no_increment(
    schedule: tuple[int, list[Step]],
) -> None:
    n, steps = schedule
    net = Net(n)
    net.run(steps)
    net.heal_and_exchange()
    reference = _entries(net.replicas[0])
    for i, r in enumerate(net.replicas):
        assert _entries(r) == reference, f"replica {i} diverged"
        value = total(_entries(r).values())
        assert value == sum(net.added), "an increment was lost or counted twice"
        assert type(value) is int  # every add was an int
    joiner = Replica()  # a late joiner from the (compacted) log alone
    if net.updates:
        joiner.apply_update(tree_merge(net.updates))
    assert total(_entries(joiner).values()) == sum(net.added)


@given(schedule=schedules(floats=True))
def test_counter_with_fractional_adds_converges(schedule: tuple[int, list[Step]]) -> None:
    n, steps = schedule
    net = Net(n)
    net.run(steps)
    net.heal_and_exchange()
    values = {total(_entries(r).values()) for r in net.replicas}
    assert len(values) == 1
    # the amounts are binary fractions: float sums are exact
    assert values.pop() == sum(net.added)


# -- the same through real records: resume and compaction between random adds ----------------


class RAdd(NamedTuple):
    rec: int
    amount: int


class RResume(NamedTuple):
    rec: int


class RCompact(NamedTuple):
    drop_journal: bool


@st.composite
def record_schedules(draw: st.DrawFn) -> tuple[int, list[RAdd | RResume | RCompact]]:
    n = draw(st.integers(2, 4))
    who = st.integers(0, n - 1)
    step = st.one_of(
        st.builds(RAdd, who, st.integers(-3, 50)),
        st.builds(RAdd, who, st.integers(-3, 50)),
        st.builds(RResume, who),
        st.builds(RCompact, st.booleans()),
    )
    return n, draw(st.lists(step, min_size=1, max_size=25))


@settings(max_examples=max(10, settings.default.max_examples // 3))
@given(schedule=record_schedules())
def test_counter_records_lose_nothing_across_resume_and_compaction(
    schedule: tuple[int, list[RAdd | RResume | RCompact]],
) -> None:
    n, steps = schedule

    async def main() -> None:
        url = f"memory://counter-prop-{time.monotonic_ns()}"
        added = 0
        async with crdtstore.open_store(url) as store:
            recs = [await store.open_record(run="r", agent=f"a{i}").start() for i in range(n)]
            for step in steps:
                if isinstance(step, RAdd):
                    await recs[step.rec].counter("c").add(step.amount)
                    added += step.amount
                elif isinstance(step, RResume):
                    await recs[step.rec].aclose()
                    recs[step.rec] = await store.open_record(run="r", agent=f"a{step.rec}").start()
                else:
                    for rec in recs:
                        await rec.flush()
                    await store.compact("r", drop_journal=step.drop_journal)
            for rec in recs:
                await rec.flush()
            for rec in recs:
                await rec.sync()
                if added or "c" in rec.collections():
                    assert rec.counter("c").value == added
            for rec in recs:
                await rec.aclose()
            async with store.open_record(run="r", agent="reader") as rec:
                assert rec.counter("c").value == added
                assert type(rec.counter("c").value) is int

    anyio.run(main)
