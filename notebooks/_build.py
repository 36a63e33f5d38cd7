"""Build the notebooks of this folder from the cells below, execute them, save them with outputs.

    .venv/bin/python notebooks/_build.py            # every notebook
    .venv/bin/python notebooks/_build.py 02         # those whose name starts with 02

The notebooks are committed with their outputs; ``tests/test_notebooks.py`` executes them
again in CI. Edit the cells here, not in the .ipynb files, and rebuild. Notebook code uses the
public API only (``import crdtstore``, ``from crdtstore import sim``).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
CELL_TIMEOUT = 60

SETUP = """\
%matplotlib inline
import crdtstore
from crdtstore import sim"""

NOTEBOOKS: dict[str, list[tuple[str, str]]] = {}

NOTEBOOKS["01_merge_basics"] = [
    (
        "md",
        """\
# 01 · Merge basics: what merges, and what wins

Three agents edit one record at the same time. Each agent has its own real `crdtstore`
record (on its own `memory://` store); the simulator (`crdtstore.sim`) carries every write
to the other agents over a simulated network (1 to 3 ticks per message). Nobody sees anyone
else's write before making their own, so every write below is *concurrent*.

- **maps** (`plan`): last writer wins *per key*; different keys never conflict;
- **lists** (`log`): every concurrent append survives;
- **texts** (`notes`): every concurrent insert survives, character by character.""",
    ),
    ("code", "%matplotlib inline\nfrom crdtstore import sim"),
    (
        "code",
        """\
script = [
    sim.Set(0, "plan", "owner", "alice"),
    sim.Set(1, "plan", "owner", "bob"),
    sim.Set(2, "plan", "deadline", "friday"),
    sim.Append(0, "log", "a0 looked at the cache"),
    sim.Append(1, "log", "a1 profiled the build"),
    sim.Append(2, "log", "a2 read the docs"),
    sim.InsertText(0, "notes", "cache is cold. "),
    sim.InsertText(1, "notes", "build is slow. "),
    sim.Wait(2),
    sim.InsertText(2, "notes", "docs are fine. ", at=0),
    sim.Drain(),
]
config = sim.SimConfig(agents=3, seed=4, keep_all=())
result = await sim.Simulation(config, script).run()
print("invariants held:", result.ok, "| converged:", result.converged, "| ticks:", result.ticks)""",
    ),
    (
        "md",
        """\
Every agent ends with the same record. The table shows it with provenance: who wrote each
value, its position in the author's journal, the tick and the simulator's write id.""",
    ),
    ("code", "sim.record_table(result)"),
    (
        "md",
        """\
`owner` was written by `a0` and `a1` concurrently: one of them wins, the same one at every
agent (Yjs picks by client id: arbitrary, but deterministic). `contests` lists such keys.
The losing write is not gone from the system: it stays in its author's journal and in
`history`. `deadline` was written by one agent only, so it merged without a contest.""",
    ),
    (
        "code",
        """\
for c in sim.contests(result):
    print(f"{c.collection}[{c.key!r}]: concurrent writes {c.values} by {c.agents}; "
          f"kept {c.kept!r} (write #{c.winner})")""",
    ),
    (
        "md",
        """\
Before the messages arrived, the agents disagreed. The trace holds every agent's state after
each of its writes and deliveries; `sim.diff` compares two of them.""",
    ),
    (
        "code",
        """\
first_state = {}
for e in result.trace.of("write"):
    first_state.setdefault(e["agent"], e["state"])  # what each agent held after its first write
print(sim.diff(first_state["a0"], first_state["a1"]))""",
    ),
    (
        "md",
        """\
The timeline: one lane per agent, a dot per write (coloured by collection kind), an arrow per
delivery from the writer (at write time) to the receiver (when it applied the write).""",
    ),
    ("code", "sim.timeline(result)"),
    (
        "md",
        """\
A write made *after* seeing another one is not a conflict: it simply supersedes it. Here
`a2` waits until it has `a0`'s value, then overwrites it; `contests` finds nothing.""",
    ),
    (
        "code",
        """\
sequential = [
    sim.Set(0, "plan", "owner", "alice"),
    sim.Drain(),
    sim.Set(2, "plan", "owner", "carol"),
    sim.Drain(),
]
after = await sim.Simulation(config, sequential).run()
print(after.states["a1"]["plan"], "| contests:", sim.contests(after))""",
    ),
]

