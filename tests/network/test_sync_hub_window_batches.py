"""The journal window's batches (``LoopCommit``), on a simulated clock and event loop.

A batch waits one ``journal_window`` from its first entry (not from the last commit), so a
steady stream of updates shares fewer commits; an entry queued once the batch is nearly due,
when the last commit is a window old, makes it ripe, and the caller's ``ride()`` (the hub's,
once it relayed the update) commits it at once, in that arrival's iteration (no callback, no
wake-up of its own for the timer); without a ride the timer commits it. Whatever the arrival
times, riding or not (hypothesis): every entry is committed once, in order, none waits
longer than one window, and commits are at least a window apart (nobody waits for a commit
here: no flush, reader or other process).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crdtstore.record import _loop_commit
from crdtstore.record._loop_commit import LoopCommit


class Loop:
    """A simulated event loop: ``call_soon`` runs at the end of the current iteration,
    ``call_later`` at its time; the clock moves only between arrivals and timers."""

    def __init__(self) -> None:
        self.now = 0.0
        self.soon: list[Callable[[], None]] = []
        self.timers: list[tuple[float, int, Any]] = []
        self._n = 0
        self.wakeups = 0  # iterations run for a timer alone

    def call_soon(self, f: Callable[[], None]) -> None:
        self.soon.append(f)

    def call_later(self, delay: float, f: Callable[[], None]) -> Any:
        handle = SimpleNamespace(f=f, cancelled=False)
        handle.cancel = lambda: setattr(handle, "cancelled", True)
        self._n += 1
        heapq.heappush(self.timers, (self.now + delay, self._n, handle))
        return handle

    def run_soon(self) -> None:
        while self.soon:
            batch, self.soon = self.soon, []
            for f in batch:
                f()

    def advance(self, to: float) -> None:
        """Run the timers due up to ``to`` (each in an iteration of its own), then move there."""
        while self.timers and self.timers[0][0] <= to:
            when, _, handle = heapq.heappop(self.timers)
            if handle.cancelled:
                continue
            self.now = max(self.now, when)
            self.wakeups += 1
            handle.f()
            self.run_soon()
        self.now = max(self.now, to)


class FakeRecord:
    """What :class:`LoopCommit` reads of a record: its pending entries, and what it calls."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self._pending: list[int] = []
        self._fast: dict[int, Any] = {}
        self._state = "open"
        self._failure = None
        self._commit_lock = SimpleNamespace(locked=lambda: False)
        self._committer_idle = True
        self._pending_event = SimpleNamespace(set=lambda: None)
        self._commit_observer = None
        self._store = SimpleNamespace(notifier=SimpleNamespace(others_listening=lambda: False))
        self.tenant = "t"
        self.run = "r"
        self._jrun = "r"
        self.queued_at: dict[int, float] = {}
        self.committed: list[tuple[float, list[int]]] = []

    def _entries(self, batch: Sequence[int]) -> list[int]:
        return list(batch)

    def _mark_committed(self, batch: Sequence[int], seqs: Sequence[int]) -> None:
        del self._pending[: len(batch)]
        self.committed.append((self.loop.now, list(batch)))


def simulate(
    monkeypatch: pytest.MonkeyPatch, window: float, arrivals: Sequence[float], ride: bool = True
) -> tuple[FakeRecord, Loop]:
    loop = Loop()
    monkeypatch.setattr(
        _loop_commit, "time", SimpleNamespace(monotonic=lambda: loop.now, perf_counter=lambda: 0)
    )
    rec = FakeRecord(loop)
    commit = LoopCommit(rec, lambda t, r, e: list(e), loop.call_soon, loop.call_later, window)  # type: ignore[arg-type]
    for i, at in enumerate(arrivals):
        loop.advance(at)
        rec._pending.append(i)
        rec.queued_at[i] = loop.now
        commit.queued()
        if ride and commit.ripe:  # (as the hub, once it relayed the update)
            commits = len(rec.committed)
            commit.ride()
            assert len(rec.committed) == commits + 1 and not commit.ripe
        loop.run_soon()
    loop.advance(math.inf)
    return rec, loop


def test_a_batch_waits_one_window_from_its_first_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    # the first entry is committed at once (quiet); the next, 0.9 window later, waits a whole
    # window (not until one window after the last commit, at 1.0): it and the one at 1.0
    # share the commit at 1.9
    rec, loop = simulate(monkeypatch, 1.0, [0.0, 0.9, 1.0])
    assert rec.committed == [(0.0, [0]), (1.9, [1, 2])]
    assert loop.wakeups == 1  # (the timer: nothing arrived to ride on)


