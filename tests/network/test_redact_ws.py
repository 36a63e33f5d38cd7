"""Redaction through the hub (issue 19 part 4, over ``ws://``): a client whose token has the
``redact`` right calls ``store.redact`` (a map key, a map field, a list item, a text span)
and the hub redacts on its SQLite store. With real processes: a hub (``python -m sync``), a
writer client that stays open, a Python ``ws://`` client process and a plain Yjs client
(``yjs`` + ``y-websocket``) holding the record: each drops the value without reopening; the
value's bytes are nowhere in the database file, its WAL or its snapshot; ``history`` and
``crdtstore journal`` list every entry with its agent. A token without the right (or a
read-only one) is refused with a typed error and nothing changes; bad arguments get the
local store's errors (``IndexError`` included)."""

from __future__ import annotations

import base64
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import ValidationError

from crdtstore import (
    CollectionSpec,
    CrdtStoreError,
    InvalidValue,
    ReadOnlyAccess,
    Store,
    open_store,
)
from sync import Forbidden, TokenClaims, TokenInvalid, mint, verify
from sync._client import WsJournal
from tests._wait import until
from tests.network.test_sync_processes import (
    CLIENT,
    HERE,
    RUN,
    SECRET,
    TENANT,
    Fleet,
    HubProc,
    JsClient,
    Proc,
    _node,
    fleet,
)

pytestmark = pytest.mark.anyio

READER = HERE / "_redact_ws_proc.py"
YJS_READER = CLIENT.parent / "redact_reader.mjs"
SECRETS = {
    "key": "KEY-SECRET-4711",
    "field": "FIELD-SECRET-0815",
    "item": "ITEM-SECRET-1234",
    "span": "SPAN-SECRET-9876",
}
OPTIONS: dict[str, Any] = {"connect_timeout": 30.0, "min_backoff": 0.02, "max_backoff": 0.5}
DEADLINE = 60.0


def token(agent: str, *, mode: str = "rw", redact: bool = False) -> str:
    claims = TokenClaims(
        tenant=TENANT,
        run=RUN,
        agent=agent,
        mode=mode,  # type: ignore[arg-type]
        exp=int(time.time()) + 3600,
        redact=redact,
    )
    return mint(SECRET.encode(), claims)


@contextlib.asynccontextmanager
async def hub(tmp_path: Path) -> AsyncIterator[tuple[Fleet, HubProc, str]]:
    async with fleet(tmp_path, "asyncio") as f:
        h = await f.hub()
        yield f, h, f"ws://127.0.0.1:{h.port}/{TENANT}"


@contextlib.asynccontextmanager
async def ws_store(url: str, agent: str, **claims: Any) -> AsyncIterator[Store]:
    async with open_store(url, token=token(agent, **claims), **OPTIONS) as store:
        yield store


async def _fill(store: Store) -> Any:
    """The writer's record (left open: a client holding the values) with every secret."""
    rec = store.open_record(
        RUN, "ignored", schema={"f": CollectionSpec(kind="map", merge="fields")}
    )
    await rec.__aenter__()
    await rec.map("m").set("k", {"ssn": SECRETS["key"]})
    await rec.map("m").set("k", SECRETS["key"] + "-v2")  # an overwrite holds it too
    await rec.map("m").set("other", "kept")
    await rec.map("f").patch("e", {"ssn": SECRETS["field"], "name": "kept field"})
    await rec.list("l").extend(["a", SECRETS["item"], "b"])
    await rec.text("t").edit(f"before {SECRETS['span']} after é")
    await rec.flush()
    return rec


async def _redact_all(store: Store) -> None:
    # ``agent`` is not applied through a hub: the token's agent redacts
    await store.redact(RUN, "m", "k", agent="someone-else", reason="erasure")
    await store.redact(RUN, "f", "e", field="ssn", reason="erasure")
    await store.redact(RUN, "l", index=1, reason="erasure")
    start = len("before ")
    await store.redact(RUN, "t", span=(start, start + len(SECRETS["span"])), reason="erasure")


def _files_holding(tmp_path: Path) -> list[tuple[str, str]]:
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name.startswith("store.db")]
    assert any(p.name == "store.db" for p in files), files
    return [
        (p.name, secret)
        for p in files
        for secret in SECRETS.values()
        if secret.encode() in p.read_bytes()
    ]


def _holds(rec: Any) -> list[str]:
    doc = rec.replica.doc.get_update()
    return [s for s in SECRETS.values() if s.encode() in doc or s in str(rec.to_dict())]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # (the others run on trio too)
