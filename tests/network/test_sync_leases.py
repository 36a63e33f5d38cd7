"""Leases through the hub: the ``lease.*`` ops (:mod:`sync._ops_leases`) and their client,
:class:`sync._lease_rpc.RemoteLeases`.

Over real WebSockets (a ``Hub`` on 127.0.0.1, port 0, on a ``sqlite://`` store) a raw client
(:class:`sync.ClientSession` over a ``websockets`` connection) carries ``RemoteLeases``'
requests. The hub runs on websockets' asyncio implementation, so those tests run on asyncio
only; the op layer and ``RemoteLeases`` without a socket (requests handed to the hub's
``dispatch`` in process) run on both anyio backends.

Nothing sleeps to wait: every wait is on a condition under an ``anyio.fail_after`` deadline.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import math
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest
from hypothesis import settings
from pycrdt import Doc
from pydantic import JsonValue
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from crdtstore import (
    BackendError,
    InvalidResource,
    InvalidValue,
    LeaseHeld,
    LeaseLost,
    LeaseNotFound,
    LeaseTimeout,
    ReadOnlyAccess,
    Record,
    Store,
    StoreClosed,
    open_store,
)
from crdtstore._backends.memory import MemoryLeases
from crdtstore._leases import (
    FakeClock,
    LeaseBackend,
    Leases,
    LeaseStatus,
    Proc,
    this_proc,
)
from crdtstore._leases._conformance import FakeProbe, comparable
from crdtstore._notify import Notifier
from crdtstore.testing import check_lease_backend
from sync import (
    ClientSession,
    ErrorInfo,
    Forbidden,
    Hub,
    HubLimits,
    PycrdtDocument,
    Request,
    Response,
    TokenClaims,
    decode,
    encode,
    mint,
)
from sync._lease_rpc import RemoteLeases, error_from_info, result_or_raise
from sync._ops import OPS, OpContext, dispatch
from sync._ops_leases import LEASE_OPS
from tests._wait import until
from tests.leases.test_leases_model import LeaseMachine

pytestmark = pytest.mark.anyio

SECRET = b"lease-test-secret-0123456789"
TENANT = "t1"
RUN = "r1"
DEADLINE = 10.0
PROC = this_proc()


def token(agent: str, *, tenant: str = TENANT, run: str = RUN, mode: str = "rw") -> str:
    claims = TokenClaims.model_validate(
        {
            "tenant": tenant,
            "run": run,
            "agent": agent,
            "mode": mode,
            "exp": int(time.time() + 3600),
        }
    )
    return mint(SECRET, claims)


# -- a raw client ---------------------------------------------------------------------------


class Client:
    """One connection: a ClientSession over a websockets client, answering ``call``."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.session = ClientSession(PycrdtDocument(Doc()))
        self.responses: dict[int | str, Response] = {}
        self.closed = False
        self._changed = anyio.Event()

    def _fire(self) -> None:
        old, self._changed = self._changed, anyio.Event()
        old.set()

    async def reader(self) -> None:
        try:
            async for frame in self.ws:
                assert isinstance(frame, bytes)
                received = self.session.receive(frame)
                for reply in received.reply_frames():
                    await self.ws.send(reply)
                if isinstance(received.message, Response):
                    self.responses[received.message.id] = received.message
                self._fire()
        except ConnectionClosed:
            pass
        finally:
            self.closed = True
            self._fire()

    async def response(self, op: str, params: dict[str, Any]) -> Response:
        request, frame = self.session.request(op, params)
        await self.ws.send(frame)
        with anyio.fail_after(DEADLINE):
            while request.id not in self.responses:
                if self.closed:
                    raise BackendError("ws", "connection closed")
                await self._changed.wait()
        return self.responses.pop(request.id)

    async def call(self, op: str, params: dict[str, JsonValue]) -> JsonValue:
        """The ``call`` of RemoteLeases: the result, or the hub's error raised."""
        return result_or_raise(await self.response(op, params))

    def leases(self) -> RemoteLeases:
        return RemoteLeases(self.call)


class HubUnderTest:
    def __init__(self, hub: Hub, port: int, url: str) -> None:
        self.hub = hub
        self.port = port
        self.store_url = url

    @contextlib.asynccontextmanager
    async def client(
        self, agent: str, *, tenant: str = TENANT, run: str = RUN, mode: str = "rw"
    ) -> AsyncIterator[Client]:
        tok = token(agent, tenant=tenant, run=run, mode=mode)
        url = f"ws://127.0.0.1:{self.port}/{tenant}/{run}?token={tok}"
        async with connect(url, max_size=None) as ws:
            client = Client(ws)
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.reader)
                for frame in client.session.start():
                    await ws.send(frame)
                yield client
                tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def running_hub(db: Path) -> AsyncIterator[HubUnderTest]:
    url = f"sqlite:///{db}"
    hub = Hub(url, SECRET)
    async with anyio.create_task_group() as tg:
        port = await tg.start(hub.serve, "127.0.0.1", 0)
        yield HubUnderTest(hub, port, url)
        tg.cancel_scope.cancel()


async def acquire(
    b: LeaseBackend,
    resources: tuple[str, ...],
    *,
    owner: str = "ignored",
    ttl: float = 30.0,
    wait: bool = False,
    key: tuple[str, int] | None = None,
    tenant: str = TENANT,
) -> Any:
    return await b.request(tenant, owner, resources, ttl=ttl, key=key, proc=PROC, wait=wait)


