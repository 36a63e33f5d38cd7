"""The lease backends against a sequential model, with a fake clock and fake process deaths.

Hypothesis drives requests (with and without idempotency keys, waiting or not), heartbeats,
releases (also with forged tokens), cancels, time passing short of and past TTLs, holder
processes dying, reaping, restarting the coordinator (reopening the backend on the same
store) and rebooting the machine. After every step:

- the backend's state equals the model's (ranks, states, tokens, deadlines, attachments);
- no two grants overlap; tokens strictly increase per resource; grants per resource follow
  rank order (no holder has an earlier waiter on one of its resources).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import anyio.from_thread
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from crdtstore import InvalidResource, LeaseHeld, LeaseLost, LeaseNotFound
from crdtstore._backends.memory import MemoryLeaseData, MemoryLeases
from crdtstore._backends.sqlite import SQLiteJournal, SQLiteLeases
from crdtstore._leases import FakeClock, LeaseBackend, Proc
from crdtstore._leases._conformance import FakeProbe

T = "t"
FILES = ("f1", "f2", "f3", "f4")


@dataclass
class MReq:
    id: str
    rank: int
    owner: str
    key: tuple[str, int] | None
    resources: frozenset[str]
    state: str
    token: int | None
    ttl: float
    pid: int
    acked: bool
    boot: str
    expires: float


class Model:
    """An independent, deliberately naive implementation of the lease semantics."""

    def __init__(self, clock: FakeClock, probe: FakeProbe) -> None:
        self.clock, self.probe = clock, probe
        self.reqs: list[MReq] = []  # in rank order
        self.next_rank = 1
        self.next_token = 1

    def reap(self) -> None:
        now, boot = self.clock.now(), self.clock.boot_id()
        keep = []
        for r in self.reqs:
            if r.boot != boot:
                if r.state == "granted":
                    continue
                r.boot, r.expires = boot, now + r.ttl
            elif r.expires <= now or (
                r.state == "granted" and r.acked and r.pid in self.probe.dead
            ):
                continue
            keep.append(r)
        self.reqs = keep

    def grant(self) -> None:
        now = self.clock.now()
        changed = True
        while changed:
            changed = False
            for r in self.reqs:
                if r.state != "waiting":
                    continue
                blocked = any(
                    o is not r
                    and o.resources & r.resources
                    and (o.state == "granted" or o.rank < r.rank)
                    for o in self.reqs
                )
                if not blocked:
                    r.state, r.token, r.expires, r.acked = (
                        "granted",
                        self.next_token,
                        now + r.ttl,
                        False,
                    )
                    self.next_token += 1
                    changed = True
                    break

    def find(self, lease_id: str, owner: str) -> MReq:
        for r in self.reqs:
            if r.id == lease_id:
                if r.owner != owner:
                    raise LeaseNotFound(lease_id, "belongs to another owner")
                return r
        raise LeaseNotFound(lease_id)


class LeaseMachine(RuleBasedStateMachine):
    kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.probe = FakeProbe()
        self.model = Model(self.clock, self.probe)
        self.cm = anyio.from_thread.start_blocking_portal()
        self.portal = self.cm.__enter__()
        self.tmp = tempfile.mkdtemp(prefix="leases-model-")
        self.memory = MemoryLeaseData()
        self.backend = self._open()
        self.next_pid = 100
        self.pids = [self._spawn() for _ in range(3)]
        self.last_token: dict[str, tuple[str, int]] = {}
        self.ids: list[str] = []

    def _open(self) -> LeaseBackend:
        b: LeaseBackend
        if self.kind == "memory":
            b = MemoryLeases(self.memory, clock=self.clock, probe=self.probe)
        else:
            journal = SQLiteJournal(f"sqlite:///{self.tmp}/store.db")
            b = SQLiteLeases(journal, clock=self.clock, probe=self.probe)
        self.portal.call(b.open)
        return b

    def _close(self) -> None:
        self.portal.call(self.backend.aclose)
        if isinstance(self.backend, SQLiteLeases):
            self.portal.call(self.backend.journal.aclose)

    def teardown(self) -> None:
        try:
            self._close()
        finally:
            self.cm.__exit__(None, None, None)
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _spawn(self) -> int:
        self.next_pid += 1
        return self.next_pid

    def _proc(self, pid: int) -> Proc:
        return Proc("h", "b", pid, 1)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, Exception | None]:
        try:
            return self.portal.call(lambda: fn(*args, **kwargs)), None
        except (LeaseHeld, LeaseLost, LeaseNotFound, InvalidResource) as exc:
            return None, exc

    # -- rules ------------------------------------------------------------------------------------

    @rule(
        owner=st.sampled_from("ABCD"),
        res=st.sets(st.sampled_from(FILES), min_size=1, max_size=3),
        ttl=st.sampled_from([1.0, 2.0, 5.0]),
        pid_i=st.integers(0, 2),
        key=st.none() | st.tuples(st.sampled_from(["s1", "s2"]), st.integers(1, 2)),
        wait=st.booleans(),
    )
    def request(
        self, owner: str, res: set[str], ttl: float, pid_i: int,
        key: tuple[str, int] | None, wait: bool,
    ) -> None:  # fmt: skip
        pid = self.pids[pid_i]
        resources = tuple(sorted(res))
        got, err = self._call(
            self.backend.request, T, owner, resources, ttl=ttl, key=key,
            proc=self._proc(pid), wait=wait,
        )  # fmt: skip
        m = self.model
        m.reap()
        now = self.clock.now()
        existing = next(
            (r for r in m.reqs if key is not None and (r.owner, r.key) == (owner, key)), None
        )
        if existing is not None and existing.resources != frozenset(res):
            assert isinstance(err, InvalidResource), err
            m.grant()
            return
        if existing is not None:
            r = existing
            r.pid, r.ttl, r.expires = pid, ttl, now + ttl
        else:
            r = MReq("?", m.next_rank, owner, key, frozenset(res), "waiting", None, ttl, pid,
                     False, self.clock.boot_id(), now + ttl)  # fmt: skip
            m.next_rank += 1
            m.reqs.append(r)
        m.grant()
        if r.state == "granted":
            r.acked = True
        elif not wait:
            m.reqs.remove(r)
            # a re-attached request withdrawn here may have blocked later ones: they may now
            # be granted (the engine runs its grant rule after the withdrawal)
            m.grant()
            assert isinstance(err, LeaseHeld), err
            return
        assert err is None, err
        assert got.rank == r.rank and got.state == (
            "granted" if r.state == "granted" else "waiting_on_lock"
        )
        if existing is None:
            r.id = got.lease_id
            self.ids.append(got.lease_id)
        else:
            assert got.lease_id == r.id, "re-attach must return the same request"

    def _pick(self, i: int) -> str:
        return self.ids[i % len(self.ids)] if self.ids else "none"

    @precondition(lambda self: bool(self.ids))
    @rule(i=st.integers(0, 50), owner=st.sampled_from("ABCD"), pid_i=st.integers(0, 2))
    def heartbeat(self, i: int, owner: str, pid_i: int) -> None:
        lease_id, pid = self._pick(i), self.pids[pid_i]
        got, err = self._call(self.backend.heartbeat, T, lease_id, owner, self._proc(pid))
        m = self.model
        m.reap()
        try:
            r = m.find(lease_id, owner)
        except LeaseNotFound:
            m.grant()
            assert isinstance(err, LeaseNotFound), err
            return
        r.pid, r.expires = pid, self.clock.now() + r.ttl
        if r.state == "granted":
            r.acked = True
        m.grant()
        if r.state == "granted":
            r.acked = True
        assert err is None, err
        assert got.token == r.token

    @precondition(lambda self: bool(self.ids))
    @rule(i=st.integers(0, 50), owner=st.sampled_from("ABCD"), forge=st.booleans())
    def release(self, i: int, owner: str, forge: bool) -> None:
        lease_id = self._pick(i)
        m = self.model
        token = next((r.token for r in m.reqs if r.id == lease_id), None)
        if forge and token is not None:
            token += 1
        _, err = self._call(self.backend.release, T, lease_id, owner, token)
        m.reap()
        try:
            r = m.find(lease_id, owner)
            if r.state != "granted" or (token is not None and token != r.token):
                raise LeaseLost("f", "x")
            m.reqs.remove(r)
            expected: type[Exception] | None = None
        except (LeaseNotFound, LeaseLost) as exc:
            expected = type(exc)
        m.grant()
        if expected is None:
            assert err is None, err
        else:
            assert isinstance(err, expected), (err, expected)

    @precondition(lambda self: bool(self.ids))
    @rule(i=st.integers(0, 50), owner=st.sampled_from("ABCD"))
    def cancel(self, i: int, owner: str) -> None:
        lease_id = self._pick(i)
        got, err = self._call(self.backend.cancel, T, lease_id, owner)
        m = self.model
        m.reap()
        present = next((r for r in m.reqs if r.id == lease_id), None)
        if present is not None and present.owner != owner:
            assert isinstance(err, LeaseNotFound), err
        else:
            assert err is None and got is (present is not None), (err, got)
            if present is not None:
                m.reqs.remove(present)
        m.grant()

    @rule(dt=st.sampled_from([0.1, 0.5, 0.99, 1.0, 1.5, 3.0]))
    def advance(self, dt: float) -> None:
        self.clock.advance(dt)

    @rule(pid_i=st.integers(0, 2))
    def kill(self, pid_i: int) -> None:
        self.probe.dead.add(self.pids[pid_i])
        self.pids[pid_i] = self._spawn()

    @rule()
    def reap(self) -> None:
        self.portal.call(self.backend.reap)
        self.model.reap()
        self.model.grant()

    @rule()
    def restart(self) -> None:
        self._close()
        self.backend = self._open()

    @rule()
    def reboot(self) -> None:
        self.clock.reboot()

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def matches_the_model(self) -> None:
        status = self.portal.call(self.backend.status, T)
        now = self.clock.now()
        got = [
            (i.lease_id, i.rank, i.owner, frozenset(i.resources), i.state, i.token, i.ttl,
             i.expires_in, i.pid)
            for i in (*status.holders, *status.waiters)
        ]  # fmt: skip
        want = [
            (r.id, r.rank, r.owner, r.resources,
             "granted" if r.state == "granted" else "waiting_on_lock", r.token, r.ttl,
             r.expires - now, r.pid)
            for r in self.model.reqs
        ]  # fmt: skip
        assert sorted(got, key=lambda x: x[1]) == want
        assert status.next_token == self.model.next_token

    @invariant()
    def exclusive_fifo_and_increasing_tokens(self) -> None:
        status = self.portal.call(self.backend.status, T)
        held: set[str] = set()
        for h in status.holders:
            assert held.isdisjoint(h.resources), "two grants overlap"
            held |= set(h.resources)
            for w in status.waiters:
                assert not (w.rank < h.rank and set(w.resources) & set(h.resources)), (
                    f"holder rank {h.rank} jumped waiter rank {w.rank}"
                )
            assert h.token is not None
            for res in h.resources:
                last_id, last = self.last_token.get(res, ("", 0))
                if h.lease_id != last_id:
                    assert h.token > last, f"token of a new grant on {res} did not increase"
                else:
                    assert h.token == last
                self.last_token[res] = (h.lease_id, h.token)


class SQLiteLeaseMachine(LeaseMachine):
    kind = "sqlite"


TestMemoryLeaseModel = LeaseMachine.TestCase
TestSQLiteLeaseModel = SQLiteLeaseMachine.TestCase
TestMemoryLeaseModel.settings = settings(settings.default, stateful_step_count=40)
TestSQLiteLeaseModel.settings = settings(settings.default, stateful_step_count=40)
