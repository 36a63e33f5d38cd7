"""Hub hardening over real WebSockets: revocation, read-only writes and malformed frames checked
byte for byte against the SQLite file, document size limit (4414), request rate (4429),
awareness timeout.

Covered in ``tests/network/test_sync_hub.py`` and not repeated here: the token failures at the
upgrade (missing, garbage, forged signature, other secret, expired, other run, other tenant, a
prefix token outside its prefix, a forged subprotocol token), expiry while connected (4401), the
close codes of bad frames (4400, 4413, 4422), and the slow consumer (4408). The leaky-scope
scenario through the hub is ``tests/scenarios/test_leaky_scope_hub.py``.

Nothing sleeps to wait for sync: every wait is on a condition under a deadline.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycrdt import Array, Doc, Map, Text
from typer.testing import CliRunner
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

import sync
from crdtstore import InvalidValue
from crdtstore.cli import app
from sync import (
    Awareness,
    AwarenessEntry,
    CloseCode,
    QueryAwareness,
    SyncStep2,
    TokenClaims,
    Update,
    encode,
    encode_awareness_update,
    mint,
)
from sync._cli import issue_token
from sync._tokens import (
    RevocationFileError,
    TokenRevoked,
    append_revoked,
    new_jti,
    read_revoked,
)
from tests.network.test_sync_hub import (
    DEADLINE,
    RUN,
    SECRET,
    TENANT,
    http_refused,
    refused,
    running_hub,
    token,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the hub runs on websockets' asyncio implementation


def dump(tmp_path: Path) -> list[str]:
    """Every row of every table of the store's SQLite file, as SQL text."""
    with sqlite3.connect(f"file:{tmp_path / 'store.db'}?mode=ro", uri=True) as db:
        return list(db.iterdump())


def revocable(agent: str, *, run: str = RUN, mode: str = "rw") -> tuple[str, str]:
    """A token with a fresh jti, and the jti."""
    jti = new_jti()
    claims = TokenClaims.model_validate(
        {
            "tenant": TENANT,
            "run": run,
            "agent": agent,
            "mode": mode,
            "exp": int(time.time() + 3600),
            "jti": jti,
        }
    )
    return mint(SECRET, claims), jti


def notes_update(key: str, value: Any) -> bytes:
    """An update that writes notes[key] = value in a fresh document."""
    doc: Doc[Any] = Doc()
    with doc.transaction():
        doc.get("__crdtstore_collections", type=Map)["notes"] = "map"
        doc.get("notes", type=Map)[key] = value
    return bytes(doc.get_update())


# -- revocation -----------------------------------------------------------------------------


async def test_a_revoked_token_is_refused_and_its_open_connection_closed(tmp_path: Path) -> None:
    mallory_tok, mallory_jti = revocable("mallory")
    alice_tok, _ = revocable("alice")
    async with running_hub(tmp_path) as hub:
        async with hub.peer(alice_tok) as alice, hub.peer(mallory_tok) as mallory:
            await mallory.set("m", 1)
            await mallory.flush()
            assert hub.hub.revoke(mallory_jti) == 1
            await mallory.wait(lambda: mallory.closed)
            assert mallory.close_code == CloseCode.FORBIDDEN
            code, reason = await refused(hub.url(mallory_tok))
            assert code == CloseCode.FORBIDDEN and reason.startswith("TOKEN_REVOKED: ")
            # the other connection goes on
            await alice.set("a", 1)
            await alice.flush()
        # the revocation is in the file: a hub started later on the store refuses it too
        assert mallory_jti in read_revoked(tmp_path / "store.db.revoked")
    async with running_hub(tmp_path, refuse_with="http") as hub:
        status, body = await http_refused(hub.url(mallory_tok))
        assert status == 403 and body.startswith(b"TOKEN_REVOKED: ")
        with pytest.raises(InvalidValue):
            hub.hub.revoke("not a token id")


