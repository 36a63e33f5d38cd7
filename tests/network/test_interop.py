"""Interop with the real JavaScript Yjs client: ``yjs`` + ``y-websocket`` 3.x against the hub.

The JavaScript side is ``tests/interop/client.mjs`` run by Node.js (its packages are installed by
``npm ci --prefix tests/interop``, which ``.ci/run`` and ``python3 dev.py test`` do); the tests
fail, with the command to run, when they are missing. The hub is a real :class:`sync.Hub` on a
SQLite store, in this process (port 0), run on asyncio in a thread of its own (websockets is
asyncio-only), so that the Python side runs on both anyio backends. The Python side is a
:class:`crdtstore.Record` opened on the same store: it sees the hub's writes through its journal
tail, and the hub sees its writes the same way.

A JavaScript collection is the root type of the same name (``doc.getMap("findings")`` is
``rec.map("findings")``, ``getArray`` a ``list``, ``getText`` a ``text``), registered in the
document's ``__crdtstore_collections`` map, which the driver does in the same transaction as
its write (as a record does); with ``--no-register`` it does not (a plain Yjs application), and
the hub registers the roots it writes.

Nothing sleeps to wait for sync: every wait is on a condition under a deadline (the driver's
``wait-for``, ``flush`` acknowledged by the hub, or a poll of the record under
``anyio.fail_after``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

import crdtstore
from crdtstore import Record
from sync import Hub, TokenClaims, mint
from tests._wait import until

pytestmark = pytest.mark.anyio

INTEROP = Path(__file__).resolve().parents[1] / "interop"
CLIENT = INTEROP / "client.mjs"
SECRET = b"interop-test-secret-0123456789"
TENANT = "t1"
RUN = "r1"
DEADLINE = 10.0


def _node() -> str:
    """The node binary; fails (never skips) when Node.js or the npm packages are missing."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("Node.js is not installed: the interop tests need `node` (>= 18) on PATH")
    missing = [
        p for p in ("yjs", "y-websocket", "ws") if not (INTEROP / "node_modules" / p).is_dir()
    ]
    if missing:
        pytest.fail(
            f"tests/interop/node_modules lacks {', '.join(missing)}: run "
            "`npm ci --prefix tests/interop` (python3 dev.py test runs it when npm is present)"
        )
    return node


def token(
    agent: str,
    *,
    tenant: str = TENANT,
    run: str = RUN,
    mode: str = "rw",
    ttl: float = 3600,
    secret: bytes = SECRET,
) -> str:
    claims = TokenClaims.model_validate(
        {"tenant": tenant, "run": run, "agent": agent, "mode": mode, "exp": int(time.time() + ttl)}
    )
    return mint(secret, claims)


# -- the hub, on asyncio in a thread --------------------------------------------------------------


@dataclass
class RunningHub:
    hub: Hub
    port: int
    store_url: str

    @property
    def server(self) -> str:
        """The y-websocket ``serverUrl``: the run is the room name appended to it."""
        return f"ws://127.0.0.1:{self.port}/{TENANT}"


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[RunningHub]:
    yield from _serve(tmp_path)


@pytest.fixture
def http_refusing_hub(tmp_path: Path) -> Iterator[RunningHub]:
    """A hub refusing bad tokens with HTTP 401/403 at the upgrade (``refuse_with="http"``)."""
    yield from _serve(tmp_path, refuse_with="http")


def _serve(tmp_path: Path, **options: Any) -> Iterator[RunningHub]:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    hub = Hub(url, SECRET, **options)
    with anyio.from_thread.start_blocking_portal("asyncio") as portal:
        serving: Future[Any]
        serving, port = portal.start_task(hub.serve, "127.0.0.1", 0)
        try:
            yield RunningHub(hub, port, url)
        finally:
            serving.cancel()  # leaving the portal waits until the hub closed runs and stores


# -- the JavaScript client ------------------------------------------------------------------------


