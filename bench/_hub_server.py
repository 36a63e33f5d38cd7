"""A WebSocket sync server in a process of its own, for ``bench/hub.py``.

    python bench/_hub_server.py crdtstore --store sqlite:///tmp/x/store.db  # $CRDTSTORE_SECRET
    python bench/_hub_server.py pycrdt [--preload /t/big=/tmp/x/big.update]
    python bench/_hub_server.py ystore --store sqlite:///tmp/x/store.db
    python bench/_hub_server.py relay

``crdtstore``: our hub (:class:`sync.Hub`) with its default limits. ``pycrdt``:
pycrdt-websocket's ``WebsocketServer`` behind a ``websockets`` server (the same WebSocket
library and settings as our hub: no compression), through a small ``Channel`` adapter; with
``--preload PATH=FILE`` the room ``PATH`` is created before the first client, its document
holding the update in ``FILE`` (a run's record as pycrdt-websocket would serve it).
``ystore``: the same pycrdt-websocket server whose rooms persist every update in
pycrdt-store's ``SQLiteYStore`` (``--store``'s path + ``.ystore.db``; one row and commit per
update, no squashing): the persistent peer. ``relay``: no document at all, each update frame
relayed as is to the other connections of its path (the WebSocket frame built once and written
to each socket, as our hub's broadcast does): the floor for a Python hub on ``websockets``.

Prints ``PORT <n>`` on stdout once listening; stops on SIGTERM/SIGINT. ``--profile FILE``
writes a cProfile of the whole process there on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import logging
import os
import signal
import sys
import time
from typing import Any


async def serve_crdtstore(store: str) -> None:
    import anyio

    from sync import Hub

    hub = Hub(store, os.environ["CRDTSTORE_SECRET"].encode())
    async with anyio.create_task_group() as tg:
        port = await tg.start(hub.serve, "127.0.0.1", 0)
        print(f"PORT {port}", flush=True)
        await _until_signal()
        tg.cancel_scope.cancel()


class _Channel:
    """pycrdt's ``Channel`` over a ``websockets`` server connection."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self.path: str = ws.request.path

    def __aiter__(self) -> _Channel:
        return self

    async def __anext__(self) -> bytes:
        from websockets.exceptions import ConnectionClosed

        try:
            return await self.recv()
        except ConnectionClosed:
            raise StopAsyncIteration from None

    async def send(self, message: bytes) -> None:
        from websockets.exceptions import ConnectionClosed

        with contextlib.suppress(ConnectionClosed):  # the room drops it when its recv ends
            await self._ws.send(message)

    async def recv(self) -> bytes:
        return bytes(await self._ws.recv())


async def serve_pycrdt(preload: list[tuple[str, bytes]], ystore_db: str | None = None) -> None:
    from pycrdt import Doc
    from pycrdt.websocket import WebsocketServer, YRoom
    from websockets.asyncio.server import serve

    server_class: Any = WebsocketServer
    if ystore_db is not None:
        # every room persists its updates in pycrdt-store's SQLiteYStore (one row and one
        # commit per update, written in a task of the room): what a pycrdt-websocket user
        # does to keep a document across restarts
        from pycrdt.store import SQLiteYStore

        class _Store(SQLiteYStore):
            db_path = ystore_db
            document_ttl = None  # never squash during the benchmark

        class _Server(WebsocketServer):  # type: ignore[misc]
            async def get_room(self, name: str) -> YRoom:
                if name not in self.rooms:
                    self.rooms[name] = YRoom(
                        ready=self.rooms_ready, ystore=_Store(name), log=self.log
                    )
                room = self.rooms[name]
                await self.start_room(room)
                return room

        server_class = _Server

    async with server_class(log=logging.getLogger("pycrdt-websocket")) as server:
        for path, update in preload:
            doc: Doc[Any] = Doc()
            doc.apply_update(update)
            room = YRoom(ready=True, ydoc=doc, log=server.log)
            server.rooms[path] = room
            await server.start_room(room)
        server.auto_clean_rooms = not preload  # keep preloaded rooms when their clients leave

        async def handler(ws: Any) -> None:
            await server.serve(_Channel(ws))

        async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            print(f"PORT {port}", flush=True)
            await _until_signal()


async def serve_relay() -> None:
    """The floor: relay each update frame to the other connections of the path, the
    WebSocket frame built once and written to each open socket (synchronous writes, no task
    per send, no document: what our hub's broadcast does, without anything else); a sync
    step 1 is answered with an empty step 2."""
    from websockets.asyncio.server import serve
    from websockets.exceptions import ConnectionClosed
    from websockets.frames import Frame, Opcode
    from websockets.protocol import State

    def broadcast(conns: list[Any], frame: bytes) -> None:
        wire = Frame(Opcode.BINARY, frame).serialize(mask=False, extensions=())
        for c in conns:
            if c.protocol.state is State.OPEN:
                c.transport.write(wire)

    empty_step2 = b"\x00\x01\x02\x00\x00"
    rooms: dict[str, set[Any]] = {}

    async def handler(ws: Any) -> None:
        room = rooms.setdefault(ws.request.path, set())
        room.add(ws)
        try:
            async for frame in ws:
                if frame[:2] == b"\x00\x02":
                    broadcast([c for c in room if c is not ws], frame)
                elif frame[:2] == b"\x00\x00":
                    await ws.send(empty_step2)
        except ConnectionClosed:
            pass
        finally:
            room.discard(ws)

    async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as ws_server:
        port = ws_server.sockets[0].getsockname()[1]
        print(f"PORT {port}", flush=True)
        await _until_signal()


async def _until_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=["crdtstore", "pycrdt", "ystore", "relay"])
    ap.add_argument("--store", help="store URL (crdtstore)")
    ap.add_argument("--preload", action="append", default=[], metavar="PATH=FILE")
    ap.add_argument("--profile", metavar="FILE", help="write a cProfile of the process here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # CPU time, not wall time: on a loaded machine wall time would count preemption
    profiler = cProfile.Profile(time.process_time) if args.profile else None
    if profiler is not None:
        profiler.enable()
    try:
        if args.kind == "crdtstore":
            asyncio.run(serve_crdtstore(args.store))
        elif args.kind in ("pycrdt", "ystore"):
            rooms = []
            for spec in args.preload:
                path, _, file = spec.partition("=")
                with open(file, "rb") as f:
                    rooms.append((path, f.read()))
            ystore_db = None
            if args.kind == "ystore":
                assert args.store, "ystore needs --store (a SQLite path for SQLiteYStore)"
                ystore_db = args.store.removeprefix("sqlite:///") + ".ystore.db"
            asyncio.run(serve_pycrdt(rooms, ystore_db))
        else:
            asyncio.run(serve_relay())
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)


if __name__ == "__main__":
    main()
