"""The hub with real processes: a hub process (``python -m sync``), Python agent processes on
the ``ws://`` store (``tests/_hub_agent_proc.py``) and JavaScript Yjs clients
(``tests/interop/client.mjs``: ``yjs`` + ``y-websocket``) sharing one run.

- Eight Python agents and two JavaScript agents write their entries; every process ends with
  the same full state, the SQLite journal replays to it, provenance names each token's agent.
- ``kill -9`` of the hub mid-stream, restarted on the same store and port: the clients
  reconnect by themselves; every write a client had acknowledged (its ``flush()`` returned)
  is in the journal while the hub is down, and in every client at the end; nothing is
  journaled twice.
- A network cut: a TCP relay between the clients and the hub closes every socket mid-write
  and refuses connections for a while; the clients keep writing offline; after it heals,
  every offline edit is everywhere.

In both outages no write or flush of a Python agent raises (the provider waits the outage
out), every process ends with the same state, and the journal replays to it.

The Python agents run on the test's anyio backend (asyncio or trio: ``websockets`` has a
client for each). The JavaScript clients of the ``kill -9`` and cut tests are driven by the
test, one command at a time (write a batch, ``flush``, read the reply). Nothing sleeps to wait
for sync: every wait is on what a process reported, under a deadline (the loaded-CI figure;
on an idle machine each test takes a few seconds).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import ByteStream, Process, SocketAttribute, TaskGroup, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream

import crdtstore
from sync import TokenClaims, mint

pytestmark = pytest.mark.anyio

HERE = Path(__file__).resolve().parents[1]
AGENT = HERE / "_hub_agent_proc.py"
INTEROP = HERE / "interop"
CLIENT = INTEROP / "client.mjs"
SECRET = "processes-test-secret-0123456789"
TENANT = "t1"
RUN = "r1"
EVERY = 10  # a list append every EVERY map entries
DEADLINE = 90.0  # for a whole phase on a loaded 2-core machine; seconds when idle
# The writers of the kill and cut tests: a Python agent writes an entry every PY_PACE seconds,
# at most WINDOW entries ahead of its last flush; a JavaScript client writes 4 every JS_PACE.
# The rates stay well under what the hub takes on a loaded machine, so that the backlog (and
# the time to drain it after a restart or a cut) stays small.
PY_PACE = 0.03
JS_PACE = 0.1
WINDOW = 300
_LISTENING = re.compile(r"crdtstore hub listening on ws://127\.0\.0\.1:(\d+)")


def token(agent: str) -> str:
    claims = TokenClaims.model_validate(
        {"tenant": TENANT, "run": RUN, "agent": agent, "mode": "rw", "exp": int(time.time()) + 3600}
    )
    return mint(SECRET.encode(), claims)


def _node() -> str:
    """The node binary; fails (never skips) when Node.js or the npm packages are missing."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("Node.js is not installed: these tests need `node` (>= 18) on PATH")
    missing = [
        p for p in ("yjs", "y-websocket", "ws") if not (INTEROP / "node_modules" / p).is_dir()
    ]
    if missing:
        pytest.fail(f"tests/interop/node_modules lacks {missing}: `npm ci --prefix tests/interop`")
    return node


# -- processes --------------------------------------------------------------------------------


class Proc:
    """A subprocess whose stdout lines and stderr tail are collected by reader tasks."""

    def __init__(self, name: str, process: Process) -> None:
        self.name = name
        self.process = process
        self.lines: list[str] = []
        self.stderr: deque[str] = deque(maxlen=60)
        self.exited = False
        self._changed = anyio.Event()

    def _fire(self) -> None:
        old, self._changed = self._changed, anyio.Event()
        old.set()

    def on_line(self, line: str) -> None:
        self.lines.append(line)

    def on_stderr(self, line: str) -> None:
        self.stderr.append(line)

    async def pump(self, stream: Any, handler: Callable[[str], None]) -> None:
        buffered = BufferedByteReceiveStream(stream)
        try:
            while True:
                line = await buffered.receive_until(b"\n", 1 << 26)
                handler(line.decode(errors="replace"))
                self._fire()
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError):
            pass
        finally:
            if handler == self.on_line:
                self.exited = True
            self._fire()

    def diagnostics(self) -> str:
        tail = "\n".join(line[:400] for line in self.lines[-5:])  # a state dump is long
        err = "\n".join(self.stderr)[-6000:]
        code = self.process.returncode
        return f"{self.name} (exit {code}):\nstdout tail:\n{tail}\nstderr:\n{err}"

    async def wait(
        self, predicate: Callable[[], bool], what: str, deadline: float = DEADLINE
    ) -> None:
        """Wait until ``predicate()`` (re-checked on every line the process writes) holds;
        fail with the process's output if it exits first or the deadline passes."""
        try:
            with anyio.fail_after(deadline):
                while not predicate():
                    if self.exited:
                        raise AssertionError(f"{self.name} exited before {what}")
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(
                f"{what}: not within {deadline:g} s\n{self.diagnostics()}"
            ) from None
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnostics()}") from None

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send((line + "\n").encode())

    async def exit_status(self, deadline: float = DEADLINE) -> int:
        with anyio.fail_after(deadline):
            return await self.process.wait()