class JSClient:
    """``client.mjs`` in a subprocess: commands as JSON lines on stdin, replies and events as
    JSON lines on stdout (see the script's header)."""

    def __init__(self, process: Process, argv_commands: int = 0) -> None:
        self.process = process
        self.events: list[dict[str, Any]] = []
        self.replies: dict[int, dict[str, Any]] = {}  # by seq: argv commands come first
        self.stderr = b""
        self.exited = False
        self._seq = argv_commands
        self._changed = anyio.Event()

    def _fire(self) -> None:
        old, self._changed = self._changed, anyio.Event()
        old.set()

    async def reader(self) -> None:
        assert self.process.stdout is not None
        stream = BufferedByteReceiveStream(self.process.stdout)
        try:
            while True:
                line = await stream.receive_until(b"\n", 1 << 24)
                msg = json.loads(line)
                if "reply" in msg:
                    self.replies[msg["seq"]] = msg
                else:
                    self.events.append(msg)
                self._fire()
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError):
            pass
        finally:
            self.exited = True
            self._fire()

    async def drain_stderr(self) -> None:
        assert self.process.stderr is not None
        with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError):
            async for chunk in self.process.stderr:
                self.stderr = (self.stderr + chunk)[-65536:]

    async def wait(self, predicate: Callable[[], bool], deadline: float = DEADLINE) -> None:
        with anyio.fail_after(deadline):
            while not predicate():
                await self._changed.wait()

    async def send(self, command: dict[str, Any]) -> int:
        assert self.process.stdin is not None
        self._seq += 1
        await self.process.stdin.send((json.dumps(command) + "\n").encode())
        return self._seq

    async def cmd(self, cmd: str, *, check: bool = True, **args: Any) -> dict[str, Any]:
        """Run one command and return its reply (asserting it succeeded, unless ``check`` is
        false). The driver's own ``timeout`` (in ``wait-for``, ``flush``) is below ours."""
        seq = await self.send({"cmd": cmd, **args})
        await self.wait(lambda: seq in self.replies or self.exited, DEADLINE + 5)
        assert seq in self.replies, (
            f"client.mjs exited before answering {cmd}: {self.events} {self.stderr!r}"
        )
        reply = self.replies[seq]
        if check:
            assert reply["ok"], reply
        return reply

    async def state(self) -> dict[str, Any]:
        return dict((await self.cmd("dump"))["state"])

    def closes(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == "connection-close" and not e["local"]]

    def count(self, event: str, **fields: Any) -> int:
        return sum(
            1
            for e in self.events
            if e["event"] == event and all(e.get(k) == v for k, v in fields.items())
        )


@contextlib.asynccontextmanager
async def js_client(
    hub: RunningHub,
    tok: str | None,
    *flags: str,
    commands: Sequence[dict[str, Any]] = (),
    run: str = RUN,
    synced: bool = True,
) -> AsyncIterator[JSClient]:
    """``client.mjs`` connected to ``run`` with token ``tok``, running ``commands`` from argv
    first; on the way out it is told to exit, and its exit status must be the driver's
    contract (1 if a command failed, else 0: anything else is a crash)."""
    command = [_node(), str(CLIENT), "--server", hub.server, "--run", run, *flags]
    if tok is not None:
        command += ["--token", tok]
    command += [json.dumps(c) for c in commands]
    async with await anyio.open_process(command, cwd=INTEROP) as process:
        client = JSClient(process, len(commands))
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.reader)
            tg.start_soon(client.drain_stderr)
            try:
                if synced:
                    await client.cmd("wait-for", synced=True)
                yield client
                await client.send({"cmd": "exit"})
                with anyio.fail_after(DEADLINE):
                    await process.wait()
                failed = any(not r["ok"] for r in client.replies.values())
                assert process.returncode == int(failed), client.stderr.decode(errors="replace")
            finally:
                if process.returncode is None:
                    process.kill()
                tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def py_record(hub: RunningHub, agent: str = "py") -> AsyncIterator[Record]:
    async with (
        crdtstore.open_store(hub.store_url, tenant=TENANT) as store,
        store.open_record(RUN, agent, "tool") as rec,
    ):
        yield rec


async def journal(hub: RunningHub) -> list[Any]:
    """The run's journal ([] when the run was never created)."""
    async with crdtstore.open_store(hub.store_url, tenant=TENANT) as store:
        if RUN not in {r.run for r in await store.runs()}:
            return []
        return await store.journal(RUN)


# -- convergence ----------------------------------------------------------------------------------


