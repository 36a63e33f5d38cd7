"""Steps for the flow tests' kernel processes (``call: "tests._flow_steps:work"``).

``work`` reports on a side file (``inputs.log``: one line per event, each one ``write()``,
so a line read whole was written whole before any kill) and writes to the record: it appends
its call id to the list ``log`` and sets ``out[<step path>]`` to the step path (the same in
every attempt). With ``inputs.gate`` it waits until that file exists before it ends; with
``inputs.sleep`` it sleeps that long first. A ``start`` line ends with the rank of the
step's lease (0 without one).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio

from crdtstore.flow import StepContext


def report(path: str, *parts: object) -> None:
    line = " ".join(str(p) for p in parts) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def work(ctx: StepContext) -> dict[str, Any]:
    log = ctx.inputs["log"]
    rank = ctx.lease.rank if ctx.lease is not None else 0  # its place in the lease queue
    report(log, "start", ctx.step, ctx.attempt, os.getpid(), time.monotonic(), rank)
    await ctx.list("log").append(ctx.call_id)
    await ctx.map("out").set(ctx.step, ctx.step)
    await ctx.record.flush()
    if ctx.inputs.get("sleep"):
        await anyio.sleep(float(ctx.inputs["sleep"]))
    gate = ctx.inputs.get("gate")
    while gate and not Path(gate).exists():
        await anyio.sleep(0.01)  # (a helper process: the test opens the gate)
    report(log, "end", ctx.step, ctx.attempt, os.getpid(), time.monotonic())
    return {"step": ctx.step}
