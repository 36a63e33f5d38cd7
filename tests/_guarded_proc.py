"""A process doing read-increment-guarded-write on one counter
(tests/journal/test_guarded_processes.py).

``python tests/_guarded_proc.py URL RUN AGENT SECONDS [--retry]`` prints one JSON line at the
end: ``{"ok": n, "refusals": [[tried_version, reported_version, reported_value], ...],
"unknown": m}``. With ``--retry``, a write that fails with ``BackendError`` (the server away)
is counted in ``unknown`` (it may or may not have been journaled) and the loop goes on.
"""

from __future__ import annotations

import json
import sys
import time

import anyio

import crdtstore


async def main(url: str, run: str, agent: str, seconds: float, retry: bool = False) -> None:
    ok = unknown = 0
    refusals: list[list[object]] = []
    async with (
        crdtstore.open_store(url) as store,
        store.open_record(run=run, agent=agent, source="tool") as rec,
    ):
        counter = rec.map("counter")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            value, version = counter.get_versioned("n")
            try:
                await counter.set("n", (value or 0) + 1, expected_version=version or 0)
            except crdtstore.StaleVersion as err:
                refusals.append([version, err.current_version, err.current_value])
                continue
            except crdtstore.BackendError:
                if not retry:
                    raise
                unknown += 1
                await anyio.sleep(0.05)  # the server is away: try again shortly
                continue
            ok += 1
    out = {"ok": ok, "refusals": refusals, "unknown": unknown}
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    retry = "--retry" in sys.argv[5:]
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), retry)
