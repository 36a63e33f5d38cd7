"""The viewer's plain HTTP side (``/-/view/``, :mod:`sync._viewer`), its op and ``crdtstore
view``, without a browser: the headers every answer carries (a strict CSP), the index of runs
and who may read it, the op ``view.connections``, and the address the command prints."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from websockets.asyncio.client import connect

from crdtstore import InvalidValue, open_store
from sync import Hub, HubLimits, Request, TokenClaims, decode, encode, mint, verify
from sync._cli_view import view_url
from sync._viewer import content_security_policy

SECRET = b"viewer-http-secret-0123456789"
TENANT = "acme"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the hub runs on websockets' asyncio implementation


def token(run: str, *, mode: str = "ro", tenant: str = TENANT, exp: float = 3600) -> str:
    claims = TokenClaims.model_validate(
        {
            "tenant": tenant,
            "run": run,
            "agent": "viewer",
            "mode": mode,
            "exp": int(time.time() + exp),
        }
    )
    return mint(SECRET, claims)


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.fixture
async def base(tmp_path: Path) -> AsyncIterator[str]:
    hub = Hub(f"sqlite:///{tmp_path}/store.db", SECRET, limits=HubLimits(close_timeout=0.5))
    async with anyio.create_task_group() as tg:
        port = await tg.start(hub.serve, "127.0.0.1", 0)
        async with open_store(f"ws://127.0.0.1:{port}/{TENANT}", token=rw("*")) as store:
            for run in ("team-a", "team-b", "private"):
                async with store.open_record(run, "alice") as rec:
                    await rec.map("notes").set("x", run)
        yield f"http://127.0.0.1:{port}"
        tg.cancel_scope.cancel()


def rw(run: str) -> str:
    return token(run, mode="rw")


async def fetch(
    url: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    return await anyio.to_thread.run_sync(get, url, headers)


@pytest.mark.anyio
async def test_pages_and_files_carry_a_strict_content_security_policy(base: str) -> None:
    host = base.removeprefix("http://")
    for path, kind in (
        (f"/-/view/{TENANT}/team-a", "text/html"),
        (f"/-/view/{TENANT}/", "text/html"),
        ("/-/view/", "text/html"),
        ("/-/view/viewer.js", "text/javascript"),
        ("/-/view/viewer.css", "text/css"),
        ("/-/view/favicon.svg", "image/svg+xml"),
    ):
        status, headers, body = await fetch(base + path)
        assert status == 200, path
        assert headers["Content-Type"].startswith(kind), path
        csp = headers["Content-Security-Policy"]
        assert csp == content_security_policy(host)
        assert (
            "script-src 'self';" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
        )
        assert f"connect-src 'self' ws://{host} wss://{host};" in csp
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Referrer-Policy"] == "no-referrer"
        if kind == "text/html":
            assert b"<script>" not in body and not re.search(rb"\son\w+=", body)  # no inline code
            assert b'<script src="/-/view/viewer.js" defer></script>' in body
    status, _, _ = await fetch(base + "/-/view/nothing.js")
    assert status == 404


@pytest.mark.anyio
async def test_the_index_lists_the_runs_a_read_only_token_covers(base: str) -> None:
    url = f"{base}/-/view/{TENANT}/?list=runs"

    async def runs(tok: str | None) -> tuple[int, Any]:
        headers = {} if tok is None else {"Authorization": f"Bearer {tok}"}
        status, _, body = await fetch(url, headers)
        return status, json.loads(body)

    assert [r["run"] for r in (await runs(token("team-*")))[1]["runs"]] == ["team-a", "team-b"]
    assert [r["run"] for r in (await runs(token("*")))[1]["runs"]] == [
        "private",
        "team-a",
        "team-b",
    ]
    status, body = await runs(token("team-a"))
    assert status == 200 and [r["run"] for r in body["runs"]] == ["team-a"]
    assert body["runs"][0]["head"] == 1 and body["runs"][0]["state"] == "open"
    # refused, with the code and no run named
    for tok, want in (
        (None, (401, "TOKEN_INVALID")),
        ("not-a-token", (401, "TOKEN_INVALID")),
        (token("*", exp=-10), (401, "TOKEN_EXPIRED")),
        (token("*", tenant="other"), (403, "FORBIDDEN")),
        (rw("*"), (403, "FORBIDDEN")),  # the viewer takes read-only tokens only
        (
            mint(
                b"another-secret-0123456789",
                TokenClaims.model_validate(
                    {
                        "tenant": TENANT,
                        "run": "*",
                        "agent": "x",
                        "mode": "ro",
                        "exp": int(time.time()) + 60,
                    }
                ),
            ),
            (401, "TOKEN_INVALID"),
        ),
    ):
        status, body = await runs(tok)
        assert (status, body["error"]["code"]) == want, tok
        assert "team-a" not in json.dumps(body)
    status, _, body = await fetch(f"{base}/-/view/a..b/?list=runs")
    assert status == 400 and json.loads(body)["error"]["code"] == "INVALID_NAME"


@pytest.mark.anyio
async def test_view_connections_is_a_reading_op_and_writes_stay_refused(base: str) -> None:
    ws_url = base.replace("http://", "ws://") + f"/{TENANT}/team-a?token={token('team-a')}"
    async with connect(ws_url, subprotocols=["crdtstore"]) as ws:  # type: ignore[list-item]

        async def call(op: str, params: dict[str, Any] | None = None) -> Any:
            await ws.send(encode(Request(id=op, op=op, params=params or {})))
            while True:
                message = decode(await ws.recv())  # type: ignore[arg-type]
                if getattr(message, "id", None) == op:
                    return message

        answer = await call("view.connections")
        assert answer.error is None
        assert answer.result == [{"agent": "viewer", "mode": "ro", "protocol": "crdtstore"}]
        for op in ("journal.append", "config.put", "lease.request", "lease.release"):
            refused = await call(op)
            assert refused.error is not None and refused.error.code == "READ_ONLY", op


def test_view_url_makes_a_read_only_token_for_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRDTSTORE_SECRET", SECRET.decode())
    url = view_url("ws://127.0.0.1:8765/acme", "r 1")
    page, _, tok = url.partition("#token=")
    assert page == "http://127.0.0.1:8765/-/view/acme/r%201"
    claims = verify(SECRET, tok, tenant="acme", run="r 1")
    assert claims.mode == "ro" and claims.agent == "viewer" and claims.jti
    assert view_url("wss://hub.example:443", "nightly-*", tenant="t").startswith(
        "https://hub.example:443/-/view/t/#token="
    )
    with pytest.raises(InvalidValue):
        view_url("sqlite:///x.db", "r")
    with pytest.raises(InvalidValue):
        view_url("ws://h:1/acme", "r", tenant="other")


def test_crdtstore_view_prints_the_address_and_opens_nothing(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "crdtstore"
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "BROWSER": "false"}
    env.pop("CRDTSTORE_SECRET", None)
    out = subprocess.run(
        [
            str(script),
            "view",
            "--store",
            "ws://127.0.0.1:9/",
            "--run",
            "r1",
            "--tenant",
            "acme",
            "--secret-file",
            str(secret),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    url = out.stdout.strip().splitlines()[-1]
    assert url.startswith("http://127.0.0.1:9/-/view/acme/r1#token=")
    assert verify(SECRET, url.partition("#token=")[2]).mode == "ro"
    missing = subprocess.run(
        [str(script), "view", "--store", "ws://127.0.0.1:9", "--run", "r1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert missing.returncode == 1 and "SECRET" in missing.stderr
    helped = subprocess.run(
        [str(script), "view", "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert helped.returncode == 0 and "--store" in helped.stdout, helped.stderr
