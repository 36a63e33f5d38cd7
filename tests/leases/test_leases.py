"""Leases: resources, the grant rule, both backends' conformance, and the store API."""

from __future__ import annotations

import math
import time
from pathlib import Path

import anyio
import pytest
import typer

import crdtstore
from crdtstore import (
    InvalidResource,
    InvalidValue,
    LeaseHeld,
    LeaseLost,
    LeaseNotFound,
    LeaseTimeout,
)
from crdtstore._backends.memory import MemoryLeases
from crdtstore._backends.sqlite import SQLiteJournal, SQLiteLeases, check_fence
from crdtstore._leases import (
    QueueEntry,
    canonical_resource,
    canonical_resources,
    grant_order,
    this_proc,
)
from crdtstore._leases._conformance import check_lease_backend, comparable
from tests._wait import until

pytestmark = pytest.mark.anyio


# -- resources --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("b", "b"),
        ("./a/../b", "b"),
        ("a//b/", "a/b"),
        ("src/./x.py", "src/x.py"),
        ("a/b/../../c", "c"),
        ("item:tasks/42", "item:tasks/42"),
        ("item:tasks/a/b", "item:tasks/a/b"),
    ],
)
def test_canonical_resource(raw: str, canonical: str) -> None:
    assert canonical_resource(raw) == canonical


@pytest.mark.parametrize(
    "raw",
    ["", "   ", "/etc/passwd", "..", "../x", "a/../../x", "a\x00b", ".", "./", "a\\b",
     "item:", "item:tasks", "item:/42", "item:tasks/", 42, None, b"a"],
)  # fmt: skip
def test_invalid_resource(raw: object) -> None:
    with pytest.raises(InvalidResource):
        canonical_resource(raw)


def test_resource_sets() -> None:
    assert canonical_resources(["b", "./a/../b", "a"]) == ("a", "b")
    with pytest.raises(InvalidResource):
        canonical_resources([])
    with pytest.raises(InvalidResource):
        canonical_resources("src/a.py")  # a string is not a set of resources


# -- the grant rule -----------------------------------------------------------------------------


def q(rank: int, res: str, granted: bool = False) -> QueueEntry:
    return QueueEntry(rank, frozenset(res.split()), granted)


def test_grant_rule() -> None:
    # A holds f1; B wants f1 f2; C wants f2; D wants f3 -> only D
    assert grant_order([q(1, "f1", True), q(2, "f1 f2"), q(3, "f2"), q(4, "f3")]) == [4]
    # A gone: B first, and C still behind B
    assert grant_order([q(2, "f1 f2"), q(3, "f2"), q(4, "f3", True)]) == [2]
    # independent waiters all go, in rank order
    assert grant_order([q(5, "x"), q(3, "y"), q(4, "x")]) == [3, 4]
    assert grant_order([]) == []


# -- backends -----------------------------------------------------------------------------------


async def test_memory_conformance() -> None:
    await check_lease_backend(lambda clock, probe: MemoryLeases(clock=clock, probe=probe))


async def test_sqlite_conformance(tmp_path: Path) -> None:
    n = 0

    def make(clock: crdtstore._leases.Clock, probe: crdtstore._leases.ProcessProbe) -> SQLiteLeases:
        nonlocal n
        n += 1
        return SQLiteLeases(
            SQLiteJournal(f"sqlite:///{tmp_path}/s{n}.db"), clock=clock, probe=probe
        )

    await check_lease_backend(make)


