"""A process running schedules of guarded writers, for tests/test_guarded_interleavings.py.

``python tests/_guarded_group_proc.py URL NAME`` reads one JSON command per line on stdin:
``{"run": RUN, "writers": [[[key, mode, yields], ...], ...]}``. It opens a record of ``RUN``
as agent ``NAME``, prints ``ready``, waits for a ``go`` line, then runs one task per writer,
all at once (so that they wait for the record's guarded group together). Each op writes a
value of its own (``NAME.writer.op.attempt``) to ``m[key]`` with ``expected_version``:

- ``read``: the version just read (``get_versioned``);
- ``stale``: the version this writer read at its op before (0 at its first), maybe outdated;
- ``retry``: as ``read``, and a refusal is retried at once with the version it reported
  (at most 3 times: the retry joins the group under way when there is one).

``yields`` checkpoints come before the write. Then it prints every attempt, as
``[key, value, named, "ok"]`` or ``[key, value, named, "stale", current, current_value]``,
waits for a ``sync`` line (every process is done), syncs and prints one JSON line: the
attempts, the map as this record holds it (``"state"``) and how many authority transactions
the run's writes took (``"transactions"``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread

import crdtstore


async def run_schedule(
    store: crdtstore.Store, name: str, run: str, writers: list[list[list[Any]]]
) -> dict[str, Any]:
    attempts: list[list[Any]] = []
    transactions = count_transactions(store)
    async with store.open_record(run=run, agent=name, source="tool") as rec:
        m = rec.map("m")
        await rec.sync()
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        if line.strip() != "go":
            raise SystemExit(f"expected 'go', got {line!r}")

        async def writer(w: int, ops: list[list[Any]]) -> None:
            seen: dict[str, int] = {}
            for i, (key, mode, yields) in enumerate(ops):
                for _ in range(yields):
                    await anyio.lowlevel.checkpoint()
                _, read = m.get_versioned(key)
                named = seen.get(key, 0) if mode == "stale" else (read or 0)
                seen[key] = read or 0
                for attempt in range(4 if mode == "retry" else 1):
                    value = f"{name}.{w}.{i}.{attempt}"
                    try:
                        await m.set(key, value, expected_version=named)
                    except crdtstore.StaleVersion as err:
                        attempts.append(
                            [key, value, named, "stale", err.current_version, err.current_value]
                        )
                        if type(err.current_version) is not int:
                            break
                        named = err.current_version
                        continue
                    attempts.append([key, value, named, "ok"])
                    break

        async with anyio.create_task_group() as tg:
            for w, ops in enumerate(writers):
                tg.start_soon(writer, w, ops)
        await rec.flush()
        sys.stdout.write(json.dumps(attempts) + "\n")
        sys.stdout.flush()
        line = await anyio.to_thread.run_sync(sys.stdin.readline)  # every process is done
        if line.strip() != "sync":
            raise SystemExit(f"expected 'sync', got {line!r}")
        await rec.sync()
        return {"attempts": attempts, "state": m.to_dict(), "transactions": transactions[0]}


def count_transactions(store: crdtstore.Store) -> list[int]:
    """Count the authority transactions the store's journal opens from now on."""
    backend = store.backend
    authority = getattr(backend, "_counted_authority", backend.authority)
    backend._counted_authority = authority  # type: ignore[attr-defined]
    opened = [0]

    @asynccontextmanager
    async def counted(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        opened[0] += 1
        async with authority(*args, **kwargs) as auth:
            yield auth

    backend.authority = counted  # type: ignore[method-assign]
    return opened


async def main(url: str, name: str) -> None:
    async with crdtstore.open_store(url) as store:
        while True:
            line = await anyio.to_thread.run_sync(sys.stdin.readline)
            if not line.strip():
                return
            cmd = json.loads(line)
            out = await run_schedule(store, name, cmd["run"], cmd["writers"])
            sys.stdout.write(json.dumps(out) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
