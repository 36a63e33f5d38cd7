"""The ``crdtstore`` command: a multi-process demo, and tools to look into a store.

::

    crdtstore demo [--agents 4] [--writes 50] [--store demo-store/store.db] [--run NAME]
    crdtstore journal URL [--run R] [--json] [--after N] [--limit N]
    crdtstore inspect URL --run R [--json]
    crdtstore history URL --run R --collection C --key K [--json]
    crdtstore compact URL --run R [--drop-journal]
    crdtstore token --tenant T --run R --agent A [--rw | --ro] [--ttl SECONDS]
    crdtstore token revoke --jti ID (--store URL | --revoked-file F)
    crdtstore serve --store URL [--host H] [--port P] [--secret-file F] [--revoked-file F]
                    [--journal-window SECONDS]

``URL`` is a store URL (``sqlite:///path/store.db``) or simply the path of a SQLite store file.
Only the public API is used here.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from subprocess import PIPE
from typing import Annotated, Any, TypeVar

import anyio
import typer
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from . import (
    CrdtStoreError,
    HistoryEntry,
    JournalEntry,
    Record,
    RunInfo,
    Store,
    _demo,
    open_store,
)
from ._cli_flow import flow_app
from ._cli_leases import leases_command
from ._cli_plugins import CommandGroup
from ._cli_tools import register as register_tool_commands

T = TypeVar("T")


app = typer.Typer(
    name="crdtstore",
    cls=CommandGroup,  # + the commands of crdtstore.commands entry points (sync: serve, token)
    help="One shared, journaled CRDT working record per run, for concurrent AI agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

CLI_AGENT = "crdtstore-cli"  # the agent name the read-only commands open records as

UrlArg = Annotated[
    str,
    typer.Argument(
        metavar="URL",
        help="Store URL (sqlite:///path/store.db, sqlite:////abs/store.db) or the path of a "
        "SQLite store file.",
    ),
]
TenantOpt = Annotated[str, typer.Option("--tenant", help="Tenant of the run.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def main() -> None:
    """Entry point of the ``crdtstore`` console script."""
    app()


app.command("leases")(leases_command)
app.add_typer(flow_app, name="flow")  # flow run, flow status
register_tool_commands(app)  # get, put, append, edit, changes, claim, mcp


# -- helpers ------------------------------------------------------------------------------------


def _fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(Text.assemble(("error: ", "bold red"), message))
    return typer.Exit(code)


def _path_url(path: Path) -> str:
    return f"sqlite:///{path.expanduser().resolve()}"


def _store_url(target: str) -> str:
    """The URL of an existing store, given its URL or the path of its SQLite file. (Opening a
    SQLite store creates its file; a typo should not create an empty store.)"""
    url = target if "://" in target else _path_url(Path(target))
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :].split("?", 1)[0])
        if not path.is_file():
            raise _fail(f"no store at {path}")
    return url


def _run_async(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run ``fn(*args)`` on an event loop; crdtstore errors become a message and exit 1."""
    try:
        return anyio.run(fn, *args)
    except CrdtStoreError as exc:
        raise _fail(str(exc)) from None


def _when(wall_time: float) -> str:
    return datetime.fromtimestamp(wall_time).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= width else text[: width - 1] + "…"


def _clock(wall_time: float) -> str:
    return datetime.fromtimestamp(wall_time).strftime("%H:%M:%S.%f")[:-3]


def _days_caption(wall_times: list[float]) -> str | None:
    """The caption "times are local, on DAY (to DAY)" of a table of clock times; None if empty."""
    days = sorted({datetime.fromtimestamp(t).date().isoformat() for t in wall_times})
    return f"times are local, on {' to '.join(days[:: max(len(days) - 1, 1)])}" if days else None


def _op_summary(op: list[Any]) -> str:
    kind, name, what = op[0], op[1], op[2]
    if kind == "map":
        return (
            f"{name}[{op[3]!r}] = {_short(op[4], 40)}"
            if what == "set"
            else (f"del {name}[{op[3]!r}]")
        )
    if kind == "list":
        if what == "ins":
            return f"{name} +{len(op[4])} item{'s' if len(op[4]) != 1 else ''} @{op[3]}"
        return f"{name} -{op[4]} item{'s' if op[4] != 1 else ''} @{op[3]}"
    if kind == "text":
        if what == "ins":
            return f"{name} +{len(op[4])} chars @{op[3]}"
        return f"{name} -{op[4]} chars @{op[3]}"
    return _short(op, 40)  # pragma: no cover - an effect of a newer version


