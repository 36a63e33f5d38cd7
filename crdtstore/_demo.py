"""The agent process of ``crdtstore demo``, and the check that nothing it acknowledged was lost.

Run as ``python -m crdtstore._demo --store URL --run RUN --agent NAME --writes N``: a real
process per agent, so the demo shows what the store promises across processes (every
acknowledged write survives, every agent converges), not what one event loop can fake. The
agent talks to its parent through stdout, one JSON object per line (the steps:
:func:`run_agent`); :func:`verify` is the parent's check of the acknowledged writes against
the record and its journal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread

from ._journal import Durability
from ._store import Store, open_store
from .record._record import Record

FINDINGS = "findings"
STATUS = "status"
SHARED = "shared"
NOTES = "notes"
SHARED_KEYS = ("hypothesis", "next-step", "blocker")
KINDS = ("finding", "own", "shared", "note")

_TOPICS = (
    "the cache is cold on the first request",
    "retries hide a timeout in the client",
    "the index is rebuilt on every start",
    "two workers read the same queue item",
    "the config default differs from the docs",
    "a flaky test depends on wall-clock time",
    "the build pulls an unpinned dependency",
    "log lines are dropped under load",
)

_NOTES = (
    "cache cold",
    "retry budget low",
    "index rebuilt",
    "queue read twice",
    "config drift",
    "clock-bound test",
    "unpinned dep",
    "logs dropped",
)


def record_digest(data: dict[str, Any]) -> str:
    """A digest of a record's contents (``Record.to_dict()``), equal across equal replicas."""
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# -- the agent --------------------------------------------------------------------------------


def _say(obj: dict[str, Any]) -> None:
    # one write() per line, so the parent never reads half a line
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def _expect(word: str) -> None:
    line = await anyio.to_thread.run_sync(sys.stdin.readline)
    if line.strip() != word:
        raise SystemExit(f"expected {word!r} on stdin, got {line!r}")


async def run_agent(
    url: str, run: str, agent: str, writes: int, durability: Durability, seed: str
) -> None:
    """Open the record as ``agent``, make ``writes`` writes, acknowledging each once it is in
    the journal, then report the digest of the converged record.

    The agent talks to its parent through stdout, one JSON object per line, written whole and
    flushed at once:

    - ``{"type": "ready"}`` once the record is open; the agent then waits for ``go`` on stdin,
      so that every agent starts writing at the same moment;
    - ``{"type": "ack", ...}`` for every write, *after* it is in the journal: a ``durable``
      record returns from a write once it is committed with ``synchronous=FULL``, a
      ``batched`` one is flushed first;
    - ``{"type": "written"}`` when all writes are acknowledged; the agent then waits for
      ``check`` on stdin (sent once every agent has written), reads the journal up to its head
      and reports ``{"type": "state", "digest": ...}``: a digest of its whole record, which
      must be the same in every agent and in the parent (convergence);
    - errors go to stderr and the exit status is non-zero.

    The writes, cycling over four kinds until ``writes`` are done:

    1. ``findings`` (a list): append ``{"agent", "n", "text"}``;
    2. ``status`` (a map): the agent's own keys ``AGENT:progress`` and ``AGENT:last`` in one
       update;
    3. ``shared`` (a map): one of :data:`SHARED_KEYS`, written by every agent (last writer
       wins; the losers stay in the key's history);
    4. ``notes`` (a text): after ``sync()``, the agent inserts a line of its own at a random
       line boundary of the current text and hands the whole new text to ``edit()``, which
       turns it into character edits, so the lines that other agents inserted concurrently
       survive.
    """
    rng = random.Random(f"{seed}/{agent}")
    async with (
        open_store(url) as store,
        store.open_record(run=run, agent=agent, source="model", durability=durability) as rec,
    ):
        findings, status, shared, notes = (
            rec.list(FINDINGS),
            rec.map(STATUS),
            rec.map(SHARED),
            rec.text(NOTES),
        )
        _say({"type": "ready", "agent": agent})
        await _expect("go")
        started = time.perf_counter()
        made = {kind: 0 for kind in KINDS}
        last: str | None = None  # the text of this agent's latest finding
        for j in range(writes):
            kind = KINDS[j % len(KINDS)]
            n = made[kind]
            made[kind] += 1
            acks: list[dict[str, Any]]
            if kind == "finding":
                text = f"{agent}: {rng.choice(_TOPICS)} (#{n})"
                await findings.append({"agent": agent, "n": n, "text": text})
                acks = [{"n": n, "text": text}]
                last = text
            elif kind == "own":
                values = {f"{agent}:progress": f"{j + 1}/{writes}", f"{agent}:last": last}
                await status.update(values)
                acks = [{"key": k, "value": v} for k, v in values.items()]
            elif kind == "shared":
                key = SHARED_KEYS[n % len(SHARED_KEYS)]
                value = {"agent": agent, "n": n, "says": rng.choice(_TOPICS)}
                await shared.set(key, value)
                acks = [{"key": key, "value": value}]
            else:
                await rec.sync()  # see the lines the others have added so far
                line = f"- [{agent}] note {n}: {rng.choice(_NOTES)}"
                lines = notes.read().splitlines(keepends=True)
                at = rng.randint(0, len(lines))
                await notes.edit("".join([*lines[:at], line + "\n", *lines[at:]]))
                acks = [{"line": line}]
            if durability == "batched":
                await rec.flush()  # the durability barrier: only now is the write acknowledged
            for ack in acks:
                _say({"type": "ack", "agent": agent, "kind": kind, "write": j + 1, **ack})
        _say({"type": "written", "agent": agent, "seconds": time.perf_counter() - started})
        await _expect("check")
        seq = await rec.sync()
        _say({"type": "state", "agent": agent, "seq": seq, "digest": record_digest(rec.to_dict())})


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m crdtstore._demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--store", required=True, help="store URL")
    p.add_argument("--run", required=True)
    p.add_argument("--agent", required=True)
    p.add_argument("--writes", type=int, default=50)
    p.add_argument("--durability", choices=["durable", "batched"], default="durable")
    p.add_argument("--seed", default="demo")
    args = p.parse_args(argv)
    anyio.run(run_agent, args.store, args.run, args.agent, args.writes, args.durability, args.seed)


