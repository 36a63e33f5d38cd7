"""Properties of the agent tools (issue 13), through ``Toolset.call`` only.

- Random tool calls of two or three agents, one after another and in concurrent bursts, with
  random sync points, converge (I1), lose no acknowledged write (I2: every ok append is in the
  list, every ok put is the value or in ``store_history``), follow the rules a model relies on
  (a guarded put succeeds only on the version it echoes, an edit is refused unless its finds
  are unique, one claimer at a time, a done item stays done) and a refused call changes
  nothing (I9, I10).
- Any arguments for any tool name get a dict result or a structured error with a known code,
  never an exception, and a refused call changes nothing (I10).
- Results are JSON as they are and fit ``max_result_tokens``; paging with ``next_cursor`` (and
  ``next_since``) returns every entry exactly once.
"""

from __future__ import annotations

import base64
import itertools
import json
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import crdtstore
from crdtstore import CollectionSpec
from crdtstore.tools import TOOL_NAMES, Toolset
from crdtstore.tools._args import TOOLS
from tests.strategies import json_values

pytestmark = pytest.mark.anyio

# anyio_backend and tmp_path are safe to share between examples (every example opens its own
# store, or its own run on the shared file)
ASYNC_SETTINGS = settings(
    suppress_health_check=[
        *settings.default.suppress_health_check,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)


def fewer(divisor: int, floor: int = 8) -> settings:
    """A share of the profile's examples: each one opens records, which is costly."""
    return settings(
        ASYNC_SETTINGS, max_examples=max(floor, settings.default.max_examples // divisor)
    )


RUNS = itertools.count()  # a fresh run name per example on a shared store file

# Every code a tool may return. Anything else (BACKEND, JOURNAL_CORRUPT, CRDTSTORE_ERROR, a
# Python exception) is a bug in the tools or below them.
KNOWN_CODES = frozenset(
    {
        "STALE_VERSION",
        "SCHEMA_INVALID",
        "POLICY_VIOLATION",
        "BUDGET_EXCEEDED",
        "LEASE_HELD",
        "LEASE_LOST",
        "LEASE_NOT_FOUND",
        "READ_ONLY",
        "INVALID_NAME",
        "INVALID_VALUE",
        "INVALID_RESOURCE",
        "UNKNOWN_TOOL",
        "INVALID_ARGUMENTS",
        "EDIT_REFUSED",
        "COLLECTION_KIND",
        "PAYLOAD_TOO_LARGE",
    }
)
WRITES = frozenset(name for name, spec in TOOLS.items() if spec.writes)
# what the estimate may pass max_result_tokens by (ceil per part, the envelope's few fields)
TOKEN_SLACK = 16
CALL_DEADLINE = 20.0  # no call may hang (lease waits here are at most a few ms)


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def estimate_tokens(result: Any) -> float:
    """The budget's estimate: compact JSON bytes / 4."""
    return len(compact(result).encode()) / 4


def check_result(result: Any) -> dict[str, Any]:
    """A result is a dict ``json.dumps`` takes as it is; an error has a known code."""
    assert isinstance(result, dict), result
    json.dumps(result, allow_nan=False)
    if "error" in result:
        err = result["error"]
        assert isinstance(err, dict), result
        assert err.get("code") in KNOWN_CODES, result
        assert isinstance(err.get("message"), str), result
    return result


async def call(tools: Toolset, name: Any, arguments: Any = None) -> dict[str, Any]:
    with anyio.fail_after(CALL_DEADLINE):
        return check_result(await tools.call(name, arguments))


def code(result: dict[str, Any]) -> str | None:
    err = result.get("error")
    return err["code"] if isinstance(err, dict) else None


async def head(store: crdtstore.Store, run: str) -> int:
    return (await store.run_info(run)).head


# -- 1. random tool calls of several agents --------------------------------------------------------

KEYS = ("a", "b", "c")
ITEMS = ("i1", "i2", "i3")
EDIT_ALPHABET = "ab \n"  # finds in it are often ambiguous
INSERT_ALPHABET = "abcdefgh \né🙂"  # inserted text: longer finds taken from it are unique
SEQ_SCHEMA = {
    "m": CollectionSpec(kind="map"),
    "l": CollectionSpec(kind="list"),
    "t": CollectionSpec(kind="text"),
}
# the refusals a well-formed call of this test may meet
SEQ_CODES = frozenset(
    {"STALE_VERSION", "EDIT_REFUSED", "LEASE_HELD", "LEASE_NOT_FOUND", "COLLECTION_KIND"}
)
SEQ_KINDS = (
    "put", "guarded_put", "based_put", "delete", "guarded_delete", "append", "edit", "get",
    "get_page", "claim", "complete", "release", "changes", "history", "describe", "wrong_kind",
)  # fmt: skip
BURST_KINDS = ("put", "guarded_put", "append", "edit", "get", "get_page", "claim")
READS = frozenset({"get", "get_page", "changes", "history", "describe"})


@dataclass
class Call:
    agent: int
    kind: str
    name: str
    args: dict[str, Any]


@dataclass
class Agents:
    """The agents of one example and what the tools acknowledged to them."""

    store: crdtstore.Store
    run: str
    recs: list[crdtstore.Record]
    tools: list[Toolset]
    reads: list[dict[str, int]] = field(default_factory=list)  # key -> version store_get gave
    coll_seen: list[set[int]] = field(default_factory=list)  # versions of "m" each was told
    puts: list[tuple[str, Any]] = field(default_factory=list)  # acknowledged puts to "m"
    appends: Counter[str] = field(default_factory=Counter)  # tags of acknowledged appends
    held: dict[str, int | None] = field(default_factory=dict)  # item -> its claimer
    done: dict[str, tuple[int, Any]] = field(default_factory=dict)  # item -> claimer, result
    tags: Any = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.reads = [{} for _ in self.recs]
        self.coll_seen = [{0} for _ in self.recs]
        self.held = dict.fromkeys(ITEMS)


def draw_edits(data: st.DataObject, text: str) -> list[dict[str, Any]]:
    """1-3 edits: finds taken from ``text`` (the agent's possibly stale copy: some are
    ambiguous or gone by the time the call runs) or made up, splices in or out of range.

    What is drawn never depends on ``text`` (positions are resolved against it afterwards):
    the state an example meets varies from run to run with the interleaving of the agents,
    and hypothesis must be able to replay its draws."""
    chunk = st.text(INSERT_ALPHABET, max_size=8)
    edits: list[dict[str, Any]] = []
    for _ in range(data.draw(st.sampled_from([1, 1, 1, 2, 3]), label="edits")):
        if data.draw(st.booleans(), label="find"):
            from_text = data.draw(st.booleans(), label="from text")
            start = data.draw(st.integers(0, 10_000), label="start")
            size = data.draw(st.integers(1, 10), label="size")
            made_up = data.draw(st.text(EDIT_ALPHABET, min_size=1, max_size=4), label="find")
            if from_text and text:
                at = start % len(text)
                find = text[at : at + size]
            else:
                find = made_up
            edits.append({"find": find, "replace": data.draw(chunk, label="replace")})
        else:
            at = data.draw(st.integers(0, 10_000), label="at")
            delete = data.draw(st.integers(0, 3), label="delete")
            if data.draw(st.booleans(), label="past the end"):
                at %= len(text) + 3  # sometimes out of range: refused
            else:
                at %= len(text) + 1
                delete %= len(text) - at + 1
            edits.append({"at": at, "delete": delete, "insert": data.draw(chunk, label="insert")})
    return edits


def pick(data: st.DataObject, known: set[int], label: str) -> int:
    """Mostly a version the agent was told (fresh or stale by now), sometimes a made-up one;
    drawn without looking at ``known`` (see :func:`draw_edits`)."""
    told = data.draw(st.booleans(), label=f"{label}: told")
    n = data.draw(st.integers(0, 12), label=label)
    return sorted(known)[n % len(known)] if told and known else n


def planned_text(text: str, edits: list[dict[str, Any]]) -> str | None:
    """The text after ``edits``, or None when the call must be refused (EDIT_REFUSED)."""
    for edit in edits:
        if "find" in edit:
            find = edit["find"]
            first = text.find(find)
            if first < 0 or text.find(find, first + 1) >= 0:  # overlapping ones count too
                return None
            text = text[:first] + edit["replace"] + text[first + len(find) :]
        else:
            at, delete = edit["at"], edit["delete"]
            if at + delete > len(text):
                return None
            text = text[:at] + edit["insert"] + text[at + delete :]
    return text


def draw_call(data: st.DataObject, w: Agents, i: int, kinds: tuple[str, ...]) -> Call:
    kind = data.draw(st.sampled_from(kinds), label="kind")
    key = data.draw(st.sampled_from(KEYS), label="key")
    item = data.draw(st.sampled_from(ITEMS), label="item")
    known = {w.reads[i][key]} if key in w.reads[i] else set()
    if kind in ("put", "guarded_put", "based_put"):
        args: dict[str, Any] = {
            "collection": "m", "key": key, "value": data.draw(json_values(4), label="value"),
        }  # fmt: skip
        if kind == "guarded_put":
            args["expected_version"] = pick(data, known, "expected")
        elif kind == "based_put":
            args["based_on"] = pick(data, w.coll_seen[i], "based on")
        return Call(i, kind, "store_put", args)
    if kind in ("delete", "guarded_delete"):
        args = {"collection": "m", "key": key}
        if kind == "guarded_delete":
            args["expected_version"] = pick(data, known, "expected")
        return Call(i, kind, "store_delete", args)
    if kind == "append":
        tag = f"agent{i}-{next(w.tags)}"  # unique, so each acknowledged append is countable
        value = [tag, data.draw(json_values(3), label="value")]
        return Call(i, kind, "store_append", {"collection": "l", "value": value})
    if kind == "edit":
        edits = draw_edits(data, w.recs[i].text("t").read())
        return Call(i, kind, "store_text_edit", {"collection": "t", "edits": edits})
    if kind == "get":
        return Call(i, kind, "store_get", {"collection": "m", "key": key})
    if kind == "get_page":
        coll = data.draw(st.sampled_from(["m", "l", "t", "claims"]), label="collection")
        return Call(i, kind, "store_get", {"collection": coll})
    if kind == "claim":
        return Call(i, kind, "store_claim", {"collection": "work", "item": item, "ttl": 60})
    if kind in ("complete", "release"):
        # mostly an item the agent holds (else LEASE_NOT_FOUND nearly always)
        mine = [it for it in ITEMS if w.held[it] == i]
        if data.draw(st.booleans(), label="mine") and mine:
            item = mine[data.draw(st.integers(0, 2), label="which") % len(mine)]
        else:
            data.draw(st.integers(0, 2), label="which")  # the same draws either way
    if kind == "complete":
        result = data.draw(json_values(2), label="result")
        return Call(
            i, kind, "store_complete", {"collection": "work", "item": item, "result": result}
        )
    if kind == "release":
        return Call(i, kind, "store_release", {"collection": "work", "item": item})
    if kind == "changes":
        since = pick(data, w.coll_seen[i], "since")
        return Call(i, kind, "store_changes", {"since_version": since})
    if kind == "history":
        return Call(i, kind, "store_history", {"collection": "m", "key": key})
    if kind == "describe":
        return Call(i, kind, "store_describe", {})
    name, args = data.draw(
        st.sampled_from(
            [
                ("store_append", {"collection": "m", "value": 1}),
                ("store_put", {"collection": "l", "key": "a", "value": 1}),
                ("store_text_edit", {"collection": "l", "edits": [{"at": 0, "insert": "x"}]}),
                ("store_put", {"collection": "t", "key": "a", "value": 1}),
            ]
        ),
        label="wrong kind",
    )
    return Call(i, kind, name, args)


def expected_outcome(w: Agents, c: Call) -> str | None:
    """For a call made on a synced record with nobody writing meanwhile: "ok" or the error
    code it must get (None: no prediction)."""
    rec = w.recs[c.agent]
    if c.kind == "guarded_put" or c.kind == "guarded_delete":
        _, version = rec.map("m").get_versioned(c.args["key"])
        return "ok" if c.args["expected_version"] == (version or 0) else "STALE_VERSION"
    if c.kind == "based_put":
        return "ok" if c.args["based_on"] == rec.current_version("m").seq else "STALE_VERSION"
    if c.kind == "edit":
        planned = planned_text(rec.text("t").read(), c.args["edits"])
        return "EDIT_REFUSED" if planned is None else "ok"
    if c.kind in ("claim", "complete", "release"):
        return claim_outcome(w, c)
    if c.kind == "wrong_kind":
        return "COLLECTION_KIND"
    return "ok"


def claim_outcome(w: Agents, c: Call) -> str:
    item = c.args["item"]
    holder = w.held[item]
    if c.kind == "claim":
        if item in w.done or holder not in (None, c.agent):
            return "LEASE_HELD"
        return "ok"
    return "ok" if holder == c.agent else "LEASE_NOT_FOUND"


def note(w: Agents, c: Call, result: dict[str, Any]) -> None:
    """Keep what the result acknowledged (and the versions it told the agent)."""
    err = code(result)
    assert err is None or err in SEQ_CODES, (c, result)
    if c.kind in READS:
        assert err is None, ("a read was refused", c, result)
    if "collection_version" in result and result.get("collection") == "m":
        w.coll_seen[c.agent].add(result["collection_version"])
    if err is not None:
        if err == "STALE_VERSION":
            current = result["error"].get("current")
            if current is not None and c.kind != "based_put":
                # what a model does with it: the next guarded write may echo it
                w.reads[c.agent][c.args["key"]] = current["version"]
        return
    if c.kind == "get":
        w.reads[c.agent][c.args["key"]] = result["version"]
    elif c.kind == "get_page" and c.args["collection"] == "m":
        w.coll_seen[c.agent].add(result["version"])
    elif c.name == "store_put":
        assert result["ok"] is True
        w.puts.append((c.args["key"], c.args["value"]))
        w.reads[c.agent][c.args["key"]] = result["version"]
    elif c.kind == "append":
        w.appends[c.args["value"][0]] += 1
    elif c.kind == "changes":
        w.coll_seen[c.agent].add(result["version"])


async def run_sequential(w: Agents, c: Call, pin: bool) -> None:
    """One call with nobody else writing. ``pin``: the record is synced first, so the
    outcome is predicted and a refusal must leave its state exactly as it was."""
    rec, tools = w.recs[c.agent], w.tools[c.agent]
    if pin:
        await rec.sync()
    expect = expected_outcome(w, c) if pin else None
    if c.kind in ("claim", "complete", "release"):
        expect = claim_outcome(w, c)  # the lease service decides, not the replica's state
    before_head = await head(w.store, w.run)
    before = rec.to_dict()
    before_text = rec.text("t").read()
    result = await call(tools, c.name, c.args)
    note(w, c, result)
    err = code(result)
    if expect is not None:
        assert (err or "ok") == expect, (c, result, before)
    if err is not None:
        assert await head(w.store, w.run) == before_head, ("a refused call wrote", c, result)
        if pin:
            assert rec.to_dict() == before, ("a refused call changed the record", c, result)
    elif pin and c.kind == "edit":
        assert rec.text("t").read() == planned_text(before_text, c.args["edits"]), c
    if c.kind in ("claim", "complete", "release") and err is None:
        item = c.args["item"]
        if c.kind == "claim":
            w.held[item] = c.agent
        else:
            w.held[item] = None
            if c.kind == "complete":
                w.done[item] = (c.agent, c.args["result"])
    event(f"{c.kind}: {err or 'ok'}")


async def run_burst(w: Agents, calls: list[Call]) -> None:
    """Calls at the same time (of several agents, or several of one agent)."""
    results: list[dict[str, Any]] = [{} for _ in calls]

    async def one(n: int) -> None:
        c = calls[n]
        results[n] = await call(w.tools[c.agent], c.name, c.args)

    async with anyio.create_task_group() as tg:
        for n in range(len(calls)):
            tg.start_soon(one, n)
    guarded: Counter[tuple[str, int]] = Counter()
    claimed: dict[str, set[int]] = {}
    for c, result in zip(calls, results, strict=True):
        note(w, c, result)
        err = code(result)
        event(f"burst {c.kind}: {err or 'ok'}")
        if c.kind == "guarded_put" and err is None:
            guarded[(c.args["key"], c.args["expected_version"])] += 1
        if c.kind == "claim":
            item = c.args["item"]
            assert (err or "ok") in ("ok", "LEASE_HELD"), (c, result)
            if err is None:
                claimed.setdefault(item, set()).add(c.agent)
            elif w.held[item] is None and item not in w.done:
                # refused a free item: only because another agent of the burst got it
                assert any(
                    o.kind == "claim" and o.args["item"] == item and code(r) is None
                    for o, r in zip(calls, results, strict=True)
                ), ("a free item was refused to everyone", c, result)
    for (key, version), n in guarded.items():
        assert n == 1, f"{n} guarded puts of {key!r} on version {version} all succeeded (I9)"
    for item, agents in claimed.items():
        assert len(agents) == 1, f"{item} claimed by {sorted(agents)} at once"
        (agent,) = agents
        assert item not in w.done, f"done item {item} claimed again by agent{agent}"
        assert w.held[item] in (None, agent), f"{item} of agent{w.held[item]} given to {agent}"
        w.held[item] = agent


async def history_values(tools: Toolset, key: str) -> list[Any]:
    """Every value ``m[key]`` held, paged through with ``next_cursor``."""
    values: list[Any] = []
    cursor: str | None = None
    for _ in range(1000):
        args: dict[str, Any] = {"collection": "m", "key": key}
        if cursor is not None:
            args["cursor"] = cursor
        page = await call(tools, "store_history", args)
        assert code(page) is None, page
        values += [e["value"] for e in page["entries"] if "value" in e]
        cursor = page["next_cursor"]
        if cursor is None:
            return values
    raise AssertionError("store_history never ended")


async def check_converged(w: Agents) -> None:
    for rec in w.recs:
        await rec.flush()
    for rec in w.recs:
        await rec.sync()
    final = w.recs[0].to_dict()
    for n, rec in enumerate(w.recs):
        assert rec.to_dict() == final, f"agent{n} diverged (I1)"
    assert (await w.store.replay(w.run)).to_dict() == final, "the journal replays otherwise (I3)"
    # I2: every acknowledged append is there, once; no other append is
    tags = Counter(v[0] for v in final.get("l", []))
    assert tags == w.appends, "an acknowledged append was lost or duplicated"
    # I2 under lww: each acknowledged put is the value, or in the history of its key
    current = final.get("m", {})
    histories: dict[str, list[Any]] = {}
    for key, value in w.puts:
        if key in current and current[key] == value:
            continue
        if key not in histories:
            histories[key] = await history_values(w.tools[0], key)
        assert value in histories[key], f"acknowledged put {key}={value!r} is nowhere"
    claims = final.get("claims", {})
    for item, (agent, result) in w.done.items():
        entry = claims[f"work/{item}"]
        assert entry["state"] == "done", entry
        assert entry["claimer"] == f"agent{agent}", entry
        assert entry.get("result") == result, entry


@fewer(3)
@given(
    n=st.integers(2, 3),
    backend=st.sampled_from(["memory", "sqlite"]),
    declare=st.booleans(),
    data=st.data(),
)
async def test_random_tool_calls_converge_and_lose_no_acknowledged_write(
    anyio_backend: str,
    tmp_path: Path,
    n: int,
    backend: str,
    declare: bool,
    data: st.DataObject,
) -> None:
    """``declare``: the collections' kinds are declared up front; otherwise the first write
    makes each one, and the other agents learn of it by syncing (no call of the wrong kind
    then: it would make the collection of that kind)."""
    url = "memory://" if backend == "memory" else f"sqlite:///{tmp_path}/store.db"
    run = f"seq{next(RUNS)}"
    schema = SEQ_SCHEMA if declare else None
    kinds = SEQ_KINDS if declare else tuple(k for k in SEQ_KINDS if k != "wrong_kind")
    async with crdtstore.open_store(url) as store, AsyncExitStack() as stack:
        recs = [
            await stack.enter_async_context(
                store.open_record(run=run, agent=f"agent{i}", schema=schema)
            )
            for i in range(n)
        ]
        tools = [await stack.enter_async_context(Toolset(rec)) for rec in recs]
        w = Agents(store, run, recs, tools)
        base = data.draw(st.text(INSERT_ALPHABET, max_size=30), label="base text")
        if base:  # something to find in, from the start
            edit = {"collection": "t", "edits": [{"at": 0, "insert": base}]}
            assert (await call(tools[0], "store_text_edit", edit))["ok"]
        for _ in range(data.draw(st.integers(1, 24), label="steps")):
            step = data.draw(st.sampled_from(["call", "call", "call", "burst", "sync"]))
            if step == "call":
                i = data.draw(st.integers(0, n - 1), label="agent")
                c = draw_call(data, w, i, kinds)
                await run_sequential(w, c, pin=data.draw(st.booleans(), label="pin"))
            elif step == "burst":
                # an agent may be there twice: a model's parallel tool calls
                who = data.draw(
                    st.lists(st.integers(0, n - 1), min_size=2, max_size=n + 1), label="burst"
                )
                await run_burst(w, [draw_call(data, w, i, BURST_KINDS) for i in who])
            else:
                await recs[data.draw(st.integers(0, n - 1), label="sync")].sync()
        await check_converged(w)


# -- 2. any arguments, any tool name -----------------------------------------------------------


class Finding(BaseModel):
    title: str
    score: int


ANY_SCHEMA = {
    "m": CollectionSpec(kind="map"),
    "l": CollectionSpec(kind="list"),
    "t": CollectionSpec(kind="text"),
    "g": CollectionSpec(kind="map", policy="guarded"),
    "small": CollectionSpec(kind="map", max_entries=2, max_value_bytes=64),
    "log": CollectionSpec(kind="list", policy="append_only"),
    "typed": CollectionSpec(kind="map", model=Finding),
    "mine": CollectionSpec(kind="map", policy="owner"),
}
COLLECTIONS = [*ANY_SCHEMA, "claims", "work", "new"]
BAD_COLLECTIONS = ["", "a/b", "x" * 129, "../x", " ", "é", "__crdtstore_collections"]
KEY_POOL = ["a", "b", "x", "held", "done", "o", "f", "src/a.py", "🙂"]
BAD_KEYS = ["", "x" * 1025, "\x00", " "]


def any_json() -> st.SearchStrategy[Any]:
    return json_values(6)


def cursors() -> st.SearchStrategy[Any]:
    def make(kind: str, position: Any, version: int) -> str:
        raw = json.dumps([kind, position, version]).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    kinds = st.sampled_from(["map", "list", "text", "value", "history", "nope"])
    positions = st.one_of(st.integers(-5, 50), st.sampled_from(["a", "", "zz"]), any_json())
    return st.one_of(
        st.builds(make, kinds, positions, st.integers(0, 10)),
        st.text(max_size=12),
        any_json(),
    )


def edit_lists() -> st.SearchStrategy[Any]:
    finds = st.sampled_from(["hello", "world", "o", "", "zzz", "hello world hello"])
    edit = st.one_of(
        st.fixed_dictionaries(
            {"find": finds | st.text(max_size=4), "replace": st.text(max_size=4)}
        ),
        st.fixed_dictionaries(
            {"at": st.integers(-2, 30)},
            optional={"delete": st.integers(-1, 30), "insert": st.text(max_size=4)},
        ),
        st.dictionaries(
            st.sampled_from(["find", "replace", "at", "delete", "insert", "x"]), any_json()
        ),
    )
    return st.lists(edit, max_size=4) | any_json()


def right_values(name: str) -> st.SearchStrategy[Any]:
    """Values of the right type for argument ``name``, often valid, sometimes out of range."""
    if name == "collection":
        return st.sampled_from(COLLECTIONS) | st.sampled_from(COLLECTIONS + BAD_COLLECTIONS)
    if name in ("key", "item"):
        return st.one_of(
            st.sampled_from(KEY_POOL), st.sampled_from(KEY_POOL + BAD_KEYS), st.text(max_size=6)
        )
    if name in ("value", "result"):
        return st.one_of(
            any_json(),
            st.fixed_dictionaries({"title": st.text(max_size=5), "score": st.integers(-3, 3)}),
            st.sampled_from([float("nan"), float("inf"), 2**64, "\ud800", {"\ud800": 1}]),
            st.text(min_size=70, max_size=90),
        )
    if name in ("expected_version", "based_on", "since_version"):
        return weighted((4, st.integers(0, 20)), (1, st.sampled_from([-1, True, 1.0, "1", 2**70])))
    if name == "cursor":
        return cursors()
    if name == "edits":
        return edit_lists()
    if name == "ttl":
        return weighted(
            (4, st.sampled_from([0.5, 5, 60])),
            (1, st.sampled_from([0, -1, 86_401, "60", float("nan"), None])),
        )
    if name == "wait_seconds":
        # never a long wait: a call in line for a lease taken by an earlier call would only
        # time the test out (a toolset waits even on its own lease)
        return st.sampled_from([0, 0.01, -1, 601, "1", None, True])
    if name == "resources":
        paths = st.sampled_from(["src/a.py", "src/b.py", "../etc/passwd", "/abs", "", "a\\b"])
        return st.lists(paths | st.text(max_size=6), max_size=4)
    if name == "lease_id":
        return st.text(max_size=20)
    return any_json()


def argument_dicts(tool: str) -> st.SearchStrategy[Any]:
    """Dicts with the tool's required arguments of the right type (so that many calls run),
    or any subset of its arguments with any JSON values, and an unknown argument."""
    if tool not in TOOLS:
        return st.dictionaries(st.sampled_from(["collection", "key", "value", "x"]), any_json())
    fields = TOOLS[tool].args.model_fields
    required = [f for f, info in fields.items() if info.is_required()]
    optional = [f for f in fields if f not in required]
    complete = st.fixed_dictionaries(
        {f: right_values(f) for f in required}, optional={f: right_values(f) for f in optional}
    )
    anything = st.fixed_dictionaries(
        {},
        optional={f: right_values(f) | any_json() for f in [*fields, "extra_argument"]},
    )
    return weighted((3, complete), (1, anything))


EDGE_STRINGS = [
    '{"collection":"m","key":"a","value":NaN}',
    '{"collection":"m","key":"a","value":1e400}',
    '{"collection":"m","key":"a","value":-Infinity}',
    '{"collection":"m","key":"a","value":1',
    '{"collection":"m","key":"a","value":"\\ud800"}',
    '{"collection":"m","collection":"l","key":"a","value":1}',
    "[]",
    "null",
    "",
    " ",
    "\x00",
    '"store_get"',
]


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """``one_of`` with weights (``one_of`` gives each distinct branch the same chance)."""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.sampled_from(table).flatmap(lambda strategy: strategy)


def arguments_for(tool: str) -> st.SearchStrategy[Any]:
    dicts = argument_dicts(tool)
    return weighted(
        (8, dicts),
        (1, dicts.map(lambda d: json.dumps(d, ensure_ascii=False))),
        (1, dicts.map(lambda d: json.dumps(d).encode())),
        (1, any_json()),
        (1, any_json().map(json.dumps)),
        (1, st.text(max_size=30)),
        (1, st.binary(max_size=20)),
        (1, st.sampled_from(EDGE_STRINGS)),
        (1, st.none()),
    )


TOOL_NAME_STRATEGY = weighted(
    (12, st.sampled_from(TOOL_NAMES)),
    (1, st.sampled_from(["", "STORE_GET", "store_get ", "_store_get", "aclose", "call"])),
    (1, st.text(max_size=12)),
    (1, st.sampled_from([None, 1])),
)


@st.composite
def tool_calls(draw: st.DrawFn) -> tuple[Any, Any]:
    name = draw(TOOL_NAME_STRATEGY)
    return name, draw(arguments_for(name if isinstance(name, str) else ""))


async def populate(other: crdtstore.Record) -> None:
    """What the calls meet: entries in every collection, a full budget, an owner's entry, a
    claim held by someone else and a done one."""
    await other.map("m").update({"a": 1, "b": "x"})
    await other.list("l").extend([1, 2])
    await other.text("t").edit("hello world hello")
    await other.map("g").set("a", 1, expected_version=0)
    await other.map("small").update({"x": 1, "y": 2})
    await other.list("log").append("e")
    await other.map("typed").set("f", {"title": "t", "score": 1})
    await other.map("mine").set("o", 1)
    await other.claim("work", "held", ttl=60)
    done = await other.claim("work", "done", ttl=60)
    await done.complete("it is done")
    await other.flush()


@fewer(2)
@given(
    calls=st.lists(tool_calls(), min_size=1, max_size=6),
    read_only=st.booleans(),
    view=st.sampled_from([None, ["m", "l", "t", "claims", "work"], ["m/a", "t"]]),
)
async def test_any_arguments_get_a_result_or_a_structured_error(
    anyio_backend: str, calls: list[tuple[Any, Any]], read_only: bool, view: list[str] | None
) -> None:
    run = f"any{next(RUNS)}"
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record(run=run, agent="other", schema=ANY_SCHEMA) as other,
        store.open_record(run=run, agent="agent", schema=ANY_SCHEMA) as rec,
    ):
        await populate(other)
        async with Toolset(rec, view=view, read_only=read_only, max_result_tokens=300) as tools:
            for name, arguments in calls:
                await rec.sync()
                before_head, before = await head(store, run), rec.to_dict()
                result = await call(tools, name, arguments)
                err = code(result)
                event(f"{name if name in TOOLS else 'unknown'}: {err or 'ok'}")
                if err is not None or name not in WRITES:
                    await rec.sync()
                    assert await head(store, run) == before_head, (name, arguments, result)
                    assert rec.to_dict() == before, (name, arguments, result)
                if read_only and name in WRITES:  # refused, on its arguments or as a write
                    assert err in ("READ_ONLY", "INVALID_ARGUMENTS"), (name, arguments, result)


# -- 3. results fit the budget; paging returns everything once -------------------------------------

PAGE_ALPHABET = 'ab "\\\n\t\x01é日🙂'
page_text = st.text(PAGE_ALPHABET, max_size=40)
page_values = st.one_of(
    json_values(6),
    page_text,
    st.text(PAGE_ALPHABET, min_size=200, max_size=1500),  # past half a page at small budgets
)


@dataclass
class Content:
    entries: dict[str, Any]
    items: list[Any]
    text: str
    big: Any
    history: list[Any]


@st.composite
def contents(draw: st.DrawFn) -> Content:
    """Collections mostly larger than one page, built from a few drawn values (drawing
    hundreds of values one by one would make most of the example's cost)."""
    pool = draw(st.lists(page_values, min_size=1, max_size=6))
    names = draw(st.lists(st.text(PAGE_ALPHABET, min_size=1, max_size=12), min_size=1, max_size=6))
    n = draw(st.integers(0, 150))
    entries = {f"{names[i % len(names)]}{i}": pool[i % len(pool)] for i in range(n)}
    items = [pool[(i * 7) % len(pool)] for i in range(draw(st.integers(0, 150)))]
    text = "".join(draw(st.lists(page_text, max_size=20))) * draw(st.integers(1, 60))
    big = {"blob": draw(st.text(PAGE_ALPHABET, min_size=1, max_size=60)) * draw(st.integers(1, 80))}
    history = [pool[(i * 3) % len(pool)] for i in range(draw(st.integers(0, 40)))]
    return Content(entries, items, text, big, history)


async def fill(rec: crdtstore.Record, c: Content) -> None:
    # one key per journal entry, as the tools write (one entry of many keys is
    # test_changes_of_one_large_entry_fit_the_budget)
    for key, value in c.entries.items():
        await rec.map("m").set(key, value)
    if c.items:
        await rec.list("l").extend(c.items)
    if c.text:
        await rec.text("t").edit(c.text)
    await rec.map("blobs").set("big", c.big)
    for value in c.history:
        await rec.map("h").set("k", value)
    await rec.flush()


async def pages(tools: Toolset, name: str, args: dict[str, Any], limit: int) -> list[Any]:
    """Every result of a paged read, following ``next_cursor``; each one within budget."""
    out: list[Any] = []
    cursor: str | None = None
    for _ in range(limit + 2):
        a = dict(args) if cursor is None else {**args, "cursor": cursor}
        page = await call(tools, name, a)
        assert code(page) is None, page
        assert estimate_tokens(page) <= tools.max_result_tokens + TOKEN_SLACK, (
            f"{name} result of {estimate_tokens(page):.0f} tokens, budget "
            f"{tools.max_result_tokens}: {compact(page)[:300]}"
        )
        assert not page.get("changed_since_cursor"), page
        out.append(page)
        cursor = page.get("next_cursor")  # an entry that fits in one result has none
        if cursor is None:
            return out
    raise AssertionError(f"{name}: more than {limit + 2} pages")


def omitted_or_equal(item: dict[str, Any], expected: Any, budget: int) -> None:
    if "value_omitted" in item:
        # cut only because the item with its value would take half a page
        whole = {k: v for k, v in item.items() if k != "value_omitted"}
        whole["value"] = expected
        assert estimate_tokens(whole) > budget // 2 - 1, (item, expected)
    else:
        assert item["value"] == expected, (item, expected)


@fewer(3)
@given(content=contents(), budget=st.integers(100, 800), page_size=st.integers(1, 60))
async def test_results_fit_the_budget_and_pages_return_every_entry_once(
    anyio_backend: str, content: Content, budget: int, page_size: int
) -> None:
    run = f"page{next(RUNS)}"
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record(run=run, agent="writer", schema=SEQ_SCHEMA) as rec,
    ):
        await fill(rec, content)
        tools = Toolset(rec, max_result_tokens=budget, page_size=page_size)
        n_entries = len(content.entries)

        got = [e for p in await pages(tools, "store_get", {"collection": "m"}, n_entries)
               for e in p["entries"]]  # fmt: skip
        assert [e["key"] for e in got] == sorted(content.entries), "map entries not each once"
        for e in got:
            omitted_or_equal(e, content.entries[e["key"]], budget)
        event(f"map pages > 1: {n_entries > 0 and len(got) > page_size}")

        got = [i for p in await pages(tools, "store_get", {"collection": "l"}, len(content.items))
               for i in p["items"]]  # fmt: skip
        assert [i["index"] for i in got] == list(range(len(content.items)))
        for i in got:
            omitted_or_equal(i, content.items[i["index"]], budget)

        if content.text:
            text_pages = await pages(tools, "store_get", {"collection": "t"}, len(content.text))
            assert "".join(p["text"] for p in text_pages) == content.text
            offsets = list(itertools.accumulate([0] + [len(p["text"]) for p in text_pages[:-1]]))
            assert [p["offset"] for p in text_pages] == offsets
            event(f"text pages: {min(len(text_pages), 3)}")

        if content.history:
            hist = [e for p in await pages(tools, "store_history", {"collection": "h", "key": "k"},
                                           len(content.history)) for e in p["entries"]]  # fmt: skip
            assert len(hist) == len(content.history)
            for e, expected in zip(hist, content.history, strict=True):
                omitted_or_equal(e, expected, budget)

        # store_changes pages by next_since: every change once, oldest first
        want = [(ch.seq, ch.collection) for ch in await rec.changes_since(0)]
        lines: list[tuple[int, str]] = []
        since = 0
        for _ in range(len(want) + 2):
            page = await call(tools, "store_changes", {"since_version": since})
            assert estimate_tokens(page) <= budget + TOKEN_SLACK, compact(page)[:300]
            lines += [(line["version"], line["collection"]) for line in page["changes"]]
            if not page["more"]:
                break
            assert page["next_since"] > since, page
            since = page["next_since"]
        assert lines == want

        describe = await call(tools, "store_describe", {})
        if content.entries:
            assert describe["collections"]["m"]["size"]["entries"] == n_entries

        # last: a value too large for one result comes back in chunks
        big = await pages(tools, "store_get", {"collection": "blobs", "key": "big"}, 10_000)
        if len(big) == 1 and "value" in big[0]:
            assert big[0]["value"] == content.big
        else:
            assert json.loads("".join(p["value_json"] for p in big)) == content.big
            assert [p["value_json_offset"] for p in big] == list(
                itertools.accumulate([0] + [len(p["value_json"]) for p in big[:-1]])
            )
        event(f"value chunks: {min(len(big), 3)}")


