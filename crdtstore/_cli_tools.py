"""The agent tools on the command line: shell commands for shell agents, and the MCP server.

``crdtstore get``, ``put``, ``append``, ``edit``, ``changes`` and ``claim`` each run one tool
of the :class:`~crdtstore.tools.Toolset` (``store_get``, ``store_put``, ...) and print its
result, the very JSON object a model gets, so a shell agent and a model agent see the same
contract; ``crdtstore mcp`` serves the same toolset over MCP (:mod:`crdtstore.tools._mcp`).
The exit statuses let a script branch on a refusal without parsing (see
:data:`EXIT_REFUSED`); ``claim -- CMD`` holds the claim while the command runs, as ``flock``
holds a lock. The options default to the environment a workflow's ``script`` step is given.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import anyio
import typer

from ._errors import CrdtStoreError
from ._store import open_store

if TYPE_CHECKING:
    from .tools import Toolset

# The contract of the shell commands (README "Tools for shell agents"):
# - one JSON object on standard output, the tool's result, and exit 0; a refusal (any result
#   with "error", such as STALE_VERSION) is printed the same way and exits EXIT_REFUSED;
#   usage errors (a malformed VALUE_JSON included) exit 2, a store that cannot be opened 1.
#   Writes are journaled before the command exits.
# - `claim` with a command after `--` holds the claim while the command runs (a claim cannot
#   outlive the process holding its lease: a dead holder's is reaped), passes the command's
#   output on to standard error, then completes the item with {"exit": 0, "tail": LAST_LINES}
#   when the command exits 0, or releases it otherwise; it exits with the command's status,
#   or EXIT_REFUSED when the claim is refused. Without a command it claims and completes the
#   item at once with --result.
# - --run, --agent, --source, --tenant and --token default to $CRDTSTORE_RUN, _AGENT,
#   _SOURCE, _TENANT and _TOKEN (what a workflow's `script` step is given); every write
#   carries $CRDTSTORE_CALL as its tool-call id.
# - through a hub (ws://host:port/<tenant> with --token) the token names the writer and
#   --agent is ignored. URL is a store URL or the path of a SQLite store file; `get` and
#   `changes` refuse a SQLite file that does not exist. `mcp --http` does not authenticate
#   its HTTP clients: keep it on a loopback address (it warns otherwise).
EXIT_REFUSED = 3
TAIL_LINES = 20
TAIL_CHARS = 4000
PLACEHOLDER_AGENT = "crdtstore-cli"  # the agent a ws:// record is opened as (the token's wins)


# -- shared options -----------------------------------------------------------------------------

UrlArg = Annotated[
    str,
    typer.Argument(
        metavar="URL",
        help="Store URL (sqlite:///path/store.db, ws://host:port/tenant) or a SQLite file path.",
    ),
]
RunOpt = Annotated[
    str,
    typer.Option("--run", "-r", envvar="CRDTSTORE_RUN", help="The run whose record to use."),
]
AgentOpt = Annotated[
    str | None,
    typer.Option(
        "--agent",
        "-a",
        envvar="CRDTSTORE_AGENT",
        help="The agent writing (required, except through a hub: there the token names it).",
    ),
]
SourceOpt = Annotated[
    str,
    typer.Option(
        "--source",
        envvar="CRDTSTORE_SOURCE",
        help="Source kind of the writes: tool, model, user, system.",
    ),
]
TenantOpt = Annotated[
    str | None, typer.Option("--tenant", envvar="CRDTSTORE_TENANT", help="Tenant of the run.")
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar="CRDTSTORE_TOKEN", help="Access token of a hub (ws:// stores)."),
]
CollectionArg = Annotated[str, typer.Argument(metavar="COLLECTION", help="The collection.")]


def _is_hub(url: str) -> bool:
    return url.startswith(("ws://", "wss://"))


def _url(target: str, *, must_exist: bool) -> str:
    url = target if "://" in target else f"sqlite:///{Path(target).expanduser().resolve()}"
    if must_exist and url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :].split("?", 1)[0])
        if not path.is_file():
            _fail(f"no store at {path}")
    return url


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _agent(url: str, agent: str | None) -> str:
    if agent is not None:
        return agent
    if _is_hub(url):
        return PLACEHOLDER_AGENT
    raise typer.BadParameter("--agent is required (except on a ws:// store)", param_hint="--agent")


def _json_arg(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint=what) from None


class _Target:
    """Where a command works: the store, run and writer, from the shared options."""

    def __init__(
        self,
        url: str,
        run: str,
        agent: str | None,
        source: str,
        tenant: str | None,
        token: str | None,
        *,
        must_exist: bool = False,
    ) -> None:
        self.url = _url(url, must_exist=must_exist)
        self.run = run
        self.agent = _agent(self.url, agent)
        self.source = source
        self.tenant = tenant
        self.token = token

    def run_tools(self, fn: Callable[[Toolset], Awaitable[dict[str, Any]]]) -> None:
        """Open the record, run ``fn`` on its toolset, print the result, exit 0 or 3."""

        async def go() -> dict[str, Any]:
            from .tools import Toolset

            async with (
                open_store(self.url, tenant=self.tenant, token=self.token) as store,
                store.open_record(self.run, self.agent, self.source) as rec,
                Toolset(rec, source=self.source) as tools,
            ):
                return await fn(tools)

        try:
            result = anyio.run(go)
        except CrdtStoreError as exc:
            _fail(str(exc))
        _print_result(result)


def _print_result(result: dict[str, Any]) -> NoReturn:
    typer.echo(json.dumps(result, ensure_ascii=False))
    raise typer.Exit(EXIT_REFUSED if "error" in result else 0)


def _call_id() -> str | None:
    """The tool-call id the writes carry: ``$CRDTSTORE_CALL`` (a kernel's ``script`` step sets
    it to the step's ``<run>:<step>#<attempt>``), if set."""
    return os.environ.get("CRDTSTORE_CALL") or None


def _call(name: str, **arguments: Any) -> Callable[[Toolset], Awaitable[dict[str, Any]]]:
    async def call(tools: Toolset) -> dict[str, Any]:
        return await tools.call(name, arguments, call_id=_call_id())

    return call


# -- shell commands -----------------------------------------------------------------------------


def get_command(
    url: UrlArg,
    run: RunOpt,
    collection: CollectionArg,
    key: Annotated[str | None, typer.Argument(metavar="KEY", help="A map key.")] = None,
    agent: AgentOpt = None,
    cursor: Annotated[
        str | None, typer.Option("--cursor", help="The next_cursor of an earlier page.")
    ] = None,
    source: SourceOpt = "model",
    tenant: TenantOpt = None,
    token: TokenOpt = None,
) -> None:
    """Read a map entry, or a page of a collection (store_get)."""
    target = _Target(url, run, agent, source, tenant, token, must_exist=True)
    args: dict[str, Any] = {"collection": collection}
    if key is not None:
        args["key"] = key
    if cursor is not None:
        args["cursor"] = cursor
    target.run_tools(_call("store_get", **args))


def put_command(
    url: UrlArg,
    run: RunOpt,
    collection: CollectionArg,
    key: Annotated[str, typer.Argument(metavar="KEY", help="The map key.")],
    value: Annotated[str, typer.Argument(metavar="VALUE_JSON", help="The value, as JSON.")],
    agent: AgentOpt = None,
    expected_version: Annotated[
        int | None,
        typer.Option(
            "--expected-version", min=0, help="Refuse unless the entry is at this version."
        ),
    ] = None,
    based_on: Annotated[
        int | None,
        typer.Option("--based-on", min=0, help="Refuse if the collection moved since."),
    ] = None,
    source: SourceOpt = "model",
    tenant: TenantOpt = None,
    token: TokenOpt = None,
) -> None:
    """Set a map entry, optionally only at an expected version (store_put)."""
    args: dict[str, Any] = {
        "collection": collection,
        "key": key,
        "value": _json_arg(value, "VALUE_JSON"),
    }
    if expected_version is not None:
        args["expected_version"] = expected_version
    if based_on is not None:
        args["based_on"] = based_on
    _Target(url, run, agent, source, tenant, token).run_tools(_call("store_put", **args))


def append_command(
    url: UrlArg,
    run: RunOpt,
    collection: CollectionArg,
    value: Annotated[str, typer.Argument(metavar="VALUE_JSON", help="The value, as JSON.")],
    agent: AgentOpt = None,
    source: SourceOpt = "model",
    tenant: TenantOpt = None,
    token: TokenOpt = None,
) -> None:
    """Append a value to a list collection (store_append)."""
    parsed = _json_arg(value, "VALUE_JSON")
    target = _Target(url, run, agent, source, tenant, token)
    target.run_tools(_call("store_append", collection=collection, value=parsed))


def edit_command(
    url: UrlArg,
    run: RunOpt,
    collection: CollectionArg,
    agent: AgentOpt = None,
    find: Annotated[
        str | None, typer.Option("--find", help="Text that occurs exactly once.")
    ] = None,
    replace: Annotated[str | None, typer.Option("--replace", help="What replaces it.")] = None,
    at: Annotated[int | None, typer.Option("--at", min=0, help="Character offset.")] = None,
    delete: Annotated[
        int, typer.Option("--delete", min=0, help="Characters to delete at --at.")
    ] = 0,
    insert: Annotated[str, typer.Option("--insert", help="Text to insert at --at.")] = "",
    edits: Annotated[
        str | None,
        typer.Option("--edits", help='The edits as JSON: [{"find": ..., "replace": ...}, ...].'),
    ] = None,
    source: SourceOpt = "model",
    tenant: TenantOpt = None,
    token: TokenOpt = None,
) -> None:
    """Edit a text collection by find/replace or splices, never a rewrite (store_text_edit)."""
    forms = [find is not None or replace is not None, at is not None, edits is not None]
    if sum(forms) != 1:
        raise typer.BadParameter(
            "give one of --find/--replace, --at [--delete] [--insert], or --edits",
            param_hint="--find / --at / --edits",
        )
    ops: Any
    if edits is not None:
        ops = _json_arg(edits, "--edits")
    elif at is not None:
        ops = [{"at": at, "delete": delete, "insert": insert}]
    else:
        if find is None or replace is None:
            raise typer.BadParameter("--find and --replace go together", param_hint="--find")
        ops = [{"find": find, "replace": replace}]
    target = _Target(url, run, agent, source, tenant, token)
    target.run_tools(_call("store_text_edit", collection=collection, edits=ops))


def changes_command(
    url: UrlArg,
    run: RunOpt,
    since_version: Annotated[
        int, typer.Argument(metavar="SINCE_VERSION", min=0, help="A record version.")
    ],
    agent: AgentOpt = None,
    source: SourceOpt = "model",
    tenant: TenantOpt = None,
    token: TokenOpt = None,
) -> None:
    """What moved in the record since a version (store_changes)."""
    target = _Target(url, run, agent, source, tenant, token, must_exist=True)
    target.run_tools(_call("store_changes", since_version=since_version))


def claim_command(
    url: UrlArg,
    run: RunOpt,
    collection: CollectionArg,
    item: Annotated[str, typer.Argument(metavar="ITEM", help="The work item's id.")],
    command: Annotated[
        list[str] | None,
        typer.Argument(metavar="CMD...", help="A command to run holding the claim."),
    ] = None,
    agent: AgentOpt = None,
    ttl: Annotated[
        float, typer.Option("--ttl", min=0.1, help="Seconds the claim lives unrenewed.")
    ] = 60.0,
    result: Annotated[
        str | None,
        typer.Option("--result", help="Without a command: the item's result, as JSON."),
    ] = None,
    source: SourceOpt = "model",
    tenant: TenantOpt = None,
    token: TokenOpt = None,
) -> None:
    """Claim a work item and complete it: at once (with --result), or after running a command
    that holds the claim (completed if it exits 0, released otherwise)."""
    if command and result is not None:
        raise typer.BadParameter("--result goes without a command", param_hint="--result")
    done = None if result is None else _json_arg(result, "--result")
    target = _Target(url, run, agent, source, tenant, token)
    status = 0

    async def go(tools: Toolset) -> dict[str, Any]:
        nonlocal status
        where = {"collection": collection, "item": item}
        claimed = await tools.call("store_claim", {**where, "ttl": ttl}, call_id=_call_id())
        if "error" in claimed:
            return claimed
        if not command:
            return await tools.call("store_complete", {**where, "result": done}, call_id=_call_id())
        status, tail = await _run_command(command)
        if status == 0:
            return await tools.call(
                "store_complete",
                {**where, "result": {"exit": 0, "tail": tail}},
                call_id=_call_id(),
            )
        return await tools.call("store_release", where, call_id=_call_id())

    try:
        target.run_tools(go)
    except typer.Exit as exit_:
        if exit_.exit_code == 0 and status != 0:
            raise typer.Exit(status) from None
        raise


async def _run_command(command: list[str]) -> tuple[int, str]:
    """Run ``command``, its output passed on to standard error; its exit status (a shell's:
    127 when it cannot start, 128 + N when signal N ends it) and its last output lines."""
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    partial = b""
    try:
        proc = await anyio.open_process(
            command, stdin=None, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
    except OSError as exc:
        typer.echo(f"error: cannot run {command[0]!r}: {exc}", err=True)
        return 127, ""
    async with proc:
        assert proc.stdout is not None
        async for chunk in proc.stdout:
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()
            *lines, partial = (partial + chunk).split(b"\n")
            tail.extend(line.decode(errors="replace") for line in lines)
        await proc.wait()
    if partial:
        tail.append(partial.decode(errors="replace"))
    code = proc.returncode if proc.returncode is not None else 1
    text = "\n".join(tail)[-TAIL_CHARS:]
    return (128 - code if code < 0 else code), text


# -- the MCP server -----------------------------------------------------------------------------


def _bind(address: str) -> socket.socket:
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        raise typer.BadParameter(f"not HOST:PORT: {address!r}", param_hint="--http")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        sock.close()
        _fail(f"cannot listen on {address}: {exc}")
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


@contextmanager
def _quiet_signals() -> Iterator[None]:
    """uvicorn stops on SIGINT and SIGTERM, then raises the signal again to the handler it
    found: let that one be a no-op, so that the record closes (and flushes) after it."""

    def ignore(signum: int, frame: FrameType | None) -> None:
        pass

    wanted = (signal.SIGINT, signal.SIGTERM)
    before = {s: signal.signal(s, ignore) for s in wanted}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


async def _serve_mcp(
    url: str,
    run: str,
    agent: str,
    source: str,
    view: list[str] | None,
    read_only: bool,
    sock: socket.socket | None,
    tenant: str | None,
    token: str | None,
) -> None:
    from .tools import Toolset
    from .tools._mcp import RecordServer

    async with (
        open_store(url, tenant=tenant, token=token) as store,
        store.open_record(run, agent, source) as rec,
        Toolset(rec, view=view, source=source, read_only=read_only) as tools,
    ):
        server = RecordServer(tools)
        who = f"run {rec.run!r} as agent {rec.agent!r}{' (read-only)' if read_only else ''}"
        if sock is None:
            typer.echo(f"crdtstore mcp: serving {who} over stdio", err=True)

            async def stop_on_signal() -> None:
                # The SDK reads stdin in a worker thread, which a cancellation waits for (until
                # the client writes or closes stdin). So on SIGINT or SIGTERM close here what
                # holds state (the toolset's claims and leases, the record: flushed), then end
                # the process by the signal (what is left is what kill -9 leaves).
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        typer.echo(f"crdtstore mcp: stopping on signal {signum}", err=True)
                        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                            await tools.aclose()
                            await rec.aclose()
                        signal.signal(signum, signal.SIG_DFL)
                        os.kill(os.getpid(), signum)

            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_on_signal)
                await server.serve_stdio()  # until the client closes stdin
                tg.cancel_scope.cancel()
        else:
            host, port = sock.getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            typer.echo(
                f"crdtstore mcp listening on http://{shown}:{port}/mcp, serving {who}", err=True
            )
            if not ipaddress.ip_address(host).is_loopback:
                typer.echo(
                    "crdtstore mcp: warning: HTTP clients are not authenticated; anyone who "
                    f"reaches {shown}:{port} can use these tools",
                    err=True,
                )
            with _quiet_signals():
                await server.serve_http(sock)


def mcp_command(
    store: Annotated[
        str,
        typer.Option(
            "--store", help="Store URL (sqlite:///path/store.db, ws://host:port/tenant) or path."
        ),
    ],
    run: RunOpt,
    agent: Annotated[
        str | None,
        typer.Option(
            "--agent",
            help="The agent the tools write as (required, except through a hub: there the "
            "token names the agent and --agent is ignored).",
        ),
    ] = None,
    source: Annotated[
        str,
        typer.Option("--source", help="Source kind of the writes: model, tool, user, system."),
    ] = "model",
    view: Annotated[
        list[str] | None,
        typer.Option(
            "--view",
            metavar="PATTERN",
            help='Restrict the tools to a slice ("findings", "findings/net/*"); repeatable.',
        ),
    ] = None,
    read_only: Annotated[
        bool, typer.Option("--ro", help="Refuse every tool that writes (READ_ONLY).")
    ] = False,
    http: Annotated[
        str | None,
        typer.Option(
            "--http",
            metavar="HOST:PORT",
            help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio (port 0: any).",
        ),
    ] = None,
    token: TokenOpt = None,
    tenant: TenantOpt = None,
) -> None:
    """Serve the record's agent tools, and its collections as resources, over MCP (stdio, or
    streamable HTTP with --http). Logs go to standard error; in stdio mode standard output
    carries nothing but the protocol."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        _fail("crdtstore mcp needs the MCP SDK: pip install 'crdtstore[mcp]'")
    url = _url(store, must_exist=False)
    who = _agent(url, agent)
    sock = _bind(http) if http is not None else None
    try:
        anyio.run(_serve_mcp, url, run, who, source, view, read_only, sock, tenant, token)
    except CrdtStoreError as exc:
        _fail(str(exc))
    finally:
        if sock is not None:
            sock.close()


def register(app: typer.Typer) -> None:
    """Add these commands to the ``crdtstore`` app."""
    app.command("get")(get_command)
    app.command("put")(put_command)
    app.command("append")(append_command)
    app.command("edit")(edit_command)
    app.command("changes")(changes_command)
    app.command("claim")(claim_command)
    app.command("mcp")(mcp_command)