async def queue_behind(tg: Any, waiter: Any, leases: Any) -> anyio.Event:
    """Start ``waiter.acquire()`` in ``tg`` and return once ``leases`` shows one waiter; the
    event returned is set when the waiter holds the lease."""
    got = anyio.Event()

    async def wait_for_it() -> None:
        await waiter.acquire()
        got.set()

    tg.start_soon(wait_for_it)

    async def queued() -> bool:
        return len((await leases.status()).waiters) == 1

    await until(queued, "the waiter queues")
    return got


# -- over real WebSockets (asyncio: the hub is websockets' asyncio server) --------------------


class TestThroughTheHub:
    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    async def test_acquire_renew_release_as_the_token_s_agent(self, tmp_path: Path) -> None:
        async with running_hub(tmp_path / "s.db") as hub, hub.client("alice") as alice:
            leases = alice.leases()
            st = await acquire(leases, ("src/a.py", "src/b.py"), owner="mallory", ttl=5.0)
            assert st.granted and st.token is not None and st.token > 0
            assert st.owner == "alice", "the owner is the token's agent, not the caller's say"
            assert st.watch_pids == ()
            status = await leases.status(TENANT)
            assert [(h.owner, h.resources, h.pid) for h in status.holders] == [
                ("alice", ("src/a.py", "src/b.py"), PROC.pid)
            ]
            host = status.holders[0].host
            assert host is not None and host.startswith("ws:127.0.0.1:"), host
            await leases.check(TENANT, st.lease_id, "src/a.py", st.token)

            again = await leases.heartbeat(TENANT, st.lease_id, "whoever", PROC)
            assert again.granted and again.token == st.token and again.expires_in > 4.0

            await leases.release(TENANT, st.lease_id, "whoever", st.token)
            assert (await leases.status(TENANT)).holders == ()
            with pytest.raises(LeaseLost) as lost:
                await leases.check(TENANT, st.lease_id, "src/a.py", st.token)
            assert lost.value.code == "LEASE_LOST" and lost.value.token == st.token
            with pytest.raises(LeaseNotFound):
                await leases.heartbeat(TENANT, st.lease_id, "alice", PROC)
            assert await leases.cancel(TENANT, st.lease_id, "alice") is False
            assert await leases.reap() == 0

    async def test_a_second_agent_is_refused_then_served_in_order(self, tmp_path: Path) -> None:
        async with (
            running_hub(tmp_path / "s.db") as hub,
            hub.client("alice") as alice,
            hub.client("bob") as bob,
        ):
            a, b = alice.leases(), bob.leases()
            held = await acquire(a, ("src/a.py",))
            with pytest.raises(LeaseHeld) as refused:
                await acquire(b, ("./src/a.py", "src/c.py"))
            exc = refused.value
            assert (exc.code, exc.resource, exc.holder, exc.token) == (
                "LEASE_HELD",
                "src/a.py",
                "alice",
                held.token,
            )
            assert (await b.status(TENANT)).waiters == (), "a refused request is withdrawn"

            waiting = await acquire(b, ("src/a.py",), wait=True)
            assert waiting.state == "waiting_on_lock" and waiting.wake_in is not None
            await a.release(TENANT, held.lease_id, "alice", held.token)
            # the release handed the lease to bob in the same transaction
            got = await b.heartbeat(TENANT, waiting.lease_id, "bob", PROC)
            assert got.granted and got.rank == waiting.rank
            assert got.token is not None and held.token is not None and got.token > held.token

    async def test_an_agent_cannot_touch_another_agent_s_lease(self, tmp_path: Path) -> None:
        async with (
            running_hub(tmp_path / "s.db") as hub,
            hub.client("alice") as alice,
            hub.client("bob") as bob,
        ):
            a, b = alice.leases(), bob.leases()
            held = await acquire(a, ("src/a.py",))
            before = comparable(await a.status(TENANT))
            tok = held.token
            # bob names alice as the owner: the hub does not listen
            for attempt in (
                lambda: b.release(TENANT, held.lease_id, "alice", tok),
                lambda: b.cancel(TENANT, held.lease_id, "alice"),
                lambda: b.heartbeat(TENANT, held.lease_id, "alice", PROC),
            ):
                with pytest.raises(LeaseNotFound) as refused:
                    await attempt()
                assert refused.value.code == "LEASE_NOT_FOUND"
                assert comparable(await a.status(TENANT)) == before
            # another agent can read the status and run the fencing check (no ownership)
            await b.check(TENANT, held.lease_id, "src/a.py", tok)
            # the same agent name on another connection is the same owner
            async with hub.client("alice") as alice2:
                await alice2.leases().release(TENANT, held.lease_id, "x", tok)
            assert (await a.status(TENANT)).holders == ()

    async def test_a_read_only_token_cannot_take_or_drop_leases(self, tmp_path: Path) -> None:
        async with (
            running_hub(tmp_path / "s.db") as hub,
            hub.client("alice") as alice,
            hub.client("reader", mode="ro") as reader,
        ):
            a, r = alice.leases(), reader.leases()
            held = await acquire(a, ("src/a.py",))
            before = comparable(await r.status(TENANT))  # status is open to read-only tokens
            for attempt in (
                lambda: acquire(r, ("src/z.py",)),
                lambda: r.heartbeat(TENANT, held.lease_id, "alice", PROC),
                lambda: r.release(TENANT, held.lease_id, "alice", held.token),
                lambda: r.cancel(TENANT, held.lease_id, "alice"),
            ):
                with pytest.raises(ReadOnlyAccess) as refused:
                    await attempt()
                assert refused.value.code == "READ_ONLY"
            assert comparable(await r.status(TENANT)) == before
            await r.check(TENANT, held.lease_id, "src/a.py", held.token)
            assert await r.reap() == 0

    async def test_hub_and_embedded_store_exclude_each_other(self, tmp_path: Path) -> None:
        async with (
            running_hub(tmp_path / "s.db") as hub,
            hub.client("alice") as alice,
            open_store(hub.store_url, tenant=TENANT) as store,
        ):
            remote = alice.leases()
            held = await acquire(remote, ("src/a.py",))
            # the embedded store sees the hub's grant, and cannot take the file
            status = await store.leases.status()
            assert [(h.owner, h.lease_id) for h in status.holders] == [("alice", held.lease_id)]
            with pytest.raises(LeaseHeld) as refused:
                async with store.lease(["src/a.py"], owner="local", wait=False):
                    pass
            assert refused.value.holder == "alice"
            await store.leases.check(held.lease_id, "src/a.py", held.token)

            # an embedded waiter is handed the lease when the remote holder releases
            async with anyio.create_task_group() as tg:
                got = anyio.Event()
                tokens: list[int] = []

                async def embedded_waiter() -> None:
                    async with store.lease(["src/a.py"], owner="local", ttl=5.0) as lease:
                        tokens.append(lease.token)
                        got.set()
                        await release_it.wait()

                release_it = anyio.Event()
                tg.start_soon(embedded_waiter)

                async def queued() -> bool:
                    return len((await remote.status(TENANT)).waiters) == 1

                await until(queued, "the embedded request is queued")
                await remote.release(TENANT, held.lease_id, "alice", held.token)
                with anyio.fail_after(DEADLINE):
                    await got.wait()
                assert held.token is not None and tokens[0] > held.token

                # ... and the other way round: the hub refuses while the embedded one holds
                with pytest.raises(LeaseHeld) as remote_refused:
                    await acquire(remote, ("src/a.py",))
                assert remote_refused.value.holder == "local"
                release_it.set()
            after = await acquire(remote, ("src/a.py",))
            assert after.granted and after.token is not None and after.token > tokens[0]

    async def test_a_closed_connection_s_lease_lapses_by_its_ttl(self, tmp_path: Path) -> None:
        ttl = 0.6
        async with running_hub(tmp_path / "s.db") as hub, hub.client("bob") as bob:
            b = bob.leases()
            async with hub.client("alice") as alice:
                held = await acquire(alice.leases(), ("src/a.py",), ttl=ttl)
                renewed_at = time.monotonic()
            # alice's connection is gone: her grant is neither released nor reaped at once
            status = await b.status(TENANT)
            assert [h.owner for h in status.holders] == ["alice"]
            assert await b.reap() == 0
            with pytest.raises(LeaseHeld):
                await acquire(b, ("src/a.py",))
            waiting = await acquire(b, ("src/a.py",), wait=True, ttl=5.0)
            with anyio.fail_after(DEADLINE):
                st = waiting
                while not st.granted:
                    await anyio.sleep(min(0.05, (st.wake_in or 0.05) + 0.002))
                    st = await b.heartbeat(TENANT, waiting.lease_id, "bob", PROC)
            lapsed_after = time.monotonic() - renewed_at
            assert lapsed_after >= ttl - 0.05, lapsed_after
            assert held.token is not None and st.token is not None and st.token > held.token
            async with hub.client("alice") as alice:
                with pytest.raises(LeaseNotFound):
                    await alice.leases().heartbeat(TENANT, held.lease_id, "alice", PROC)

    async def test_a_reconnecting_holder_keeps_its_grant(self, tmp_path: Path) -> None:
        async with running_hub(tmp_path / "s.db") as hub:
            async with hub.client("alice") as alice:
                held = await acquire(alice.leases(), ("src/a.py",), ttl=30.0)
                first_host = (await alice.leases().status(TENANT)).holders[0].host
            async with hub.client("alice") as alice:
                again = await alice.leases().heartbeat(TENANT, held.lease_id, "alice", PROC)
                assert again.granted and again.token == held.token
                holder = (await alice.leases().status(TENANT)).holders[0]
                assert holder.host != first_host, "the grant is attached to the new connection"

    async def test_malformed_params_are_refused_and_change_nothing(self, tmp_path: Path) -> None:
        async with running_hub(tmp_path / "s.db") as hub, hub.client("alice") as alice:
            a = alice.leases()
            held = await acquire(a, ("src/a.py",))
            before = comparable(await a.status(TENANT))
            lid = held.lease_id
            bad: list[tuple[str, dict[str, Any], str]] = [
                ("lease.request", {}, "INVALID_VALUE"),
                ("lease.request", {"resources": "src/x.py"}, "INVALID_VALUE"),
                ("lease.request", {"resources": []}, "INVALID_RESOURCE"),
                ("lease.request", {"resources": ["/etc/passwd"]}, "INVALID_RESOURCE"),
                ("lease.request", {"resources": ["../x"]}, "INVALID_RESOURCE"),
                ("lease.request", {"resources": [7]}, "INVALID_RESOURCE"),
                ("lease.request", {"resources": ["x"], "ttl": "30"}, "INVALID_VALUE"),
                ("lease.request", {"resources": ["x"], "ttl": True}, "INVALID_VALUE"),
                ("lease.request", {"resources": ["x"], "ttl": -1}, "INVALID_VALUE"),
                ("lease.request", {"resources": ["x"], "ttl": 1e9}, "INVALID_VALUE"),
                ("lease.request", {"resources": ["x"], "key": ["s", "1"]}, "INVALID_VALUE"),
                ("lease.request", {"resources": ["x"], "key": ["", 1]}, "INVALID_VALUE"),
                ("lease.request", {"resources": ["x"], "wait": "no"}, "INVALID_VALUE"),
                ("lease.request", {"resources": ["x"], "owner": "bob"}, "INVALID_VALUE"),
                ("lease.request", {"resources": ["x"], "pid": -1}, "INVALID_VALUE"),
                ("lease.request", {"resources": ["x"], "pid": 2**40}, "INVALID_VALUE"),
                ("lease.request", {"resources": ["x"], "key": ["s", 2**70]}, "INVALID_VALUE"),
                ("lease.request", {"resources": ["x"], "tenant": "t2"}, "FORBIDDEN"),
                ("lease.heartbeat", {"lease_id": 5}, "INVALID_VALUE"),
                ("lease.heartbeat", {"lease_id": "nope"}, "LEASE_NOT_FOUND"),
                ("lease.release", {"lease_id": lid}, "INVALID_VALUE"),
                ("lease.release", {"lease_id": lid, "token": "1"}, "INVALID_VALUE"),
                ("lease.release", {"lease_id": lid, "token": 10**6}, "LEASE_LOST"),
                ("lease.release", {"lease_id": lid, "token": None, "tenant": "t2"}, "FORBIDDEN"),
                ("lease.cancel", {"lease_id": ""}, "INVALID_VALUE"),
                ("lease.cancel", {"lease_id": lid, "extra": 1}, "INVALID_VALUE"),
                ("lease.status", {"tenant": "t2"}, "FORBIDDEN"),
                ("lease.status", {"tenant": 3}, "INVALID_VALUE"),
                ("lease.check", {"lease_id": lid, "resource": "src/a.py"}, "INVALID_VALUE"),
                (
                    "lease.check",
                    {"lease_id": lid, "resource": "/abs", "token": 1},
                    "INVALID_RESOURCE",
                ),
                ("lease.reap", {"all": True}, "INVALID_VALUE"),
            ]
            for op, params, code in bad:
                response = await alice.response(op, params)
                assert response.error is not None, (op, params)
                assert response.error.code == code, (op, params, response.error)
                assert comparable(await a.status(TENANT)) == before, (op, params)
            assert not alice.closed, "a refused request does not close the connection"
            await a.check(TENANT, lid, "src/a.py", held.token)

    async def test_the_conformance_suite_passes_through_a_real_hub(self, tmp_path: Path) -> None:
        counter = itertools.count()

        def make(clock: FakeClock, probe: Any) -> LeaseBackend:
            return HubRouted(tmp_path / f"c{next(counter)}.db", clock, probe)

        await check_lease_backend(make)


