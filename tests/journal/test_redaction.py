"""Redaction that keeps the audit trail (issue 19 part 4): ``store.redact`` for a map key, a
map field, a list item and a text span removes the value's bytes from the record, the
journal and the snapshots (the raw bytes of the files are searched), keeps every journal
entry with its agent, and a second process holding the record drops the value without
reopening. Memory, SQLite and a real redis-server (with its append-only file)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycrdt import Array, Doc, Map, Text

import crdtstore
from crdtstore import InvalidValue
from crdtstore.codec import decode_update
from crdtstore.codec._redact import blank_items
from tests._redis import RedisServer
from tests._wait import until

pytestmark = pytest.mark.anyio

SECRETS = {
    "key": "KEY-SECRET-4711",
    "field": "FIELD-SECRET-0815",
    "item": "ITEM-SECRET-1234",
    "span": "SPAN-SECRET-9876",
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's client is asyncio only


@pytest.fixture(params=["memory", "sqlite", "redis"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://redact-{id(request)}"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    srv: RedisServer = request.getfixturevalue("redis_server")
    return srv.url()


async def _fill(store: crdtstore.Store) -> None:
    async with store.open_record(run="r", agent="writer", source="tool") as rec:
        await rec.map("m").set("k", {"ssn": SECRETS["key"]})
        await rec.map("m").set("k", SECRETS["key"] + "-v2")  # an overwrite holds it too
        await rec.map("m").set("other", "kept")
        # a merge="fields" entry's field f is the physical key "e\x1ef" (its layout contract)
        await rec.map("m").set("e\x1ef", SECRETS["field"])
        await rec.map("m").set("e\x1eg", "kept field")
        await rec.list("l").extend(["a", SECRETS["item"], "b"])
        await rec.text("t").edit(f"before {SECRETS['span']} after é")
    await store.compact("r")  # a snapshot that holds every value
    async with store.open_record(run="r", agent="later", source="model") as rec:
        await rec.list("l").append("c")


async def _redact_all(store: crdtstore.Store) -> None:
    await store.redact("r", "m", "k", agent="dpo", reason="erasure")
    await store.redact("r", "m", "e", field="f", agent="dpo", reason="erasure")
    await store.redact("r", "l", index=1, agent="dpo", reason="erasure")
    start = len("before ")
    await store.redact("r", "t", span=(start, start + len(SECRETS["span"])), agent="dpo")


async def test_redaction_keeps_every_entry_and_leaves_no_byte(
    url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async with crdtstore.open_store(url) as store:
        await _fill(store)
        before = [(e.seq, e.agent) for e in await store.journal("r")]
        await _redact_all(store)
        entries = await store.journal("r")
        # every entry is still there, by whom it was written; the redactions appended
        assert [(e.seq, e.agent) for e in entries][: len(before)] == before
        assert [e.effect[0][2] for e in entries[len(before) :]] == ["del", "redact"] * 4
        for e in entries:
            for secret in SECRETS.values():
                assert secret.encode() not in e.update, (e.seq, secret)
                assert secret not in str(e.effect), (e.seq, secret)
        marked = [op for e in entries for op in e.effect if "$redacted" in str(op)]
        assert len(marked) == 5  # two sets of k, the field, the list insert, the text insert
        assert all("'agent': 'dpo'" in str(op) for op in marked)
        snap = await store.backend.load_snapshot(store.tenant, "r")
        assert snap is not None
        for secret in SECRETS.values():
            assert secret.encode() not in snap.update
        history = await store.history("r", "m", "k")
        assert [(h.provenance.agent, h.redacted, h.value) for h in history] == [
            ("writer", True, None),
            ("writer", True, None),
            ("dpo", False, None),  # the delete
            ("dpo", True, None),  # the redaction
        ]
        assert history[2].deleted
        async with store.open_record(run="r", agent="reader", create=False) as rec:
            assert rec.to_dict() == {
                "m": {"other": "kept", "e\x1eg": "kept field"},
                "l": ["a", "b", "c"],
                "t": "before  after é",
            }
            for secret in SECRETS.values():
                assert secret.encode() not in rec.replica.doc.get_update()
    # the raw bytes of the storage
    if url.startswith("sqlite"):
        files = list(tmp_path.glob("store.db*"))
        assert files
        for f in files:
            for secret in SECRETS.values():
                assert secret.encode() not in f.read_bytes(), (f.name, secret)
    elif url.startswith("redis"):
        srv: RedisServer = request.getfixturevalue("redis_server")

        def aof_clean() -> bool:
            blobs = b"".join(p.read_bytes() for p in srv.folder.rglob("*") if p.is_file())
            return not any(s.encode() in blobs for s in SECRETS.values())

        await until(aof_clean, "the append-only file rewritten without the values")


async def test_a_redis_saving_rdb_snapshots_rewrites_them_too(tmp_path: Path) -> None:
    """A Redis with an RDB ``save`` schedule keeps a dump of the data set: the value saved in
    it before the redaction leaves it too (``BGSAVE`` after the rewrite of the AOF)."""
    srv = RedisServer(tmp_path / "redis")
    srv.extra = ["--save", "3600 1"]
    srv.start()
    try:
        async with crdtstore.open_store(srv.url()) as store:
            await _fill(store)
            with srv.client() as c:
                c.save()  # the dump now holds every value
            dump = srv.folder / "dump.rdb"
            assert SECRETS["key"].encode() in dump.read_bytes()
            await _redact_all(store)
        for f in srv.folder.rglob("*"):
            if f.is_file():
                for secret in SECRETS.values():
                    assert secret.encode() not in f.read_bytes(), (f.name, secret)
    finally:
        srv.stop()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_a_second_process_drops_the_value_without_reopening(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path}/store.db"
    else:
        url = request.getfixturevalue("redis_server").url()
    secret = SECRETS["key"]
    async with crdtstore.open_store(url) as store:
        async with store.open_record(run="r", agent="writer", source="tool") as rec:
            await rec.map("m").set("k", secret)
            await rec.map("m").set("x", "kept")
        err = (tmp_path / "child.stderr").open("w")
        proc = subprocess.Popen(  # noqa: ASYNC220 (started once; a thread reads it)
            [
                sys.executable,
                str(Path(__file__).resolve().parents[1] / "_redact_proc.py"),
                url,
                "r",
                secret,
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
        reader.start()
        try:
            await until(lambda: "ready\n" in lines or proc.poll() is not None, "child ready")
            assert "ready\n" in lines, (tmp_path / "child.stderr").read_text()
            await store.redact("r", "m", "k", agent="dpo", reason="erasure")
            await until(lambda: len(lines) > 1 or proc.poll() is not None, "child's verdict")
            proc.wait(timeout=30)
            reader.join(timeout=30)
            assert lines[-1] == "dropped\n", (lines, (tmp_path / "child.stderr").read_text())
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
            err.close()


async def test_bad_redactions_are_refused_and_change_nothing() -> None:
    async with crdtstore.open_store("memory://redact-bad") as store:
        await _fill(store)
        before = await store.journal("r")
        bad: list[dict[str, Any]] = [
            {"key": "k", "index": 0},
            {"index": 0, "span": (0, 1)},
            {},
            {"field": "f"},
            {"key": "k", "field": ""},
            {"span": (3, 3)},
            {"span": "0-3"},
            {"index": "0"},
        ]
        for kwargs in bad:
            with pytest.raises(InvalidValue):
                await store.redact("r", "m", **kwargs)
        with pytest.raises(IndexError):
            await store.redact("r", "l", index=99)
        with pytest.raises(IndexError):
            await store.redact("r", "t", span=(0, 999))
        assert await store.journal("r") == before


# -- the rewriter: pycrdt accepts the rewritten updates -------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    words=st.lists(st.text(min_size=1, max_size=6), min_size=2, max_size=8),
    batches=st.integers(1, 3),
    pick=st.data(),
)
def test_resume_from_rewritten_updates_equals_the_live_doc(
    words: list[str], batches: int, pick: st.DataObject
) -> None:
    """Updates written by two docs (list, text and map); one list item and one text span are
    deleted live; the updates rewritten with their content blanked replay to the same
    document, and hold none of the blanked content."""
    a, b = Doc(), Doc()
    updates: list[bytes] = []
    a.observe(lambda e: updates.append(e.update))
    b.observe(lambda e: updates.append(e.update))
    for n, w in enumerate(words):
        doc = a if n % 2 else b
        if updates:
            for u in updates:
                doc.apply_update(u)
        with doc.transaction():
            doc.get("l", type=Array).append(w)
            doc.get("t", type=Text).insert(0, w)
            doc.get("m", type=Map)[f"k{n % batches}"] = w
    live = Doc()
    for u in updates:
        live.apply_update(u)
    lst, txt = live.get("l", type=Array), live.get("t", type=Text)
    i = pick.draw(st.integers(0, len(lst) - 1))
    s = str(txt)
    start = pick.draw(st.integers(0, len(s) - 1))
    end = pick.draw(st.integers(start + 1, len(s)))
    deletes: list[bytes] = []
    live.observe(lambda e: deletes.append(e.update))
    del lst[i]
    del txt[len(s[:start].encode()) : len(s[:end].encode())]  # (pycrdt: UTF-8 offsets)
    targets = [d for u in deletes for d in decode_update(u).deletes]
    updates += deletes
    rewritten = [blank_items(u, targets)[0] for u in updates]
    resumed = Doc()
    for u in rewritten:
        resumed.apply_update(u)
    assert resumed.get("l", type=Array).to_py() == lst.to_py()
    assert str(resumed.get("t", type=Text)) == str(txt)
    assert resumed.get("m", type=Map).to_py() == live.get("m", type=Map).to_py()
    # the rewritten updates apply on top of a replica that has the originals too
    both = Doc()
    for u in updates + rewritten:
        both.apply_update(u)
    assert str(both.get("t", type=Text)) == str(txt)


async def test_a_span_typed_in_pieces_leaves_none_of_them_in_the_effects() -> None:
    """A secret typed by two agents in three edits: every entry keeps its agent, none keeps
    a piece of the secret in its update or effect, the text around it stays."""
    async with crdtstore.open_store("memory://redact-pieces") as store:
        async with store.open_record(run="r", agent="a") as rec:
            await rec.text("t").edit("id: PIECE")
        async with store.open_record(run="r", agent="b") as rec:
            await rec.text("t").edit("id: PIECE-WISE-SEC")
            await rec.text("t").edit("id: PIECE-WISE-SECRET; ok")
        start = len("id: ")
        secret = "PIECE-WISE-SECRET"
        await store.redact("r", "t", span=(start, start + len(secret)), agent="dpo")
        entries = await store.journal("r")
        assert [e.agent for e in entries] == ["a", "b", "b", "dpo", "dpo"]
        for e in entries:
            for piece in ("PIECE", "WISE", "SEC", "RET"):
                assert piece.encode() not in e.update and piece not in str(e.effect), e
        async with store.open_record(run="r", agent="c", create=False) as rec:
            assert rec.text("t").read() == "id: ; ok"


def test_rows_that_did_not_hold_the_value_are_not_rewritten() -> None:
    # memory:// keeps a single set's ops as tuples: an untouched row compares equal still
    from crdtstore._journal import Row, checksum
    from crdtstore._store_redact import marker, rewrite_rows
    from crdtstore.codec import KeyIndex

    doc = Doc()
    doc["m"] = m = Map()
    m["other"] = "kept"
    update = doc.get_update()
    effect = (("map", "m", "set", "other", "kept"),)
    row = Row(1, "a", "tool", 7, 1.0, update, effect, checksum(update))  # type: ignore[arg-type]
    index = KeyIndex()
    mark = marker("a", "why", 2.0)
    assert rewrite_rows([row], index, "map", "m", "k", [], "secret", mark) == []
    hit = row._replace(effect=(("map", "m", "set", "k", "secret"),))
    (out,) = rewrite_rows([hit], index, "map", "m", "k", [], "secret", mark)
    assert "secret" not in repr(out.effect)
