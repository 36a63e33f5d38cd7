"""The hub's plain HTTP endpoints under ``/-/<name>/`` (``Hub.http_routes``)."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import anyio
import pytest
from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from sync import Hub


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the hub runs on websockets' asyncio implementation


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.anyio
async def test_a_route_answers_its_name_and_others_are_404(tmp_path: Path) -> None:
    hub = Hub(f"sqlite:///{tmp_path}/s.db", b"x" * 32)
    seen: list[str] = []

    async def hello(h: Hub, conn: ServerConnection, req: Request) -> Response:
        seen.append(req.path)
        return conn.respond(200, "hi\n")

    hub.http_routes["hello"] = hello
    async with anyio.create_task_group() as tg:
        port = await tg.start(hub.serve, "127.0.0.1", 0)
        base = f"http://127.0.0.1:{port}"
        assert await anyio.to_thread.run_sync(_get, f"{base}/-/hello/x?y=1") == (200, b"hi\n")
        status, body = await anyio.to_thread.run_sync(_get, f"{base}/-/nope")
        assert status == 404 and b"/-/nope" in body
        assert seen == ["/-/hello/x?y=1"]
        tg.cancel_scope.cancel()
