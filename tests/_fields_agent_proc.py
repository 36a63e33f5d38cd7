"""An agent process patching merge="fields" entries, for tests/journal/test_fields_processes.py.

Run as ``python tests/_fields_agent_proc.py URL RUN AGENT --field F --expect F1,F2,...
[--token T] [--n N]``: a ``sqlite:///`` store or a hub (``ws://127.0.0.1:PORT/<tenant>``,
with ``--token``). It prints ``READY`` once its record is open, reads ``go`` on stdin, then
patches field ``F`` of entries ``e0..e{N-1}`` of the map ``m`` (``AGENT:i``) and the shared
field ``last`` (every writer, so one field that all patch at once), flushes, waits until every
entry holds every field of ``--expect`` and prints ``OK {json}`` with the map and the agent
that provenance names for each field. Waits are conditions under a deadline.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import anyio
import anyio.to_thread

import crdtstore
from crdtstore import CollectionSpec, FieldMap

SCHEMA = {"m": CollectionSpec(kind="map", merge="fields")}


def say(*parts: object) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


async def main_async(args: argparse.Namespace) -> None:
    options: dict[str, Any] = {} if args.token is None else {"token": args.token}
    async with (
        crdtstore.open_store(args.url, **options) as store,
        store.open_record(args.run, args.agent, "tool", schema=SCHEMA) as rec,
    ):
        m = rec.map("m")
        assert isinstance(m, FieldMap), type(m)
        say("READY")
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        if line.strip() != "go":
            raise SystemExit(f"expected 'go' on stdin, got {line!r}")
        for i in range(args.n):
            await m.patch(f"e{i}", {args.field: f"{args.agent}:{i}", "last": args.agent})
        await rec.flush()
        keys = [f"e{i}" for i in range(args.n)]
        with anyio.fail_after(args.deadline):
            while not all(set(args.expect) <= set(m.fields(k)) for k in keys):
                await anyio.sleep(0.02)  # polling a local read; the record's tail brings entries
        await rec.sync()
        provenance = {}
        for k in keys:
            for f in m.fields(k):
                prov = m.provenance(k, f)
                provenance[f"{k}.{f}"] = None if prov is None else prov.agent
        say("OK", json.dumps({"state": m.to_json(), "provenance": provenance}))


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="_fields_agent_proc")
    p.add_argument("url")
    p.add_argument("run")
    p.add_argument("agent")
    p.add_argument("--field", required=True)
    p.add_argument("--expect", type=lambda s: s.split(","), required=True)
    p.add_argument("--token", default=None)
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--deadline", type=float, default=90.0)
    p.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    args = p.parse_args(argv)
    anyio.run(main_async, args, backend=args.backend)


if __name__ == "__main__":
    main(sys.argv[1:])
