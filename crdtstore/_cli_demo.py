"""``crdtstore demo``: start agent processes on one store, show the merged record, and check
that every write an agent reported is in it (its current value, or a key's history).

The agents are real processes (``crdtstore._demo``) that talk to this one over pipes; the
barrier starts them together so their writes contend. ``cli.py`` registers the command.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from subprocess import PIPE
from typing import Annotated, Any

import anyio
import typer
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
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

from . import JournalEntry, Record, _demo, open_store
from ._cli_common import (
    _all_entries,
    _fail,
    _fixed_but,
    _line,
    _path_url,
    _run_async,
    _short,
    console,
)
from ._cli_render import record_tree

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


DEMO_HELP = (
    "Run agent processes on one store, show the merged record, check that nothing was lost."
    "\n\n"
    "Each agent appends findings to a list, sets its own keys in a map, overwrites a few keys "
    "that every agent writes, and inserts lines into one shared text. A write is reported only "
    "once it is in the journal; afterwards every reported write must be in the record: the "
    "current value, or, for a key that another agent overwrote, in the key's history. "
    "The exit status is 1 if anything was lost."
)


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
