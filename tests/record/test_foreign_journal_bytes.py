"""What ``Record.apply_update`` journals for foreign bytes (a hub's Yjs clients).

The entry holds the bytes as given, merged with the document's delta only when the record
registered roots for them (a plain Yjs client's ``getMap``): replaying the journal into an
empty document gives the record's document, whatever order the updates came in (clock gaps
wait in pycrdt and are journaled as given), and with or without registration.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from pycrdt import Doc, Map, Text

from crdtstore import Record, Writer, open_store
from crdtstore.codec import decode_state_vector

pytestmark = pytest.mark.anyio

REGISTRY = "__crdtstore_collections"


def client_updates(rng: random.Random, register: bool) -> list[bytes]:
    """Updates of three Yjs clients writing maps and a text, each client's in its order; the
    registry written by them (``register``) or left to the record."""
    out: list[bytes] = []
    for client in range(3):
        doc: Doc[Any] = Doc()
        for step in range(rng.randint(2, 6)):
            before = doc.get_state()
            with doc.transaction():
                if register and step == 0:
                    registry = doc.get(REGISTRY, type=Map)
                    registry["notes"] = "map"
                    registry["log"] = "text"
                notes = doc.get("notes", type=Map)
                key = f"k{rng.randrange(4)}"
                if key in notes and rng.random() < 0.3:
                    del notes[key]
                else:
                    notes[key] = f"{client}-{step}"
                if rng.random() < 0.5:
                    text = doc.get("log", type=Text)
                    text.insert(rng.randint(0, len(text)), f"<{client}{step}>")
            out.append(doc.get_update(before))
    return out


@pytest.mark.parametrize("register", [True, False], ids=["registry-sent", "record-registers"])
async def test_the_journal_replays_to_the_record_s_document(
    anyio_backend: str, register: bool
) -> None:
    for seed in range(12):
        rng = random.Random(seed)
        updates = client_updates(rng, register)
        rng.shuffle(updates)  # out of order: an update with a clock gap waits in pycrdt
        async with open_store(f"memory://foreign-bytes-{seed}-{register}", tenant="t") as store:
            rec = Record(store, "r", "hub", "system")
            await rec.start()
            try:
                for update in updates:
                    rec.replica.check_update(update)
                    await rec.apply_update(update, writer=Writer("yjs", "tool"), checked=True)
                await rec.flush()
                entries = await store.journal("r", limit=10_000)
                replayed: Doc[Any] = Doc()
                for entry in entries:
                    replayed.apply_update(entry.update)
                doc = rec.replica.doc
                # (the same clocks; the encoding's client order is not canonical)
                sv = decode_state_vector(replayed.get_state())
                assert sv == decode_state_vector(doc.get_state()), seed
                assert replayed.get(REGISTRY, type=Map).to_py() == {"notes": "map", "log": "text"}
                assert replayed.get("notes", type=Map).to_py() == doc.get("notes", type=Map).to_py()
                assert str(replayed.get("log", type=Text)) == str(doc.get("log", type=Text))
                assert {e.agent for e in entries} == {"yjs"}
            finally:
                await rec.aclose()
