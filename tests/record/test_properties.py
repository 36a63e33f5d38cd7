"""Properties of the record (DESIGN.md invariants I1, I2, I3) and of its text diff.

- I1/I2 with controlled delivery: pure replicas make random local writes through the same
  code as the collections; their updates reach each other in random order, duplicated and in
  random batches; every batch is merged with ``tree_merge`` and applied once; every reconnect
  ends with a state-vector exchange (the rules of PYCRDT-NOTES hazard 1).
- I3: a journal written by several live records, replayed in any order through
  ``tree_merge``, rebuilds the live state.
- The text diff turns the old text into the new one, and two agents that edit disjoint parts
  of one text from the same base both keep their edit.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pycrdt import Doc, Map, Text

import crdtstore
from crdtstore import Replica, tree_merge
from crdtstore.record._provenance import Meta
from crdtstore.record._textdiff import apply_text_edits, text_diff
from tests.strategies import (
    UNICODE_SAMPLES,
    UNICODE_TEXT,
    Deliver,
    Flood,
    Local,
    Log,
    Op,
    apply_to_record,
    apply_to_replica,
    operations,
    schedules,
)

pytestmark = pytest.mark.anyio

# anyio_backend is a plain parameter (the event loop's name), safe to share between examples
ASYNC_SETTINGS = settings(
    suppress_health_check=[
        *settings.default.suppress_health_check,
        HealthCheck.function_scoped_fixture,
    ],
)
# for tests that open records: half the profile's examples
FEWER = settings(ASYNC_SETTINGS, max_examples=max(10, settings.default.max_examples // 2))
SOURCES = ("model", "tool", "user", "system")


# -- a network of pure replicas with controlled delivery -----------------------------------------


class Network:
    """Replicas, every update any of them made, and what the ``log`` steps appended."""

    def __init__(self, n: int) -> None:
        self.replicas = [Replica() for _ in range(n)]
        self.updates: list[bytes] = []
        self.seen: list[set[int]] = [set() for _ in range(n)]  # updates each replica has had
        self.appended: list[str] = []  # unique values appended to the list "log"
        self.own: dict[str, int] = {}  # key of map "own" -> the replica that set it

    def meta(self, i: int) -> Meta:
        return Meta(f"agent{i}", SOURCES[i % len(SOURCES)], 0.0, None)

    def local(self, i: int, op: Op) -> None:
        update = apply_to_replica(self.replicas[i], op, self.meta(i))
        if update is not None:
            self.seen[i].add(len(self.updates))
            self.updates.append(update)

    def log(self, i: int) -> None:
        r = self.replicas[i]
        value = f"r{i}-{len(self.appended)}"
        log, own = r.root("log", "list"), r.root("own", "map")
        at = len(log)

        def apply() -> None:
            log.extend([value])
            own[value] = i

        effect = [["list", "log", "ins", at, [value]], ["map", "own", "set", value, i]]
        update = r.local(effect, apply, self.meta(i))
        assert update is not None
        self.seen[i].add(len(self.updates))
        self.updates.append(update)
        self.appended.append(value)
        self.own[value] = i

    def deliver(self, target: int, picks: tuple[int, ...], *, merge: bool) -> None:
        if not self.updates:
            return
        indices = [p % len(self.updates) for p in picks]
        self.seen[target].update(indices)
        batch = [self.updates[k] for k in indices]
        replica = self.replicas[target]
        if merge:
            replica.apply_update(tree_merge(batch))
        else:
            for update in batch:
                replica.apply_update(update)

    def flood(self, step: Flood, *, merge: bool) -> None:
        if not self.updates:
            return
        rnd = random.Random(step.seed)
        order = list(range(len(self.updates)))
        order += rnd.choices(order, k=step.extra)
        rnd.shuffle(order)
        cuts = sorted({c % len(order) for c in step.cuts} | {0, len(order)})
        for start, stop in itertools.pairwise(cuts):
            self.deliver(step.target, tuple(order[start:stop]), merge=merge)

    def run(self, steps: list[Local | Log | Deliver | Flood], *, merge: bool) -> None:
        for step in steps:
            if isinstance(step, Local):
                self.local(step.replica, step.op)
            elif isinstance(step, Log):
                self.log(step.replica)
            elif isinstance(step, Deliver):
                self.deliver(step.target, step.picks, merge=merge)
            else:
                self.flood(step, merge=merge)

    def note_complete_but_wrong(self, reference: dict[str, Any]) -> None:
        """Tell the statistics how often a replica that had received every update was still
        wrong before the state-vector exchange (hazard 1 at work, so the test meets it)."""
        complete = [i for i, s in enumerate(self.seen) if len(s) == len(self.updates)]
        wrong = sum(self.replicas[i].to_dict() != reference for i in complete)
        event(f"complete replicas wrong before the state-vector exchange: {min(wrong, 1)}")

    def state_vector_exchange(self) -> None:
        """Every replica reconnects to every other: sync step 1 (state vector) and step 2."""
        for _ in range(2):  # the second round carries what the first one gathered
            for a, b in itertools.permutations(self.replicas, 2):
                a.apply_update(b.doc.get_update(a.doc.get_state()))

    def check_no_lost_writes(self, state: dict[str, Any]) -> None:
        log = state.get("log", [])
        assert Counter(log) == Counter(self.appended), "an append was lost or duplicated"
        assert state.get("own", {}) == self.own


def assert_converged(net: Network, reference: dict[str, Any]) -> None:
    for i, replica in enumerate(net.replicas):
        assert replica.to_dict() == reference, f"replica {i} diverged"
    net.check_no_lost_writes(reference)


@given(schedule=schedules(), rnd=st.randoms(use_true_random=False))
def test_converge_with_merged_batches_in_random_order(
    schedule: tuple[int, list[Any]], rnd: random.Random
) -> None:
    """I1/I2: random order, duplicates and batching; each batch merged and applied once."""
    n, steps = schedule
    net = Network(n)
    net.run(steps, merge=True)

    # A late joiner that receives the whole history as one merged batch, shuffled and with
    # duplicates, needs no state-vector exchange to be complete.
    everything = net.updates + (rnd.choices(net.updates, k=5) if net.updates else [])
    rnd.shuffle(everything)
    joiner = Replica()
    joiner.apply_update(tree_merge(everything))
    reference = joiner.to_dict()
    net.check_no_lost_writes(reference)

    net.note_complete_but_wrong(reference)
    net.state_vector_exchange()
    assert_converged(net, reference)


@given(schedule=schedules())
def test_unmerged_out_of_order_delivery_is_repaired_by_state_vector_exchange(
    schedule: tuple[int, list[Any]],
) -> None:
    """Single updates applied one by one in random order (against the design's rule) may
    lose content in pycrdt 0.14 (hazard 1); the final state-vector exchange repairs it."""
    n, steps = schedule
    net = Network(n)
    net.run(steps, merge=False)
    joiner = Replica()
    joiner.apply_update(tree_merge(net.updates))
    reference = joiner.to_dict()
    net.note_complete_but_wrong(reference)
    net.state_vector_exchange()
    assert_converged(net, reference)


def test_pin_hazard_out_of_order_single_applies_lose_content() -> None:
    """Pins PYCRDT-NOTES hazard 1, the reason for merge-first and the state-vector exchange.

    If this starts failing because no order loses content any more, pycrdt fixed the bug:
    update PYCRDT-NOTES.md (the design rules stay harmless).
    """
    source = Replica()
    meta = Meta("a", "model", 0.0, None)
    ops = [
        Op("list", "l", "insert", (0, "v0")),
        Op("list", "l", "del", (0, 1)),
        Op("list", "l", "insert", (0, "v2")),
        Op("map", "m", "set", ("k1", 3)),
    ]
    updates = [apply_to_replica(source, op, meta) for op in ops]
    assert all(u is not None for u in updates)
    expected = source.to_dict()
    assert expected == {"l": ["v2"], "m": {"k1": 3}}
    lost = []
    for order in itertools.permutations(updates):
        single = Replica()
        for u in order:
            assert u is not None
            single.apply_update(u)
        if single.to_dict() != expected:
            lost.append(single.to_dict())
        single.apply_update(source.doc.get_update(single.doc.get_state()))
        assert single.to_dict() == expected, "the state-vector exchange did not repair it"
        merged = Replica()
        merged.apply_update(tree_merge([u for u in order if u is not None]))
        assert merged.to_dict() == expected, "merge-then-apply lost content"
    assert lost, "no order lost content: pycrdt fixed hazard 1, update PYCRDT-NOTES.md"


# -- replaying a real journal in any order (I3) ----------------------------------------------------


async def concurrent_agents(
    stack: AsyncExitStack, store: crdtstore.Store, run: str, programs: list[list[Op]]
) -> list[crdtstore.Record]:
    """Open one record per program (closed with ``stack``), run the programs concurrently
    (interleaved at every write), then flush and sync every record."""
    recs = []
    for i in range(len(programs)):
        rec = store.open_record(run=run, agent=f"agent{i}", source=SOURCES[i % len(SOURCES)])
        recs.append(await stack.enter_async_context(rec))

    async def agent(rec: crdtstore.Record, program: list[Op]) -> None:
        for op in program:
            await apply_to_record(rec, op)
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        for rec, program in zip(recs, programs, strict=True):
            tg.start_soon(agent, rec, program)
    for rec in recs:
        await rec.flush()
    for rec in recs:
        await rec.sync()
    return recs


@ASYNC_SETTINGS
@given(
    programs=st.lists(st.lists(operations(), max_size=8), min_size=2, max_size=4),
    data=st.data(),
)
async def test_journal_replay_in_any_order_rebuilds_live_state(
    anyio_backend: str, programs: list[list[Op]], data: st.DataObject
) -> None:
    async with crdtstore.open_store("memory://") as store, AsyncExitStack() as stack:
        recs = await concurrent_agents(stack, store, "r", programs)
        live = recs[0].to_dict()
        for rec in recs:
            assert rec.to_dict() == live, "live records diverged (I1)"
        entries = await store.journal("r", limit=1_000_000)
        assert (await store.replay("r")).to_dict() == live

    updates = [e.update for e in entries]
    order = data.draw(st.permutations(updates), label="order")
    dups = (
        data.draw(st.lists(st.sampled_from(updates), max_size=4), label="dups") if updates else []
    )
    replica = Replica()
    replica.apply_update(tree_merge(order + dups))
    assert replica.to_dict() == live


async def test_apply_update_is_journaled_as_applied() -> None:
    """I3 for raw updates: what ``rec.apply_update`` integrates, the journal replays.

    Fails today: a peer's second update that does not depend on its first (a new map key) is
    integrated and shown at once although the peer's first update is missing (pycrdt 0.14
    integrates around the clock gap), but the journaled delta is the empty update: the other
    records and every resume never see the write.
    """
    peer = Doc()
    registry, facts = peer.get("__crdtstore_collections", type=Map), peer.get("facts", type=Map)
    with peer.transaction():
        registry["facts"] = "map"
        facts["first"] = 1
    first = peer.get_update()
    seen = peer.get_state()
    facts["second"] = 2
    second = peer.get_update(seen)
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a") as a:
            await a.map("facts").set("mine", 0)
            views = []
            for update in (second, first):  # the first one arrives late
                await a.apply_update(update)
                await a.flush()
                async with store.open_record(run="r", agent="b") as b:
                    views.append((a.to_dict(), b.to_dict(), (await store.replay("r")).to_dict()))
    assert views[0][0] == views[0][1] == views[0][2], views[0]
    assert (
        views[1][0] == views[1][1] == views[1][2] == {"facts": {"mine": 0, "first": 1, "second": 2}}
    )


# -- the text diff ---------------------------------------------------------------------------------


def apply_diff(old: str, new: str) -> str:
    """Apply text_diff(old, new) to a pycrdt Text holding ``old``, as TextCollection.edit does."""
    doc = Doc()
    text = doc.get("t", type=Text)
    text.insert(0, old)
    try:
        with doc.transaction():
            apply_text_edits(text, old, text_diff(old, new))
    except BaseException as exc:  # a pycrdt panic is a BaseException
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        raise AssertionError(f"applying text_diff raised {exc!r}") from None
    return str(text)


@given(old=st.text("abc \n", max_size=40), new=st.text("abc \n", max_size=40))
def test_text_diff_applied_gives_new_ascii(old: str, new: str) -> None:
    assert apply_diff(old, new) == new


@given(old=st.text(UNICODE_TEXT, max_size=30), new=st.text(UNICODE_TEXT, max_size=30))
def test_text_diff_applied_gives_new(old: str, new: str) -> None:
    """pycrdt's Text indexes UTF-8 bytes, text_diff emits code-point indices: the edits are
    applied through the byte conversion TextCollection uses."""
    assert apply_diff(old, new) == new


@given(old=st.text("ab", max_size=20), at=st.integers(0, 100), piece=st.text("ab", min_size=1))
def test_text_diff_of_a_pure_insertion_or_deletion_touches_nothing_else(
    old: str, at: int, piece: str
) -> None:
    """Minimality: inserting (deleting) one piece is diffed as inserts (deletes) of exactly
    that many characters; deleting and re-inserting unchanged characters would undo a
    concurrent edit of them."""
    at %= len(old) + 1
    grown = old[:at] + piece + old[at:]
    ops = text_diff(old, grown)
    assert {what for what, _, _ in ops} == {"ins"}, ops
    assert sum(len(arg) for _, _, arg in ops) == len(piece), ops
    ops = text_diff(grown, old)
    assert {what for what, _, _ in ops} == {"del"}, ops
    assert sum(arg for _, _, arg in ops) == len(piece), ops


def _edit_replica(replica: Replica, new: str) -> bytes | None:
    meta = Meta("a", "model", 0.0, None)
    return apply_to_replica(replica, Op("text", "t", "rewrite", (new,)), meta)


# Two halves with disjoint alphabets around a unique separator: whatever the diff does, an
# edit of one half cannot match characters of the other.
HALF_A = st.text("abc \n", max_size=25)
HALF_B = st.text("012.", max_size=25)


@given(a=HALF_A, a2=HALF_A, b=HALF_B, b2=HALF_B)
def test_concurrent_disjoint_text_edits_both_survive_replicas(
    a: str, a2: str, b: str, b2: str
) -> None:
    base = f"{a}|{b}"
    origin = Replica()
    _edit_replica(origin, base)
    one, two = Replica(), Replica()
    for r in (one, two):
        r.apply_update(origin.doc.get_update())
    u1 = _edit_replica(one, f"{a2}|{b}")
    u2 = _edit_replica(two, f"{a}|{b2}")
    for r, u in ((one, u2), (two, u1)):
        if u is not None:
            r.apply_update(u)
    assert str(one.root("t", "text")) == str(two.root("t", "text")) == f"{a2}|{b2}"


async def _edit_concurrently(
    store: crdtstore.Store, base: str, new_a: str, new_b: str
) -> tuple[str, str]:
    async with (
        store.open_record(run="notes", agent="a") as ra,
        store.open_record(run="notes", agent="b") as rb,
    ):
        await ra.text("pad").edit(base)
        await ra.flush()
        await rb.sync()
        assert rb.text("pad").read() == base
        # b's open transaction holds back its tail: a's edit is journaled but b does not
        # see it before making its own edit, from the same base
        async with rb.transaction():
            await ra.text("pad").edit(new_a)
            await ra.flush()
            assert rb.text("pad").read() == base
            await rb.text("pad").edit(new_b)
        await rb.flush()
        await ra.sync()
        await rb.sync()
        return ra.text("pad").read(), rb.text("pad").read()


@FEWER
@given(a=HALF_A, a2=HALF_A, b=HALF_B, b2=HALF_B)
async def test_concurrent_disjoint_text_edits_both_survive_records(
    anyio_backend: str, a: str, a2: str, b: str, b2: str
) -> None:
    async with crdtstore.open_store("memory://") as store:
        got = await _edit_concurrently(store, f"{a}|{b}", f"{a2}|{b}", f"{a}|{b2}")
    assert got == (f"{a2}|{b2}", f"{a2}|{b2}")


async def test_scratchpad_rewrites_by_two_agents_keep_every_fact() -> None:
    """The rewrite-drop failure mode: both agents "rewrite" the whole scratchpad."""
    base = "facts:\n- the cache is cold\n- the db is slow\n- tests are flaky\n"
    # agent a fixes line 1 and adds a fact after it; agent b edits line 3 and appends
    new_a = (
        "facts:\n- the cache is cold (confirmed)\n- p99 is 2s\n- the db is slow\n"
        "- tests are flaky\n"
    )
    new_b = (
        "facts:\n- the cache is cold\n- the db is slow\n- tests are flaky on trio\n- disk is full\n"
    )
    async with crdtstore.open_store("memory://") as store:
        got = await _edit_concurrently(store, base, new_a, new_b)
    merged = (
        "facts:\n- the cache is cold (confirmed)\n- p99 is 2s\n- the db is slow\n"
        "- tests are flaky on trio\n- disk is full\n"
    )
    assert got == (merged, merged)


async def test_edit_non_ascii_text() -> None:
    """Fails today: ``edit`` on text with non-ASCII characters corrupts it or panics."""
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a") as rec:
            text = rec.text("t")
            for target in ["café", "cafés!", "日本", "日本語 🙂", "🙂 é", UNICODE_SAMPLES]:
                try:
                    await text.edit(target)
                except BaseException as exc:  # a pycrdt panic is a BaseException
                    if isinstance(exc, KeyboardInterrupt | SystemExit):
                        raise
                    raise AssertionError(f"edit to {target!r} raised {exc!r}") from None
                assert text.read() == target
            await rec.flush()
        async with store.open_record(run="r", agent="b") as again:
            assert again.text("t").read() == UNICODE_SAMPLES


async def test_one_name_created_concurrently_as_two_kinds_converges() -> None:
    """Two agents concurrently create collection "x", one as a map, one as a list.

    Fails today: the registry keeps one kind (last writer wins), the record that lost keeps
    raising CollectionKindMismatch from ``to_dict()``, and a fresh record reads the map's
    key as a list item, so the three replicas disagree.
    """
    async with crdtstore.open_store("memory://") as store:
        async with (
            store.open_record(run="r", agent="a") as a,
            store.open_record(run="r", agent="b") as b,
        ):
            async with b.transaction():  # holds back b's tail: the writes are concurrent
                await a.map("x").set("k", 1)
                await a.flush()
                await b.list("x").append("item")
            await b.flush()
            await a.sync()
            await b.sync()
            async with store.open_record(run="r", agent="c") as c:
                views: list[Any] = []
                for rec in (a, b, c):
                    try:
                        views.append((rec.collections(), rec.to_dict()))
                    except crdtstore.CrdtStoreError as exc:
                        views.append((rec.agent, repr(exc)))
        assert views[0] == views[1] == views[2], views
