"""Change streams and versions.

Every entry a record makes or takes in is announced to its subscribers as one
:class:`~crdtstore.Change` per collection (:meth:`Changes._emit`; a bounded buffer per
stream, :class:`ChangeStream`), and ``changes_since`` reads them back from the journal. A
version is a journal position: of the write that made a key's value (:meth:`Changes.version`),
of the last entry that touched a collection, or of the whole record (``current_version``).
"""

from __future__ import annotations

from builtins import list as _List
from collections import deque
from collections.abc import AsyncIterator, Callable

import anyio

from .._events import event_factory
from .._journal import Op
from .._models import Change, Version
from .._names import check_name
from ._policies import Policies
from ._provenance import Meta
from ._state import READ_CHUNK


class _Subscriber:
    __slots__ = ("event", "lost", "new_event", "queue")

    def __init__(self, maxlen: int) -> None:
        self.queue: deque[Change] = deque(maxlen=maxlen)
        self.event = anyio.Event()
        self.new_event: Callable[[], anyio.Event] | None = None  # (chosen on the first wait)
        self.lost = 0


class Changes(Policies):
    """Change streams and versions of a record (see the module docstring)."""

    def changes(self, *, local: bool = True, buffer: int = 1024) -> ChangeStream:
        """Changes from the moment of this call on: a :class:`Change` per collection touched
        by each transaction, local (unless ``local=False``) and remote, until the record
        closes. Use ``async for change in rec.changes():``.

        The buffer is bounded: a consumer that falls more than ``buffer`` changes behind
        loses the oldest ones (``stream.lost`` counts them) rather than growing memory;
        re-read the record (``to_dict()``) after such a gap.
        """
        return ChangeStream(self, local, buffer)

    @staticmethod
    def _changes_of(
        ops: _List[Op], agent: str, source: str, seq: int | None, local: bool
    ) -> _List[Change]:
        if len(ops) == 1:  # the usual entry: one op, one change (no grouping)
            op = ops[0]
            return [
                Change(
                    collection=op[1],
                    kind=op[0],
                    keys=(op[3],) if op[0] == "map" else (),
                    agent=agent,
                    source=source,
                    seq=seq,
                    local=local,
                    ops=(tuple(op),),
                )
            ]
        grouped: dict[tuple[str, str], _List[Op]] = {}
        for op in ops:
            grouped.setdefault((op[1], op[0]), []).append(op)
        return [
            Change(
                collection=name,
                kind=kind,
                keys=tuple(dict.fromkeys(op[3] for op in cops)) if kind == "map" else (),
                agent=agent,
                source=source,
                seq=seq,
                local=local,
                ops=tuple(tuple(op) for op in cops),
            )
            for (name, kind), cops in grouped.items()
        ]

    def _emit(
        self, ops: _List[Op], agent: str, source: str, seq: int | None, *, local: bool
    ) -> None:
        for change in self._changes_of(ops, agent, source, seq, local):
            for sub in self._subscribers:
                if len(sub.queue) == sub.queue.maxlen:
                    sub.lost += 1
                sub.queue.append(change)
                sub.event.set()

    def version(self, collection: str, key: str) -> int | None:
        """The version of ``collection[key]``: the journal position of the write that made
        its current value (0 if never written; None while that write is not journaled yet,
        call :meth:`flush` first)."""
        meta = self.replica.meta(collection, key)
        if meta is None:
            return 0
        if meta.seq is None and self._inflight:  # appended by an open guarded group
            return self._inflight.get(id(meta))
        return meta.seq

    def current_version(self, collection: str | None = None) -> Version:
        """The version of the whole record (``collection=None``) or of one collection, as this
        replica knows it now. Pass it as ``based_on`` to refuse acting on a stale view."""
        if collection is None:
            return Version(scope="*", seq=max(self.replica.head, self.applied_seq))
        check_name("collection", collection)
        return Version(scope=collection, seq=self.replica.coll_seq.get(collection, 0))

    async def changes_since(self, version: Version | int) -> _List[Change]:
        """What changed after ``version`` (a :class:`Version` or a journal position): one
        :class:`Change` per collection per journal entry, oldest first, filtered to the
        version's collection when it has one. Flushes this record's writes first."""
        self._check_open()
        await self.flush()
        seq = version if isinstance(version, int) else version.seq
        scope = "*" if isinstance(version, int) else version.scope
        out: _List[Change] = []
        while True:
            rows = await self._backend.read(self.tenant, self._jrun, seq, READ_CHUNK)
            if not rows:
                return out
            for row in rows:
                own = row.client_id == self.replica.client_id
                for change in self._changes_of(row.effect, row.agent, row.source, row.seq, own):
                    if scope in ("*", change.collection):
                        out.append(change)
            seq = rows[-1].seq

    def _scope_seq(
        self, scope: str, batch: _List[tuple[bytes, _List[Op], Meta]], seqs: _List[int]
    ) -> int:
        if scope == "*":
            return max([self.replica.head, self.applied_seq, *seqs])
        best = self.replica.coll_seq.get(scope, 0)
        for (_, ops, _), seq in zip(batch, seqs, strict=True):
            if any(op[1] == scope for op in ops):
                best = max(best, seq)
        return best

    def _version_with(
        self,
        name: str,
        key: str,
        batch: _List[tuple[bytes, _List[Op], Meta]],
        seqs: _List[int],
    ) -> int | None:
        meta = self.replica.meta(name, key)
        if meta is None:
            return 0
        if meta.seq is not None:
            return meta.seq
        for (_, _, m), seq in zip(batch, seqs, strict=True):
            if m is meta:
                return seq
        return None


class ChangeStream(AsyncIterator[Change]):
    """An async iterator of :class:`Change`; subscribed from its creation until closed."""

    def __init__(self, rec: Changes, local: bool, buffer: int) -> None:
        self._rec = rec
        self._local = local
        self._sub = _Subscriber(buffer)
        rec._subscribers.append(self._sub)

    @property
    def lost(self) -> int:
        """Changes dropped because the consumer fell more than ``buffer`` behind."""
        return self._sub.lost

    async def __anext__(self) -> Change:
        sub = self._sub
        while True:
            if not sub.queue:
                if self._rec._state != "open":
                    self.close()
                    raise StopAsyncIteration
                new = sub.new_event
                if new is None:
                    new = sub.new_event = event_factory()
                sub.event = new()
                await sub.event.wait()
                continue
            change = sub.queue.popleft()
            if self._local or not change.local:
                return change

    def close(self) -> None:
        """Stop receiving changes. Idempotent."""
        if self._sub in self._rec._subscribers:
            self._rec._subscribers.remove(self._sub)

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> ChangeStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
