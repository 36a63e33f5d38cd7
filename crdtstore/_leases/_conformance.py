"""Public conformance checks for lease backends (re-exported by ``crdtstore.testing``).

Every lease backend (memory, SQLite, later Redis, or a third party's) must pass
:func:`check_lease_backend`. The factory gets the clock and process probe to use, so that
expiry and dead-holder reaping are checked deterministically::

    async def test_my_leases(tmp_path):
        await check_lease_backend(lambda clock, probe: MyLeases(..., clock=clock, probe=probe))

Failures raise ``AssertionError`` with a message naming the broken rule.
"""

# ruff: noqa: PT017, PT018  (a conformance suite asserts without pytest)

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .._errors import InvalidResource, LeaseHeld, LeaseLost, LeaseNotFound
from ._backend import LeaseBackend
from ._clock import FakeClock, Proc, ProcessProbe
from ._models import LeaseState, LeaseStatus

__all__ = ["FakeProbe", "check_lease_backend", "comparable"]

T = "t"
TTL = 10.0


class FakeProbe:
    """A process probe for tests: a process is dead once its pid is in ``dead``."""

    def __init__(self) -> None:
        self.dead: set[int] = set()

    def is_dead(self, proc: Proc) -> bool:
        return proc.pid in self.dead


def proc(pid: int) -> Proc:
    return Proc("test-host", "test-boot", pid, 1)


async def _req(
    b: LeaseBackend, owner: str, res: tuple[str, ...], *, pid: int = 1, wait: bool = True,
    key: tuple[str, int] | None = None, ttl: float = TTL, tenant: str = T,
) -> LeaseState:  # fmt: skip
    return await b.request(
        tenant, owner, tuple(sorted(res)), ttl=ttl, key=key, proc=proc(pid), wait=wait
    )


async def _holders(b: LeaseBackend, tenant: str = T) -> list[str]:
    return [h.owner for h in (await b.status(tenant)).holders]


async def _waiters(b: LeaseBackend, tenant: str = T) -> list[str]:
    return [w.owner for w in (await b.status(tenant)).waiters]


def comparable(status: LeaseStatus) -> list[dict[str, object]]:
    """A status without its clock readings (ages, remaining TTL), to compare statuses."""
    return [
        i.model_dump(exclude={"age", "held_for", "expires_in"})
        for i in (*status.holders, *status.waiters)
    ]


Make = Callable[[FakeClock, ProcessProbe], LeaseBackend]
Check = Callable[[LeaseBackend, FakeClock, FakeProbe], Awaitable[None]]


async def check_lease_backend(make: Make) -> None:
    """Run every conformance rule against fresh, empty backends from ``make(clock, probe)``.

    Raises:
        AssertionError: a rule is broken.
    """
    for check in _CHECKS:
        clock, probe = FakeClock(), FakeProbe()
        backend = make(clock, probe)
        await backend.open()
        try:
            await check(backend, clock, probe)
        except AssertionError as exc:
            raise AssertionError(f"{check.__name__}: {exc}") from exc
        finally:
            await backend.aclose()
            await backend.aclose()  # aclose is idempotent


async def _free_resources_are_granted(b: LeaseBackend, clock: FakeClock, probe: FakeProbe) -> None:
    a = await _req(b, "A", ("f1", "f2"))
    assert a.granted and a.token is not None and a.token > 0, a
    d = await _req(b, "D", ("f3",))
    assert d.granted and d.token is not None and d.token > a.token, "tokens must increase"
    assert d.rank > a.rank, "ranks must increase"
    st = await b.status(T)
    assert [(h.owner, h.resources) for h in st.holders] == [("A", ("f1", "f2")), ("D", ("f3",))]
    assert st.waiters == ()


