"""The ``script`` executor: a command run as a subprocess, with the store in its environment.

Environment given to the command (on top of the kernel's own and the executor's ``env``):

==========================  ==================================================================
``CRDTSTORE_STORE``         the store URL (``crdtstore get/put ... $CRDTSTORE_STORE``)
``CRDTSTORE_TENANT``        the tenant
``CRDTSTORE_RUN``           the run the step writes under (a nested workflow's: the nested run)
``CRDTSTORE_STEP``          the step's path (``verify/lint``)
``CRDTSTORE_AGENT``         the step's agent id
``CRDTSTORE_SOURCE``        ``tool`` (the source kind of the script's writes)
``CRDTSTORE_CALL``          the attempt's call id (``<root run>:<path>#<attempt>``)
``CRDTSTORE_ATTEMPT``       the attempt number
``CRDTSTORE_TOKEN``         the kernel's access token (``ws://`` stores only)
``CRDTSTORE_LEASE_ID``      the step's lease on its ``owned_files`` (when it has some) ...
``CRDTSTORE_LEASE_TOKEN``   ... and its fencing token, for external systems that check it
==========================  ==================================================================

The command runs in a session of its own; cancelling the step (a timeout, a join decided,
the kernel stopped) kills the whole process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream

from ._errors import StepFailed
from ._spec import ScriptExecutor

__all__ = ["process_start", "run_script", "stop_left_over"]

MAX_LINE = 1000  # characters kept of one output line


LINGER = 0.5  # seconds the output may stay open after the command exits (its children)


async def _drain(stream: ByteReceiveStream | None, keep: deque[str], done: anyio.Event) -> None:
    try:
        if stream is None:
            return
        partial = b""
        async for chunk in stream:
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()[-4 * MAX_LINE :]
            keep.extend(line.decode(errors="replace")[:MAX_LINE] for line in lines)
        if partial:
            keep.append(partial.decode(errors="replace")[:MAX_LINE])
    finally:
        done.set()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, /proc), None if it is gone
    (or there is no /proc): with the pid it names one process, whatever reuse of pids."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]  # field 22, counted after the command name


def stop_left_over(pid: int, start: str) -> bool:
    """Kill the process group of a command a killed kernel left running, if that process is
    still the one recorded; return whether it was."""
    if process_start(pid) != start:
        return False
    _kill_group(pid)
    return True


async def run_script(
    ex: ScriptExecutor,
    env: Mapping[str, str],
    *,
    step: str,
    attempt: int,
    on_start: Callable[[int, str], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Run the command to its end; return ``{"exit_code", "duration", "stdout", "stderr"}``
    (the last ``ex.tail`` lines of each).

    ``on_start(pid, start_time)`` is awaited once the command runs (the kernel records it).

    Raises:
        StepFailed: it could not be started, or exited with a non-zero status (the result is
            attached to the error).
    """
    started = time.monotonic()
    full_env = {**os.environ, **ex.env, **env}
    out: deque[str] = deque(maxlen=ex.tail)
    err: deque[str] = deque(maxlen=ex.tail)
    try:
        proc = await anyio.open_process(
            ex.run,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            cwd=ex.cwd,
            start_new_session=True,
        )
    except OSError as exc:
        raise StepFailed(
            step, attempt, f"cannot start {ex.run!r}: {exc}",
            error={"code": "SCRIPT_START", "message": str(exc)},
        ) from None  # fmt: skip
    try:
        if on_start is not None:
            await on_start(proc.pid, process_start(proc.pid) or "")
        drained = (anyio.Event(), anyio.Event())
        async with anyio.create_task_group() as tg:
            tg.start_soon(_drain, proc.stdout, out, drained[0])
            tg.start_soon(_drain, proc.stderr, err, drained[1])
            code = await proc.wait()
            with anyio.move_on_after(LINGER) as linger:
                for event in drained:
                    await event.wait()
            if linger.cancelled_caught:
                # children it left behind hold its output open (so they are alive, and the
                # group id cannot have been reused): they go with it
                _kill_group(proc.pid)
    except BaseException:
        # cancelled (timeout, join, kernel stopping): the command and its children go too
        with anyio.CancelScope(shield=True):
            _kill_group(proc.pid)
            await proc.wait()
            await proc.aclose()
        raise
    await proc.aclose()
    result = {
        "exit_code": code,
        "duration": round(time.monotonic() - started, 6),
        "stdout": "\n".join(out),
        "stderr": "\n".join(err),
    }
    if code != 0:
        raise StepFailed(
            step, attempt, f"exit status {code}",
            error={"code": "EXIT_STATUS", "message": f"exit status {code}", "exit_code": code},
            result=result,
        )  # fmt: skip
    return result