class PyAgent(Proc):
    """``_hub_agent_proc.py``: events are ``WORD rest`` lines."""

    def __init__(self, name: str, process: Process) -> None:
        super().__init__(name, process)
        self.latest: dict[str, str] = {}  # word -> the rest of its last line

    def on_line(self, line: str) -> None:
        super().on_line(line)
        word, _, rest = line.partition(" ")
        self.latest[word] = rest

    def events(self, word: str) -> list[str]:
        return [line.partition(" ")[2] for line in self.lines if line.split(" ", 1)[0] == word]

    def last(self, word: str) -> int:
        """The number of the last ``word`` event (``WROTE``, ``FLUSHED``, ``DONE``), or -1."""
        rest = self.latest.get(word)
        return -1 if rest is None else int(rest.split()[0])

    def has(self, word: str) -> bool:
        return word in self.latest

    def ok(self) -> dict[str, Any]:
        (result,) = self.events("OK")
        return dict(json.loads(result))


class JsClient(Proc):
    """``client.mjs``: JSON lines, replies by command sequence number."""

    def __init__(self, name: str, process: Process) -> None:
        super().__init__(name, process)
        self.replies: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.seq = 0

    def on_line(self, line: str) -> None:
        super().on_line(line)
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            msg = {"event": "not-json", "line": line}
        if "reply" in msg:
            self.replies[msg["seq"]] = msg
        else:
            self.events.append(msg)

    async def cmd(self, cmd: str, *, check: bool = True, **args: Any) -> dict[str, Any]:
        self.seq += 1
        seq = self.seq
        await self.send(json.dumps({"cmd": cmd, **args}))
        await self.wait(lambda: seq in self.replies, f"{self.name}: the reply to {cmd}")
        reply = self.replies[seq]
        if check:
            assert reply["ok"], reply
        return reply


class HubProc(Proc):
    """``python -m sync`` on a SQLite store; ``port`` is set once it said it is listening."""

    port: int | None = None

    def on_stderr(self, line: str) -> None:
        super().on_stderr(line)
        found = _LISTENING.search(line)
        if found:
            self.port = int(found.group(1))


@dataclass
class Fleet:
    """The processes of a test and the task group reading their output."""

    tg: TaskGroup
    tmp: Path
    backend: str
    procs: list[Proc] = field(default_factory=list)

    @property
    def store_url(self) -> str:
        return f"sqlite:///{self.tmp / 'store.db'}"

    async def _spawn(
        self, proc: Callable[[str, Process], Any], name: str, argv: list[str], **kw: Any
    ) -> Any:
        process = await anyio.open_process(argv, **kw)
        started = proc(name, process)
        self.procs.append(started)
        assert process.stdout is not None
        assert process.stderr is not None
        self.tg.start_soon(started.pump, process.stdout, started.on_line)
        self.tg.start_soon(started.pump, process.stderr, started.on_stderr)
        return started

    async def hub(self, port: int = 0) -> HubProc:
        argv = [sys.executable, "-m", "sync", "--store", self.store_url]
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        env = {**os.environ, "CRDTSTORE_SECRET": SECRET}
        hub: HubProc = await self._spawn(HubProc, "hub", argv, env=env, stdin=subprocess.DEVNULL)
        await hub.wait(lambda: hub.port is not None, "hub listening")
        return hub

    async def py_agent(self, cmd: str, url: str, agent: str, *options: str) -> PyAgent:
        argv = [sys.executable, str(AGENT), cmd, url, RUN, agent, "--token", token(agent)]
        argv += ["--backend", self.backend, "--every", str(EVERY), *options]
        proc: PyAgent = await self._spawn(PyAgent, agent, argv)
        return proc

    async def js_client(self, url: str, agent: str, *commands: dict[str, Any]) -> JsClient:
        """``client.mjs`` for ``agent``, running ``commands`` (from argv) first."""
        argv = [_node(), str(CLIENT), "--server", url, "--run", RUN, "--token", token(agent)]
        argv += [json.dumps(c) for c in commands]
        js: JsClient = await self._spawn(JsClient, agent, argv, cwd=INTEROP)
        js.seq = len(commands)  # replies to argv commands come first
        return js

    async def kill_all(self) -> None:
        for proc in self.procs:
            if proc.process.returncode is None:
                proc.process.kill()
        for proc in self.procs:
            with anyio.move_on_after(10):
                await proc.process.wait()


