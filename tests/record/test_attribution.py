"""Per-write attribution: ``rec.attributed(source=..., call=...)`` puts a source kind and a
tool-call id on the journal entries of the writes made inside the block, whatever their kind,
on every backend and through a hub, and ``history``, ``journal`` and the CLI show the call id.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from pycrdt import Doc, Map

import crdtstore
from crdtstore import InvalidValue, Store
from crdtstore._journal import NewEntry, checksum
from tests._wait import until
from tests.cli.test_cli import cli, cli_json
from tests.network.test_sync_client import RUN, journal, running_hub, token, ws_record

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://attribution-{id(request)}"
    return f"sqlite:///{tmp_path}/store.db"


async def entries(store: Store, run: str = "r") -> list[tuple[str, str, str]]:
    """(agent, source, call) of every journal entry of ``run``."""
    return [(e.agent, e.source, e.call) for e in await store.journal(run, limit=100_000)]


# -- the block --------------------------------------------------------------------------------


async def test_writes_inside_the_block_carry_source_and_call(url: str) -> None:
    async with crdtstore.open_store(url) as store, store.open_record("r", "a") as rec:
        m = rec.map("m")
        await m.set("before", 1)
        with rec.attributed(source="tool", call="call_1") as same:
            assert same is rec
            await m.set("k", 1)
            await m.update({"x": 1, "y": 2})
            await m.delete("before")
            # the live index names the source; it does not keep call ids
            prov = rec.provenance("m", "k")
            assert prov is not None and (prov.source, prov.call) == ("tool", None)
        await m.set("after", 1)
        await rec.flush()
        assert await entries(store) == [
            ("a", "model", ""),
            ("a", "tool", "call_1"),
            ("a", "tool", "call_1"),
            ("a", "tool", "call_1"),
            ("a", "model", ""),
        ]
        provs = [h.provenance for h in await rec.history("m", "k")]
        assert [(p.source, p.call) for p in provs] == [("tool", "call_1")]
        provs = [h.provenance for h in await m.history("before")]
        assert [(p.source, p.call) for p in provs] == [("model", None), ("tool", "call_1")]
        assert (await store.journal("r"))[0].call == ""


async def test_only_the_call_or_only_the_source_and_nested_blocks(url: str) -> None:
    async with crdtstore.open_store(url) as store, store.open_record("r", "a", "user") as rec:
        m = rec.map("m")
        with rec.attributed(call="c1"):
            await m.set("a", 1)  # the record's source, the call id
            with rec.attributed(source="system"):
                await m.set("b", 1)  # keeps the outer call id
                with rec.attributed(call="c2"):
                    await m.set("c", 1)  # keeps the source of the block around it
            await m.set("d", 1)
        with rec.attributed(source="tool"):
            await m.set("e", 1)
        await rec.flush()
        assert await entries(store) == [
            ("a", "user", "c1"),
            ("a", "system", "c1"),
            ("a", "system", "c2"),
            ("a", "user", "c1"),
            ("a", "tool", ""),
        ]


async def test_a_transaction_opened_inside_the_block_is_one_attributed_entry(url: str) -> None:
    async with crdtstore.open_store(url) as store, store.open_record("r", "a") as rec:
        with rec.attributed(source="tool", call="txn-call"):
            async with rec.transaction():
                await rec.map("m").set("k", 1)
                await rec.list("log").append("k set")
                await rec.text("notes").insert(0, "hello")
        # a transaction opened outside a block: its entry has the attribution it opened with
        async with rec.transaction():
            with rec.attributed(call="too-late"):
                await rec.map("m").set("k", 2)
        await rec.flush()
        journal_ = await store.journal("r")
        assert [(e.source, e.call, len(e.effect)) for e in journal_] == [
            ("tool", "txn-call", 3),
            ("model", "", 1),
        ]


async def test_guarded_and_fenced_writes_and_claims(url: str) -> None:
    async with crdtstore.open_store(url) as store, store.open_record("r", "a") as rec:
        m = rec.map("m")
        with rec.attributed(source="tool", call="guarded"):
            await m.set("k", 1, expected_version=0)
            _, version = m.get_versioned("k")
            await m.set("k", 2, expected_version=version)
            await m.set("j", 1, based_on=rec.current_version("m"))
            await m.delete("j", expected_version=m.get_versioned("j")[1])
        lease = store.lease(["src/main.py"], ttl=30, owner="a")
        await lease.acquire()
        with rec.attributed(call="fenced"):
            await rec.map("files").set("src/main.py", {"lines": 1}, lease=lease)
        await lease.release()
        with rec.attributed(source="tool", call="claim-call"):
            claim = await rec.claim("tasks", "t1", ttl=30)
        with rec.attributed(source="tool", call="complete-call"):
            await claim.complete({"ok": True})
        await rec.flush()
        assert await entries(store) == [
            ("a", "tool", "guarded"),
            ("a", "tool", "guarded"),
            ("a", "tool", "guarded"),
            ("a", "tool", "guarded"),
            ("a", "model", "fenced"),
            ("a", "tool", "claim-call"),
            ("a", "tool", "complete-call"),
        ]
        history = await rec.map("claims").history("tasks/t1")
        assert [(h.value["state"], h.provenance.call) for h in history] == [
            ("claimed", "claim-call"),
            ("done", "complete-call"),
        ]


async def test_list_and_text_writes_and_apply_update(url: str) -> None:
    other: Doc[Any] = Doc()
    other.get("ext", type=Map)["x"] = 1
    async with crdtstore.open_store(url) as store, store.open_record("r", "a") as rec:
        with rec.attributed(source="tool", call="lt"):
            await rec.list("log").append("one")
            await rec.list("log").extend(["two", "three"])
            await rec.list("log").delete(0)
            await rec.text("notes").edit("hello world")
            await rec.text("notes").edit("hello there world")
            await rec.apply_update(other.get_update())
        await rec.flush()
        kinds = [(e.effect[0][0], e.source, e.call) for e in await store.journal("r")]
        assert kinds == [
            ("list", "tool", "lt"),
            ("list", "tool", "lt"),
            ("list", "tool", "lt"),
            ("text", "tool", "lt"),
            ("text", "tool", "lt"),
            ("map", "tool", "lt"),
        ]


async def test_the_block_applies_to_its_task_and_the_tasks_it_starts_only(url: str) -> None:
    async with (
        crdtstore.open_store(url) as store,
        store.open_record("r", "a") as rec,
        store.open_record("r2", "b") as other,
    ):
        inside = anyio.Event()
        done = anyio.Event()

        async def bystander() -> None:  # another task writing while the block is open
            await inside.wait()
            await rec.map("m").set("bystander", 1)
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(bystander)
            with rec.attributed(source="tool", call="mine"):
                async with anyio.create_task_group() as child:
                    child.start_soon(rec.map("m").set, "child", 1)  # started inside: inherits
                await other.map("m").set("other-record", 1)  # another record: not affected
                inside.set()
                await done.wait()
                await rec.map("m").set("mine", 1)
        await rec.flush()
        await other.flush()
        journal_ = await store.journal("r")
        by_key = {e.effect[0][3]: (e.source, e.call) for e in journal_}
        assert by_key == {
            "child": ("tool", "mine"),
            "bystander": ("model", ""),
            "mine": ("tool", "mine"),
        }
        assert await entries(store, "r2") == [("b", "model", "")]


@pytest.mark.parametrize(
    ("options", "what"),
    [
        ({"source": "robot"}, "source"),
        ({"source": 3}, "source"),
        ({"call": "x" * 257}, "call"),
        ({"call": "a\x00b"}, "call"),
        ({"call": 7}, "call"),
        ({"source": "tool", "call": b"bytes"}, "call"),
    ],
)
async def test_a_bad_source_or_call_is_refused_and_changes_nothing(
    url: str, options: dict[str, Any], what: str
) -> None:
    async with crdtstore.open_store(url) as store, store.open_record("r", "a") as rec:
        with pytest.raises(InvalidValue, match=what):
            with rec.attributed(**options):
                await rec.map("m").set("never", 1)
        assert "never" not in rec.map("m")
        await rec.map("m").set("k", 1)  # no block was left open
        await rec.flush()
        assert await entries(store) == [("a", "model", "")]
    with rec.attributed(call="c" * 256):  # the longest call id is fine (no write: closed)
        pass


def test_the_blocking_facade_carries_the_block(tmp_path: Path) -> None:
    from crdtstore import blocking

    with (
        blocking.open_store(f"sqlite:///{tmp_path}/store.db") as store,
        store.open_record(run="r", agent="a") as rec,
    ):
        with rec.attributed(source="tool", call="sync-call"):
            rec.map("m").set("k", 1)
            rec.list("log").append("x")
        rec.map("m").set("j", 1)
        rec.flush()
        got = [(e.source, e.call) for e in rec.journal()]
        assert got == [("tool", "sync-call"), ("tool", "sync-call"), ("model", "")]


# -- on disk ------------------------------------------------------------------------------------


async def test_call_ids_survive_reopening_the_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    async with crdtstore.open_store(url) as store, store.open_record("r", "a") as rec:
        with rec.attributed(source="tool", call="call_ÄÖ✓"):
            await rec.map("m").set("k", 1)
        await rec.map("m").set("k", 2)
    async with crdtstore.open_store(url) as store:
        assert await entries(store) == [("a", "tool", "call_ÄÖ✓"), ("a", "model", "")]
        history = await store.history("r", "m", "k")
        assert [h.provenance.call for h in history] == ["call_ÄÖ✓", None]
        async with store.open_record("r", "b") as rec:  # replays the journal as before
            assert rec.map("m")["k"] == 2


async def test_a_store_file_made_before_call_ids_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    url = f"sqlite:///{db}"
    async with crdtstore.open_store(url) as store, store.open_record("r", "a") as rec:
        await rec.map("m").set("old", 1)
    raw = sqlite3.connect(db)
    try:  # the file as a store before the column wrote it
        raw.execute("ALTER TABLE journal DROP COLUMN call")
        columns = {row[1] for row in raw.execute("PRAGMA table_info(journal)")}
        assert "call" not in columns and "origin" in columns
        raw.commit()
    finally:
        raw.close()
    async with crdtstore.open_store(url) as store, store.open_record("r", "a") as rec:
        assert rec.map("m")["old"] == 1
        with rec.attributed(call="after-migration"):
            await rec.map("m").set("new", 1)
        await rec.flush()
        assert [e.call for e in await store.journal("r")] == ["", "after-migration"]
    raw = sqlite3.connect(db)
    try:
        assert "call" in {row[1] for row in raw.execute("PRAGMA table_info(journal)")}
    finally:
        raw.close()


# -- through a hub --------------------------------------------------------------------------------


async def test_through_a_hub_the_call_id_is_journaled_with_the_tokens_identity(
    tmp_path: Path,
) -> None:
    async with (
        running_hub(tmp_path) as hub,
        ws_record(hub, token("alice", source="model")) as rec,
    ):
        m = rec.map("m")
        with rec.attributed(source="tool", call="call_hub"):
            await m.set("plain", 1)  # journal.append (the hub's fast path)
            await m.set("guarded", 1, expected_version=0)  # journal.append_guarded
            # not applied on a store that names the writer: the record shows what the hub does
            prov = rec.provenance("m", "plain")
            assert prov is not None and prov.source == "model"
        await m.set("outside", 1)
        await rec.flush()
        # a batch of entries with and without a call id (one journal.append of both)
        with rec.attributed(call="mixed"):
            await m.set("a", 1)
        await m.set("b", 1)
        await rec.flush()
        got = [(e.effect[0][3], e.agent, e.source, e.call) for e in await journal(hub)]
        assert got == [
            ("plain", "alice", "model", "call_hub"),
            ("guarded", "alice", "model", "call_hub"),
            ("outside", "alice", "model", ""),
            ("a", "alice", "model", "mixed"),
            ("b", "alice", "model", ""),
        ]
        # rows read back through the hub carry it too (journal.read, journal.history)
        assert [(e.source, e.call) for e in await rec.journal()][:2] == [
            ("model", "call_hub"),
            ("model", "call_hub"),
        ]
        history = await m.history("guarded")
        assert [(h.provenance.agent, h.provenance.call) for h in history] == [("alice", "call_hub")]
        # another ws:// client gets them through the hub's pushes and reads
        async with ws_record(hub, token("bob")) as bob:
            await until(lambda: "b" in bob.map("m"), "bob to read the journal")
            assert [e.call for e in await bob.journal()] == [
                "call_hub",
                "call_hub",
                "",
                "mixed",
                "",
            ]


def _update(key: str) -> bytes:
    doc: Doc[Any] = Doc()
    doc.get("m", type=Map)[key] = 1
    return doc.get_update()


async def test_external_appends_carry_their_call_ids_on_both_paths(url: str) -> None:
    """``Record.append_updates`` (what the hub journals a client's entries with): the fast
    path (unguarded, as the record's own pending entries) and the authority path."""
    async with crdtstore.open_store(url) as store, store.open_record("r", "hub", "system") as rec:
        await rec.map("m").set("seed", 0)  # (registers the map: effects name its keys)
        fast = await rec.append_updates(
            [_update("f1"), _update("f2")], client_id=77, durable=False, calls=["c-f1", ""]
        )
        slow = await rec.append_updates(
            [_update("s1"), _update("s2")], client_id=77, durable=True, calls=["", "c-s2"]
        )
        assert rec.fast_appends == 1 and len(fast + slow) == 4
        with pytest.raises(InvalidValue):
            await rec.append_updates([_update("x")], client_id=77, calls=["a", "b"])
        with pytest.raises(InvalidValue):
            await rec.append_updates([_update("y")], client_id=77, calls=["\x00"])
        assert "x" not in rec.map("m") and "y" not in rec.map("m")
        await rec.flush()
        got = [(e.effect[0][3], e.client_id, e.call) for e in await store.journal("r")]
        assert got[1:] == [("f1", 77, "c-f1"), ("f2", 77, ""), ("s1", 77, ""), ("s2", 77, "c-s2")]


@pytest.mark.parametrize("bad", ["x" * 257, "nul\x00", 42, ["list"]])
async def test_the_hub_refuses_a_bad_call_id_and_journals_nothing(tmp_path: Path, bad: Any) -> None:
    async with running_hub(tmp_path) as hub, ws_record(hub, token("alice")) as rec:
        await rec.map("m").set("k", 1)
        await rec.flush()
        before = await journal(hub)
        backend: Any = rec._store.backend
        good = {"update": _b64(_update("good")), "client_id": 4242, "call": "fine"}
        evil = {"update": _b64(_update("evil")), "client_id": 4242, "call": bad}
        with pytest.raises(InvalidValue) as err:
            await backend.call(RUN, "journal.append", {"entries": [good, evil]})
        assert err.value.code == "INVALID_VALUE"
        with pytest.raises(InvalidValue):
            await backend.call(RUN, "journal.append_guarded", {"entry": evil})
        if isinstance(bad, str):  # what the client's own backend would send, refused alike
            update = _update("evil2")
            entry = NewEntry("x", "tool", 4242, 0.0, update, [], checksum(update), call=bad)
            with pytest.raises(InvalidValue):
                await backend.append(rec.tenant, RUN, [entry], durable=True)
        assert await journal(hub) == before
        assert set(rec.map("m")) == {"k"}


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode("ascii")


# -- the command line -----------------------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_cli_shows_call_ids(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    async with crdtstore.open_store(f"sqlite:///{db}") as store:
        async with store.open_record("r", "a") as rec:
            await rec.map("m").set("k", 0)
            with rec.attributed(source="tool", call="call_cli_1"):
                await rec.map("m").set("k", 1)
        async with store.open_record("r", "n") as plain:
            await plain.map("m").set("plain", 1)

    def run_cli() -> tuple[Any, Any, Any, Any]:
        args = ("--run", "r", "--collection", "m", "--key", "k")
        return (
            cli_json("history", db, *args),
            cli("history", db, *args),
            cli_json("journal", db, "--run", "r"),
            cli("history", db, "--run", "r", "--collection", "m", "--key", "plain"),
        )

    data, table, journal_, plain_table = await anyio.to_thread.run_sync(run_cli)
    assert [(e["source"], e["call"]) for e in data["entries"]] == [
        ("model", None),
        ("tool", "call_cli_1"),
    ]
    assert table.returncode == 0, table.stderr
    header = next(line for line in table.stdout.splitlines() if "source" in line)
    assert "call" in header.split()
    assert "call_cli_1" in table.stdout
    assert [e["call"] for e in journal_["entries"]] == [None, "call_cli_1", None]
    json.dumps(journal_)  # (plain JSON)
    assert plain_table.returncode == 0, plain_table.stderr
    plain_header = next(line for line in plain_table.stdout.splitlines() if "source" in line)
    assert "call" not in plain_header.split()  # no entry has one: no column