async def test_check_fence_in_a_write_transaction(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    async with crdtstore.open_store(url) as store:
        journal = store.backend
        assert isinstance(journal, SQLiteJournal)
        async with store.lease(["src/a.py"], ttl=5) as lease:
            lid, tok = lease.lease_id, lease.token
            await journal._write(lambda db: check_fence(db, lid, "src/a.py", tok))
            with pytest.raises(LeaseLost):
                await journal._write(lambda db: check_fence(db, lid, "src/a.py", tok - 1))
            with pytest.raises(LeaseLost):
                await journal._write(lambda db: check_fence(db, lid, "src/b.py", tok))
            # the refused transaction was rolled back: the connection is usable
            await journal._write(lambda db: check_fence(db, lid, "src/a.py", tok))
        with pytest.raises(LeaseLost):
            await journal._write(lambda db: check_fence(db, lid, "src/a.py", tok))
    async with crdtstore.open_store(f"sqlite:///{tmp_path}/fresh.db") as store:
        journal = store.backend
        assert isinstance(journal, SQLiteJournal)
        with pytest.raises(LeaseLost):  # no lease table yet: nothing can pass
            await journal._write(lambda db: check_fence(db, "x", "a", 1))


# -- the store API ----------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/store.db"


async def test_lease_context_and_status(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.lease(["./src/../src/a.py", "item:tasks/1"], ttl=5, owner="me") as lease:
            assert lease.resources == ("item:tasks/1", "src/a.py")
            assert lease.tokens == {"item:tasks/1": lease.token, "src/a.py": lease.token}
            st = await store.leases.status()
            assert [(h.owner, h.resources, h.token) for h in st.holders] == [
                ("me", lease.resources, lease.token)
            ]
            await lease.check()
            await store.leases.check(lease.lease_id, "src/./a.py", lease.token)
        st = await store.leases.status()
        assert st.holders == () and st.waiters == ()
        async with store.lease(["src/a.py"]) as again:
            assert again.token > lease.token


async def test_waiter_resumes_on_release_and_times_out(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        holder = await store.lease(["f1"], ttl=5, owner="A").acquire()
        order: list[str] = []

        async def waiter(name: str, res: list[str]) -> None:
            async with store.lease(res, ttl=5, owner=name):
                order.append(name)

        with pytest.raises(LeaseTimeout) as info:
            await store.lease(["f1"], ttl=5, timeout=0.2).acquire()
        assert isinstance(info.value, TimeoutError)
        assert (await store.leases.status()).waiters == (), "a timed-out request is withdrawn"
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter, "B", ["f1", "f2"])
            await until(lambda: _n_waiters(store, 1))
            tg.start_soon(waiter, "C", ["f2"])
            await until(lambda: _n_waiters(store, 2))
            with pytest.raises(LeaseHeld):
                await store.lease(["f2"], wait=False).acquire()
            t0 = time.perf_counter()
            await holder.release()
        assert order == ["B", "C"]
        assert time.perf_counter() - t0 < 1.0, "waiters resume on wake-up, not on a slow poll"


async def test_cancelled_waiter_withdraws(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.lease(["f1"], ttl=5):
            with anyio.move_on_after(0.2):
                await store.lease(["f1"], ttl=5).acquire()
            assert (await store.leases.status()).waiters == ()


async def test_error_in_body_releases(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        with pytest.raises(ZeroDivisionError):
            async with store.lease(["f1"], ttl=5):
                1 / 0  # noqa: B018
        assert (await store.leases.status()).holders == ()


async def test_heartbeat_keeps_the_lease_past_its_ttl(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.lease(["f1"], ttl=0.3) as lease:
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:  # three TTLs, checked all along
                await lease.check()
                await anyio.sleep(0.05)
            assert not lease.lost


async def test_reattach_by_key_keeps_the_place(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        holder = await store.lease(["f1"], ttl=5, owner="A").acquire()
        backend = store.leases.backend
        # B asked and its process died while waiting; C queued behind it
        first = await backend.request(
            store.tenant, "B", ("f1",), ttl=5, key=("edit", 1), proc=this_proc(), wait=True
        )
        await backend.request(store.tenant, "C", ("f1",), ttl=5, key=None,
                              proc=this_proc(), wait=True)  # fmt: skip
        got: list[crdtstore.Lease] = []

        async def reattach() -> None:
            async with store.lease(["f1"], ttl=5, owner="B", key=("edit", 1)) as lease:
                got.append(lease)
                st = await store.leases.status()
                assert [w.owner for w in st.waiters] == ["C"]

        async with anyio.create_task_group() as tg:
            tg.start_soon(reattach)
            st = await store.leases.status()
            assert [w.owner for w in st.waiters] == ["B", "C"]
            await holder.release()
        assert (got[0].rank, got[0].lease_id) == (first.rank, first.lease_id)
        st = await store.leases.status()
        assert [h.owner for h in st.holders] == ["C"], "B went first, then C"


async def test_lost_lease_raises_on_exit(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        with pytest.raises(LeaseLost):
            async with store.lease(["f1"], ttl=5, owner="A") as lease:
                await store.leases.backend.cancel(store.tenant, lease.lease_id, "A")
        assert lease.lost


async def test_a_lost_lease_does_not_hide_the_bodys_error(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        held = []

        async def body() -> None:
            async with store.lease(["f1"], ttl=5, owner="A") as lease:
                held.append(lease)
                await store.leases.backend.cancel(store.tenant, lease.lease_id, "A")
                raise KeyError("the body's")

        with pytest.raises(KeyError):
            await body()
        assert held[0].lost
        explicit = await store.lease(["f1"], ttl=5, owner="A").acquire()
        await store.leases.backend.cancel(store.tenant, explicit.lease_id, "A")
        with pytest.raises(LeaseLost):
            await explicit.release()
        await explicit.release()  # released already: idempotent, nothing raised again
        assert (await store.leases.status()).holders == ()


@pytest.mark.parametrize(
    ("resources", "kwargs", "error"),
    [
        (["../../etc/passwd"], {}, InvalidResource),
        (["/abs"], {}, InvalidResource),
        ([], {}, InvalidResource),
        (["a\x00"], {}, InvalidResource),
        (["a"], {"ttl": 0}, InvalidValue),
        (["a"], {"ttl": -1}, InvalidValue),
        (["a"], {"ttl": math.nan}, InvalidValue),
        (["a"], {"ttl": math.inf}, InvalidValue),
        (["a"], {"ttl": 86_401}, InvalidValue),
        (["a"], {"timeout": -1}, InvalidValue),
        (["a"], {"owner": ""}, InvalidValue),
        (["a"], {"key": ("s",)}, InvalidValue),
    ],
)
async def test_bad_input_is_refused_and_changes_nothing(
    url: str, resources: list[str], kwargs: dict[str, object], error: type[Exception]
) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.lease(["a"], ttl=5, owner="A"):
            before = await store.leases.status()
            with pytest.raises(error):
                store.lease(resources, **kwargs)  # type: ignore[arg-type]
            assert comparable(await store.leases.status()) == comparable(before)


async def test_someone_elses_lease_and_forged_tokens(url: str) -> None:
    async with crdtstore.open_store(url) as store:
        backend = store.leases.backend
        async with store.lease(["a"], ttl=5, owner="A") as lease:
            before = await store.leases.status()
            with pytest.raises(LeaseNotFound):
                await backend.release(store.tenant, lease.lease_id, "B", lease.token)
            with pytest.raises(LeaseLost):
                await backend.release(store.tenant, lease.lease_id, "A", lease.token + 7)
            with pytest.raises(LeaseLost):
                await store.leases.check(lease.lease_id, "a", lease.token + 7)
            with pytest.raises(LeaseLost):
                await store.leases.check("0000000000000000", "a", lease.token)
            assert comparable(await store.leases.status()) == comparable(before)


# -- helpers ------------------------------------------------------------------------------------


async def _n_waiters(store: crdtstore.Store, n: int) -> bool:
    return len((await store.leases.status()).waiters) == n


def test_cli_leases(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from crdtstore._cli_leases import leases_command

    app = typer.Typer()
    app.command()(leases_command)
    url = f"sqlite:///{tmp_path}/s.db"

    async def hold() -> None:
        async with crdtstore.open_store(url) as store:
            holder = await store.lease(["src/a.py"], ttl=60, owner="A").acquire()
            await store.leases.backend.request(
                store.tenant, "B", ("src/a.py",), ttl=60, key=("s", 1), proc=this_proc(),
                wait=True,
            )  # fmt: skip
            holder._hb_scope.cancel()  # type: ignore[union-attr]  # keep it, unattended

    anyio.run(hold)
    out = CliRunner().invoke(app, ["--store", url, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert [h["owner"] for h in data["holders"]] == ["A"]
    assert [(w["owner"], w["state"]) for w in data["waiters"]] == [("B", "waiting_on_lock")]
    out = CliRunner().invoke(app, ["--store", url], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "waiting_on_lock" in out.output
    assert "src/a.py" in out.output
    assert "1 holding, 1 waiting" in out.output