@contextlib.asynccontextmanager
async def fleet(tmp_path: Path, backend: str) -> AsyncIterator[Fleet]:
    async with anyio.create_task_group() as tg:
        f = Fleet(tg, tmp_path, backend)
        try:
            yield f
        finally:
            with anyio.CancelScope(shield=True):
                await f.kill_all()
            tg.cancel_scope.cancel()


async def wait_all(procs: Iterable[Proc], predicate: Callable[[Any], bool], what: str) -> None:
    """Wait until ``predicate(proc)`` holds for every one of ``procs`` (one shared deadline)."""
    with anyio.fail_after(DEADLINE + 5):
        for proc in procs:
            await proc.wait(partial(predicate, proc), f"{proc.name}: {what}")


async def stop_hub(hub: HubProc) -> None:
    """SIGTERM: the hub closes its connections and flushes its runs, then exits 0."""
    hub.process.terminate()
    assert await hub.exit_status() == 0, hub.diagnostics()


# -- what the store holds ---------------------------------------------------------------------


@dataclass
class Journal:
    entries: list[Any]

    def map_writes(self) -> dict[str, list[int]]:
        """Key of the map ``m`` -> the journal positions of the entries that set it."""
        out: dict[str, list[int]] = {}
        for e in self.entries:
            for op in e.effect:
                if op[:3] == ["map", "m", "set"]:
                    out.setdefault(op[3], []).append(e.seq)
        return out


async def read_journal(store_url: str) -> Journal:
    async with crdtstore.open_store(store_url, tenant=TENANT) as store:
        return Journal(await store.journal(RUN, limit=1_000_000))


async def replay(store_url: str) -> dict[str, Any]:
    """The map ``m`` the run's journal replays to."""
    async with crdtstore.open_store(store_url, tenant=TENANT) as store:
        return dict((await store.replay(RUN)).to_dict().get("m", {}))


def expected_state(counts: dict[str, int]) -> dict[str, Any]:
    """What every agent writing ``counts[agent]`` entries leaves in ``m`` and ``log``."""
    m = {f"{a}:{i}": i for a, n in counts.items() for i in range(n)}
    log = sorted(f"{a}:{i}" for a, n in counts.items() for i in range(0, n, EVERY))
    return {"m": m, "log": log}


def check_state(state: dict[str, Any], counts: dict[str, int], who: str) -> None:
    want = expected_state(counts)
    assert state["m"] == want["m"], f"{who}: map differs"
    log = state["log"]
    assert len(log) == len(set(log)), f"{who}: duplicated list entries"
    assert sorted(log) == want["log"], f"{who}: list differs"


async def check_store(store_url: str, final: dict[str, Any], agents: Iterable[str]) -> Journal:
    """The journal replays to ``final``; a record opened on the store holds it, with each
    key's provenance naming the agent of its prefix (never the hub)."""
    journal = await read_journal(store_url)
    async with crdtstore.open_store(store_url, tenant=TENANT) as store:
        replayed = (await store.replay(RUN)).to_dict()
        assert replayed == final
        async with store.open_record(RUN, "checker", create=False) as rec:
            assert rec.to_dict() == final
            for a in agents:
                for key in (f"{a}:0", f"{a}:{EVERY + 1}"):
                    prov = rec.provenance("m", key)
                    assert prov is not None and prov.agent == a, (key, prov)
    assert {e.agent for e in journal.entries} == set(agents)
    return journal


