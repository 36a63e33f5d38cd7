"""``crdtstore flow``: run a workflow spec over a run's record, and show its state.

::

    crdtstore flow run SPEC --store URL --run R [--allow-changed] [--lease-ttl S] [--json]
    crdtstore flow status --store URL --run R [--json] [--watch]

``run`` runs or resumes the workflow (steps recorded ``done`` are not run again) and exits 0
when it is done, 1 when a step failed (the error is printed), 2 when it could not start (a
bad spec, a changed spec without ``--allow-changed``, another kernel on the run). SIGTERM and
SIGINT stop it cleanly: running steps are recorded ``cancelled`` and their leases released
(a ``kill -9`` leaves them ``running``: the next ``run`` retries them as a new attempt).

``status`` prints the tree of steps with state, attempt, duration and result or error; a
``waiting_on_lock`` step shows its files and who is ahead of it. ``--watch`` redraws it as
the record changes until the run ends.

The lead registers :data:`flow_app` in ``cli.py``: ``app.add_typer(flow_app, name="flow")``.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Annotated, Any

import anyio
import typer
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text
from rich.tree import Tree

from ._errors import CrdtStoreError
from ._store import open_store
from .flow import FlowStatus, SpecChanged, SpecInvalid, StepFailed, load_spec, run_workflow
from .flow._errors import KernelBusy
from .flow._status import READER_AGENT, status_of

flow_app = typer.Typer(
    name="flow",
    help="Run workflow specs over a run's record, and show their state.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_FAILED = 1
EXIT_NOT_STARTED = 2

StoreOpt = Annotated[
    str, typer.Option("--store", help="Store URL (sqlite:///path/store.db) or a SQLite file path.")
]
RunOpt = Annotated[str, typer.Option("--run", "-r", help="The run whose record holds the state.")]
TenantOpt = Annotated[str, typer.Option("--tenant", help="Tenant of the run.")]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar="CRDTSTORE_TOKEN", help="Access token (ws:// stores)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]

_STYLE = {
    "pending": "dim",
    "waiting_on_lock": "yellow",
    "running": "cyan",
    "done": "green",
    "failed": "red",
    "cancelled": "magenta",
}


def _url(store: str) -> str:
    return store if "://" in store else f"sqlite:///{store}"


def _err(console: Console, message: str) -> None:
    console.print(Text.assemble(("error: ", "bold red"), message))


def _seconds(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def render(status: FlowStatus) -> Group:
    """The status as a rich renderable: a header line and the tree of steps."""
    run = status.run
    if run is None:
        head = Text(f"run {status.run_id}: no workflow has run here yet", style="dim")
    else:
        head = Text.assemble(
            (f"{run.name}", "bold"), f" (run {status.run_id}, spec {run.spec_hash}) ",
            (run.state, _STYLE.get(run.state, "")),
            f"  kernel starts {run.starts}, last {run.kernel}",
        )  # fmt: skip
    tree = Tree(head)
    nodes: dict[str, Tree] = {}
    now = time.time()
    for s in status.steps:
        e = s.entry
        line = Text.assemble(
            (e.path.rsplit("/", 1)[-1], "bold"), f" [{e.kind}"
            + (f" {e.join}" if e.join else "") + "] ",
            (e.state, _STYLE.get(e.state, "")),
        )  # fmt: skip
        if e.attempt:
            line.append(f" attempt {e.attempt}")
        took = e.duration if e.ended else (now - e.started if e.started else None)
        if took is not None and e.state != "pending":
            line.append(f" {_seconds(took)}")
        if e.lease is not None:
            line.append(f" lease token {e.lease.token}")
        if e.state == "waiting_on_lock" and e.waiting is not None:
            ahead = s.ahead if s.ahead is not None else e.waiting.ahead
            who = ", ".join(
                a.owner + (f" {a.key[0]}#{a.key[1]}" if a.key else "") + f" ({a.state})"
                for a in ahead
            )  # fmt: skip
            line.append(f" files {', '.join(e.waiting.files)}; ahead: {who or '-'}", "yellow")
        if e.state == "done" and e.kind == "script" and isinstance(e.result, dict):
            last = str(e.result.get("stdout") or "").rsplit("\n", 1)[-1]
            tail = f": {last[:60]}" if last else ""
            line.append(f"  → exit {e.result.get('exit_code')}{tail}", "dim")
        elif e.state == "done" and e.kind in ("python", "agent"):
            line.append(f"  → {_short(e.result)}", "dim")
        if e.state == "failed" and e.error is not None:
            inner = e.error.get("error") if isinstance(e.error.get("error"), dict) else None
            code = (inner or e.error).get("code")  # the cause (EXIT_STATUS, ...) if known
            why = e.error.get("reason") or e.error.get("message")
            line.append(f"  {code}: {_short(why, 80)}", "red")
        parent = nodes.get(e.parent)
        nodes[e.path] = (parent or tree).add(line)
    return Group(tree)


# -- run ----------------------------------------------------------------------------------------


async def _run(
    spec: str, url: str, run: str, tenant: str, token: str | None, allow_changed: bool,
    lease_ttl: float,
) -> Any:  # fmt: skip
    wf = load_spec(spec)
    got: dict[str, Any] = {}
    async with (
        open_store(url, tenant=tenant, token=token) as store,
        anyio.create_task_group() as tg,
    ):

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()  # steps recorded cancelled, leases released
                    return

        async def kernel() -> None:
            try:
                got["result"] = await run_workflow(
                    store, wf, run, allow_changed=allow_changed, lease_ttl=lease_ttl, token=token
                )
            except CrdtStoreError as exc:  # raised below, outside the task group
                got["error"] = exc
            finally:
                tg.cancel_scope.cancel()

        tg.start_soon(stop_on_signal)
        tg.start_soon(kernel)
    if "error" in got:
        raise got["error"]
    return got.get("result")


@flow_app.command("run")
def run_command(
    spec: Annotated[str, typer.Argument(metavar="SPEC", help="The workflow spec (YAML or JSON).")],
    store: StoreOpt,
    run: RunOpt,
    allow_changed: Annotated[
        bool, typer.Option("--allow-changed", help="Resume even if the spec changed.")
    ] = False,
    lease_ttl: Annotated[
        float, typer.Option("--lease-ttl", help="TTL of the steps' leases, seconds.")
    ] = 30.0,
    tenant: TenantOpt = "default",
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Run (or resume) the workflow SPEC over the record of run R."""
    err = Console(stderr=True, highlight=False)
    try:
        result = anyio.run(_run, spec, _url(store), run, tenant, token, allow_changed, lease_ttl)
    except (SpecInvalid, SpecChanged, KernelBusy) as exc:
        _err(err, str(exc))
        if json_out:
            typer.echo(json.dumps({"run": run, "state": "not_started", "error": exc.to_dict()}))
        raise typer.Exit(EXIT_NOT_STARTED) from None
    except StepFailed as exc:
        _err(err, str(exc))
        if json_out:
            typer.echo(json.dumps({"run": run, "state": "failed", "error": exc.to_dict()}))
        raise typer.Exit(EXIT_FAILED) from None
    except CrdtStoreError as exc:
        _err(err, str(exc))
        raise typer.Exit(EXIT_FAILED) from None
    if result is None:  # cancelled by a signal
        raise typer.Exit(130)
    if json_out:
        typer.echo(json.dumps({"run": run, "state": "done", "result": result}))
    else:
        Console(highlight=False).print(Text.assemble((f"run {run}: ", "bold"), ("done", "green")))