async def test_js_writes_reach_a_python_record(hub: RunningHub) -> None:
    async with py_record(hub) as rec, js_client(hub, token("js-1")) as js:
        await js.cmd("map.set", name="findings", key="a", value={"x": [1, 2.5, "é"], "ok": True})
        await js.cmd("map.update", name="findings", values={"b": 2, "c": None, "d": "gone"})
        await js.cmd("map.delete", name="findings", key="d")
        await js.cmd("array.push", name="steps", values=["one", 2, {"three": 3}])
        await js.cmd("array.insert", name="steps", index=0, values=["zero"])
        await js.cmd("array.delete", name="steps", index=2, count=1)
        # Yjs counts UTF-16 units: the globe is 2 of them; "!" goes after it
        await js.cmd("text.insert", name="notes", index=0, text="héllo 🌍 wörld")
        await js.cmd("text.insert", name="notes", index=8, text="!")
        await js.cmd("text.delete", name="notes", index=0, count=1)
        expected = {
            "findings": {"a": {"x": [1, 2.5, "é"], "ok": True}, "b": 2, "c": None},
            "steps": ["zero", "one", {"three": 3}],
            "notes": "éllo 🌍! wörld",
        }
        assert await js.state() == expected

        await until(lambda: rec.to_dict() == expected)
        assert rec.collections() == {"findings": "map", "notes": "text", "steps": "list"}
        assert rec.map("findings").get("b") == 2 and "d" not in rec.map("findings").to_dict()
        assert rec.list("steps").to_list() == ["zero", "one", {"three": 3}]
        assert rec.text("notes").read() == "éllo 🌍! wörld"
        assert len(rec.text("notes")) == 13  # code points on the Python side


async def test_python_writes_reach_js(hub: RunningHub) -> None:
    async with py_record(hub) as rec, js_client(hub, token("js-1")) as js:
        async with rec.transaction():
            await rec.map("findings").update({"a": 1, "b": {"nested": [1, 2]}, "gone": 0})
            await rec.list("steps").extend(["s1", "s2", "s3"])
            await rec.text("notes").edit("naïve café 🍰")
        await rec.map("findings").delete("gone")
        await rec.list("steps").insert(1, "s1.5")
        await rec.list("steps").delete(3)
        await rec.text("notes").insert(6, "and ")  # code points: after "naïve "
        await rec.flush()
        expected = {
            "findings": {"a": 1, "b": {"nested": [1, 2]}},
            "steps": ["s1", "s1.5", "s2"],
            "notes": "naïve and café 🍰",
        }
        assert rec.to_dict() == expected
        await js.cmd("wait-for", state=expected)
        assert await js.state() == expected

        # and JS edits at Python's positions: the text is the same string on both sides
        await js.cmd(
            "text.insert",
            name="notes",
            index=len("naïve and café 🍰".encode("utf-16-le")) // 2,
            text="!",
        )
        await until(lambda: rec.text("notes").read() == "naïve and café 🍰!")


async def test_concurrent_edits_converge_both_ways(hub: RunningHub) -> None:
    async with (
        py_record(hub) as rec,
        js_client(hub, token("js-1")) as js1,
        js_client(hub, token("js-2")) as js2,
    ):
        await rec.text("doc").edit("The quick fox.")
        await rec.list("log").append("start")
        await rec.flush()
        for js in (js1, js2):
            await js.cmd("wait-for", state={"doc": "The quick fox.", "log": ["start"]})

        # the three write to the same collections (and one map key) at the same time
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                partial(
                    js1.cmd,
                    "transact",
                    ops=[
                        {"cmd": "text.insert", "name": "doc", "index": 4, "text": "very "},
                        {"cmd": "array.push", "name": "log", "values": ["js-1"]},
                        {"cmd": "map.set", "name": "votes", "key": "winner", "value": "js-1"},
                    ],
                )
            )
            tg.start_soon(
                partial(
                    js2.cmd,
                    "transact",
                    ops=[
                        {"cmd": "text.insert", "name": "doc", "index": 9, "text": " brown"},
                        {"cmd": "array.insert", "name": "log", "index": 0, "values": ["js-2"]},
                        {"cmd": "map.set", "name": "votes", "key": "winner", "value": "js-2"},
                    ],
                )
            )
            tg.start_soon(rec.text("doc").edit, "The quick fox jumps.")
            tg.start_soon(rec.map("votes").set, "winner", "py")
        await rec.list("log").append("py")
        await js1.cmd("flush")
        await js2.cmd("flush")
        await rec.flush()

        def converged(state: dict[str, Any]) -> bool:
            return (
                len(state.get("log", [])) == 4
                and "very" in state.get("doc", "")
                and "brown" in state.get("doc", "")
                and "jumps" in state.get("doc", "")
            )

        await until(lambda: converged(rec.to_dict()))
        final = rec.to_dict()
        # where each insert lands depends on what its writer had seen; each lands once
        for word in ("very", "brown", "jumps", "quick", "fox"):
            assert final["doc"].count(word) == 1, final["doc"]
        assert final["doc"].startswith("The ") and final["doc"].endswith(".")
        assert sorted(final["log"]) == ["js-1", "js-2", "py", "start"]
        assert final["votes"]["winner"] in {"js-1", "js-2", "py"}
        for js in (js1, js2):
            await js.cmd("wait-for", state=final)
        # the journal replays to the same state
        async with crdtstore.open_store(hub.store_url, tenant=TENANT) as store:
            assert (await store.replay(RUN)).to_dict() == final