NOTEBOOKS["02_conflict_policies"] = [
    (
        "md",
        """\
# 02 · Conflict policies: `lww`, `keep_all`, `guarded`

The same contested key under three policies. Two agents write `population` concurrently:

- `lww` (the default): one value wins, the other stays only in the journal and `history`;
- `keep_all`: a multi-value register keeps *both* as siblings until a later write, made
  after seeing them, resolves them;
- `guarded`: writes are conditional on the version the writer read; a write based on a
  stale read is refused (`StaleVersion`) instead of merged.""",
    ),
    ("code", SETUP),
    (
        "code",
        """\
script = [
    sim.Set(0, "lww", "population", 8_100_000),
    sim.Set(1, "lww", "population", 7_900_000),
    sim.Set(0, "facts", "population", 8_100_000),
    sim.Set(1, "facts", "population", 7_900_000),
    sim.Wait(6),
    sim.Drain(),
    sim.Wait(4),
    # a0 has seen both siblings now: its write resolves them
    sim.Set(0, "facts", "population", 8_100_000),
    sim.Drain(),
]
config = sim.SimConfig(agents=2, seed=3, keep_all=("facts",))  # "facts" is keep_all
result = await sim.Simulation(config, script).run()
print("invariants held:", result.ok, "| converged:", result.converged)""",
    ),
    (
        "md",
        """\
Right after the concurrent writes were delivered, before the resolving write: `lww` holds
one value, `keep_all` holds two siblings, each with its author.""",
    ),
    (
        "code",
        """\
resolving = max(e["t"] for e in result.trace.of("write"))
before = [e for e in result.trace.of("write", "apply") if e["t"] < resolving][-1]
sim.record_table(before["state"], keep_all=config.keep_all)""",
    ),
    ("code", "sim.record_table(result)  # after the resolving write: one sibling left"),
    (
        "md",
        """\
Siblings and conflicted keys over time, per agent: each agent sees the conflict once the
other's write arrives, and it disappears everywhere once the resolving write is delivered.
The grey line counts the distinct states the agents hold (1: converged).""",
    ),
    ("code", "sim.plot_counts(result)"),
    (
        "md",
        """\
## The `stale-lww` scenario

A fact-checker corrects a value; a slow agent, working from what it read *before* the
correction, finishes second and writes the old value back. These writes are not concurrent
but sequential, so last-writer-wins keeps the stale value, silently. Here on real records
sharing one `memory://` store.""",
    ),
    (
        "md",
        """\
(Each cell runs as its own task in Jupyter, so a store and its records are opened and closed
within one cell, with `async with`.)""",
    ),
    (
        "code",
        """\
schema = {
    "lww": crdtstore.CollectionSpec(kind="map"),
    "guarded": crdtstore.CollectionSpec(kind="map", policy="guarded"),
}
async with (
    crdtstore.open_store("memory://") as store,
    store.open_record("r", "fact-checker", schema=schema) as checker,
    store.open_record("r", "slow-agent", schema=schema) as slow,
):
    await checker.map("lww").set("population", 7_900_000)
    await checker.flush()
    await slow.sync()
    seen = slow.map("lww")["population"]  # the slow agent reads 7.9M ...
    await checker.map("lww").set("population", 8_100_000)  # ... the checker corrects it ...
    await checker.flush()
    await slow.sync()
    await slow.map("lww").set("population", seen)  # ... and the slow agent writes back its read
    await slow.flush()
    await checker.sync()
    print("lww keeps:", checker.map("lww")["population"])
    for h in await checker.history("lww", "population"):
        print(f"  history: {h.value:>9,} by {h.provenance.agent} (seq {h.provenance.seq})")

    # guarded: every write names the version it is based on
    await checker.map("guarded").set("population", 7_900_000, expected_version=0)
    await checker.flush()
    await slow.sync()
    _, seen_version = slow.map("guarded").get_versioned("population")
    _, v = checker.map("guarded").get_versioned("population")
    await checker.map("guarded").set("population", 8_100_000, expected_version=v)
    try:
        await slow.map("guarded").set("population", 7_900_000, expected_version=seen_version)
    except crdtstore.StaleVersion as err:
        print("guarded refuses the stale write:", type(err).__name__,
              "| current value:", f"{err.current_value:,}")
    await slow.sync()
    print("guarded keeps:", slow.map("guarded")["population"])
    print()
    print(sim.record_tree(slow))""",
    ),
    (
        "md",
        """\
Under `guarded` the slow agent's write was refused, and the error carried the current value
so that it can decide again. Under `keep_all` (above) the correction would have survived as
a sibling next to the stale value, for a later write to resolve.""",
    ),
]

