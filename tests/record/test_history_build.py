"""``history``'s entries built in bulk (``crdtstore._history.entries``): equal to validated
models, for long histories too (built with the cyclic collector paused), and the collector's
state as the caller left it afterwards."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from crdtstore import HistoryEntry, Provenance, open_store
from crdtstore._history import entries
from crdtstore._journal import HistoryRow

KEY = "e\x1estatus"


def _rows(n: int) -> list[HistoryRow]:
    ops: list[list[list[Any]]] = [
        [["map", "f", "set", KEY, 1]],
        [["map", "f", "set", "other", 2], ["map", "f", "set", KEY, {"a": [1, 2.5]}]],
        [["map", "g", "set", KEY, 3]],  # another collection: not in the history
        [["map", "f", "del", KEY]],
        [["map", "f", "set", KEY, {"$redacted": {"reason": "pii"}}]],
        [["map", "f", "redact", KEY, "pii"]],
    ]
    return [
        HistoryRow(
            i + 1,
            f"agent-{i % 3}",
            "tool",
            1.5 + i,
            "child" if i % 7 == 0 else "",
            "call" if i % 5 == 0 else "",
            ops[i % len(ops)],
        )
        for i in range(n)
    ]


def _validated(rows: list[HistoryRow]) -> list[HistoryEntry]:
    out = []
    for r in rows:
        prov = Provenance(run=r.origin or "r", agent=r.agent, source=r.source,
                          wall_time=r.wall_time, seq=r.seq, call=r.call or None)  # fmt: skip
        for op in r.ops:
            if op[:2] != ["map", "f"] or op[3] != KEY:
                continue
            if op[2] == "set" and not (isinstance(op[4], dict) and "$redacted" in op[4]):
                out.append(HistoryEntry(value=op[4], deleted=False, provenance=prov))
            elif op[2] == "set":
                out.append(HistoryEntry(value=None, deleted=False, provenance=prov, redacted=True))
            else:
                out.append(HistoryEntry(value=None, deleted=True, provenance=prov,
                                        redacted=op[2] == "redact"))  # fmt: skip
    return out


@pytest.mark.parametrize("n", [6, 3000])
def test_entries_equal_validated_models(n: int) -> None:
    rows = _rows(n)
    got = entries("r", "f", KEY, rows)
    want = _validated(rows)
    assert got == want
    other = {r.seq for r in rows if r.ops[0][1] == "g"}
    assert other and not other & {h.provenance.seq for h in got}  # another collection's
    assert [h.model_dump() for h in got] == [h.model_dump() for h in want]
    assert got[0].model_fields_set == want[0].model_fields_set | {"redacted"}
    assert got[1].provenance.run == "r" and got[0].provenance.run == "child"
    with pytest.raises(ValidationError, match="frozen"):
        got[0].value = 5  # type: ignore[misc]


def test_the_collector_is_left_as_it_was() -> None:
    rows = _rows(3000)
    assert gc.isenabled()
    entries("r", "f", KEY, rows)
    assert gc.isenabled()
    gc.disable()
    try:
        entries("r", "f", KEY, rows)
        assert not gc.isenabled()  # a caller's pause is not ended by ours
    finally:
        gc.enable()


def test_the_collector_runs_again_after_an_error() -> None:
    rows = _rows(3000)
    rows[2000] = HistoryRow(2001, "a", "tool", 1.0, "", "", [["map", "f"]])  # a torn op
    with pytest.raises(IndexError):
        entries("r", "f", KEY, rows)
    assert gc.isenabled()


@pytest.mark.anyio
async def test_a_sqlite_history_read_leaves_the_collector_as_it_was(tmp_path: Path) -> None:
    async with open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        async with store.open_record(run="r", agent="a") as rec:
            for i in range(1200):
                await rec.map("m").set("k", i)
            await rec.flush()
            assert gc.isenabled()
            got = await rec.history("m", "k")
            assert [h.value for h in got] == list(range(1200))
            assert gc.isenabled()
            gc.disable()
            try:
                assert len(await rec.history("m", "k")) == 1200
                assert not gc.isenabled()  # a caller's pause is not ended by the read
            finally:
                gc.enable()