# -- 8 Python agents and 2 JavaScript agents on one hub -----------------------------------------


async def test_eight_python_and_two_js_agents_converge_through_a_hub_process(
    tmp_path: Path, anyio_backend: str
) -> None:
    await _agents_converge(tmp_path, anyio_backend, n=100)


@pytest.mark.slow
async def test_agents_converge_soak(tmp_path: Path, anyio_backend: str) -> None:
    await _agents_converge(tmp_path, anyio_backend, n=1000)


async def _agents_converge(tmp_path: Path, backend: str, *, n: int) -> None:
    py_names = [f"py{i}" for i in range(8)]
    js_names = ["js-a", "js-b"]
    agents = py_names + js_names
    async with fleet(tmp_path, backend) as f:
        hub = await f.hub()
        url = f"ws://127.0.0.1:{hub.port}/{TENANT}"
        expect = ",".join(agents)
        pys = [
            await f.py_agent(
                "fill", url, a, "--n", str(n), "--expect", expect, "--deadline", str(DEADLINE)
            )
            for a in py_names
        ]
        command = {
            "cmd": "agent",
            "agent": "",
            "map": "m",
            "n": n,
            "list": "log",
            "every": EVERY,
            "expect": agents,
            "wait_go": True,
            "timeout": DEADLINE,
        }
        jss = [await f.js_client(url, a, {**command, "agent": a}) for a in js_names]
        await wait_all(pys, lambda p: p.has("READY"), "READY")
        await wait_all(jss, lambda j: any(e["event"] == "ready" for e in j.events), "ready")
        for proc in [*pys, *jss]:  # everyone starts writing at once
            await proc.send("go")
        await wait_all(pys, lambda p: p.has("OK"), "every entry seen")
        await wait_all(jss, lambda j: 1 in j.replies, "every entry seen")

        counts = dict.fromkeys(agents, n)
        results = {p.name: p.ok() for p in pys}
        final = results["py0"]["state"]
        check_state(final, counts, "py0")
        for name, result in results.items():
            assert result["record_agent"] == name  # the token's agent, not the caller's
            assert result["state"] == final, f"{name} differs from py0"
            for key, prov_agent in result["provenance"].items():
                assert prov_agent == key.split(":")[0], (name, key, prov_agent)
        for js in jss:
            reply = js.replies[1]
            assert reply["ok"], reply
            assert reply["entries"] == len(agents) * n
            # the JavaScript document converged on the same map and the same list order
            assert reply["state"] == final, f"{js.name} differs from py0"
        for proc in pys:
            assert await proc.exit_status() == 0, proc.diagnostics()
        for js in jss:
            await js.send(json.dumps({"cmd": "exit"}))
            assert await js.exit_status() == 0, js.diagnostics()
        await stop_hub(hub)

    journal = await check_store(f.store_url, final, agents)
    writes = journal.map_writes()
    assert all(len(seqs) == 1 for seqs in writes.values())  # each key journaled once
    assert len(writes) == len(agents) * n


# -- writers for the kill and cut tests -----------------------------------------------------------