def effect_summary(effect: list[list[Any]], width: int = 120) -> str:
    """A one-line human summary of a journal entry's effect."""
    if not effect:
        return "(raw update)"
    text = "; ".join(_op_summary(op) for op in effect)
    return text if len(text) <= width else text[: width - 1] + "…"


def _entry_json(e: JournalEntry) -> dict[str, Any]:
    return {
        "seq": e.seq,
        "agent": e.agent,
        "source": e.source,
        "client_id": e.client_id,
        "wall_time": e.wall_time,
        "size": e.size,
        "effect": e.effect,
        "summary": effect_summary(e.effect),
        "call": e.call or None,
    }


async def _all_entries(store: Store, run: str) -> list[JournalEntry]:
    out: list[JournalEntry] = []
    while True:
        page = await store.journal(run, after=out[-1].seq if out else 0, limit=1000)
        if not page:
            return out
        out.extend(page)


def record_json(rec: Record, info: RunInfo) -> dict[str, Any]:
    """The record as JSON: every collection, with the provenance of every map key."""
    collections: dict[str, Any] = {}
    agents: set[str] = set()
    for name, kind in rec.collections().items():
        if kind == "map":
            m = rec.map(name)
            entries: dict[str, Any] = {}
            for key, value in sorted(m.items()):
                prov = m.provenance(key)
                if prov is not None:
                    agents.add(prov.agent)
                entries[key] = {
                    "value": value,
                    "provenance": None if prov is None else prov.model_dump(exclude={"run"}),
                }
            collections[name] = {"kind": kind, "entries": entries}
        elif kind == "list":
            collections[name] = {"kind": kind, "items": rec.list(name).to_list()}
        else:
            collections[name] = {"kind": kind, "text": rec.text(name).read()}
    return {
        "tenant": info.tenant,
        "run": info.run,
        "head": info.head,
        "snapshot_seq": info.snapshot_seq,
        "applied_seq": rec.applied_seq,
        "agents": sorted(agents),
        "collections": collections,
    }


def _line(*parts: str | tuple[str, str]) -> Text:
    text = Text.assemble(*parts)
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


def _fixed_but(table: Table, flexible: int) -> None:
    """Keep every column of ``table`` on one line; only column ``flexible`` shrinks (its
    cells are cut with an ellipsis, see :func:`_line`)."""
    for i, column in enumerate(table.columns):
        column.no_wrap = i != flexible


def _map_table(rec: Record, name: str, keys: list[str]) -> Table:
    m = rec.map(name)
    table = Table(
        "key",
        "value",
        "written by",
        "seq",
        "at",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        header_style="dim",
    )
    _fixed_but(table, 1)
    for key in keys:
        prov = m.provenance(key)
        table.add_row(
            Text(key, style="green"),
            _line(_short(m[key], 200)),
            "?" if prov is None else f"{prov.agent} ({prov.source})",
            "-" if prov is None or prov.seq is None else str(prov.seq),
            "-" if prov is None else _clock(prov.wall_time),
        )
    return table


def record_tree(rec: Record, title: str, max_items: int = 20) -> Tree:
    """The record as a rich tree: collections, values, and who wrote each map value."""
    tree = Tree(Text(title, style="bold"))

    def more(node: Tree, shown: int, total: int, what: str) -> None:
        if total > shown:
            node.add(Text(f"… {total - shown} more {what}", style="dim"))

    limit = max_items if max_items > 0 else None
    for name, kind in rec.collections().items():
        if kind == "map":
            keys = sorted(rec.map(name).keys())
            node = tree.add(Text.assemble((name, "bold cyan"), f"  map, {len(keys)} keys"))
            if keys:
                node.add(_map_table(rec, name, keys[:limit]))
            more(node, len(keys[:limit]), len(keys), "keys")
        elif kind == "list":
            items = rec.list(name).to_list()
            node = tree.add(Text.assemble((name, "bold cyan"), f"  list, {len(items)} items"))
            for i, item in enumerate(items[:limit]):
                node.add(_line((f"[{i}] ", "dim"), _short(item, 200)))
            more(node, len(items[:limit]), len(items), "items")
        else:
            lines = rec.text(name).read().splitlines()
            node = tree.add(Text.assemble((name, "bold cyan"), f"  text, {len(lines)} lines"))
            for line in lines[:limit]:
                node.add(_line(line))
            more(node, len(lines[:limit]), len(lines), "lines")
    return tree


