"""Updates from plain Yjs clients (no crdtstore registry): their root types are registered with
the kind their items show, and their list and text edits have an effect (issue 5).

A bare pycrdt ``Doc`` stands in for a plain Yjs client: it writes root types without the
``__crdtstore_collections`` registry, and its update bytes reach a record through
``Record.apply_update`` (what the hub does with a connection's updates) or a replica through
``Replica.apply_external``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycrdt import Array, Doc, Map, Text

import crdtstore
from crdtstore.codec import CodecError as UpdateDecodeError
from crdtstore.codec import root_kinds
from crdtstore.record._document import REGISTRY
from crdtstore.record._provenance import Meta
from crdtstore.record._replica import Replica

pytestmark = pytest.mark.anyio
DEADLINE = 10.0


class PlainClient:
    """A Yjs client that knows nothing of crdtstore: a bare pycrdt Doc; ``since()`` is the
    update of what it wrote since the last call (what a y-websocket client sends)."""

    def __init__(self, client_id: int | None = None) -> None:
        self.doc: Doc[Any] = Doc(client_id=client_id)
        self._state = self.doc.get_state()

    def map(self, name: str) -> Map[Any]:
        return self.doc.get(name, type=Map)

    def array(self, name: str) -> Array[Any]:
        return self.doc.get(name, type=Array)

    def text(self, name: str) -> Text:
        return self.doc.get(name, type=Text)

    def text_insert(self, name: str, index: int, text: str) -> None:
        """Insert at character ``index`` (pycrdt's Text counts UTF-8 bytes)."""
        root = self.text(name)
        root.insert(len(str(root)[:index].encode()), text)

    def text_delete(self, name: str, index: int, count: int) -> None:
        root = self.text(name)
        current = str(root)
        start = len(current[:index].encode())
        del root[start : start + len(current[index : index + count].encode())]

    def since(self) -> bytes:
        update = bytes(self.doc.get_update(self._state))
        self._state = self.doc.get_state()
        return update


def replay_effect(state: dict[str, Any], effect: list[list[Any]]) -> dict[str, Any]:
    """Apply effect ops (the journal's format) to plain Python values, in order."""
    out = {
        k: (dict(v) if isinstance(v, dict) else v[:] if isinstance(v, list) else v)
        for k, v in state.items()
    }
    for op in effect:
        kind, name, action = op[0], op[1], op[2]
        if kind == "map":
            current = out.setdefault(name, {})
            if action == "set":
                current[op[3]] = op[4]
            else:
                current.pop(op[3], None)
        elif kind == "list":
            current = out.setdefault(name, [])
            if action == "ins":
                current[op[3] : op[3]] = op[4]
            else:
                del current[op[3] : op[3] + op[4]]
        else:
            current = out.setdefault(name, "")
            if action == "ins":
                out[name] = current[: op[3]] + op[4] + current[op[3] :]
            else:
                out[name] = current[: op[3]] + current[op[3] + op[4] :]
    return out


def numbers(value: Any) -> Any:
    """JSON numbers compare as numbers (the document keeps them as floats)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: numbers(v) for k, v in value.items()}
    return value


# -- reading the kinds of roots from update bytes ------------------------------------------------


def test_root_kinds_reads_maps_lists_and_texts_from_the_items() -> None:
    client = PlainClient()
    with client.doc.transaction():
        client.map("m")["a"] = {"x": [1, "s", None, True, 1.5, -7]}
        client.map("m")["b"] = Map({"nested": 1})
        client.array("l").extend([1, "two", b"three", Array([4])])
        client.text("t").insert(0, "héllo 😀")
        client.text("t").format(0, 2, {"bold": True})
        client.map("gone")["k"] = 1
        client.array("emptied").append(1)
    with client.doc.transaction():
        del client.map("gone")["k"]
        del client.array("emptied")[0]
    assert root_kinds(client.since()) == {
        "m": {"map"},
        "l": {"list"},
        "t": {"text"},
        "gone": {"map"},  # a deleted map entry still names its key
        "emptied": set(),  # deleted content says nothing
    }
    client.array("l").append(5)  # appended next to an existing item: names no root
    assert root_kinds(client.since()) == {}


@given(st.binary(max_size=64))
@settings(max_examples=300, deadline=None)
def test_root_kinds_raises_only_its_typed_error_on_garbage(data: bytes) -> None:
    with contextlib.suppress(UpdateDecodeError):
        root_kinds(data)


def test_root_kinds_refuses_truncated_updates() -> None:
    client = PlainClient()
    client.map("m")["k"] = "v" * 40
    update = client.since()
    assert root_kinds(update) == {"m": {"map"}}
    for cut in range(1, len(update) - 2):
        with pytest.raises(UpdateDecodeError):
            root_kinds(update[:cut])


# -- registering what a plain client creates -------------------------------------------------------


async def test_plain_client_collections_are_registered_in_the_journaled_entry(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    client = PlainClient()
    with client.doc.transaction():
        client.map("notes")["k"] = "v"
        client.array("log").extend(["a", "b"])
        client.text("doc").insert(0, "héllo")
        client.map("__private")["x"] = 1  # reserved: never registered
    async with crdtstore.open_store(url) as store:
        async with store.open_record("r", "js-agent", "tool") as rec:
            await rec.apply_update(client.since())
            assert rec.collections() == {"doc": "text", "log": "list", "notes": "map"}
            assert rec.to_dict() == {"doc": "héllo", "log": ["a", "b"], "notes": {"k": "v"}}
            meta = rec.map("notes").provenance("k")
            assert meta is not None and meta.agent == "js-agent"
            await rec.flush()
        (entry,) = await store.journal("r")
        assert entry.agent == "js-agent"
        assert sorted(entry.effect) == sorted(
            [
                ["map", "notes", "set", "k", "v"],
                ["list", "log", "ins", 0, ["a", "b"]],
                ["text", "doc", "ins", 0, "héllo"],
            ]
        )
        # the registration travels in the entry: a replay (another replica) agrees
        replayed = await store.replay("r")
        assert replayed.collections() == {"doc": "text", "log": "list", "notes": "map"}
        assert replayed.to_dict() == {"doc": "héllo", "log": ["a", "b"], "notes": {"k": "v"}}
        history = await store.history("r", "notes", "k")
        assert [(h.value, h.provenance.agent) for h in history] == [("v", "js-agent")]


def test_a_root_the_update_only_appends_to_is_read_from_the_whole_document() -> None:
    client = PlainClient()
    client.array("log").append(1)
    first = client.since()
    replica = Replica()
    ops, _ = replica.apply_external(first)  # not registered (register=False)
    assert ops == [] and replica.collections() == {}
    client.array("log").append(2)
    second = client.since()
    assert root_kinds(second) == {}  # the second update alone does not name "log"
    ops, delta = replica.apply_external(second, register=True)
    assert replica.collections() == {"log": "list"}
    assert ops == [["list", "log", "ins", 0, [1.0, 2.0]]]
    assert delta is not None
    other = Replica()  # the delta carries the registration
    other.apply_update(first)
    other.apply_update(delta)
    assert other.collections() == {"log": "list"}


def test_a_name_registered_as_another_kind_is_left_alone_and_replicas_agree() -> None:
    a, b = Replica(), Replica()
    # a crdtstore writer made "x" a list; concurrently a plain client writes map entries to it
    meta = Meta("py", "tool", 0.0, None)
    update_a = a.local([["list", "x", "ins", 0, [1]]], lambda: a.root("x", "list").append(1), meta)
    assert update_a is not None
    client = PlainClient()
    client.map("x")["k"] = 1
    b.apply_update(update_a)  # b knows "x" is a list: the plain client's update leaves it so
    ops, delta = b.apply_external(client.since(), register=True)
    assert b.collections() == {"x": "list"}
    assert all(op[0] != "map" for op in ops)
    assert delta is not None
    a.apply_update(delta)
    assert a.collections() == b.collections() == {"x": "list"}
    assert a.to_dict() == b.to_dict()
    assert bytes(a.doc.get_state()) == bytes(b.doc.get_state())


def test_concurrent_registrations_of_two_kinds_converge() -> None:
    a, b = Replica(), Replica()
    meta = Meta("py", "tool", 0.0, None)
    update_a = a.local([["list", "x", "ins", 0, [1]]], lambda: a.root("x", "list").append(1), meta)
    client = PlainClient()
    client.map("x")["k"] = 1
    _, delta_b = b.apply_external(client.since(), register=True)  # b does not know a's yet
    assert b.collections() == {"x": "map"}
    assert update_a is not None and delta_b is not None
    a.apply_update(delta_b)
    b.apply_update(update_a)
    assert a.collections() == b.collections()  # the registry's last writer wins, everywhere
    assert a.registry.get("x") in ("map", "list")


def test_an_update_with_a_registry_registers_nothing_more() -> None:
    replica = Replica()
    client = PlainClient()
    with client.doc.transaction():
        client.map(REGISTRY)["notes"] = "map"
        client.map("notes")["k"] = 1
    ops, delta = replica.apply_external(client.since(), register=True)
    assert ops == [["map", "notes", "set", "k", 1.0]]
    assert delta is not None and replica.collections() == {"notes": "map"}
    before = bytes(replica.doc.get_state())
    client.map("notes")["k"] = 2
    replica.apply_external(client.since(), register=True)
    assert replica.registry.get("notes") == "map"
    assert bytes(replica.doc.get_state()) != before


def test_roots_created_empty_are_registered_when_their_first_items_come() -> None:
    client = PlainClient()
    with client.doc.transaction():  # a Yjs client's getMap/getArray/getText: no item yet
        client.map("m")
        client.array("l")
        client.text("t")
    replica = Replica()
    ops, _ = replica.apply_external(client.since(), register=True)
    assert (ops, replica.collections()) == ([], {})
    with client.doc.transaction():
        client.map("m")["k"] = "v"
        client.array("l").append("a")
        client.text("t").insert(0, "é")
    ops, delta = replica.apply_external(client.since(), register=True)
    assert delta is not None  # the items and the registration
    assert replica.collections() == {"l": "list", "m": "map", "t": "text"}
    assert sorted(ops) == [
        ["list", "l", "ins", 0, ["a"]],
        ["map", "m", "set", "k", "v"],
        ["text", "t", "ins", 0, "é"],
    ]


# -- effects of list and text edits ------------------------------------------------------------


async def test_external_list_and_text_edits_journal_effects_and_feed_changes(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    client = PlainClient()
    async with crdtstore.open_store(url) as store:
        async with store.open_record("r", "js-agent", "tool") as rec:
            with client.doc.transaction():
                client.array("log").extend(["a", "b", "c"])
                client.text("doc").insert(0, "héllo wörld 😀!")
            await rec.apply_update(client.since())
            seen: list[Any] = []
            stream = rec.changes()

            async def consume() -> None:
                async for change in stream:
                    seen.append(change)
                    if len(seen) == 2:
                        return

            with anyio.fail_after(DEADLINE):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consume)  # returns after two changes
                    with client.doc.transaction():
                        client.array("log").insert(1, "x")
                        del client.array("log")[3]  # "c"
                        client.text_delete("doc", 6, 6)  # "wörld "
                        client.text_insert("doc", 7, " ok")  # after the emoji
                    await rec.apply_update(client.since())
            assert rec.to_dict() == {"doc": "héllo 😀 ok!", "log": ["a", "x", "b"]}
            by_collection = {c.collection: c for c in seen}
            assert by_collection["log"].kind == "list"
            assert by_collection["log"].agent == "js-agent"
            assert [list(o) for o in by_collection["log"].ops] == [
                ["list", "log", "ins", 1, ["x"]],
                ["list", "log", "del", 3, 1],
            ]
            assert [list(o) for o in by_collection["doc"].ops] == [
                ["text", "doc", "del", 6, 6],
                ["text", "doc", "ins", 7, " ok"],
            ]
            await rec.flush()
        entries = await store.journal("r")
        assert [e.agent for e in entries] == ["js-agent", "js-agent"]
        assert sorted(entries[1].effect) == sorted(
            [
                ["list", "log", "ins", 1, ["x"]],
                ["list", "log", "del", 3, 1],
                ["text", "doc", "del", 6, 6],
                ["text", "doc", "ins", 7, " ok"],
            ]
        )
        # the effects replayed on plain values give the document
        state: dict[str, Any] = {}
        for entry in entries:
            state = replay_effect(state, entry.effect)
        assert state == {"doc": "héllo 😀 ok!", "log": ["a", "x", "b"]}


_CHARS = st.sampled_from(list("ab é中😀\n"))
_TEXT_EDIT = st.tuples(
    st.booleans(), st.integers(0, 40), st.integers(1, 4), st.text(_CHARS, max_size=5)
)
_LIST_EDIT = st.tuples(st.booleans(), st.integers(0, 40), st.integers(1, 3), st.integers(0, 99))


@given(
    start_text=st.text(_CHARS, min_size=1, max_size=12),
    start_list=st.lists(st.integers(0, 99), min_size=1, max_size=6),
    batches=st.lists(
        st.tuples(st.lists(_TEXT_EDIT, max_size=4), st.lists(_LIST_EDIT, max_size=4)),
        min_size=1,
        max_size=4,
    ),
)
@settings(max_examples=150, deadline=None)
def test_effects_of_external_edits_replay_to_the_document(
    start_text: str,
    start_list: list[int],
    batches: list[tuple[list[tuple[bool, int, int, str]], list[tuple[bool, int, int, int]]]],
) -> None:
    """Whatever a plain client does to a text and a list, in one transaction or several, the
    effect the replica derives, replayed on the values before, gives the values after (text
    positions in characters, whatever the UTF-8 width of what precedes them)."""
    client = PlainClient()
    replica = Replica()
    with client.doc.transaction():
        client.text("t").insert(0, start_text)
        client.array("l").extend(start_list)
    ops, _ = replica.apply_external(client.since(), register=True)
    assert replica.collections() == {"l": "list", "t": "text"}
    state = replay_effect({}, ops)
    for text_edits, list_edits in batches:
        with client.doc.transaction():
            for insert, at, count, text in text_edits:
                current = str(client.text("t"))
                at = min(at, len(current))
                if insert:
                    client.text_insert("t", at, text)
                elif at < len(current):
                    client.text_delete("t", at, min(count, len(current) - at))
            for insert, at, count, value in list_edits:
                arr = client.array("l")
                at = min(at, len(arr))
                if insert:
                    arr.insert(at, value)
                elif at < len(arr):
                    del arr[at : at + min(count, len(arr) - at)]
        ops, _ = replica.apply_external(client.since(), register=True)
        state = replay_effect(state, ops)
        expected = {"l": list(client.array("l")), "t": str(client.text("t"))}
        assert numbers(state) == numbers(expected)
        assert numbers(replica.to_dict()) == numbers(expected)


async def test_append_only_judges_external_deletes_but_not_where_appends_land() -> None:
    """An external delete from an append_only list is refused (nothing changes); an append
    made concurrently elsewhere, which lands before this record's own items, is not."""
    schema = {"log": crdtstore.CollectionSpec(kind="list", policy="append_only")}
    # client id 0 sorts before ours: its concurrent append lands at index 0, before ours
    assert await _append_only_run(schema, "r0", 0) == 0


async def _append_only_run(schema: dict[str, Any], run: str, client_id: int) -> int:
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run=run, agent="a", schema=schema) as rec:
            client = PlainClient(client_id)
            client.map(REGISTRY)["log"] = "list"
            client.array("log").append("theirs")  # concurrent with rec's own append
            await rec.list("log").append("mine")
            await rec.apply_update(client.since())
            assert sorted(rec.list("log").to_list()) == ["mine", "theirs"]
            where = rec.list("log").to_list().index("theirs")
            client.doc.apply_update(rec.replica.doc.get_update())
            client.since()
            del client.array("log")[0]
            before = rec.list("log").to_list()
            with pytest.raises(crdtstore.PolicyViolation):
                await rec.apply_update(client.since())
            assert rec.list("log").to_list() == before
            await rec.flush()
        entries = await store.journal(run)
        assert [e.effect[0][2] for e in entries] == ["ins", "ins"]  # the delete: not journaled
    return where


