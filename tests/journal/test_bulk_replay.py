"""The bulk replay of a record's opening and of compaction: ``apply_rows`` in journal chunks
with the later-provenance check off (``own=False``), the provenance index packed once at the
end (``settle=False``) and the garbage collector held off per chunk (``collector_paused``).

- it must give the document, provenance, skipped entries and exported state that applying
  the same entries one by one gives, for journals of concurrent writers that see each other
  late, with damaged entries, from nothing and from a snapshot;
- through a store: opening from the journal, compacting and opening from the snapshot give
  the same values, provenance of every key and history (maps, lists, texts; several agents).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import crdtstore
from crdtstore._gc_pause import collector_paused
from crdtstore._journal import Row
from crdtstore.record._replica import Replica
from tests.journal.test_compaction import _journal, _state, steps_st


def _exported(rep: Replica) -> Any:
    return (_state(rep), rep.export_state())


def _one_by_one(rows: list[Row]) -> Replica:
    reference = Replica()
    for row in rows:  # the exact per-entry semantics: one entry per batch
        reference.apply_rows([row], "r")
    return reference


def _bulk(rows: list[Row], chunk: int, into: Replica | None = None) -> Replica:
    rep = Replica() if into is None else into
    for at in range(0, len(rows), chunk):
        with collector_paused():
            rep.apply_rows(rows[at : at + chunk], "r", settle=False, own=False)
    rep._settle()
    return rep


@given(
    steps=steps_st,
    chunk=st.integers(1, 80),
    corrupt=st.sets(st.integers(1, 60), max_size=3),
)
def test_bulk_replay_equals_one_by_one(
    steps: list[tuple[int, int, str, int, bool]], chunk: int, corrupt: set[int]
) -> None:
    rows = _journal(steps, corrupt)
    assert _exported(_bulk(rows, chunk)) == _exported(_one_by_one(rows))


@given(
    steps=steps_st,
    cut=st.integers(0, 60),
    chunk=st.integers(1, 40),
    corrupt=st.sets(st.integers(1, 60), max_size=2),
)
def test_bulk_replay_after_a_snapshot_equals_one_by_one(
    steps: list[tuple[int, int, str, int, bool]], cut: int, chunk: int, corrupt: set[int]
) -> None:
    """From a snapshot of the first ``cut`` entries (as compaction and opening start), the
    rest applied in bulk: as every entry applied one by one."""
    rows = _journal(steps, corrupt)
    cut = min(cut, len(rows))
    first = _one_by_one(rows[:cut])
    snap, state = first.doc.get_update(), first.export_state()
    rep = Replica()
    rep.apply_update(snap)
    rep.import_state(state)
    got = _bulk(rows[cut:], chunk, rep)
    # the snapshot's entries are reflected, not skipped: compare what the rest skipped
    want = _one_by_one(rows)
    assert got.to_dict() == want.to_dict()
    assert {(c, k): got.meta(c, k) for c in ("m", "n") for k in "abcd"} == {
        (c, k): want.meta(c, k) for c in ("m", "n") for k in "abcd"
    }
    assert [e.seq for e in got.skipped] == [e.seq for e in want.skipped if e.seq > cut]
    assert (got.head, dict(got.coll_seq)) == (want.head, dict(want.coll_seq))


def test_collector_paused_restores_the_collector() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), collector_paused():
        raise KeyError("x")
    assert gc.isenabled()  # (also after a failure)
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()


async def _view(store: Any, run: str) -> Any:
    """Values, provenance of every key and item, and history of every key, as a new record
    of ``run`` opens it."""
    async with store.open_record(run, "reader", "tool", create=False) as rec:
        m, log, text = rec.map("m"), rec.list("log"), rec.text("doc")
        keys = sorted(m.keys())
        return (
            rec.to_dict(),
            {k: m.provenance(k) for k in keys},
            {k: [(h.value, h.deleted, h.provenance) for h in await m.history(k)] for k in keys},
            log.provenances(),
            str(text),
        )


@pytest.mark.anyio
async def test_open_compact_reopen_keeps_provenance_and_history(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with crdtstore.open_store(url, auto_compact=None) as store:
        recs = [await store.open_record("r", f"agent{j}", "tool").start() for j in range(3)]
        for i in range(600):
            rec = recs[i % 3]
            if i % 5 == 4:
                await rec.list("log").append({"n": i})
            elif i % 7 == 6:
                await rec.text("doc").insert(0, f"{i} ")
            elif i % 11 == 10:
                await rec.map("m").delete(f"k{i % 40}")
            else:
                await rec.map("m").set(f"k{i % 40}", i)
            if i % 50 == 0:  # the others see the writes late: concurrent writes
                for other in recs:
                    await other.flush()
                    await other.sync()
        for rec in recs:
            await rec.flush()
        for rec in recs:
            await rec.sync()
        live = recs[0].to_dict()
        for rec in recs:
            await rec.aclose()
        before = await _view(store, "r")
        assert before[0] == live
        assert before[1] and all(p is not None for p in before[1].values())
        # each key's provenance is its journal entry (read apart from any replay), and that
        # entry set the key to its current value
        async with store.open_record("r", "auditor", "tool", create=False) as rec:
            entries = {e.seq: e for e in await rec.journal(0, 10_000)}
        for key, p in before[1].items():
            entry = entries[p.seq]
            assert (entry.agent, entry.wall_time) == (p.agent, p.wall_time)
            assert ["map", "m", "set", key, before[0]["m"][key]] in entry.effect
        result = await store.compact("r")
        assert result.seq == (await store.run_info("r")).head
    async with crdtstore.open_store(url, auto_compact=None) as store:
        after = await _view(store, "r")  # from the snapshot
        replayed = await store.replay("r")
    assert after == before
    assert replayed.to_dict() == before[0]
    metas = {k: replayed.meta("m", k) for k in before[1]}
    assert {k: (m.seq, m.agent, m.wall_time) for k, m in metas.items() if m is not None} == {
        k: (p.seq, p.agent, p.wall_time) for k, p in before[1].items() if p is not None
    }
