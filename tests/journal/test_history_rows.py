"""The fast path of ``history``: ``JournalBackend.history_rows`` (SQLite's own query against
the default built from ``history``) and history entries built without validation."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

import crdtstore
from crdtstore import HistoryEntry, Provenance
from crdtstore._backends.memory import MemoryJournal
from crdtstore._backends.sqlite import SQLiteJournal
from crdtstore._history import entries, with_value
from crdtstore._journal import HistoryRow, JournalBackend, NewEntry, checksum

pytestmark = pytest.mark.anyio

EFFECTS: list[list[Any]] = [
    [["map", "m", "set", "k", 1.0]],  # an integral float: read back as an int
    [["map", "m", "set", "other", 1], ["map", "m", "set", "k", {"a": [2.0, 2.5, 1e300]}]],
    [["map", "n", "set", "k", 3]],  # another collection
    [["map", "m", "del", "k"]],
    [["map", "m", "set", "k", {"$redacted": {"reason": "pii", "agent": "x", "wall_time": 1.0}}]],
    [["map", "m", "redact", "k", "pii"]],
    [["list", "m", "ins", 0, ["k"]]],
    [["map", "m", "set", "k", 'é \\ " \u2028']],
]


def _entry(i: int, effect: list[Any]) -> NewEntry:
    upd = bytes([i])
    origin, call = ("child" if i == 2 else ""), ("call-1" if i == 1 else "")
    wall = 1_700_000_000.123456789 + i
    return NewEntry(f"agent-{i % 2}", "tool", 7, wall, upd, effect, checksum(upd), origin, call)


async def _filled(backend: JournalBackend) -> JournalBackend:
    await backend.open()
    await backend.ensure_run("t", "r", create=True)
    await backend.append("t", "r", [_entry(i, e) for i, e in enumerate(EFFECTS)], durable=True)
    return backend


def _ops(rows: list[HistoryRow]) -> list[tuple[Any, ...]]:
    """Each row with only its ops of m/k (a backend may leave the others in)."""
    return [
        (*r[:6], [op for op in r.ops if op[0] == "map" and op[1] == "m" and op[3] == "k"])
        for r in rows
    ]


async def test_sqlite_history_rows_match_the_default(tmp_path: Path) -> None:
    b = await _filled(SQLiteJournal(f"sqlite:///{tmp_path / 's.db'}"))
    try:
        fast = await b.history_rows("t", "r", "m", "k")
        default = await JournalBackend.history_rows(b, "t", "r", "m", "k")
        assert _ops(fast) == _ops(default)
        assert [r.seq for r in fast] == [1, 2, 4, 5, 6, 8]
        first = fast[0].ops[0][4]
        assert first == 1 and type(first) is int  # normalised as from_stored does
        nested = _ops(fast)[1][6][0][4]
        assert nested == {"a": [2, 2.5, 1e300]} and type(nested["a"][0]) is int
        assert fast[1].call == "call-1" and fast[0].wall_time == 1_700_000_000.123456789
        assert await b.history_rows("t", "r", "m", "nothing") == []
    finally:
        await b.aclose()


async def test_a_malformed_effect_still_raises(tmp_path: Path) -> None:
    """The effects are parsed joined into one array; one that is not a single JSON value
    must not shift the others onto the wrong rows."""
    b = await _filled(SQLiteJournal(f"sqlite:///{tmp_path / 's.db'}"))
    try:
        await b._read(  # a corrupt effect, as a torn or foreign write could leave
            lambda db: db.execute("UPDATE journal SET effect = '[1],[2' WHERE seq = 2")
        )
        with pytest.raises(ValueError):
            await b.history_rows("t", "r", "m", "k")
    finally:
        await b.aclose()


async def test_memory_history_rows_match_history() -> None:
    b = await _filled(MemoryJournal("memory://"))
    rows = await b.history_rows("t", "r", "m", "k")
    assert [r.seq for r in rows] == [r.seq for r in await b.history("t", "r", "m", "k")]
    assert type(rows[0].ops[0][4]) is int
    assert EFFECTS[0][0][4] == 1.0 and type(EFFECTS[0][0][4]) is float  # not changed in place


async def test_built_entries_equal_validated_ones() -> None:
    b = await _filled(MemoryJournal("memory://"))
    got = entries("r", "m", "k", await b.history_rows("t", "r", "m", "k"))
    expected = []
    for seq, value, deleted, redacted in [
        (1, 1, False, False),
        (2, {"a": [2, 2.5, 1e300]}, False, False),
        (4, None, True, False),
        (5, None, False, True),
        (6, None, True, True),
        (8, 'é \\ " \u2028', False, False),
    ]:
        prov = Provenance(run="r", agent=f"agent-{(seq - 1) % 2}", source="tool",
                          wall_time=1_700_000_000.123456789 + seq - 1, seq=seq,
                          call="call-1" if seq == 2 else None)  # fmt: skip
        expected.append(
            HistoryEntry(value=value, deleted=deleted, provenance=prov, redacted=redacted)
        )
    assert got == expected
    for g, e in zip(got, expected, strict=True):
        assert type(g) is HistoryEntry and type(g.provenance) is Provenance
        assert g.model_dump() == e.model_dump() and repr(g) == repr(e)
        assert g.model_fields_set == e.model_fields_set
        assert pickle.loads(pickle.dumps(g)) == e
        copied = g.model_copy(update={"value": 5})
        assert copied.value == 5 and g.value == e.value  # the original is untouched
        assert with_value(g, 5) == copied
    with pytest.raises(Exception, match="frozen"):
        got[0].value = 2  # type: ignore[misc]


async def test_store_history_reads_through_history_rows(tmp_path: Path) -> None:
    """A field's and a key's history through SQLite: the values, agents and order a
    whole-row read gives (the default path of the interface)."""
    async with crdtstore.open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        spec = {"f": crdtstore.CollectionSpec(kind="map", merge="fields")}
        async with store.open_record(run="r", agent="a", schema=spec) as rec:
            for i in range(30):
                await rec.map("f").patch("e", {"n": i * 1.0, "other": i})
                await rec.map("p").set("k", {"n": i + 0.5})
            await rec.map("p").delete("k")
            await rec.flush()
            hist = await rec.map("f").history("e", "n")
            assert [h.value for h in hist] == list(range(30))
            assert all(type(h.value) is int for h in hist)
            plain = await rec.history("p", "k")
            assert [h.value for h in plain] == [{"n": i + 0.5} for i in range(30)] + [None]
            assert plain[-1].deleted and not plain[0].deleted
            seqs = [h.provenance.seq or 0 for h in plain]
            assert seqs == sorted(seqs)
            backend = store.backend
            rows = await JournalBackend.history_rows(backend, store.tenant, "r", "p", "k")
            assert [r.seq for r in rows] == seqs