class AgentRouted(LeaseBackend):
    """For the conformance suite and the model test, which play several owners in several
    tenants on one backend: every (tenant, owner) is an agent with its own token and
    connection, and each call goes through that agent's ``RemoteLeases`` (status, check and
    reap through an ``observer`` agent of the tenant)."""

    def __init__(self) -> None:
        self._agents: dict[tuple[str, str], RemoteLeases] = {}

    async def _as(self, tenant: str, agent: str = "observer") -> RemoteLeases:
        raise NotImplementedError

    async def request(
        self,
        tenant: str,
        owner: str,
        resources: tuple[str, ...],
        *,
        ttl: float,
        key: tuple[str, int] | None,
        proc: Proc,
        wait: bool,
    ) -> Any:
        b = await self._as(tenant, owner)
        return await b.request(tenant, owner, resources, ttl=ttl, key=key, proc=proc, wait=wait)

    async def heartbeat(self, tenant: str, lease_id: str, owner: str, proc: Proc) -> Any:
        return await (await self._as(tenant, owner)).heartbeat(tenant, lease_id, owner, proc)

    async def release(self, tenant: str, lease_id: str, owner: str, token: int | None) -> None:
        await (await self._as(tenant, owner)).release(tenant, lease_id, owner, token)

    async def cancel(self, tenant: str, lease_id: str, owner: str) -> bool:
        return await (await self._as(tenant, owner)).cancel(tenant, lease_id, owner)

    async def reap(self) -> int:
        return await (await self._as("t")).reap()

    async def status(self, tenant: str) -> LeaseStatus:
        return await (await self._as(tenant)).status(tenant)

    async def check(self, tenant: str, lease_id: str, resource: str, token: int) -> None:
        await (await self._as(tenant)).check(tenant, lease_id, resource, token)