# -- the check ----------------------------------------------------------------------------------


@dataclass
class Verification:
    """What :func:`verify` found. ``lost`` is empty when every acknowledged write is there."""

    checked: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    lost: list[str] = field(default_factory=list)
    replay_matches: bool = False

    @property
    def total(self) -> int:
        return sum(self.checked.values())

    @property
    def ok(self) -> bool:
        return not self.lost and self.replay_matches


async def verify(store: Store, rec: Record, acks: Iterable[dict[str, Any]]) -> Verification:
    """Check every acknowledged write (``ack`` lines of the agents) against the record ``rec``
    (opened after the agents finished) and its journal:

    - a finding is in the ``findings`` list;
    - an agent's own key holds the last value it acknowledged there (and that agent wrote it),
      and each earlier acknowledged value is in the key's history;
    - a value acknowledged on a shared key is its current value or in its history;
    - a note line is a line of the ``notes`` text;

    and that replaying the run's journal from scratch rebuilds the same record.
    """
    out = Verification()
    data = rec.to_dict()
    items = data.get(FINDINGS, [])
    found = {(f.get("agent"), f.get("n"), f.get("text")) for f in items if isinstance(f, dict)}
    status: dict[str, Any] = data.get(STATUS, {})
    shared: dict[str, Any] = data.get(SHARED, {})
    note_lines = set(str(data.get(NOTES, "")).splitlines())
    acks = list(acks)
    last_own: dict[str, tuple[str, Any]] = {}  # key -> (agent, value) of the last ack
    for ack in acks:
        if ack["kind"] == "own":
            last_own[ack["key"]] = (ack["agent"], ack["value"])
    histories: dict[tuple[str, str], list[tuple[str, Any]]] = {}

    async def history(collection: str, key: str) -> list[tuple[str, Any]]:
        got = histories.get((collection, key))
        if got is None:
            got = histories[(collection, key)] = [
                (h.provenance.agent, h.value)
                for h in await rec.history(collection, key)
                if not h.deleted
            ]
        return got

    for ack in acks:
        kind, agent = ack["kind"], ack["agent"]
        out.checked[kind] += 1
        if kind == "finding":
            if (agent, ack["n"], ack["text"]) not in found:
                out.lost.append(f"{agent}: finding #{ack['n']} is not in {FINDINGS!r}")
        elif kind == "own":
            key, value = ack["key"], ack["value"]
            if last_own[key] == (agent, value):
                prov = rec.provenance(STATUS, key)
                if status.get(key, ...) != value:
                    out.lost.append(
                        f"{agent}: {STATUS}[{key!r}] is {status.get(key)!r}, "
                        f"not the acknowledged {value!r}"
                    )
                elif prov is None or prov.agent != agent:
                    out.lost.append(
                        f"{agent}: {STATUS}[{key!r}] is attributed to "
                        f"{prov.agent if prov else None!r}"
                    )
            elif (agent, value) not in await history(STATUS, key):
                out.lost.append(
                    f"{agent}: {value!r} acknowledged for {STATUS}[{key!r}] is not in its history"
                )
        elif kind == "shared":
            key, value = ack["key"], ack["value"]
            if shared.get(key, ...) != value and (agent, value) not in await history(SHARED, key):
                out.lost.append(
                    f"{agent}: {value!r} acknowledged for {SHARED}[{key!r}] is "
                    "neither its value nor in its history"
                )
        elif ack["line"] not in note_lines:
            out.lost.append(f"{agent}: note line {ack['line']!r} is not in {NOTES!r}")
    replica = await store.replay(rec.run)
    out.replay_matches = record_digest(replica.to_dict()) == record_digest(data)
    return out


if __name__ == "__main__":
    main()