# -- journal ------------------------------------------------------------------------------------


@app.command()
def journal(
    url: UrlArg,
    run: Annotated[
        str | None, typer.Option("--run", "-r", help="The run (omitted: list the runs).")
    ] = None,
    as_json: JsonOpt = False,
    after: Annotated[int, typer.Option(min=0, help="Start after this journal position.")] = 0,
    limit: Annotated[int, typer.Option(min=1, help="At most this many entries.")] = 1000,
    tenant: TenantOpt = "default",
) -> None:
    """List a run's journal entries: position, agent, source, time, size and effect.

    Without --run, list the runs of the store.
    """
    store_url = _store_url(url)

    async def go() -> tuple[RunInfo | None, list[RunInfo], list[JournalEntry]]:
        async with open_store(store_url, tenant=tenant) as store:
            if run is None:
                return None, await store.runs(), []
            info = await store.run_info(run)
            return info, [], await store.journal(run, after=after, limit=limit)

    info, runs, entries = _run_async(go)
    if info is None:
        if as_json:
            typer.echo(json.dumps([r.model_dump() for r in runs]))
            return
        table = Table("run", "entries (head)", "snapshot at", "created", title=f"Runs of {url}")
        for r in runs:
            table.add_row(r.run, str(r.head), str(r.snapshot_seq), _when(r.created))
        console.print(table)
        return
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "tenant": info.tenant,
                    "run": info.run,
                    "head": info.head,
                    "snapshot_seq": info.snapshot_seq,
                    "after": after,
                    "entries": [_entry_json(e) for e in entries],
                },
                ensure_ascii=False,
            )
        )
        return
    table = Table(
        "seq",
        "agent",
        "source",
        "time",
        "size",
        "effect",
        title=f"Journal of run {info.run!r} (head {info.head}, snapshot at {info.snapshot_seq})",
        caption=_days_caption([e.wall_time for e in entries]),
    )
    _fixed_but(table, 5)
    for e in entries:
        table.add_row(
            str(e.seq),
            e.agent,
            e.source,
            _clock(e.wall_time),
            f"{e.size} B",
            _line(effect_summary(e.effect)),
        )
    console.print(table)
    if not entries and info.snapshot_seq >= after and info.head > after:
        console.print(
            Text(
                f"entries up to {info.snapshot_seq} were compacted away "
                "(--drop-journal); the snapshot holds them",
                style="dim",
            )
        )
    if entries and entries[-1].seq < info.head:
        console.print(Text(f"more: --after {entries[-1].seq}", style="dim"))


# -- inspect ------------------------------------------------------------------------------------


@app.command()
def inspect(
    url: UrlArg,
    run: Annotated[str, typer.Option("--run", "-r", help="The run to show.")],
    as_json: JsonOpt = False,
    max_items: Annotated[
        int,
        typer.Option(
            min=0,
            help="Show at most this many keys/items/lines per collection (0: all). JSON shows all.",
        ),
    ] = 20,
    tenant: TenantOpt = "default",
) -> None:
    """Print a run's record as a tree, with the provenance of every map key."""
    store_url = _store_url(url)

    async def go() -> tuple[dict[str, Any], Tree]:
        async with open_store(store_url, tenant=tenant) as store:
            info = await store.run_info(run)
            async with store.open_record(run, CLI_AGENT, "user", create=False) as rec:
                title = (
                    f"run {run!r} of tenant {tenant!r}: journal head {info.head}, "
                    f"snapshot at {info.snapshot_seq}"
                )
                return record_json(rec, info), record_tree(rec, title, max_items)

    data, tree = _run_async(go)
    if as_json:
        typer.echo(json.dumps(data, ensure_ascii=False))
    else:
        console.print(tree)


# -- history ------------------------------------------------------------------------------------


def _history_json(h: HistoryEntry) -> dict[str, Any]:
    p = h.provenance
    return {
        "seq": p.seq,
        "wall_time": p.wall_time,
        "agent": p.agent,
        "source": p.source,
        "run": p.run,
        "value": h.value,
        "deleted": h.deleted,
        "redacted": h.redacted,
        "call": p.call,
    }