# -- status -------------------------------------------------------------------------------------


async def _status(url: str, run: str, tenant: str, token: str | None) -> FlowStatus:
    async with (
        open_store(url, tenant=tenant, token=token) as store,
        store.open_record(run, READER_AGENT, "system", create=False) as rec,
    ):
        return status_of(rec, await _leases(store))


async def _leases(store: Any) -> Any:
    try:
        return await store.leases.status()
    except CrdtStoreError:
        return None


async def _watch(url: str, run: str, tenant: str, token: str | None, console: Console) -> None:
    async with (
        open_store(url, tenant=tenant, token=token) as store,
        store.open_record(run, READER_AGENT, "system", create=False) as rec,
    ):
        changes = rec.changes(local=False)
        with Live(console=console, auto_refresh=False) as live:
            while True:
                status = status_of(rec, await _leases(store))
                live.update(render(status), refresh=True)
                if status.run is not None and status.run.state != "running":
                    return
                # redraw on the next change, or every second (durations, the lease queue)
                with anyio.move_on_after(1.0):
                    await changes.__anext__()


@flow_app.command("status")
def status_command(
    store: StoreOpt,
    run: RunOpt,
    json_out: JsonOpt = False,
    watch: Annotated[bool, typer.Option("--watch", help="Redraw until the run ends.")] = False,
    tenant: TenantOpt = "default",
    token: TokenOpt = None,
) -> None:
    """Show the steps of run R: state, attempt, duration, result or error, lock waits."""
    console = Console(highlight=False)
    try:
        if watch and not json_out:
            anyio.run(_watch, _url(store), run, tenant, token, console)
            return
        status = anyio.run(_status, _url(store), run, tenant, token)
    except CrdtStoreError as exc:
        _err(Console(stderr=True, highlight=False), str(exc))
        raise typer.Exit(EXIT_FAILED) from None
    if json_out:
        typer.echo(json.dumps(status.to_json_dict(), indent=2))
    else:
        console.print(render(status))
