"""crdtstore.tools: each tool, each error code, paging under the token budget, and the tool
list in each vendor's format checked against that format's rules."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import mcp.types
import pytest
from pydantic import BaseModel

import crdtstore
from crdtstore import CollectionSpec
from crdtstore.tools import TOOL_NAMES, Toolset

pytestmark = pytest.mark.anyio

NAME_RULE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI and Anthropic tool names


class Finding(BaseModel):
    text: str
    score: int = 0


SCHEMA = {
    "findings": CollectionSpec(kind="map", model=Finding),
    "log": CollectionSpec(kind="list", policy="append_only"),
    "owned": CollectionSpec(kind="map", policy="owner"),
    "small": CollectionSpec(kind="map", max_entries=2),
    "facts": CollectionSpec(kind="map", conflict="keep_all"),
}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[crdtstore.Store]:
    async with crdtstore.open_store(f"sqlite:///{tmp_path}/s.db") as s:
        yield s


@pytest.fixture
async def pair(store: crdtstore.Store) -> AsyncIterator[tuple[Toolset, Toolset]]:
    async with (
        store.open_record(run="r1", agent="a1", schema=SCHEMA) as r1,
        store.open_record(run="r1", agent="a2") as r2,
        Toolset(r1) as t1,
        Toolset(r2, source="tool") as t2,
    ):
        yield t1, t2


def code(result: dict[str, Any]) -> str | None:
    err = result.get("error")
    return None if err is None else str(err["code"])


async def snapshot(ts: Toolset) -> tuple[int, dict[str, Any]]:
    """The journal head and the record, with everything journaled so far taken in."""
    rec = ts.record
    await rec.flush()
    await rec.sync()
    head = (await rec.journal(after=0, limit=100_000))[-1:]
    return (head[0].seq if head else 0), rec.to_dict()


# -- the tool list --------------------------------------------------------------------------------


def test_names_are_the_contract() -> None:
    assert TOOL_NAMES == (
        "store_get", "store_put", "store_delete", "store_append", "store_text_edit",
        "store_changes", "store_claim", "store_complete", "store_release", "lease_acquire",
        "lease_release", "store_history", "store_describe",
    )  # fmt: skip


async def test_openai_format(pair: tuple[Toolset, Toolset]) -> None:
    t1, _ = pair
    tools = t1.schemas("openai")
    assert [t["function"]["name"] for t in tools] == list(TOOL_NAMES)
    for tool in tools:
        assert set(tool) == {"type", "function"} and tool["type"] == "function"
        fn = tool["function"]
        assert set(fn) == {"name", "description", "parameters"}
        assert NAME_RULE.match(fn["name"]) and fn["description"]
        params = fn["parameters"]
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert "$ref" not in json.dumps(params) and "$defs" not in params
        jsonschema.Draft202012Validator.check_schema(params)
        json.dumps(tool)


async def test_anthropic_format(pair: tuple[Toolset, Toolset]) -> None:
    t1, _ = pair
    for tool in t1.schemas("anthropic"):
        assert set(tool) == {"name", "description", "input_schema"}
        assert NAME_RULE.match(tool["name"])
        assert tool["input_schema"]["type"] == "object"
        jsonschema.Draft202012Validator.check_schema(tool["input_schema"])


async def test_mcp_format_through_the_sdk(pair: tuple[Toolset, Toolset]) -> None:
    t1, _ = pair
    for raw in t1.schemas("mcp"):
        tool = mcp.types.Tool.model_validate(raw)  # the SDK's own model of a tool
        assert tool.name == raw["name"] and tool.input_schema == raw["inputSchema"]
        assert tool.annotations is not None
        writes = raw["name"] not in ("store_get", "store_changes", "store_history",
                                     "store_describe")  # fmt: skip
        assert tool.annotations.read_only_hint is (not writes)


async def test_schemas_validate_what_the_tools_accept(pair: tuple[Toolset, Toolset]) -> None:
    """The published schema and the validation agree on a good and a bad call."""
    t1, _ = pair
    by_name = {t["name"]: t["inputSchema"] for t in t1.schemas("mcp")}
    good = {"collection": "notes", "key": "k", "value": {"a": [1, None]}, "expected_version": 0}
    jsonschema.validate(good, by_name["store_put"])
    assert code(await t1.call("store_put", good)) is None
    bad = {"collection": "notes", "key": "k", "value": 1, "expected_version": -1}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, by_name["store_put"])
    assert code(await t1.call("store_put", bad)) == "INVALID_ARGUMENTS"


async def test_unknown_format(pair: tuple[Toolset, Toolset]) -> None:
    with pytest.raises(crdtstore.InvalidValue):
        pair[0].schemas("gemini")


# -- maps --------------------------------------------------------------------------------------


async def test_put_get_delete_with_versions(pair: tuple[Toolset, Toolset]) -> None:
    t1, t2 = pair
    put = await t1.call("store_put", {"collection": "notes", "key": "k", "value": {"n": 5}})
    assert put["ok"] and put["version"] >= 1
    got = await t2.call("store_get", '{"collection": "notes", "key": "k"}')
    assert got["value"] == {"n": 5} and got["version"] == put["version"] and got["exists"]
    assert got["provenance"]["agent"] == "a1" and got["provenance"]["source"] == "model"
    missing = await t2.call("store_get", {"collection": "notes", "key": "nope"})
    assert missing["exists"] is False and missing["value"] is None and missing["version"] == 0
    gone = await t2.call(
        "store_delete", {"collection": "notes", "key": "k", "expected_version": got["version"]}
    )
    assert gone["deleted"] is True
    again = await t1.call("store_delete", {"collection": "notes", "key": "k"})
    assert again["deleted"] is False


async def test_stale_version_returns_the_current_one(pair: tuple[Toolset, Toolset]) -> None:
    t1, t2 = pair
    v = (await t1.call("store_put", {"collection": "plan", "key": "p", "value": 1}))["version"]
    newer = await t2.call(
        "store_put", {"collection": "plan", "key": "p", "value": 2, "expected_version": v}
    )
    assert newer["ok"]
    before = await snapshot(t1)
    stale = await t1.call(
        "store_put", {"collection": "plan", "key": "p", "value": 3, "expected_version": v}
    )
    assert code(stale) == "STALE_VERSION"
    assert stale["error"]["current"] == {"version": newer["version"], "value": 2}
    assert "expected version" in stale["error"]["message"]
    assert await snapshot(t1) == before  # nothing written
    retry = await t1.call(
        "store_put",
        {"collection": "plan", "key": "p", "value": 3, "expected_version": newer["version"]},
    )
    assert retry["ok"]


async def test_based_on_a_stale_collection_version(pair: tuple[Toolset, Toolset]) -> None:
    t1, t2 = pair
    await t1.call("store_put", {"collection": "plan", "key": "a", "value": 1})
    page = await t1.call("store_get", {"collection": "plan"})
    await t2.call("store_put", {"collection": "plan", "key": "b", "value": 2})
    stale = await t1.call(
        "store_put", {"collection": "plan", "key": "c", "value": 3, "based_on": page["version"]}
    )
    assert code(stale) == "STALE_VERSION"
    fresh = await t1.call("store_get", {"collection": "plan"})
    ok = await t1.call(
        "store_put", {"collection": "plan", "key": "c", "value": 3, "based_on": fresh["version"]}
    )
    assert ok["ok"]


async def test_schema_policy_budget_and_kind_errors(pair: tuple[Toolset, Toolset]) -> None:
    t1, t2 = pair
    before = await snapshot(t1)
    bad = await t1.call("store_put", {"collection": "findings", "key": "f", "value": {"x": 1}})
    assert code(bad) == "SCHEMA_INVALID"
    assert bad["error"]["errors"][0]["loc"] == ["text"]
    assert all("url" not in e for e in bad["error"]["errors"])
    good = await t1.call(
        "store_put", {"collection": "findings", "key": "f", "value": {"text": "t"}}
    )
    assert good["ok"]
    read = await t2.call("store_get", {"collection": "findings", "key": "f"})
    assert read["value"] == {"text": "t", "score": 0}

    await t1.call("store_put", {"collection": "owned", "key": "o", "value": 1})
    refused = await t2.call("store_put", {"collection": "owned", "key": "o", "value": 2})
    assert code(refused) == "POLICY_VIOLATION"

    await t1.call("store_put", {"collection": "small", "key": "a", "value": 1})
    await t1.call("store_put", {"collection": "small", "key": "b", "value": 1})
    full = await t1.call("store_put", {"collection": "small", "key": "c", "value": 1})
    assert code(full) == "BUDGET_EXCEEDED" and full["error"]["limit"] == 2

    await t1.call("store_append", {"collection": "log", "value": "x"})
    kind = await t1.call("store_put", {"collection": "log", "key": "k", "value": 1})
    assert code(kind) == "COLLECTION_KIND"
    assert code(await t1.call("store_get", {"collection": "log", "key": "k"})) == (
        "INVALID_ARGUMENTS"
    )

    for name in ("__registry", "a/b", "..", " x"):
        assert code(await t1.call("store_get", {"collection": name})) == "INVALID_NAME"
    too_big = await t1.call("store_put", {"collection": "notes", "key": "k", "value": 2**60})
    assert code(too_big) == "INVALID_VALUE"
    # every refusal above left the record as it was, but for the writes that were accepted
    assert before[0] < (await snapshot(t1))[0]


async def test_keep_all_siblings_come_back_with_their_writers(store: crdtstore.Store) -> None:
    async with (
        store.open_record(run="r2", agent="a1", schema=SCHEMA) as r1,
        store.open_record(run="r2", agent="a2") as r2,
    ):
        # two writers who have not seen each other: both values survive as siblings
        await r1.map("facts").set("k", "one")
        await r2.map("facts").set("k", "two")
        await r1.flush()
        await r2.flush()
        async with Toolset(r1) as t1:
            got = await t1.call("store_get", {"collection": "facts", "key": "k"})
            assert got["conflict"] is True
            assert sorted((s["value"], s["agent"]) for s in got["siblings"]) == [
                ("one", "a1"), ("two", "a2"),
            ]  # fmt: skip
            resolved = await t1.call("store_put", {"collection": "facts", "key": "k", "value": 3})
            assert resolved["ok"]
            assert (await t1.call("store_get", {"collection": "facts", "key": "k"}))["value"] == 3


# -- lists and texts ----------------------------------------------------------------------------


async def test_append_and_append_only(pair: tuple[Toolset, Toolset]) -> None:
    t1, t2 = pair
    for i in range(3):
        assert (await t1.call("store_append", {"collection": "log", "value": i}))["ok"]
    assert (await t2.call("store_append", {"collection": "log", "value": "b"}))["ok"]
    page = await t1.call("store_get", {"collection": "log"})
    assert [i["value"] for i in page["items"]] == [0, 1, 2, "b"] and page["total"] == 4


async def test_text_edits(pair: tuple[Toolset, Toolset]) -> None:
    t1, t2 = pair
    first = {"collection": "doc", "edits": [{"at": 0, "insert": "alpha beta gamma"}]}
    assert (await t1.call("store_text_edit", first))["ok"]
    two = [{"find": "alpha", "replace": "ALPHA"}, {"at": 0, "delete": 0, "insert": "> "}]
    assert (await t2.call("store_text_edit", {"collection": "doc", "edits": two}))["ok"]
    got = await t1.call("store_get", {"collection": "doc"})
    assert got["text"] == "> ALPHA beta gamma" and got["length"] == len(got["text"])

    before = await snapshot(t1)
    for edits, reason in (
        ([{"find": "delta", "replace": "x"}], "not_found"),
        ([{"find": "a", "replace": "x"}], "ambiguous"),
        ([{"find": "aa", "replace": "x"}], "not_found"),
        ([{"find": "beta", "replace": "B"}, {"find": "beta", "replace": "C"}], "not_found"),
        ([{"at": 50, "delete": 1}], "out_of_range"),
    ):
        refused = await t1.call("store_text_edit", {"collection": "doc", "edits": edits})
        assert code(refused) == "EDIT_REFUSED", edits
        assert refused["error"]["reason"] == reason
    assert await snapshot(t1) == before  # the first edit of a refused call was not applied

    rewrite = await t1.call("store_put", {"collection": "doc", "key": "k", "value": "new text"})
    assert code(rewrite) == "COLLECTION_KIND"  # there is no whole rewrite of a text


async def test_overlapping_find_is_ambiguous(pair: tuple[Toolset, Toolset]) -> None:
    t1, _ = pair
    await t1.call("store_text_edit", {"collection": "t", "edits": [{"at": 0, "insert": "aaa"}]})
    refused = await t1.call(
        "store_text_edit", {"collection": "t", "edits": [{"find": "aa", "replace": "b"}]}
    )
    assert code(refused) == "EDIT_REFUSED" and refused["error"]["reason"] == "ambiguous"


# -- changes, history, describe -----------------------------------------------------------------


async def test_changes_since_a_version(pair: tuple[Toolset, Toolset]) -> None:
    t1, t2 = pair
    seen = (await t1.call("store_describe", {}))["version"]
    await t2.call("store_put", {"collection": "notes", "key": "n1", "value": 1})
    await t2.call("store_append", {"collection": "log", "value": "x"})
    got = await t1.call("store_changes", {"since_version": seen})
    assert [(c["collection"], c["agent"]) for c in got["changes"]] == [
        ("notes", "a2"), ("log", "a2"),
    ]  # fmt: skip
    assert got["changes"][0]["keys"] == ["n1"] and got["changes"][1]["ops"] == [["ins", 0, 1]]
    assert got["more"] is False and got["version"] > seen
    assert (await t1.call("store_changes", {"since_version": got["version"]}))["changes"] == []


async def test_history_names_the_call_and_source(pair: tuple[Toolset, Toolset]) -> None:
    t1, t2 = pair
    await t1.call("store_put", {"collection": "notes", "key": "k", "value": 1}, call_id="call_A")
    await t2.call("store_put", {"collection": "notes", "key": "k", "value": 2}, call_id="call_B")
    await t2.call("store_put", {"collection": "notes", "key": "k", "value": 3})
    hist = await t1.call("store_history", {"collection": "notes", "key": "k"})
    assert [(e["value"], e["agent"], e["source"], e.get("call")) for e in hist["entries"]] == [
        (1, "a1", "model", "call_A"), (2, "a2", "tool", "call_B"), (3, "a2", "tool", None),
    ]  # fmt: skip
    # and the journal itself carries it, for `crdtstore history`
    entries = await t1.record.journal()
    assert [e.call for e in entries if e.effect and e.effect[0][1] == "notes"] == [
        "call_A", "call_B", "",
    ]  # fmt: skip


async def test_describe(pair: tuple[Toolset, Toolset]) -> None:
    t1, _ = pair
    await t1.call("store_put", {"collection": "findings", "key": "f", "value": {"text": "t"}})
    d = await t1.call("store_describe", {})
    f = d["collections"]["findings"]
    assert f["kind"] == "map" and f["policy"] == "open" and f["conflict"] == "lww"
    assert f["model"]["properties"]["text"]["type"] == "string"
    assert f["size"]["entries"] == 1 and f["size"]["tokens"] >= 1
    assert d["collections"]["small"]["budgets"]["max_entries"] == 2
    assert d["collections"]["log"]["policy"] == "append_only"
    assert d["agent"] == "a1" and d["read_only"] is False and d["view"] is None
    json.dumps(d)


# -- claims and leases --------------------------------------------------------------------------


async def test_claim_contest_and_completion(pair: tuple[Toolset, Toolset]) -> None:
    t1, t2 = pair
    won = await t1.call("store_claim", {"collection": "tasks", "item": "t1", "ttl": 10})
    assert won["ok"] and won["token"] >= 1
    lost = await t2.call("store_claim", {"collection": "tasks", "item": "t1", "ttl": 10})
    assert code(lost) == "LEASE_HELD"
    assert lost["error"]["holder"] == "a1" and lost["error"]["queue_position"] >= 1
    assert code(await t2.call("store_complete", {"collection": "tasks", "item": "t1"})) == (
        "LEASE_NOT_FOUND"
    )
    done = await t1.call(
        "store_complete", {"collection": "tasks", "item": "t1", "result": {"ok": True}}
    )
    assert done["state"] == "done"
    after = await t2.call("store_claim", {"collection": "tasks", "item": "t1", "ttl": 10})
    assert code(after) == "LEASE_HELD"  # done: nobody claims it again
    assert after["error"]["state"] == "done" and after["error"]["result"] == {"ok": True}
    assert "is done" in after["error"]["message"]
    claim = await t2.call("store_get", {"collection": "claims", "key": "tasks/t1"})
    assert claim["value"]["state"] == "done" and claim["value"]["result"] == {"ok": True}

    assert (await t2.call("store_claim", {"collection": "tasks", "item": "t2"}))["ok"]
    assert (await t2.call("store_release", {"collection": "tasks", "item": "t2"}))["ok"]
    assert (await t1.call("store_claim", {"collection": "tasks", "item": "t2"}))["ok"]


async def test_leases_fence_writes(pair: tuple[Toolset, Toolset]) -> None:
    t1, t2 = pair
    got = await t1.call("lease_acquire", {"resources": ["src/a.py", "./src/b.py"], "ttl": 10})
    assert got["resources"] == ["src/a.py", "src/b.py"]
    held = await t2.call("lease_acquire", {"resources": ["src/b.py"], "ttl": 10})
    assert code(held) == "LEASE_HELD" and held["error"]["holder"] == "a1"
    waited = await t2.call(
        "lease_acquire", {"resources": ["src/b.py"], "ttl": 10, "wait_seconds": 0.1}
    )
    assert code(waited) == "LEASE_HELD" and "waiting" in waited["error"]["message"]
    # a write to a key the lease covers is fenced by it
    ok = await t1.call("store_put", {"collection": "files", "key": "src/a.py", "value": 1})
    assert ok["ok"]
    # the lease is lost behind the toolset's back (as when it expires): the fenced write fails
    await t1._leases[got["lease_id"]].release()
    before = await snapshot(t1)
    fenced = await t1.call("store_put", {"collection": "files", "key": "src/a.py", "value": 2})
    assert code(fenced) == "LEASE_LOST"
    assert await snapshot(t1) == before
    released = await t1.call("lease_release", {"lease_id": got["lease_id"]})
    assert released["ok"]
    assert code(await t1.call("lease_release", {"lease_id": got["lease_id"]})) == (
        "LEASE_NOT_FOUND"
    )
    assert (await t2.call("lease_acquire", {"resources": ["src/b.py"], "ttl": 10}))["ok"]
    bad = await t2.call("lease_acquire", {"resources": ["../etc/passwd"], "ttl": 10})
    assert code(bad) == "INVALID_RESOURCE"


async def test_close_releases_what_the_toolset_holds(store: crdtstore.Store) -> None:
    async with store.open_record(run="r3", agent="a1") as rec:
        ts = Toolset(rec)
        await ts.call("lease_acquire", {"resources": ["x.txt"], "ttl": 10})
        await ts.call("store_claim", {"collection": "tasks", "item": "i"})
        assert len((await store.leases.status()).holders) == 2
        await ts.aclose()
        await ts.aclose()  # idempotent
        assert (await store.leases.status()).holders == ()
        assert code(await ts.call("store_describe", {})) == "CLOSED"


# -- dispatch, views, read-only ---------------------------------------------------------------


async def test_bad_calls_are_structured_and_write_nothing(pair: tuple[Toolset, Toolset]) -> None:
    t1, _ = pair
    before = await snapshot(t1)
    cases: list[tuple[str, Any, str]] = [
        ("store_nope", {}, "UNKNOWN_TOOL"),
        ("store_get", "{not json", "INVALID_ARGUMENTS"),
        ("store_get", "[1, 2]", "INVALID_ARGUMENTS"),
        ("store_get", {"collection": "x", "extra": 1}, "INVALID_ARGUMENTS"),
        ("store_put", {"collection": "x", "key": "k"}, "INVALID_ARGUMENTS"),
        ("store_put", {"collection": 5, "key": "k", "value": 1}, "INVALID_ARGUMENTS"),
        ("store_put", {"collection": "x", "key": "", "value": 1}, "INVALID_ARGUMENTS"),
        ("store_text_edit", {"collection": "x", "edits": []}, "INVALID_ARGUMENTS"),
        ("store_text_edit", {"collection": "x", "edits": [{"find": "a"}]}, "INVALID_ARGUMENTS"),
        ("store_claim", {"collection": "x", "item": "i", "ttl": -1}, "INVALID_ARGUMENTS"),
        ("store_get", {"collection": "x", "cursor": "garbage"}, "INVALID_ARGUMENTS"),
        ("store_get", "x" * 2_000_001, "PAYLOAD_TOO_LARGE"),
    ]
    for name, args, expected in cases:
        result = await t1.call(name, args)
        assert code(result) == expected, (name, args, result)
        assert result["error"]["message"]
        json.dumps(result)
    bad = await t1.call("store_put", {"collection": "x", "key": "k"})
    assert bad["error"]["errors"][0]["loc"] == ["value"]
    assert await snapshot(t1) == before


async def test_view_restricts_every_tool(store: crdtstore.Store) -> None:
    async with store.open_record(run="r4", agent="a1") as rec:
        await rec.map("findings").set("net/1", 1)
        await rec.map("findings").set("disk/1", 2)
        await rec.map("other").set("k", 3)
        await rec.list("log").append("x")
        async with Toolset(rec, view=["findings/net/*", "log"]) as ts:
            page = await ts.call("store_get", {"collection": "findings"})
            assert [e["key"] for e in page["entries"]] == ["net/1"] and page["total"] == 1
            for args in (
                {"collection": "findings", "key": "disk/1"},
                {"collection": "other"},
            ):
                assert code(await ts.call("store_get", args)) == "POLICY_VIOLATION"
            put = {"collection": "findings", "key": "disk/2", "value": 1}
            assert code(await ts.call("store_put", put)) == "POLICY_VIOLATION"
            assert (await ts.call("store_put", {**put, "key": "net/2"}))["ok"]
            assert (await ts.call("store_append", {"collection": "log", "value": 1}))["ok"]
            d = await ts.call("store_describe", {})
            assert sorted(d["collections"]) == ["findings", "log"]
            assert d["view"] == ["findings/net/*", "log"]
            await rec.map("other").set("k2", 4)
            await rec.map("findings").set("disk/3", 4)
            changes = await ts.call("store_changes", {"since_version": 0})
            assert {c["collection"] for c in changes["changes"]} == {"findings", "log"}
            assert all(k.startswith("net/") for c in changes["changes"] for k in c.get("keys", []))


async def test_read_only_refuses_writes_and_leases(store: crdtstore.Store) -> None:
    async with store.open_record(run="r5", agent="a1") as rec:
        await rec.map("m").set("k", 1)
        async with Toolset(rec, read_only=True) as ts:
            assert (await ts.call("store_get", {"collection": "m", "key": "k"}))["value"] == 1
            before = await snapshot(ts)
            for name, args in (
                ("store_put", {"collection": "m", "key": "k", "value": 2}),
                ("store_append", {"collection": "l", "value": 2}),
                ("store_claim", {"collection": "t", "item": "i"}),
                ("lease_acquire", {"resources": ["a"]}),
            ):
                assert code(await ts.call(name, args)) == "READ_ONLY"
            assert await snapshot(ts) == before
            assert (await store.leases.status()).holders == ()


# -- paging under the token budget ------------------------------------------------------------


async def test_pages_stay_under_the_budget_and_cover_everything(store: crdtstore.Store) -> None:
    async with store.open_record(run="r6", agent="a1") as rec:
        await rec.map("big").update({f"k{i:03}": "v" * 120 for i in range(300)})
        await rec.list("items").extend([{"i": i, "pad": "p" * 80} for i in range(200)])
        text = "".join(f"line {i}: {'x' * 50}\n" for i in range(500))
        await rec.text("notes").edit(text)
        ts = Toolset(rec, max_result_tokens=1000)

        async def pages(args: dict[str, Any]) -> list[dict[str, Any]]:
            out, cursor = [], None
            while True:
                page = await ts.call("store_get", {**args, "cursor": cursor})
                assert "error" not in page, page
                assert len(json.dumps(page)) / 4 <= 1000 * 1.1
                out.append(page)
                cursor = page["next_cursor"]
                if cursor is None:
                    return out

        maps = await pages({"collection": "big"})
        keys = [e["key"] for p in maps for e in p["entries"]]
        assert keys == sorted(f"k{i:03}" for i in range(300)) and len(maps) > 3
        lists = await pages({"collection": "items"})
        assert [i["value"]["i"] for p in lists for i in p["items"]] == list(range(200))
        texts = await pages({"collection": "notes"})
        assert "".join(p["text"] for p in texts) == text and len(texts) > 3

        await rec.map("big").set("huge", {"blob": "y" * 20_000})
        chunks = await pages({"collection": "big", "key": "huge"})
        assert json.loads("".join(p["value_json"] for p in chunks)) == {"blob": "y" * 20_000}
        assert chunks[0]["value"] is None and chunks[0]["value_json_total"] > 20_000
        listing = await pages({"collection": "big"})
        huge = [e for p in listing for e in p["entries"] if e["key"] == "huge"]
        assert huge and "value_omitted" in huge[0]  # named, never dropped silently

        # a cursor remembers the version it was made at
        await rec.map("big").set("k000", "changed")
        later = await ts.call("store_get", {"collection": "big", "cursor": maps[0]["next_cursor"]})
        assert later["changed_since_cursor"] is True


async def test_changes_are_paged_at_entry_boundaries(store: crdtstore.Store) -> None:
    async with store.open_record(run="r7", agent="a1") as rec:
        for i in range(200):
            await rec.map("m").set(f"key-{i}", i)
        await rec.flush()
        ts = Toolset(rec, max_result_tokens=500)
        since, seen = 0, []
        while True:
            got = await ts.call("store_changes", {"since_version": since})
            assert len(json.dumps(got)) / 4 <= 550
            seen.extend(k for c in got["changes"] for k in c["keys"])
            if not got["more"]:
                break
            since = got["next_since"]
        assert seen == [f"key-{i}" for i in range(200)]


async def test_constructor_checks(store: crdtstore.Store) -> None:
    async with store.open_record(run="r8", agent="a1") as rec:
        for kwargs in ({"source": "robot"}, {"max_result_tokens": 5}, {"page_size": 0}):
            with pytest.raises(crdtstore.InvalidValue):
                Toolset(rec, **kwargs)  # type: ignore[arg-type]
        with pytest.raises(crdtstore.InvalidValue):
            Toolset(rec, view="findings")


async def test_a_lent_lease_fences_the_tools_and_stays_the_lenders(store: crdtstore.Store) -> None:
    async with store.open_record(run="r9", agent="kernel") as rec:
        lease = await store.lease(["src/owned.py"], ttl=10, owner="kernel").acquire()
        ts = Toolset(rec)
        ts.fence_with(lease)
        put = {"collection": "files", "key": "src/owned.py", "value": 1}
        assert (await ts.call("store_put", put))["ok"]
        await ts.aclose()
        assert lease.granted  # closing the toolset does not release what it was lent
        await lease.release()
        ts2 = Toolset(rec)
        ts2.fence_with(lease)
        assert code(await ts2.call("store_put", {**put, "value": 2})) == "LEASE_LOST"
        assert rec.map("files").get("src/owned.py") == 1


async def test_a_lease_the_agent_holds_is_refused_at_once(pair: tuple[Toolset, Toolset]) -> None:
    t1, _ = pair
    got = await t1.call("lease_acquire", {"resources": ["a.txt", "b.txt"], "ttl": 10})
    again = await t1.call(
        "lease_acquire", {"resources": ["./b.txt"], "ttl": 10, "wait_seconds": 30}
    )  # would wait for itself for 30 s
    assert code(again) == "LEASE_HELD" and again["error"]["lease_id"] == got["lease_id"]
