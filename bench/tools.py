"""Agent tools: a tool call against the direct API doing the same work, and an MCP round trip
over stdio against the same calls in-process and an MCP server with one no-op tool.

    python bench/tools.py            # 200 blocks of 50 ops per side and variant; 2,000 MCP calls
    python bench/tools.py --quick    # 40 blocks of 50 ops; 500 MCP calls per tool

- **tool call vs direct API**, one record on a ``sqlite:///`` store in a temp dir (batched
  durability, the default), 100 keys overwritten in turn with a small dict:
  ``await ts.call("store_put", {...})`` against ``await m.set(k, v); await rec.flush()``
  (both journaled before they return); ``store_get`` against ``m.get_versioned(k)`` + flush
  (and, as a second baseline, with the ``rec.sync()`` that store_get makes to see other
  writers); ``store_append`` against ``lst.append(v)`` + flush. ``store_put`` is also timed
  with its arguments as JSON text, as a model emits them. Short blocks of ``--ops`` calls, tool
  and direct blocks alternating (ABBA) for ``--rounds`` rounds, so both sides meet the same
  load; per-op medians over the blocks, on wall time (the target) and CPU time of this
  process (steadier on a shared machine). Target: at most 1.3x direct.
- **MCP over stdio**: the real client (``mcp.ClientSession`` over ``stdio_client``) launching
  ``crdtstore mcp --store sqlite:///... --run R --agent A`` (the console script beside this
  interpreter), calling ``store_put`` and ``store_get`` in turn; per-call latency p50/p99.
  Baselines in the same run, interleaved by chunks: the same calls through an in-process
  ``Toolset`` on the same store file (another run, so that neither side applies the other's
  writes; the ratio is the transport's cost), and an ``MCPServer`` with
  one no-op tool (a script written to a temp file), the SDK's own floor. Target: p50 <= 2 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from _common import Result, header, median, percentile, table

import crdtstore
from crdtstore.tools import Toolset

TARGET_RATIO = 1.3
TARGET_MCP_P50_MS = 2.0
KEYS = 100

NOOP_SERVER = """\
from mcp.server.mcpserver import MCPServer

server = MCPServer("noop", log_level="WARNING")


@server.tool()
def noop() -> str:
    \"\"\"Do nothing.\"\"\"
    return "ok"