class JsWriter:
    """The test's loop driving a JavaScript client: a batch of map entries (and a list append
    every EVERY) in one transaction, then, if the client is connected, a ``flush``; ``acked``
    is the last entry written before a flush the hub answered. After ``stop``: the entry
    ``done[name] = written``, flushed until the hub answers."""

    def __init__(self, js: JsClient, batch: int = 4) -> None:
        self.js = js
        self.name = js.name
        self.batch = batch
        self.written = 0
        self.acked = -1
        self.failures: list[str] = []
        self.stop = anyio.Event()
        self.finished = anyio.Event()
        self._changed = anyio.Event()

    def _fire(self) -> None:
        old, self._changed = self._changed, anyio.Event()
        old.set()

    async def wait(self, predicate: Callable[[JsWriter], bool], what: str) -> None:
        try:
            with anyio.fail_after(DEADLINE):
                while not predicate(self):
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(
                f"{self.name}: {what}: not within {DEADLINE:g} s (written {self.written}, "
                f"acked {self.acked}, failures {self.failures[-3:]})\n{self.js.diagnostics()}"
            ) from None

    async def run(self, pace: float) -> None:
        name = self.name
        while not self.stop.is_set():
            ops: list[dict[str, Any]] = []
            for i in range(self.written, self.written + self.batch):
                ops.append({"cmd": "map.set", "name": "m", "key": f"{name}:{i}", "value": i})
                if i % EVERY == 0:
                    ops.append({"cmd": "array.push", "name": "log", "values": [f"{name}:{i}"]})
            await self.js.cmd("transact", ops=ops)
            self.written += self.batch
            self._fire()
            status = await self.js.cmd("status")
            if status["connected"] and status["synced"]:
                upto = self.written - 1
                reply = await self.js.cmd("flush", check=False, timeout=3)
                if reply["ok"]:
                    self.acked = max(self.acked, upto)
                    self._fire()
                else:
                    self.failures.append(reply["error"])
            await anyio.sleep(pace)  # pacing the writes, not waiting for anything
        await self.js.cmd("map.set", name="done", key=name, value=self.written)
        with anyio.fail_after(DEADLINE):
            while True:  # a cut or a restart may fail a flush: again until answered
                reply = await self.js.cmd("flush", check=False, timeout=10)
                if reply["ok"]:
                    break
                self.failures.append(reply["error"])
        self.acked = self.written - 1
        self.finished.set()
        self._fire()


def acked_keys(pys: Iterable[PyAgent], jsw: Iterable[JsWriter]) -> set[str]:
    keys = {f"{p.name}:{i}" for p in pys for i in range(p.last("FLUSHED") + 1)}
    return keys | {f"{w.name}:{i}" for w in jsw for i in range(w.acked + 1)}


async def finish_writers(
    pys: list[PyAgent], jsw: list[JsWriter], writing: TaskGroup
) -> tuple[dict[str, int], dict[str, Any]]:
    """Stop every writer; wait until each has the full state; return the counts and it."""
    for p in pys:
        await p.send("stop")
    for w in jsw:
        w.stop.set()
    await wait_all(pys, lambda p: p.has("DONE"), "DONE")
    for w in jsw:
        await w.wait(lambda w: w.finished.is_set(), "done, flushed")
    counts = {p.name: p.last("DONE") for p in pys} | {w.name: w.written for w in jsw}
    await wait_all(pys, lambda p: p.has("OK"), "every entry seen")
    final = pys[0].ok()["state"]
    want = expected_state(counts)
    for w in jsw:
        await w.js.cmd("wait-for", state={"m": want["m"], "done": counts}, timeout=DEADLINE)
    return counts, final


async def check_writers_end(
    pys: list[PyAgent], jsw: list[JsWriter], counts: dict[str, int], final: dict[str, Any]
) -> None:
    check_state(final, counts, pys[0].name)
    assert final["done"] == counts
    for p in pys:
        result = p.ok()
        assert result["state"] == final, f"{p.name} differs from {pys[0].name}"
        for key, prov_agent in result["provenance"].items():
            assert prov_agent == key.split(":")[0], (p.name, key, prov_agent)
        assert await p.exit_status() == 0, p.diagnostics()
    for w in jsw:
        state = (await w.js.cmd("dump"))["state"]
        assert state == final, f"{w.name} differs from {pys[0].name}"
        # the only failures a writer may see are flushes cut short by the connection
        for failure in w.failures:
            assert failure.startswith(("TIMEOUT", "CONNECTION_CLOSED", "NOT_CONNECTED")), failure
        await w.js.send(json.dumps({"cmd": "exit"}))
        assert await w.js.exit_status() in (0, 1), w.js.diagnostics()


def wrote_past(marks: dict[str, int], more: int, p: PyAgent) -> bool:
    return p.last("WROTE") > marks[p.name] + more


def js_wrote_past(marks: dict[str, int], more: int, w: JsWriter) -> bool:
    return w.written > marks[w.name] + more


def check_no_errors(pys: Iterable[PyAgent]) -> None:
    """No write or flush raised: the provider waits out a lost connection (its appends are
    sent again once it is back) instead of failing the record's writes."""
    errors = {p.name: p.events("ERROR")[:3] for p in pys if p.has("ERROR")}
    assert not errors, f"writes or flushes raised during the outage: {errors}"