NOTEBOOKS["03_partitions_and_resume"] = [
    (
        "md",
        """\
# 03 · Partitions, healing, and resuming from the journal

Four agents on a lossy network (messages lost 20% of the time and retransmitted,
duplicated, reordered). At tick 5 the network splits into {a0, a1} and {a2, a3}; both sides
keep working; at tick 30 the partition heals. How long until everybody agrees again?""",
    ),
    ("code", "%matplotlib inline\nimport random\n\nimport crdtstore\nfrom crdtstore import sim"),
    (
        "code",
        """\
rng = random.Random(1)
script = [sim.Wait(5), sim.Partition(((0, 1), (2, 3)))]
for n in range(24):
    a = n % 4
    step = rng.choice([
        sim.Set(a, "m", rng.choice("xyz"), f"a{a}.{n}"),
        sim.Set(a, "k", rng.choice("xyz"), f"a{a}.{n}"),
        sim.Append(a, "l", f"a{a}.{n}"),
        sim.InsertText(a, "t", f"<a{a}.{n}>", at="boundary"),
    ])
    script += [step, sim.Wait(1)]
script += [sim.Heal(), sim.Wait(2)]
script += [sim.Set(0, "k", "x", "resolved by a0"), sim.Drain()]
network = sim.NetworkConfig(sim.LinkSpec(delay=(1, 3), loss=0.2, duplicate=0.1, reorder=0.2))
config = sim.SimConfig(agents=4, seed=2, network=network)
result = await sim.Simulation(config, script).run()
timeline = sim.timeline_data(result)
print("invariants held:", result.ok, "| converged:", result.converged)
print("partitioned during ticks", timeline.partitions)
print("writes per agent:", timeline.writes_per_agent())
print("lost transmissions:", len(timeline.losses), "| deliveries:", len(timeline.deliveries))
print("converged for good from tick", sim.convergence_time(result))""",
    ),
    (
        "md",
        """\
The shaded band is the partition: arrows never cross it while it lasts (red crosses are lost
transmissions, retransmitted later); after the heal, the backlog flows across.""",
    ),
    ("code", "sim.timeline(result)"),
    ("code", "sim.plot_counts(result)"),
    (
        "md",
        """\
Just before the heal, the two sides hold different records. The diff between `a0` and `a2`
at that moment:""",
    ),
    (
        "code",
        """\
heal = timeline.partitions[0][1]
last = {}
for e in result.trace.of("write", "apply"):
    if e["t"] < heal:
        last[e["dst"] if e["ev"] == "apply" else e["agent"]] = e["state"]
sim.diff(last["a0"], last["a2"], keep_all=config.keep_all)""",
    ),
    (
        "md",
        """\
## Resuming from the journal, in any order

The journal is the resume log. Here three real records share one store and write
concurrently; then we rebuild the record from the journal entries *shuffled*. Merging
the entries into one update (`crdtstore.tree_merge`; Yjs merges commute) and applying it
gives the same record whatever the order. Applying them one at a time out of causal order
is a different matter with pycrdt 0.14 (see *causal delivery* in `crdtstore.sim`'s docs):
we count how often that matches too.""",
    ),
    (
        "code",
        """\
async with crdtstore.open_store("memory://") as store:
    async with (
        store.open_record("r", "agent0") as r0,
        store.open_record("r", "agent1") as r1,
        store.open_record("r", "agent2") as r2,
    ):
        recs = [r0, r1, r2]
        for n in range(8):
            for i, rec in enumerate(recs):
                await rec.map("m").set(f"k{n % 3}", f"{i}.{n}")
                await rec.list("l").append(f"{i}.{n}")
                await rec.text("t").insert(0, f"<{i}.{n}>")
            if n % 3 == 0:
                for rec in recs:
                    await rec.flush()
                    await rec.sync()
        for rec in recs:
            await rec.flush()
        for rec in recs:
            await rec.sync()
        entries = await store.journal("r", limit=10_000)
        reference = (await store.replay("r")).to_dict()
        print(len(entries), "journal entries; every record equals the replay:",
              all(rec.to_dict() == reference for rec in recs))

    merged_ok = one_by_one_ok = 0
    for seed in range(20):
        shuffled = entries[:]
        random.Random(seed).shuffle(shuffled)
        merged = crdtstore.Replica()
        merged.apply_update(crdtstore.tree_merge([e.update for e in shuffled]))
        merged_ok += merged.to_dict() == reference
        single = crdtstore.Replica()
        for e in shuffled:
            single.apply_update(e.update)
        one_by_one_ok += single.to_dict() == reference
    print(f"merged, shuffled: {merged_ok}/20 equal; one at a time, shuffled: {one_by_one_ok}/20")

    # time travel: the record at every journal position
    sizes = {"m": [], "l": [], "t": []}
    for seq in range(1, len(entries) + 1):
        past = (await store.replay("r", until=seq)).to_dict()
        for name in sizes:
            sizes[name].append(len(past.get(name, "")))
    middle = len(entries) // 2
    middle_tree = sim.record_tree(await store.replay("r", until=middle), width=30)
    next_five = await sim.journal_diff(store, "r", middle, middle + 5)""",
    ),
    (
        "md",
        """\
## Time travel

`store.replay(run, until=seq)` rebuilds the record as it was at any journal position, with
provenance (the cell above replayed every position). The size of each collection along the
journal:""",
    ),
    (
        "code",
        """\
from matplotlib.figure import Figure

fig = Figure(figsize=(8, 3), layout="constrained")
ax = fig.add_subplot()
for name, label in (("m", "map keys"), ("l", "list items"), ("t", "text characters / 10")):
    ys = [v / 10 for v in sizes[name]] if name == "t" else sizes[name]
    ax.step(range(1, len(entries) + 1), ys, where="post", label=label)
ax.set_xlabel("journal position")
ax.legend()
fig""",
    ),
    (
        "code",
        """\
print(f"the record at journal position {middle}:")
print(middle_tree)
print()
print("what the next five entries changed:")
print(next_five)""",
    ),
]