async def test_binary_and_nested_values_of_a_plain_client_are_journaled_as_json(
    tmp_path: Path,
) -> None:
    """Binary content and a nested shared type (only a plain Yjs client writes them) are
    journaled: their effect is JSON (``{"$bytes": base64}``), the commit does not fail (it
    once raised TypeError in the SQLite append and the record stopped syncing), and
    ``to_dict`` is JSON, the same after a reopen from the journal."""
    import json

    url = f"sqlite:///{tmp_path / 'store.db'}"
    client = PlainClient()
    notes = client.map("notes")
    notes["bytes"] = b"\x00\x01"
    notes["nested"] = Map({"b": b"x", "n": 1})
    async with crdtstore.open_store(url, tenant="t") as store:
        async with store.open_record("r", "a") as rec:
            await rec.apply_update(client.since())
            with anyio.fail_after(DEADLINE):
                await rec.flush()
            shown = rec.to_dict()
            assert shown["notes"] == {
                "bytes": {"$bytes": "AAE="},
                "nested": {"b": {"$bytes": "eA=="}, "n": 1.0},
            }
            json.dumps(shown)
            (entry,) = await rec.history("notes", "bytes")
            assert entry.value == {"$bytes": "AAE="}
            await rec.map("notes").set("after", 1)  # the record still writes and commits
            with anyio.fail_after(DEADLINE):
                await rec.flush()
        async with store.open_record("r", "b", create=False) as again:
            assert again.to_dict()["notes"] == {**shown["notes"], "after": 1}
