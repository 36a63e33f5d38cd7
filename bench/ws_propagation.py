"""Propagation between Python agents through the hub (``ws://`` stores), with two baselines.

    python bench/ws_propagation.py            # 600 writes at 100/s, 1 / 4 / 8 readers
    python bench/ws_propagation.py --quick    # 200 writes
    python bench/ws_propagation.py --readers 1,8 --repeat 2

One writer agent and R reader agents, every agent a process of its own, and the hub a process
of its own (``python -m sync --store sqlite:///...``, as an operator starts it). The writer
opens the run's record on a ``ws://`` store (read-write token) and, paced at ``--rate``
writes per second, sets ``m["w<i>"] = i`` (``await rec.map("m").set(...)``, the record's
default durability), taking ``time.monotonic_ns()`` just before the call. Each reader opens
the same run on a ``ws://`` store of its own (read-only token), iterates
``rec.changes(local=False)`` and stamps every ``w<i>`` it sees with ``time.monotonic_ns()``
(one machine, one clock). Latency = arrival in a reader's record - the writer's stamp, over
every (write, reader) pair; the first ``SKIP`` writes are left out (connection warm-up).
Also reported: a reader process's CPU time per write while it received (median over the
readers; not measured for the Yjs observers), the writer process's CPU time per write while it
wrote (not for the Yjs writer) and the hub process's CPU time per write over the trial: CPU
times, unlike latencies, hold still on a machine loaded by other work (A/B them). For the
ws:// writer: how many appends its record sent, and their median wall time (send to answer).
``--flush-each`` makes every write one append (the writer flushes after each), so that CPU
per write is CPU per append whatever the load does to the batching.

``--profile DIR`` runs the hub, the ws:// writer and its first reader under cProfile
(``DIR/hub.prof``, ``DIR/writer-<trial>.prof``, ``DIR/reader-<trial>.prof``) and prints
where their time per update went, by part (JSON and base64, pydantic, websockets, the event
loop, pycrdt, SQLite, crdtstore's own code).

``--stages`` logs, in the writer, the hub and a reader, when each write passes each stage
(the writer's set, its committer's append, the frame sent, the hub's receipt, dispatch,
apply, commit and push, the reader's receipt, decode and apply: ``bench/_ws_stages.py``) and
prints the median time of each after the writer's stamp, per ws:// trial.

Baselines in the same run, same pacing and counts:

- **Yjs peers through the same hub**: a plain Yjs writer and R plain Yjs observers on raw
  WebSockets (``bench/_hub_peers.py``: a pycrdt doc speaking y-protocols; observers stamp the
  update frame's arrival without applying it), on another run of the same hub process.
- **Yjs peers applying** (``yjsdoc``): the same, but every observer applies each update to a
  pycrdt ``Doc`` and stamps it in the doc's map observer (``--apply``), as a Yjs client sees it.
- **SQLite direct**: the same writer and readers as above on ``sqlite:///`` (a separate store
  file; no hub): what ``bench/propagation.py`` measures, with this harness.

Prints a table (p50/p90/p99/max, samples, entries missing, load average before each trial)
and the ratios ws:// / Yjs-through-hub and ws:// / SQLite-direct, then the ``BENCH-RESULT``
lines. ``--repeat R`` runs every configuration R times (the kinds alternating); the summary
takes the median over the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import Result, fmt, header, median, percentile, readline, spawn, stop, table, tell

HERE = Path(__file__).resolve().parent
TENANT = "bench"
SKIP = 10  # first writes not counted (connection and page-cache warm-up)
KINDS = ("ws", "yjs", "yjsdoc", "sqlite")
LABELS = {
    "ws": "crdtstore ws:// through the hub",
    "yjs": "plain Yjs peers through the hub",
    "yjsdoc": "Yjs peers applying, through the hub",
    "sqlite": "crdtstore sqlite:// direct",
}
_LISTENING = re.compile(r"crdtstore hub listening on ws://127\.0\.0\.1:(\d+)")


def _line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


# -- agent processes ------------------------------------------------------------------------------


def agent(
    role: str,
    url: str,
    run: str,
    token: str | None,
    n: int,
    rate: float,
    profile: str | None = None,
    flush_each: bool = False,
    stages: str | None = None,
) -> None:
    """A writer or a reader (see the module docstring); protocol on stdout/stdin: ``READY``,
    (writer) ``GO`` read, then ``RESULT {json}``. ``profile``: the writer's write loop (a
    reader's receive loop) runs under cProfile, dumped there; ``flush_each``: the writer
    flushes after every write; ``stages``: log its stages there (``_ws_stages``)."""
    if stages:
        import _ws_stages

        _ws_stages.install(role, stages)
    import anyio
    import anyio.to_thread

    import crdtstore

    options: dict[str, Any] = {"tenant": TENANT} if token is None else {"token": token}

    async def main() -> dict[str, Any]:
        async with (
            crdtstore.open_store(url, **options) as store,
            store.open_record(run, role, "tool") as rec,
        ):
            if role == "writer":
                m = rec.map("m")
                await m.set("ready", 1)
                await rec.flush()
                _line("READY")
                await anyio.to_thread.run_sync(sys.stdin.readline)
                sent = [0] * n
                prof = None
                waits: list[float] = []  # wall seconds of each append, from send to answer
                from sync._client import WsJournal

                chunk = WsJournal._append_chunk

                async def timed(*args: Any, **kwargs: Any) -> Any:
                    t = time.perf_counter()
                    try:
                        return await chunk(*args, **kwargs)
                    finally:
                        waits.append(time.perf_counter() - t)

                WsJournal._append_chunk = timed  # type: ignore[method-assign]
                if profile:
                    import cProfile

                    prof = cProfile.Profile(time.process_time)
                    prof.enable()
                cpu0 = time.process_time()
                t0 = time.monotonic()
                for i in range(n):
                    delay = t0 + i / rate - time.monotonic()
                    if delay > 0:
                        await anyio.sleep(delay)
                    sent[i] = time.monotonic_ns()
                    await m.set(f"w{i}", i)
                    if flush_each:
                        await rec.flush()
                await rec.flush()
                cpu = time.process_time() - cpu0
                if prof is not None:
                    prof.disable()
                    prof.dump_stats(str(profile))
                waits.sort()
                append_ms = percentile(waits, 50) * 1e3  # (nan when there were none)
                return {"sent": sent, "cpu": cpu, "appends": len(waits), "append_ms": append_ms}
            arrivals = [0] * n
            seen = 0
            stream = rec.changes(local=False, buffer=100_000)
            _line("READY")
            prof = None
            if profile:
                import cProfile

                prof = cProfile.Profile(time.process_time)
                prof.enable()
            cpu0 = time.process_time()
            with anyio.move_on_after(n / rate + 60):
                async for change in stream:
                    now = time.monotonic_ns()
                    for op in change.ops:
                        if op[0] == "map" and op[2] == "set" and str(op[3]).startswith("w"):
                            i = int(str(op[3])[1:])
                            if i < n and not arrivals[i]:
                                arrivals[i] = now
                                seen += 1
                    if seen >= n:
                        break
            cpu = time.process_time() - cpu0
            if prof is not None:
                prof.disable()
                prof.dump_stats(str(profile))
            return {"arrivals": arrivals, "lost": stream.lost, "cpu": cpu}

    _line("RESULT " + json.dumps(anyio.run(main)))


# -- profiles -------------------------------------------------------------------------------------

# (part, substrings of "file:function") in order: the first that matches takes a function's
# own time
_LOOP = ("asyncio", "selectors", "anyio", "socket", "select.epoll", "sniffio", "trio")
_PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("JSON + base64", ("json", "base64", "binascii", "b64")),
    ("pydantic", ("pydantic", "model_validate", "model_dump")),
    ("websockets", ("websockets",)),
    ("event loop + sockets", _LOOP),
    ("pycrdt", ("pycrdt",)),
    ("SQLite", ("sqlite3", "_sqlite")),
    ("sync (hub / client)", ("/sync/",)),
    ("crdtstore", ("/crdtstore/",)),
]


def profile_split(path: Path, updates: int) -> dict[str, float]:
    """Own CPU time per update (us) of the profile at ``path``, by part (see ``_PARTS``)."""
    import pstats

    stats: dict[Any, Any] = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    out: dict[str, float] = {}
    for (file, _line, func), (_cc, _nc, tt, _ct, _callers) in stats.items():
        key = f"{file}:{func}"
        part = next((name for name, keys in _PARTS if any(k in key for k in keys)), "other")
        out[part] = out.get(part, 0.0) + tt
    return {k: v / updates * 1e6 for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def profile_report(path: Path, updates: int, top: int = 25) -> None:
    import pstats

    split = profile_split(path, updates)
    total = sum(split.values())
    print(f"\n{path.name}: {total:.0f} us of profiled CPU per update, by part (own time)")
    table(
        ["part", "us/update", "share"],
        [[k, f"{v:.1f}", f"{v / total:.0%}"] for k, v in split.items()],
    )
    print()
    pstats.Stats(str(path)).sort_stats("tottime").print_stats(top)


# -- the wire cost of one append ------------------------------------------------------------------


def wire_cost(rounds: int = 5, number: int = 2000) -> dict[str, float]:
    """CPU us per append of what differs between the JSON ``journal.append`` and the append
    frame, in this process (both paths alternating, the best of ``rounds``): the client's
    request, the hub's decoding and checking of it, the hub's answer and the client's reading
    of it, for the update of one ``m.set`` of the writer (no socket, no journal)."""
    import base64 as b64mod
    import timeit

    from pycrdt import Doc

    from crdtstore.backend import check_call
    from sync import ClientSession, PycrdtDocument, ServerSession
    from sync._messages import Response

    doc: Doc[Any] = Doc()
    state = doc.get_state()
    from pycrdt import Map

    doc.get("m", type=Map)["w123"] = 123
    update, client_id = doc.get_update(state), doc.client_id
    client = ClientSession(PycrdtDocument(Doc()), max_pending_requests=10**9)
    hub = ServerSession(PycrdtDocument(Doc()), max_pending_requests=10**9)

    def json_path() -> None:
        entry = {"update": b64mod.b64encode(update).decode("ascii"), "client_id": client_id}
        _, frame = client.request("journal.append", {"entries": [entry], "durable": False})
        request: Any = hub.receive(frame).message
        for e in request.params["entries"]:  # as the hub's op checks an entry
            b64mod.b64decode(e["update"], validate=True), check_call(e.get("call", ""))
        client.receive(hub.respond(Response.success(request.id, [12345])))

    paths = {"JSON journal.append": json_path}
    try:
        from sync._messages import Append, Appended, AppendEntry, encode
    except ImportError:  # (code before the append frame)
        pass
    else:

        def frame_path() -> None:
            request, _ = client.request("journal.append")  # (its id: see sync._client)
            entries = (AppendEntry(update, client_id, ""),)
            frame = encode(Append.of(int(request.id), entries, False))
            append: Any = hub.receive(frame).message
            for e in append.entries:
                check_call(e.call)
            client.receive(hub.respond(Appended.of(append.id, [12345])))

        paths["append frame"] = frame_path
    best = dict.fromkeys(paths, float("inf"))
    for _ in range(rounds):
        for name, path in paths.items():
            t = timeit.Timer(path, timer=time.process_time).timeit(number)
            best[name] = min(best[name], t / number * 1e6)
    return best


# -- parent ---------------------------------------------------------------------------------------


# the hub under cProfile while a trial writes: SIGUSR1 starts a profile, SIGUSR2 ends it and
# dumps it to the next of {out}1.prof, {out}2.prof, ...
_PROFILED_HUB = """
import cProfile, runpy, signal, sys, time
held = [None, 0]
def start(*_):
    held[0] = cProfile.Profile(time.process_time)
    held[0].enable()