NOTEBOOKS["04_leases_and_claims"] = [
    (
        "md",
        """\
# 04 · Leases and claims: who may touch what, and when

Merging is not always what you want: two agents rewriting one source file, or doing the
same work item twice, is wasted (or harmful) work. For that a store has **leases**:
exclusive, all-or-nothing, FIFO per resource, with a TTL renewed in the background and a
**fencing token** that strictly increases per resource. A `claim` is a lease on a work item
(`item:<collection>/<id>`) plus an entry in the map `claims` that every agent sees.

Here several agents (asyncio tasks in this one process) share one SQLite store in a temporary
folder. Each phase below opens the store anew; leases, tokens and the journal live in the
file, so they carry over. Every request, grant and release is timestamped for the Gantt
chart at the end.""",
    ),
    (
        "code",
        """\
%matplotlib inline
import asyncio
import tempfile
import time
from pathlib import Path

import crdtstore

folder = tempfile.TemporaryDirectory()
URL = f"sqlite:///{Path(folder.name) / 'store.db'}"
RUN = "leases-demo"
T0 = time.monotonic()
spans = []  # (agent, resource label, kind "wait" | "hold", start, end, token)


def now():
    return time.monotonic() - T0


def show(status):
    \"\"\"Holders and waiters, in rank (arrival) order.\"\"\"
    rows = [("holder", i) for i in status.holders] + [("waiter", i) for i in status.waiters]
    print(f"{'':7} {'rank':>4}  {'owner':8} {'token':>5}  {'blocked by':10}  resources")
    for role, i in sorted(rows, key=lambda r: r[1].rank):
        blocked = ",".join(map(str, i.blocked_by)) or "-"
        token = "-" if i.token is None else i.token
        resources = ", ".join(i.resources)
        print(f"{role:7} {i.rank:>4}  {i.owner:8} {token:>5}  {blocked:10}  {resources}")""",
    ),
    (
        "md",
        """\
## A FIFO queue

`alice` holds `src/app.py`. Then, in this order, `bob` asks for `src/app.py`, `carol` for
`src/app.py` *and* `src/util.py` (all or nothing), and `erin` for `src/util.py` alone. Each
one holds what it gets for 0.3 s, then releases it.""",
    ),
    (
        "code",
        """\
async def worker(store, agent, resources, granted=None, hold=0.3):
    asked = now()
    async with store.lease(resources, ttl=2, owner=agent) as lease:
        got = now()
        if granted is not None:
            granted.set()
        await asyncio.sleep(hold)
    done = now()
    for res in resources:
        spans.append((agent, res, "wait", asked, got, None))
        spans.append((agent, res, "hold", got, done, lease.token))
    return lease.token


async def until_waiting(store, n):
    \"\"\"Wait until ``n`` requests are queued (so that the arrival order is the one we want).\"\"\"
    for _ in range(200):
        if len((await store.leases.status()).waiters) >= n:
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"{n} waiters never showed up")


async with crdtstore.open_store(URL) as store:
    alice_in = asyncio.Event()
    tasks = [asyncio.create_task(worker(store, "alice", ["src/app.py"], alice_in))]
    await alice_in.wait()
    arrivals = [
        ("bob", ["src/app.py"]),
        ("carol", ["src/app.py", "src/util.py"]),
        ("erin", ["src/util.py"]),
    ]
    for n, (agent, resources) in enumerate(arrivals, start=1):
        tasks.append(asyncio.create_task(worker(store, agent, resources)))
        await until_waiting(store, n)
    queue = await store.leases.status()
    tokens = await asyncio.gather(*tasks)
    after = await store.leases.status()

show(queue)""",
    ),
    (
        "md",
        """\
`blocked by` gives the ranks each waiter waits behind. `erin` waits although nobody holds
`src/util.py`: `carol`, who came first, wants it too, and a waiting request reserves its
resources against every later one. So nobody starves, and since a request only ever waits on
earlier ones, there is no deadlock. The grants came in that order, each with a new token:""",
    ),
    (
        "code",
        """\
for agent, token in zip(["alice", "bob", "carol", "erin"], tokens, strict=True):
    print(f"{agent:6} token {token}")
print("left in the queue:", len(after.holders) + len(after.waiters))""",
    ),
    (
        "md",
        """\
## A holder that stalls, and fencing

`frank` takes `src/util.py` with a short TTL (0.5 s) and writes under it: a *fenced* write,
`rec.map("files").set(path, value, lease=lease)`, checked in the same transaction as the
write. Then `frank` calls a blocking tool (`time.sleep(1.5)`): the whole event loop stops,
heartbeats included. His grant expires, it is reaped, and `grace`, who was waiting, gets the
file with a newer token. When `frank` wakes up he still has his `Lease` object and tries to
write again: the store refuses it (`LeaseLost`), so the stale write never lands.""",
    ),
    (
        "code",
        """\
async with (
    crdtstore.open_store(URL) as store,
    store.open_record(RUN, "frank") as frank_rec,
    store.open_record(RUN, "grace") as grace_rec,
):
    grace_in = asyncio.Event()

    async def grace():
        asked = now()
        async with store.lease(["src/util.py"], ttl=5, owner="grace") as lease:
            got = now()
            grace_in.set()
            value = {"by": "grace", "lines": 80}
            await grace_rec.map("files").set("src/util.py", value, lease=lease)
            await asyncio.sleep(0.3)
        spans.append(("grace", "src/util.py", "wait", asked, got, None))
        spans.append(("grace", "src/util.py", "hold", got, now(), lease.token))

    old = await store.lease(["src/util.py"], ttl=0.5, owner="frank").acquire()
    frank_got = now()
    await frank_rec.map("files").set("src/util.py", {"by": "frank", "lines": 40}, lease=old)
    print(f"frank holds src/util.py, token {old.token}; his first write is in")
    waiting = asyncio.create_task(grace())
    await until_waiting(store, 1)
    time.sleep(1.5)  # a blocking call: no heartbeat for 1.5 s, the TTL is 0.5 s
    frank_stalled = now()
    await asyncio.wait_for(grace_in.wait(), 10)
    during = await store.leases.status()
    show(during)
    try:
        await frank_rec.map("files").set("src/util.py", {"by": "frank", "lines": 41}, lease=old)
        print("frank's stale write went through (it should not have)")
    except crdtstore.LeaseLost as exc:
        print(f"\\nfrank's stale write with token {old.token} was refused: {exc}")
    try:
        await old.release()
    except crdtstore.LeaseLost:
        print("frank's release reports the loss too: lost =", old.lost)
    spans.append(("frank", "src/util.py", "hold", frank_got, frank_stalled, old.token))
    await waiting
    await grace_rec.sync()
    print("\\nfiles['src/util.py'] =", grace_rec.map("files").get("src/util.py"),
          "| written by", grace_rec.map("files").provenance("src/util.py").agent)""",
    ),
    (
        "md",
        """\
## Claims: each work item done once

Three agents go through the same list of six tasks. `rec.claim("tasks", id)` takes an item
or raises `LeaseHeld` at once (someone is on it, or it is already done); the agent then moves
on to the next one. `claim.complete(result=...)` records the result in the map `claims`
(a fenced write) and releases the item. Who gets which task depends on timing; that every
task is done exactly once does not.""",
    ),
    (
        "code",
        """\
TASKS = [f"t{i}" for i in range(1, 7)]
attempts = []  # (agent, task, outcome)

async with (
    crdtstore.open_store(URL) as store,
    store.open_record(RUN, "ana") as r1,
    store.open_record(RUN, "ben") as r2,
    store.open_record(RUN, "cleo") as r3,
):

    async def agent(rec):
        for n, task in enumerate(TASKS):
            try:
                claim = await rec.claim("tasks", task, ttl=5)
            except crdtstore.LeaseHeld:
                attempts.append((rec.agent, task, "held or done"))
                continue
            got = now()
            attempts.append((rec.agent, task, "claimed"))
            await asyncio.sleep(0.1 + 0.05 * (n % 3))  # the work
            await claim.complete(result={"ok": True, "by": rec.agent})
            spans.append((rec.agent, f"item:tasks/{task}", "hold", got, now(), claim.token))

    await asyncio.gather(agent(r1), agent(r2), agent(r3))
    await r1.sync()
    claims = r1.map("claims").to_dict()

for task in TASKS:
    c = claims[f"tasks/{task}"]
    ok = c["result"]["ok"]
    print(f"{task}: {c['state']:5} by {c['claimer']:5} (token {c['token']}), result ok={ok}")
done = [c["claimer"] for c in claims.values() if c["state"] == "done"]
print("tasks done:", len(done), "| claimed successfully:", sum(a[2] == "claimed" for a in attempts),
      "| turned away:", sum(a[2] != "claimed" for a in attempts))""",
    ),
    (
        "md",
        """\
## Who held what, over time

One lane per resource; a bar per grant, coloured by agent and labelled with its fencing
token; thin grey bars under a lane are time spent waiting in the queue. Hatched: the time
`frank` *believed* he held `src/util.py`: his grant had expired 0.5 s after he got it, and
`grace` got the file (with a newer token) as soon as the event loop ran again.""",
    ),
    (
        "code",
        """\
from matplotlib.figure import Figure

lanes = sorted({s[1] for s in spans}, key=lambda r: (r.startswith("item:"), r))
agents = sorted({s[0] for s in spans})
colours = {a: f"C{i}" for i, a in enumerate(agents)}
fig = Figure(figsize=(9, 4.5), layout="constrained")
ax = fig.add_subplot()
for agent, res, kind, start, end, token in spans:
    y = lanes.index(res)
    if kind == "wait":  # a thin bar just under the lane
        ax.broken_barh([(start, end - start)], (y + 0.38, 0.08), color="0.6")
        continue
    ax.broken_barh([(start, end - start)], (y - 0.35, 0.7), color=colours[agent],
                   alpha=0.85, edgecolor="k", linewidth=0.5)
    ax.text(start + (end - start) / 2, y, f"{agent}·{token}", ha="center", va="center", fontsize=7)
# what frank believed he held after his TTL ran out
believed = (frank_got + old.ttl, frank_stalled - frank_got - old.ttl)
ax.broken_barh([believed], (lanes.index("src/util.py") - 0.35, 0.7), facecolor="white",
               hatch="//", edgecolor=colours["frank"], alpha=0.9)
ax.set_yticks(range(len(lanes)), lanes)
ax.invert_yaxis()
ax.set_xlabel("seconds since the start of the notebook")
ax.set_title("lease grants per resource (label: agent·token); grey: waiting")
fig""",
    ),
]

