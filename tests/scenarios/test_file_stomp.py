"""file-stomp (shared/DESIGN.md failure mode 10): two agents write the same files at once.

Holders are real processes (``tests/_lease_proc.py hold``) on one SQLite store; the waiter is
this test's process. Every wait is a condition with a deadline.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

import crdtstore
from tests._lease_harness import LeaseProc, processes
from tests._wait import until

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # timing scenarios: one event loop is enough


async def _waiting(store: crdtstore.Store, n: int) -> None:
    async def queued() -> bool:
        return len((await store.leases.status(reap=False)).waiters) >= n

    await until(queued, f"{n} waiters")


async def test_killed_holder_is_reaped_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    with processes() as procs:
        holder = LeaseProc(tmp_path, "holder", "hold", url, "A", "src/a.py", "--ttl", "30")
        procs.append(holder)
        holder.wait_line("GRANT")
        async with crdtstore.open_store(url) as store:
            killed_at: list[float] = []
            lease = store.lease(["src/a.py"], ttl=30, owner="B", timeout=20)

            async def kill_when_waiting() -> None:
                await _waiting(store, 1)
                # the waiter has its answer (not granted): from its next step on it watches
                # the holder's process, with no checkpoint in between
                await until(lambda: lease.state is not None, "the waiter's answer")
                killed_at.append(time.monotonic())
                holder.kill()

            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_when_waiting)
                async with lease:
                    granted_at = time.monotonic()
            assert lease.token > 0
            latency = granted_at - killed_at[0]
            assert latency < 0.1, f"waiter granted {latency * 1000:.0f} ms after the kill"


async def test_stopped_holder_is_reaped_after_its_ttl(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    ttl = 0.5
    with processes() as procs:
        holder = LeaseProc(tmp_path, "holder", "hold", url, "A", "f1", "--ttl", str(ttl))
        procs.append(holder)
        holder.wait_line("GRANT")
        async with crdtstore.open_store(url) as store:
            stopped_at: list[float] = []

            async def stop_when_waiting() -> None:
                await _waiting(store, 1)
                stopped_at.append(time.monotonic())
                os.kill(holder.pid, signal.SIGSTOP)

            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_when_waiting)
                async with store.lease(["f1"], ttl=5, owner="B", timeout=20):
                    granted_at = time.monotonic()
            os.kill(holder.pid, signal.SIGCONT)
            latency = granted_at - stopped_at[0]
            assert latency < ttl + 0.2, f"granted {latency:.3f} s after SIGSTOP (ttl {ttl})"
            # the stopped holder learns it lost the lease when it resumes
            holder.send("release\n")
            assert holder.proc.wait(timeout=30) != 0, "the resumed holder must see LeaseLost"
            assert "LeaseLost" in holder.stderr()


async def test_restart_mid_wait_keeps_fifo(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"

    def start(name: str, res: str) -> LeaseProc:
        return LeaseProc(tmp_path, name, "hold", url, name, res, "--ttl", "30", "--key", "step")

    with processes() as procs:
        async with crdtstore.open_store(url) as store:
            a = start("A", "f1")
            procs.append(a)
            a.wait_line("GRANT")
            b = start("B", "f1,f2")
            procs.append(b)
            await _waiting(store, 1)
            c = start("C", "f2")
            procs.append(c)
            await _waiting(store, 2)
            st = await store.leases.status(reap=False)
            ranks = {i.owner: i.rank for i in (*st.holders, *st.waiters)}
            assert ranks["A"] < ranks["B"] < ranks["C"]
            # waiters first: a waiter still alive when A dies would rightly take f1 and then
            # die holding it, which is another scenario
            for p in (c, b, a):
                p.kill()
            for p in (c, b, a):
                p.reap()
            # everything is dead; C comes back first, then B
            c2 = start("C", "f2")
            procs.append(c2)

            async def c_reattached() -> Any:
                st = await store.leases.status(reap=False)
                pids = {i.owner: i.pid for i in (*st.holders, *st.waiters)}
                return st if pids.get("C") == c2.pid else None

            st = await until(c_reattached, "C to re-attach", deadline=60)
            assert {i.owner: i.rank for i in st.waiters}.get("C") == ranks["C"]
            assert [i.owner for i in st.holders] == ["B"], "A was reaped, B got f1+f2 (unseen)"
            assert not c2.has_line("GRANT")
            b2 = start("B", "f1,f2")
            procs.append(b2)
            _, line = b2.wait_line("GRANT")
            assert int(line.split()[1]) == ranks["B"], "B re-attached to its own request"
            assert not c2.has_line("GRANT"), "C must not be granted while B holds f2"
            b2.send("release\n")
            b2.wait_line("RELEASED")
            _, line = c2.wait_line("GRANT", 10)
            assert int(line.split()[1]) == ranks["C"]
            c2.send("release\n")
            c2.wait_line("RELEASED")