def _call_cell(call: str | None, width: int = 40) -> Text:
    # (a Text: a call id is the writer's string, never console markup)
    if not call:
        return Text("-")
    return Text(call if len(call) <= width else call[: width - 1] + "…", no_wrap=True)


def _history_value(h: HistoryEntry) -> Text:
    if h.redacted:
        return Text("redacted", style="magenta")
    if h.deleted:
        return Text("deleted", style="red")
    return _line(_short(h.value, 200))


@app.command()
def history(
    url: UrlArg,
    run: Annotated[str, typer.Option("--run", "-r", help="The run whose journal to read.")],
    collection: Annotated[
        str, typer.Option("--collection", "-c", help="The map collection holding the key.")
    ],
    key: Annotated[str, typer.Option("--key", "-k", help="The map key.")],
    as_json: JsonOpt = False,
    tenant: TenantOpt = "default",
) -> None:
    """List every journaled write to one map key, oldest first: position, time, agent,
    source, run, tool-call id (when any write has one) and the value written (or
    deleted/redacted)."""
    store_url = _store_url(url)

    async def go() -> tuple[RunInfo, list[HistoryEntry]]:
        async with open_store(store_url, tenant=tenant) as store:
            info = await store.run_info(run)
            return info, await store.history(run, collection, key)

    info, entries = _run_async(go)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "tenant": info.tenant,
                    "run": info.run,
                    "collection": collection,
                    "key": key,
                    "head": info.head,
                    "snapshot_seq": info.snapshot_seq,
                    "entries": [_history_json(h) for h in entries],
                },
                ensure_ascii=False,
            )
        )
        return
    if not entries:
        dropped = (
            "; entries compacted away with --drop-journal are not in the history"
            if info.snapshot_seq > 0
            else ""
        )
        console.print(
            Text(f"no journaled writes to {collection}[{key!r}] in run {info.run!r}{dropped}"),
            soft_wrap=True,
        )
        return
    n_agents = len({h.provenance.agent for h in entries})
    calls = any(h.provenance.call for h in entries)
    table = Table(
        "seq",
        "time",
        "agent",
        "source",
        "run",
        *(["call"] if calls else []),
        "value",
        title=f"History of {collection}[{key!r}] in run {info.run!r} "
        f"({len(entries)} write{'s' if len(entries) != 1 else ''} "
        f"by {n_agents} agent{'s' if n_agents != 1 else ''})",
        caption=_days_caption([h.provenance.wall_time for h in entries]),
    )
    _fixed_but(table, 6 if calls else 5)
    for h in entries:
        p = h.provenance
        table.add_row(
            "-" if p.seq is None else str(p.seq),
            _clock(p.wall_time),
            p.agent,
            p.source,
            p.run,
            *([_call_cell(p.call)] if calls else []),
            _history_value(h),
        )
    console.print(table)


# -- compact ------------------------------------------------------------------------------------


@app.command()
def compact(
    url: UrlArg,
    run: Annotated[str, typer.Option("--run", "-r", help="The run to compact.")],
    drop_journal: Annotated[
        bool,
        typer.Option(
            "--drop-journal",
            help="Also delete the journal entries the snapshot covers (they are the audit trail).",
        ),
    ] = False,
    as_json: JsonOpt = False,
    tenant: TenantOpt = "default",
) -> None:
    """Merge a run's journal into a snapshot, so that opening the run reads less."""
    store_url = _store_url(url)

    async def go() -> Any:
        async with open_store(store_url, tenant=tenant) as store:
            info = await store.run_info(run)
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=err_console if as_json else console,
                transient=as_json,
            ) as progress:
                task = progress.add_task(
                    f"compacting {run}", total=max(info.head, 1), completed=info.snapshot_seq
                )

                def step(seq: int, target: int) -> None:
                    progress.update(task, completed=seq, total=max(target, 1))

                result = await store.compact(run, drop_journal=drop_journal, progress=step)
                progress.update(task, completed=max(result.seq, 1), total=max(result.seq, 1))
            return result

    result = _run_async(go)
    if as_json:
        typer.echo(result.model_dump_json())
        return
    dropped = "; journal entries dropped" if result.journal_dropped else ""
    console.print(
        f"compacted run {result.run!r}: snapshot at position {result.seq} "
        f"({result.entries} entries merged, {result.snapshot_bytes} bytes){dropped} "
        f"in {result.seconds:.2f} s"
    )