async def start_writers(
    f: Fleet, url: str, py_names: list[str], js_names: list[str], tg: TaskGroup
) -> tuple[list[PyAgent], list[JsWriter]]:
    expect = ",".join(py_names + js_names)
    pys = [
        await f.py_agent(
            "stream",
            url,
            a,
            "--expect",
            expect,
            "--pace",
            str(PY_PACE),
            "--flush-every",
            "0.05",
            "--window",
            str(WINDOW),
            "--deadline",
            str(DEADLINE),
        )
        for a in py_names
    ]
    jsw = []
    for name in js_names:
        js = await f.js_client(url, name)
        await js.cmd("wait-for", synced=True, timeout=DEADLINE)
        writer = JsWriter(js)
        tg.start_soon(writer.run, JS_PACE)
        jsw.append(writer)
    await wait_all(pys, lambda p: p.has("READY"), "READY")
    return pys, jsw


async def until_acked_beyond(
    pys: list[PyAgent], jsw: list[JsWriter], marks: dict[str, int], what: str
) -> None:
    """Wait until every writer had a write past ``marks[name]`` acknowledged, and every Python
    writer is less than half its window ahead of the hub (room to write offline next)."""
    await wait_all(
        pys,
        lambda p: (
            p.last("FLUSHED") > marks[p.name] and p.last("WROTE") - p.last("FLUSHED") < WINDOW // 2
        ),
        what,
    )
    for w in jsw:
        await w.wait(lambda w: w.acked > marks[w.name], what)


# -- kill -9 of the hub ---------------------------------------------------------------------------


async def test_kill_9_of_the_hub_mid_stream_loses_nothing_acknowledged(
    tmp_path: Path, anyio_backend: str
) -> None:
    await _kill_hub(tmp_path, anyio_backend, kills=1, n_py=4)


@pytest.mark.slow
async def test_kill_9_of_the_hub_soak(tmp_path: Path, anyio_backend: str) -> None:
    await _kill_hub(tmp_path, anyio_backend, kills=5, n_py=8)


async def _kill_hub(tmp_path: Path, backend: str, *, kills: int, n_py: int) -> None:
    py_names = [f"py{i}" for i in range(n_py)]
    js_names = ["js-a", "js-b"]
    async with fleet(tmp_path, backend) as f:
        hub = await f.hub()
        port = hub.port
        assert port is not None
        url = f"ws://127.0.0.1:{port}/{TENANT}"
        async with anyio.create_task_group() as writing:
            pys, jsw = await start_writers(f, url, py_names, js_names, writing)
            marks = dict.fromkeys(py_names + js_names, 2 * EVERY)
            acked: set[str] = set()
            for _ in range(kills):
                await until_acked_beyond(pys, jsw, marks, "acknowledged writes before the kill")
                hub.process.kill()  # SIGKILL, mid-stream
                assert await hub.exit_status() == -9
                acked |= acked_keys(pys, jsw)  # nothing can be acknowledged from here on
                wrote = {p.name: p.last("WROTE") for p in pys} | {w.name: w.written for w in jsw}
                # every acknowledged write is in the journal while the hub is down: in the
                # state it replays to, and in the effect of an entry
                journal, replayed = await read_journal(f.store_url), await replay(f.store_url)
                lost = {k for k in acked if replayed.get(k) != int(k.rpartition(":")[2])}
                assert not lost, f"acknowledged, not in the journal: {sorted(lost)[:10]}"
                missing = acked - set(journal.map_writes())
                assert not missing, f"acknowledged, in no entry's effect: {sorted(missing)[:10]}"
                # the clients keep writing, offline
                await wait_all(pys, partial(wrote_past, wrote, 0), "offline writes")
                hub = await f.hub(port)  # same store, same port
                # they reconnect by themselves and get writes made after the kill journaled
                marks = {p.name: p.last("WROTE") for p in pys} | {w.name: w.written for w in jsw}
                await until_acked_beyond(pys, jsw, marks, "acknowledged writes after the restart")
            counts, final = await finish_writers(pys, jsw, writing)
        assert acked <= set(final["m"])
        await check_writers_end(pys, jsw, counts, final)
        await stop_hub(hub)

    journal = await check_store(f.store_url, final, py_names + js_names)
    writes = journal.map_writes()
    assert acked <= set(writes)
    twice = {k: s for k, s in writes.items() if len(s) > 1}
    assert not twice, f"journaled more than once: {dict(list(twice.items())[:5])}"
    check_no_errors(pys)