# -- provenance -----------------------------------------------------------------------------------


async def test_the_provenance_of_js_writes_names_the_token_agent(hub: RunningHub) -> None:
    async with py_record(hub) as rec:
        async with js_client(hub, token("js-agent")) as js:
            await js.cmd("map.set", name="findings", key="k", value="from js")
            await js.cmd("array.push", name="steps", values=["js step"])
            await js.cmd("flush")  # the hub has journaled it
            await until(lambda: rec.map("findings").get("k") == "from js")
            prov = rec.map("findings").provenance("k")
            assert prov is not None
            assert (prov.agent, prov.source) == ("js-agent", "model")
            history = await rec.map("findings").history("k")
            assert [(h.provenance.agent, h.value) for h in history] == [("js-agent", "from js")]

    entries = await journal(hub)
    assert entries and {e.agent for e in entries} == {"js-agent"}  # never "hub", never "py"
    assert ["map", "findings", "set", "k", "from js"] in [op for e in entries for op in e.effect]


# -- offline edits --------------------------------------------------------------------------------


async def test_an_offline_js_edit_arrives_after_reconnect_and_is_journaled(
    hub: RunningHub,
) -> None:
    async with py_record(hub) as rec, js_client(hub, token("js-1")) as js:
        await rec.map("findings").set("online", 1)
        await rec.text("notes").edit("shared")
        await rec.flush()
        await js.cmd("wait-for", contains={"findings": {"online": 1}}, state={"notes": "shared"})

        await js.cmd("disconnect")
        await js.cmd("wait-for", connected=False)
        await js.cmd("map.set", name="findings", key="offline", value="written offline")
        await js.cmd("array.push", name="steps", values=["offline step"])
        await js.cmd("text.insert", name="notes", index=6, text=" (js)")
        # meanwhile, Python writes too
        await rec.map("findings").set("meanwhile", 2)
        await rec.text("notes").insert(0, "py: ")
        await rec.flush()
        offline_seen = len(await journal(hub))
        assert rec.map("findings").get("offline") is None

        await js.cmd("reconnect")
        await js.cmd("wait-for", synced=True)
        await js.cmd("flush")  # the hub journaled the client's sync step 2
        await until(lambda: rec.map("findings").get("offline") == "written offline")
        expected = {
            "findings": {"online": 1, "offline": "written offline", "meanwhile": 2},
            "notes": "py: shared (js)",
            "steps": ["offline step"],
        }
        await until(lambda: rec.to_dict() == expected)
        await js.cmd("wait-for", state=expected)
        prov = rec.map("findings").provenance("offline")
        assert prov is not None and prov.agent == "js-1"

    entries = (await journal(hub))[offline_seen:]
    assert [e.agent for e in entries] == ["js-1"]  # one entry: the step 2 after reconnect
    assert ["map", "findings", "set", "offline", "written offline"] in entries[0].effect


# -- final closes ---------------------------------------------------------------------------------


async def _assert_final_close(js: JSClient, **expect: Any) -> dict[str, Any]:
    """The client reported a final close matching ``expect`` and does not reconnect: no other
    connection attempt within half a second (y-websocket retries 200 ms after a first failed
    attempt, and the driver prints that "connecting" event before its reply to ``wait-for``)."""
    await js.cmd("wait-for", final_close=True)
    closed = next(e for e in js.events if e["event"] == "closed")
    assert closed["final"] is True
    for key, value in expect.items():
        assert closed[key] == value, (key, closed)
    status = await js.cmd("status")
    assert status["should_connect"] is False and status["connected"] is False
    retry = await js.cmd("wait-for", connected=True, timeout=0.5, check=False)
    assert not retry["ok"] and retry["error"].startswith("TIMEOUT")
    assert js.count("status", status="connecting") == 1, js.events
    assert len(js.closes()) == 1
    return closed


