"""``crdtstore leases --store URL [--json]``: who holds what, who waits, in rank order.

The lead registers :func:`leases_command` in ``cli.py``::

    app.command("leases")(leases_command)
"""

from __future__ import annotations

import json as jsonlib
from typing import Annotated

import anyio
import typer
from rich import box
from rich.console import Console
from rich.table import Table

from ._leases import LeaseStatus
from ._store import open_store


async def _status(store: str, tenant: str) -> LeaseStatus:
    async with open_store(store, tenant=tenant) as s:
        return await s.leases.status()


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def render(status: LeaseStatus, console: Console) -> None:
    """Print holders and waiters as one table, in rank order."""
    table = Table(box=box.SIMPLE_HEAD, title="leases")
    for col in ("rank", "state", "owner", "resources", "token", "age", "held", "expires in",
                "pid", "waits behind"):  # fmt: skip
        table.add_column(col, justify="right" if col in ("rank", "token", "pid") else "left")
    for i in sorted((*status.holders, *status.waiters), key=lambda i: i.rank):
        table.add_row(
            str(i.rank),
            "[green]granted[/]" if i.state == "granted" else "[yellow]waiting_on_lock[/]",
            i.owner + (f" {i.key[0]}#{i.key[1]}" if i.key else ""),
            "\n".join(i.resources),
            "-" if i.token is None else str(i.token),
            _age(i.age),
            _age(i.held_for),
            _age(i.expires_in) if i.expires_in > 0 else "[red]overdue[/]",
            "-" if i.pid is None else str(i.pid),
            ", ".join(str(r) for r in i.blocked_by) or "-",
        )
    console.print(table)
    console.print(f"{len(status.holders)} holding, {len(status.waiters)} waiting")


def leases_command(
    store: Annotated[str, typer.Option("--store", help="store URL, e.g. sqlite:///store.db")],
    json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
    tenant: Annotated[str, typer.Option(help="tenant")] = "default",
) -> None:
    """Show lease holders and waiters (ranks, resources, tokens, ages) of a store."""
    status = anyio.run(_status, store, tenant)
    if json:
        typer.echo(jsonlib.dumps(status.to_json_dict(), indent=2))
    else:
        render(status, Console())