# -- a network cut --------------------------------------------------------------------------------


class Relay:
    """A TCP relay to the hub; ``cut()`` closes every relayed connection (both sockets) and
    refuses new ones (accepted and closed at once) until ``heal()``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.cut_off = False
        self.scopes: set[anyio.CancelScope] = set()
        self.relayed = 0  # connections relayed so far
        self.refused = 0

    async def serve(self, *, task_status: TaskStatus[int]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        async with listener:
            task_status.started(listener.extra(SocketAttribute.local_port))
            await listener.serve(self._relay)

    async def _relay(self, client: ByteStream) -> None:
        async with client:
            if self.cut_off:
                self.refused += 1
                return
            try:
                upstream = await anyio.connect_tcp("127.0.0.1", self.target_port)
            except OSError:
                return
            async with upstream, anyio.create_task_group() as tg:
                self.scopes.add(tg.cancel_scope)
                self.relayed += 1
                tg.start_soon(self._pump, client, upstream, tg.cancel_scope)
                tg.start_soon(self._pump, upstream, client, tg.cancel_scope)
            self.scopes.discard(tg.cancel_scope)

    @staticmethod
    async def _pump(src: ByteStream, dst: ByteStream, scope: anyio.CancelScope) -> None:
        try:
            async for chunk in src:
                await dst.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        scope.cancel()  # one side gone: close both

    def cut(self) -> int:
        self.cut_off = True
        scopes, self.scopes = self.scopes, set()
        for scope in scopes:
            scope.cancel()
        return len(scopes)

    def heal(self) -> None:
        self.cut_off = False


async def test_a_network_cut_mid_write_loses_no_offline_edit(
    tmp_path: Path, anyio_backend: str
) -> None:
    await _network_cut(tmp_path, anyio_backend, cuts=1, n_py=4)


@pytest.mark.slow
async def test_network_cut_soak(tmp_path: Path, anyio_backend: str) -> None:
    await _network_cut(tmp_path, anyio_backend, cuts=5, n_py=8)


async def _network_cut(tmp_path: Path, backend: str, *, cuts: int, n_py: int) -> None:
    py_names = [f"py{i}" for i in range(n_py)]
    js_names = ["js-a", "js-b"]
    async with fleet(tmp_path, backend) as f:
        hub = await f.hub()
        assert hub.port is not None
        relay = Relay(hub.port)
        relay_port = await f.tg.start(relay.serve)
        url = f"ws://127.0.0.1:{relay_port}/{TENANT}"
        async with anyio.create_task_group() as writing:
            pys, jsw = await start_writers(f, url, py_names, js_names, writing)
            marks = dict.fromkeys(py_names + js_names, 2 * EVERY)
            offline: list[tuple[str, int, int]] = []  # (writer, from, to): written while cut
            for _ in range(cuts):
                await until_acked_beyond(pys, jsw, marks, "acknowledged writes before the cut")
                wrote = {p.name: p.last("WROTE") for p in pys} | {w.name: w.written for w in jsw}
                assert relay.cut() == len(pys) + len(jsw)  # every client was connected
                # everyone keeps writing while no connection gets through
                await wait_all(pys, partial(wrote_past, wrote, 2 * EVERY), "offline writes")
                for w in jsw:
                    await w.wait(partial(js_wrote_past, wrote, 3 * w.batch), "offline writes")
                now = {p.name: p.last("WROTE") for p in pys} | {w.name: w.written for w in jsw}
                offline += [(name, since + 1, now[name]) for name, since in wrote.items()]
                relay.heal()
                marks = now
                await until_acked_beyond(pys, jsw, marks, "acknowledged writes after the cut")
            assert relay.refused > 0  # the clients did try to reconnect during the cut
            counts, final = await finish_writers(pys, jsw, writing)
        for name, lo, hi in offline:
            assert all(final["m"].get(f"{name}:{i}") == i for i in range(lo, hi)), name
        await check_writers_end(pys, jsw, counts, final)
        await stop_hub(hub)

    journal = await check_store(f.store_url, final, py_names + js_names)
    twice = {k: s for k, s in journal.map_writes().items() if len(s) > 1}
    assert not twice, f"journaled more than once: {dict(list(twice.items())[:5])}"
    check_no_errors(pys)
