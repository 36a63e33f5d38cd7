"""Failure mode 7, leaky-scope, through the hub: two tenants and two runs on one store behind one
hub; every way a client could reach across is refused, and nothing of the other run is ever
sent to it (checked on the raw bytes of what it received: its document's encoding, the
results of every extension op, searched for the other runs' secrets as text and inside base64).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import JsonValue
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from crdtstore import open_store
from sync import TokenClaims, mint
from sync._ops import OPS
from tests.network.test_sync_hub import SECRET, HubUnderTest, Peer, running_hub
from tests.network.test_sync_hub import peer_at as hub_peer_at

pytestmark = pytest.mark.anyio

ACME_SECRET = "acme-shared-secret-5f2c"
ACME_OTHER_SECRET = "acme-other-run-secret-91ab"
GLOBEX_SECRET = "globex-own-data-77d0"
FOREIGN = (ACME_SECRET, ACME_OTHER_SECRET)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the hub runs on websockets' asyncio implementation


def tok(tenant: str, run: str, agent: str = "agent", mode: str = "rw") -> str:
    claims = TokenClaims.model_validate(
        {"tenant": tenant, "run": run, "agent": agent, "mode": mode, "exp": int(time.time()) + 600}
    )
    return mint(SECRET, claims)


@contextlib.asynccontextmanager
async def peer_at(hub: HubUnderTest, path: str, token: str) -> AsyncIterator[Peer]:
    """A synced client at the raw URL path ``path``."""
    async with hub_peer_at(f"{hub.base}{path}?token={token}", Peer()) as peer:
        yield peer


def leaked(data: bytes | JsonValue, secrets: tuple[str, ...] = FOREIGN) -> list[str]:
    """The ``secrets`` found in ``data``: raw bytes, or any string of a JSON value as is or
    base64-decoded (update bytes travel base64 in op results)."""
    if isinstance(data, bytes):
        return [s for s in secrets if s.encode() in data]
    if isinstance(data, str):
        found = [s for s in secrets if s in data]
        for decode in (base64.b64decode, base64.urlsafe_b64decode):
            with contextlib.suppress(binascii.Error, ValueError):
                found += leaked(decode(data + "=" * (-len(data) % 4)), secrets)
        return found
    if isinstance(data, dict):
        return [s for k, v in data.items() for s in leaked(k, secrets) + leaked(v, secrets)]
    if isinstance(data, list):
        return [s for v in data for s in leaked(v, secrets)]
    return []


async def refusal(url: str) -> tuple[int, bytes]:
    """How the hub refused ``url``: the HTTP status and body of a refused upgrade (a bad path),
    or, for a token refused with a close after the upgrade (the hub's default), the HTTP status
    its 44xx code mirrors and its reason, asserting that no frame came before the close."""
    try:
        async with connect(url) as ws:
            try:
                frame = await ws.recv()
            except ConnectionClosed as exc:
                rcvd = exc.rcvd
            else:
                pytest.fail(f"{url}: a frame before the close: {frame!r}")
    except InvalidStatus as exc:
        return exc.response.status_code, exc.response.body
    assert rcvd is not None and 4400 <= rcvd.code < 4500, (url, rcvd)
    return rcvd.code - 4000, rcvd.reason.encode()


async def journals(url: str) -> dict[tuple[str, str], list[Any]]:
    out = {}
    for tenant in ("acme", "globex"):
        async with open_store(url, tenant=tenant) as store:
            for info in await store.runs():
                out[(tenant, info.run)] = await store.journal(info.run)
    return out


async def test_nothing_crosses_runs_or_tenants_through_the_hub(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub:
        # the data: a secret in each acme run; globex has a run of the same name
        async with peer_at(hub, "/acme/shared-name", tok("acme", "shared-name", "a")) as a:
            await a.set("k", ACME_SECRET)
            await a.flush()
        async with peer_at(hub, "/acme/other", tok("acme", "other", "a")) as a:
            await a.set("k", ACME_OTHER_SECRET)
            await a.flush()
        async with peer_at(hub, "/globex/shared-name", tok("globex", "shared-name", "g")) as g:
            await g.set("k", GLOBEX_SECRET)
            await g.flush()
        with anyio.fail_after(10):
            await hub.hub.wait_until(lambda h: not h.loaded_runs())
        before = await journals(hub.store_url)
        assert set(before) == {
            ("acme", "shared-name"),
            ("acme", "other"),
            ("globex", "shared-name"),
        }

        # refused at the upgrade (a token: with 44xx just after it): (path, token, statuses)
        other_run = tok("acme", "other")
        attempts: list[tuple[str, str, set[int]]] = [
            ("/acme/shared-name", other_run, {403}),  # another run's token
            ("/acme/shared-name", tok("globex", "shared-name"), {403}),  # same run, other tenant
            ("/acme/shared-name", tok("globex", "*"), {403}),  # tenant-wide token, other tenant
            ("/acme/other", tok("acme", "shared*"), {403}),  # prefix token outside its prefix
            ("/acme/shared-name", tok("acme", "other*"), {403}),
            ("/acme/other%2F..%2Fshared-name", other_run, {400, 403, 404}),
            ("/acme/other%2f..%2fshared-name", other_run, {400, 403, 404}),
            ("/acme/..%2Fshared-name", other_run, {400, 403, 404}),
            ("/acme/other/../shared-name", other_run, {400, 403, 404}),
            ("/acme/other%252F..%252Fshared-name", other_run, {400, 403, 404}),
            ("/acme/%2e%2e", other_run, {400, 403, 404}),
            ("/acme/other%00", other_run, {400, 403, 404}),
            ("/acme//other", other_run, {400, 403, 404}),
            ("/acme/other/", other_run, {400, 403, 404}),
            ("/acme%2Fother/shared-name", other_run, {400, 403, 404}),
            ("/globex/..%2Facme%2Fshared-name", tok("globex", "*"), {400, 403, 404}),
            ("/globex%2F..%2Facme/shared-name", tok("globex", "*"), {400, 403, 404}),
            ("/acme/shared-name", tok("acme", "shared-name").replace(".", ".x", 1), {401}),
        ]
        for path, token, statuses in attempts:
            status, body = await refusal(f"{hub.base}{path}?token={token}")
            assert status in statuses, (path, status)
            assert leaked(body) == [], path
            assert hub.hub.loaded_runs() == {}, path  # nothing was even loaded

        # globex's own run of the same name: only its own data, and every op, whatever run or
        # tenant its params name, answers about globex/shared-name at most
        param_sets: list[dict[str, Any]] = [
            {},
            {"run": "shared-name", "tenant": "acme"},
            {"tenant": "acme"},
            {"run": "other"},
            {"after": 0},
            {"after": 0, "run": "other", "tenant": "acme"},
            {"collection": "notes", "key": "k", "run": "shared-name", "tenant": "acme"},
            {"collection": "notes", "key": "k"},
            {"key": "k", "tenant": "acme"},
        ]
        async with peer_at(hub, "/globex/shared-name", tok("globex", "*", "g")) as g:
            assert g.notes() == {"k": GLOBEX_SECRET}
            assert leaked(bytes(g.doc.get_update())) == []
            answered = 0
            own_data_seen = 0  # the detector works: globex's own secret does come back
            for name in sorted(OPS):
                for params in param_sets:
                    request, frame = g.session.request(name, params)
                    assert g.ws is not None
                    await g.ws.send(frame)
                    await g.wait(lambda r=request: r.id in g.responses or g.closed)
                    assert not g.closed, (name, params, g.close_code)
                    response = g.responses[request.id]
                    result = response.model_dump(mode="json")
                    assert leaked(result) == [], (name, params)
                    own_data_seen += bool(leaked(result, (GLOBEX_SECRET,)))
                    answered += 1
            assert answered == len(OPS) * len(param_sets)
            assert own_data_seen > 0
            await g.request("flush")
            assert leaked(bytes(g.doc.get_update())) == []
            assert hub.hub.loaded_runs() == {("globex", "shared-name"): 1}
            assert ACME_SECRET not in str(g.awareness)

    after = await journals(hub.store_url)
    for key in [("acme", "shared-name"), ("acme", "other")]:
        assert after[key] == before[key], key  # the acme runs are untouched
