"""An agent process writing through the hub, for tests/network/test_sync_processes.py.

Run as ``python tests/_hub_agent_proc.py COMMAND URL RUN AGENT --token T [options]``, where
``URL`` is the hub and tenant (``ws://127.0.0.1:PORT/<tenant>``) and ``AGENT`` the token's
agent (the record's identity comes from the token; the process checks that it is ``AGENT``).
The process talks to the test through stdout, one line per event, flushed at once:

- ``READY`` once the record is open and synced with the hub;
- ``WROTE i`` (``stream``) every ``--report`` writes: ``m["AGENT:0..i"]`` are written (locally);
- ``FLUSHED i ms`` (``stream``) after ``flush()`` returned (in ``ms`` milliseconds) with
  ``m["AGENT:0..i"]`` written before it was called: the hub journaled every one of them;
- ``ERROR what: message`` (``stream``) when a write or a flush raised ``BackendError`` (it
  is retried; a working provider never raises it for a lost connection);
- ``DONE n`` (``stream``) once writing stopped after ``n`` entries and they are flushed;
- ``OK {json}`` when the command's goal was reached: every expected agent's entries are here.

Both commands write ``m["AGENT:i"] = i`` and append ``"AGENT:i"`` to the list ``log`` every
``--every`` entries. ``fill`` writes ``--n`` entries after reading ``go`` on stdin, flushes,
then waits for the ``--n`` entries of every ``--expect`` agent. ``stream`` writes one entry
every ``--pace`` seconds (pacing, so that a long run stays small) while a flusher task calls
``flush()`` every ``--flush-every`` seconds, at most ``--window`` entries ahead of the last
flush (backpressure: the hub is not given more than it can take on a loaded machine), until
``stop`` is read on stdin or ``--max`` entries are written; then it writes
``done["AGENT"] = n``, flushes, and waits until every ``--expect`` agent's ``done`` entry and
all the entries it counts are here (writers that are not processes of this script write their
``done`` entry the same way). Writes do not wait for the hub, up to the window: while it is
unreachable they go on locally (offline edits).

Waiting is always on a condition with a deadline (``anyio.fail_after``); a missed deadline
exits non-zero with a traceback on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio
import anyio.to_thread

import crdtstore
from crdtstore import BackendError, Record

# a hub restart or a cut is waited out by reconnecting often, not by failing appends
STORE_OPTIONS: dict[str, Any] = {
    "min_backoff": 0.05,
    "max_backoff": 0.5,
    "connect_timeout": 30.0,
    "offline_timeout": 120.0,
}


def say(*parts: object) -> None:
    # one write() per line: a line the test reads whole was written whole before a kill
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


async def retrying(what: str, write: Callable[[], Awaitable[object]]) -> None:
    """``write()``, again until it succeeds: a ``BackendError`` (the record's journal append
    failed, and the committer retries it) is reported as ``ERROR what: message``."""
    while True:
        try:
            await write()
            return
        except BackendError as exc:
            say("ERROR", f"{what}:", exc)
            await anyio.sleep(0.05)  # then write again (the failed write changed nothing)


async def read_line() -> str:
    line = await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
    return str(line).strip()


def missing_entries(rec: Record, counts: dict[str, int]) -> int:
    m = rec.map("m")
    return sum(1 for a, n in counts.items() for i in range(n) if m.get(f"{a}:{i}") != i)


def report(rec: Record, args: argparse.Namespace, counts: dict[str, int], **extra: Any) -> None:
    """``OK`` with the whole state and the provenance of a sample of keys of every agent."""
    provenance: dict[str, str | None] = {}
    for a, n in counts.items():
        for i in sorted({0, n // 2, n - 1}):
            if i >= 0:
                prov = rec.provenance("m", f"{a}:{i}")
                provenance[f"{a}:{i}"] = None if prov is None else prov.agent
    say(
        "OK",
        json.dumps(
            {
                "agent": args.agent,
                "record_agent": rec.agent,
                "state": rec.to_dict(),
                "provenance": provenance,
                **extra,
            }
        ),
    )


async def fill(rec: Record, args: argparse.Namespace) -> None:
    m, log = rec.map("m"), rec.list("log")
    say("READY")
    if await read_line() != "go":
        raise SystemExit("expected 'go' on stdin")
    started = time.perf_counter()
    for i in range(args.n):
        await m.set(f"{args.agent}:{i}", i)
        if i % args.every == 0:
            await log.append(f"{args.agent}:{i}")
    await rec.flush()
    wrote = time.perf_counter() - started
    counts = {a: args.n for a in args.expect}
    want_log = len(counts) * len(range(0, args.n, args.every))
    with anyio.fail_after(args.deadline):
        while missing_entries(rec, counts) or len(log) < want_log:
            await anyio.sleep(0.02)  # polling a local read; the record's tail brings entries
    report(
        rec,
        args,
        counts,
        write_s=round(wrote, 3),
        seen_all_s=round(time.perf_counter() - started, 3),
    )


async def stream(rec: Record, args: argparse.Namespace) -> None:
    m, log = rec.map("m"), rec.list("log")
    say("READY")
    written = 0
    flushed = 0  # entries flushed
    progress = anyio.Event()  # fired after each flush
    stop = anyio.Event()
    writing_done = anyio.Event()

    async def writer() -> None:
        nonlocal written
        while written < args.max and not stop.is_set():
            if written - flushed >= args.window:
                # backpressure: at most `window` entries ahead of the hub (also offline)
                with anyio.fail_after(args.deadline):
                    await progress.wait()
                continue
            i = written
            key = f"{args.agent}:{i}"
            await retrying("set", partial(m.set, key, i))
            if i % args.every == 0:
                await retrying("append", partial(log.append, key))
            written = i + 1
            if written % args.report == 0:
                say("WROTE", i)
            await anyio.sleep(args.pace)
        writing_done.set()

    async def flusher() -> None:
        nonlocal flushed, progress
        while not writing_done.is_set():
            upto = written
            t0 = time.perf_counter()
            try:
                await rec.flush()
            except BackendError as exc:
                say("ERROR", "flush:", exc)
                await anyio.sleep(0.05)  # the committer retries; flush again after a while
                continue
            if upto:
                say("FLUSHED", upto - 1, round(1000 * (time.perf_counter() - t0), 1))
            flushed = upto
            progress.set()
            progress = anyio.Event()
            with anyio.move_on_after(args.flush_every):
                await writing_done.wait()

    async def stopper() -> None:
        while True:
            line = await read_line()
            if line in ("stop", ""):  # "" is EOF: the test is gone
                stop.set()
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(stopper)
        async with anyio.create_task_group() as inner:
            inner.start_soon(writer)
            inner.start_soon(flusher)
        tg.cancel_scope.cancel()
    await retrying("set", partial(rec.map("done").set, args.agent, written))
    await retrying("flush", rec.flush)
    say("FLUSHED", written - 1)
    say("DONE", written)
    done = rec.map("done")
    with anyio.fail_after(args.deadline):
        while True:
            counts = {a: done.get(a) for a in args.expect}
            if all(isinstance(n, int) for n in counts.values()):
                complete = {a: int(n) for a, n in counts.items() if isinstance(n, int)}
                if not missing_entries(rec, complete):
                    break
            await anyio.sleep(0.02)  # polling a local read; the record's tail brings entries
    report(rec, args, complete, written=written)


async def main_async(args: argparse.Namespace) -> None:
    async with (
        crdtstore.open_store(args.url, token=args.token, **STORE_OPTIONS) as store,
        store.open_record(args.run, args.agent, "tool") as rec,
    ):
        if rec.agent != args.agent:
            raise SystemExit(f"the token names agent {rec.agent!r}, not {args.agent!r}")
        await {"fill": fill, "stream": stream}[args.cmd](rec, args)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="_hub_agent_proc")
    p.add_argument("cmd", choices=["fill", "stream"])
    p.add_argument("url")
    p.add_argument("run")
    p.add_argument("agent")
    p.add_argument("--token", required=True)
    p.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    p.add_argument("--expect", type=lambda s: s.split(","), required=True)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--deadline", type=float, default=60.0)
    p.add_argument("--n", type=int, default=200)  # fill
    p.add_argument("--max", type=int, default=5000)  # stream
    p.add_argument("--pace", type=float, default=0.005)
    p.add_argument("--flush-every", type=float, default=0.05)
    p.add_argument("--report", type=int, default=10)
    p.add_argument("--window", type=int, default=300)
    args = p.parse_args(argv)
    anyio.run(main_async, args, backend=args.backend)


if __name__ == "__main__":
    main(sys.argv[1:])