# -- demo ---------------------------------------------------------------------------------------


class DurabilityMode(StrEnum):
    durable = "durable"
    batched = "batched"


@dataclass
class _Agent:
    name: str
    task: TaskID
    writes: int = 0
    acks: int = 0
    digest: str | None = None
    returncode: int | None = None
    stderr: bytearray = field(default_factory=bytearray)
    arrived: set[str] = field(default_factory=set)
    proc: Process | None = None


class _Barrier:
    """Released once every agent arrived (a dead agent counts as arrived)."""

    def __init__(self, name: str, n: int) -> None:
        self.name = name
        self.left = n
        self.event = anyio.Event()

    def arrive(self, agent: _Agent) -> None:
        if self.name not in agent.arrived:
            agent.arrived.add(self.name)
            self.left -= 1
            if self.left <= 0:
                self.event.set()


async def _send(agent: _Agent, data: bytes, *, close: bool = False) -> None:
    proc = agent.proc
    if proc is None or proc.stdin is None:
        return
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await proc.stdin.send(data)
        if close:
            await proc.stdin.aclose()


async def _run_agents(
    url: str,
    run: str,
    names: list[str],
    writes: int,
    durability: str,
    limit: float,
    progress: Progress,
    acks: list[dict[str, Any]],
) -> list[_Agent]:
    """Start the agent processes, release them together, collect their acknowledgements."""
    agents = [
        _Agent(name, progress.add_task(name, total=writes, status="starting")) for name in names
    ]
    ready = _Barrier("ready", len(agents))
    written = _Barrier("written", len(agents))

    def show(agent: _Agent, state: str) -> None:
        progress.update(agent.task, completed=agent.writes, status=state)

    async def drive(agent: _Agent) -> None:
        cmd = [
            sys.executable,
            "-m",
            "crdtstore._demo",
            "--store",
            url,
            "--run",
            run,
            "--agent",
            agent.name,
            "--writes",
            str(writes),
            "--durability",
            durability,
        ]
        async with await anyio.open_process(cmd, stdin=PIPE, stdout=PIPE, stderr=PIPE) as proc:
            agent.proc = proc
            assert proc.stdout is not None
            assert proc.stderr is not None
            stderr = proc.stderr

            async def drain_stderr() -> None:
                async for chunk in stderr:
                    agent.stderr.extend(chunk)
                    del agent.stderr[:-8192]

            async with anyio.create_task_group() as tg:
                tg.start_soon(drain_stderr)
                lines = BufferedByteReceiveStream(proc.stdout)
                while True:
                    try:
                        line = await lines.receive_until(b"\n", 1 << 20)
                    except (anyio.EndOfStream, anyio.IncompleteRead):
                        break
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        msg = None
                    if not isinstance(msg, dict):  # not ours: keep it with the diagnostics
                        agent.stderr.extend(line + b"\n")
                        continue
                    if msg["type"] == "ready":
                        show(agent, "ready")
                        ready.arrive(agent)
                    elif msg["type"] == "ack":
                        acks.append(msg)
                        agent.acks += 1
                        agent.writes = max(agent.writes, msg["write"])
                        show(agent, "writing")
                    elif msg["type"] == "written":
                        show(agent, "written, waiting for the others")
                        written.arrive(agent)
                    elif msg["type"] == "state":
                        agent.digest = msg["digest"]
                        show(agent, "synced")
            ready.arrive(agent)
            written.arrive(agent)
            agent.returncode = await proc.wait()
            show(agent, "done" if agent.returncode == 0 else f"failed ({agent.returncode})")

    async def conduct() -> None:
        await ready.event.wait()
        for agent in agents:
            await _send(agent, b"go\n")
        await written.event.wait()
        for agent in agents:
            await _send(agent, b"check\n", close=True)

    with anyio.move_on_after(limit) as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(conduct)
            for agent in agents:
                tg.start_soon(drive, agent)
    if scope.cancelled_caught:
        for agent in agents:
            if agent.returncode is None:
                show(agent, "killed (timeout)")
    return agents