async def test_a_redaction_through_the_hub_reaches_every_client_and_leaves_no_byte(
    tmp_path: Path,
) -> None:
    async with hub(tmp_path) as (f, h, url), ws_store(url, "writer") as wstore:
        writer = await _fill(wstore)
        try:
            secrets = list(SECRETS.values())
            reader: Proc = await f._spawn(
                Proc, "reader", [sys.executable, str(READER), url, RUN, token("reader"), *secrets]
            )
            yjs: JsClient = await f._spawn(
                JsClient,
                "yjs",
                [_node(), str(YJS_READER), url, RUN, token("yjs"), *secrets],
                cwd=CLIENT.parent,
            )
            await reader.wait(lambda: "ready" in reader.lines, "the reader holds the values")
            await yjs.wait(
                lambda: any(e.get("event") == "ready" for e in yjs.events),
                "the Yjs client holds the values",
            )
            assert _files_holding(tmp_path), "the store file held the values before"
            async with ws_store(url, "dpo", redact=True) as dpo:
                before = [(e.seq, e.agent) for e in await dpo.journal(RUN)]
                await _redact_all(dpo)
                entries = await dpo.journal(RUN)
                history = await dpo.history(RUN, "m", "k")
            # every client holding the record drops the values, without reopening
            await reader.wait(lambda: reader.lines[-1].startswith(("dropped", "stuck")), "drop")
            assert reader.lines[-1] == "dropped 1", reader.diagnostics()
            await yjs.wait(
                lambda: any(e.get("event") in ("dropped", "stuck") for e in yjs.events), "drop"
            )
            (dropped,) = [e for e in yjs.events if e.get("event") in ("dropped", "stuck")]
            assert dropped["event"] == "dropped", dropped
            assert dropped["connects"] == 1, dropped
            assert dropped["state"]["m"] == {"other": "kept"}
            assert dropped["state"]["l"] == ["a", "b"]
            assert dropped["state"]["t"] == "before  after é"
            await until(lambda: not _holds(writer), "the writer's record to drop the values")
            assert writer.to_dict()["m"] == {"other": "kept"}
            assert writer.map("f").get("e") == {"name": "kept field"}
            assert isinstance(wstore.backend, WsJournal)
            link = wstore.backend._links[RUN]
            assert link.connects == 1
            assert not any(s.encode() in r.update for r in link.rows.values() for s in secrets)
        finally:
            await writer.__aexit__(None, None, None)
        # every entry is still there, by whom it was written; the redactions appended by the
        # token's agent
        assert [(e.seq, e.agent) for e in entries][: len(before)] == before
        assert [(e.agent, e.effect[0][2]) for e in entries[len(before) :]] == [
            ("dpo", "del"),
            ("dpo", "redact"),
        ] * 4
        for e in entries:
            for secret in secrets:
                assert secret.encode() not in e.update, (e.seq, secret)
                assert secret not in str(e.effect), (e.seq, secret)
        marked = [op for e in entries for op in e.effect if "$redacted" in str(op)]
        assert len(marked) == 5  # two sets of k, the field, the list insert, the text insert
        assert all("'agent': 'dpo'" in str(op) for op in marked)
        assert [(x.provenance.agent, x.redacted, x.value) for x in history] == [
            ("writer", True, None),
            ("writer", True, None),
            ("dpo", False, None),  # the delete
            ("dpo", True, None),  # the redaction
        ]
        # the hub's files, while it runs and after it stopped
        assert _files_holding(tmp_path) == []
        h.process.terminate()
        assert await h.exit_status() == 0, h.diagnostics()
    assert _files_holding(tmp_path) == []
    cli = Path(sys.executable).with_name("crdtstore")
    argv = [str(cli), "journal", f"sqlite:///{tmp_path / 'store.db'}", "--run", RUN]
    listed = await anyio.run_process([*argv, "--tenant", TENANT, "--json", "--limit", "10000"])
    out = listed.stdout.decode()
    rows = json.loads(out)["entries"]
    assert [(r["seq"], r["agent"]) for r in rows] == [(e.seq, e.agent) for e in entries]
    assert not any(s in out for s in secrets)


def test_the_redact_right_is_a_claim_of_its_own() -> None:
    """Only ``rw`` tokens may carry it; a token without it is signed over the same claims as
    before the right existed (older hubs accept it), one with it verifies with it."""
    claims = {"tenant": TENANT, "run": RUN, "agent": "a", "mode": "rw", "exp": 2**40}
    plain = mint(SECRET.encode(), TokenClaims.model_validate(claims))
    payload = plain.split(".")[0]
    signed = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert "redact" not in signed
    assert verify(SECRET.encode(), plain).redact is False
    granted = mint(SECRET.encode(), TokenClaims.model_validate({**claims, "redact": True}))
    assert verify(SECRET.encode(), granted).redact is True
    with pytest.raises(ValidationError):
        TokenClaims.model_validate({**claims, "mode": "ro", "redact": True})
    with pytest.raises(ValidationError):
        TokenClaims.model_validate({**claims, "redact": "yes"})
    # signed without the model's check (a foreign minter): the hub refuses it
    forged = TokenClaims.model_construct(**{**claims, "mode": "ro", "redact": True})
    with pytest.raises(TokenInvalid):
        verify(SECRET.encode(), mint(SECRET.encode(), forged))