def _bad_tokens() -> list[tuple[str, str | None, int, str]]:
    """(name, token, HTTP status, error code) of every way a token is refused."""
    good = token("js-1")
    payload, _, signature = good.partition(".")
    # (two characters other than the signature's last two: "AA" itself would be the real one)
    forged = f"{payload}.{signature[:-2]}{'AA' if signature[-2:] != 'AA' else 'BA'}"
    return [
        ("missing", None, 401, "TOKEN_INVALID"),
        ("forged", forged, 401, "TOKEN_INVALID"),
        (
            "other secret",
            token("js-1", secret=b"not-the-hub-secret-0123456789"),
            401,
            "TOKEN_INVALID",
        ),
        ("expired", token("js-1", ttl=-60), 401, "TOKEN_EXPIRED"),
        ("other run", token("js-1", run="r2"), 403, "FORBIDDEN"),
        ("other tenant", token("js-1", tenant="t2"), 403, "FORBIDDEN"),
    ]


async def test_refused_tokens_end_y_websocket_by_itself(hub: RunningHub) -> None:
    """The default hub completes the upgrade and closes with 4401/4403 before any document
    byte: a stock y-websocket 3.1 provider (``--stock-close``: its own ``shouldReconnect``, no
    ``disconnect()`` from the driver) stops reconnecting by itself and emits ``closed``."""

    async def case(name: str, tok: str | None, status: int, code: str) -> None:
        async with js_client(hub, tok, "--stock-close", synced=False) as js:
            closed = await _assert_final_close(
                js, code=4400 + status - 400, http_status=None, by="y-websocket"
            )
            assert closed["reason"].startswith(f"{code}: "), (name, closed)
            assert js.count("provider-closed", code=closed["code"]) == 1
            assert js.count("sync", synced=True) == 0  # no document byte came
            await js.cmd("map.set", name="findings", key=name, value=1)  # stays local

    async with anyio.create_task_group() as tg:
        for args in _bad_tokens():
            tg.start_soon(case, *args)
    assert await journal(hub) == []
    assert hub.hub.loaded_runs() == {}


async def test_http_refused_tokens_end_in_a_final_close(http_refusing_hub: RunningHub) -> None:
    """With ``refuse_with="http"`` the upgrade is refused with 401/403: y-websocket sees close
    1006 and would retry for ever; the driver's workaround reads the status and stops."""
    hub = http_refusing_hub

    async def case(name: str, tok: str | None, status: int, code: str) -> None:
        async with js_client(hub, tok, synced=False) as js:
            closed = await _assert_final_close(js, http_status=status, by="driver")
            assert closed["http_body"].startswith(code), (name, closed)
            await js.cmd("map.set", name="findings", key=name, value=1)  # stays local

    async with anyio.create_task_group() as tg:
        for args in _bad_tokens():
            tg.start_soon(case, *args)
    assert await journal(hub) == []
    assert hub.hub.loaded_runs() == {}


async def test_a_token_expiring_while_connected_ends_in_a_final_4401(hub: RunningHub) -> None:
    async with js_client(hub, token("js-1", ttl=3)) as js:
        await js.cmd("map.set", name="findings", key="before", value=1)
        await js.cmd("flush")
        closed = await _assert_final_close(js, code=4401)
        assert "TOKEN_EXPIRED" in closed["reason"]
        await js.cmd("map.set", name="findings", key="after", value=2)  # stays local
    entries = await journal(hub)
    assert [op[3] for e in entries for op in e.effect] == ["before"]


# -- collections the JS side does not register ----------------------------------------------------


