"""Kernels as real processes (``crdtstore flow run``) on one SQLite store: killed with SIGKILL
mid-run and restarted (done steps are not run again; the record holds each done attempt's
writes once, and a killed attempt's writes marked with its call id); killed while a step
waits for its files (the restarted kernel keeps the place); two kernels whose steps own
overlapping files (never two holders at once); and random crash points under hypothesis.

The steps are ``tests/_flow_steps.py:work``; every wait is a condition with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import crdtstore
from crdtstore.flow import flow_status
from tests._wait import until

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
WORK = "tests._flow_steps:work"
DEADLINE = 60.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the processes are the point here, not the event loop


class KernelProc:
    """One ``crdtstore flow run`` process."""

    def __init__(self, tmp: Path, spec: Path, url: str, run: str, name: str) -> None:
        self.err = tmp / f"{name}.stderr"
        self.out = tmp / f"{name}.stdout"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with self.err.open("ab") as err, self.out.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "crdtstore.cli", "flow", "run", str(spec), "--store", url,
                 "--run", run, "--lease-ttl", "20", "--json"],
                stdout=out, stderr=err, cwd=ROOT, env=env,
            )  # fmt: skip

    def kill9(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)

    async def exit_code(self, what: str = "the kernel to end") -> int:
        await until(lambda: self.proc.poll() is not None, what, DEADLINE)
        return self.proc.returncode

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")[-3000:]

    def result(self) -> Any:
        return json.loads(self.out.read_text().strip().splitlines()[-1])


@pytest.fixture
def kernels() -> Iterator[list[KernelProc]]:
    procs: list[KernelProc] = []
    yield procs
    for k in procs:
        with contextlib.suppress(Exception):
            k.kill9()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[crdtstore.Store]:
    async with crdtstore.open_store(f"sqlite:///{tmp_path}/store.db") as s:
        yield s


def lines(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [ln.split() for ln in log.read_text().splitlines()]


def started(log: Path) -> Counter[str]:
    return Counter(p[1] for p in lines(log) if p[0] == "start")


def work(id: str, log: Path, **inputs: Any) -> dict[str, Any]:
    return {"id": id, "kind": "python", "call": WORK, "inputs": {"log": str(log), **inputs}}


async def state(store: crdtstore.Store, run: str, path: str) -> str | None:
    try:
        s = (await flow_status(store, run)).step(path)
    except crdtstore.UnknownRun:
        return None
    return None if s is None else s.entry.state


async def record_list(store: crdtstore.Store, run: str) -> list[str]:
    async with store.open_record(run, "checker", create=False) as rec:
        return [str(x) for x in rec.list("log").to_list()]


def done_calls(status: Any) -> set[str]:
    return {
        s.entry.call for s in status.steps if s.entry.state == "done" and s.entry.kind == "python"
    }


async def test_kill9_mid_run_then_resume(
    tmp_path: Path, store: crdtstore.Store, kernels: list[KernelProc]
) -> None:
    log, gate = tmp_path / "steps.log", tmp_path / "gate"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"name": "crash", "steps": [
        work("s1", log),
        {"id": "p", "kind": "parallel", "branches": [
            work("a", log), work("b", log, gate=str(gate)), work("c", log)]},
        work("s3", log)]}))  # fmt: skip
    url = f"sqlite:///{tmp_path}/store.db"
    k = KernelProc(tmp_path, spec, url, "r1", "k1")
    kernels.append(k)

    async def mid_run() -> bool:
        return (
            started(log)["p/b"] == 1
            and await state(store, "r1", "p/a") == "done"
            and await state(store, "r1", "p/c") == "done"
        )

    await until(mid_run, "b to be running with a and c done", DEADLINE)
    k.kill9()
    st = await flow_status(store, "r1")
    assert st.step("p/b").entry.state == "running"  # type: ignore[union-attr]
    gate.touch()
    k2 = KernelProc(tmp_path, spec, url, "r1", "k2")
    kernels.append(k2)
    assert await k2.exit_code() == 0, k2.stderr()
    assert k2.result()["state"] == "done"
    # done steps were not run again; the killed attempt was retried as attempt 2
    assert started(log) == {"s1": 1, "p/a": 1, "p/c": 1, "p/b": 2, "s3": 1}
    st = await flow_status(store, "r1")
    assert st.step("p/b").entry.attempt == 2  # type: ignore[union-attr]
    assert st.run is not None and st.run.starts == 2 and st.run.state == "done"
    calls = done_calls(st)
    assert calls == {"r1:s1#1", "r1:p/a#1", "r1:p/c#1", "r1:p/b#2", "r1:s3#1"}
    # each done attempt's writes exactly once; the killed attempt's kept, marked as #1
    got = Counter(await record_list(store, "r1"))
    assert got == Counter([*calls, "r1:p/b#1"])


async def test_kill9_while_waiting_keeps_the_place_in_the_queue(
    tmp_path: Path, store: crdtstore.Store, kernels: list[KernelProc]
) -> None:
    log = tmp_path / "steps.log"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"name": "wait", "steps": [
        {**work("edit", log), "owned_files": ["src/a.py"]}]}))  # fmt: skip
    url = f"sqlite:///{tmp_path}/store.db"
    holder = await store.lease(["src/a.py"], owner="human", ttl=30).acquire()
    k = KernelProc(tmp_path, spec, url, "r1", "k1")
    kernels.append(k)
    await until(lambda: _eq(state(store, "r1", "edit"), "waiting_on_lock"), "edit to wait", 60)

    async def queued() -> Any:
        waiters = (await store.leases.status()).waiters
        return next((w for w in waiters if w.owner == "flow:r1"), None)

    mine = await until(queued, "the kernel's request")
    assert mine.key == ("edit", 1)
    # someone else queues behind it; then the kernel dies
    late = store.lease(["src/a.py"], owner="late", ttl=30)
    async with anyio.create_task_group() as tg:
        got_late = anyio.Event()

        async def take_late() -> None:
            await late.acquire()
            got_late.set()

        tg.start_soon(take_late)
        await until(lambda: _has_waiter(store, "late"), "the late request")
        k.kill9()
        k2 = KernelProc(tmp_path, spec, url, "r1", "k2")
        kernels.append(k2)
        await until(lambda: _attached(store, mine.rank), "the restarted kernel to re-attach", 60)
        status = await store.leases.status()
        ranks = [(w.owner, w.rank) for w in status.waiters]
        assert ranks[0] == ("flow:r1", mine.rank)  # the same request: its place is kept
        assert [o for o, _ in ranks] == ["flow:r1", "late"]
        await holder.release()
        assert await k2.exit_code() == 0, k2.stderr()
        with anyio.fail_after(DEADLINE):
            await got_late.wait()
        # the kernel's step held the file (start..end) before the late request got it
        assert [p[0] for p in lines(log)] == ["start", "end"]
        await late.release()
    st = await flow_status(store, "r1")
    assert st.step("edit").entry.attempt == 1  # type: ignore[union-attr]


async def test_a_script_left_running_by_a_killed_kernel_is_stopped_before_its_retry(
    tmp_path: Path, store: crdtstore.Store, kernels: list[KernelProc]
) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"name": "orphan", "steps": [{
        "id": "s", "kind": "script", "owned_files": ["src/a.py"],
        "run": 'test "$CRDTSTORE_ATTEMPT" = 1 && sleep 60; echo attempt $CRDTSTORE_ATTEMPT',
    }]}))  # fmt: skip
    url = f"sqlite:///{tmp_path}/store.db"
    k = KernelProc(tmp_path, spec, url, "r1", "k1")
    kernels.append(k)

    async def recorded() -> Any:
        try:
            s = (await flow_status(store, "r1")).step("s")
        except crdtstore.UnknownRun:
            return None
        return s.entry.process if s is not None and s.entry.state == "running" else None

    proc = await until(recorded, "the script's process in the state", DEADLINE)
    assert _alive(proc.pid)
    k.kill9()
    assert _alive(proc.pid)  # the kernel is gone, its command is not (a session of its own)
    k2 = KernelProc(tmp_path, spec, url, "r1", "k2")
    kernels.append(k2)
    assert await k2.exit_code() == 0, k2.stderr()
    await until(lambda: not _alive_not_zombie(proc.pid), "the left-over command to be stopped")
    st = (await flow_status(store, "r1")).step("s")
    assert st is not None and st.entry.attempt == 2 and st.entry.process is None
    assert st.entry.result["stdout"] == "attempt 2"


def _alive_not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def _eq(value: Any, want: Any) -> bool:
    return (await value) == want


async def _has_waiter(store: crdtstore.Store, owner: str) -> bool:
    return any(w.owner == owner for w in (await store.leases.status()).waiters)


async def _attached(store: crdtstore.Store, rank: int) -> bool:
    """The request of rank ``rank`` is held by a live process again (its pid changed)."""
    for w in (await store.leases.status()).waiters:
        if w.rank == rank:
            return w.pid is not None and _alive(w.pid) and w.age >= 0
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_two_kernels_with_overlapping_files_never_hold_one_together(
    tmp_path: Path, store: crdtstore.Store, kernels: list[KernelProc]
) -> None:
    log = tmp_path / "steps.log"
    url = f"sqlite:///{tmp_path}/store.db"
    rnd = random.Random(7)
    files = ["f0", "f1", "f2"]
    owned: dict[str, list[str]] = {}
    for run in ("ra", "rb"):
        branches = []
        for i in range(5):
            mine = sorted(rnd.sample(files, rnd.randint(1, 2)))
            owned[f"{run}/p/s{i}"] = mine
            branches.append({**work(f"s{i}", log, sleep=0.02), "owned_files": mine})
        spec = tmp_path / f"{run}.json"
        spec.write_text(json.dumps({"name": run, "steps": [
            {"id": "p", "kind": "parallel", "branches": branches}]}))  # fmt: skip
        kernels.append(KernelProc(tmp_path, spec, url, run, run))
    for k in kernels:
        assert await k.exit_code() == 0, k.stderr()
    # intervals [start, end] per step (monotonic clock, shared by the processes)
    spans: dict[tuple[int, str], list[float]] = {}
    for p in lines(log):
        spans.setdefault((int(p[3]), p[1]), []).append(float(p[4]))
    pid_run = {k.proc.pid: run for k, run in zip(kernels, ("ra", "rb"), strict=True)}
    intervals = [(pid_run[pid], path, *ts) for (pid, path), ts in spans.items()]
    assert len(intervals) == 10
    ranks = {(int(p[3]), p[1]): int(p[5]) for p in lines(log) if p[0] == "start"}
    for i, (ra, pa, s1, e1) in enumerate(intervals):
        for rb, pb, s2, e2 in intervals[i + 1 :]:
            if set(owned[f"{ra}/{pa}"]) & set(owned[f"{rb}/{pb}"]):
                assert e1 <= s2 or e2 <= s1, (ra, pa, rb, pb)  # never two holders at once
    # FIFO: of two requests sharing a file, the earlier (lower rank) was granted first
    spans_by = {
        (pid_run[pid], path): (ranks[(pid, path)], ts[0]) for (pid, path), ts in spans.items()
    }
    items = sorted(spans_by.items(), key=lambda kv: kv[1][0])
    for i, ((ra, pa), (rank_a, start_a)) in enumerate(items):
        for (rb, pb), (rank_b, start_b) in items[i + 1 :]:
            if set(owned[f"{ra}/{pa}"]) & set(owned[f"{rb}/{pb}"]):
                assert rank_a < rank_b and start_a < start_b, (ra, pa, rb, pb)


@st.composite
def crash_workflows(draw: st.DrawFn) -> dict[str, Any]:
    """A small random workflow of ``work`` steps (the log path is filled in later)."""

    def leaf(i: int) -> dict[str, Any]:
        return {"id": f"s{i}", "sleep": draw(st.sampled_from([0, 0.01, 0.05]))}

    steps: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            n = draw(st.integers(2, 4))
            join = draw(st.sampled_from(["all", {"at_least": 1}]))
            steps.append({"id": f"p{i}", "join": join, "max_concurrency": draw(st.sampled_from(
                [None, 1, 2])), "branches": [leaf(10 * i + j) for j in range(n)]})  # fmt: skip
        else:
            steps.append(leaf(i))
    return {"steps": steps, "crashes": draw(st.lists(st.integers(1, 8), min_size=1, max_size=2))}


def build(shape: dict[str, Any], log: Path) -> dict[str, Any]:
    def step(s: dict[str, Any]) -> dict[str, Any]:
        if "branches" in s:
            out = {"id": s["id"], "kind": "parallel", "join": s["join"],
                   "branches": [step(b) for b in s["branches"]]}  # fmt: skip
            if s["max_concurrency"]:
                out["max_concurrency"] = s["max_concurrency"]
            return out
        return work(s["id"], log, sleep=s["sleep"])

    return {"name": "random", "steps": [step(s) for s in shape["steps"]]}


async def crash_and_resume(tmp: Path, shape: dict[str, Any]) -> None:
    log = tmp / "steps.log"
    spec = tmp / "spec.json"
    spec.write_text(json.dumps(build(shape, log)))
    url = f"sqlite:///{tmp}/store.db"
    procs: list[KernelProc] = []
    try:
        for n, crash_at in enumerate(shape["crashes"]):
            k = KernelProc(tmp, spec, url, "r1", f"k{n}")
            procs.append(k)
            target = len(lines(log)) + crash_at
            # kill once the steps reported `crash_at` more events (or the kernel ended)
            await until(
                lambda k=k, target=target: len(lines(log)) >= target or k.proc.poll() is not None,
                "steps to report", DEADLINE,
            )  # fmt: skip
            k.kill9()
        k = KernelProc(tmp, spec, url, "r1", "final")
        procs.append(k)
        assert await k.exit_code() == 0, k.stderr()
    finally:
        for p in procs:
            p.kill9()
    async with crdtstore.open_store(url) as store:
        st = await flow_status(store, "r1")
        assert st.run is not None and st.run.state == "done"
        calls = done_calls(st)
        got = Counter(await record_list(store, "r1"))
        async with store.open_record("r1", "checker", create=False) as rec:
            out = rec.map("out").to_dict()
    ends = Counter((p[1], int(p[2])) for p in lines(log) if p[0] == "end")
    for s in st.steps:
        e = s.entry
        if e.state == "done" and e.kind == "python":
            # each done step: its done attempt ended once and wrote once
            assert ends[(e.path, e.attempt)] == 1
            assert got[e.call] == 1  # type: ignore[index]
            # and no attempt of it started after its done one
            assert max(int(p[2]) for p in lines(log) if p[:2] == ["start", e.path]) == e.attempt
    # the other writes are exactly those of attempts that did not complete, marked as such
    for call, n in got.items():
        if call not in calls:
            assert n == 1 and call.startswith("r1:")
    # map writes repeat the same value: the map equals a run without crashes
    assert out == {p: p for p in out}
    assert set(out) >= {c.split(":", 1)[1].rsplit("#", 1)[0] for c in calls}


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(shape=crash_workflows())
async def test_random_crash_points_with_real_restarts(
    tmp_path: Path, shape: dict[str, Any]
) -> None:
    sub = Path(tempfile.mkdtemp(dir=tmp_path))  # (hypothesis seeds `random`)
    await crash_and_resume(sub, shape)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(shape=crash_workflows())
async def test_random_crash_points_with_real_restarts_soak(
    tmp_path: Path, shape: dict[str, Any]
) -> None:
    sub = Path(tempfile.mkdtemp(dir=tmp_path))  # (hypothesis seeds `random`)
    await crash_and_resume(sub, shape)
