"""A process doing read-increment-guarded-write on one counter (tests/test_guarded_processes.py).

``python tests/_guarded_proc.py URL RUN AGENT SECONDS`` prints one JSON line at the end:
``{"ok": n, "refusals": [[tried_version, reported_version, reported_value], ...]}``.
"""

from __future__ import annotations

import json
import sys
import time

import anyio

import crdtstore


async def main(url: str, run: str, agent: str, seconds: float) -> None:
    ok = 0
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
            ok += 1
    sys.stdout.write(json.dumps({"ok": ok, "refusals": refusals}) + "\n")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
