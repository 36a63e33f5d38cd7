"""The SQLite journal's worker thread (``crdtstore._backends.sqlite._authority._Worker``): the
slow commits of the authority run in it on asyncio, in the order given, their errors raised in
the caller; a cancellation waits for the call to return; the thread ends when idle."""

from __future__ import annotations

import asyncio
import functools
import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import crdtstore
from crdtstore._backends.sqlite import _authority as sqa
from tests._wait import until


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_calls_run_in_one_thread_in_order_and_errors_reach_the_caller(
    anyio_backend: str,
) -> None:
    worker = sqa._Worker()
    loop = asyncio.get_running_loop()
    seen: list[tuple[int, int]] = []

    def call(i: int) -> int:
        seen.append((i, threading.get_ident()))
        return i * 2

    got = [await worker.run(loop, functools.partial(call, i)) for i in range(5)]
    assert got == [0, 2, 4, 6, 8]
    assert [i for i, _ in seen] == list(range(5))
    assert len({ident for _, ident in seen}) == 1
    assert seen[0][1] != threading.get_ident()

    def fail() -> None:
        raise ValueError("from the worker")

    with pytest.raises(ValueError, match="from the worker"):
        await worker.run(loop, fail)
    assert await worker.run(loop, lambda: "still serving") == "still serving"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_cancelled_caller_waits_for_its_call_to_return(anyio_backend: str) -> None:
    worker = sqa._Worker()
    loop = asyncio.get_running_loop()
    started, release = threading.Event(), threading.Event()
    done: list[str] = []

    def slow() -> str:
        started.set()
        release.wait(30)
        done.append("returned")
        return "late"

    async def caller() -> None:
        try:
            await worker.run(loop, slow)
        finally:
            # whatever ends the wait, the call has returned by then
            assert done == ["returned"]

    async with anyio.create_task_group() as tg:
        tg.start_soon(caller)
        await until(started.is_set, "the call to start")
        tg.cancel_scope.cancel()
        for _ in range(10):  # the cancellation is delivered; the caller still waits
            await anyio.lowlevel.checkpoint()
        assert done == []
        release.set()
    assert done == ["returned"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_thread_ends_when_idle_and_starts_again(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqa, "WORKER_IDLE", 0.05)
    worker = sqa._Worker()
    loop = asyncio.get_running_loop()
    # (this worker's own thread: other tests' idle workers may end meanwhile)
    first = await worker.run(loop, threading.current_thread)
    assert first is not threading.current_thread() and first.name == "crdtstore-sqlite"
    await until(lambda: not first.is_alive(), "the idle worker to end")
    second = await worker.run(loop, threading.current_thread)
    assert second is not first and second.is_alive()
    assert await worker.run(loop, lambda: 1) == 1


async def test_slow_commits_of_a_store_go_through_the_worker_on_asyncio_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    monkeypatch.setattr(sqa, "INLINE_SYNC", 0.0)  # every durable commit takes the thread
    used: list[Any] = []
    run = sqa._Worker.run

    async def counted(self: sqa._Worker, loop: Any, fn: Any) -> Any:
        used.append(fn)
        return await run(self, loop, fn)

    monkeypatch.setattr(sqa._Worker, "run", counted)
    async with (
        crdtstore.open_store(f"sqlite:///{tmp_path}/s.db") as store,
        store.open_record("r", "a") as rec,
    ):
        m = rec.map("m")
        for i in range(3):
            _, version = m.get_versioned("k")
            await m.set("k", i, expected_version=version or 0)
        assert m.get("k") == 2
    assert len(used) == (3 if anyio_backend == "asyncio" else 0)