NOTEBOOKS["05_real_processes"] = [
    (
        "md",
        """\
# 05 · Real processes: the demo, and its journal afterwards

The earlier notebooks ran agents inside one process. `crdtstore demo` starts real agent
processes (`python -m crdtstore._demo`) on one SQLite file. Each agent appends findings to a
list, sets its own keys in a map, overwrites three keys that all of them write, and inserts
lines into a shared text; each write is acknowledged only once it is in the journal. The demo
then checks that every acknowledged write is in the merged record (its last lines below).

Here we run it with three agents, then read what they left behind with the public API:
`store.journal`, `store.history` and the provenance of a record's values.""",
    ),
    (
        "code",
        """\
%matplotlib inline
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import crdtstore
from crdtstore import sim

folder = tempfile.TemporaryDirectory()
RUN = "demo-notebook"
command = [sys.executable, "-m", "crdtstore.cli", "demo", "--agents", "3", "--writes", "20",
           "--store", folder.name, "--run", RUN]
plain = {**os.environ, "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "100"}
plain.pop("FORCE_COLOR", None)
done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=plain)
assert done.returncode == 0, done.stderr[-2000:]
lines = re.sub(r"\\x1b\\[[0-9;]*m", "", done.stdout).splitlines()
print("\\n".join(line for line in lines if line.startswith(("✓", "VERIFIED"))))""",
    ),
    (
        "md",
        """\
## The journal

Every local transaction of every process is one journal entry: who (agent, source), when
(`wall_time`), its size, and its *effect*, the operations as JSON. We read them all (in
pages of 1000) and count them per agent and per collection.""",
    ),
    (
        "code",
        """\
URL = f"sqlite:///{Path(folder.name) / 'store.db'}"
async with crdtstore.open_store(URL) as store:
    print([(r.run, r.head) for r in await store.runs()])
    entries = []
    while batch := await store.journal(RUN, after=entries[-1].seq if entries else 0):
        entries += batch
    hypothesis = await store.history(RUN, "shared", "hypothesis")
    async with store.open_record(RUN, "reader", "user", create=False) as rec:
        shared = {k: (v, rec.map("shared").provenance(k)) for k, v in rec.map("shared").items()}
        tree = sim.record_tree(rec, width=40)

per_agent = Counter(e.agent for e in entries)
per_collection = Counter(op[1] for e in entries for op in e.effect)
print(len(entries), "entries;", dict(sorted(per_agent.items())))
print("operations per collection:", dict(sorted(per_collection.items())))
first = entries[0]
print(f"\\nentry {first.seq}: {first.agent} ({first.source}), {first.size} bytes", first.effect)""",
    ),
    (
        "md",
        """\
The processes write at the same time, so their entries interleave in the journal (how
evenly depends on the operating system's scheduler: with more processes than cores, one may
wait its turn for a while). Left, the number of entries per agent over time; right, each
entry as a dot, one lane per agent, coloured by the collection it touched.""",
    ),
    (
        "code",
        """\
from matplotlib.figure import Figure

t0 = entries[0].wall_time
agents = sorted(per_agent)
collections = sorted(per_collection)
fig = Figure(figsize=(10, 3.5), layout="constrained")
left, right = fig.subplots(1, 2)
for agent in agents:
    times = [(e.wall_time - t0) * 1000 for e in entries if e.agent == agent]
    left.step(times, range(1, len(times) + 1), where="post", label=agent)
left.set_xlabel("ms since the first entry")
left.set_ylabel("journal entries")
left.legend()
for i, name in enumerate(collections):
    pts = [((e.wall_time - t0) * 1000, agents.index(e.agent)) for e in entries
           if any(op[1] == name for op in e.effect)]
    right.scatter([p[0] for p in pts], [p[1] for p in pts], s=18, color=f"C{i}", label=name)
right.set_yticks(range(len(agents)), agents)
right.set_ylim(-0.5, len(agents) - 0.5)
right.set_xlabel("ms since the first entry")
right.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
fig""",
    ),
    (
        "md",
        """\
## Who won, and what the losers wrote

Every agent overwrote the three `shared` keys; last writer wins per key. The record keeps the
provenance of the value that won (agent, journal position), and `store.history` every value
the key held, the losing writes included.""",
    ),
    (
        "code",
        """\
for key, (value, prov) in sorted(shared.items()):
    print(f"shared[{key!r}] = {value['says']!r}: {prov.agent}, journal position {prov.seq}")
print(f"\\nhistory of shared['hypothesis'] ({len(hypothesis)} writes):")
for h in hypothesis:
    print(f"  #{h.provenance.seq:>3} {h.provenance.agent}: {h.value['says']}")""",
    ),
    (
        "md",
        """\
The merged record as a tree, with the provenance of every map key (the list and the text
hold every agent's contributions):""",
    ),
    ("code", "print(tree)"),
]


