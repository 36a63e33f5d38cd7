"""``ReplicaDocument.listen``: every transaction's update, encoded once for the capture and
the listeners (what a hub's room broadcasts and counts)."""

from __future__ import annotations

from typing import Any

from pycrdt import Doc, Map

from crdtstore.record import Replica
from crdtstore.record._provenance import Meta


def _foreign_update() -> bytes:
    doc: Doc[Any] = Doc()
    doc.get("notes", type=Map)["a"] = "x"
    return bytes(doc.get_update())


def test_listeners_get_every_transactions_update() -> None:
    replica = Replica()
    observed: list[bytes] = []
    replica.doc.observe(lambda event: observed.append(bytes(event.update)))
    heard: list[bytes] = []
    listener = replica.listen(heard.append)
    meta = Meta("a", "user", 0.0, None, "", "")
    root = replica.root("m", "map")
    update = replica.local_set(root, [["map", "m", "set", "k", "v"]], meta)  # captured
    assert update is not None
    replica.apply_update(_foreign_update())  # not captured
    replica.apply_external(_foreign_update(), meta, register=True)  # captured, with deletes
    assert heard == observed and len(heard) >= 3
    assert heard[0] == update
    replica.unlisten(listener)
    replica.local_set(root, [["map", "m", "set", "k", "w"]], meta)
    assert len(heard) == len(observed) - 1


def test_no_listener_no_update_outside_a_capture() -> None:
    replica = Replica()
    second: list[bytes] = []
    first = replica.listen(lambda update: None)
    replica.listen(second.append)
    replica.unlisten(first)
    replica.unlisten(first)  # (unknown now: nothing happens)
    replica.apply_update(_foreign_update())
    assert len(second) == 1 and second[0] not in (b"", b"\x00\x00")