async def test_collections_a_plain_yjs_client_creates_are_registered_with_effects(
    hub: RunningHub,
) -> None:
    """A Yjs client that knows nothing of ``__crdtstore_collections`` (``--no-register``):
    the hub registers the roots it writes with the kind their items show, in the entry that
    journals its update, and its list and text edits have an effect (text positions in
    characters, whereas Yjs counts UTF-16 units and pycrdt UTF-8 bytes), which a record's
    ``changes()`` delivers, attributed to the token's agent."""
    async with py_record(hub) as rec, js_client(hub, token("js-1"), "--no-register") as js:
        stream = rec.changes()
        await js.cmd("map.set", name="loose", key="k", value=1)
        await js.cmd("array.push", name="items", values=["a", "b"])
        await js.cmd("text.insert", name="notes", index=0, text="héllo")
        await js.cmd("flush")
        await until(lambda: rec.collections() == {"items": "list", "loose": "map", "notes": "text"})
        assert rec.to_dict() == {"items": ["a", "b"], "loose": {"k": 1}, "notes": "héllo"}
        meta = rec.map("loose").provenance("k")
        assert meta is not None and meta.agent == "js-1"

        await js.cmd("array.insert", name="items", index=1, values=["x"])
        await js.cmd("array.delete", name="items", index=0, count=1)
        await js.cmd("text.insert", name="notes", index=5, text="😀")
        await js.cmd("text.insert", name="notes", index=7, text="!")  # after 😀: 2 UTF-16 units
        await js.cmd("text.delete", name="notes", index=1, count=1)  # é
        await js.cmd("flush")
        await until(lambda: rec.to_dict().get("notes") == "hllo😀!")
        assert rec.to_dict()["items"] == ["x", "b"]
        ops: list[list[Any]] = []
        with anyio.fail_after(DEADLINE):
            async for change in stream:
                assert change.agent == "js-1" and not change.local
                ops.extend(list(op) for op in change.ops)
                if len(ops) == 8:
                    break
        stream.close()
    assert sorted(ops[:3]) == [
        ["list", "items", "ins", 0, ["a", "b"]],
        ["map", "loose", "set", "k", 1],
        ["text", "notes", "ins", 0, "héllo"],
    ]
    assert ops[3:] == [
        ["list", "items", "ins", 1, ["x"]],
        ["list", "items", "del", 0, 1],
        ["text", "notes", "ins", 5, "😀"],
        ["text", "notes", "ins", 6, "!"],
        ["text", "notes", "del", 1, 1],
    ]
    entries = await journal(hub)
    assert {e.agent for e in entries} == {"js-1"}
    assert [op for e in entries for op in e.effect] == ops  # the journal holds them
    async with crdtstore.open_store(hub.store_url, tenant=TENANT) as store:
        replayed = await store.replay(RUN)  # the registration is in the journal
        assert replayed.collections() == {"items": "list", "loose": "map", "notes": "text"}
        assert replayed.to_dict() == {"items": ["x", "b"], "loose": {"k": 1}, "notes": "hllo😀!"}


# -- the driver as an agent -----------------------------------------------------------------------


async def test_js_agents_and_a_python_agent_see_every_entry(hub: RunningHub) -> None:
    n, every = 20, 5
    agents = ["js-a", "js-b", "py"]
    results: dict[str, dict[str, Any]] = {}

    async def js_agent(name: str) -> None:
        command = {
            "cmd": "agent",
            "agent": name,
            "map": "m",
            "n": n,
            "list": "log",
            "every": every,
            "expect": agents,
            "timeout": DEADLINE,
        }
        async with js_client(hub, token(name), commands=[command], synced=False) as js:
            await js.wait(lambda: 1 in js.replies, DEADLINE + 5)
            assert js.replies[1]["ok"], js.replies[1]
            results[name] = js.replies[1]

    async with py_record(hub) as rec:
        async with anyio.create_task_group() as tg:
            tg.start_soon(js_agent, "js-a")
            tg.start_soon(js_agent, "js-b")
            for i in range(n):
                await rec.map("m").set(f"py:{i}", i)
                if i % every == 0:
                    await rec.list("log").append(f"py:{i}")
            await rec.flush()
            want = {f"{a}:{i}": i for a in agents for i in range(n)}
            await until(lambda: rec.map("m").to_dict() == want and len(rec.list("log")) == 12)
        final = rec.to_dict()

    for name in ("js-a", "js-b"):
        assert results[name]["entries"] == len(agents) * n
        assert results[name]["state"]["m"] == final["m"]
        assert sorted(results[name]["state"]["log"]) == sorted(final["log"])
    async with crdtstore.open_store(hub.store_url, tenant=TENANT) as store:
        assert (await store.replay(RUN)).to_dict() == final
        for a in agents:
            assert [h.provenance.agent for h in await store.history(RUN, "m", f"{a}:0")] == [a]


def test_the_interop_packages_are_pinned() -> None:
    """The lock file is committed and pins exactly what package.json names (npm ci needs it)."""
    manifest = json.loads((INTEROP / "package.json").read_text())
    lock = json.loads((INTEROP / "package-lock.json").read_text())
    deps = manifest["dependencies"]
    assert set(deps) == {"yjs", "y-websocket", "ws"}
    assert deps["y-websocket"].startswith("3.")
    for name, version in deps.items():
        assert version[0].isdigit(), f"{name} is not pinned to an exact version: {version}"
        assert lock["packages"][f"node_modules/{name}"]["version"] == version