NOTEBOOKS["06_through_a_hub"] = [
    (
        "md",
        """\
# 06 · Through a hub: agents that do not share a file

Agents on other hosts (or in containers, or untrusted) cannot open the run's SQLite file.
They connect to a **hub** (`crdtstore serve`), which holds the store and shares each run's
record over WebSockets. A Python agent opens `ws://host:port/<tenant>` with a token and gets
the same `Record` API; a JavaScript agent uses the stock `y-websocket` client.

Here we start a real hub process, give three agents tokens, and watch:

1. concurrent writes merging, with provenance taken from the *token*, not from what the agent
   claims;
2. a read-only token refused before anything changes;
3. how long a write takes to reach another agent through the hub;
4. the hub killed with `kill -9` while an agent keeps writing, then restarted: nothing
   acknowledged is lost, and the offline writes arrive.""",
    ),
    (
        "code",
        """\
%matplotlib inline
import contextlib
import os
import queue
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import anyio

import crdtstore
import sync

folder = tempfile.TemporaryDirectory()
STORE = f"sqlite:///{Path(folder.name) / 'hub.db'}"
SECRET = secrets.token_hex(32)  # the hub refuses to start without a signing secret
env = {**os.environ, "CRDTSTORE_SECRET": SECRET}


def start_hub(port=0):
    \"\"\"`python -m sync` (= `crdtstore serve`) on STORE; returns the process and its port
    once it says (on stderr, where it also logs) that it listens.\"\"\"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sync", "--store", STORE, "--host", "127.0.0.1",
         "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr], daemon=True).start()
    deadline = time.monotonic() + 30
    while (left := deadline - time.monotonic()) > 0:
        line = lines.get(timeout=left)
        if "listening on ws://" in line:
            return proc, int(line.rsplit(":", 1)[1])
    proc.kill()
    raise RuntimeError("the hub did not start")


hub, PORT = start_hub()
URL = f"ws://127.0.0.1:{PORT}/lab"
print("hub pid", hub.pid, "serving", URL)""",
    ),
    (
        "md",
        """\
## Tokens

The operator mints a token per agent (`crdtstore token --tenant lab --run notebook --agent
alice --rw` on the command line; here the same with `sync.mint`). The token names the
tenant, the run (or a prefix), the agent, read-write or read-only, and an expiry; it is
signed with the hub's secret, so an agent cannot change what it says.""",
    ),
    (
        "code",
        """\
RUN = "notebook"


def token(agent, mode="rw"):
    claims = sync.TokenClaims(tenant="lab", run=RUN, agent=agent, mode=mode,
                              exp=int(time.time()) + 3600, jti=secrets.token_hex(8))
    return sync.mint(SECRET.encode(), claims)


tokens = {name: token(name) for name in ("alice", "bob", "carol")}
print(tokens["alice"][:60] + "...")""",
    ),
    (
        "md",
        """\
## Three agents, concurrent writes

Each agent opens its own `ws://` store and record (each has its own connection to the hub).
They write at the same time: findings appended to `log`, their own key in `status`, and all
three overwrite `shared["lead"]`. Bob *claims* to be `"mallory"` when he opens the record:
the hub ignores that and journals his writes as the token's agent.

`await rec.flush()` returns once the hub has journaled everything the record wrote.""",
    ),
    (
        "code",
        """\
@contextlib.asynccontextmanager
async def agents(*names, claims=None):
    \"\"\"A record per agent, each on its own ws:// store (its own connection to the hub).
    (Opened and closed within one cell: Jupyter runs each cell in a task of its own.)\"\"\"
    async with contextlib.AsyncExitStack() as stack:
        recs = {}
        for name in names:
            store = await stack.enter_async_context(
                crdtstore.open_store(URL, token=tokens[name]))
            claimed = (claims or {}).get(name, name)
            recs[name] = await stack.enter_async_context(store.open_record(RUN, claimed))
        yield recs


async def work(name, rec):
    for i in range(20):
        await rec.list("log").append({"by": name, "finding": i})
        if i % 5 == 0:
            await rec.map("status").set(name, f"step {i}")
            await rec.map("shared").set("lead", name)
    await rec.flush()


async with agents("alice", "bob", "carol", claims={"bob": "mallory"}) as recs:
    async with anyio.create_task_group() as tg:
        for name, rec in recs.items():
            tg.start_soon(work, name, rec)
    heads = [await rec.sync() for rec in recs.values()]  # each reads the journal to its head
    views = [rec.to_dict() for rec in recs.values()]
    prov = recs["alice"].map("shared").provenance("lead")
    entries = await recs["alice"].journal(limit=1000)

print("journal heads:", heads, "| every agent sees the same record:",
      all(v == views[0] for v in views))
print("log entries:", len(views[0]["log"]), "| status:", views[0]["status"])
print(f"shared['lead'] = {views[0]['shared']['lead']!r}, written by {prov.agent} "
      f"(journal position {prov.seq})")
print("agents in the journal:", sorted({e.agent for e in entries}))""",
    ),
    (
        "md",
        """\
Every append survived (3 x 20), each agent's own key holds its last write, and one of the
three `lead` writes won. No entry names `mallory`: the agent in provenance is the token's.

## A read-only token

A read-only token may read the record; its writes are refused *before* the local document
changes, with a typed error (`ReadOnlyAccess`, code `READ_ONLY`).""",
    ),
    (
        "code",
        """\
async with crdtstore.open_store(URL, token=token("dana", "ro")) as store:
    async with store.open_record(RUN, "dana") as reader:
        before = reader.to_dict()
        try:
            await reader.map("status").set("dana", "sneaky")
        except crdtstore.ReadOnlyAccess as exc:
            print(type(exc).__name__, exc.code, "|", exc)
        print("unchanged:", reader.to_dict() == before,
              "| sees", len(before["log"]), "log entries")""",
    ),
    (
        "md",
        """\
## Propagation through the hub

Alice sets a key; Bob's change stream (`rec.changes()`) tells us when it arrived. The path
is: Alice's record → hub (journals it) → push to Bob's connection → Bob reads the entry.
Timed over 200 writes, one at a time, on this machine's loopback.""",
    ),
    (
        "code",
        """\
from matplotlib.figure import Figure

delays = []
async with agents("alice", "bob") as recs:
    alice, bob = recs["alice"], recs["bob"]
    async with bob.changes(local=False) as stream:
        for i in range(200):
            t0 = time.perf_counter()
            await alice.map("ping").set("n", i)
            with anyio.fail_after(10):
                async for change in stream:
                    if change.collection == "ping" and bob.map("ping").get("n") == i:
                        break
            delays.append((time.perf_counter() - t0) * 1000)

delays.sort()
p50, p99 = delays[len(delays) // 2], delays[int(len(delays) * 0.99) - 1]
print(f"write -> visible to another agent: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
fig = Figure(figsize=(7, 2.8), layout="constrained")
ax = fig.subplots()
ax.hist(delays, bins=40, color="C0")
ax.axvline(p50, color="k", ls="--", lw=1, label=f"p50 {p50:.1f} ms")
ax.set_xlabel("ms from Alice's write to Bob's record")
ax.set_ylabel("writes")
ax.legend()
fig""",
    ),
    (
        "md",
        """\
## The hub dies

`kill -9` the hub. Alice keeps writing: her writes go into her record at once and wait to be
journaled (her record reconnects with backoff in the background). Then the hub is started
again on the same store and port. `flush()` returns once the hub holds all of Alice's writes;
Bob's record reconnects too and sees them.""",
    ),
    (
        "code",
        """\
async with agents("alice", "bob") as recs:
    alice, bob = recs["alice"], recs["bob"]
    journaled_before = await alice.sync()
    hub.send_signal(signal.SIGKILL)
    hub.wait()

    for i in range(30):  # offline: nothing here waits for the hub
        await alice.list("log").append({"by": "alice", "offline": i})
    print("alice holds", len(alice.list("log")), "log entries; the hub is down")

    hub, _ = start_hub(PORT)
    with anyio.fail_after(60):
        await alice.flush()  # returns when the restarted hub journaled all 30
        while len(bob.list("log")) < len(alice.list("log")):
            await bob.sync()
            await anyio.sleep(0.01)
    print("after the restart: bob sees", len(bob.list("log")), "log entries;",
          "same record:", bob.to_dict() == alice.to_dict())
    after = await bob.journal(after=journaled_before, limit=1000)
print(sum(e.agent == "alice" for e in after), "entries journaled for alice after the kill")

hub.send_signal(signal.SIGTERM)
print("hub exit status", hub.wait(timeout=30))
folder.cleanup()""",
    ),
    (
        "md",
        """\
## What to take away

- A `ws://` store gives remote agents the same `Record` as the embedded store; `flush()`
  means *journaled by the hub*, a sync status the Yjs ecosystem does not have.
- Identity comes from the token: provenance cannot be forged by the client.
- Read-only is enforced before anything changes.
- The hub can die at any moment: agents keep working, reconnect by themselves, and their
  writes are journaled once it is back. Plain Yjs clients (`y-websocket`) join the same runs;
  `tests/test_interop.py` runs the real JavaScript client against the hub.""",
    ),
]

