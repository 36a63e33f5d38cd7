"""Provenance of list items and text spans under random delivery (issue 19 part 3).

2-6 pure replicas write list appends/inserts/deletes and text edits, commit them to one
simulated journal at random times and take in its entries at random times (partitions:
a replica that does not read for a while; duplication: entries taken in again). Each
replica writes text from its own alphabet and list values unique to it, so the author of
every item and character is known from its content. At the end: every replica converges, no
item is lost, and per-item and per-span provenance is the same on every replica, names the
right writer, and survives a resume (bulk replay) and a compaction (snapshot state + tail).
A relay journals merged updates of recent entries again (items the journal holds already):
they stay attributed to the entry that first brought them.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from crdtstore._journal import Op, Row, checksum
from crdtstore.record import BulkLoad, Replica, tree_merge
from crdtstore.record._item_provenance import item_id, text_authorship
from crdtstore.record._provenance import Meta

ALPHABETS = ("abé", "DE😀", "ghß", "JKΩ", "mnoü", "PQ€")  # each with a multi-byte character


class Sim:
    """Replicas and one journal (rows in journal order)."""

    def __init__(self, n: int) -> None:
        self.replicas = [Replica() for _ in range(n)]
        self.pending: list[list[tuple[bytes, list[Op], Meta]]] = [[] for _ in range(n)]
        self.read_to = [0] * n
        self.own: list[set[int]] = [set() for _ in range(n)]  # journal positions of each
        self.rows: list[Row] = []
        self.appended: dict[str, int] = {}  # list value -> its writer
        self.counter = 0

    def meta(self, i: int) -> Meta:
        return Meta(f"agent{i}", "model" if i % 2 else "tool", float(len(self.rows)), None)

    def write(self, i: int, kind: str, pos: int, size: int) -> None:
        r = self.replicas[i]
        meta = self.meta(i)
        if kind in ("append", "insert", "ldel"):
            root = r.root("log", "list")
            n = len(root)
            if kind == "ldel":
                if not n:
                    return
                at, count = pos % n, 1 + size % min(2, n - pos % n)
                ops: list[Op] = [["list", "log", "del", at, count]]

                def apply() -> None:
                    del root[at : at + count]
            else:
                self.counter += 1
                value = f"r{i}-{self.counter}"
                self.appended[value] = i
                at = n if kind == "append" else pos % (n + 1)
                ops = [["list", "log", "ins", at, [value]]]

                def apply() -> None:
                    root.insert(at, value)
        else:
            root = r.root("notes", "text")
            text = str(root)
            at = pos % (len(text) + 1)
            if kind == "tdel":
                if at == len(text):
                    return
                count = 1 + size % (len(text) - at)
                start = len(text[:at].encode())
                stop = len(text[: at + count].encode())
                ops = [["text", "notes", "del", at, count]]

                def apply() -> None:
                    del root[start:stop]
            else:
                alphabet = ALPHABETS[i]
                piece = "".join(alphabet[(pos + k) % len(alphabet)] for k in range(1 + size))
                start = len(text[:at].encode())
                ops = [["text", "notes", "ins", at, piece]]

                def apply() -> None:
                    root.insert(start, piece)

        update = r.local(ops, apply, meta)
        if update is not None:
            self.pending[i].append((update, ops, meta))

    def commit(self, i: int) -> None:
        """Replica ``i`` journals its pending entries (after what it has read: causal)."""
        r = self.replicas[i]
        for update, ops, meta in self.pending[i]:
            seq = len(self.rows) + 1
            agent, source, wall = meta.agent, meta.source, meta.wall_time
            # odd replicas' entries are labelled with another client id, as a hub labels a
            # foreign update it journals: readers decode their exact ranges
            label = r.client_id if i % 2 == 0 else 0
            self.rows.append(Row(seq, agent, source, label, wall, update, ops, checksum(update)))
            self.own[i].add(seq)
            r.journaled(ops, meta, seq)
        self.pending[i] = []

    def resend(self, k: int) -> None:
        """A relay journals the merged updates of the last ``k`` entries again (as a Yjs
        client's sync step 2 may carry items the journal holds): first entry wins."""
        if not self.rows:
            return
        recent = self.rows[-(k + 1) :]
        update = tree_merge([row.update for row in recent])
        effect = [op for row in recent for op in row.effect]
        seq = len(self.rows) + 1
        self.rows.append(Row(seq, "relay", "system", 0, 0.0, update, effect, checksum(update)))

    def read(self, i: int, again: int = 0) -> None:
        """Replica ``i`` takes in the journal's new entries (and ``again`` old ones)."""
        r = self.replicas[i]
        start = max(0, self.read_to[i] - again)
        rows = [row for row in self.rows[start:] if row.seq not in self.own[i]]
        r.apply_rows(rows)
        self.read_to[i] = len(self.rows)


def provenance_of(r: Replica) -> tuple[list[Any], list[Any], list[Any]]:
    root = r.root("log", "list")
    items = []
    for i in range(len(root)):
        ident = item_id(root, i)
        meta = None if ident is None else r.items.meta(*ident)
        items.append(None if meta is None else (meta.agent, meta.source, meta.seq))
    spans = [
        (s, e, t, None if p is None else (p.agent, p.source, p.seq))
        for s, e, t, p in text_authorship(r.root("notes", "text"), r.items, "run")
    ]
    return r.read("log", "list"), items, spans


step = st.tuples(
    st.sampled_from(
        ["append", "insert", "ldel", "tins", "tins", "tdel", "commit", "read", "resend"]
    ),
    st.integers(0, 5),
    st.integers(0, 1000),
    st.integers(0, 4),
)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 6),
    steps=st.lists(step, min_size=1, max_size=40),
    cut=st.integers(0, 10_000),
    seed=st.integers(0, 2**32),
)
def test_item_and_span_provenance_converge_and_survive_resume_and_compaction(
    n: int, steps: list[tuple[str, int, int, int]], cut: int, seed: int
) -> None:
    sim = Sim(n)
    for kind, who, pos, size in steps:
        i = who % n
        if kind == "commit":
            sim.commit(i)
        elif kind == "read":
            sim.read(i, again=size)  # (size: entries delivered again, duplicates)
        elif kind == "resend":
            sim.resend(size)
        else:
            sim.write(i, kind, pos, size)
    for i in range(n):
        sim.commit(i)
    for i in range(n):
        sim.read(i, again=2)

    states = [provenance_of(r) for r in sim.replicas]
    values, items, spans = states[0]
    for i, state in enumerate(states):
        assert state == states[0], f"replica {i} differs"
        assert sim.replicas[i].to_dict() == sim.replicas[0].to_dict()
    # no item lost (deletes aside): every value is there once, or was deleted
    assert max(Counter(values).values(), default=1) == 1
    assert set(values) <= set(sim.appended)
    # the right writer: a list value's, a character's alphabet
    by_seq = {row.seq: row for row in sim.rows}
    for value, prov in zip(values, items, strict=True):
        assert prov is not None and prov[0] == f"agent{sim.appended[value]}"
        assert value in json.dumps(by_seq[prov[2]].effect)
    text = sim.replicas[0].read("notes", "text")
    assert "".join(t for _, _, t, _ in spans) == text
    for _, _, piece, prov in spans:
        assert prov is not None and prov[2] is not None
        writer = int(prov[0].removeprefix("agent"))
        assert set(piece) <= set(ALPHABETS[writer]), (piece, prov)

    # resume: a bulk replay of the whole journal, in groups of random size
    resumed = Replica()
    bulk = BulkLoad(resumed)
    rnd = random.Random(seed)
    at = 0
    while at < len(sim.rows):
        size = rnd.randint(1, 40)
        bulk.feed(sim.rows[at : at + size])
        at += size
    bulk.finish()
    assert provenance_of(resumed) == states[0]

    # compaction: a snapshot of a prefix (its update and exported state, through JSON),
    # then the journal's tail applied one by one
    k = cut % (len(sim.rows) + 1)
    compactor = Replica()
    compactor.apply_rows(sim.rows[:k])
    snapshot = tree_merge([row.update for row in sim.rows[:k]])
    state = json.loads(json.dumps(compactor.export_state()))
    opened = Replica()
    opened.apply_update(snapshot)
    opened.import_state(state)
    opened.apply_rows(sim.rows[k:])
    assert provenance_of(opened) == states[0]