class HubRouted(AgentRouted):
    """:class:`AgentRouted` through a real hub. The hub's lease backends use the suite's clock
    and probe (a remote request's ``pid`` is the pid the client reported: the suite's probe
    judges it by that; a real probe never finds a remote holder dead)."""

    def __init__(self, db: Path, clock: FakeClock, probe: FakeProbe) -> None:
        super().__init__()
        self.db, self.clock, self.probe = db, clock, probe
        self._stack: contextlib.AsyncExitStack | None = None
        self._hub: HubUnderTest | None = None

    async def open(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self._hub = await self._stack.enter_async_context(running_hub(self.db))

    async def aclose(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def _as(self, tenant: str, agent: str = "observer") -> RemoteLeases:
        got = self._agents.get((tenant, agent))
        if got is None:
            assert self._stack is not None and self._hub is not None
            client = await self._stack.enter_async_context(
                self._hub.client(agent, tenant=tenant, run="conformance")
            )
            store: Store = await self._hub.hub._store(tenant)
            backend: Any = store.leases.backend
            backend.clock, backend.probe = self.clock, self.probe
            got = self._agents[(tenant, agent)] = client.leases()
        return got


# -- without a socket: the ops through dispatch, on both anyio backends ----------------------


class _Conn:
    """Stands for a hub connection (the ops only use it to tell connections apart)."""


def in_process(store: Store, agent: str, *, mode: str = "rw", tenant: str = TENANT) -> Any:
    """The ``call`` of a connection of ``agent``: each request goes to the hub's ``dispatch``
    and its response through the wire encoding and back, as over a socket."""
    claims = TokenClaims.model_validate(
        {"tenant": tenant, "run": RUN, "agent": agent, "mode": mode, "exp": 2**40}
    )
    ctx = OpContext(
        hub=cast(Any, None),
        conn=cast(Any, _Conn()),
        claims=claims,
        tenant=tenant,
        run=RUN,
        rec=cast(Any, None),
        store=store,
    )
    ids = itertools.count(1)

    async def call(op: str, params: dict[str, JsonValue]) -> JsonValue:
        request = decode(encode(Request(id=next(ids), op=op, params=params)))
        assert isinstance(request, Request)
        response = decode(encode(await dispatch(ctx, request)))
        assert isinstance(response, Response)
        return result_or_raise(response)

    return call


@contextlib.asynccontextmanager
async def memory_store(tenant: str = TENANT) -> AsyncIterator[Store]:
    async with open_store(
        f"memory://leases-{id(tenant)}-{time.monotonic_ns()}", tenant=tenant
    ) as s:
        yield s


class DispatchRouted(AgentRouted):
    """:class:`AgentRouted` without the hub's sockets: the hub side of every tenant is
    ``backend`` (as a tenant store's lease backend), requests go through ``dispatch``."""

    def __init__(self, backend: LeaseBackend) -> None:
        super().__init__()
        self.backend = backend
        self._store = SimpleNamespace(leases=SimpleNamespace(backend=backend))

    async def open(self) -> None:
        await self.backend.open()

    async def aclose(self) -> None:
        await self.backend.aclose()

    async def _as(self, tenant: str, agent: str = "observer") -> RemoteLeases:
        got = self._agents.get((tenant, agent))
        if got is None:
            call = in_process(cast(Store, self._store), agent, tenant=tenant)
            got = self._agents[(tenant, agent)] = RemoteLeases(call)
        return got


async def test_the_conformance_suite_passes_through_dispatch() -> None:
    def make(clock: FakeClock, probe: Any) -> LeaseBackend:
        return DispatchRouted(MemoryLeases(clock=clock, probe=probe))

    await check_lease_backend(make)


def remote_leases_api(call: Any, tg: Any, tenant: str = TENANT) -> Leases:
    """``store.leases`` as a ``ws://`` store would have it: the lease API over RemoteLeases."""
    return Leases(
        RemoteLeases(call),
        notifier=Notifier(None),
        tenant=tenant,
        check_open=lambda: None,
        task_group=lambda: tg,
    )


async def test_the_lease_api_works_over_remote_leases() -> None:
    """``async with leases.lease(...)``: renewals every ttl/3 keep a grant alive past its TTL,
    a waiter's timeout withdraws its request, a waiter is served when the holder leaves."""
    ttl = 0.5
    async with memory_store() as store, anyio.create_task_group() as tg:
        alice = remote_leases_api(in_process(store, "alice"), tg)
        bob = remote_leases_api(in_process(store, "bob"), tg)
        bob_gave_up = anyio.Event()
        with anyio.fail_after(DEADLINE):
            async with alice.lease(["src/a.py"], ttl=ttl) as held:
                assert held.state is not None and held.state.owner == "alice"
                with pytest.raises(LeaseTimeout):
                    await bob.lease(["src/a.py"], ttl=ttl, timeout=2 * ttl).acquire()
                bob_gave_up.set()
                await held.check()  # alive after 2 TTLs: renewed by its heartbeats
                status = await store.leases.status()
                assert [h.owner for h in status.holders] == ["alice"]
                assert status.waiters == (), "the timed-out request was withdrawn"
                assert not held.lost

                waiter = bob.lease(["src/a.py"], ttl=ttl)
                got = await queue_behind(tg, waiter, store.leases)
            released_at = time.monotonic()
            await got.wait()
            handed_after = time.monotonic() - released_at
            assert waiter.token > held.token
            await waiter.release()
        tg.cancel_scope.cancel()  # the lease API's heartbeat scheduler runs in tg
        assert bob_gave_up.is_set()
        # a waiter re-checks at its heartbeat (ttl/3) at the latest: well before the lease
        # layer's 2 s fallback poll
        assert handed_after < 1.0, handed_after


async def test_a_release_through_the_backend_wakes_its_own_waiters_at_once() -> None:
    async with memory_store() as store, anyio.create_task_group() as tg:
        leases = remote_leases_api(in_process(store, "alice"), tg)
        with anyio.fail_after(DEADLINE):
            held = await leases.lease(["src/a.py"], ttl=30.0).acquire()
            waiter = leases.lease(["src/a.py"], ttl=30.0)  # re-checks every 2 s otherwise
            got = anyio.Event()

            async def wait_for_it() -> None:
                await waiter.acquire()
                got.set()

            tg.start_soon(wait_for_it)

            async def queued() -> bool:
                return len((await store.leases.status()).waiters) == 1

            await until(queued, "the waiter queues")
            released_at = time.monotonic()
            await held.release()
            await got.wait()
            assert time.monotonic() - released_at < 1.0
            await waiter.release()
        tg.cancel_scope.cancel()


async def test_in_process_refusals_and_the_owner_rule() -> None:
    async with memory_store() as store:
        alice = RemoteLeases(in_process(store, "alice"))
        bob = RemoteLeases(in_process(store, "bob"))
        reader = RemoteLeases(in_process(store, "reader", mode="ro"))
        held = await acquire(alice, ("item:tasks/1",), owner="bob")
        assert held.owner == "alice"
        with pytest.raises(LeaseHeld) as refused:
            await acquire(bob, ("item:tasks/1",))
        assert refused.value.holder == "alice"
        with pytest.raises(LeaseNotFound):
            await bob.release(TENANT, held.lease_id, "alice", held.token)
        with pytest.raises(ReadOnlyAccess):
            await reader.cancel(TENANT, held.lease_id, "alice")
        with pytest.raises(Forbidden):
            await alice.status("another-tenant")
        with pytest.raises(InvalidResource):
            await acquire(alice, ("../escape",))
        with pytest.raises(InvalidValue):
            await acquire(alice, ("x",), ttl=math.inf)
        assert [h.lease_id for h in (await reader.status(TENANT)).holders] == [held.lease_id]
        await alice.aclose()
        with pytest.raises(StoreClosed):
            await alice.status(TENANT)


def test_error_responses_become_the_library_s_exceptions() -> None:
    held = LeaseHeld("src/a.py", "alice", 7)
    back = error_from_info(ErrorInfo.from_exception(held))
    assert type(back) is LeaseHeld and str(back) == str(held)
    assert (back.resource, back.holder, back.token) == ("src/a.py", "alice", 7)
    gone = error_from_info(ErrorInfo.from_exception(LeaseNotFound("abc")))
    assert type(gone) is LeaseNotFound and gone.reason == "no such lease"
    other = error_from_info(ErrorInfo(code="UNSUPPORTED_OP", message="no such op"))
    assert other.code == "UNSUPPORTED_OP" and str(other) == "no such op"
    assert set(LEASE_OPS) <= set(OPS)


async def test_a_malformed_result_is_a_backend_error() -> None:
    async def liar(op: str, params: dict[str, JsonValue]) -> JsonValue:
        return {"lease_id": 3} if op != "lease.cancel" else {"removed": "yes"}

    b = RemoteLeases(liar)
    with pytest.raises(BackendError):
        await acquire(b, ("x",))
    with pytest.raises(BackendError):
        await b.cancel(TENANT, "id", "me")
    with pytest.raises(BackendError):
        await b.reap()


# -- through the ws:// store (open_store("ws://...")): leases and claims, both anyio backends --


class HubThread:
    """A hub on an asyncio loop of its own thread, so that clients can run on trio too."""

    def __init__(self, db: Path) -> None:
        self.store_url = f"sqlite:///{db}"
        self.port = 0
        self._exit: Any = None

    def start(self) -> None:
        cm = anyio.from_thread.start_blocking_portal("asyncio")
        portal = cm.__enter__()
        hub = portal.call(lambda: Hub(self.store_url, SECRET, limits=HubLimits(close_timeout=0.5)))
        future, self.port = portal.start_task(hub.serve, "127.0.0.1", 0)

        def stop() -> None:
            future.cancel()
            concurrent.futures.wait([future])
            cm.__exit__(None, None, None)

        self._exit = stop

    def stop(self) -> None:
        if self._exit is not None:
            self._exit()
            self._exit = None


@contextlib.asynccontextmanager
async def hub_thread(db: Path) -> AsyncIterator[HubThread]:
    hub = HubThread(db)
    await anyio.to_thread.run_sync(hub.start)
    try:
        yield hub
    finally:
        await anyio.to_thread.run_sync(hub.stop)


@contextlib.asynccontextmanager
async def ws_record(hub: HubThread, agent: str) -> AsyncIterator[tuple[Store, Record]]:
    """A ``ws://`` store of ``agent`` and its record of the run (leases need an open run)."""
    url = f"ws://127.0.0.1:{hub.port}/{TENANT}"
    async with (
        open_store(url, token=token(agent), min_backoff=0.02, max_backoff=0.2) as store,
        store.open_record(RUN, "not-the-agent") as rec,
    ):
        yield store, rec


async def test_claims_work_through_the_ws_store(tmp_path: Path) -> None:
    async with (
        hub_thread(tmp_path / "s.db") as hub,
        ws_record(hub, "alice") as (_, alice),
        ws_record(hub, "bob") as (_, bob),
        open_store(hub.store_url, tenant=TENANT) as local,
        local.open_record(RUN, "carol") as carol,
    ):
        with anyio.fail_after(DEADLINE):
            claim = await alice.claim("tasks", "1", ttl=5.0)
            assert claim.lease.state is not None and claim.lease.state.owner == "alice"
            for other in (bob, carol):  # through the hub, and embedded on the same file
                with pytest.raises(LeaseHeld) as refused:
                    await other.claim("tasks", "1")
                assert refused.value.holder == "alice"
            await claim.complete({"ok": True})
            for other in (bob, carol):
                with pytest.raises(LeaseHeld) as done:
                    await other.claim("tasks", "1")
                assert done.value.holder == "alice", "a done item names who completed it"
            entry = carol.map("claims").get("tasks/1")
            assert entry["state"] == "done" and entry["claimer"] == "alice"
            assert entry["token"] == claim.token
            second = await bob.claim("tasks", "2")
            await second.release()
        writers = [(e.agent, e.effect[0][3]) for e in await local.journal(RUN)]
        assert writers == [
            ("alice", "tasks/1"),
            ("alice", "tasks/1"),
            ("bob", "tasks/2"),
            ("bob", "tasks/2"),
        ]
        assert (await local.leases.status()).holders == ()


async def test_a_fenced_write_through_the_ws_store_needs_the_lease(tmp_path: Path) -> None:
    async with (
        hub_thread(tmp_path / "s.db") as hub,
        ws_record(hub, "alice") as (store, alice),
        open_store(hub.store_url, tenant=TENANT) as local,
    ):
        with anyio.fail_after(DEADLINE):
            lease = await store.lease(["src/a.py"], ttl=5.0).acquire()
            await alice.map("files").set("src/a.py", "v1", lease=lease)
            await alice.flush()
            before = len(await local.journal(RUN))
            # the grant is withdrawn behind the holder's back (an operator, say)
            assert await local.leases.backend.cancel(TENANT, lease.lease_id, "alice")
            with pytest.raises(LeaseLost):
                await alice.map("files").set("src/a.py", "v2", lease=lease)
            assert len(await local.journal(RUN)) == before, (
                "a refused fenced write is not journaled"
            )
            assert alice.map("files").get("src/a.py") == "v1"
            with pytest.raises(LeaseLost):
                await lease.release()


async def test_a_fenced_write_with_another_agent_s_lease_is_refused(tmp_path: Path) -> None:
    async with (
        hub_thread(tmp_path / "s.db") as hub,
        ws_record(hub, "alice") as (alice_store, alice),
        ws_record(hub, "bob") as (_, bob),
        open_store(hub.store_url, tenant=TENANT) as local,
    ):
        with anyio.fail_after(DEADLINE):
            lease = await alice_store.lease(["src/a.py"], ttl=5.0).acquire()
            await alice.map("files").set("src/a.py", "v1", lease=lease)
            await alice.flush()
            await until(lambda: bob.map("files").get("src/a.py") == "v1")
            before = await local.journal(RUN)
            # bob read alice's lease id and token (lease.status shows them) and forges a fence
            with pytest.raises(LeaseLost) as forged:
                await bob.map("files").set("src/a.py", "bob's", lease=lease)
            assert await local.journal(RUN) == before, "nothing is journaled"
            assert bob.map("files").get("src/a.py") == "v1"
            # the refusal says no more than a lease that does not exist gets
            ghost = SimpleNamespace(lease_id="0" * 32, token=lease.token, resources=lease.resources)
            with pytest.raises(LeaseLost) as unknown:
                await bob.map("files").set("src/a.py", "bob's", lease=cast(Any, ghost))
            assert str(forged.value) == str(unknown.value)
            assert forged.value.to_dict() == unknown.value.to_dict()
            # the owner's own fenced write still goes
            await alice.map("files").set("src/a.py", "v2", lease=lease)
            await lease.release()
        assert [e.agent for e in await local.journal(RUN)] == ["alice", "alice"]


async def test_store_lease_through_the_ws_store_renews_and_hands_off(tmp_path: Path) -> None:
    ttl = 0.5
    async with (
        hub_thread(tmp_path / "s.db") as hub,
        ws_record(hub, "alice") as (alice, _),
        ws_record(hub, "bob") as (bob, _),
        anyio.create_task_group() as tg,
    ):
        with anyio.fail_after(DEADLINE):
            async with alice.lease(["src/a.py"], ttl=ttl) as held:
                with pytest.raises(LeaseTimeout):
                    await bob.lease(["src/a.py"], ttl=ttl, timeout=2 * ttl).acquire()
                await held.check()  # renewed through the hub past two TTLs
                waiter = bob.lease(["src/a.py"], ttl=ttl)
                got = await queue_behind(tg, waiter, alice.leases)
            released_at = time.monotonic()
            await got.wait()
            handed_after = time.monotonic() - released_at
            assert waiter.token > held.token
            await waiter.release()
        assert handed_after < 1.0, handed_after


async def _handed_after(waiter_store: Store, release: Callable[[], Any]) -> float:
    """Seconds from ``release()`` until a waiter of ``waiter_store`` that queued behind the
    holder is granted (from the ``time.monotonic()`` that ``release()`` returns, if any:
    another process's release time; CLOCK_MONOTONIC is the host's)."""
    got = anyio.Event()
    # a TTL whose heartbeat (ttl/3) is far off: only a wake-up or the 2 s poll can hand off
    waiter = waiter_store.lease(["src/a.py"], ttl=30.0)
    async with anyio.create_task_group() as tg:

        async def wait_for_it() -> None:
            await waiter.acquire()
            got.set()

        tg.start_soon(wait_for_it)

        async def queued() -> bool:
            return len((await waiter_store.leases.status()).waiters) == 1

        await until(queued, "the waiter queues")
        released_at = time.monotonic()
        when = await release()
        with anyio.fail_after(DEADLINE):
            await got.wait()
        handed = time.monotonic() - (released_at if when is None else when)
        await waiter.release()
    return handed


async def test_the_hub_pushes_lease_changes_to_remote_waiters(tmp_path: Path) -> None:
    async with (
        hub_thread(tmp_path / "s.db") as hub,
        ws_record(hub, "alice") as (alice, _),
        ws_record(hub, "bob") as (bob, _),
        open_store(hub.store_url, tenant=TENANT) as local,
    ):
        # released by another ws client
        held = await alice.lease(["src/a.py"], ttl=30.0).acquire()
        by_ws = await _handed_after(bob, held.release)
        # released by an embedded store on the hub's SQLite file (its own notifier socket:
        # the hub learns of it by the cross-process datagram, as from another process)
        held = await local.lease(["src/a.py"], ttl=30.0).acquire()
        by_embedded = await _handed_after(bob, held.release)
        # released by another process with the SQLite file open
        args = [sys.executable, "-c", _EMBEDDED_HOLDER, hub.store_url, TENANT]
        async with (
            await anyio.open_process(args) as proc,
            contextlib.aclosing(_lines(proc.stdout)) as lines,
        ):
            assert proc.stdin is not None
            with anyio.fail_after(DEADLINE):
                assert await anext(lines) == "held"

            async def release_there() -> float:
                assert proc.stdin is not None
                await proc.stdin.send(b"release\n")
                with anyio.fail_after(DEADLINE):
                    return float(await anext(lines))

            by_process = await _handed_after(bob, release_there)
            await proc.wait()
    assert by_ws < 0.5, by_ws
    assert by_embedded < 0.5, by_embedded
    assert by_process < 0.5, by_process


_EMBEDDED_HOLDER = """
import sys, time, anyio
from crdtstore import open_store

async def main(url, tenant):
    async with open_store(url, tenant=tenant) as store:
        lease = await store.lease(["src/a.py"], ttl=30.0).acquire()
        print("held", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        await lease.release()
        print(time.monotonic(), flush=True)

anyio.run(main, sys.argv[1], sys.argv[2])
"""


async def _lines(stream: Any) -> AsyncIterator[str]:
    buf = b""
    async for chunk in stream:
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.decode()


# -- the model test of the lease backends, through the ops ----------------------------------


class RemoteLeaseMachine(LeaseMachine):
    """``tests/leases/test_leases_model.py``'s state machine (requests, heartbeats, releases with
    forged tokens, cancels, time, process deaths, restarts, reboots against a naive model)
    with every call made by its owner's agent through ``RemoteLeases``, the wire encoding and
    the hub's ops, onto a memory lease table."""

    kind = "remote"

    def _open(self) -> LeaseBackend:
        hub_side = MemoryLeases(self.memory, clock=self.clock, probe=self.probe)
        b = DispatchRouted(hub_side)
        self.portal.call(b.open)
        return b


TestRemoteLeaseModel = RemoteLeaseMachine.TestCase
TestRemoteLeaseModel.settings = settings(settings.default, stateful_step_count=40, max_examples=30)


# -- a real client process killed while holding a lease -------------------------------------

_HOLDER = """
import sys, anyio
from crdtstore import open_store

async def main(url, token):
    async with open_store(url, token=token) as store, store.open_record("r1", "x"):
        lease = await store.lease(["src/a.py"], ttl=float(sys.argv[3])).acquire()
        print(lease.lease_id, lease.token, flush=True)
        await anyio.sleep_forever()  # renewing the lease until killed

anyio.run(main, sys.argv[1], sys.argv[2])
"""


async def test_a_killed_client_s_lease_lapses_after_its_ttl(tmp_path: Path) -> None:
    ttl = 1.0
    async with hub_thread(tmp_path / "s.db") as hub, ws_record(hub, "bob") as (bob, _):
        url = f"ws://127.0.0.1:{hub.port}/{TENANT}"
        args = [sys.executable, "-c", _HOLDER, url, token("alice"), str(ttl)]
        async with await anyio.open_process(args) as proc:
            assert proc.stdout is not None
            with anyio.fail_after(DEADLINE):
                line = b""
                async for chunk in proc.stdout:
                    line += chunk
                    if line.endswith(b"\n"):
                        break
            lease_id, tok = line.decode().split()
            # held across several of its TTLs by the live process's heartbeats
            with pytest.raises(LeaseTimeout):
                await bob.lease(["src/a.py"], timeout=2 * ttl).acquire()
            proc.kill()  # kill -9: no release, no close frame
            killed_at = time.monotonic()
            await proc.wait()
        with anyio.fail_after(DEADLINE):
            async with bob.lease(["src/a.py"], ttl=5.0) as lease:
                taken_after = time.monotonic() - killed_at
                assert lease.token > int(tok)
        # not at the kill (the hub cannot tell a crash from a network cut): once the TTL
        # since the last renewal (due ttl/3 before the kill, later if the holder was slow)
        # ran out, plus a waiter's re-check
        assert ttl / 3 <= taken_after < ttl + 2.5, taken_after
        with pytest.raises(LeaseLost):
            await bob.leases.check(lease_id, "src/a.py", int(tok))
