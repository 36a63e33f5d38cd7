"""The kernel's pure rules (crdtstore/flow/_logic.py) under hypothesis: the join rule, the
start plan, the resume rule, and a model of the kernel built from them alone that runs random
workflows (nesting, joins, failures, crashes) in random completion orders."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from crdtstore.flow import AtLeast
from crdtstore.flow._logic import (
    STATES,
    Launcher,
    Tally,
    backoff_delay,
    join_decision,
    plan_starts,
    ready_steps,
    resume_action,
    sequence_decision,
)
from crdtstore.flow._spec import Join, find_cycle

OUTCOMES = st.sampled_from(["done", "failed", "cancelled"])


@st.composite
def joins(draw: st.DrawFn, n: int) -> Join:
    kind = draw(st.sampled_from(["all", "any", "at_least"]))
    if kind == "at_least":
        return AtLeast(at_least=draw(st.integers(1, max(1, n))))
    return kind  # type: ignore[return-value]


def closed_form(join: Join, outcomes: list[str]) -> str:
    done = outcomes.count("done")
    need = len(outcomes) if join == "all" else 1 if join == "any" else join.at_least  # type: ignore[union-attr]
    return "done" if done >= need else "failed"


@given(st.data())
def test_join_decides_once_and_for_good_in_any_arrival_order(data: st.DataObject) -> None:
    outcomes = data.draw(st.lists(OUTCOMES, min_size=1, max_size=12))
    join = data.draw(joins(len(outcomes)))
    order = data.draw(st.permutations(range(len(outcomes))))
    seen: list[str | None] = [None] * len(outcomes)
    decided = None
    for i in order:
        seen[i] = outcomes[i]
        now = join_decision(join, seen)
        if decided is not None:
            assert now == decided  # a decision never changes as more branches finish
        elif now != "pending":
            decided = now
    assert decided is not None  # every outcome known: never pending
    # success does not depend on the order; a failure is decided as soon as it is certain
    assert decided == closed_form(join, outcomes)


@given(st.lists(OUTCOMES, min_size=1, max_size=10))
def test_all_fails_at_the_first_unsuccessful_branch(outcomes: list[str]) -> None:
    for i, o in enumerate(outcomes):
        partial: list[str | None] = [None] * len(outcomes)
        partial[i] = o
        alone = "done" if len(outcomes) == 1 else "pending"
        assert join_decision("all", partial) == ("failed" if o != "done" else alone)


def test_at_least_fails_as_soon_as_k_is_impossible() -> None:
    assert join_decision(AtLeast(at_least=2), ["failed", "failed", None]) == "failed"
    assert join_decision(AtLeast(at_least=2), ["failed", None, None]) == "pending"
    assert join_decision(AtLeast(at_least=2), ["done", None, "done"]) == "done"
    assert join_decision("any", ["failed", None]) == "pending"
    assert join_decision("any", ["failed", "cancelled"]) == "failed"


@given(
    st.lists(st.tuples(st.booleans(), st.booleans()), max_size=20),
    st.none() | st.integers(1, 6),
)
def test_plan_starts_never_exceeds_the_limit(
    flags: list[tuple[bool, bool]], limit: int | None
) -> None:
    started = [s for s, _ in flags]
    finished = [s and f for s, f in flags]
    running = sum(1 for s, f in zip(started, finished, strict=True) if s and not f)
    got = plan_starts(started, finished, limit)
    assert got == sorted(got) and all(not started[i] for i in got)
    free = [i for i, s in enumerate(started) if not s]
    if limit is None:
        assert got == free
    else:
        assert running + len(got) <= max(limit, running)
        assert got == free[: max(0, limit - running)]  # in branch order, as many as fit


def test_ready_steps_and_sequence() -> None:
    deps = [(), (0,), (0,), (1, 2)]
    assert ready_steps(deps, [False] * 4, [None] * 4) == [0]
    assert ready_steps(deps, [True, False, False, False], ["done", None, None, None]) == [1, 2]
    assert sequence_decision(["done", None]) == "pending"
    assert sequence_decision(["done", "cancelled"]) == "failed"
    assert sequence_decision(["done", "done"]) == "done"


@given(st.sampled_from([None, *STATES]), st.integers(0, 5))
def test_resume_rule(state: str | None, attempt: int) -> None:
    r = resume_action(state, attempt)
    if state == "done":
        assert r.skip
    elif state == "waiting_on_lock" and attempt > 0:
        assert (r.skip, r.attempt, r.reattach) == (False, attempt, True)
    else:
        assert (r.skip, r.attempt, r.reattach) == (False, attempt + 1, False)
    assert r.skip or r.attempt >= 1  # every attempt that runs has a number > 0


def test_backoff() -> None:
    assert [backoff_delay(0.5, n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert backoff_delay(10, 20) == 60.0 and backoff_delay(0, 3) == 0.0


@given(st.lists(st.lists(st.integers(0, 7), max_size=3), min_size=1, max_size=8))
def test_find_cycle(raw: list[list[int]]) -> None:
    n = len(raw)
    deps = [[j % n for j in d] for d in raw]
    cycle = find_cycle(deps)
    # a topological order exists iff there is no cycle
    order: list[int] = []
    left = set(range(n))
    while True:
        free = [i for i in sorted(left) if all(j not in left for j in deps[i])]
        if not free:
            break
        order.extend(free)
        left -= set(free)
    assert (cycle is None) == (not left)
    if cycle is not None:
        assert cycle[0] == cycle[-1]
        for a, b in itertools.pairwise(cycle):
            assert b in deps[a]


# -- a model of the kernel from the pure rules alone ---------------------------------------------


@dataclass
class Node:
    """A step of a random workflow: a leaf that succeeds or not, or a composite."""

    kind: str  # leaf | parallel | sequence
    ok: bool = True
    children: list[Node] = field(default_factory=list)
    join: Join = "all"
    limit: int | None = None


@st.composite
def nodes(draw: st.DrawFn, depth: int = 0) -> Node:
    if depth >= 3 or draw(st.integers(0, 2)) == 0:
        return Node("leaf", ok=draw(st.booleans() | st.just(True)))
    kind = draw(st.sampled_from(["parallel", "sequence"]))
    children = draw(st.lists(nodes(depth + 1), min_size=1, max_size=4))
    n = len(children)
    return Node(
        kind, children=children, join=draw(joins(n)), limit=draw(st.none() | st.integers(1, 3))
    )


def reference(node: Node) -> bool:
    if node.kind == "leaf":
        return node.ok
    results = [reference(c) for c in node.children]
    if node.kind == "sequence":
        return all(results)
    return closed_form(node.join, ["done" if r else "failed" for r in results]) == "done"


class Crash(Exception):
    pass


class Model:
    """Runs a Node tree with the kernel's rules; completion order is random; a crash stops
    everything at a random step count, leaving the recorded states behind."""

    def __init__(self, rnd: random.Random, crash_after: int | None) -> None:
        self.rnd = rnd
        self.crash_after = crash_after
        self.ticks = 0
        self.state: dict[str, tuple[str, int]] = {}  # path -> (state, attempt): the record
        self.runs: dict[str, int] = {}  # leaf path -> times its body ran
        self.max_running: dict[str, int] = {}

    def tick(self) -> None:
        self.ticks += 1
        if self.crash_after is not None and self.ticks >= self.crash_after:
            raise Crash

    def run(self, node: Node, path: str) -> str:
        st_, attempt = self.state.get(path, ("pending", 0))
        action = resume_action(st_, attempt)
        if action.skip:
            return "done"
        self.state[path] = ("running", action.attempt)
        self.tick()
        if node.kind == "leaf":
            self.runs[path] = self.runs.get(path, 0) + 1
            outcome = "done" if node.ok else "failed"
        else:
            outcome = self.composite(node, path)
        self.state[path] = (outcome, action.attempt)
        self.tick()
        return outcome

    def composite(self, node: Node, path: str) -> str:
        kids = node.children
        outcomes: list[str | None] = [
            "done" if self.state.get(f"{path}/{i}", ("", 0))[0] == "done" else None
            for i in range(len(kids))
        ]
        started = [o is not None for o in outcomes]
        deps = [(i - 1,) if i else () for i in range(len(kids))]

        def decide() -> str:
            if node.kind == "sequence":
                return sequence_decision(outcomes)
            return join_decision(node.join, outcomes)

        running: list[int] = []
        while decide() == "pending":
            finished = [o is not None for o in outcomes]
            if node.kind == "sequence":
                new = ready_steps(deps, started, outcomes)
            else:
                new = plan_starts(started, finished, node.limit)
            for i in new:
                started[i] = True
                running.append(i)
            if node.kind == "parallel" and node.limit is not None:
                assert len(running) <= node.limit
            self.max_running[path] = max(self.max_running.get(path, 0), len(running))
            i = self.rnd.choice(running)  # branches finish in a random order
            running.remove(i)
            outcomes[i] = self.run(kids[i], f"{path}/{i}")
        for i in running:  # cancelled by the decided join
            self.state[f"{path}/{i}"] = ("cancelled", self.state.get(f"{path}/{i}", ("", 1))[1])
        return decide()


def leaves(node: Node, path: str = "r") -> list[str]:
    if node.kind == "leaf":
        return [path]
    return [p for i, c in enumerate(node.children) for p in leaves(c, f"{path}/{i}")]


@given(nodes(), st.integers(0, 2**32), st.lists(st.integers(1, 40), max_size=3))
def test_model_of_random_workflows_with_crashes(tree: Node, seed: int, crashes: list[int]) -> None:
    rnd = random.Random(seed)
    model = Model(rnd, None)
    recorded_done: set[str] = set()
    body_runs: dict[str, int] = {}
    for crash_after in [*crashes, None]:  # crash a few times, then run to the end
        model.crash_after = None if crash_after is None else model.ticks + crash_after
        before = {p for p, (s, _) in model.state.items() if s == "done"}
        try:
            outcome = model.run(tree, "r")
        except Crash:
            outcome = None
        for p, n in model.runs.items():
            body_runs[p] = body_runs.get(p, 0) + n
            assert p not in before  # a step recorded done is never run again after a restart
        model.runs = {}
        for p in before:
            assert model.state[p][0] == "done"
        recorded_done |= {p for p, (s, _) in model.state.items() if s == "done"}
        if outcome is not None:
            break
    assert outcome == ("done" if reference(tree) else "failed")
    for p in leaves(tree):
        if p in recorded_done:
            assert body_runs.get(p, 0) >= 1
    # without crashes each leaf body runs at most once
    clean = Model(random.Random(seed), None)
    assert clean.run(tree, "r") == outcome
    assert all(n == 1 for n in clean.runs.values())


@given(st.data())
def test_tally_is_join_decision_one_outcome_at_a_time(data: st.DataObject) -> None:
    outcomes = data.draw(st.lists(OUTCOMES, min_size=1, max_size=12))
    join = data.draw(joins(len(outcomes)))
    order = data.draw(st.permutations(range(len(outcomes))))
    tally = Tally(join, len(outcomes))
    seen: list[str | None] = [None] * len(outcomes)
    assert tally.decision() == join_decision(join, seen)
    for i in order:
        seen[i] = outcomes[i]
        assert tally.add(outcomes[i]) == join_decision(join, seen)
        if join == "all":
            assert tally.decision() == sequence_decision(seen)


@given(st.lists(st.booleans(), max_size=20), st.none() | st.integers(1, 5), st.randoms())
def test_launcher_is_plan_starts(pre: list[bool], limit: int | None, rnd: random.Random) -> None:
    """Branches recorded done (``pre``) are skipped; the rest start in order, at most
    ``limit`` at once, whichever finishes first."""
    started = list(pre)
    finished = list(pre)
    launcher = Launcher(list(pre), limit)
    running: list[int] = []
    while True:
        want = plan_starts(started, finished, limit)
        got = launcher.starts()
        assert got == want
        for i in got:
            started[i] = True
        running += got
        if limit is not None:
            assert len(running) <= limit
        if not running:
            break
        i = rnd.choice(running)
        running.remove(i)
        finished[i] = True
        launcher.finished()
    assert all(started) and all(finished)
