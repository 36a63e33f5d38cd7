"""What every ``crdtstore`` command shares: the consoles, the URL/tenant/JSON options, turning
a path into a store URL, running a coroutine with crdtstore errors as a message and exit 1, and
the small text helpers the tables use.

Split out of ``cli.py`` so the command modules (``_cli_inspect``, ``_cli_demo``) import it
without importing the ``app`` that registers them.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import CrdtStoreError, JournalEntry, Store

T = TypeVar("T")


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


async def _all_entries(store: Store, run: str) -> list[JournalEntry]:
    out: list[JournalEntry] = []
    while True:
        page = await store.journal(run, after=out[-1].seq if out else 0, limit=1000)
        if not page:
            return out
        out.extend(page)
