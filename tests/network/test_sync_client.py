"""The ``ws://`` store: ``open_store("ws://host:port/<tenant>", token=...)`` through a real hub.

The hub runs on its own asyncio event loop in a thread (a blocking portal), so the clients
run on both anyio backends (``websockets`` has an asyncio and a trio client). Records on
the hub's SQLite store, opened directly, play "another process". Nothing sleeps to wait for
sync: every wait is on a condition, under an ``anyio.fail_after`` deadline.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crdtstore import (
    CrdtStoreError,
    InvalidValue,
    PolicyViolation,
    ReadOnlyAccess,
    Record,
    StaleVersion,
    Store,
    UnknownRun,
    UnsupportedOperation,
    UnsupportedURL,
    open_store,
)
from crdtstore._errors import error_from_dict
from sync import (
    ClientSession,
    Forbidden,
    Hub,
    HubLimits,
    ProtocolError,
    Push,
    PycrdtDocument,
    ServerSession,
    TokenClaims,
    decode,
    encode,
    mint,
)
from sync._client import WsJournal
from tests._wait import until

pytestmark = pytest.mark.anyio

SECRET = b"client-test-secret-0123456789"
TENANT = "t1"
RUN = "r1"
DEADLINE = 10.0
FAST = {"min_backoff": 0.02, "max_backoff": 0.2, "connect_timeout": 5.0}


def token(
    agent: str, *, run: str = RUN, mode: str = "rw", tenant: str = TENANT, source: str = "model"
) -> str:
    claims = TokenClaims.model_validate(
        {
            "tenant": tenant,
            "run": run,
            "agent": agent,
            "mode": mode,
            "exp": int(time.time() + 3600),
            "source": source,
        }
    )
    return mint(SECRET, claims)


class HubThread:
    """A :class:`Hub` serving the SQLite store at ``store_url`` on an asyncio loop of its own
    thread; ``stop`` cancels its task (as a shutdown would), ``start`` may be called again."""

    def __init__(self, store_url: str) -> None:
        self.store_url = store_url
        self.port = 0
        self._portal_cm: Any = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._future: concurrent.futures.Future[Any] | None = None
        self.hub: Hub | None = None

    def url(self, tenant: str = TENANT) -> str:
        return f"ws://127.0.0.1:{self.port}/{tenant}"

    def _start(self) -> None:
        self._portal_cm = anyio.from_thread.start_blocking_portal("asyncio")
        portal = self._portal = self._portal_cm.__enter__()
        self.hub = portal.call(
            lambda: Hub(self.store_url, SECRET, limits=HubLimits(close_timeout=0.5))
        )
        self._future, self.port = portal.start_task(self.hub.serve, "127.0.0.1", self.port)

    def _stop(self) -> None:
        assert self._future is not None
        self._future.cancel()
        concurrent.futures.wait([self._future])
        self._portal_cm.__exit__(None, None, None)
        self._future = self._portal = self._portal_cm = None

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self._start)

    async def stop(self) -> None:
        await anyio.to_thread.run_sync(self._stop)


@contextlib.asynccontextmanager
async def running_hub(tmp_path: Path) -> AsyncIterator[HubThread]:
    hub = HubThread(f"sqlite:///{tmp_path / 'store.db'}")
    await hub.start()
    try:
        yield hub
    finally:
        if hub._future is not None:
            await hub.stop()


@contextlib.asynccontextmanager
async def ws_record(
    hub: HubThread | str, tok: str, run: str = RUN, agent: str = "ignored", **options: Any
) -> AsyncIterator[Record]:
    url = hub if isinstance(hub, str) else hub.url()
    async with (
        open_store(url, token=tok, **{**FAST, **options}) as store,
        store.open_record(run, agent) as rec,
    ):
        yield rec


@contextlib.asynccontextmanager
async def sqlite_store(hub: HubThread) -> AsyncIterator[Store]:
    async with open_store(hub.store_url, tenant=TENANT) as store:
        yield store


async def journal(hub: HubThread, run: str = RUN) -> list[Any]:
    async with sqlite_store(hub) as store:
        return await store.journal(run, limit=100_000)


# -- the Record API through the hub ---------------------------------------------------------


async def test_open_record_create_false_of_a_missing_run_creates_nothing(tmp_path: Path) -> None:
    """``open_record(run, create=False)`` through the hub refuses a missing run with
    UnknownRun and creates nothing (the connection asks ``create=0``; connecting used to
    create the run); the same store then creates it when asked, and opens it again."""
    async with (
        running_hub(tmp_path) as hub,
        open_store(hub.url(), token=token("alice", run="*")) as store,
    ):
        with pytest.raises(UnknownRun):
            async with store.open_record("nope", "alice", create=False):
                pass
        assert await store.backend.get_run(TENANT, "nope") is None
        async with sqlite_store(hub) as local:
            assert "nope" not in [r.run for r in await local.runs()]
        async with store.open_record("nope", "alice") as rec:  # create=True: made now
            await rec.map("m").set("k", 1)
            await rec.flush()
        async with store.open_record("nope", "alice", create=False) as rec:
            assert rec.map("m").get("k") == 1
    async with running_hub(tmp_path) as hub, sqlite_store(hub) as local:
        assert "nope" in [r.run for r in await local.runs()]


async def test_two_ws_clients_and_an_embedded_record_converge(tmp_path: Path) -> None:
    async with (
        running_hub(tmp_path) as hub,
        ws_record(hub, token("alice")) as alice,
        ws_record(hub, token("bob", source="tool")) as bob,
        sqlite_store(hub) as store,
        store.open_record(RUN, "embedded", "user") as local,
    ):
        # the token names the writer, whatever agent the caller passed
        assert (alice.agent, alice.source) == ("alice", "model")
        assert (bob.agent, bob.source) == ("bob", "tool")
        await alice.map("notes").set("a", {"x": [1, 2]})
        await alice.list("log").append("alice was here")
        await alice.text("doc").insert(0, "hello")
        await bob.map("notes").set("b", 2)
        await local.map("notes").set("c", 3)
        await until(lambda: alice.to_dict() == bob.to_dict() == local.to_dict())
        assert alice.to_dict() == {
            "doc": "hello",
            "log": ["alice was here"],
            "notes": {"a": {"x": [1, 2]}, "b": 2, "c": 3},
        }
        await bob.text("doc").insert(5, " world")
        await local.list("log").append("embedded too")
        await until(lambda: alice.to_dict() == bob.to_dict() == local.to_dict())
        assert alice.text("doc").read() == "hello world"

        await alice.flush()
        await bob.flush()
        await local.flush()
        # provenance: the journal and every replica name the token's agent, with the
        # hub's journal positions (so versions agree everywhere)
        for rec in (alice, bob, local):
            await until(lambda rec=rec: rec.version("notes", "a") not in (None,))
        assert alice.provenance("notes", "a").agent == "alice"  # type: ignore[union-attr]
        assert local.provenance("notes", "a").agent == "alice"  # type: ignore[union-attr]
        assert local.provenance("notes", "b").agent == "bob"  # type: ignore[union-attr]
        await until(lambda: alice.provenance("notes", "c") is not None)
        assert alice.provenance("notes", "c").agent == "embedded"  # type: ignore[union-attr]
        for key in ("a", "b", "c"):
            await until(
                lambda key=key: (
                    alice.version("notes", key)
                    == bob.version("notes", key)
                    == local.version("notes", key)
                )
            )
        history = await bob.history("notes", "a")
        assert [(h.value, h.provenance.agent) for h in history] == [({"x": [1, 2]}, "alice")]

    entries = await journal(hub)
    agents = {e.agent for e in entries}
    assert agents == {"alice", "bob", "embedded"}, agents
    assert {e.source for e in entries if e.agent == "bob"} == {"tool"}
    async with sqlite_store(hub) as store:
        replayed = await store.replay(RUN)
        assert replayed.to_dict()["notes"] == {"a": {"x": [1, 2]}, "b": 2, "c": 3}


async def test_flush_returns_once_the_entry_is_in_the_sqlite_journal(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub, ws_record(hub, token("alice")) as rec:
        for i in range(20):
            await rec.map("m").set(f"k{i}", i)
        await rec.flush()
        entries = await journal(hub)  # read from the SQLite file directly
        written = {op[3] for e in entries for op in e.effect if op[:2] == ["map", "m"]}
        assert written == {f"k{i}" for i in range(20)}
        assert {e.agent for e in entries} == {"alice"}
        # the record's versions are the hub's journal positions
        seqs = {op[3]: e.seq for e in entries for op in e.effect}
        assert all(rec.version("m", k) == s for k, s in seqs.items())


async def test_a_retried_append_is_not_journaled_twice(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub, ws_record(hub, token("alice")) as rec:
        await rec.map("m").set("k", 1)
        await rec.flush()
        (entry,) = [e for e in await journal(hub) if e.effect]
        backend = rec._backend
        assert isinstance(backend, WsJournal)
        # the same bytes again, as after an answer lost with the connection
        again = await backend.call(
            RUN,
            "journal.append",
            {"entries": [{"update": _b64(entry.update), "client_id": entry.client_id}]},
        )
        assert again == [entry.seq]
        assert [e.seq for e in await journal(hub)][-1] == entry.seq  # nothing new


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


# -- guarded writes -------------------------------------------------------------------------


async def test_a_replica_naming_another_entry_of_the_same_value_adopts_the_hub_s(
    tmp_path: Path,
) -> None:
    """Two entries that leave the same value: which one a replica names depends on the order
    it saw them in, and a guarded write is checked against the hub's choice. A client
    refused for that reason adopts the hub's version, so that a retry succeeds instead of
    being refused forever."""
    async with (
        running_hub(tmp_path) as hub,
        ws_record(hub, token("alice")) as alice,
        ws_record(hub, token("bob")) as bob,
    ):
        # the same value written twice: by two writers concurrently, or (as here, without
        # a race to arrange) by one after the other (a set is an entry even when equal)
        await alice.map("notes").set("k", "same")
        await alice.flush()
        await until(lambda: bob.map("notes").get("k") == "same")
        await bob.map("notes").set("k", "same")
        await bob.flush()
        entries = await journal(hub)
        seqs = [e.seq for e in entries if any(op[3:4] == ["k"] for op in e.effect)]
        assert len(seqs) == 2, [(e.seq, e.agent, e.effect) for e in entries]
        await until(lambda: alice.applied_seq >= max(seqs) and bob.applied_seq >= max(seqs))
        assert hub.hub is not None and hub._portal is not None
        (room,) = hub.hub._rooms.values()
        assert room.rec is not None
        rec = room.rec
        held = hub._portal.call(lambda: rec.version("notes", "k"))  # in the hub's thread
        assert held in seqs
        other = next(s for s in seqs if s != held)
        entry = next(e for e in await journal(hub) if e.seq == other)
        # the disagreement a race leaves: alice names the other entry of the same value
        alice.replica.adopt("notes", "k", other, entry.agent, entry.source, entry.wall_time, "")
        value, version = alice.map("notes").get_versioned("k")
        assert (value, version) == ("same", other)
        before = await journal(hub)
        with pytest.raises(StaleVersion) as caught:
            await alice.map("notes").set("k", "next", expected_version=version)
        assert caught.value.current_version == held
        assert await journal(hub) == before  # nothing journaled on refusal
        value, version = alice.map("notes").get_versioned("k")
        assert (value, version) == ("same", held)  # adopted, with its provenance
        prov = alice.map("notes").provenance("k")
        assert prov is not None
        assert prov.agent == next(e.agent for e in before if e.seq == held)
        await alice.map("notes").set("k", "next", expected_version=version)  # the retry
        await until(lambda: bob.map("notes").get("k") == "next")


async def test_expected_version_through_the_hub(tmp_path: Path) -> None:
    async with (
        running_hub(tmp_path) as hub,
        ws_record(hub, token("alice")) as alice,
        ws_record(hub, token("bob")) as bob,
    ):
        notes = alice.map("notes")
        await notes.set("k", "v1", expected_version=0)  # create only if absent
        v1 = alice.version("notes", "k")
        assert isinstance(v1, int) and v1 > 0
        assert (await journal(hub))[-1].seq == v1
        await until(lambda: bob.version("notes", "k") == v1)
        await bob.map("notes").set("k", "v2", expected_version=v1)
        v2 = bob.version("notes", "k")
        assert isinstance(v2, int) and v2 > v1

        before = await journal(hub)
        with pytest.raises(StaleVersion) as caught:
            await notes.set("k", "v3", expected_version=v1)  # alice's view may be stale
        assert caught.value.current_version == v2
        assert caught.value.current_value == "v2"
        assert caught.value.expected_version == v1
        assert await journal(hub) == before  # nothing journaled on refusal
        await until(lambda: alice.map("notes").get("k") == "v2")
        await alice.flush()
        assert await journal(hub) == before
        # a guarded delete, and a based_on guard
        await notes.delete("k", expected_version=v2)
        await until(lambda: "k" not in bob.map("notes"))
        stale = bob.current_version("notes")
        await alice.map("notes").set("other", 1)
        await alice.flush()
        await until(lambda: bob.current_version("notes").seq > stale.seq)
        with pytest.raises(StaleVersion):
            await bob.map("notes").set("x", 1, based_on=stale)
        await bob.map("notes").set("x", 1, based_on=bob.current_version("notes"))
        await until(lambda: alice.map("notes").get("x") == 1)


# -- offline and reconnection ---------------------------------------------------------------


async def test_offline_writes_survive_a_hub_restart(tmp_path: Path) -> None:
    async with (
        running_hub(tmp_path) as hub,
        ws_record(hub, token("alice")) as alice,
        ws_record(hub, token("bob")) as bob,
    ):
        await alice.map("m").set("before", 1)
        await alice.flush()
        await hub.stop()
        for i in range(5):  # the hub is gone: writes go on locally
            await alice.map("m").set(f"offline{i}", i)
        await alice.list("l").append("offline")
        assert alice.map("m").get("offline4") == 4
        await hub.start()  # same store, same port
        with anyio.fail_after(DEADLINE):
            await alice.flush()
        keys = {op[3] for e in await journal(hub) for op in e.effect if op[0] == "map"}
        assert {f"offline{i}" for i in range(5)} | {"before"} <= keys
        await until(lambda: bob.to_dict() == alice.to_dict())
        assert bob.list("l").to_list() == ["offline"]


# -- refusals -------------------------------------------------------------------------------


async def test_refused_tokens_raise_typed_errors_at_open(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub:
        real = token("mallory")
        forged = real[:-4] + ("AAAA" if real[-4:] != "AAAA" else "BAAA")
        with pytest.raises(CrdtStoreError) as caught:
            async with ws_record(hub, forged):
                pass
        assert caught.value.code == "TOKEN_INVALID"
        with pytest.raises(CrdtStoreError) as caught:
            async with ws_record(hub, token("mallory", run="other")):
                pass
        assert caught.value.code == "FORBIDDEN"
        with pytest.raises(CrdtStoreError) as caught:
            async with ws_record(hub.url("t2"), token("mallory")):
                pass
        assert caught.value.code == "FORBIDDEN"
        with pytest.raises(UnknownRun):  # a read-only token cannot create the run
            async with ws_record(hub, token("reader", run="nope", mode="ro"), run="nope"):
                pass
        with pytest.raises(InvalidValue):
            open_store(hub.url(), tenant="t2", token=token("x"))
        with pytest.raises(InvalidValue):
            open_store(hub.url())  # no token
        with pytest.raises(UnsupportedURL):
            open_store(f"ws://127.0.0.1:{hub.port}/a/b", token=token("x"))
        with pytest.raises(InvalidValue):
            open_store("memory://", token="x")
        async with sqlite_store(hub) as store:
            assert await store.runs() == []  # nothing was created


async def test_a_read_only_record_s_writes_are_refused(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub:
        async with ws_record(hub, token("writer")) as writer:
            await writer.map("m").set("k", 1)
            await writer.flush()
            before = await journal(hub)
            async with ws_record(hub, token("reader", mode="ro")) as reader:
                assert reader.map("m").get("k") == 1  # it reads
                with pytest.raises(ReadOnlyAccess):  # refused before the document changes
                    await reader.map("m").set("k", 2)
                assert reader.map("m").get("k") == 1
                with pytest.raises(ReadOnlyAccess):
                    await reader.list("log").append("x")
                with pytest.raises(ReadOnlyAccess):
                    await reader.apply_update(b"\x00\x00")
                assert "log" not in reader.to_dict()
                await reader.flush()  # nothing to flush: a reader's flush is fine
                await writer.map("m").set("other", 4)  # and it still follows the run
                await until(lambda: reader.map("m").get("other") == 4)
            await writer.flush()
            after = await journal(hub)
        assert [e.agent for e in after[len(before) :]] == ["writer"]


async def test_a_client_cannot_lift_the_run_s_policies(tmp_path: Path) -> None:
    from crdtstore import CollectionSpec

    async with running_hub(tmp_path) as hub:
        async with (
            sqlite_store(hub) as store,
            store.open_record(
                RUN, "owner", schema={"tasks": CollectionSpec(kind="map", policy="owner")}
            ) as rec,
        ):
            await rec.map("tasks").set("t1", "mine")
            await rec.flush()
        async with ws_record(hub, token("mallory")) as mallory:
            assert mallory.spec("tasks") is not None
            with pytest.raises(PolicyViolation):  # checked locally first
                await mallory.map("tasks").set("t1", "stolen")
            backend = mallory._backend
            assert isinstance(backend, WsJournal)
            config = await backend.get_config(TENANT, RUN)
            with pytest.raises(PolicyViolation):
                await backend.call(RUN, "config.put", {"expected": config, "new": {}})
            # raw bytes that overwrite the key: the hub derives the effect and refuses it
            from pycrdt import Doc, Map

            doc: Doc[Any] = Doc()
            doc.apply_update(mallory.replica.doc.get_update())
            before = doc.get_state()
            doc.get("tasks", type=Map)["t1"] = "stolen"
            update = doc.get_update(before)
            with pytest.raises(PolicyViolation):
                await backend.call(
                    RUN,
                    "journal.append",
                    {"entries": [{"update": _b64(update), "client_id": doc.client_id}]},
                )
        entries = await journal(hub)
        assert {e.agent for e in entries} == {"owner"}
        async with ws_record(hub, token("x")) as rec:
            with pytest.raises(UnsupportedOperation):
                await rec._store.compact(RUN)
            with pytest.raises(UnsupportedOperation):
                await rec._store.delete_run(RUN)
            with pytest.raises(UnsupportedOperation):
                await rec._store.close_run(RUN)
            head = (await rec._store.run_info(RUN)).head
            with pytest.raises(Forbidden):  # (the hub redacts, for a token with the right)
                await rec._store.redact(RUN, "tasks", "t1", agent="x", reason="r")
            assert (await rec._store.run_info(RUN)).head == head, "a refused redact writes nothing"
            assert [r.run for r in await rec._store.runs()] == [RUN]


# -- the protocol pieces --------------------------------------------------------------------


def test_push_round_trips_and_only_the_hub_sends_it() -> None:
    push = Push(push="head", seq=42)
    assert decode(encode(push)) == push
    from pycrdt import Doc

    client = ClientSession(PycrdtDocument(Doc()))
    assert client.receive(encode(push)).message == push
    server = ServerSession(PycrdtDocument(Doc()))
    with pytest.raises(ProtocolError):
        server.receive(encode(push))
    with pytest.raises(ProtocolError):
        decode(encode(push)[:-1])


def test_errors_round_trip_through_their_dict() -> None:
    err = StaleVersion("notes", "k", 3, 7, {"v": [1]})
    back = error_from_dict(err.to_dict())
    assert type(back) is StaleVersion
    assert (back.current_version, back.current_value, back.expected_version) == (7, {"v": [1]}, 3)
    assert str(back) == str(err)
    other = error_from_dict({"code": "SOMETHING_ELSE", "message": "m"})
    assert type(other) is CrdtStoreError and other.code == "SOMETHING_ELSE"


# -- a real hub process, killed -------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn_hub(store_url: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CRDTSTORE_SECRET": SECRET.decode()}
    return subprocess.Popen(
        [sys.executable, "-m", "sync", "--store", store_url, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def test_kill_9_of_the_hub_loses_nothing_acknowledged(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    port = _free_port()
    url = f"ws://127.0.0.1:{port}/{TENANT}"
    proc = _spawn_hub(store_url, port)
    acked: set[str] = set()
    try:
        async with (
            ws_record(url, token("alice"), connect_timeout=DEADLINE) as alice,
            ws_record(url, token("bob"), connect_timeout=DEADLINE) as bob,
        ):
            for round_ in range(3):
                for i in range(10):
                    await alice.map("m").set(f"r{round_}-{i}", i)
                    if i == 5 and round_ < 2:
                        proc.send_signal(signal.SIGKILL)  # mid-stream
                        await anyio.to_thread.run_sync(proc.wait)
                        proc = _spawn_hub(store_url, port)
                with anyio.fail_after(DEADLINE * 2):
                    await alice.flush()
                acked |= {f"r{round_}-{i}" for i in range(10)}
            await until(lambda: set(bob.map("m").keys()) >= acked)
    finally:
        proc.send_signal(signal.SIGKILL)
        await anyio.to_thread.run_sync(proc.wait)
    async with open_store(store_url, tenant=TENANT) as store:
        keys = {op[3] for e in await store.journal(RUN, limit=10_000) for op in e.effect}
        assert acked <= keys
        entries = await store.journal(RUN, limit=10_000)
        assert {e.agent for e in entries} == {"alice"}


# -- leases, claims and fenced writes through the hub ---------------------------------------


async def test_claims_and_fenced_writes_go_to_the_hub(tmp_path: Path) -> None:
    from crdtstore import LeaseHeld, LeaseLost

    async with (
        running_hub(tmp_path) as hub,
        ws_record(hub, token("alice")) as alice,
        ws_record(hub, token("bob")) as bob,
    ):
        claim = await alice.claim("tasks", "t1", ttl=5)
        assert alice.map("claims").get("tasks/t1")["claimer"] == "alice"
        with pytest.raises(LeaseHeld):
            await bob.claim("tasks", "t1", ttl=5)
        await claim.complete({"ok": True})
        await until(lambda: (bob.map("claims").get("tasks/t1") or {}).get("state") == "done")
        with pytest.raises(LeaseHeld):  # done: nobody takes it again
            await bob.claim("tasks", "t1", ttl=5)
        # a fenced write with a lease that is gone is refused by the hub, nothing journaled
        lease = bob._store.lease(["item:tasks/t2"], ttl=5, owner="bob")
        await lease.acquire()
        await lease.release()
        before = await journal(hub)
        with pytest.raises(LeaseLost):
            await bob.map("tasks").set("t2", "x", lease=lease, resource="item:tasks/t2")
        assert await journal(hub) == before
        assert "t2" not in bob.map("tasks")
    entries = await journal(hub)
    claims = [e for e in entries if any(op[1] == "claims" for op in e.effect)]
    assert [e.agent for e in claims] == ["alice", "alice"]


# -- plain Yjs clients alongside ------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_plain_yjs_client_and_a_ws_record_converge(tmp_path: Path) -> None:
    from pycrdt import Doc, Map
    from websockets.asyncio.client import connect

    registry = "__crdtstore_collections"
    async with running_hub(tmp_path) as hub, ws_record(hub, token("alice")) as alice:
        doc: Doc[Any] = Doc()
        session = ClientSession(PycrdtDocument(doc))
        url = f"{hub.url()}/{RUN}?token={token('yjs')}"
        async with connect(url) as ws, anyio.create_task_group() as tg:

            async def reader() -> None:
                async for frame in ws:
                    assert isinstance(frame, bytes)
                    for reply in session.receive(frame).reply_frames():
                        await ws.send(reply)

            tg.start_soon(reader)
            for frame in session.start():
                await ws.send(frame)
            await alice.map("notes").set("from_ws", 1)
            await until(lambda: doc.get("notes", type=Map).get("from_ws") == 1)
            before = doc.get_state()
            with doc.transaction():
                doc.get(registry, type=Map)["notes"] = "map"
                doc.get("notes", type=Map)["from_yjs"] = 2
            await ws.send(session.update_frame(doc.get_update(before)))
            await until(lambda: alice.map("notes").get("from_yjs") == 2)
            await until(lambda: alice.provenance("notes", "from_yjs") is not None)
            assert alice.provenance("notes", "from_yjs").agent == "yjs"  # type: ignore[union-attr]
            tg.cancel_scope.cancel()
        backend = alice._backend
        assert isinstance(backend, WsJournal)
        link_session = backend._links[RUN].session
        assert link_session is not None
        assert link_session.updates_applied == 0  # a crdtstore client gets pushes, not updates


# -- property: any interleaving of writers converges, with the same versions everywhere -----

_KEYS = st.sampled_from(["a", "b", "c"])
_STEP = st.tuples(
    st.integers(0, 2),  # writer: two ws clients and an embedded record
    st.one_of(
        st.tuples(st.just("set"), _KEYS, st.integers(0, 9)),
        st.tuples(st.just("del"), _KEYS, st.just(0)),
        st.tuples(st.just("guarded"), _KEYS, st.integers(0, 9)),
        st.tuples(st.just("append"), st.just("log"), st.integers(0, 9)),
        st.tuples(st.just("flush"), st.just(""), st.just(0)),
    ),
)


async def _run_program(hub: HubThread, run: str, program: list[Any]) -> None:
    async with (
        ws_record(hub, token("w0", run="p*"), run=run) as w0,
        ws_record(hub, token("w1", run="p*"), run=run) as w1,
        sqlite_store(hub) as store,
        store.open_record(run, "w2") as w2,
    ):
        recs = [w0, w1, w2]
        # values are unique: two concurrent writes of one value (or two deletes) cannot be
        # told apart, and replicas may name either as the key's version (Replica.apply_rows)
        for value, (who, (kind, key, _)) in enumerate(program):
            rec = recs[who]
            if kind == "set":
                await rec.map("m").set(key, value)
            elif kind == "del":
                await rec.map("m").delete(key)
            elif kind == "append":
                await rec.list(key).append(value)
            elif kind == "flush":
                await rec.flush()
            else:
                version = rec.version("m", key)
                try:
                    await rec.map("m").set(key, value, expected_version=version or 0)
                except StaleVersion as exc:
                    assert exc.current_version != (version or 0)
                else:
                    # the value written, unless a concurrent write of another writer (made
                    # before ours was journaled, journaled after it: an earlier step of a
                    # ws:// writer still on its way to the hub) arrived meanwhile and won
                    # last-writer-wins; then provenance names that writer
                    if rec.map("m").get(key) != value:
                        prov = rec.provenance("m", key)
                        assert prov is not None and prov.agent != rec.agent, (key, prov)
        for rec in recs:
            await rec.flush()
        head = (await store.run_info(run)).head
        await until(lambda: all(r.applied_seq >= head or r.replica.head >= head for r in recs))
        await until(lambda: w0.to_dict() == w1.to_dict() == w2.to_dict())
        for key in w2.map("m"):  # present keys (concurrent deletes: see above)
            assert w0.version("m", key) == w1.version("m", key) == w2.version("m", key), key
        replayed = await store.replay(run)
        assert replayed.to_dict() == w2.to_dict()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_ws_and_embedded_writers_converge_with_equal_versions(tmp_path: Path, backend: str) -> None:
    hub = HubThread(f"sqlite:///{tmp_path / 'store.db'}")
    hub._start()
    runs = iter(range(10_000))
    try:

        @settings(max_examples=12, deadline=None)
        @given(st.lists(_STEP, min_size=1, max_size=25))
        def check(program: list[Any]) -> None:
            anyio.run(_run_program, hub, f"p{next(runs)}", program, backend=backend)

        check()
    finally:
        hub._stop()


async def test_the_ws_journal_passes_the_attributing_conformance_suite(tmp_path: Path) -> None:
    """``WsJournal`` against ``crdtstore.testing.check_attributing_journal_backend``: the
    journal rules of every backend, for one that derives effects and writers itself."""
    from crdtstore.testing import check_attributing_journal_backend

    async with running_hub(tmp_path) as hub:
        await check_attributing_journal_backend(
            lambda: WsJournal(hub.url(), token=token("alice", run="*"), **FAST), TENANT
        )
