"""A ``ws://`` client process holding a record while another client redacts values through
the hub (tests/network/test_redact_ws.py).

``python tests/_redact_ws_proc.py URL RUN TOKEN SECRET [SECRET ...]``: opens the record
through the hub, prints ``ready`` once its document holds every secret, then waits (no
reopen) until none is left in what the record returns (``to_dict``, ``history`` of ``m/k``,
the journal's effects), in its document's own encoding or in the entries its connection
kept from the hub's pushes, and prints ``dropped CONNECTS`` (how many times its connection
was made: 1 when it never reconnected), or ``stuck ...`` on timeout.
"""

from __future__ import annotations

import sys

import anyio

import crdtstore

DEADLINE = 60.0


def say(*parts: object) -> None:
    print(*parts, flush=True)


async def main(url: str, run: str, token: str, *secrets: str) -> None:
    async with crdtstore.open_store(url, token=token, connect_timeout=30.0) as store:
        async with store.open_record(run=run, agent="ignored", create=False) as rec:
            with anyio.fail_after(DEADLINE):
                while not all(s.encode() in rec.replica.doc.get_update() for s in secrets):
                    await rec.sync()
                    await anyio.sleep(0.02)
            say("ready")
            link = store.backend._links[run]  # type: ignore[attr-defined]
            seen: list[str] = []
            with anyio.move_on_after(DEADLINE):
                while True:
                    await rec.sync()
                    history = [h.value for h in await rec.history("m", "k")]
                    effects = str([e.effect for e in await store.journal(run, limit=10_000)])
                    doc = rec.replica.doc.get_update()
                    kept = b"".join(r.update for r in link.rows.values())
                    seen = [
                        f"{s} in {where}"
                        for s in secrets
                        for where, found in (
                            ("to_dict", s in str(rec.to_dict())),
                            ("history", s in str(history)),
                            ("journal", s in effects),
                            ("document", s.encode() in doc),
                            ("kept pushes", s.encode() in kept),
                        )
                        if found
                    ]
                    if not seen:
                        say("dropped", link.connects)
                        return
                    await anyio.sleep(0.05)
            say("stuck", seen)


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:])