def test_a_nearly_due_batch_commits_with_the_next_arrival(monkeypatch: pytest.MonkeyPatch) -> None:
    # arrivals every 0.4 window: each batch commits at the arrival that finds it 0.8 window
    # old (and the last commit 1.2 windows old), three entries a commit, no timer wake-up
    rec, loop = simulate(monkeypatch, 1.0, [i * 0.4 for i in range(10)])
    assert [batch for _, batch in rec.committed] == [[0], [1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [at for at, _ in rec.committed] == pytest.approx([0.0, 1.2, 2.4, 3.6])
    assert loop.wakeups == 0


def test_a_ripe_batch_nobody_rides_is_committed_by_its_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the same arrivals, no ride: each batch waits its whole window (from its first entry)
    rec, loop = simulate(monkeypatch, 1.0, [i * 0.4 for i in range(10)], ride=False)
    assert [batch for _, batch in rec.committed] == [[0], [1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [at for at, _ in rec.committed] == pytest.approx([0.0, 1.4, 2.6, 3.8])
    assert loop.wakeups == 3


def test_an_arrival_in_the_timer_s_wake_up_shares_its_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # asyncio runs a timer that is due before the task woken by a frame in the same wake-up:
    # the timer's commit waits for that task (call_soon), so the frame's entry is in it
    loop = Loop()
    monkeypatch.setattr(
        _loop_commit, "time", SimpleNamespace(monotonic=lambda: loop.now, perf_counter=lambda: 0)
    )
    rec = FakeRecord(loop)
    commit = LoopCommit(rec, lambda t, r, e: list(e), loop.call_soon, loop.call_later, 1.0)  # type: ignore[arg-type]

    def arrive(i: int) -> None:
        rec._pending.append(i)
        commit.queued()

    arrive(0)
    loop.run_soon()  # quiet: at once
    loop.now = 0.5
    arrive(1)  # deferred: its timer at 1.5
    loop.now = 1.5
    when, _, handle = heapq.heappop(loop.timers)
    assert when == 1.5
    handle.f()  # the timer, then (same wake-up) the task receiving the next frame
    arrive(2)
    loop.run_soon()
    assert rec.committed == [(0.0, [0]), (1.5, [1, 2])]
    assert not loop.timers


@settings(max_examples=200, deadline=None)
@given(
    window=st.sampled_from([0.02, 1.0]),
    gaps=st.lists(st.floats(min_value=0.0, max_value=3.0), min_size=1, max_size=40),
    ride=st.booleans(),
)
def test_no_entry_waits_longer_than_a_window_and_commits_are_a_window_apart(
    window: float, gaps: list[float], ride: bool
) -> None:
    arrivals: list[float] = []
    t = 0.0
    for gap in gaps:
        t += gap * window
        arrivals.append(t)
    with pytest.MonkeyPatch.context() as m:
        rec, _ = simulate(m, window, arrivals, ride)
    order = [i for _, batch in rec.committed for i in batch]
    assert order == list(range(len(arrivals)))  # every entry once, in order
    for at, batch in rec.committed:
        for i in batch:
            assert at - rec.queued_at[i] <= window * (1 + 1e-9)
    times = [at for at, _ in rec.committed]
    for before, after in itertools.pairwise(times):
        assert after - before >= window * (1 - 1e-9)


def test_listeners_hear_each_commit_before_the_record_marks_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = Loop()
    monkeypatch.setattr(
        _loop_commit, "time", SimpleNamespace(monotonic=lambda: loop.now, perf_counter=lambda: 0)
    )
    rec = FakeRecord(loop)
    commit = LoopCommit(
        rec, lambda t, r, e: [10 + x for x in e], loop.call_soon, loop.call_later, 1.0
    )  # type: ignore[arg-type]
    heard: list[tuple[str, str, list[int], list[int], int]] = []

    def listener(t: str, r: str, entries: Sequence[Any], seqs: list[int]) -> None:
        heard.append((t, r, list(entries), seqs, len(rec.committed)))

    def broken(t: str, r: str, entries: Sequence[Any], seqs: list[int]) -> None:
        raise RuntimeError("a listener's bug")

    remove = commit.on_committed(listener)
    commit.on_committed(broken)  # logged; the commit stands and later listeners still hear
    rec._pending.append(0)
    commit.queued()
    loop.run_soon()
    assert heard == [("t", "r", [0], [10], 0)]  # (before _mark_committed)
    assert rec.committed == [(0.0, [0])]
    remove()
    remove()  # (twice is fine)
    loop.advance(5.0)
    rec._pending.append(1)
    commit.queued()
    loop.run_soon()
    loop.advance(math.inf)
    assert len(heard) == 1 and rec.committed[-1][1] == [1]
