"""The hub's per-update work without sockets, for callgrind or a CPU-time A/B.

    PYTHONHASHSEED=0 valgrind --tool=callgrind python bench/_hub_record.py --n 330 --made 500
    python bench/_hub_record.py --n 3000         # CPU us per update (process_time)

A :class:`sync.Hub` (never served) loads a run of a ``sqlite:///`` store with its group
commit (journal window as the hub's), and a connection stub's frames go through what the hub
does with a writer's update frame: the session's ``receive_update`` (check, size
reservation), ``Hub._apply`` (``Record.apply_update`` as the token's writer, the broadcast to
no other connection), and every ``--batch`` updates (2.8 per commit in bench/hub.py at 100/s)
the group commit. The updates are bench/hub.py's writer's: one key of a 64-key map set to a
string holding the sequence number. ``--warm`` updates run first and are not counted. For
instructions per update, run it under callgrind for two ``--n`` with the same ``--made`` and
divide the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from typing import Any

REGISTRY = "__crdtstore_collections"  # (as bench/_hub_peers.py)


def _frames(n: int) -> list[bytes]:
    from pycrdt import Doc, Map

    from sync import ClientSession, PycrdtDocument

    doc: Doc[Any] = Doc()
    session = ClientSession(PycrdtDocument(doc))
    notes = doc.get("notes", type=Map)
    registry = doc.get(REGISTRY, type=Map)
    state = doc.get_state()
    registry["notes"] = "map"
    out = [session.update_frame(doc.get_update(state))]
    for seq in range(n):
        state = doc.get_state()
        notes[f"k{seq % 64}"] = f"~SEQ{seq}~"
        out.append(session.update_frame(doc.get_update(state)))
    return out


class _Conn:
    """What ``Hub._apply`` and ``_receive`` use of a connection."""

    def __init__(self, room: Any, session: Any, writer: Any) -> None:
        self.room, self.session, self.writer = room, session, writer
        self.close_with: tuple[int, str] | None = None

    def send(self, frame: bytes) -> None:  # pragma: no cover - nothing is refused here
        raise AssertionError(f"a reply: {frame!r}")

    def close(self, code: int, reason: str) -> None:
        raise AssertionError(f"closed {code}: {reason}")


async def main(n: int, warm: int, batch: int, made: int = 0, profile_to: str | None = None) -> None:
    from crdtstore import Writer, open_store
    from sync import Hub, ServerSession
    from sync._hub_runs import HUB_AGENT, _CheckingDocument, _Room

    frames = _frames(max(warm + n, made))
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/store.db"
        hub = Hub(url, b"s" * 32)
        async with open_store(url, tenant="t") as store:
            from crdtstore import Record

            rec = Record(store, "r", HUB_AGENT, "system", create=True)
            await rec.start()
            room = _Room("t", "r")
            room.commit = rec.commit_on_loop(hub.limits.journal_window)
            room.attach(rec, len(rec.replica.doc.get_update()))
            hub.metrics.watch_record(rec)
            session = ServerSession(
                _CheckingDocument(room, hub.limits.max_document_bytes),
                max_message_size=hub.limits.max_message_size,
            )
            conn: Any = _Conn(room, session, Writer("w", "tool"))

            async def feed(chunk: list[bytes]) -> None:
                for i, frame in enumerate(chunk, 1):
                    update = session.receive_update(frame)
                    assert update is not None
                    await hub._apply(conn, update, frame)
                    if i % batch == 0:
                        await rec.flush()
                await rec.flush()

            await feed(frames[: warm + 1])
            profile = None
            if profile_to:
                import cProfile

                profile = cProfile.Profile()
                profile.enable()
            t0 = time.process_time()
            await feed(frames[warm + 1 : warm + 1 + n])
            spent = time.process_time() - t0
            if profile is not None:
                profile.disable()
                profile.dump_stats(profile_to)
            await rec.aclose()
        print(f"{n} updates: {spent / n * 1e6:.1f} us CPU per update (batch {batch})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=600)
    ap.add_argument("--warm", type=int, default=100)
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument(
        "--made",
        type=int,
        default=0,
        help="updates made at least (the same in both callgrind runs)",
    )
    ap.add_argument("--profile", help="write a cProfile of the counted updates there")
    a = ap.parse_args()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    asyncio.run(main(a.n, a.warm, a.batch, a.made, a.profile))
