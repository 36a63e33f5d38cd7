"""Client processes for ``bench/hub.py``: observers, a writer, a joining client.

The same code talks to both servers (our hub and pycrdt-websocket): plain ``websockets``
connections (no compression) speaking y-protocols with :mod:`sync`'s message encoding. Every
process prints protocol lines on stdout (``READY``, ``SYNCED``, ``DONE``, then one ``RESULT
{json}``) and reads ``GO`` on stdin where it must wait for the parent.

    observers URL... --n N         # one observer per URL; stamps each update's arrival
    observers URL... --n N --apply # ... in its pycrdt Doc (applied, seen by an observer)
    writer URL --n N --rate R      # sends N small map updates at R/s (0: as fast as it can)
    join URL --keys K              # time from connect to the full document applied

Observers do not apply the updates: each update's value carries a marker ``~SEQ<n>~`` that
they find in the frame bytes and stamp with ``time.monotonic_ns()`` (one clock for every
process of the machine). With ``--apply`` they are Yjs peers: each applies the sync step 2 and
every update to a pycrdt ``Doc`` and stamps a marker when the doc's map event shows it (what a
y-websocket client's observer sees). The writer stamps each update just before ``ws.send``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

MARKER = b"~SEQ"
REGISTRY = "__crdtstore_collections"
# Observers import neither sync nor pycrdt (process start-up); hub.py checks that these are
# sync.encode(SyncStep1(empty state vector)) and sync.encode(SyncStep2(empty update)).
EMPTY_STEP1 = b"\x00\x00\x01\x00"
EMPTY_STEP2 = b"\x00\x01\x02\x00\x00"


def _line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


async def _stdin_line() -> str:
    return await asyncio.to_thread(sys.stdin.readline)


async def _connect(url: str) -> ClientConnection:
    return await connect(url, compression=None, max_size=None, open_timeout=60)


# -- observers ----------------------------------------------------------------------------------


def _payload(frame: bytes) -> bytes:
    """The update of a sync step 2 or update frame (after its two type bytes, a varUint
    length and the bytes)."""
    length, shift, at = 0, 0, 2
    while True:
        b = frame[at]
        at += 1
        length |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return frame[at : at + length]


def _applier(n: int, stamp: Any) -> Any:
    """``apply(update)`` into a pycrdt doc whose ``notes`` map observer calls ``stamp(seq)``
    for every ``~SEQ<n>~`` value it sees set."""
    from pycrdt import Doc, Map

    doc: Doc[Any] = Doc()
    notes = doc.get("notes", type=Map)

    def seen(event: Any) -> None:
        for change in event.keys.values():
            value = change.get("newValue")
            if isinstance(value, str) and value.startswith("~SEQ"):
                stamp(int(value[4:-1]))

    held = (doc, notes, notes.observe(seen))  # (a dropped subscription stops observing)

    def apply(update: bytes) -> None:
        held[0].apply_update(update)

    return apply


async def observers(urls: list[str], n: int, deadline: float, apply: bool = False) -> None:
    arrivals = [[0] * n for _ in urls]
    counts = [0] * len(urls)
    synced = [asyncio.Event() for _ in urls]
    all_done = asyncio.Event()
    finished = 0
    closed: list[int | None] = [None] * len(urls)
    sockets: list[ClientConnection] = []

    async def observe(i: int, url: str) -> None:
        nonlocal finished
        mine = arrivals[i]

        def stamp(seq: int) -> None:
            nonlocal finished
            if seq < n and not mine[seq]:
                mine[seq] = time.monotonic_ns()
                counts[i] += 1
                if counts[i] == n:
                    finished += 1
                    if finished == len(urls):
                        all_done.set()

        doc_apply = _applier(n, stamp) if apply else None
        ws = await _connect(url)
        sockets.append(ws)
        await ws.send(EMPTY_STEP1)
        try:
            async for frame in ws:
                assert isinstance(frame, bytes)
                if frame[0] != 0:  # awareness etc.
                    continue
                sub = frame[1]
                if doc_apply is not None and sub in (1, 2):  # a peer: into its doc
                    doc_apply(_payload(frame))
                    if sub == 1:
                        synced[i].set()
                elif sub == 2:  # update
                    at = frame.find(MARKER)
                    if at < 0:
                        continue
                    end = frame.index(b"~", at + 4)
                    seq = int(frame[at + 4 : end])
                    if seq < n and not mine[seq]:
                        mine[seq] = time.monotonic_ns()
                        counts[i] += 1
                        if counts[i] == n:
                            finished += 1
                            if finished == len(urls):
                                all_done.set()
                elif sub == 1:
                    synced[i].set()
                elif sub == 0:  # pycrdt-websocket asks for our (empty) state
                    await ws.send(EMPTY_STEP2)
        except ConnectionClosed:
            pass
        closed[i] = ws.close_code

    tasks = [asyncio.create_task(observe(i, u)) for i, u in enumerate(urls)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in synced)), 120)
    _line("READY")
    if n == 0:  # only hold the connections open until the parent says so
        await _stdin_line()
        await _close(sockets, tasks)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_done.wait(), deadline)
    _line("DONE")
    await _stdin_line()  # close once the parent has read the server's CPU time
    await _close(sockets, tasks)
    _line("RESULT " + json.dumps({"arrivals": arrivals, "counts": counts, "closed": closed}))


async def _close(sockets: list[ClientConnection], tasks: list[asyncio.Task[None]]) -> None:
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    for t in tasks:
        t.cancel()


# -- writer -------------------------------------------------------------------------------------


async def writer(url: str, n: int, rate: float) -> None:
    from pycrdt import Doc, Map

    from sync import ClientSession, PycrdtDocument

    doc: Doc[Any] = Doc()
    session = ClientSession(PycrdtDocument(doc))
    ws = await _connect(url)
    synced = asyncio.Event()

    async def reader() -> None:  # completes the handshake, then drains (pycrdt-websocket echoes)
        try:
            async for frame in ws:
                assert isinstance(frame, bytes)
                if synced.is_set() and frame[:2] == b"\x00\x02":
                    continue
                received = session.receive(frame)
                for reply in received.reply_frames():
                    await ws.send(reply)
                if session.synced:
                    synced.set()
        except ConnectionClosed:
            pass

    task = asyncio.create_task(reader())
    for frame in session.start():
        await ws.send(frame)
    await asyncio.wait_for(synced.wait(), 120)
    notes = doc.get("notes", type=Map)
    registry = doc.get(REGISTRY, type=Map)
    if "notes" not in registry:  # our hub wants the map registered as a collection
        state = doc.get_state()
        registry["notes"] = "map"
        await ws.send(session.update_frame(doc.get_update(state)))
    _line("SYNCED")
    await _stdin_line()  # GO
    sent = [0] * n
    t0 = time.monotonic()
    for seq in range(n):
        if rate > 0:
            delay = t0 + seq / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        state = doc.get_state()
        notes[f"k{seq % 64}"] = f"~SEQ{seq}~"
        frame = session.update_frame(doc.get_update(state))
        sent[seq] = time.monotonic_ns()
        await ws.send(frame)
    _line("SENT")
    _line("RESULT " + json.dumps({"sent": sent, "seconds": time.monotonic() - t0}))
    await _stdin_line()  # the parent says when the observers are done
    task.cancel()
    await ws.close()


# -- a joining client ---------------------------------------------------------------------------


async def join(url: str, keys: int, collection: str) -> None:
    from pycrdt import Doc, Map

    from sync import ClientSession, PycrdtDocument, SyncStep2

    doc: Doc[Any] = Doc()
    session = ClientSession(PycrdtDocument(doc))
    t0 = time.monotonic()
    ws = await _connect(url)
    t_open = time.monotonic()
    for frame in session.start():
        await ws.send(frame)
    size = 0
    async for frame in ws:
        assert isinstance(frame, bytes)
        received = session.receive(frame)  # applies the step 2 into the Doc
        for reply in received.reply_frames():
            await ws.send(reply)
        if isinstance(received.message, SyncStep2):
            size = len(frame)
            break
    t_done = time.monotonic()
    got = len(doc.get(collection, type=Map))
    await ws.close()
    _line(
        "RESULT "
        + json.dumps(
            {
                "seconds": t_done - t0,
                "open": t_open - t0,
                "bytes": size,
                "keys": got,
                "ok": got == keys,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    o = sub.add_parser("observers")
    o.add_argument("urls", nargs="+")
    o.add_argument("--n", type=int, required=True)
    o.add_argument("--deadline", type=float, default=120.0)
    o.add_argument("--apply", action="store_true", help="apply to a pycrdt doc, stamp its events")
    w = sub.add_parser("writer")
    w.add_argument("url")
    w.add_argument("--n", type=int, required=True)
    w.add_argument("--rate", type=float, required=True)
    j = sub.add_parser("join")
    j.add_argument("url")
    j.add_argument("--keys", type=int, required=True)
    j.add_argument("--collection", default="big")
    args = ap.parse_args()
    if args.mode == "observers":
        asyncio.run(observers(args.urls, args.n, args.deadline, args.apply))
    elif args.mode == "writer":
        asyncio.run(writer(args.url, args.n, args.rate))
    else:
        asyncio.run(join(args.url, args.keys, args.collection))


if __name__ == "__main__":
    main()