async def test_changes_of_one_large_entry_fit_the_budget(anyio_backend: str) -> None:
    """One journal entry that sets many keys (a transaction, ``map.update``) is one group of
    store_changes: its line must still be cut to the budget (saying how many keys it left
    out), not returned whole because it is the first one."""
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record(run="r", agent="writer") as rec,
    ):
        await rec.map("m").update({"k" * 1000 + str(i): i for i in range(50)})  # valid keys
        tools = Toolset(rec)
        page = await call(tools, "store_changes", {"since_version": 0})
        assert code(page) is None, page
        assert estimate_tokens(page) <= tools.max_result_tokens + TOKEN_SLACK, (
            f"store_changes returned {estimate_tokens(page):.0f} tokens, budget "
            f"{tools.max_result_tokens}"
        )
        (line,) = page["changes"]
        assert len(line["keys"]) + line.get("more_keys", 0) == 50, line.keys()


async def test_a_large_value_comes_back_in_chunks_within_the_budget(anyio_backend: str) -> None:
    """store_get of an entry too large for one result returns its JSON in chunks, each
    within the budget whatever the characters (4-byte UTF-8, escapes), together the value."""
    value = {"blob": "🙂" * 20_000}
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record(run="r", agent="writer") as rec,
    ):
        await rec.map("m").set("big", value)
        tools = Toolset(rec)
        chunks = []
        args: dict[str, Any] = {"collection": "m", "key": "big"}
        for _ in range(100):
            page = await call(tools, "store_get", args)
            assert code(page) is None, page
            assert estimate_tokens(page) <= tools.max_result_tokens + TOKEN_SLACK, (
                f"a chunk of {estimate_tokens(page):.0f} tokens, budget {tools.max_result_tokens}"
            )
            chunks.append(page["value_json"])
            if page["next_cursor"] is None:
                break
            args["cursor"] = page["next_cursor"]
        assert json.loads("".join(chunks)) == value


