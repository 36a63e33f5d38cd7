"""A TCP proxy in front of a real server that loses a reply together with its connection:
the command reached the server and ran, the client sees its connection drop before the
answer (what a network cut, a load balancer's reset or a server-side ``CLIENT KILL`` at the
wrong moment does). Tests of "sent again after a lost connection" use it to prove a resend
never applies a command twice.

    proxy = await LossyProxy.start(tg, "127.0.0.1", server_port)
    proxy.lose_reply_to(b"marker")   # the next command whose bytes hold b"marker" runs; its
                                     # reply is dropped and its connection closed
"""

from __future__ import annotations

import contextlib

import anyio
from anyio.abc import SocketStream, TaskGroup


class LossyProxy:
    """Forwards every connection to ``host:port``; see the module docstring."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.listen_port = 0
        self._marks: list[bytes] = []
        self.lost = 0  # replies lost so far

    @classmethod
    async def start(cls, tg: TaskGroup, host: str, port: int) -> LossyProxy:
        proxy = cls(host, port)
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        proxy.listen_port = listener.extra(anyio.abc.SocketAttribute.local_port)
        tg.start_soon(proxy._listen, listener)
        return proxy

    async def _listen(self, listener: anyio.abc.Listener[SocketStream]) -> None:
        async with listener:
            await listener.serve(self._serve)

    def lose_reply_to(self, marker: bytes) -> None:
        """Lose the reply to the next command holding ``marker`` (once per call)."""
        self._marks.append(marker)

    async def _serve(self, client: SocketStream) -> None:
        # one side going away ends the connection, as a real one would
        with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self._pump(client)

    async def _pump(self, client: SocketStream) -> None:
        doomed = anyio.Event()
        async with client, await anyio.connect_tcp(self.host, self.port) as server:
            async with anyio.create_task_group() as tg:

                async def up() -> None:
                    async for chunk in client:
                        for m in self._marks:
                            if m in chunk:
                                self._marks.remove(m)
                                doomed.set()
                                break
                        await server.send(chunk)
                    tg.cancel_scope.cancel()

                async def down() -> None:
                    async for chunk in server:
                        if doomed.is_set():
                            self.lost += 1
                            break  # the reply is dropped with the connection
                        await client.send(chunk)
                    tg.cancel_scope.cancel()

                tg.start_soon(up)
                tg.start_soon(down)
