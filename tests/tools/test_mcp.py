"""``crdtstore mcp`` as real processes, driven by the MCP SDK's own client (``ClientSession``
over ``stdio_client``, and over ``streamable_http_client``).

- Two servers (two agents) on one SQLite store: concurrent appends and puts all land; a
  guarded put loses with STALE_VERSION and wins after a re-read; of two claims on one item
  exactly one wins (and SIGTERM gives a server's claim back); ``kill -9`` of a server
  mid-write loses nothing it acknowledged.
- The tool list is the toolset's own (and the SDK's types accept it); collections are
  resources, read, subscribed to and announced in both protocol eras of SDK 2.x.
- Streamable HTTP; through a hub process, writes carry the token's agent and a read-only
  token is refused on writes.

The servers run on asyncio (as ``crdtstore mcp`` does); the client side of the tool-list
test runs on asyncio and trio, the process-heavy tests on asyncio only. Nothing sleeps to wait:
every wait is on what a process answered or sent, under a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import mcp.types
import psutil
import pytest
from anyio.abc import Process
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ResourcesListChanged, ResourceUpdated, listen
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

import crdtstore
from crdtstore.tools import Toolset
from tests._wait import until

pytestmark = pytest.mark.anyio

# Process-heavy tests run the client on asyncio only (the servers run on asyncio whatever the
# client does); the HTTP one also because the SDK's HTTP client on trio leaves an async
# generator of httpx2 to the garbage collector (a ResourceWarning, an error here).
asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])

RUN = "r1"
SECRET = "mcp-test-secret-0123456789abcdef"


def _crdtstore() -> list[str]:
    script = Path(sys.executable).parent / ("crdtstore.exe" if os.name == "nt" else "crdtstore")
    return [str(script)] if script.exists() else [sys.executable, "-m", "crdtstore.cli"]


@dataclass
class Agent:
    """One ``crdtstore mcp`` process and the client session talking to it."""

    name: str
    session: ClientSession
    log: Path
    messages: list[Any] = field(default_factory=list)

    async def call(self, tool: str, **arguments: Any) -> mcp.types.CallToolResult:
        result = await self.session.call_tool(tool, arguments)
        # the text content is the same JSON as the structured content
        assert len(result.content) == 1 and isinstance(result.content[0], mcp.types.TextContent)
        assert json.loads(result.content[0].text) == result.structured_content
        return result

    async def ok(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = await self.call(tool, **arguments)
        assert not result.is_error, (tool, result.structured_content)
        assert isinstance(result.structured_content, dict)
        return result.structured_content

    async def refused(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = await self.call(tool, **arguments)
        assert result.is_error, (tool, result.structured_content)
        assert isinstance(result.structured_content, dict)
        error: dict[str, Any] = result.structured_content["error"]
        return error

    async def read_all(self, collection: str) -> list[Any]:
        """Every item (lists) or entry (maps) of a collection, following the cursors."""
        out: list[Any] = []
        cursor = None
        while True:
            args: dict[str, Any] = {"collection": collection}
            if cursor is not None:
                args["cursor"] = cursor
            page = await self.ok("store_get", **args)
            out.extend(page.get("items", page.get("entries", [])))
            cursor = page["next_cursor"]
            if cursor is None:
                return out

    def pid(self) -> int:
        """The server process (a child of this test process naming this agent)."""
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                cmdline = proc.cmdline()
                if "mcp" in cmdline and self.name in cmdline:
                    return proc.pid
        raise AssertionError(f"no server process for {self.name}")

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.asynccontextmanager
async def mcp_agent(
    tmp_path: Path, store: str, name: str, *options: str, modern: bool = False
) -> AsyncIterator[Agent]:
    """``crdtstore mcp --store STORE --run r1 --agent NAME OPTIONS`` over stdio, with a
    session that made the handshake (``initialize``) or, ``modern``, a 2026 ``discover``."""
    command = _crdtstore()
    args = [*command[1:], "mcp", "--store", store, "--run", RUN, "--agent", name, *options]
    params = StdioServerParameters(command=command[0], args=args, env=dict(os.environ))
    log = tmp_path / f"{name}.stderr"
    messages: list[Any] = []

    async def handler(message: Any) -> None:
        messages.append(message)

    with log.open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write, message_handler=handler, read_timeout_seconds=60) as s,
        ):
            if modern:
                await s.discover()
            else:
                await s.initialize()
            agent = Agent(name, s, log, messages)
            yield agent
    # stdout carried nothing but the protocol: no line failed to parse
    assert not [m for m in messages if isinstance(m, Exception)], agent.stderr()


def sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


async def record_data(url: str) -> dict[str, Any]:
    """The record of run r1 as this process reads it from the store."""
    async with crdtstore.open_store(url) as store, store.open_record(RUN, "checker") as rec:
        return rec.to_dict()


# -- two agents on one store ----------------------------------------------------------------------


@asyncio_only
async def test_two_servers_on_one_store_keep_every_append_and_put(tmp_path: Path) -> None:
    url = sqlite(tmp_path)
    n = 12
    async with mcp_agent(tmp_path, url, "alice") as a, mcp_agent(tmp_path, url, "bob") as b:

        async def lane(agent: Agent, lane: int) -> None:
            for i in range(n):
                tag = f"{agent.name}-{lane}-{i}"
                await agent.ok("store_append", collection="log", value={"tag": tag})
                await agent.ok("store_put", collection="findings", key=tag, value=i)

        async with anyio.create_task_group() as tg:
            for agent in (a, b):
                for lane_no in range(2):  # two calls in flight per session, too
                    tg.start_soon(lane, agent, lane_no)

        expected = {
            f"{who}-{lane}-{i}" for who in ("alice", "bob") for lane in (0, 1) for i in range(n)
        }
        for agent in (a, b):  # each server reads the other's writes
            assert sorted(item["value"]["tag"] for item in await agent.read_all("log")) == sorted(
                expected
            )
            assert {e["key"] for e in await agent.read_all("findings")} == expected
    data = await record_data(url)
    assert sorted(x["tag"] for x in data["log"]) == sorted(expected)
    assert set(data["findings"]) == expected


@asyncio_only
async def test_a_guarded_put_loses_with_stale_version_and_wins_after_a_reread(
    tmp_path: Path,
) -> None:
    url = sqlite(tmp_path)
    async with (
        mcp_agent(tmp_path, url, "alice") as a,
        mcp_agent(tmp_path, url, "bob", "--source", "tool") as b,
    ):
        first = await a.ok(
            "store_put", collection="plan", key="owner", value="alice", expected_version=0
        )
        error = await b.refused(
            "store_put", collection="plan", key="owner", value="bob", expected_version=0
        )
        assert error["code"] == "STALE_VERSION"
        assert error["current"] == {"version": first["version"], "value": "alice"}
        fresh = await b.ok("store_get", collection="plan", key="owner")
        assert (fresh["value"], fresh["version"]) == ("alice", first["version"])
        won = await b.ok(
            "store_put",
            collection="plan",
            key="owner",
            value="bob",
            expected_version=fresh["version"],
        )
        assert won["version"] > first["version"]
        assert (await a.ok("store_get", collection="plan", key="owner"))["value"] == "bob"
        # the journal names the call of each agent that wrote
        history = (await a.ok("store_history", collection="plan", key="owner"))["entries"]
        assert [(h["agent"], h["source"], h["value"]) for h in history] == [
            ("alice", "model", "alice"),
            ("bob", "tool", "bob"),
        ]
        assert all(h["call"].startswith("mcp-") for h in history)
        assert history[0]["call"] != history[1]["call"]


@asyncio_only
async def test_of_two_claims_on_one_item_exactly_one_wins(tmp_path: Path) -> None:
    url = sqlite(tmp_path)
    async with mcp_agent(tmp_path, url, "alice") as a, mcp_agent(tmp_path, url, "bob") as b:
        results: dict[str, mcp.types.CallToolResult] = {}

        async def claim(agent: Agent) -> None:
            results[agent.name] = await agent.call(
                "store_claim", collection="tasks", item="t1", ttl=30
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(claim, a)
            tg.start_soon(claim, b)
        winners = [name for name, r in results.items() if not r.is_error]
        assert len(winners) == 1, {n: r.structured_content for n, r in results.items()}
        winner, loser = (a, b) if winners == ["alice"] else (b, a)
        lost = results[loser.name].structured_content
        assert isinstance(lost, dict)
        assert lost["error"]["code"] == "LEASE_HELD"
        assert winner.name in json.dumps(lost["error"])  # it names the holder
        await winner.ok("store_complete", collection="tasks", item="t1", result="done")
        again = await loser.refused("store_claim", collection="tasks", item="t1", ttl=30)
        assert again["code"] == "LEASE_HELD"  # done: nobody takes it again

        # SIGTERM: the server gives back what it holds before it ends (released, not reaped)
        await loser.ok("store_claim", collection="tasks", item="t2", ttl=60)
        pid = loser.pid()
        os.kill(pid, signal.SIGTERM)
        await until(lambda: _dead(pid), "the server to stop on SIGTERM")
        assert "stopping on signal" in loser.stderr()
        state = await winner.ok("store_get", collection="claims", key="tasks/t2")
        assert (state["value"]["state"], state["value"]["claimer"]) == ("released", loser.name)
        await winner.ok("store_claim", collection="tasks", item="t2", ttl=60)


@asyncio_only
async def test_kill_9_of_a_server_mid_write_loses_nothing_it_acknowledged(
    tmp_path: Path,
) -> None:
    url = sqlite(tmp_path)
    acked: list[str] = []
    async with mcp_agent(tmp_path, url, "witness") as witness:
        async with mcp_agent(tmp_path, url, "victim") as victim:
            pid = victim.pid()

            async def writer(lane: int) -> None:
                with contextlib.suppress(
                    MCPError, anyio.BrokenResourceError, anyio.ClosedResourceError
                ):
                    for i in range(10_000):
                        key = f"{lane}-{i}"
                        await victim.ok("store_put", collection="acked", key=key, value=i)
                        acked.append(key)

            async with anyio.create_task_group() as tg:
                for lane in range(3):  # writes in flight when the process dies
                    tg.start_soon(writer, lane)
                await until(lambda: len(acked) >= 40, "40 acknowledged writes")
                os.kill(pid, signal.SIGKILL)
            await until(lambda: _dead(pid), "the killed server to be gone")
        keys = {e["key"] for e in await witness.read_all("acked")}
        assert set(acked) <= keys, set(acked) - keys
    assert set(acked) <= set((await record_data(url))["acked"])


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# -- tools, resources, notifications --------------------------------------------------------------


async def test_the_tool_list_is_the_toolsets_own_and_the_sdk_accepts_it(tmp_path: Path) -> None:
    async with crdtstore.open_store("memory://") as store, store.open_record(RUN, "a") as rec:
        expected = Toolset(rec).schemas("mcp")
    async with mcp_agent(tmp_path, sqlite(tmp_path), "alice") as a:
        listed = (await a.session.list_tools()).tools
        unknown = await a.call("no_such_tool")
        bad = await a.call("store_put", collection="m", value=1)  # no key
    got = [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in listed]
    assert got == expected
    assert [t["name"] for t in got] == list(crdtstore.tools.TOOL_NAMES)
    for schema in expected:
        tool = mcp.types.Tool.model_validate(schema)
        assert tool.input_schema == schema["inputSchema"]
        jsonschema.Draft202012Validator.check_schema(tool.input_schema)
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint == Toolset.annotations(tool.name)["readOnlyHint"]
    assert unknown.is_error and unknown.structured_content["error"]["code"] == "UNKNOWN_TOOL"
    assert bad.is_error and bad.structured_content["error"]["code"] == "INVALID_ARGUMENTS"


def _updated(agent: Agent, uri: str, after: int = 0) -> bool:
    return any(
        isinstance(m, mcp.types.ResourceUpdatedNotification) and m.params.uri == uri
        for m in agent.messages[after:]
    )


def _list_changed(agent: Agent, after: int = 0) -> bool:
    return any(
        isinstance(m, mcp.types.ResourceListChangedNotification) for m in agent.messages[after:]
    )


@asyncio_only
async def test_collections_are_resources_read_subscribed_and_announced(tmp_path: Path) -> None:
    url = sqlite(tmp_path)
    findings, log = f"crdtstore://{RUN}/findings", f"crdtstore://{RUN}/log"
    async with (
        mcp_agent(tmp_path, url, "writer") as w,
        mcp_agent(tmp_path, url, "reader") as r,
        mcp_agent(tmp_path, url, "listener", modern=True) as modern,
        mcp_agent(tmp_path, url, "scoped", "--view", "findings", "--ro") as scoped,
    ):
        assert r.session.protocol_version == "2025-11-25"
        assert modern.session.protocol_version == "2026-07-28"
        caps = r.session.server_capabilities
        assert caps is not None and caps.resources is not None
        assert caps.resources.subscribe and caps.resources.list_changed
        await w.ok("store_put", collection="findings", key="k1", value={"text": "cold cache"})
        await w.ok("store_put", collection="notes_secret", key="k", value=1)
        listed = (await r.session.list_resources()).resources
        assert {x.uri for x in listed} == {findings, f"crdtstore://{RUN}/notes_secret"}
        assert all(x.mime_type == "application/json" for x in listed)
        # reading a resource is store_get of the collection (its first page)
        contents = (await r.session.read_resource(findings)).contents
        assert len(contents) == 1 and contents[0].mime_type == "application/json"
        assert isinstance(contents[0], mcp.types.TextResourceContents)
        page = json.loads(contents[0].text)
        assert page == await r.ok("store_get", collection="findings")
        assert [e["value"] for e in page["entries"]] == [{"text": "cold cache"}]
        with pytest.raises(MCPError):
            await r.session.read_resource(f"crdtstore://{RUN}/nothing_here")
        with pytest.raises(MCPError):
            await r.session.read_resource("crdtstore://another-run/findings")
        # a view lists (and lets the tools reach) only its slice
        assert [x.uri for x in (await scoped.session.list_resources()).resources] == [findings]
        outside = await scoped.refused("store_get", collection="notes_secret", key="k")
        assert outside["code"] == "POLICY_VIOLATION"
        denied = await scoped.refused("store_put", collection="findings", key="k9", value=0)
        assert denied["code"] == "READ_ONLY"  # --ro

        with warnings.catch_warnings():  # resources/subscribe: the handshake era's way
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await r.session.subscribe_resource(findings)
        async with listen(
            modern.session, resource_subscriptions=[findings], resources_list_changed=True
        ) as sub:
            events: list[Any] = []

            async def collect() -> None:
                async for event in sub:
                    events.append(event)

            async with anyio.create_task_group() as tg:
                tg.start_soon(collect)
                # another process writes: both subscribers hear of it (what they hear is
                # looked for after a mark: the first writes may still be announced meanwhile)
                mark = len(r.messages)
                events.clear()
                await w.ok("store_put", collection="findings", key="k2", value=2)
                await until(lambda: _updated(r, findings, mark), "resources/updated on the reader")
                await until(lambda: ResourceUpdated(uri=findings) in events, "the listen event")
                # a new collection: the resource list changed (the rounds before it are sent)
                mark = len(r.messages)
                events.clear()
                await w.ok("store_append", collection="log", value="hello")
                await until(lambda: _list_changed(r, mark), "resources/list_changed")
                await until(lambda: ResourcesListChanged() in events, "the listen list change")
                tg.cancel_scope.cancel()
        assert log in {x.uri for x in (await r.session.list_resources()).resources}
        assert not _updated(r, log)  # not subscribed to
        assert not _updated(scoped, findings)  # subscribed to nothing


# -- streamable HTTP ------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def process(
    argv: list[str], pattern: str, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[Process, re.Match[str]]]:
    """A process whose standard error is read until ``pattern`` appears (then drained)."""
    proc = await anyio.open_process(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    seen = bytearray()
    try:
        assert proc.stderr is not None
        with anyio.fail_after(60):
            while (found := re.search(pattern, seen.decode(errors="replace"))) is None:
                seen.extend(await proc.stderr.receive())
        async with anyio.create_task_group() as tg:

            async def drain() -> None:
                assert proc.stderr is not None
                with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError):
                    async for chunk in proc.stderr:
                        seen.extend(chunk)

            tg.start_soon(drain)
            yield proc, found
            tg.cancel_scope.cancel()
    except BaseException:
        print(seen.decode(errors="replace"), file=sys.stderr)
        raise
    finally:
        if proc.returncode is None:
            proc.kill()
        with anyio.move_on_after(10):
            await proc.wait()
        await proc.aclose()


@asyncio_only
async def test_streamable_http_serves_the_same_tools_and_notifications(tmp_path: Path) -> None:
    url = sqlite(tmp_path)
    argv = [
        *_crdtstore(),
        "mcp",
        "--store",
        url,
        "--run",
        RUN,
        "--agent",
        "web",
        "--http",
        "127.0.0.1:0",
    ]
    uri = f"crdtstore://{RUN}/findings"
    async with process(argv, r"listening on (http://127\.0\.0\.1:\d+/mcp)") as (proc, found):
        endpoint = found.group(1)
        messages: list[Any] = []

        async def handler(message: Any) -> None:
            messages.append(message)

        async with (
            streamable_http_client(endpoint) as (read, write),
            ClientSession(read, write, message_handler=handler, read_timeout_seconds=60) as s,
        ):
            await s.initialize()
            listed = [
                t.model_dump(by_alias=True, exclude_none=True) for t in (await s.list_tools()).tools
            ]
            assert [t["name"] for t in listed] == list(crdtstore.tools.TOOL_NAMES)
            first = await s.call_tool(
                "store_put", {"collection": "findings", "key": "k", "value": 1}
            )
            assert not first.is_error and first.structured_content is not None
            stale = await s.call_tool(
                "store_put",
                {"collection": "findings", "key": "k", "value": 2, "expected_version": 0},
            )
            assert stale.is_error and stale.structured_content is not None
            assert stale.structured_content["error"]["code"] == "STALE_VERSION"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                await s.subscribe_resource(uri)
            await s.call_tool("store_put", {"collection": "findings", "key": "k2", "value": 2})
            await until(
                lambda: any(isinstance(m, mcp.types.ResourceUpdatedNotification) for m in messages),
                "resources/updated over HTTP",
            )
        # the 2026 era over HTTP: the SDK's Client negotiates it and listens
        async with mcp.Client(endpoint) as client:
            assert client.session.protocol_version == "2026-07-28"
            async with client.listen(resource_subscriptions=[uri]) as sub:
                await client.call_tool(
                    "store_put", {"collection": "findings", "key": "k3", "value": 3}
                )
                with anyio.fail_after(30):
                    assert await sub.__anext__() == ResourceUpdated(uri=uri)
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await proc.wait() == 0
    assert set((await record_data(url))["findings"]) == {"k", "k2", "k3"}


# -- through a hub --------------------------------------------------------------------------------


def mint(tenant: str, agent: str, *, rw: bool) -> str:
    """A token, minted by ``crdtstore token`` (the last line it prints)."""
    out = subprocess.run(
        [
            *_crdtstore(),
            "token",
            "--tenant",
            tenant,
            "--run",
            RUN,
            "--agent",
            agent,
            "--rw" if rw else "--ro",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "CRDTSTORE_SECRET": SECRET},
        timeout=60,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


@asyncio_only
async def test_through_a_hub_the_token_names_the_writer_and_a_read_only_token_writes_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "hub.db"
    hub_argv = [*_crdtstore(), "serve", "--store", f"sqlite:///{db}", "--port", "0"]
    env = {**os.environ, "CRDTSTORE_SECRET": SECRET}
    rw, ro = await anyio.to_thread.run_sync(
        lambda: (mint("t1", "alice", rw=True), mint("t1", "carol", rw=False))
    )
    async with process(hub_argv, r"listening on ws://127\.0\.0\.1:(\d+)", env) as (_, found):
        store = f"ws://127.0.0.1:{found.group(1)}/t1"
        async with (
            # --agent is ignored through a hub: the token names the agent
            mcp_agent(tmp_path, store, "mallory", "--token", rw) as a,
            mcp_agent(tmp_path, store, "reader-carol", "--token", ro) as c,
        ):
            assert (await a.ok("store_describe"))["agent"] == "alice"
            await a.ok("store_put", collection="findings", key="k", value="by alice")
            history = (await a.ok("store_history", collection="findings", key="k"))["entries"]
            assert [(h["agent"], h["value"]) for h in history] == [("alice", "by alice")]
            assert history[0]["call"].startswith("mcp-")

            version = (await a.ok("store_describe"))["version"]
            before = await c.ok("store_get", collection="findings", key="k")
            assert before["value"] == "by alice"
            for tool, args in (
                ("store_put", {"collection": "findings", "key": "k", "value": "by carol"}),
                ("store_append", {"collection": "log", "value": "carol was here"}),
            ):
                assert (await c.refused(tool, **args))["code"] == "READ_ONLY"
            after = await a.ok("store_get", collection="findings", key="k")
            assert (after["value"], after["version"]) == ("by alice", before["version"])
            assert (await a.ok("store_changes", since_version=version))["changes"] == []
    async with crdtstore.open_store(f"sqlite:///{db}", tenant="t1") as s:
        entries = await s.journal(RUN)
    assert entries and {e.agent for e in entries} == {"alice"}