server.run()
"""

Op = Callable[[int], Awaitable[Any]]
Timing = tuple[float, float]  # (wall seconds, CPU seconds of this process)


def value(i: int) -> dict[str, Any]:
    return {"text": f"finding {i}: the cache is cold", "confidence": 0.5, "n": i}


async def block(op: Op, start: int, n: int) -> Timing:
    w0, c0 = time.perf_counter(), time.process_time()
    for i in range(start, start + n):
        await op(i)
    return time.perf_counter() - w0, time.process_time() - c0


# -- tool call vs direct API ---------------------------------------------------------------------


def variants(rec: crdtstore.Record, ts: Toolset) -> dict[str, tuple[Op, Op, str]]:
    """name -> (tool op, direct op, what the direct op is)."""
    m, lst = rec.map("m"), rec.list("log")
    put_json = [
        json.dumps({"collection": "m", "key": f"k{i % KEYS}", "value": value(i)})
        for i in range(KEYS)
    ]  # the arguments as a model emits them (value(i % KEYS): a fixed set of texts)

    async def tool_put(i: int) -> Any:
        return await ts.call("store_put", {"collection": "m", "key": f"k{i % KEYS}",
                                           "value": value(i)})  # fmt: skip

    async def tool_put_json(i: int) -> Any:
        return await ts.call("store_put", put_json[i % KEYS])

    async def direct_put(i: int) -> None:
        await m.set(f"k{i % KEYS}", value(i))
        await rec.flush()

    async def direct_put_sync(i: int) -> None:
        await rec.sync()
        await m.set(f"k{i % KEYS}", value(i))
        await rec.flush()

    async def tool_get(i: int) -> Any:
        return await ts.call("store_get", {"collection": "m", "key": f"k{i % KEYS}"})

    async def direct_get(i: int) -> Any:
        got = m.get_versioned(f"k{i % KEYS}")
        await rec.flush()
        return got

    async def direct_get_sync(i: int) -> Any:
        await rec.sync()
        got = m.get_versioned(f"k{i % KEYS}")
        await rec.flush()
        return got

    async def tool_append(i: int) -> Any:
        return await ts.call("store_append", {"collection": "log", "value": value(i)})

    async def direct_append(i: int) -> None:
        await lst.append(value(i))
        await rec.flush()

    async def direct_append_sync(i: int) -> None:
        await rec.sync()
        await lst.append(value(i))
        await rec.flush()

    # the rows "... vs sync" do the rec.sync() that each of these tools makes first (to decide
    # on what other writers wrote): what is left between the two is the toolset's own cost
    return {
        "store_put": (tool_put, direct_put, "m.set + flush"),
        "store_put (JSON text)": (tool_put_json, direct_put, "m.set + flush"),
        "store_put vs sync": (tool_put, direct_put_sync, "sync + m.set + flush"),
        "store_get": (tool_get, direct_get, "m.get_versioned + flush"),
        "store_get vs sync": (tool_get, direct_get_sync, "sync + get_versioned + flush"),
        "store_append": (tool_append, direct_append, "list.append + flush"),
        "store_append vs sync": (tool_append, direct_append_sync, "sync + append + flush"),
    }


async def in_process(
    url: str, ops: int, rounds: int
) -> tuple[dict[str, dict[str, list[Timing]]], dict[str, str]]:
    """Per variant, the (wall, CPU) time of each block of each side; and what each direct
    side does."""
    out: dict[str, dict[str, list[Timing]]] = {}
    async with crdtstore.open_store(url) as store:
        async with store.open_record("tools-bench", "agent", "model") as rec:
            async with Toolset(rec) as ts:
                table_ = variants(rec, ts)
                for tool, direct, _ in table_.values():  # warm up: 100 keys exist, code paths hot
                    await block(tool, 0, KEYS)
                    await block(direct, 0, KEYS)
                for r in range(rounds):
                    for name, (tool, direct, _) in table_.items():
                        times = out.setdefault(name, {"tool": [], "direct": []})
                        order = [("tool", tool), ("direct", direct)]
                        if r % 2:
                            order.reverse()  # ABBA: neither side always runs first
                        for side, op in order:
                            times[side].append(await block(op, r * ops, ops))
                descr = {name: d for name, (_, _, d) in table_.items()}
    return out, descr


def report_in_process(
    times: dict[str, dict[str, list[Timing]]], ops: int, rounds: int, descr: dict[str, str]
) -> list[Result]:
    rows, results = [], []
    for name, t in times.items():
        tool_us = median([w for w, _ in t["tool"]]) / ops * 1e6
        direct_us = median([w for w, _ in t["direct"]]) / ops * 1e6
        tool_cpu = median([c for _, c in t["tool"]]) / ops * 1e6
        direct_cpu = median([c for _, c in t["direct"]]) / ops * 1e6
        ratio = tool_us / direct_us
        met = ratio <= TARGET_RATIO
        headline = "vs sync" not in name  # the target is against the brief's direct API
        rows.append([name, f"{tool_us:.1f} us", f"{direct_us:.1f} us ({descr[name]})",
                     f"{ratio:.2f}x", f"{tool_cpu / direct_cpu:.2f}x",
                     ("met" if met else "MISSED") if headline else "(where it goes)"])  # fmt: skip
        results.append(Result("tools", f"{name} via ts.call vs direct", tool_us, "us/op",
                              direct_us, ratio, f"<= {TARGET_RATIO}x" if headline else "-",
                              met if headline else None))  # fmt: skip
    print()
    print(f"tool call vs direct API, sqlite:///, {ops:,} ops per block, median of {rounds} blocks")
    table(["tool", "ts.call", "direct (same work)", "ratio", "ratio, CPU", "target"], rows)
    return results


# -- MCP over stdio ------------------------------------------------------------------------------


def mcp_calls() -> list[tuple[str, Callable[[int], dict[str, Any]]]]:
    return [
        ("store_put", lambda i: {"collection": "m", "key": f"k{i % KEYS}", "value": value(i)}),
        ("store_get", lambda i: {"collection": "m", "key": f"k{i % KEYS}"}),
    ]


async def mcp_round_trips(
    url: str, tmp: Path, calls: int, chunk: int
) -> dict[str, dict[str, list[float]]] | str:
    """Latencies (seconds) per tool: ``mcp``, ``in_process``, and the no-op server's; or why
    the MCP part could not run."""
    try:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client
    except ImportError:
        return "the mcp SDK is not installed (pip install -e '.[mcp]')"
    exe = Path(sys.executable).parent / "crdtstore"
    if not exe.exists():
        return f"no console script {exe}"
    noop_path = tmp / "noop_server.py"
    noop_path.write_text(NOOP_SERVER)
    ours = StdioServerParameters(
        command=str(exe), args=["mcp", "--store", url, "--run", "mcp-bench", "--agent", "mcp"]
    )
    noop = StdioServerParameters(command=sys.executable, args=[str(noop_path)])
    lat: dict[str, dict[str, list[float]]] = {
        name: {"mcp": [], "in_process": []} for name, _ in mcp_calls()
    }
    lat["noop"] = {"mcp": []}
    errlog = (tmp / "mcp-servers.log").open("w")
    try:
        async with (
            stdio_client(ours, errlog=errlog) as (r1, w1),
            ClientSession(r1, w1) as crdt,
            stdio_client(noop, errlog=errlog) as (r2, w2),
            ClientSession(r2, w2) as floor,
            crdtstore.open_store(url) as store,
            store.open_record("mcp-bench-local", "in-process", "model") as rec,
            Toolset(rec) as ts,
        ):
            await crdt.initialize()
            await floor.initialize()
            await crdt.list_tools()
            await floor.list_tools()

            async def over_mcp(name: str, args: dict[str, Any]) -> None:
                res = await crdt.call_tool(name, args)
                if res.is_error:
                    raise RuntimeError(f"{name} over MCP: {res.structured_content}")

            async def locally(name: str, args: dict[str, Any]) -> None:
                res = await ts.call(name, args)
                if "error" in res:
                    raise RuntimeError(f"{name} in-process: {res}")

            async def nothing(name: str, args: dict[str, Any]) -> None:
                await floor.call_tool("noop", {})

            sides = [("mcp", over_mcp), ("in_process", locally)]
            for i in range(50):  # warm up both sides and the no-op server
                for name, make in mcp_calls():
                    for _, call in sides:
                        await call(name, make(i))
                await nothing("noop", {})
            done = 0
            while done < calls:
                n = min(chunk, calls - done)
                for side, call in sides:
                    for i in range(done, done + n):
                        for name, make in mcp_calls():
                            args = make(i)
                            t0 = time.perf_counter()
                            await call(name, args)
                            lat[name][side].append(time.perf_counter() - t0)
                for _ in range(n):
                    t0 = time.perf_counter()
                    await nothing("noop", {})
                    lat["noop"]["mcp"].append(time.perf_counter() - t0)
                sides.reverse()
                done += n
    except BaseException:
        errlog.flush()
        print((tmp / "mcp-servers.log").read_text()[-4000:], file=sys.stderr)  # servers' stderr
        raise
    finally:
        errlog.close()
    return lat


def report_mcp(lat: dict[str, dict[str, list[float]]], calls: int) -> list[Result]:
    def ms(xs: list[float], p: float) -> float:
        return percentile(xs, p) * 1000

    floor50, floor99 = ms(lat["noop"]["mcp"], 50), ms(lat["noop"]["mcp"], 99)
    rows, results = [], []
    for name in (n for n, _ in mcp_calls()):
        m50, m99 = ms(lat[name]["mcp"], 50), ms(lat[name]["mcp"], 99)
        i50, i99 = ms(lat[name]["in_process"], 50), ms(lat[name]["in_process"], 99)
        met = m50 <= TARGET_MCP_P50_MS
        rows.append([name, f"{m50:.2f} / {m99:.2f} ms", f"{i50:.3f} / {i99:.3f} ms",
                     f"{m50 / i50:.1f}x", f"{m50 - i50:.2f} ms",
                     f"{floor50:.2f} / {floor99:.2f} ms", "met" if met else "MISSED"])  # fmt: skip
        results.append(Result("tools", f"MCP stdio {name} p50", m50, "ms", i50, m50 / i50,
                              f"p50 <= {TARGET_MCP_P50_MS} ms", met))  # fmt: skip
    print()
    print(f"MCP round trip over stdio, {calls:,} calls per tool (store_put, store_get in turn)")
    table(["tool", "MCP p50 / p99", "in-process ts.call p50 / p99", "ratio p50",
           "transport p50", "no-op MCP tool p50 / p99", "target"], rows)  # fmt: skip
    results.append(Result("tools", "MCP stdio no-op tool p50 (SDK floor)", floor50, "ms", None,
                          None, "-", None))  # fmt: skip
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="40 blocks per side, 500 MCP calls")
    ap.add_argument("--ops", type=int, help="ops per block (default 50)")
    ap.add_argument("--rounds", type=int, help="blocks per side (default 200; --quick 40)")
    ap.add_argument("--calls", type=int, help="MCP calls per tool (default 2,000; --quick 500)")
    ap.add_argument("--no-mcp", action="store_true", help="skip the MCP round trips")
    args = ap.parse_args(argv)
    ops = args.ops or 50
    rounds = args.rounds or (40 if args.quick else 200)
    calls = args.calls or (500 if args.quick else 2000)
    header("tools: agent tool calls vs the direct API, MCP over stdio", args)
    tmp = Path(tempfile.mkdtemp(prefix="bench-tools-"))
    url = f"sqlite:///{tmp / 'store.db'}"

    try:
        times, descr = anyio.run(in_process, url, ops, rounds)
        results = report_in_process(times, ops, rounds, descr)
        if not args.no_mcp:
            lat = anyio.run(mcp_round_trips, url, tmp, calls, max(50, calls // 10))
            if isinstance(lat, str):
                print(f"\nMCP round trips skipped: {lat}")
            else:
                results += report_mcp(lat, calls)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n   load average after: {os.getloadavg()[0]:.2f}")
    for res in results:
        res.emit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