def end(*_):
    held[0].disable()
    held[1] += 1
    held[0].dump_stats({out!r} + str(held[1]) + ".prof")
sys.argv[0] = "sync"
if {stages!r}:
    import _ws_stages
    _ws_stages.install("hub", {stages!r})
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, end)
try:
    runpy.run_module("sync", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
"""


class Hub:
    """``python -m sync`` on a SQLite store, in a process of its own."""

    def __init__(
        self, store: str, secret: str, profile: Path | None = None, stages: Path | None = None
    ) -> None:
        self.secret = secret
        env = {**os.environ, "CRDTSTORE_SECRET": secret}
        argv = [sys.executable, "-m", "sync", "--store", store, "--host", "127.0.0.1"]
        self.profiled, self.dumps = profile, 0
        if profile is not None:  # CPU time, not wall time (an idle hub waits in epoll)
            self.profiled = profile.with_name("dump-hub")
        if profile is not None or stages is not None:  # (a profile that never starts)
            out = str(profile.with_name("dump-hub") if profile else "")
            code = _PROFILED_HUB.format(out=out, stages=str(stages or ""))
            argv[1:3] = ["-c", code]
        self.proc = subprocess.Popen(
            [*argv, "--port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=HERE,  # (not the repository: PYTHONPATH may name another copy of the code)
        )
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 60
        while True:
            line = self.proc.stderr.readline()
            found = _LISTENING.search(line)
            if found:
                self.port = int(found.group(1))
                break
            if not line or time.monotonic() > deadline:
                raise RuntimeError(f"the hub did not start (exit code {self.proc.poll()})")
        # keep draining its log, or a full pipe would stall it
        import threading

        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for _ in self.proc.stderr:
            pass

    def token(self, run: str, agent: str, mode: str) -> str:
        from sync import TokenClaims, mint

        claims = TokenClaims.model_validate(
            {"tenant": TENANT, "run": run, "agent": agent, "mode": mode, "exp": 2**31 - 1}
        )
        return mint(self.secret.encode(), claims)

    def profiling(self, on: bool, name: str = "") -> None:
        """Start the hub's next profile (when it runs under one), or end it: it is dumped
        to ``{profile}-{name}.prof``."""
        if self.profiled is None:
            return
        import signal

        if on:
            self.proc.send_signal(signal.SIGUSR1)
            return
        self.proc.send_signal(signal.SIGUSR2)
        self.dumps += 1
        dumped = Path(f"{self.profiled}{self.dumps}.prof")
        deadline = time.monotonic() + 60
        while not dumped.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # (written whole)
        dumped.rename(self.profiled.with_name(f"hub-{name}.prof"))

    def cpu(self) -> float:
        """The hub process's CPU seconds so far (user + system)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        stop(self.proc)  # type: ignore[arg-type]


_trials = 0


def trial(
    kind: str,
    hub: Hub,
    sqlite_url: str,
    readers: int,
    n: int,
    rate: float,
    profile: Path | None = None,
    flush_each: bool = False,
    stages: Path | None = None,
) -> dict[str, Any]:
    """One writer and ``readers`` readers of ``kind`` on a fresh run: latencies in ms, CPU
    per write in us (``profile``: a folder for the ws:// writer's profile; ``stages``: the
    folder of the stage logs, see ``_ws_stages``)."""
    global _trials
    _trials += 1
    run = f"t{_trials}-{kind}-{readers}"
    load = os.getloadavg()[0]
    procs: list[subprocess.Popen[str]] = []
    me = str(Path(__file__).resolve())
    cpu: list[float] = []  # CPU seconds of each reader process while it received
    writer_cpu = append_ms = float("nan")
    appends = 0
    try:
        if kind in ("yjs", "yjsdoc"):
            base = f"ws://127.0.0.1:{hub.port}/{TENANT}/{run}"
            w_url = f"{base}?token={hub.token(run, 'writer', 'rw')}"
            writer = spawn([str(HERE / "_hub_peers.py"), "writer", w_url, "--n", str(n),
                             "--rate", str(rate)])  # fmt: skip
            procs.append(writer)
            readline(writer, "SYNCED")
            urls = [f"{base}?token={hub.token(run, f'r{i}', 'ro')}" for i in range(readers)]
            apply = ["--apply"] if kind == "yjsdoc" else []
            obs = [spawn([str(HERE / "_hub_peers.py"), "observers", u, "--n", str(n),
                           "--deadline", str(n / rate + 60), *apply]) for u in urls]  # fmt: skip
            procs += obs
            for p in obs:
                readline(p, "READY")
            hub0 = hub.cpu()
            hub.profiling(True)
            tell(writer)
            for p in obs:
                readline(p, "DONE")
            sent = json.loads(readline(writer, "RESULT "))["sent"]
            hub.profiling(False, run)
            hub_cpu = hub.cpu() - hub0
            for p in [writer, *obs]:
                tell(p)
            arrivals = [json.loads(readline(p, "RESULT "))["arrivals"][0] for p in obs]
        else:
            if kind == "ws":
                url = f"ws://127.0.0.1:{hub.port}/{TENANT}"

                def tok(agent: str, mode: str) -> str:
                    return hub.token(run, agent, mode)
            else:
                url = sqlite_url

                def tok(agent: str, mode: str) -> str:
                    return "-"

            common = ["--n", str(n), "--rate", str(rate), "--run", run, "--url", url]
            if flush_each:
                common.append("--flush-each")
            if stages is not None and kind == "ws":
                (stages / run).mkdir()
                common += ["--stages-dir", str(stages / run)]
            prof = []
            if profile is not None and kind == "ws":
                prof = ["--profile", str(profile / f"writer-{run}.prof")]
            writer = spawn(
                [me, "--agent", "writer", "--token", tok("writer", "rw"), *common, *prof]
            )
            procs.append(writer)
            readline(writer, "READY")  # the run exists now
            # (the first reader is profiled with the writer)
            rprof = ["--profile", str(profile / f"reader-{run}.prof")] if prof else []
            rargs = [[*common, *(rprof if i == 0 else [])] for i in range(readers)]
            rs = [
                spawn([me, "--agent", "reader", "--token", tok(f"r{i}", "ro"), *rargs[i]])
                for i in range(readers)
            ]
            procs += rs
            for p in rs:
                readline(p, "READY")
            hub0 = hub.cpu()
            if kind == "ws":
                hub.profiling(True)
            tell(writer)
            wrote = json.loads(readline(writer, "RESULT "))
            sent, writer_cpu = wrote["sent"], wrote["cpu"]
            appends, append_ms = wrote["appends"], wrote["append_ms"]
            results = [json.loads(readline(p, "RESULT ")) for p in rs]
            hub.profiling(False, run)
            hub_cpu = hub.cpu() - hub0 if kind == "ws" else float("nan")
            arrivals = [r["arrivals"] for r in results]
            cpu = [r["cpu"] for r in results]
        if stages is not None and kind == "ws":
            import _ws_stages

            _ws_stages.report(stages, run, sent, arrivals[0], SKIP)
        lat: list[float] = []
        missing = 0
        for arr in arrivals:
            for i, at in enumerate(arr):
                if not at:
                    missing += 1
                elif i >= SKIP:
                    lat.append((at - sent[i]) / 1e6)
        return {
            "kind": kind,
            "readers": readers,
            "load": load,
            "n": len(lat),
            "p50": percentile(lat, 50),
            "p90": percentile(lat, 90),
            "p99": percentile(lat, 99),
            "max": max(lat) if lat else float("nan"),
            "missing": missing,
            "reader_cpu_us": median(cpu) / n * 1e6 if cpu else float("nan"),
            "writer_cpu_us": writer_cpu / n * 1e6,
            "hub_cpu_us": hub_cpu / n * 1e6,
            "appends": appends,
            "append_ms": append_ms,
        }
    finally:
        for p in procs:
            stop(p)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200 writes per trial")
    ap.add_argument("-n", "--n", type=int, default=None, help="writes per trial (default 600)")
    ap.add_argument("--rate", type=float, default=100.0, help="writes per second")
    ap.add_argument("--readers", default="1,4,8", help="comma-separated reader counts")
    ap.add_argument("--kinds", default=",".join(KINDS), help="which of ws,yjs,yjsdoc,sqlite")
    ap.add_argument("--repeat", type=int, default=1, help="runs of every configuration")
    ap.add_argument(
        "--profile", type=Path, default=None, help="cProfile the hub and the ws:// writer here"
    )
    ap.add_argument(
        "--wire",
        action="store_true",
        help="only the CPU per append of the JSON append and the append frame, in-process",
    )
    ap.add_argument(
        "--flush-each",
        action="store_true",
        help="the writer flushes after every write: one append per write (CPU per append A/B)",
    )
    ap.add_argument(
        "--stages",
        action="store_true",
        help="log where each ws:// write's latency goes (slower: compare traced runs only)",
    )
    # an agent process (internal)
    ap.add_argument("--agent", choices=("writer", "reader"), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--token", help=argparse.SUPPRESS)
    ap.add_argument("--stages-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    n = args.n or (200 if args.quick else 600)
    if args.wire:
        for name, us in wire_cost().items():
            print(f"{name}: {us:.2f} us CPU per append (encode, decode, check, answer, read)")
        return 0
    if args.agent:
        agent(args.agent, args.url, args.run, None if args.token == "-" else args.token, n,
              args.rate, args.profile, args.flush_each, args.stages_dir)  # fmt: skip
        return 0
    readers = [int(r) for r in args.readers.split(",")]
    kinds = [k for k in args.kinds.split(",") if k]
    header("ws_propagation: writer's set -> rec.changes() in reader processes", args)
    by: dict[tuple[str, int], list[dict[str, Any]]] = {}
    rows: list[list[Any]] = []
    with tempfile.TemporaryDirectory(prefix="crdtstore-bench-") as tmp:
        profile = args.profile.resolve() if args.profile is not None else None
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
        hub_prof = None if profile is None else profile / "hub"
        stages = Path(tmp) / "stages" if args.stages else None
        if stages is not None:
            stages.mkdir()
        hub = Hub(f"sqlite:///{Path(tmp) / 'hub.db'}", secrets.token_hex(16), hub_prof, stages)
        try:
            for rep in range(args.repeat):
                for r in readers:
                    for kind in kinds:
                        sqlite_url = f"sqlite:///{Path(tmp) / f'direct{rep}-{r}.db'}"
                        res = trial(
                            kind, hub, sqlite_url, r, n, args.rate, profile, args.flush_each,
                            stages,
                        )  # fmt: skip
                        by.setdefault((kind, r), []).append(res)
                        rows.append(
                            [
                                LABELS[kind],
                                r,
                                f"{res['load']:.1f}",
                                f"{res['n']:,}",
                                fmt(res["p50"], "ms"),
                                fmt(res["p90"], "ms"),
                                fmt(res["p99"], "ms"),
                                fmt(res["max"], "ms"),
                                res["missing"],
                                fmt(res["reader_cpu_us"], "us"),
                                fmt(res["writer_cpu_us"], "us"),
                                fmt(res["hub_cpu_us"], "us"),
                                res["appends"] or "-",
                                fmt(res["append_ms"], "ms"),
                            ]
                        )
                        print(f"   done: {kind} x{r} (load {res['load']:.2f} before)", flush=True)
        finally:
            hub.stop()
        if profile is not None:
            for path in sorted(profile.glob("reader-*.prof")):
                profile_report(path, n)
            for path in sorted(profile.glob("writer-*.prof")):
                profile_report(path, n)
            for path in sorted(profile.glob("hub-*.prof")):
                profile_report(path, n)
    print()
    print(
        f"1 writer, {n} writes at {args.rate:g}/s; latency = arrival in a reader's record "
        "(or frame, Yjs) - the writer's stamp before set; load = 1-min load average before"
    )
    table(
        [
            "variant",
            "readers",
            "load",
            "samples",
            "p50",
            "p90",
            "p99",
            "max",
            "missing",
            "reader CPU/write",
            "writer CPU/write",
            "hub CPU/write",
            "appends",
            "append p50",
        ],
        rows,
    )
    print()
    summary: list[list[Any]] = []
    results: list[Result] = []
    for r in readers:
        fig = {
            k: {q: median([x[q] for x in by[(k, r)]]) for q in ("p50", "p99")}
            for k in kinds
            if (k, r) in by
        }
        if "ws" not in fig:
            continue
        cells: list[Any] = [r]
        for q in ("p50", "p99"):
            cells.append(fmt(fig["ws"][q], "ms"))
            for base in ("yjs", "yjsdoc", "sqlite"):
                if base in fig:
                    cells.append(f"{fig['ws'][q] / fig[base][q]:.2f}x")
                else:
                    cells.append("-")
        summary.append(cells)
        for q in ("p50", "p99"):
            yjs = fig.get("yjs", {}).get(q)
            results.append(
                Result(
                    "ws_propagation",
                    f"ws:// {q} latency, {r} readers",
                    fig["ws"][q],
                    "ms",
                    yjs,
                    fig["ws"][q] / yjs if yjs else None,
                    "(vs Yjs peers through the same hub)",
                    None,
                )
            )
            doc = fig.get("yjsdoc", {}).get(q)
            if doc:
                results.append(
                    Result(
                        "ws_propagation",
                        f"ws:// {q} latency vs applying Yjs peers, {r} readers",
                        fig["ws"][q],
                        "ms",
                        doc,
                        fig["ws"][q] / doc,
                        "(vs Yjs peers applying to a doc, through the same hub)",
                        None,
                    )
                )
    table(
        [
            "readers",
            "ws:// p50",
            "/ Yjs",
            "/ Yjs doc",
            "/ SQLite",
            "ws:// p99",
            "/ Yjs",
            "/ Yjs doc",
            "/ SQLite",
        ],
        summary,
    )
    for res in results:
        res.emit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