from _nb07 import CELLS as NB07_CELLS  # noqa: E402  (the cells of 07 live in notebooks/_nb07.py)

NOTEBOOKS["07_agent_tools"] = NB07_CELLS


def kernel_manager(spec_root: Path) -> KernelManager:
    """A kernel manager that runs this interpreter (the venv's) whatever kernelspecs the
    machine has: a private kernelspec pointing at ``sys.executable``."""
    spec = spec_root / "kernels" / "crdtstore-venv"
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"})
    )
    ksm = KernelSpecManager(kernel_dirs=[str(spec_root / "kernels")])
    return KernelManager(kernel_name="crdtstore-venv", kernel_spec_manager=ksm)


def execute(nb: nbformat.NotebookNode, spec_root: Path) -> None:
    """Execute ``nb`` in place (cwd: this folder); raises on the first failing cell."""
    client = NotebookClient(
        nb,
        km=kernel_manager(spec_root),
        timeout=CELL_TIMEOUT,
        record_timing=False,
        resources={"metadata": {"path": str(HERE)}},
    )
    client.execute()


def build(name: str, cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    for i, (kind, source) in enumerate(cells):
        cell = (nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell)(
            source
        )
        cell["id"] = f"{name[:2]}-{i:02d}"  # stable ids: rebuilding changes only what changed
        nb.cells.append(cell)
    return nb


def main(argv: list[str]) -> int:
    selected = [n for n in NOTEBOOKS if not argv or any(n.startswith(a) for a in argv)]
    with tempfile.TemporaryDirectory() as tmp:
        for name in selected:
            nb = build(name, NOTEBOOKS[name])
            start = time.perf_counter()
            execute(nb, Path(tmp))
            elapsed = time.perf_counter() - start
            nbformat.validate(nb)
            nbformat.write(nb, HERE / f"{name}.ipynb")
            print(f"{name}.ipynb: executed in {elapsed:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
