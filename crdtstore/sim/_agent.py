"""One simulated agent: its real record on its own ``memory://`` store, the journal entries it
has read, and the causal bookkeeping (which writes it integrated, which messages wait for
their predecessors); plus the seeded client id that makes a seed's outcome repeatable and the
canonical JSON state the simulator traces and checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import codec
from .._store import Store
from ..record._document import REGISTRY
from ..record._maps import KeepAllMap
from ..record._record import Record
from ._check import WriteRec
from ._network import Message


def _seed_client_id(rec: Record, client_id: int) -> None:
    """Give a record's (not yet started) document the client id ``client_id``.

    pycrdt draws a random client id per Doc and concurrent map writes are won by the higher
    one, so without this the same seed would not give the same outcome. Replaces the fresh,
    empty Doc the record's replica made with an equally fresh one of the chosen id.
    """
    from pycrdt import Doc, Map

    replica = rec.replica
    replica.doc = Doc(client_id=client_id)
    replica.client_id = client_id
    replica.registry = replica.doc.get(REGISTRY, type=Map)
    replica._capture = replica.capture_transactions()


def decode_state_vector(sv: bytes) -> dict[int, int]:
    """A v1 state vector (``doc.get_state()``) as ``{client id: clock}``
    (:func:`crdtstore.codec.decode_state_vector`)."""
    return codec.decode_state_vector(sv)


def agent_state(rec: Record, keep_all: Sequence[str] = ()) -> dict[str, Any]:
    """The canonical JSON view of a record the simulator traces and checks: maps as dicts,
    ``keep_all`` maps as ``{key: [{"token", "agent", "value"}, ...]}`` (sorted by token),
    lists as lists, texts as strings."""
    out: dict[str, Any] = {}
    for name, kind in rec.collections().items():
        if kind == "map":
            coll = rec.map(name)
            if isinstance(coll, KeepAllMap):
                out[name] = {
                    key: [
                        {"token": s.token, "agent": s.agent, "value": s.value}
                        for s in sorted(coll.siblings(key), key=lambda s: s.token)
                    ]
                    for key in sorted(coll.keys())
                }
            else:
                out[name] = dict(sorted(coll.to_dict().items()))
        elif kind == "list":
            out[name] = rec.list(name).to_list()
        else:
            out[name] = rec.text(name).read()
    return out


class _Agent:
    def __init__(self, index: int, store: Store, rec: Record, agents: int) -> None:
        self.index = index
        self.name = rec.agent
        self.store = store
        self.rec = rec
        self.journal_seq = 0  # journal entries of this agent's store read so far
        self.written = 0  # acknowledged writes made
        self.known: set[int] = set()  # writes integrated (causally closed)
        self.clock = [0] * agents  # per author: how many of its writes are in ``known``
        self.arrived: set[int] = set()  # causal=False: writes whose message was applied
        self.held: dict[int, Message] = {}  # causal=True: messages waiting for predecessors

    async def new_entries(self, run: str) -> list[Any]:
        entries = await self.store.journal(run, after=self.journal_seq, limit=1 << 30)
        if entries:
            self.journal_seq = entries[-1].seq
        return entries

    def deliverable(self, msg: Message) -> bool:
        return self.clock[msg.src] == msg.index - 1 and all(
            have >= need
            for a, (have, need) in enumerate(zip(self.clock, msg.deps, strict=True))
            if a != msg.src
        )

    def integrate(self, w: WriteRec) -> None:
        self.known.add(w.id)
        self.clock[w.agent] = max(self.clock[w.agent], w.index)