async def _fifo_hand_off(b: LeaseBackend, clock: FakeClock, probe: FakeProbe) -> None:
    a = await _req(b, "A", ("f1",))
    bb = await _req(b, "B", ("f1", "f2"))
    c = await _req(b, "C", ("f2",))
    d = await _req(b, "D", ("f3",))
    assert a.granted and not bb.granted and not c.granted, "C must queue behind B's claim on f2"
    assert d.granted, "an unrelated request must not wait"
    assert bb.state == "waiting_on_lock" and bb.rank < c.rank
    st = await b.status(T)
    assert [w.owner for w in st.waiters] == ["B", "C"]
    assert st.waiters[1].blocked_by == (bb.rank,), st.waiters[1]
    await b.release(T, a.lease_id, "A", a.token)
    assert await _holders(b) == ["B", "D"], "release must hand off to the next waiter at once"
    b2 = await b.heartbeat(T, bb.lease_id, "B", proc(1))
    assert b2.granted and b2.rank == bb.rank and b2.token is not None
    assert a.token is not None and d.token is not None and b2.token > d.token > a.token
    await b.release(T, bb.lease_id, "B", b2.token)
    c2 = await b.heartbeat(T, c.lease_id, "C", proc(1))
    assert c2.granted and c2.token is not None and c2.token > b2.token
    assert await _waiters(b) == []


async def _no_wait_raises_held(b: LeaseBackend, clock: FakeClock, probe: FakeProbe) -> None:
    a = await _req(b, "A", ("f1",))
    try:
        await _req(b, "B", ("f1", "f2"), wait=False)
    except LeaseHeld as exc:
        assert exc.resource == "f1" and exc.holder == "A" and exc.token == a.token, exc
    else:
        raise AssertionError("wait=False on a held resource must raise LeaseHeld")
    assert await _waiters(b) == [], "a refused wait=False request must not stay queued"
    assert (await _req(b, "B", ("f2",), wait=False)).granted


async def _key_keeps_the_rank(b: LeaseBackend, clock: FakeClock, probe: FakeProbe) -> None:
    await _req(b, "A", ("f1",))
    w = await _req(b, "B", ("f1",), key=("step", 1), pid=2)
    await _req(b, "C", ("f1",))
    again = await _req(b, "B", ("f1",), key=("step", 1), pid=3)
    assert (again.lease_id, again.rank) == (w.lease_id, w.rank), "a re-sent request keeps its rank"
    assert await _waiters(b) == ["B", "C"]
    assert (await b.status(T)).waiters[0].pid == 3, "re-attach moves the request to the new pid"
    other = await _req(b, "B", ("f1",), key=("step", 2))
    assert other.rank > w.rank, "another attempt is another request"
    try:
        await _req(b, "B", ("f9",), key=("step", 1))
    except InvalidResource:
        pass
    else:
        raise AssertionError("one key for other resources must raise InvalidResource")


async def _refusals_change_nothing(b: LeaseBackend, clock: FakeClock, probe: FakeProbe) -> None:
    a = await _req(b, "A", ("f1",))
    w = await _req(b, "B", ("f1",))
    assert a.token is not None
    tok: int = a.token
    before = await b.status(T)
    attempts: list[tuple[Callable[[], Awaitable[object]], type[Exception]]] = [
        (lambda: b.release(T, a.lease_id, "B", tok), LeaseNotFound),
        (lambda: b.release(T, a.lease_id, "A", tok + 1000), LeaseLost),
        (lambda: b.release(T, w.lease_id, "B", None), LeaseLost),
        (lambda: b.release(T, "forged-id", "A", tok), LeaseNotFound),
        (lambda: b.cancel(T, a.lease_id, "B"), LeaseNotFound),
        (lambda: b.heartbeat(T, a.lease_id, "B", proc(1)), LeaseNotFound),
        (lambda: b.release("other-tenant", a.lease_id, "A", tok), LeaseNotFound),
        (lambda: b.check(T, a.lease_id, "f1", tok + 1), LeaseLost),
        (lambda: b.check(T, a.lease_id, "f2", tok), LeaseLost),
        (lambda: b.check(T, w.lease_id, "f1", tok), LeaseLost),
    ]
    for attempt, error in attempts:
        try:
            await attempt()
        except error:
            pass
        else:
            raise AssertionError(f"expected {error.__name__}")
        after = await b.status(T)
        assert comparable(after) == comparable(before), (
            f"a refused call changed the state: {after} != {before}"
        )
    await b.check(T, a.lease_id, "f1", a.token)