async def test_a_token_without_the_right_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    async with hub(tmp_path) as (f, _h, url), ws_store(url, "writer") as wstore:
        writer = await _fill(wstore)
        try:
            head = (await wstore.run_info(RUN)).head
            journal = [(e.seq, e.agent, e.update, e.effect) for e in await wstore.journal(RUN)]
            async with ws_store(url, "mallory") as plain, ws_store(url, "ro", mode="ro") as ro:
                with pytest.raises(Forbidden) as refused:
                    await plain.redact(RUN, "m", "k", reason="mine now")
                assert refused.value.code == "FORBIDDEN"
                assert isinstance(refused.value, PermissionError)
                with pytest.raises(ReadOnlyAccess):
                    await ro.redact(RUN, "l", index=1)
                # the op itself, sent as is: refused before its params are even read
                backend = plain.backend
                assert isinstance(backend, WsJournal)
                with pytest.raises(Forbidden):
                    await backend.call(RUN, "run.redact", {"collection": "m", "key": "k"})
                with pytest.raises(Forbidden):
                    await backend.call(RUN, "run.redact", {"bogus": True})
            # a plain Yjs client sending the op (its token: rw, no redact right)
            js = await f.js_client(url, "js")
            reply = await js.cmd(
                "request", op="run.redact", params={"collection": "m", "key": "k"}, timeout=30
            )
            assert reply["response"]["error"]["code"] == "FORBIDDEN", reply
            assert (await wstore.run_info(RUN)).head == head
            assert [
                (e.seq, e.agent, e.update, e.effect) for e in await wstore.journal(RUN)
            ] == journal
            assert writer.map("m").get("k") == SECRETS["key"] + "-v2"
            assert SECRETS["item"] in writer.list("l").to_list()
        finally:
            await writer.__aexit__(None, None, None)


async def test_bad_redactions_through_the_hub_get_the_local_errors(tmp_path: Path) -> None:
    async with hub(tmp_path) as (_, _h, url), ws_store(url, "writer") as wstore:
        writer = await _fill(wstore)
        try:
            journal = [(e.seq, e.agent, e.update, e.effect) for e in await wstore.journal(RUN)]
            async with ws_store(url, "dpo", redact=True) as dpo:
                bad: list[dict[str, Any]] = [
                    {"key": "k", "index": 0},
                    {"index": 0, "span": (0, 1)},
                    {},
                    {"field": "f"},
                    {"key": "k", "field": ""},
                    {"span": (3, 3)},
                    {"index": "0"},
                ]
                for kwargs in bad:
                    with pytest.raises(InvalidValue):
                        await dpo.redact(RUN, "m", **kwargs)
                with pytest.raises(IndexError):
                    await dpo.redact(RUN, "l", index=99)
                with pytest.raises(IndexError):
                    await dpo.redact(RUN, "t", span=(0, 999))
                # what the hub checks itself, whatever a client sends
                backend = dpo.backend
                assert isinstance(backend, WsJournal)
                for params in (
                    {"collection": "m", "index": "1"},
                    {"collection": "m", "span": [1]},
                    {"collection": "m", "key": "k", "reason": "x" * 5000},
                    {"collection": "m", "key": "k", "who": "me"},
                    {"collection": "m"},
                ):
                    with pytest.raises(InvalidValue):
                        await backend.call(RUN, "run.redact", params)  # type: ignore[arg-type]
                with pytest.raises(CrdtStoreError) as out_of_range:
                    await backend.call(RUN, "run.redact", {"collection": "l", "index": 7})
                assert out_of_range.value.code == "INDEX_OUT_OF_RANGE"
                assert [
                    (e.seq, e.agent, e.update, e.effect) for e in await dpo.journal(RUN)
                ] == journal
            assert writer.map("m").get("k") == SECRETS["key"] + "-v2"
        finally:
            await writer.__aexit__(None, None, None)


def test_the_token_command_grants_the_redact_right_only_with_rw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from crdtstore.cli import app

    monkeypatch.setenv("CRDTSTORE_SECRET", SECRET)
    base = ["token", "--tenant", "t", "--run", "r", "--agent", "dpo"]
    granted = CliRunner().invoke(app, [*base, "--rw", "--redact"])
    assert granted.exit_code == 0, granted.output
    assert verify(SECRET.encode(), granted.output.strip().splitlines()[-1]).redact is True
    plain = CliRunner().invoke(app, [*base, "--rw"])
    assert plain.exit_code == 0, plain.output
    assert verify(SECRET.encode(), plain.output.strip().splitlines()[-1]).redact is False
    refused = CliRunner().invoke(app, [*base, "--ro", "--redact"])
    assert refused.exit_code == 1
    assert "redact" in refused.output and "jti" not in refused.output
