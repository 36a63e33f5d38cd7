"""The cells of notebook 07_agent_tools: ``_build.py`` adds them to its NOTEBOOKS, and
``.venv/bin/python notebooks/_build.py 07`` builds and executes that notebook alone."""

from __future__ import annotations

NAME = "07_agent_tools"

CELLS: list[tuple[str, str]] = [
    (
        "md",
        """\
# 07 · Agent tools: the record as tools a model calls

An LLM agent cannot call `rec.map("plan").set(...)`: it emits *tool calls*, a tool name and
its arguments as JSON text. `crdtstore.tools.Toolset` turns an open record into thirteen such
tools (`store_get`, `store_put`, `store_claim`, ...), gives their schemas in each vendor's
format, runs a call from its JSON arguments and answers with a JSON-ready dict. A failure the
agent can act on (a stale version, a claim held by someone else, an edit that does not apply)
comes back as a structured `{"error": {...}}`, never as an exception, and changes nothing.

Two agents, `alice` and `bob`, share one run on a SQLite store in a temporary folder. There is
no model and no network here: the tool calls are written out as a model would emit them. The
same toolset is served to agents in other processes by `crdtstore mcp` (MCP over stdio).""",
    ),
    (
        "code",
        """\
import asyncio
import contextlib
import json
import tempfile
from pathlib import Path

from pydantic import BaseModel

import crdtstore
from crdtstore.tools import TOOL_NAMES, Toolset


class Finding(BaseModel):
    text: str
    confidence: float


SCHEMA = {
    "findings": crdtstore.CollectionSpec(kind="map", model=Finding),
    "plan": crdtstore.CollectionSpec(kind="map"),
    "log": crdtstore.CollectionSpec(kind="list"),
    "notes": crdtstore.CollectionSpec(kind="text"),
}
folder = tempfile.TemporaryDirectory()
URL = f"sqlite:///{Path(folder.name) / 'store.db'}"
RUN = "incident-42"


@contextlib.asynccontextmanager
async def agents(*names):
    \"\"\"One toolset per agent, each on its own record of RUN (a notebook cell runs in a task
    of its own, so each cell opens the store and closes it again; the file keeps everything).\"\"\"
    async with crdtstore.open_store(URL) as store, contextlib.AsyncExitStack() as stack:
        tools = []
        for name in names:
            record = store.open_record(RUN, name, "model", schema=SCHEMA)
            rec = await stack.enter_async_context(record)
            tools.append(await stack.enter_async_context(Toolset(rec)))
        yield tools


def show(result, indent=None):
    \"\"\"A tool result as the model would read it: JSON text.\"\"\"
    print(json.dumps(result, indent=indent, ensure_ascii=False))


print(len(TOOL_NAMES), "tools:", ", ".join(TOOL_NAMES))""",
    ),
    (
        "md",
        """\
## The schemas

Each tool's arguments are one pydantic model; the JSON schema is generated from it, with
every `$ref` inlined (not every vendor resolves them) and unknown fields refused. Here is
`store_put` as an OpenAI function tool; the Anthropic and MCP forms carry the same schema
under `input_schema` and `inputSchema`, MCP with hints saying which tools only read.""",
    ),
    (
        "code",
        """\
async with agents("alice") as (alice,):
    openai = {t["function"]["name"]: t for t in alice.schemas("openai")}
    anthropic = {t["name"]: t for t in alice.schemas("anthropic")}
    mcp = {t["name"]: t for t in alice.schemas("mcp")}

show(openai["store_put"], indent=1)
params = openai["store_put"]["function"]["parameters"]
print("\\nanthropic:", sorted(anthropic["store_put"]), "| same schema:",
      anthropic["store_put"]["input_schema"] == params)
print("mcp:      ", sorted(mcp["store_put"]), "| same schema:",
      mcp["store_put"]["inputSchema"] == params)
print("mcp annotations of store_get:", mcp["store_get"]["annotations"])""",
    ),
    (
        "md",
        """\
## A scripted agent loop

What a model's turn looks like from the toolset's side: a list of tool calls, each with the
model's call id and its arguments as JSON text, dispatched with `await ts.call(name, args,
call_id=...)`. The script makes two mistakes a model makes: a misspelled argument
(`colection`) and a value that does not fit the collection's model (`confidence` missing).
Both come back as errors the model can read and correct; neither writes anything.""",
    ),
    (
        "code",
        """\
turn = [
    ("call_1", "store_describe", "{}"),
    ("call_2", "store_put", '{"colection": "findings", "key": "cache", "value": {}}'),
    ("call_3", "store_put",
     '{"collection": "findings", "key": "cache", "value": {"text": "cache is cold"}}'),
    ("call_4", "store_put",
     '{"collection": "findings", "key": "cache",'
     ' "value": {"text": "cache is cold", "confidence": 0.8}}'),
    ("call_5", "store_append", '{"collection": "log", "value": "alice: looked at the cache"}'),
    ("call_6", "store_get", '{"collection": "findings", "key": "cache"}'),
]
async with agents("alice") as (alice,):
    for call_id, name, args in turn:
        result = await alice.call(name, args, call_id=call_id)
        if name == "store_describe":  # long: the collections, their rules and sizes
            result = {"version": result["version"],
                      "collections": {n: c["kind"] for n, c in result["collections"].items()}}
        print(f"{call_id} {name}({args})")
        show(result)
        print()""",
    ),
    (
        "md",
        """\
Every write returns the entry's `version` (a journal position); every read returns one too,
with who wrote the value. The model echoes a version back to a later write, which is how the
next section guards against a lost update.

## Two agents race on one key

Both agents read `plan/reviewers`, add themselves, and write it back with `expected_version`
set to what they read. Both decided on the same read, so the second write would silently drop
the first agent's name. Instead it is refused with `STALE_VERSION`, and the error carries the
current version and value.""",
    ),
    (
        "code",
        """\
def add_me(read, me):
    \"\"\"What the model emits: the list it read plus its own name, guarded by the version.\"\"\"
    return json.dumps({"collection": "plan", "key": "reviewers", "value": read["value"] + [me],
                       "expected_version": read["version"]})


async with agents("alice", "bob") as (alice, bob):
    await alice.call("store_put", {"collection": "plan", "key": "reviewers", "value": ["carol"]})
    read_a, read_b = await asyncio.gather(
        alice.call("store_get", '{"collection": "plan", "key": "reviewers"}'),
        bob.call("store_get", '{"collection": "plan", "key": "reviewers"}'),
    )
    print("both read version", read_a["version"], read_b["version"], read_a["value"])
    first = await alice.call("store_put", add_me(read_a, "alice"), call_id="a-7")
    second = await bob.call("store_put", add_me(read_b, "bob"), call_id="b-3")
    show(first)
    show(second, indent=1)

    # bob does what the error says: re-read, decide again, retry
    reread = await bob.call("store_get", {"collection": "plan", "key": "reviewers"})
    retry = await bob.call("store_put", add_me(reread, "bob"), call_id="b-4")
    show(retry)
    show((await alice.call("store_get", {"collection": "plan", "key": "reviewers"}))["value"])""",
    ),
    (
        "md",
        """\
`bob` did what the error told him (last three lines of the cell): re-read, decide again,
retry. The retry carries the new version and succeeds, and both names are in the list.""",
    ),
    (
        "md",
        """\
## A claim contest

Both agents see work item `t1` and both try to take it at the same moment. A claim is a lease
on the item across every process using the store: one agent gets it (with a fencing token),
the other gets `LEASE_HELD` naming the holder, so it moves on to other work instead of doing
`t1` twice. The toolset holds the claim between calls and renews it.""",
    ),
    (
        "code",
        """\
claim = '{"collection": "tasks", "item": "t1", "ttl": 30}'
async with agents("alice", "bob") as (alice, bob):
    tools = {"alice": alice, "bob": bob}
    results = await asyncio.gather(alice.call("store_claim", claim), bob.call("store_claim", claim))
    got = dict(zip(tools, results, strict=True))
    winner = next(agent for agent, r in got.items() if "error" not in r)
    loser = next(agent for agent in got if agent != winner)
    print("winner:", winner)
    show(got[winner])
    print("loser:", loser)
    show(got[loser], indent=1)

    # the winner does the work and completes the item: later claims are refused too
    done = {"collection": "tasks", "item": "t1", "result": "cache warmed"}
    show(await tools[winner].call("store_complete", done))
    late = await tools[loser].call("store_claim", claim)
    print(late["error"]["code"], "-", late["error"]["message"])
    entry = await bob.call("store_get", '{"collection": "claims", "key": "tasks/t1"}')
    print("claims/tasks/t1:", entry["value"])""",
    ),
    (
        "md",
        """\
The winner then completes the item with its result (last lines of the cell): the claim is
released and the item is marked done in the record's `claims` map, which every agent reads,
so a later claim of `t1`, by anyone, is refused as well.""",
    ),
    (
        "md",
        """\
## No rewrites: a text changes by edits only

The failure mode here is an agent that "updates" a shared scratchpad by writing back its
whole (stale) copy, dropping what others added meanwhile. The tools have no way to do that:
there is no rewrite tool, a text is not a map entry, and `store_text_edit` takes small edits,
`{"find", "replace"}` or `{"at", "delete", "insert"}`. A `find` must occur exactly once: if it
is absent or ambiguous the whole call is refused with `EDIT_REFUSED` and the text is left as
it was.""",
    ),
    (
        "code",
        """\
print("the tools that change a text:", [n for n in TOOL_NAMES if "text" in n])
start = {"at": 0, "insert": "The cache is cold. The build is slow. The docs are fine."}
ambiguous = {"collection": "notes", "edits": [{"find": "The", "replace": "A"}]}
absent = {"collection": "notes", "edits": [{"find": "slow.", "replace": "slow (41 min)."},
                                           {"find": "the tests", "replace": "the suite"}]}
async with agents("alice", "bob") as (alice, bob):
    await alice.call("store_text_edit", {"collection": "notes", "edits": [start]})
    # a rewrite disguised as a map write is refused: notes is a text
    print(await bob.call("store_put", {"collection": "notes", "key": "all", "value": "my copy"}))
    before = await bob.call("store_get", {"collection": "notes"})
    show(await bob.call("store_text_edit", ambiguous), indent=1)
    refused = await bob.call("store_text_edit", absent)  # the first edit would apply: not alone
    print(refused["error"]["code"], refused["error"]["reason"], "-", refused["error"]["message"])
    after = await bob.call("store_get", {"collection": "notes"})
print("text unchanged:", after["text"] == before["text"], "| version", before["version"], "->",
      after["version"])""",
    ),
    (
        "md",
        """\
Now both agents read the text and, from that same read, edit different sentences at the same
time. An edit names the text it changes, not the whole result, so both survive.""",
    ),
    (
        "code",
        """\
edit_a = {"collection": "notes", "edits": [{"find": "cold.", "replace": "cold (hit rate 3%)."}]}
edit_b = {"collection": "notes", "edits": [{"find": "slow.", "replace": "slow (41 min)."}]}
async with agents("alice", "bob") as (alice, bob):
    seen = await asyncio.gather(alice.call("store_get", {"collection": "notes"}),
                                bob.call("store_get", {"collection": "notes"}))
    print("both read version", [r["version"] for r in seen], repr(seen[0]["text"]))
    done = await asyncio.gather(alice.call("store_text_edit", edit_a, call_id="a-9"),
                                bob.call("store_text_edit", edit_b, call_id="b-6"))
    print("both applied:", [r.get("ok") for r in done])
    print(repr((await alice.call("store_get", {"collection": "notes"}))["text"]))""",
    ),
    (
        "md",
        """\
## What moved while I was away

An agent that acted on a read from long ago is acting on a snapshot that may have stopped
being true. `store_changes(since_version)` answers compactly, one line per change: which
collection, which keys (or the shape of list and text operations, without their payload), by
whom. Here `bob` asks what moved since his first read of the reviewers. The text edits show
as the small inserts they were (`["ins", offset, characters]`), not as rewrites.""",
    ),
    (
        "code",
        """\
async with agents("bob") as (bob,):
    moved = await bob.call("store_changes", {"since_version": read_b["version"]})
print("now at version", moved["version"], "| more:", moved["more"])
for line in moved["changes"]:
    what = line.get("keys", line.get("ops"))
    who = f"v{line['version']:<3} {line['agent']:6}"
    print(f"  {who} {line['collection']:7} {line['kind']:5} {what}")""",
    ),
    (
        "md",
        """\
## Who wrote what, by which call

Every write made through a toolset carries the agent, its source kind and the model's tool-call
id (`call_id=`), journaled with the value. `store_history` lists every value an entry held:
here the stale write of `bob` is absent (it was refused), and his retry is there as `b-4`.""",
    ),
    (
        "code",
        """\
async with agents("alice") as (alice,):
    history = await alice.call("store_history", {"collection": "plan", "key": "reviewers"})
for h in history["entries"]:
    print(f"v{h['version']:<3} {h['agent']:6} {h['source']:6} call={h.get('call')}", h["value"])""",
    ),
    ("code", "folder.cleanup()"),
    (
        "md",
        """\
## What to take away

- One pydantic model per tool gives the schema in every vendor's format; `ts.call(name,
  json_text)` validates, runs and answers JSON; writes are journaled before it returns.
- Refusals are data: `STALE_VERSION` with the current value, `LEASE_HELD` with the holder,
  `EDIT_REFUSED` with the reason, `SCHEMA_INVALID` with pydantic's errors. None writes anything.
- Texts change by edits, never by rewrites; `store_changes` and `store_history` tell an agent
  what moved and who (which call) moved it.
- `crdtstore mcp --store URL --run R --agent A` serves the same tools to agents in other
  processes; `bench/tools.py` measures what a call costs over the direct API and over MCP.""",
    ),
]