async def _cancel_withdraws(b: LeaseBackend, clock: FakeClock, probe: FakeProbe) -> None:
    a = await _req(b, "A", ("f1",))
    w = await _req(b, "B", ("f1", "f2"))
    c = await _req(b, "C", ("f2",))
    assert not c.granted
    assert await b.cancel(T, w.lease_id, "B") is True
    assert await b.cancel(T, w.lease_id, "B") is False, "cancel is idempotent"
    assert await _holders(b) == ["A", "C"], "cancelling B must unblock C"
    assert await b.cancel(T, a.lease_id, "A") is True, "a grant can be withdrawn too"


async def _fencing(b: LeaseBackend, clock: FakeClock, probe: FakeProbe) -> None:
    a = await _req(b, "A", ("f1", "f2"))
    assert a.token is not None
    await b.check(T, a.lease_id, "f1", a.token)
    await b.check(T, a.lease_id, "f2", a.token)
    await b.release(T, a.lease_id, "A", a.token)
    n = await _req(b, "B", ("f1",))
    for lease_id, token in [(a.lease_id, a.token), (n.lease_id, a.token)]:
        try:
            await b.check(T, lease_id, "f1", token)
        except LeaseLost:
            pass
        else:
            raise AssertionError("a released lease or a superseded token must fail the fence")


async def _ttl_expiry(b: LeaseBackend, clock: FakeClock, probe: FakeProbe) -> None:
    a = await _req(b, "A", ("f1",), ttl=1.0)
    w = await _req(b, "B", ("f1",), ttl=5.0)
    clock.advance(0.9)
    assert (await b.heartbeat(T, a.lease_id, "A", proc(1))).granted, "renewed before expiry"
    clock.advance(0.9)
    assert await b.reap() == 0 and await _holders(b) == ["A"], "a renewed grant must live"
    assert a.token is not None
    await b.check(T, a.lease_id, "f1", a.token)
    clock.advance(0.2)  # 1.1 s since the heartbeat
    try:
        await b.check(T, a.lease_id, "f1", a.token)
    except LeaseLost:
        pass
    else:
        raise AssertionError("the fence must refuse an expired grant even before it is reaped")
    assert await b.reap() == 1
    assert await _holders(b) == ["B"], "reaping an expired grant hands off"
    try:
        await b.heartbeat(T, a.lease_id, "A", proc(1))
    except LeaseNotFound:
        pass
    else:
        raise AssertionError("a reaped grant must not be renewable")
    # the hand-off happened while B did not look: B has one TTL from the hand-off to notice
    clock.advance(4.9)
    assert (await b.heartbeat(T, w.lease_id, "B", proc(1))).granted
    clock.advance(5.1)
    assert await b.reap() == 1 and await _holders(b) == []


async def _waiters_expire_too(b: LeaseBackend, clock: FakeClock, probe: FakeProbe) -> None:
    await _req(b, "A", ("f1",), ttl=100.0)
    await _req(b, "B", ("f1", "f2"), ttl=1.0)
    c = await _req(b, "C", ("f2",), ttl=100.0)
    assert not c.granted
    clock.advance(1.5)
    await b.reap()
    assert await _holders(b) == ["A", "C"], "an abandoned waiter must not block the queue forever"


async def _dead_holders_are_reaped(b: LeaseBackend, clock: FakeClock, probe: FakeProbe) -> None:
    await _req(b, "A", ("f1",), pid=10)
    w = await _req(b, "B", ("f1",), pid=11)
    probe.dead.update({10, 11})
    assert await b.reap() == 1, "a dead holder is reaped at once (but not its dead waiter)"
    st = await b.status(T)
    assert [h.owner for h in st.holders] == ["B"], "the waiter of a dead process keeps its place"
    assert await b.reap() == 0, "a grant its process has not seen yet is reaped by TTL only"
    back = await _req(b, "B", ("f1",), pid=12)  # B's process restarted (no key: by id)
    assert back.lease_id != w.lease_id
    got = await b.heartbeat(T, w.lease_id, "B", proc(12))
    assert got.granted
    probe.dead.add(12)
    await b.reap()
    assert await _holders(b) == ["B"], "B's second request gets f1 after B's first one died"


