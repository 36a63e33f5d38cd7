"""A second process holding a record while another one redacts a value
(tests/journal/test_redaction.py).

``python tests/_redact_proc.py URL RUN SECRET``: opens the record, prints ``ready`` once it
reads the secret, then waits (no reopen) until the value is gone from what every API returns
and from the document's own encoding, and prints ``dropped`` (or ``stuck ...`` on timeout).
"""

from __future__ import annotations

import sys

import anyio

import crdtstore

DEADLINE = 30.0


def say(*parts: object) -> None:
    print(*parts, flush=True)


async def main(url: str, run: str, secret: str) -> None:
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run=run, agent="reader", create=False) as rec:
            assert secret in str(rec.to_dict()), rec.to_dict()
            say("ready")
            blob = secret.encode()
            with anyio.move_on_after(DEADLINE):
                while True:
                    await rec.sync()
                    history = [h.value for h in await rec.history("m", "k")]
                    changes = [e.effect for e in await store.journal(run)]
                    seen = [
                        secret in str(rec.to_dict()),
                        rec.map("m").get("k") is not None,
                        secret in str(history),
                        secret in str(changes),
                        blob in rec.replica.doc.get_update(),
                    ]
                    if not any(seen):
                        say("dropped")
                        return
                    await anyio.sleep(0.05)
            say("stuck", seen)


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:4])
