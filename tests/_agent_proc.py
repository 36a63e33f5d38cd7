"""An agent process for the multi-process tests (tests/journal/test_multiprocess.py).

Run as ``python tests/_agent_proc.py COMMAND URL RUN AGENT [options]``. The process talks to
the test through stdout, one line per event, flushed at once:

- ``READY`` once the record is open (the test may then start it, or kill it);
- ``ACK key`` after a durable ``set`` of ``key`` returned (``durable``);
- ``FLUSHED prefix i`` after ``flush()`` returned with keys ``prefix:0..i`` written (``batched``);
- ``OK {json}`` when the command's goal was reached (``fill``, ``pingpong``).

A command that waits reads a line from stdin first (``go``), so that several processes start
writing at the same moment. Waiting for other processes' writes is always a condition with a
deadline (``anyio.fail_after``); a missed deadline exits non-zero with a traceback on stderr.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import anyio
import anyio.to_thread

import crdtstore


def say(*parts: object) -> None:
    # one write() per line: a line the test reads whole was written whole before a kill
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


async def wait_for_go() -> None:
    line = await anyio.to_thread.run_sync(sys.stdin.readline)
    if line.strip() != "go":
        raise SystemExit(f"expected 'go' on stdin, got {line!r}")


async def fill(args: argparse.Namespace) -> None:
    """Write ``n`` own map entries (and a list append every ``every`` of them), then wait
    until every one of the ``agents`` processes' entries is visible here."""
    agents = [f"w{i}" for i in range(args.agents)]
    n, every = args.n, args.every
    async with (
        crdtstore.open_store(args.url) as store,
        store.open_record(run=args.run, agent=args.agent, source="tool") as rec,
    ):
        m, log = rec.map("m"), rec.list("log")
        say("READY")
        await wait_for_go()
        started = time.perf_counter()
        for i in range(n):
            await m.set(f"{args.agent}:{i}", i)
            if i % every == 0:
                await log.append(f"{args.agent}:{i}")
        await rec.flush()
        wrote = time.perf_counter() - started
        want_map, want_log = n * len(agents), len(agents) * len(range(0, n, every))
        with anyio.fail_after(args.deadline):
            while True:
                await rec.sync()
                if len(m) >= want_map and len(log) >= want_log:
                    break
                await anyio.sleep(0.02)
        seen = time.perf_counter() - started
        synced = await rec.sync()  # everyone has flushed: the whole journal is here
        # the counts are reached; now check the contents, not just the sizes
        missing = [f"{a}:{i}" for a in agents for i in range(n) if m.get(f"{a}:{i}") != i]
        expected_log = sorted(f"{a}:{i}" for a in agents for i in range(0, n, every))
        log_ok = sorted(log.to_list()) == expected_log
        say(
            "OK",
            json.dumps(
                {
                    "agent": args.agent,
                    "entries": len(m),
                    "log": len(log),
                    "missing": missing[:10],
                    "log_ok": log_ok,
                    "write_s": round(wrote, 3),
                    "seen_all_s": round(seen, 3),
                    "synced": synced,
                }
            ),
        )


async def durable(args: argparse.Namespace) -> None:
    """Write ``prefix:0``, ``prefix:1``, ... one by one in durable mode, acknowledging each
    on stdout once ``set`` returned, until killed or until the ``--stop`` file exists."""
    stop = Path(args.stop) if args.stop else None
    async with (
        crdtstore.open_store(args.url, durability="durable") as store,
        store.open_record(run=args.run, agent=args.agent, source="tool") as rec,
    ):
        m = rec.map("m")
        say("READY")
        i = 0
        while i < args.max and not (stop is not None and stop.exists()):
            key = f"{args.prefix}:{i}"
            await m.set(key, i)
            say("ACK", key)
            i += 1
            if args.pause:
                await anyio.sleep(args.pause)  # pacing, so that a long loop stays small
        say("OK", json.dumps({"written": i}))


async def batched(args: argparse.Namespace) -> None:
    """Write ``prefix:0``, ``prefix:1``, ... in batched mode (list appends in between), and
    after every random-sized batch ``flush()`` and report the last key flushed. After ``max``
    keys, wait to be killed (so that a long kill loop does not grow the journal without end)."""
    rng = random.Random(args.seed)
    async with (
        crdtstore.open_store(args.url) as store,
        store.open_record(run=args.run, agent=args.agent, source="tool") as rec,
    ):
        m, log = rec.map("m"), rec.list("log")
        say("READY")
        i = 0
        while i < args.max:
            for _ in range(rng.randint(1, 200)):
                await m.set(f"{args.prefix}:{i}", i)
                if i % 10 == 0:
                    await log.append(f"{args.prefix}:{i}")
                i += 1
            await rec.flush()
            say("FLUSHED", args.prefix, i - 1)
        await anyio.sleep_forever()


async def pingpong(args: argparse.Namespace) -> None:
    """Alternate writes with ``peer``: the leader writes ``me:r`` and waits for ``peer:r``;
    the follower waits for ``peer:r`` and answers ``me:r``. Only the record's background tail
    brings the peer's writes in (no ``sync()`` here): with a long ``poll_interval`` that means
    the cross-process wake-up works."""
    async with (
        crdtstore.open_store(args.url, poll_interval=args.poll) as store,
        store.open_record(run=args.run, agent=args.agent) as rec,
    ):
        m = rec.map("m")
        say("READY")
        await wait_for_go()
        waits: list[float] = []

        async def wait_key(key: str) -> None:
            t0 = time.perf_counter()
            with anyio.fail_after(args.deadline):
                while key not in m:
                    await anyio.sleep(0.002)
            waits.append(time.perf_counter() - t0)

        for r in range(args.rounds):
            if args.leader:
                await m.set(f"{args.agent}:{r}", r)
                await wait_key(f"{args.peer}:{r}")
            else:
                await wait_key(f"{args.peer}:{r}")
                await m.set(f"{args.agent}:{r}", r)
        await rec.flush()
        say(
            "OK",
            json.dumps(
                {
                    "rounds": args.rounds,
                    "max_wait_s": round(max(waits), 4),
                    "mean_wait_s": round(sum(waits) / len(waits), 4),
                }
            ),
        )


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="_agent_proc")
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(name: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name)
        sp.add_argument("url")
        sp.add_argument("run")
        sp.add_argument("agent")
        sp.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
        return sp

    sp = common("fill")
    sp.add_argument("--n", type=int, default=2000)
    sp.add_argument("--agents", type=int, default=8)
    sp.add_argument("--every", type=int, default=20)
    sp.add_argument("--deadline", type=float, default=60.0)
    sp = common("durable")
    sp.add_argument("--prefix", required=True)
    sp.add_argument("--stop", default="")
    sp.add_argument("--max", type=int, default=1_000_000)
    sp.add_argument("--pause", type=float, default=0.0)
    sp = common("batched")
    sp.add_argument("--prefix", required=True)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--max", type=int, default=4000)
    sp = common("pingpong")
    sp.add_argument("--peer", required=True)
    sp.add_argument("--leader", action="store_true")
    sp.add_argument("--rounds", type=int, default=20)
    sp.add_argument("--poll", type=float, default=0.25)
    sp.add_argument("--deadline", type=float, default=5.0)
    args = p.parse_args(argv)
    fn = {"fill": fill, "durable": durable, "batched": batched, "pingpong": pingpong}[args.cmd]
    anyio.run(fn, args, backend=args.backend)


if __name__ == "__main__":
    main(sys.argv[1:])
