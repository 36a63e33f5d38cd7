"""A lease holder over ``ws://`` for tests/network/test_partition.py.

``python tests/_partition_lease_proc.py URL RUN AGENT TOKEN RESOURCE TTL``: opens the run
through the hub at ``URL`` (``ws://host:port/<tenant>``) with ``TOKEN``, takes the lease on
``RESOURCE`` (waiting while another holds it), prints ``GRANT <fencing token>``; then for each
line read on stdin: ``write VALUE`` makes the fenced write ``files[RESOURCE] = VALUE`` under the
lease and prints ``WROTE VALUE`` once the hub journaled it, or ``REFUSED <code>`` if the hub
refused it; ``exit`` (or EOF) ends. One line per event on stdout, flushed at once.
"""

from __future__ import annotations

import sys

import anyio
import anyio.to_thread

import crdtstore
from crdtstore import CrdtStoreError

OPTIONS = {"min_backoff": 0.05, "max_backoff": 0.3, "connect_timeout": 30.0}


def say(*parts: object) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


async def main(url: str, run: str, agent: str, token: str, resource: str, ttl: float) -> None:
    async with (
        crdtstore.open_store(url, token=token, **OPTIONS) as store,
        store.open_record(run, agent, "tool") as rec,
    ):
        files = rec.map("files")
        lease = store.lease([resource], ttl=ttl)
        await lease.acquire()
        say("GRANT", lease.token)
        try:
            while True:
                line = await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
                words = line.split()
                if not words or words[0] == "exit":
                    return
                value = words[1]
                try:
                    with anyio.fail_after(30):
                        await files.set(resource, value, lease=lease)
                        await rec.flush()
                except CrdtStoreError as exc:
                    say("REFUSED", exc.code)
                else:
                    say("WROTE", value)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                try:
                    await lease.release()
                except CrdtStoreError as exc:
                    say("RELEASE", exc.code)


if __name__ == "__main__":
    url, run, agent, token, resource, ttl = sys.argv[1:7]
    anyio.run(main, url, run, agent, token, resource, float(ttl))