def _who_wrote_what(
    rec: Record,
    agents: list[_Agent],
    entries: list[JournalEntry],
    shared_history: dict[str, list[Any]],
) -> Table:
    data = rec.to_dict()
    per_agent = Counter(e.agent for e in entries)
    findings = Counter(f.get("agent") for f in data.get(_demo.FINDINGS, []) if isinstance(f, dict))
    note_lines = str(data.get(_demo.NOTES, "")).splitlines()
    status, shared = rec.map(_demo.STATUS), rec.map(_demo.SHARED)
    table = Table(
        "agent",
        "acked",
        "entries",
        "findings",
        "own keys",
        "shared writes",
        "shared won",
        "notes",
        title="Who wrote what (record contents, provenance, history)",
    )
    for agent in agents:
        a = agent.name
        own = [k for k in status if k.startswith(f"{a}:")]
        own_ok = sum(1 for k in own if (p := status.provenance(k)) is not None and p.agent == a)
        won = sum(
            1 for k in shared_history if (p := shared.provenance(k)) is not None and p.agent == a
        )
        shared_writes = sum(
            1 for hist in shared_history.values() for h in hist if h.provenance.agent == a
        )
        table.add_row(
            a,
            str(agent.acks),
            str(per_agent[a]),
            str(findings[a]),
            f"{own_ok}/{len(own)}",
            str(shared_writes),
            f"{won}/{len(shared_history)}",
            str(sum(1 for line in note_lines if line.startswith(f"- [{a}] "))),
        )
    return table


def _contested(rec: Record, shared_history: dict[str, list[Any]]) -> Table:
    shared = rec.map(_demo.SHARED)
    table = Table(
        "key",
        "current value",
        "last writer",
        "seq",
        "writes kept in history",
        title="Contested keys: every agent wrote them; the last writer wins",
    )
    _fixed_but(table, 1)
    for key, hist in shared_history.items():
        prov = shared.provenance(key)
        table.add_row(
            key,
            _line(_short(shared.get(key), 200)),
            "?" if prov is None else prov.agent,
            "-" if prov is None or prov.seq is None else str(prov.seq),
            f"{len(hist)} by {len({h.provenance.agent for h in hist})} agents",
        )
    return table


def _prog() -> str:
    """How to call this command again: ``crdtstore`` if that is on PATH, else the script's path
    (``.venv/bin/crdtstore`` when run through dev.py)."""
    argv0 = Path(sys.argv[0])
    if argv0.name.startswith("crdtstore"):
        found = shutil.which("crdtstore")
        if found is not None and Path(found).resolve() == argv0.resolve():
            return "crdtstore"
        return _display_path(argv0)
    return f"{Path(sys.executable).name} -m crdtstore.cli"


def _display_path(path: Path) -> str:
    path = path.resolve()
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


