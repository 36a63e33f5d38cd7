"""The inspection commands: ``journal`` (the runs, or one run's entries), ``inspect`` (a
run's record as a tree), ``history`` (every value a map key had, and who wrote it) and
``compact`` (snapshot a run, optionally drop the journal it covers).

They use only the public API. ``cli.py`` registers them on the ``crdtstore`` app.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from . import HistoryEntry, JournalEntry, RunInfo, open_store
from ._cli_common import (
    CLI_AGENT,
    JsonOpt,
    TenantOpt,
    UrlArg,
    _clock,
    _days_caption,
    _fixed_but,
    _line,
    _run_async,
    _short,
    _store_url,
    _when,
    console,
    err_console,
)
from ._cli_render import _entry_json, effect_summary, record_json, record_tree

# -- journal ------------------------------------------------------------------------------------


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

    async def go() -> dict[str, Any] | Tree:
        async with open_store(store_url, tenant=tenant) as store:
            info = await store.run_info(run)
            async with store.open_record(run, CLI_AGENT, "user", create=False) as rec:
                if as_json:  # (only what is printed: reading the record is most of the time)
                    return record_json(rec, info)
                title = (
                    f"run {run!r} of tenant {tenant!r}: journal head {info.head}, "
                    f"snapshot at {info.snapshot_seq}"
                )
                return record_tree(rec, title, max_items)

    shown = _run_async(go)
    if isinstance(shown, dict):
        typer.echo(json.dumps(shown, ensure_ascii=False))
    else:
        console.print(shown)


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