async def test_token_revoke_command_reaches_a_running_hub_within_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRDTSTORE_SECRET", SECRET.decode())
    result = CliRunner().invoke(
        app, ["token", "--tenant", TENANT, "--run", RUN, "--agent", "bob", "--rw"]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    jti = lines[0].removeprefix("jti: ")
    tok = lines[-1]  # the token stays on the last line
    assert sync.verify(SECRET, tok).jti == jti
    async with running_hub(tmp_path) as hub, hub.peer(tok) as bob:  # polls every 0.5 s
        await bob.set("b", 1)
        await bob.flush()
        url = f"sqlite:///{tmp_path / 'store.db'}"
        start = time.monotonic()
        result = CliRunner().invoke(app, ["token", "revoke", "--jti", jti, "--store", url])
        assert result.exit_code == 0, result.output
        await bob.wait(lambda: bob.closed)
        noticed = time.monotonic() - start
        assert bob.close_code == CloseCode.FORBIDDEN
        assert noticed < 1.5, noticed
        assert (await refused(hub.url(tok)))[0] == CloseCode.FORBIDDEN
    # bad input: no file to write to, a bad jti
    runner = CliRunner()
    result = runner.invoke(app, ["token", "revoke", "--jti", jti, "--store", "memory://x"])
    assert result.exit_code == 1
    assert "--revoked-file" in result.output
    result = runner.invoke(
        app, ["token", "revoke", "--jti", "a b", "--revoked-file", str(tmp_path / "r")]
    )
    assert result.exit_code == 1
    assert not (tmp_path / "r").exists()
    result = runner.invoke(app, ["token", "--tenant", TENANT, "--agent", "x"])
    assert result.exit_code == 2
    assert "--run" in result.output


def test_tokens_carry_a_jti_and_tokens_without_one_still_verify(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(SECRET)
    claims, tok = issue_token(
        tenant="t", run="r", agent="a", rw=True, secret_file=tmp_path / "secret"
    )
    other, _ = issue_token(tenant="t", run="r", agent="a", rw=True, secret_file=tmp_path / "secret")
    assert claims.jti is not None and other.jti is not None
    assert claims.jti != other.jti
    assert sync.verify(SECRET, tok) == claims
    with pytest.raises(TokenRevoked) as revoked:
        sync.verify(SECRET, tok, revoked={claims.jti})
    assert revoked.value.code == "TOKEN_REVOKED"
    assert revoked.value.http_status == 403
    assert revoked.value.close_code == CloseCode.FORBIDDEN
    legacy = TokenClaims(tenant="t", run="r", agent="a", mode="ro", exp=2_000)
    assert legacy.jti is None
    assert sync.verify(SECRET, mint(SECRET, legacy), now=1_000, revoked={"x"}) == legacy
    with pytest.raises(ValueError):
        TokenClaims(tenant="t", run="r", agent="a", mode="ro", exp=1, jti="no spaces")
    # the revocation file: comments and junk lines are ignored
    path = tmp_path / "revoked"
    path.write_text("# revoked tokens\nnot/a/jti\n\n")
    append_revoked(path, "abc_DEF-1", "why")
    for bad_jti, note in [("abc\n", ""), ("", ""), ("x" * 65, ""), ("ok", "two\nlines")]:
        with pytest.raises(InvalidValue):
            append_revoked(path, bad_jti, note)
    assert read_revoked(path) == {"abc_DEF-1"}
    assert read_revoked(tmp_path / "missing") == frozenset()
    assert sync._tokens.default_revoked_file("memory://x") is None
    assert sync._tokens.default_revoked_file("sqlite:///rel/s.db?x=1") == Path("rel/s.db.revoked")


def test_an_unreadable_revocation_file_stops_the_hub_from_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "store.db.revoked").mkdir()  # exists, cannot be read as a file
    with pytest.raises(RevocationFileError) as info:
        sync.Hub(f"sqlite:///{tmp_path / 'store.db'}", SECRET)
    assert info.value.code == "REVOCATION_FILE"
    monkeypatch.setenv("CRDTSTORE_SECRET", SECRET.decode())
    result = CliRunner().invoke(app, ["serve", "--store", f"sqlite:///{tmp_path / 'store.db'}"])
    assert result.exit_code == 1
    assert "revocation file" in result.output


def test_hub_limits_refuse_values_that_are_not_positive() -> None:
    for field in ("awareness_timeout", "max_document_bytes", "rate_per_second", "rate_burst"):
        with pytest.raises(InvalidValue, match=field):
            sync.HubLimits(**{field: 0})
    assert sync.HubLimits(max_document_bytes=None, rate_per_second=None).rate_burst > 0


# -- read-only writes and malformed frames, against the SQLite file ---------------------------


async def test_read_only_step2_and_updates_change_no_byte_of_the_store(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub:
        async with hub.peer(token("alice")) as alice:
            await alice.set("a", 1)
            await alice.flush()
            before = dump(tmp_path)
            async with hub.peer(token("reader", mode="ro"), read_only=True) as reader:
                assert reader.ws is not None
                await reader.ws.send(encode(SyncStep2(notes_update("step2", "x"))))
                await reader.ws.send(encode(Update(notes_update("update", "y"))))
                await reader.wait(lambda: reader.session.refused == 2)
                assert not reader.closed  # refused, not disconnected: it still reads
                await alice.set("b", 2)
                await reader.wait(lambda: reader.notes().get("b") == 2)
            await alice.request("whoami")  # alice's frames are handled in order
            assert set(alice.notes()) == {"a", "b"}
        await hub.wait_unloaded()
        after = dump(tmp_path)
        new = [line for line in after if line not in before]
        assert all("reader" not in line for line in after)
        assert all("'bob'" not in line and "step2" not in line for line in new)
        assert len([line for line in new if line.startswith('INSERT INTO "journal"')]) == 1


async def test_malformed_frames_change_no_byte_of_the_store(tmp_path: Path) -> None:
    frames: list[bytes] = [
        b"",  # empty
        b"\x00",  # sync without a sub-type
        b"\x07\x00",  # unknown message type
        b"\x00\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # var-uint overflow
        b"\x00\x01\x80",  # truncated var-uint
        encode(Update(notes_update("k", "v")))[:-3],  # truncated update
        b"\x00\x01" + bytes([len(b"\x09\x01\x02") + 0]) + b"\x09\x01\x02",  # garbage update
        b"\x01\x05\x01\x01\x01\x01",  # awareness cut short
        b"\x01" + encode_awareness_update([AwarenessEntry(1, 1, "{not json")])[:1],
        b"\x64\x05{bad}",  # a request that is not JSON
    ]
    async with running_hub(tmp_path) as hub:
        async with hub.peer(token("alice")) as alice, hub.peer(token("bob")) as bob:
            await alice.set("a", 1)
            await alice.flush()
            before = dump(tmp_path)
            codes = []
            for frame in frames:
                async with hub.peer(token("mallory")) as mallory:
                    assert mallory.ws is not None
                    await mallory.ws.send(frame)
                    await mallory.wait(lambda m=mallory: m.closed)
                    codes.append(mallory.close_code)
            assert (
                codes
                == [CloseCode.MALFORMED] * 6
                + [CloseCode.INVALID_UPDATE]
                + [CloseCode.MALFORMED] * 3
            )
            assert dump(tmp_path) == before
            # the run's other connections keep working
            await bob.set("b", 2)
            await alice.wait(lambda: alice.notes().get("b") == 2)
            assert bob.notes() == {"a": 1, "b": 2}


# -- document size, rate, awareness timeout ---------------------------------------------------


async def test_an_update_past_the_document_size_limit_is_refused(tmp_path: Path) -> None:
    limit = 40_000
    async with running_hub(tmp_path, max_document_bytes=limit) as hub:
        async with hub.peer(token("alice")) as alice, hub.peer(token("bob")) as bob:
            written = 0
            with anyio.fail_after(DEADLINE):
                while not alice.closed:
                    before = dump(tmp_path)
                    await alice.set(f"k{written}", "x" * 3000)
                    try:
                        response = await alice.request("flush")  # journaled by now
                    except (KeyError, ConnectionClosed):  # or closed before answering
                        break
                    assert response.ok
                    written += 1
            assert alice.close_code == CloseCode.DOCUMENT_TOO_LARGE
            assert 10 <= written <= limit // 3000
            await bob.wait(lambda: len(bob.notes()) == written)
            await bob.flush()
            assert dump(tmp_path) == before  # the refused update: nothing journaled
            assert f"k{written}" not in bob.notes()
            size = len(bob.doc.get_update())
            assert limit - 4000 < size <= limit
        await hub.wait_unloaded()
    # a run already past the limit is not loaded: closed before any document byte
    async with running_hub(tmp_path, max_document_bytes=size // 2) as hub:
        async with hub.peer(token("carol")) as carol:
            await carol.wait(lambda: carol.closed)
            assert carol.close_code == CloseCode.DOCUMENT_TOO_LARGE
            assert carol.notes() == {}
            assert carol.frames == 0
        assert hub.hub.loaded_runs() == {}
    async with running_hub(tmp_path, max_document_bytes=limit) as hub, hub.peer(token("d")) as d:
        assert len(d.notes()) == written


async def test_a_connection_sending_too_fast_is_closed_with_4429(tmp_path: Path) -> None:
    async with running_hub(tmp_path, rate_per_second=20.0, rate_burst=30) as hub:
        async with hub.peer(token("alice")) as alice, hub.peer(token("flood")) as flood:
            assert flood.ws is not None
            for _ in range(20):  # within the burst: fine
                await flood.ws.send(encode(QueryAwareness()))
            assert (await flood.request("whoami")).ok
            with anyio.fail_after(DEADLINE), contextlib.suppress(ConnectionClosed):
                while not flood.closed:
                    await flood.ws.send(encode(QueryAwareness()))
                    await anyio.lowlevel.checkpoint()
            await flood.wait(lambda: flood.closed)
            assert flood.close_code == CloseCode.TOO_MANY_REQUESTS
            await alice.set("a", 1)
            await alice.flush()


async def test_the_awareness_of_a_silent_connection_times_out(tmp_path: Path) -> None:
    def presence(client: int, clock: int, state: str) -> bytes:
        return encode(Awareness(encode_awareness_update([AwarenessEntry(client, clock, state)])))

    async with running_hub(tmp_path, awareness_timeout=0.8) as hub:
        async with hub.peer(token("alice")) as alice, hub.peer(token("bob")) as bob:
            assert alice.ws is not None and bob.ws is not None
            await alice.ws.send(presence(11, 1, '{"user":"alice"}'))
            await bob.wait(lambda: bob.awareness.get(11) == '{"user":"alice"}')
            # alice stays talking (any frame counts) for three timeouts: her state stays
            with anyio.fail_after(DEADLINE):
                end = anyio.current_time() + 2.0
                while anyio.current_time() < end:
                    assert (await alice.request("whoami")).ok
                    await anyio.sleep(0.05)  # pacing a keepalive, not waiting for sync
            assert bob.awareness.get(11) == '{"user":"alice"}'
            # then she is silent: the hub removes her state for everyone, her included
            start = anyio.current_time()
            await bob.wait(lambda: bob.awareness.get(11) == "null")
            assert anyio.current_time() - start >= 0.7
            await alice.wait(lambda: alice.awareness.get(11) == "null")
            assert not alice.closed  # the connection stays
            # a new connection is not told about her any more
            async with hub.peer(token("carol", mode="ro"), read_only=True) as carol:
                assert carol.ws is not None
                await carol.ws.send(encode(QueryAwareness()))
                await carol.request("whoami")  # answered after the query: in order
                assert 11 not in carol.awareness
            # her next announcement brings her back
            await alice.ws.send(presence(11, 3, '{"user":"alice","back":true}'))
            await bob.wait(lambda: bob.awareness.get(11) == '{"user":"alice","back":true}')


async def test_journal_appends_are_held_to_the_document_size_limit(tmp_path: Path) -> None:
    big = notes_update("big", "x" * 30_000)
    small = notes_update("small", "y")
    async with running_hub(tmp_path, max_document_bytes=20_000) as hub:
        async with hub.peer(token("alice")) as alice:
            assert alice.ws is not None
            before = dump(tmp_path)
            for update, ok in [(big, False), (small, True)]:
                entry = {"update": base64.b64encode(update).decode(), "client_id": 4242}
                request, frame = alice.session.request("journal.append", {"entries": [entry]})
                await alice.ws.send(frame)
                await alice.wait(lambda r=request: r.id in alice.responses)
                response = alice.responses[request.id]
                assert response.ok is ok, response
                if not ok:
                    assert response.error is not None
                    assert response.error.code == "PAYLOAD_TOO_LARGE"
                    assert dump(tmp_path) == before  # nothing journaled
            entries = await hub.journal()
            assert [e.effect for e in entries] == [[["map", "notes", "set", "small", "y"]]]
            assert [e.agent for e in entries] == ["alice"]


# the document size bound: what the hub counts never falls below the real encoded size
_edit = st.tuples(
    st.integers(0, 2),  # which writer
    st.sampled_from(["set", "delete", "insert", "remove", "append"]),
    st.integers(0, 7),  # key / position
    st.text(alphabet="abcxyz 01", max_size=40),
)


@settings(deadline=None)
@given(edits=st.lists(_edit, min_size=1, max_size=40), exchange=st.lists(st.booleans()))
def test_the_document_size_bound_never_falls_below_the_encoded_size(
    edits: list[tuple[int, str, int, str]], exchange: list[bool]
) -> None:
    from types import SimpleNamespace

    from sync._hub_runs import _Room

    hub_doc: Doc[Any] = Doc()
    room = _Room("t", "r")
    rec = SimpleNamespace(replica=SimpleNamespace(doc=hub_doc))
    room.attach(rec, len(hub_doc.get_update()))  # type: ignore[arg-type]
    writers: list[Doc[Any]] = [Doc() for _ in range(3)]
    flips = iter(exchange)
    for who, op, at, text in edits:
        doc = writers[who]
        before = doc.get_state()
        with doc.transaction():
            notes, body = doc.get("notes", type=Map), doc.get("body", type=Text)
            if op == "set":
                notes[f"k{at}"] = text
            elif op == "delete" and f"k{at}" in notes:
                del notes[f"k{at}"]
            elif op == "insert":
                body.insert(min(at, len(body)), text or "x")
            elif op == "remove" and len(body) > 0:
                start = min(at, len(body) - 1)
                del body[start : min(len(body), start + 1 + len(text) % 3)]
            elif op == "append":
                doc.get("items", type=Array).append(text)
        hub_doc.apply_update(doc.get_update(before))
        assert room.size >= len(hub_doc.get_update())
        if next(flips, False):  # sometimes a writer catches up with the hub
            doc.apply_update(hub_doc.get_update(doc.get_state()))
    room.detach()


# -- the operator's path, with real processes ---------------------------------------------------


async def test_revoking_with_the_cli_closes_a_connection_to_a_hub_process(tmp_path: Path) -> None:
    """``crdtstore serve`` in a process of its own, ``crdtstore token`` and ``crdtstore token
    revoke`` as the operator runs them: the hub process notices within about a second."""
    env = {**os.environ, "CRDTSTORE_SECRET": SECRET.decode()}
    url = f"sqlite:///{tmp_path / 'store.db'}"
    cli = [sys.executable, "-m", "crdtstore.cli"]
    minted = await anyio.run_process(
        [*cli, "token", "--tenant", TENANT, "--run", RUN, "--agent", "ops", "--rw"], env=env
    )
    lines = minted.stdout.decode().strip().splitlines()
    jti, tok = lines[0].removeprefix("jti: "), lines[-1]
    async with await anyio.open_process(
        [*cli, "serve", "--store", url, "--port", "0"], env=env, stderr=subprocess.PIPE
    ) as hub:
        try:
            assert hub.stderr is not None
            seen = b""
            with anyio.fail_after(DEADLINE):
                while b"listening on ws://" not in seen:
                    seen += await hub.stderr.receive()
            found = re.search(rb"listening on (ws://\S+)", seen)
            assert found is not None
            base = found.group(1).decode()
            async with connect(f"{base}/{TENANT}/{RUN}?token={tok}") as ws:
                assert isinstance(await ws.recv(), bytes)  # the hub's sync step 1
                await anyio.run_process([*cli, "token", "revoke", "--jti", jti, "--store", url])
                revoked_at = time.monotonic()
                with anyio.fail_after(DEADLINE), contextlib.suppress(ConnectionClosed):
                    async for _ in ws:
                        pass
                noticed = time.monotonic() - revoked_at
                assert ws.close_code == CloseCode.FORBIDDEN
                assert noticed < 1.5, noticed
            code, reason = await refused(f"{base}/{TENANT}/{RUN}?token={tok}")
            assert code == CloseCode.FORBIDDEN and reason.startswith("TOKEN_REVOKED: ")
        finally:
            hub.terminate()
            with anyio.fail_after(DEADLINE):
                await hub.wait()
