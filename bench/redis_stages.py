"""Where the propagation latency of the ``redis://`` store goes, stage by stage.

    python bench/redis_stages.py                 # 8 processes, 300 writes each
    python bench/redis_stages.py --procs 4 -n 120 --sqlite

The harness of ``bench/propagation.py`` (every process writes ``time.time_ns()`` every 20 ms
+-50% and observes the others' writes through ``rec.changes(local=False)``) on a ``redis://``
store of a ``redis-server`` started here, with timestamps (one machine, one clock) taken:

- **write**: just before ``await m.set(...)`` (the value written);
- **append sent / answered**: around the journal append of the writer's committer;
- **XREAD**: when the reader's stream read loop got the entry (its reply parsed);
- **read**: when the reader's record tail read it (woken by the stream read), or took it
  from the stream read's entries at its wake-up (``RedisJournal.kept``);
- **observed**: when the reader's ``changes()`` consumer saw it.

It prints the p50/p99 of each stage's share (from the previous stamp) and of the total, and
the server's time per script call (``INFO commandstats``). ``--sqlite`` also runs the plain
harness on a ``sqlite:///`` store in the same run (the figure to quote beside it).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from _common import fmt, percentile, table
from redis_journal import Server

SKIP = 3


def child(
    url: str, idx: int, procs: int, n: int, interval: float, base: int, barrier: Barrier, out: Any
) -> None:
    import anyio

    import crdtstore

    def now() -> int:
        return time.time_ns() - base

    async def main() -> dict[str, Any]:
        appends: list[tuple[int, int, list[int]]] = []  # (sent, answered, seqs)
        xread: dict[int, int] = {}
        reads: dict[int, int] = {}
        observed: dict[tuple[int, int], int] = {}
        expected = (procs - 1) * n
        done = anyio.Event()
        async with crdtstore.open_store(url) as store:
            backend: Any = store.backend
            append, read = backend.append, backend.read

            async def timed_append(*a: Any, **kw: Any) -> list[int]:
                t0 = now()
                seqs: list[int] = await append(*a, **kw)
                appends.append((t0, now(), seqs))
                return seqs

            async def timed_read(*a: Any, **kw: Any) -> list[Any]:
                rows: list[Any] = await read(*a, **kw)
                t = now()
                for r in rows:
                    reads.setdefault(r.seq, t)
                return rows

            backend.append, backend.read = timed_append, timed_read
            kept = getattr(backend, "kept", None)
            if kept is not None:  # (a record's tail takes entries from the stream read)

                def timed_kept(*a: Any) -> list[Any] | None:
                    rows: list[Any] | None = kept(*a)
                    t = now()
                    for r in rows or ():
                        reads.setdefault(r.seq, t)
                    return rows

                backend.kept = timed_kept
            tail = backend.tail
            if tail is not None:
                handle = tail._handle

                def timed_handle(got: dict[bytes, list[Any]]) -> None:
                    t = now()
                    for entries in got.values():
                        for e in entries:
                            seq = int(e[0].split(b"-", 1)[0])
                            xread.setdefault(seq, t)
                    handle(got)

                tail._handle = timed_handle
            async with store.open_record("prop", f"p{idx}", "tool") as rec:
                stream = rec.changes(local=False, buffer=100_000)

                async def consume() -> None:
                    async for change in stream:
                        t = now()
                        for op in change.ops:
                            if op[0] == "map" and op[2] == "set":
                                who, i = op[3][1:].rsplit("-", 1)
                                observed[(int(who), int(i))] = t
                        if len(observed) >= expected:
                            done.set()
                            return

                m = rec.map("m")
                rng = random.Random(idx)
                written: list[int] = []
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consume)
                    await anyio.to_thread.run_sync(barrier.wait)
                    c0, t0 = time.process_time(), time.perf_counter()
                    s0 = os.times().system
                    for i in range(n):
                        stamp = now()
                        written.append(stamp)
                        await m.set(f"p{idx}-{i}", stamp)
                        await anyio.sleep(interval * rng.uniform(0.5, 1.5))
                    await rec.flush()
                    with anyio.move_on_after(30):
                        await done.wait()
                    cpu_s = time.process_time() - c0
                    sys_s = os.times().system - s0
                    cpu = cpu_s / (time.perf_counter() - t0)
                    tg.cancel_scope.cancel()
        seq_of: dict[int, tuple[int, int, int]] = {}  # i -> (seq, sent, answered)
        k = 0
        for sent, answered, seqs in appends:
            for s in seqs:
                seq_of[k] = (s, sent, answered)
                k += 1
        return {
            "idx": idx,
            "written": written,
            "seq_of": seq_of,
            "xread": xread,
            "reads": reads,
            "observed": observed,
            "cpu": cpu,
            "cpu_s": cpu_s,
            "sys_s": sys_s,
            "batches": len(appends),
        }

    prof = os.environ.get("REDIS_STAGES_PROFILE")  # "<idx>:<file>": cProfile that process
    if prof and prof.split(":", 1)[0] == str(idx):
        import cProfile

        profile = cProfile.Profile(time.process_time)
        got = profile.runcall(anyio.run, main)
        profile.dump_stats(prof.split(":", 1)[1])
        out.put(got)
        return
    out.put(anyio.run(main))


def ping_probe(port: int, stop: Any, out: list[float]) -> None:
    """Round trips (ms) of ``PING`` every 5 ms on a plain socket, until ``stop`` is set: what
    the server (and one more process waking) takes meanwhile."""
    import socket

    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while not stop.is_set():
            t0 = time.perf_counter()
            s.sendall(b"PING\r\n")
            s.recv(64)
            out.append((time.perf_counter() - t0) * 1e3)
            stop.wait(0.005)


def monitor(port: int, stop: Any, out: dict[tuple[int, int], int], base: list[int]) -> None:
    """``MONITOR``: the server's time (ns since ``base[0]``) of each append script call, by the
    key it writes (``p<idx>-<i>``): when Redis ran it."""
    import re
    import socket

    pat = re.compile(rb'^\+(\d+)\.(\d+) .*"evalsha".*?p(\d+)-(\d+)', re.I)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"MONITOR\r\n")
        s.settimeout(0.2)
        buf = b""
        while not stop.is_set():
            try:
                data = s.recv(1 << 20)
            except TimeoutError:
                continue
            if not data:
                return
            buf += data
            *lines, buf = buf.split(b"\r\n")
            for line in lines:
                m = pat.match(line)
                if m and base:
                    t = int(m[1]) * 10**9 + int(m[2]) * 1000 - base[0]
                    out.setdefault((int(m[3]), int(m[4])), t)


def run(url: str, procs: int, n: int, interval: float, bases: list[int]) -> list[dict[str, Any]]:
    import anyio

    import crdtstore

    async def create() -> None:
        async with (
            crdtstore.open_store(url) as store,
            store.open_record("prop", "setup", "system") as rec,
        ):
            await rec.map("m").set("setup", 0)

    anyio.run(create)
    ctx = mp.get_context("spawn")
    barrier, out, base = ctx.Barrier(procs), ctx.Queue(), time.time_ns()
    bases.append(base)
    ps = [
        ctx.Process(target=child, args=(url, i, procs, n, interval, base, barrier, out))
        for i in range(procs)
    ]
    for p in ps:
        p.start()
    got = [out.get(timeout=300) for _ in ps]
    for p in ps:
        p.join(30)
    return sorted(got, key=lambda r: r["idx"])


STAGES = ("committer", "append", "xread", "tail read", "observed", "total")


def stages(
    results: list[dict[str, Any]], served: dict[tuple[int, int], int]
) -> dict[str, list[float]]:
    """Per stage, the milliseconds from the previous stamp, over every (write, reader)."""
    out: dict[str, list[float]] = {s: [] for s in STAGES}
    out["sent->server ran"], out["server ran->answer"] = [], []
    for w in results:
        for i, stamp in enumerate(w["written"]):
            if i < SKIP or i not in w["seq_of"]:
                continue
            seq, sent, answered = w["seq_of"][i]
            for r in results:
                if r is w:
                    continue
                o = r["observed"].get((w["idx"], i))
                x, rd = r["xread"].get(seq), r["reads"].get(seq)
                if o is None or x is None or rd is None:
                    continue
                out["committer"].append((sent - stamp) / 1e6)
                out["append"].append((answered - sent) / 1e6)
                out["xread"].append((x - sent) / 1e6)
                out["tail read"].append((rd - x) / 1e6)
                out["observed"].append((o - rd) / 1e6)
                out["total"].append((o - stamp) / 1e6)
                ran = served.get((w["idx"], i))
                if ran is not None and r is results[0 if w is not results[0] else 1]:
                    out["sent->server ran"].append((ran - sent) / 1e6)
                    out["server ran->answer"].append((answered - ran) / 1e6)
    return out


async def script_stats(port: int) -> list[list[str]]:
    import redis.asyncio as aioredis

    client = aioredis.Redis(host="127.0.0.1", port=port)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    rows = []
    for name, v in sorted(stats.items()):
        if v["calls"] >= 100:
            rows.append([name[len("cmdstat_") :], f"{v['calls']:,}", f"{v['usec_per_call']:.1f}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    import anyio

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("-n", type=int, default=300, help="writes per process")
    ap.add_argument("--interval", type=float, default=0.02)
    ap.add_argument("--redis-nice", type=int, default=0, help="redis-server's nice value")
    ap.add_argument("--monitor", action="store_true", help="stamp script runs by MONITOR")
    ap.add_argument("--sqlite", action="store_true", help="also the plain SQLite harness")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="crdtstore-bench-stages-") as tmp:
        (Path(tmp) / "redis").mkdir()
        server = Server(Path(tmp) / "redis", nice=args.redis_nice)
        try:
            import threading

            load = os.getloadavg()[0]
            stop, pings = threading.Event(), []
            probe = threading.Thread(target=ping_probe, args=(server.port, stop, pings))
            probe.start()
            served: dict[tuple[int, int], int] = {}
            bases: list[int] = []
            mon = threading.Thread(target=monitor, args=(server.port, stop, served, bases))
            if args.monitor:
                mon.start()
            from redis_journal import _server_cpu

            s0 = _server_cpu(server)
            results = run(server.url("s"), args.procs, args.n, args.interval, bases)
            server_cpu = _server_cpu(server) - s0
            stop.set()
            probe.join()
            if args.monitor:
                mon.join()
            stats = anyio.run(script_stats, server.port)
        finally:
            server.stop()
        if args.sqlite:
            from propagation import run_variant

            (Path(tmp) / "sq").mkdir()
            sq = run_variant("crdtstore", args.procs, args.n, args.interval, Path(tmp) / "sq")
    got = stages(results, served)
    print(
        f"\n{args.procs} processes x {args.n} writes, load {load:.1f}; ms from the previous stamp"
    )
    table(
        ["stage", "samples", "p50", "p90", "p99", "max"],
        [
            [s, f"{len(v):,}", fmt(percentile(v, 50), "ms"), fmt(percentile(v, 90), "ms"),
             fmt(percentile(v, 99), "ms"), fmt(max(v), "ms")]
            for s, v in got.items() if v
        ],
    )  # fmt: skip
    print(f"PING round trips meanwhile: p50 {percentile(pings, 50):.2f} ms, "
          f"p99 {percentile(pings, 99):.2f} ms ({len(pings):,})")  # fmt: skip
    cpu = sum(r["cpu"] for r in results) / len(results)
    batches = sum(r["batches"] for r in results)
    writes = args.procs * args.n
    client_us = sum(r["cpu_s"] for r in results) / writes * 1e6
    client_sys_us = sum(r["sys_s"] for r in results) / writes * 1e6
    print(f"CPU per process {cpu * 100:.0f}%; {batches:,} appends for {writes:,} writes")
    print(f"CPU per write (all processes, writing and observing): clients {client_us:.0f} us"
          f" (system {client_sys_us:.0f} us)"
          f" + redis-server {server_cpu / writes * 1e6:.0f} us")  # fmt: skip
    print("(xread is from the writer's append sent; 'append' overlaps it)")
    table(["server command", "calls", "us/call"], stats)
    if args.sqlite:
        per_write = sq["cpu"] * args.interval * 1e6  # (CPU share x interval)
        print(f"sqlite:/// same run: p50 {sq['p50']:.2f} ms, p99 {sq['p99']:.2f} ms;"
              f" CPU per write ~{per_write:.0f} us")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
