"""The compact provenance index: journal positions per key, one table row per entry.

The replica keeps, per map key, the journal position of the entry that wrote the current value
(an int; the entry's :class:`Meta` while it is not journaled), a table of agent/source/time per
position, and, after bulk loads, the positions of big collections in sorted flat runs. These
tests pin that the compact forms answer exactly what a plain ``key -> Meta`` dict would.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import crdtstore
from crdtstore._journal import Op, Row, checksum
from crdtstore.record._provenance import Meta, _EntryTable, _Settled
from crdtstore.record._replica import Replica

AGENTS = ("alice", "bob", "carol")
SOURCES = ("model", "tool", "user")


class _Writer:
    """One writer's journal rows, each setting 1-3 keys of map ``m``, and the provenance
    each key must end with (the writer's later entries causally follow its earlier ones)."""

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.src = Replica()
        self.root = self.src.root("m", "map")
        self.seq = 0
        self.expected: dict[str, Meta] = {}

    def rows(self, n: int, keys: int) -> list[Row]:
        rnd, src, root = self.rnd, self.src, self.root
        out: list[Row] = []
        for _ in range(n):
            self.seq += 1
            seq = self.seq
            agent, source = rnd.choice(AGENTS), rnd.choice(SOURCES)
            run = rnd.choice(("", "", "nested"))
            wall = 1_700_000_000 + seq / 7
            ops: list[Op] = [
                ["map", "m", "set", f"k{rnd.randrange(keys)}", seq * 10 + i] for i in range(3)
            ][: rnd.randint(1, 3)]

            def apply(ops: list[Op] = ops) -> None:
                for op in ops:
                    root[op[3]] = op[4]

            update = src.local(ops, apply, Meta(agent, source, wall, None, run))
            assert update is not None
            out.append(
                Row(seq, agent, source, src.client_id, wall, update, ops, checksum(update), run)
            )
            for op in ops:
                self.expected[op[3]] = Meta(agent, source, wall, seq, run)
        return out


def _apply_in_chunks(replica: Replica, rows: list[Row], chunk: int) -> None:
    for i in range(0, len(rows), chunk):
        replica.apply_rows(rows[i : i + chunk])


def _check(replica: Replica, expected: dict[str, Meta]) -> None:
    for key, meta in expected.items():
        assert replica.meta("m", key) == meta, key
    assert replica.meta("m", "never-written") is None
    assert replica.meta("other", "k0") is None


@pytest.mark.parametrize("chunk", [1, 997, 5000])
def test_bulk_loaded_index_settles_and_answers_like_a_dict(chunk: int) -> None:
    writer = _Writer(seed=chunk)
    rows, expected = writer.rows(7_000 if chunk > 1 else 2_000, keys=8_000), writer.expected
    replica = Replica()
    _apply_in_chunks(replica, rows, chunk)
    if chunk > 1:  # enough keys in big enough batches: part of the index is settled
        assert replica._settled["m"].keys
        assert replica._settled["m"].keys == sorted(replica._settled["m"].keys)
    _check(replica, expected)

    # newer entries override settled positions
    _apply_in_chunks(replica, writer.rows(2_000, keys=8_000), chunk)
    _check(replica, expected)

    # a snapshot's saved index restores the same answers (compact and legacy formats)
    state = replica.export_state()
    assert "m" not in state["index"]  # every journaled key goes into the packed form
    assert state["settled"]["m"]["keys"] == sorted(expected)
    state = json.loads(json.dumps(state))  # as a backend stores it
    restored = Replica()
    restored.import_state(state)
    _check(restored, expected)
    legacy = {"index": {"m": {k: m.as_list() for k, m in expected.items()}}, "head": 1}
    old = Replica()
    old.import_state(legacy)
    _check(old, expected)
    assert old.export_state()["settled"]["m"]["keys"] == sorted(expected)


def test_entry_table_drops_rows_no_key_points_at() -> None:
    # 20,000 entries over 50 keys: the table keeps about the live entries, not the history
    writer = _Writer(seed=7)
    rows, expected = writer.rows(12_000, keys=50), writer.expected
    replica = Replica()
    _apply_in_chunks(replica, rows, 500)
    assert len(replica.table) <= max(4096, 2 * len(expected)) + 500
    _check(replica, expected)


def test_local_entries_journaled_out_of_order_and_overwritten() -> None:
    replica = Replica()
    root = replica.root("m", "map")

    def write(key: str, value: int, meta: Meta) -> list[Op]:
        ops: list[Op] = [["map", "m", "set", key, value]]

        def apply() -> None:
            root[key] = value

        assert replica.local(ops, apply, meta) is not None
        return ops

    a, b, c = (Meta("me", "tool", float(i), None, "") for i in range(3))
    ops_a, ops_b = write("x", 1, a), write("y", 2, b)
    assert replica.meta("x", "x") is None and replica.meta("m", "x") is a  # not journaled yet
    ops_c = write("x", 3, c)  # overwrites x before a is journaled
    replica.journaled(ops_b, b, 20)
    replica.journaled_many([(b"", ops_a, a), (b"", ops_c, c)], [10, 30])
    assert replica.meta("m", "x") == c._replace(seq=30)
    assert replica.meta("m", "y") == b._replace(seq=20)
    # a remote entry journaled before ours lands in the table in order
    later = Replica()
    later.import_state(replica.export_state())
    assert later.meta("m", "y") == b._replace(seq=20)
    assert later.table.seqs.tolist() == sorted(later.table.seqs.tolist())


def _by_key(rec: crdtstore.Record, keys: list[str]) -> dict[str, Any]:
    out = {}
    for key in keys:
        prov = rec.map("m").provenance(key)
        assert prov is not None, key
        out[key] = (prov.agent, prov.source, prov.seq, prov.wall_time)
    return out


@pytest.mark.anyio
async def test_resumed_and_compacted_records_keep_provenance_of_many_keys(
    tmp_path: Any,
) -> None:
    """More keys than the settling threshold: a record that resumes them from the journal,
    and one that resumes from a snapshot, answer provenance, versions and owners as the
    writer does."""
    keys = [f"k{i}" for i in range(6_000)]
    async with crdtstore.open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        async with store.open_record("r", "writer", "tool") as rec:
            for i in range(0, len(keys), 500):
                await rec.map("m").update({k: i for k in keys[i : i + 500]})
            await rec.map("m").set("k1", "again")
            await rec.flush()
            written = _by_key(rec, keys)
        async with store.open_record("r", "reader", "user", create=False) as rec:
            assert _by_key(rec, keys) == written
            assert rec.version("m", "k1") == written["k1"][2]
            assert rec.owner("m", "k5999") == "writer"
        await store.compact("r")
        async with store.open_record("r", "reader2", "user", create=False) as rec:
            assert _by_key(rec, keys) == written
            await rec.map("m").set("k2", "new")
            await rec.flush()
            prov = rec.map("m").provenance("k2")
            assert prov is not None and prov.agent == "reader2"


# keys from every plane, lone surrogates included: the packed run orders their UTF-8 bytes,
# which must agree with the order of the keys as str
_KEY_CHARS = st.sampled_from(
    [
        "a",
        "b",
        "\x00",
        "é",
        "\u07ff",
        "\u0800",
        "\ud800",
        "\udfff",
        "\ue000",
        "\uffff",
        "😀",
        "\U0010ffff",
    ]
)
_KEYS = st.text(_KEY_CHARS, max_size=3)


@given(
    st.lists(st.dictionaries(_KEYS, st.integers(1, 2**40), max_size=25), max_size=6),
    _KEYS,
)
def test_settled_run_merges_like_a_dict_update(batches: list[dict[str, int]], probe: str) -> None:
    settled, model = _Settled(), {}
    for batch in batches:
        settled.merge(batch)
        model.update(batch)
        assert settled.keys == sorted(model)
        assert len(settled) == len(model)
        assert [settled.get(k) for k in settled.keys] == [model[k] for k in settled.keys]
    assert settled.get(probe) == model.get(probe)
    again = _Settled.of_sorted(settled.keys, settled.seqs)  # what a snapshot restores
    assert again.keys == settled.keys and again.get(probe) == model.get(probe)


@given(st.lists(st.tuples(st.integers(1, 60), st.sampled_from(AGENTS)), max_size=80))
def test_entry_table_keeps_rows_by_position_in_any_arrival_order(
    rows: list[tuple[int, str]],
) -> None:
    table, model = _EntryTable(), {}
    for seq, agent in rows:
        table.add(seq, agent, "tool", seq / 3, "")
        model.setdefault(seq, agent)  # a position is one entry: the first row stays
    assert table.seqs.tolist() == sorted(model)
    for seq, agent in model.items():
        assert table.get(seq) == Meta(agent, "tool", seq / 3, seq, "")
    live = set(list(model)[::2])
    table.keep(live)
    assert table.seqs.tolist() == sorted(live)
    assert all(table.get(seq) is None for seq in set(model) - live)
    restored = _EntryTable()
    restored.load(json.loads(json.dumps(table.export())))
    assert [restored.get(s) for s in sorted(live)] == [table.get(s) for s in sorted(live)]


@given(
    st.lists(
        st.tuples(
            st.sampled_from([1, 2, 7, 300, (1 << 32) - 1, 1 << 32, (1 << 40) + 3]),
            st.integers(0, 299),
        ),
        max_size=60,
    )
)
def test_entry_table_widens_its_columns_for_big_positions_and_many_writers(
    rows: list[tuple[int, int]],
) -> None:
    """The positions start as 4-byte items and the writers' names as 1-byte indices; a
    position past 4 bytes or a 257th writer widens the column without changing a row."""
    table, model = _EntryTable(), {}
    for n in range(260):  # more writers than a 1-byte index holds
        table.add(10_000 + n, f"a{n}", "tool", float(n), "")
        model[10_000 + n] = Meta(f"a{n}", "tool", float(n), 10_000 + n, "")
    for seq, agent in rows:
        table.add(seq, f"b{agent}", "user", seq / 7, "r")
        model.setdefault(seq, Meta(f"b{agent}", "user", seq / 7, seq, "r"))
    assert table.seqs.tolist() == sorted(model)
    assert table.who.itemsize >= 2
    assert all(table.get(seq) == meta for seq, meta in model.items())
    assert all(table.agent(seq) == meta.agent for seq, meta in model.items())
    restored = _EntryTable()
    restored.load(json.loads(json.dumps(table.export())))
    assert all(restored.get(seq) == meta for seq, meta in model.items())


def test_journal_positions_past_4_bytes_keep_their_provenance() -> None:
    """The committer's and the replay's appends to the entry table widen its positions when
    a journal position does not fit 4 bytes (a batch of single sets, _journaled_run)."""
    rep = Replica()
    root = rep.root("m", "map")
    base = (1 << 32) - 4
    batch = []
    for i in range(10):
        meta = Meta("w", "tool", float(i), None, "")
        ops: list[Op] = [("map", "m", "set", f"k{i}", i)]  # type: ignore[list-item]
        update = rep.local_set(root, ops, meta)
        batch.append((update, ops, meta))
    rep.journaled_many(batch, [base + i for i in range(10)])
    assert rep.table.seqs.typecode == "q"
    assert [rep.meta("m", f"k{i}") for i in range(10)] == [
        Meta("w", "tool", float(i), base + i, "") for i in range(10)
    ]
    other = Replica()
    other.apply_rows(
        [
            Row(base + i, "w", "tool", rep.client_id, float(i), u, ops, checksum(u), "", "")
            for i, (u, ops, _) in enumerate(batch)
        ]
    )
    assert [other.meta("m", f"k{i}") for i in range(10)] == [
        Meta("w", "tool", float(i), base + i, "") for i in range(10)
    ]