async def _tenants_are_isolated(b: LeaseBackend, clock: FakeClock, probe: FakeProbe) -> None:
    a = await _req(b, "A", ("f1",))
    other = await _req(b, "A", ("f1",), tenant="u")
    assert a.granted and other.granted, "tenants do not share resources"
    assert [h.lease_id for h in (await b.status("u")).holders] == [other.lease_id]
    try:
        await b.check("u", a.lease_id, "f1", a.token or 0)
    except LeaseLost:
        pass
    else:
        raise AssertionError("a lease of another tenant must not pass the fence")


async def _reboot(b: LeaseBackend, clock: FakeClock, probe: FakeProbe) -> None:
    a = await _req(b, "A", ("f1",))
    w = await _req(b, "B", ("f1",))
    assert a.token is not None
    clock.reboot()
    try:
        await b.check(T, a.lease_id, "f1", a.token)
    except LeaseLost:
        pass
    else:
        raise AssertionError("a grant from another boot must fail the fence")
    await b.reap()
    st = await b.status(T)
    assert [(h.owner, h.rank) for h in st.holders] == [("B", w.rank)], "waiters survive a reboot"
    n = await _req(b, "C", ("f2",))
    assert n.token is not None and n.token > a.token, "tokens keep increasing after a reboot"


async def _at_once_agrees(b: LeaseBackend, clock: FakeClock, probe: FakeProbe) -> None:
    """request_now and release_now (which a backend may decline: None, False) decide as
    request and release do, and a refusal of theirs changes nothing."""
    seen: list[int] = []
    for _ in range(3):  # the first may find nothing cached yet
        got = b.request_now(T, "A", ("f1",), TTL, proc(1))
        if got is None:
            s = await _req(b, "A", ("f1",))
            assert s.token is not None
            got = (s.lease_id, s.rank, s.token, s.expires_in)
        lease_id, rank, token, _ = got
        assert not seen or token > seen[-1], "tokens keep increasing through request_now"
        seen.append(token)
        (h,) = (await b.status(T)).holders
        assert (h.lease_id, h.rank, h.token, h.owner) == (lease_id, rank, token, "A")
        assert b.request_now(T, "B", ("f1",), TTL, proc(2)) is None, "granted twice at once"
        before = await b.status(T)
        for forged in [(T, lease_id, "B", token), (T, lease_id, "A", token + 1), ("u", lease_id,
                       "A", token), (T, "forged-id", "A", token)]:  # fmt: skip
            assert not b.release_now(*forged), f"release_now took {forged}"
            assert comparable(await b.status(T)) == comparable(before)
        if not b.release_now(T, lease_id, "A", token):
            await b.release(T, lease_id, "A", token)
        assert await _holders(b) == [], "released at once"
    w = await _req(b, "B", ("f1",))
    a = await _req(b, "A", ("f1",))
    assert a.token is None and b.request_now(T, "C", ("f1",), TTL, proc(3)) is None, "queued"
    if not b.release_now(T, w.lease_id, "B", w.token):
        await b.release(T, w.lease_id, "B", w.token)
    assert await _holders(b) == ["A"], "a release with a waiter hands off"


_CHECKS: list[Check] = [
    _free_resources_are_granted,
    _fifo_hand_off,
    _no_wait_raises_held,
    _key_keeps_the_rank,
    _refusals_change_nothing,
    _cancel_withdraws,
    _fencing,
    _ttl_expiry,
    _waiters_expire_too,
    _dead_holders_are_reaped,
    _tenants_are_isolated,
    _reboot,
    _at_once_agrees,
]
