"""The hub over real WebSockets on 127.0.0.1: sync, provenance from tokens, auth, limits.

Clients are the pure :class:`sync.ClientSession` over a ``websockets`` client connection and a
bare pycrdt ``Doc``. Nothing sleeps to wait for sync: every wait is on a condition, under an
``anyio.fail_after`` deadline.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from pycrdt import Doc, Map
from typer.testing import CliRunner
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

import sync
from crdtstore import InvalidValue, open_store
from crdtstore.cli import app
from sync import (
    Awareness,
    AwarenessEntry,
    ClientSession,
    CloseCode,
    Hub,
    HubLimits,
    PycrdtDocument,
    QueryAwareness,
    Response,
    SyncStep1,
    TokenClaims,
    Update,
    encode,
    encode_awareness_update,
    mint,
)

pytestmark = pytest.mark.anyio

SECRET = b"hub-test-secret-0123456789"
TENANT = "t1"
RUN = "r1"
REGISTRY = "__crdtstore_collections"
DEADLINE = 10.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the hub runs on websockets' asyncio implementation


def token(
    agent: str,
    *,
    tenant: str = TENANT,
    run: str = RUN,
    mode: str = "rw",
    exp: float | None = None,
    secret: bytes = SECRET,
) -> str:
    claims = TokenClaims.model_validate(
        {
            "tenant": tenant,
            "run": run,
            "agent": agent,
            "mode": mode,
            "exp": int(time.time() + 3600 if exp is None else exp),
        }
    )
    return mint(secret, claims)


# -- harness --------------------------------------------------------------------------------


class Peer:
    """A Python client: a pycrdt Doc synced through a ClientSession over one connection."""

    def __init__(self, doc: Doc[Any] | None = None) -> None:
        self.doc: Doc[Any] = doc if doc is not None else Doc()
        self.session = ClientSession(PycrdtDocument(self.doc))
        self.ws: ClientConnection | None = None
        self.responses: dict[int | str, Response] = {}
        self.step2_sent = False
        self.closed = False
        self.close_code: int | None = None
        self.frames = 0
        self.awareness: dict[int, str] = {}  # client id -> JSON state, as last received
        self._changed = anyio.Event()

    def _fire(self) -> None:
        old, self._changed = self._changed, anyio.Event()
        old.set()

    async def wait(self, predicate: Callable[[], bool]) -> None:
        with anyio.fail_after(DEADLINE):
            while not predicate():
                await self._changed.wait()

    async def reader(self) -> None:
        assert self.ws is not None
        try:
            async for frame in self.ws:
                assert isinstance(frame, bytes)
                received = self.session.receive(frame)
                for reply in received.reply_frames():
                    await self.ws.send(reply)
                if isinstance(received.message, SyncStep1):
                    self.step2_sent = True
                for entry in received.awareness:
                    self.awareness[entry.client_id] = entry.state
                if isinstance(received.message, Response):
                    self.responses[received.message.id] = received.message
                self.frames += 1
                self._fire()
        except ConnectionClosed:
            pass
        finally:
            self.closed = True
            self.close_code = self.ws.close_code
            self._fire()

    def notes(self) -> dict[str, Any]:
        return dict(self.doc.get("notes", type=Map).items())

    async def set(self, key: str, value: Any) -> None:
        """Write notes[key] = value locally and send the update (the map is registered as a
        crdtstore map collection, so the hub derives the write's effect and provenance)."""
        before = self.doc.get_state()
        with self.doc.transaction():
            registry = self.doc.get(REGISTRY, type=Map)
            if "notes" not in registry:
                registry["notes"] = "map"
            self.doc.get("notes", type=Map)[key] = value
        if self.ws is not None and not self.closed:
            await self.ws.send(self.session.update_frame(self.doc.get_update(before)))

    async def request(self, op: str) -> Response:
        assert self.ws is not None
        request, frame = self.session.request(op)
        await self.ws.send(frame)
        await self.wait(lambda: request.id in self.responses or self.closed)
        return self.responses[request.id]

    async def flush(self) -> None:
        """Return once the hub journaled everything this connection sent (frames are handled
        in order; the step 2 answering the hub's step 1 is waited for first)."""
        await self.wait(lambda: self.step2_sent or (self.session.synced and self.read_only))
        response = await self.request("flush")
        assert response.ok, response

    read_only = False


P = TypeVar("P", bound="Peer")


@contextlib.asynccontextmanager
async def peer_at(url: str, peer: P, *, wait_synced: bool = True) -> AsyncIterator[P]:
    """``peer`` connected to ``url`` (a run's URL with its token), reading in a task, and
    synced with the hub (unless ``wait_synced`` is false)."""
    async with connect(url, max_size=None) as ws:
        peer.ws = ws
        async with anyio.create_task_group() as tg:
            tg.start_soon(peer.reader)
            for frame in peer.session.start():
                await ws.send(frame)
            if wait_synced:
                await peer.wait(lambda: peer.session.synced or peer.closed)
            yield peer
            tg.cancel_scope.cancel()


class HubUnderTest:
    def __init__(self, hub: Hub, port: int, url: str) -> None:
        self.hub = hub
        self.base = f"ws://127.0.0.1:{port}"
        self.store_url = url

    def url(self, tok: str | None, tenant: str = TENANT, run: str = RUN) -> str:
        query = "" if tok is None else f"?token={tok}"
        return f"{self.base}/{tenant}/{run}{query}"

    @contextlib.asynccontextmanager
    async def peer(
        self,
        tok: str,
        doc: Doc[Any] | None = None,
        *,
        run: str = RUN,
        read_only: bool = False,
        wait_synced: bool = True,
    ) -> AsyncIterator[Peer]:
        peer = Peer(doc)
        peer.read_only = read_only
        async with peer_at(self.url(tok, run=run), peer, wait_synced=wait_synced):
            yield peer

    async def journal(self, run: str = RUN) -> list[Any]:
        async with open_store(self.store_url, tenant=TENANT) as store:
            if run not in {r.run for r in await store.runs()}:
                return []
            return await store.journal(run)

    async def wait_unloaded(self) -> None:
        with anyio.fail_after(DEADLINE):
            await self.hub.wait_until(lambda h: not h.loaded_runs())


@contextlib.asynccontextmanager
async def running_hub(
    tmp_path: Path, *, refuse_with: str = "close", **limits: Any
) -> AsyncIterator[HubUnderTest]:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    hub = Hub(
        url,
        SECRET,
        limits=HubLimits(**limits),
        refuse_with="http" if refuse_with == "http" else "close",
    )
    async with anyio.create_task_group() as tg:
        port = await tg.start(hub.serve, "127.0.0.1", 0)
        yield HubUnderTest(hub, port, url)
        tg.cancel_scope.cancel()


async def refused(url: str, subprotocols: list[str] | None = None) -> tuple[int, str]:
    """Connect to a hub refusing the connection (``refuse_with="close"``): the upgrade
    completes and the hub closes at once; assert no frame came before the close, and return
    its code and reason."""
    with anyio.fail_after(DEADLINE):
        async with connect(url, subprotocols=subprotocols) as ws:  # type: ignore[arg-type]
            try:
                frame = await ws.recv()
            except ConnectionClosed as exc:
                rcvd = exc.rcvd
            else:
                pytest.fail(f"a frame before the close: {frame!r}")
    assert rcvd is not None, "closed without a close frame"
    return rcvd.code, rcvd.reason


async def http_refused(url: str, subprotocols: list[str] | None = None) -> tuple[int, bytes]:
    """Connect to a hub refusing the upgrade (``refuse_with="http"``): status and body."""
    with pytest.raises(InvalidStatus) as info:
        async with connect(url, subprotocols=subprotocols):  # type: ignore[arg-type]
            pass
    return info.value.response.status_code, info.value.response.body


# -- sync and provenance --------------------------------------------------------------------


async def test_two_clients_converge_and_the_journal_names_the_token_agents(
    tmp_path: Path,
) -> None:
    async with running_hub(tmp_path) as hub:
        async with hub.peer(token("alice")) as alice, hub.peer(token("bob")) as bob:
            await alice.set("a", 1)
            await bob.wait(lambda: bob.notes().get("a") == 1)
            await bob.set("b", 2)
            await alice.wait(lambda: alice.notes().get("b") == 2)
            await alice.set("c", 3)
            await bob.set("c", 4)  # concurrent writes to one key: both converge
            await alice.wait(lambda: alice.notes() == bob.notes() and len(bob.notes()) == 3)
            await bob.wait(lambda: alice.notes() == bob.notes())
            await alice.flush()
            await bob.flush()
            assert hub.hub.loaded_runs() == {(TENANT, RUN): 2}

            # a writer on the store itself (another process, say) reaches the clients too
            async with (
                open_store(hub.store_url, tenant=TENANT) as store,
                store.open_record(RUN, "embedded", "tool") as rec,
            ):
                await rec.map("notes").set("e", 5)
                await rec.flush()
            await alice.wait(lambda: alice.notes().get("e") == 5)
            await bob.wait(lambda: bob.notes().get("e") == 5)
            final = alice.notes()

        await hub.wait_unloaded()  # the last client left: the run's document is unloaded
        entries = await hub.journal()
        agents = [e.agent for e in entries]
        assert set(agents) == {"alice", "bob", "embedded"}, agents
        assert agents.count("alice") == 2 and agents.count("bob") == 2
        assert "hub" not in agents
        assert {e.source for e in entries if e.agent != "embedded"} == {"model"}
        async with open_store(hub.store_url, tenant=TENANT) as store:
            assert [h.provenance.agent for h in await store.history(RUN, "notes", "a")] == ["alice"]
            assert [h.provenance.agent for h in await store.history(RUN, "notes", "b")] == ["bob"]
            replayed = await store.replay(RUN)
            assert replayed.to_dict()["notes"] == final


async def test_a_reconnecting_client_s_offline_edit_is_journaled(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub:
        doc: Doc[Any] = Doc()
        async with hub.peer(token("alice"), doc) as alice:
            await alice.set("online", 1)
            await alice.flush()
        await hub.wait_unloaded()
        before = len(await hub.journal())

        offline = Peer(doc)  # no connection: the edit stays in the document
        await offline.set("offline", 2)

        async with hub.peer(token("bob")) as bob:
            assert bob.notes() == {"online": 1}
            async with hub.peer(token("alice"), doc) as alice:
                # the hub's sync step 1 asked for what it misses: alice's step 2 carries it
                await bob.wait(lambda: bob.notes().get("offline") == 2)
                await alice.flush()

        entries = await hub.journal()
        assert len(entries) == before + 1
        assert entries[-1].agent == "alice"
        assert entries[-1].effect == [["map", "notes", "set", "offline", 2]]


async def test_awareness_is_relayed_answered_and_removed(tmp_path: Path) -> None:
    def presence(client: int, clock: int, state: str) -> bytes:
        return encode(Awareness(encode_awareness_update([AwarenessEntry(client, clock, state)])))

    async with running_hub(tmp_path) as hub:
        async with hub.peer(token("alice")) as alice, hub.peer(token("bob")) as bob:
            assert alice.ws is not None and bob.ws is not None
            await alice.ws.send(presence(11, 1, '{"user":"alice"}'))
            await bob.wait(lambda: bob.awareness.get(11) == '{"user":"alice"}')
            await alice.wait(lambda: 11 in alice.awareness)  # echoed to the sender too
            async with hub.peer(token("carol", mode="ro"), read_only=True) as carol:
                # a new connection gets the run's awareness states when it joins
                await carol.wait(lambda: carol.awareness.get(11) == '{"user":"alice"}')
                carol.awareness.clear()
                assert carol.ws is not None
                await carol.ws.send(encode(QueryAwareness()))
                await carol.wait(lambda: 11 in carol.awareness)
            await alice.ws.close()  # alice leaves: her clients are removed for everyone
            await bob.wait(lambda: bob.awareness.get(11) == "null")
        assert await hub.journal() == []  # presence is never journaled


# -- auth and scope -------------------------------------------------------------------------


def _other_than(tail: str) -> str:
    """Two base64url characters that are not ``tail`` (a signature ending in "AA" made the
    "forged" one the real one: 1 run in 4,096)."""
    return "AA" if tail != "AA" else "BA"


def bad_tokens() -> list[tuple[str, str | None, int, str]]:
    """(name, token, HTTP status, error code) of every way a token for TENANT/RUN is refused."""
    now = time.time()
    good = token("alice")
    payload, _, signature = good.partition(".")
    forged_claims = token("mallory", secret=b"another-secret-0123456789")
    other_payload = token("alice", run="r2").partition(".")[0]
    forged = f"{payload}.{signature[:-2]}{_other_than(signature[-2:])}"
    return [
        ("missing", None, 401, "TOKEN_INVALID"),
        ("garbage", "not-a-token", 401, "TOKEN_INVALID"),
        ("forged signature", forged, 401, "TOKEN_INVALID"),
        ("other secret", forged_claims, 401, "TOKEN_INVALID"),
        ("tampered payload", f"{other_payload}.{signature}", 401, "TOKEN_INVALID"),
        ("expired", token("alice", exp=now - 1), 401, "TOKEN_EXPIRED"),
        ("wrong run", token("alice", run="r2"), 403, "FORBIDDEN"),
        ("wrong tenant", token("alice", tenant="t2"), 403, "FORBIDDEN"),
        ("prefix of other runs", token("alice", run="r2*"), 403, "FORBIDDEN"),
    ]


async def test_bad_tokens_are_closed_with_44xx_before_any_document_byte(tmp_path: Path) -> None:
    """Default (``refuse_with="close"``): the upgrade completes, then the hub closes with
    4401/4403 and ``"<CODE>: <reason>"`` (final for y-websocket), sending no frame first."""
    forged_claims = token("mallory", secret=b"another-secret-0123456789")
    async with running_hub(tmp_path) as hub:
        assert hub.hub.refuse_with == "close"
        for name, tok, status, code in bad_tokens():
            close_code, reason = await refused(hub.url(tok))
            assert close_code == 4400 + status - 400, (name, close_code, reason)
            assert reason.startswith(f"{code}: "), (name, reason)
        close_code, reason = await refused(
            hub.url(None), subprotocols=[f"crdtstore.token.{forged_claims}"]
        )
        assert (close_code, reason.split(":")[0]) == (CloseCode.UNAUTHORIZED, "TOKEN_INVALID")
        assert hub.hub.loaded_runs() == {}  # nothing was loaded for them

        # a prefix token covers the runs it names; the token may also come as a subprotocol
        async with hub.peer(token("alice", run="r*")) as alice:
            await alice.set("k", 1)
            await alice.flush()
        sub = f"crdtstore.token.{token('bob')}"
        async with connect(hub.url(None), subprotocols=[sub]) as ws:  # type: ignore[list-item]
            assert ws.subprotocol == sub
            assert isinstance(await ws.recv(), bytes)  # the hub's sync step 1
    assert [e.agent for e in await hub.journal()] == ["alice"]


async def test_bad_tokens_are_refused_at_the_upgrade_with_refuse_with_http(
    tmp_path: Path,
) -> None:
    forged_claims = token("mallory", secret=b"another-secret-0123456789")
    async with running_hub(tmp_path, refuse_with="http") as hub:
        for name, tok, status, code in bad_tokens():
            got_status, body = await http_refused(hub.url(tok))
            assert got_status == status, name
            assert body.startswith(code.encode() + b": "), (name, body)
        got_status, body = await http_refused(
            hub.url(None), subprotocols=[f"crdtstore.token.{forged_claims}"]
        )
        assert got_status == 401 and body.startswith(b"TOKEN_INVALID")
        assert hub.hub.loaded_runs() == {}
        async with hub.peer(token("alice")) as alice:  # a good token is served as usual
            await alice.set("k", 1)
            await alice.flush()
    assert [e.agent for e in await hub.journal()] == ["alice"]


def test_refuse_with_must_be_close_or_http(tmp_path: Path) -> None:
    with pytest.raises(InvalidValue):
        Hub(f"sqlite:///{tmp_path / 'store.db'}", SECRET, refuse_with="html")  # type: ignore[arg-type]


async def test_read_only_connections_cannot_write(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub:
        async with hub.peer(token("alice")) as alice:
            await alice.set("a", 1)
            await alice.flush()
            count = len(await hub.journal())
            async with hub.peer(token("reader", mode="ro"), read_only=True) as reader:
                assert reader.notes() == {"a": 1}  # it reads
                await reader.set("x", 666)
                await reader.wait(lambda: reader.session.refused == 1)
                assert "read-only" in (reader.session.last_denied or "")
                await alice.set("b", 2)  # and keeps receiving updates
                await reader.wait(lambda: reader.notes().get("b") == 2)
            await alice.flush()
            assert "x" not in alice.notes()
            entries = await hub.journal()
            assert len(entries) == count + 1
            assert "reader" not in {e.agent for e in entries}

        # a read-only token does not create a run
        async with hub.peer(
            token("reader", run="nope", mode="ro"), run="nope", read_only=True
        ) as ghost:
            await ghost.wait(lambda: ghost.closed)
            assert ghost.close_code == CloseCode.UNKNOWN_RUN


async def test_an_expiring_token_closes_the_connection(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub:
        async with hub.peer(token("alice", exp=time.time() + 2)) as alice:
            await alice.wait(lambda: alice.closed)
            assert alice.close_code == CloseCode.UNAUTHORIZED


# -- bad frames and limits ------------------------------------------------------------------


async def test_bad_frames_close_only_their_connection(tmp_path: Path) -> None:
    bad_frames: list[tuple[str, bytes | str, int]] = [
        ("unknown sync type", b"\x00\x07\x01\x00", CloseCode.MALFORMED),
        ("truncated", b"\x00\x02\x05ab", CloseCode.MALFORMED),
        ("trailing bytes", encode(Update(b"\x00\x00")) + b"\x00", CloseCode.MALFORMED),
        ("text frame", "hello", CloseCode.MALFORMED),
        ("a response from a client", encode(Response.success(1)), CloseCode.MALFORMED),
        ("garbage update bytes", encode(Update(b"\x05\x01\x02\x03")), CloseCode.INVALID_UPDATE),
        ("oversize", encode(Update(b"\x00" * 70_000)), CloseCode.MESSAGE_TOO_LARGE),
    ]
    async with running_hub(tmp_path, max_message_size=64 * 1024) as hub:
        async with hub.peer(token("alice")) as alice, hub.peer(token("bob")) as bob:
            await alice.set("a", 1)
            await bob.wait(lambda: bob.notes().get("a") == 1)
            await alice.flush()
            journal = await hub.journal()
            state = bytes(alice.doc.get_state())
            for i, (name, frame, code) in enumerate(bad_frames):
                async with hub.peer(token("mallory")) as mallory:
                    assert mallory.ws is not None
                    await mallory.ws.send(frame)
                    await mallory.wait(lambda m=mallory: m.closed)
                    assert mallory.close_code == code, name
                # the others go on
                await alice.set(f"k{i}", i)
                await bob.wait(lambda i=i: bob.notes().get(f"k{i}") == i)
            await alice.flush()
            entries = await hub.journal()
            assert entries[: len(journal)] == journal
            assert [e.agent for e in entries[len(journal) :]] == ["alice"] * len(bad_frames)
            assert "mallory" not in {e.agent for e in entries}
            assert bytes(alice.doc.get_state()) != state
            assert alice.notes() == bob.notes()


async def test_a_slow_consumer_is_disconnected(tmp_path: Path) -> None:
    async with running_hub(tmp_path, max_queue_frames=8, max_queue_bytes=256 * 1024) as hub:
        async with hub.peer(token("alice")) as alice:
            # a client that never reads: the kernel's buffers fill, then the hub's queue
            async with connect(hub.url(token("slow")), max_queue=1) as slow:
                await slow.send(encode(SyncStep1(b"\x00")))
                with anyio.fail_after(DEADLINE):
                    await hub.hub.wait_until(lambda h: h.loaded_runs().get((TENANT, RUN)) == 2)
                    i = 0
                    while hub.hub.loaded_runs().get((TENANT, RUN)) == 2:
                        await alice.set(f"big{i}", "x" * 200_000)
                        await alice.request("whoami")  # the hub has handled (and broadcast) it
                        i += 1
                with anyio.fail_after(DEADLINE), contextlib.suppress(ConnectionClosed):
                    async for _ in slow:  # drain what the kernel buffered, up to the close
                        pass
                assert slow.close_code == CloseCode.SLOW_CONSUMER
            await alice.set("after", 1)
            await alice.flush()  # the hub and the other connection are fine


# -- CLI ------------------------------------------------------------------------------------


def test_token_command_prints_a_verifiable_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRDTSTORE_SECRET", SECRET.decode())
    runner = CliRunner()
    result = runner.invoke(
        app, ["token", "--tenant", "t1", "--run", "r*", "--agent", "a1", "--rw", "--ttl", "60"]
    )
    assert result.exit_code == 0, result.output
    claims = sync.verify(SECRET, result.output.strip().splitlines()[-1], tenant="t1", run="r9")
    assert (claims.agent, claims.mode) == ("a1", "rw")
    assert time.time() < claims.exp <= time.time() + 61

    result = runner.invoke(app, ["token", "--tenant", "t1", "--run", "r1", "--agent", "a1"])
    assert result.exit_code == 0
    assert sync.verify(SECRET, result.output.strip().splitlines()[-1]).mode == "ro"

    result = runner.invoke(app, ["token", "--tenant", "t1", "--run", "r/1", "--agent", "a1"])
    assert result.exit_code == 1


def test_token_command_reads_a_secret_file(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(b"file-secret-0123456789abcdef\n")
    result = CliRunner().invoke(
        app,
        ["token", "--tenant", "t", "--run", "r", "--agent", "a", "--secret-file", str(secret_file)],
    )
    assert result.exit_code == 0, result.output
    sync.verify(b"file-secret-0123456789abcdef", result.output.strip().splitlines()[-1])


def test_the_hub_refuses_to_start_without_a_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CRDTSTORE_SECRET", raising=False)
    runner = CliRunner()
    result = runner.invoke(app, ["serve", "--store", f"sqlite:///{tmp_path / 's.db'}"])
    assert result.exit_code == 1
    assert "secret" in result.output.lower()
    result = runner.invoke(app, ["token", "--tenant", "t", "--run", "r", "--agent", "a"])
    assert result.exit_code == 1
    monkeypatch.setenv("CRDTSTORE_SECRET", "short")
    result = runner.invoke(app, ["serve", "--store", f"sqlite:///{tmp_path / 's.db'}"])
    assert result.exit_code == 1
    assert not (tmp_path / "s.db").exists()
    monkeypatch.setenv("CRDTSTORE_SECRET", SECRET.decode())
    result = runner.invoke(
        app, ["serve", "--store", f"sqlite:///{tmp_path / 's.db'}", "--refuse-with", "html"]
    )
    assert result.exit_code == 1
    assert "--refuse-with" in result.output
    assert not (tmp_path / "s.db").exists()


# -- tokens ---------------------------------------------------------------------------------


def test_token_round_trip_and_failures() -> None:
    claims = TokenClaims(tenant="t", run="r", agent="a", mode="ro", exp=2_000)
    tok = mint(SECRET, claims)
    assert sync.verify(SECRET, tok, now=1_000) == claims
    with pytest.raises(sync.TokenExpired) as expired:
        sync.verify(SECRET, tok, now=2_000)
    assert expired.value.code == "TOKEN_EXPIRED"
    with pytest.raises(sync.TokenInvalid) as invalid:
        sync.verify(SECRET + b"x", tok, now=1_000)
    assert invalid.value.code == "TOKEN_INVALID"
    with pytest.raises(sync.Forbidden) as forbidden:
        sync.verify(SECRET, tok, now=1_000, tenant="t", run="r2")
    assert forbidden.value.code == "FORBIDDEN"
    assert isinstance(forbidden.value, sync.TokenError)
    for bad in ["", ".", "a.b.c", tok + "=", tok.replace(".", ""), "x" * 5000, "é.é"]:
        with pytest.raises(sync.TokenInvalid):
            sync.verify(SECRET, bad, now=1_000)
    with pytest.raises(sync.SecretMissing):
        mint(b"short", claims)
    for bad_claims in [
        {"tenant": "t/x", "run": "r", "agent": "a", "mode": "rw", "exp": 1},
        {"tenant": "t", "run": "..", "agent": "a", "mode": "rw", "exp": 1},
        {"tenant": "t", "run": "r", "agent": "", "mode": "rw", "exp": 1},
        {"tenant": "t", "run": "r", "agent": "a", "mode": "admin", "exp": 1},
        {"tenant": "t", "run": "r", "agent": "a", "mode": "rw", "exp": 1, "extra": 1},
    ]:
        with pytest.raises(ValueError):
            TokenClaims.model_validate(bad_claims)
    prefix = TokenClaims(tenant="t", run="nightly-*", agent="a", mode="rw", exp=1)
    assert prefix.allows("t", "nightly-3") and not prefix.allows("t", "daily-3")
    assert not prefix.allows("u", "nightly-3")
    assert TokenClaims(tenant="t", run="*", agent="a", mode="rw", exp=1).allows("t", "any")
