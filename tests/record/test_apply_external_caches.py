"""``Replica.apply_external`` keeps ``collections()`` and the kinds cache across updates that
leave the registry alone (the hub's fixed cost per update, issue 5): the cached answers must be
the registry's, the effects the same as with nothing cached, and observing the registry during
an update must not change how pycrdt encodes the document.

Plain pycrdt ``Doc``s stand in for Yjs clients, some writing the crdtstore registry (as a
crdtstore replica does, including concurrent registrations of one name as two kinds, entries of
unknown kinds and deleted entries), some not; their updates arrive in any order.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pycrdt import Array, Doc, Map, Text

from crdtstore.record._document import KINDS, REGISTRY
from crdtstore.record._provenance import Meta
from crdtstore.record._replica import Replica

# each name holds items of one kind (reading a root as another type can hang pycrdt); the
# registry says that kind, a kind crdtstore does not know, or nothing, changing concurrently
KIND_OF = {"a": "map", "b": "list", "c": "text"}
NAMES = tuple(KIND_OF)
ROOT_KINDS = {"map": Map, "list": Array, "text": Text}

# (client, action, name, registered as the right kind, number): actions on a client's document
step = st.tuples(
    st.integers(0, 2),
    st.sampled_from(["write", "delete", "register", "unregister", "send", "sync"]),
    st.sampled_from(NAMES),
    st.booleans(),
    st.integers(0, 5),
)


class _Client:
    def __init__(self) -> None:
        self.doc: Doc[Any] = Doc()
        self.sent = self.doc.get_state()

    def act(self, action: str, name: str, right: bool, n: int) -> None:
        if action == "register":
            self.doc.get(REGISTRY, type=Map)[name] = KIND_OF[name] if right else "bogus"
        elif action == "unregister":
            registry = self.doc.get(REGISTRY, type=Map)
            if name in registry:
                del registry[name]
        elif action in ("write", "delete"):
            root = self.doc.get(name, type=ROOT_KINDS[KIND_OF[name]])
            if isinstance(root, Map):
                if action == "write":
                    root[f"k{n}"] = n
                elif f"k{n}" in root:
                    del root[f"k{n}"]
            elif isinstance(root, Array):
                if action == "write":
                    root.insert(min(n, len(root)), n)
                elif len(root):
                    del root[min(n, len(root) - 1)]
            elif action == "write":
                root.insert(min(n, len(root)), "xyz"[: n % 3 + 1])
            elif len(root):
                del root[min(n, len(root) - 1)]

    def since(self) -> bytes:
        update = bytes(self.doc.get_update(self.sent))
        self.sent = self.doc.get_state()
        return update


def _uncached(replica: Replica) -> None:
    replica._colls_at = (-1, -1)
    replica._kinds.clear()


def _effect(ops: list[Any]) -> tuple[list[Any], list[str]]:
    """Ops in an order-free form where order does not matter: list and text ops in order, map
    ops (on distinct keys; a newly registered map's come in the map's own order) as a set."""
    return [op for op in ops if op[0] != "map"], sorted(repr(op) for op in ops if op[0] == "map")


def _registry(replica: Replica) -> dict[str, str]:
    return dict(sorted((str(k), str(v)) for k, v in replica.registry.items() if v in KINDS))


@given(st.lists(step, max_size=40), st.booleans())
@settings(max_examples=200, deadline=None)
def test_cached_collections_and_effects_match_an_uncached_replica(
    steps: list[tuple[int, str, str, bool, int]], register: bool
) -> None:
    clients = [_Client() for _ in range(3)]
    cached, fresh, plain = Replica(), Replica(), Replica()
    meta = Meta("agent", "src", 0.0, None, "")
    outbox: list[bytes] = []
    for who, action, name, right, n in steps:
        client = clients[who]
        if action == "send":
            outbox.append(client.since())
            update = outbox.pop(n % len(outbox))  # out of order: gaps wait in pycrdt
        elif action == "sync":
            other = clients[(who + 1) % 3]
            other.doc.apply_update(client.doc.get_update(other.doc.get_state()))
            continue
        else:
            client.act(action, name, right, n)
            continue
        _uncached(fresh)
        got = cached.apply_external(update, meta, register=register)
        want = fresh.apply_external(update, meta, register=register)
        plain.apply_update(update)
        assert cached.collections() == _registry(cached)
        assert fresh.collections() == _registry(fresh)
        for name in NAMES:
            kind = cached.registry.get(name)
            assert cached.kind_of(name) == (kind if kind in KINDS else None)
        if not register:
            # (registering, each replica writes the registry as itself: a concurrent entry of
            # a client may win on one and lose on the other, and their effects differ)
            assert _effect(got[0]) == _effect(want[0])
            # observing the registry and the collections for the update changes no byte
            assert got[1] == want[1]
            assert cached.doc.get_update() == plain.doc.get_update()
            assert cached.doc.get_state() == plain.doc.get_state()


def test_collections_inside_an_open_transaction_sees_a_new_registration() -> None:
    replica = Replica()
    assert replica.collections() == {}
    replica.begin()
    assert replica.collections() == {}  # read (and cached) inside the transaction
    replica._register("notes", "map")
    assert replica.collections() == {"notes": "map"}
    replica.end()
    assert replica.collections() == {"notes": "map"}


def test_collections_returns_a_new_dict_every_call() -> None:
    replica = Replica()
    replica.begin()
    replica._register("notes", "map")
    replica.end()
    first = replica.collections()
    first["other"] = "list"
    assert replica.collections() == {"notes": "map"}


def test_a_registry_entry_changing_kind_in_place_is_seen() -> None:
    """The registry keeps its size (the cache's cheap check) while an entry changes kind."""
    client = _Client()
    replica = Replica()
    meta = Meta("agent", "src", 0.0, None, "")
    client.act("write", "a", True, 1)
    client.act("register", "a", False, 0)  # "bogus": not a collection
    replica.apply_external(client.since(), meta)
    assert replica.collections() == {}
    assert replica.kind_of("a") is None
    client.act("register", "a", True, 0)  # now a map, whose whole content is the effect
    ops, _ = replica.apply_external(client.since(), meta)
    assert ops == [["map", "a", "set", "k1", 1]]
    assert replica.collections() == {"a": "map"}
    assert replica.kind_of("a") == "map"
    client.act("register", "a", False, 0)
    replica.apply_external(client.since(), meta)
    assert replica.collections() == {}
    assert replica.kind_of("a") is None


def test_a_registration_by_another_path_is_seen_by_the_next_external_update() -> None:
    """The registry changed outside apply_external (a remote entry, a local write): the next
    external update's effect covers the collection it registered."""
    meta = Meta("agent", "src", 0.0, None, "")
    writer = _Client()
    replica = Replica()
    writer.act("write", "b", True, 0)
    assert replica.apply_external(writer.since(), meta)[0] == []  # unregistered: no effect
    registering = _Client()
    registering.act("register", "b", True, 0)
    replica.apply_update(registering.since())  # e.g. a journal entry of another replica
    assert replica.collections() == {"b": "list"}
    writer.act("write", "b", True, 0)
    assert replica.apply_external(writer.since(), meta)[0] == [["list", "b", "ins", 0, [0.0]]]
    replica.begin()  # a local write registering a collection
    replica._register("a", "map")
    replica.end()
    writer.act("write", "a", True, 3)
    assert replica.apply_external(writer.since(), meta)[0] == [["map", "a", "set", "k3", 3.0]]