async def test_a_collection_another_agent_just_made_is_read_as_its_kind(
    anyio_backend: str,
) -> None:
    """store_get syncs before it looks at the collection's kind: the first read of a text or
    list that another agent has just made is a page of that kind (it was COLLECTION_KIND,
    read as a map, before the fix)."""
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record(run="r", agent="a") as a,
        store.open_record(run="r", agent="b") as b,
    ):
        ta, tb = Toolset(a), Toolset(b)
        edit = {"collection": "notes", "edits": [{"at": 0, "insert": "Fact A."}]}
        assert (await call(ta, "store_text_edit", edit))["ok"]
        assert (await call(ta, "store_append", {"collection": "log", "value": 1}))["ok"]
        put = {"collection": "facts", "key": "k", "value": 1}
        assert (await call(ta, "store_put", put))["ok"]
        notes = await call(tb, "store_get", {"collection": "notes"})
        assert (notes.get("kind"), notes.get("text")) == ("text", "Fact A."), notes
        log = await call(tb, "store_get", {"collection": "log"})
        assert (log.get("kind"), log.get("total")) == ("list", 1), log
        facts = await call(tb, "store_get", {"collection": "facts"})
        assert (facts.get("kind"), facts.get("total")) == ("map", 1), facts


async def test_a_map_page_of_long_keys_fits_the_budget_with_its_cursor(
    anyio_backend: str,
) -> None:
    """A map page's ``next_cursor`` holds the page's last key: with keys near the 1,024
    characters a key may have, the cursor must count against the budget too."""
    async with (
        crdtstore.open_store("memory://") as store,
        store.open_record(run="r", agent="writer") as rec,
    ):
        for i in range(20):
            await rec.map("m").set("k" * 1000 + f"{i:02}", i)
        tools = Toolset(rec)
        page = await call(tools, "store_get", {"collection": "m"})
        assert page["next_cursor"] is not None, "20 keys of 1 KB are more than one page"
        assert estimate_tokens(page) <= tools.max_result_tokens + TOKEN_SLACK, (
            f"a map page of {estimate_tokens(page):.0f} tokens, budget {tools.max_result_tokens}"
            f" (its cursor alone {len(page['next_cursor']) / 4:.0f})"
        )
