"""Fuzz target: the record's path for foreign update bytes, what the hub applies from a plain
Yjs client (``check_update`` then ``apply_update(writer=..., checked=True)``:
crdtstore.record._foreign, _external; sync._hub applies them the same way).

Each input runs against a fresh record on a ``memory://`` store holding a map, a text and
an ``append_only`` list. The first byte's low bit picks the mode: raw (even: the rest is the
update) or structured (odd: the rest drives a plain client's edits of a copy of the
record's document, deletes from the ``append_only`` list included, and its update is what
is applied). Properties: only ``CrdtStoreError`` escapes; a refused update leaves the
document, the journal and the provenance index as they were; an applied one is journaled
(the journal holds one more entry, or none for an update that changed nothing) and a
second record replaying the journal shows the same collections.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.fuzz._harness import instrumented, main

with instrumented():
    from pycrdt import Array, Doc, Map, Text

    import crdtstore
    from crdtstore import CrdtStoreError

SCHEMA = {"log": crdtstore.CollectionSpec(kind="list", policy="append_only")}
LOOP = asyncio.new_event_loop()


def _state(rec: Any) -> tuple[Any, ...]:
    return (bytes(rec.replica.doc.get_update()), repr(rec.replica.export_state()))


def _plain_update(base: bytes, data: bytes) -> bytes:
    doc: Doc[Any] = Doc(client_id=1000 + (data[0] if data else 0))
    doc.apply_update(base)
    state = doc.get_state()
    for i in range(0, min(len(data), 60), 2):
        op, a = data[i], data[i + 1] if i + 1 < len(data) else 0
        kind = op % 6
        if kind == 0:
            doc.get("notes", type=Map)[chr(97 + a % 5)] = a
        elif kind == 1:
            notes = doc.get("notes", type=Map)
            if len(notes):
                del notes[sorted(notes.keys())[a % len(notes)]]
        elif kind == 2:
            log = doc.get("log", type=Array)
            log.insert(a % (len(log) + 1), f"x{a}")
        elif kind == 3:
            log = doc.get("log", type=Array)
            if len(log):
                del log[a % len(log)]
        elif kind == 4:
            doc.get("body", type=Text).insert(0, "é" if a & 1 else "ab")
        else:
            doc.get(f"plain{a % 3}", type=Map)["k"] = "v"  # a root nobody registered
    return bytes(doc.get_update(state))


async def _run(data: bytes) -> None:
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a", schema=SCHEMA) as rec:
            await rec.map("notes").set("a", 1)
            await rec.list("log").append("first")
            await rec.text("body").insert(0, "hi")
            await rec.flush()
            base = bytes(rec.replica.doc.get_update())
            update = _plain_update(base, data[1:]) if data[0] & 1 else data[1:]
            before, journal = _state(rec), len(await store.journal("r"))
            try:
                rec.replica.check_update(update)
                await rec.apply_update(update, checked=True)
            except CrdtStoreError as exc:
                await rec.flush()
                assert _state(rec) == before, f"refused ({exc.code}) but changed"
                assert len(await store.journal("r")) == journal, "refused but journaled"
                return
            await rec.flush()
            entries = len(await store.journal("r"))
            assert entries in (journal, journal + 1), (journal, entries)
            shown = {n: rec.replica.doc.get(n, type=Map).to_py() for n in ("notes",)}
        async with store.open_record(run="r", agent="b", schema=SCHEMA) as again:
            replayed = {n: again.replica.doc.get(n, type=Map).to_py() for n in ("notes",)}
            assert replayed == shown, (replayed, shown)


def check(data: bytes) -> None:
    if not data:
        return
    LOOP.run_until_complete(_run(data))


if __name__ == "__main__":
    main(check)