async def _run_demo(
    url: str,
    path: Path,
    run: str,
    n_agents: int,
    writes: int,
    durability: str,
    limit: float,
) -> int:
    async with open_store(url) as store:
        store.open_record(run, "demo-checker", "system")  # raises InvalidName for a bad name
        if any(r.run == run for r in await store.runs()):
            raise _fail(f"run {run!r} already exists in {path}; choose another --run", 2)
    console.rule(Text(f"crdtstore demo: {n_agents} agent processes, one SQLite store"))
    console.print(
        f"store  {url}\nrun    {run}\nwrites {writes} per agent ({durability}: "
        "acknowledged only once in the journal)"
    )
    names = [f"agent-{i}" for i in range(1, n_agents + 1)]
    acks: list[dict[str, Any]] = []
    started = time.perf_counter()
    with Progress(
        TextColumn("{task.description:>10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        agents = await _run_agents(url, run, names, writes, durability, limit, progress, acks)
    elapsed = time.perf_counter() - started
    problems: list[str] = []
    for agent in agents:
        if agent.returncode is None:
            problems.append(f"{agent.name} was killed after {limit:.0f} s")
        elif agent.returncode != 0:
            tail = agent.stderr.decode(errors="replace").strip()[-2000:]
            problems.append(f"{agent.name} exited with status {agent.returncode}: {tail}")
    acks_file = path.parent / f"{run}.acks.jsonl"
    with contextlib.suppress(OSError):
        acks_file.write_text("".join(json.dumps(a) + "\n" for a in acks))
    console.print(
        f"{len(acks)} writes acknowledged by {n_agents} processes in {elapsed:.1f} s "
        f"(saved to {acks_file})",
        soft_wrap=True,
    )

    async with open_store(url) as store:
        info = await store.run_info(run)
        async with store.open_record(run, "demo-checker", "system", create=False) as rec:
            console.print(
                record_tree(
                    rec, f"Merged record of run {run!r} (journal head {info.head})", max_items=8
                )
            )
            entries = await _all_entries(store, run)
            shared_history = {
                k: hist for k in _demo.SHARED_KEYS if (hist := await rec.history(_demo.SHARED, k))
            }
            console.print(_contested(rec, shared_history))
            console.print(_who_wrote_what(rec, agents, entries, shared_history))
            result = await _demo.verify(store, rec, acks)
            digest = _demo.record_digest(rec.to_dict())
    diverged = [a.name for a in agents if a.returncode == 0 and a.digest != digest]
    same = sum(1 for a in agents if a.digest == digest)
    if diverged:
        problems.append(f"{', '.join(diverged)} did not converge on the journal's record")
    elif same:
        console.print(
            f"[green]✓[/] converged: {same} agent processes hold the same record as "
            f"a fresh reader (digest {digest})",
            soft_wrap=True,
        )
    if result.replay_matches:
        console.print("[green]✓[/] replaying the journal from scratch rebuilds the same record")
    else:
        problems.append("replaying the journal does not rebuild the record")
    labels = {
        "finding": "findings",
        "own": "own-key values",
        "shared": "shared-key values",
        "note": "note lines",
    }
    counts = ", ".join(f"{n} {labels[kind]}" for kind, n in result.checked.items())
    if result.lost:
        for lost in result.lost[:20]:
            console.print(Text(f"  lost: {lost}", style="red"))
        console.print(
            f"LOST: {len(result.lost)} of {result.total} acknowledged writes are missing",
            style="bold red",
            soft_wrap=True,
        )
    elif problems:
        console.print(
            f"checked {result.total} acknowledged writes ({counts}): none missing", soft_wrap=True
        )
    else:
        console.print(
            f"VERIFIED: all {result.total} acknowledged writes are present ({counts})",
            style="bold green",
            soft_wrap=True,
        )
    for problem in problems:
        console.print(Text(f"FAILED: {problem}", style="bold red"), soft_wrap=True)
    prog, where = _prog(), _display_path(path)
    console.print(
        Text(
            f"explore: {prog} journal {where} --run {run}\n"
            f"         {prog} inspect {where} --run {run}",
            style="dim",
        ),
        soft_wrap=True,
    )
    return 1 if result.lost or problems else 0


_DEMO_HELP = (
    "Run agent processes on one store, show the merged record, check that nothing was lost."
    "\n\n"
    "Each agent appends findings to a list, sets its own keys in a map, overwrites a few keys "
    "that every agent writes, and inserts lines into one shared text. A write is reported only "
    "once it is in the journal; afterwards every reported write must be in the record: the "
    "current value, or, for a key that another agent overwrote, in the key's history. "
    "The exit status is 1 if anything was lost."
)


@app.command(help=_DEMO_HELP)
def demo(
    agents: Annotated[
        int, typer.Option("--agents", "-n", min=1, max=64, help="Agent processes to start.")
    ] = 4,
    writes: Annotated[
        int, typer.Option("--writes", "-w", min=1, max=100_000, help="Writes per agent.")
    ] = 50,
    store: Annotated[
        Path, typer.Option("--store", help="SQLite store file, or a folder to keep store.db in.")
    ] = Path("demo-store/store.db"),
    run: Annotated[
        str | None, typer.Option("--run", help="Run name (default: a new demo-... name).")
    ] = None,
    durability: Annotated[
        DurabilityMode,
        typer.Option(
            help="durable: each write returns once committed with synchronous=FULL; "
            "batched: writes return at once and the agent flushes before "
            "acknowledging."
        ),
    ] = DurabilityMode.durable,
    timeout: Annotated[float, typer.Option(hidden=True)] = 300.0,
) -> None:
    """Run agent processes on one store, show the merged record, check that nothing was lost."""
    if store.is_dir() or (not store.exists() and not store.suffix):
        store = store / "store.db"  # a folder: the store file inside it
    path = store
    path = path.expanduser().resolve()
    name = run or f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    code = _run_async(
        _run_demo, _path_url(path), path, name, agents, writes, durability.value, timeout
    )
    raise typer.Exit(code)


if __name__ == "__main__":
    main()
