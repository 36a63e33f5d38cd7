"""The record: one run's CRDT document, opened as one writer, kept in step with the journal.

:class:`Record` is assembled from the capabilities of this package, one base class each (see
the package docstring); this module holds its lifecycle (``start``, ``aclose``: the
background tasks of :mod:`._journal_link` in the store's task group), the run's
declarations, the collection handles and the reads of provenance and history.

Reads are synchronous and local. Writes are ``async``: they apply to the local document at
once and then, in ``durable`` mode, wait for the journal commit; in ``batched`` mode they return
at once and :meth:`Record.flush` is the durability barrier.
"""

from __future__ import annotations

import logging
from builtins import list as _List
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskStatus
from pydantic import BaseModel

from .._errors import (
    CollectionKindMismatch,
    CrdtStoreError,
    InvalidValue,
    ReadOnlyAccess,
    RunClosed,
    StoreClosed,
)
from .._models import HistoryEntry, Provenance
from .._names import check_name
from .._remote_journal import RemoteJournal
from .._semantics import CollectionSpec, budgeted, spec_from_declaration
from ._collections import CollectionHost, ListCollection, TextCollection
from ._counter import CounterCollection
from ._effects import _plain
from ._fields import FieldMap, KeepAllFieldMap
from ._foreign import ForeignWrites
from ._maps import KeepAllMap, MapCollection
from ._view import View

if TYPE_CHECKING:
    from .._store import Store

log = logging.getLogger("crdtstore.record")


class Record(ForeignWrites):
    """A run's record opened as one writer. Use as ``async with store.open_record(...)``.

    Args:
        store: the open store.
        run: the run name.
        agent: the writer's agent id (goes into provenance).
        source: the writer's source kind: ``tool``, ``model``, ``user`` or ``system``.
        durability: ``batched`` (writes return at once, :meth:`flush` waits for the journal)
            or ``durable`` (each write returns once journaled). Defaults to the store's.
        create: create the run if it does not exist (else :class:`UnknownRun`).

    Raises:
        InvalidName: a bad run or agent name (nothing is created).
        InvalidValue: an unknown source kind or durability.
    """

    async def start(self) -> Record:
        """Load the record (snapshot + journal) and start syncing. Prefer ``async with``.

        The background tasks run in the store's task group, so records may be started and
        closed in any order, from any task of the store's event loop.
        """
        if self._state != "new":
            raise StoreClosed("record", "open" if self._state == "open" else "closed")
        self._store._check_open()
        info = await self._backend.ensure_run(
            self.tenant, self.run, create=self._create, parent=self.parent
        )
        remote = self._backend if isinstance(self._backend, RemoteJournal) else None
        if remote is not None:  # the server names the writer (ws://: the token's agent)
            self.agent, self.source = await remote.identity(self.tenant, self.run)
            self._named_by_backend = True
            if await remote.read_only(self.tenant, self.run):
                self._read_only = ReadOnlyAccess(self.tenant, self.run)
        # a nested run shares the record of its root run, under its own attribution
        seen = {info.run}
        while info.parent is not None:
            info = await self._backend.ensure_run(self.tenant, info.parent, create=False)
            if info.run in seen:
                raise InvalidValue(f"run {self.run!r} has a cycle of parents")
            seen.add(info.run)
        self._jrun = info.run
        self._origin = "" if self._jrun == self.run else self.run
        if self._create:  # opened to write: every run of the chain must be open
            for name in seen:
                row = await self._backend.get_run(self.tenant, name)
                if row is not None and row.state != "open":
                    raise RunClosed(self.tenant, name, row.state)
        await self._load_specs(self._declare)
        await self._load()
        self._watch = self._store._notifier.watch(self.tenant, self._jrun)
        self._stopped = anyio.Event()
        await self._store._spawn(self._background)
        self._state = "open"
        self._store._records.add(self)
        self._backend.attach(self.tenant, self._jrun, self)
        return self

    async def aclose(self) -> None:
        """Flush what was written and stop syncing. Idempotent; always closes."""
        if self._state != "open":
            self._state = "closed"
            return
        try:
            with anyio.CancelScope(shield=True):
                try:
                    await self.flush()
                except CrdtStoreError as exc:
                    log.error(
                        "record %s/%s closed with unjournaled writes (not journaled: %d): %s",
                        self.tenant,
                        self.run,
                        self._written - self._committed,
                        exc,
                    )
        finally:
            self._state = "closed"
            self._store._records.discard(self)
            self._backend.detach(self.tenant, self._jrun, self)
            if self._watch is not None:
                self._store._notifier.unwatch(self.tenant, self._jrun)
            for sub in self._subscribers:
                sub.event.set()
            self._scope.cancel()
            with anyio.CancelScope(shield=True):
                await self._stopped.wait()

    async def _background(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            with self._scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._committer)
                    tg.start_soon(self._tail)
                    task_status.started()
        except Exception as exc:  # a bug must not take the store's other records down
            log.exception("record %s/%s stopped syncing", self.tenant, self.run)
            self._failure = exc
        finally:
            self._stopped.set()

    async def __aenter__(self) -> Record:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _load_specs(self, declare: Mapping[str, CollectionSpec]) -> None:
        for name, spec in declare.items():
            check_name("collection", name)
            spec.check_declarable(name)
        if declare:

            def merge(config: dict[str, Any]) -> dict[str, Any]:
                cols = dict(config.get("collections", {}))
                for name, spec in declare.items():
                    new = spec.declaration()
                    cur = cols.get(name)
                    if cur is None:
                        cols[name] = new
                    elif cur != new:
                        raise InvalidValue(
                            f"collection {name!r} is declared as {cur}; cannot redeclare as {new}"
                        )
                return {**config, "collections": cols}

            config = await self._backend.update_config(self.tenant, self._jrun, merge)
        else:
            config = await self._backend.get_config(self.tenant, self._jrun)
        specs = {n: spec_from_declaration(d) for n, d in config.get("collections", {}).items()}
        for name, spec in {**self._specs, **declare}.items():
            if spec.model is not None and name in specs:
                specs[name] = specs[name].model_copy(update={"model": spec.model})
        self._specs = specs
        self._models = {n: spec.model for n, spec in specs.items() if spec.model is not None}
        self._budgeted = frozenset(n for n, spec in specs.items() if budgeted(spec))

    async def declare(self, name: str, spec: CollectionSpec) -> None:
        """Declare a collection's kind, policies, budgets and model for the whole run.

        The first declaration of a name wins and every writer enforces it; declaring it again
        identically is a no-op.

        Raises:
            InvalidName: a bad collection name.
            InvalidValue: declared differently already, or an inapplicable policy.
        """
        self._check_open()
        await self._load_specs({name: spec})

    def spec(self, name: str) -> CollectionSpec | None:
        """The run's declaration of collection ``name`` (None when undeclared: open)."""
        return self._specs.get(name)

    def map(self, name: str, *, model: type[BaseModel] | None = None) -> MapCollection:
        """The map collection ``name`` (created on first write).

        Args:
            model: validate every value against this pydantic model and read values back as
                its instances (defaults to the model of the run's declaration, if any).

        Raises:
            InvalidName: a bad collection name.
            CollectionKindMismatch: ``name`` is a list or a text.
        """
        return self._collection(name, "map", MapCollection, model)  # type: ignore[no-any-return]

    def list(self, name: str, *, model: type[BaseModel] | None = None) -> ListCollection:
        """The list collection ``name`` (created on first write). Arguments as :meth:`map`."""
        return self._collection(name, "list", ListCollection, model)  # type: ignore[no-any-return]

    def text(self, name: str) -> TextCollection:
        """The text collection ``name`` (created on first write). Raises as :meth:`map`."""
        return self._collection(name, "text", TextCollection, None)  # type: ignore[no-any-return]

    def counter(self, name: str) -> CounterCollection:
        """The counter collection ``name``: ``await rec.counter("tokens_used").add(5)``,
        ``.value``, ``.contributions()`` (see :mod:`._counter`). Declared as a counter by its
        first add if the run has not declared it.

        Raises:
            InvalidName: a bad collection name.
            CollectionKindMismatch: ``name`` is declared or registered as something else.
        """
        got = self._collections.get((name, "counter", None))
        if got is None:
            check_name("collection", name)
            spec = self._specs.get(name)
            if spec is not None and spec.kind != "counter":
                raise CollectionKindMismatch(name, spec.kind, "counter")
            root = self.replica.root(name, "map")  # (a counter is a map in the document)
            got = self._collections[(name, "counter", None)] = CounterCollection(self, name, root)
        return got

    def _collection(
        self, name: str, kind: str, cls: Callable[..., Any], model: type[BaseModel] | None
    ) -> Any:
        got = self._collections.get((name, kind, model))
        if got is None:
            check_name("collection", name)
            spec = self._specs.get(name)
            if spec is not None and spec.kind != kind:
                raise CollectionKindMismatch(name, spec.kind, kind)
            root = self.replica.root(name, kind)
            if spec is not None and spec.merge == "fields":
                cls = KeepAllFieldMap if spec.conflict == "keep_all" else FieldMap
                self._stamps.setdefault(name, 0)
            elif spec is not None and spec.conflict == "keep_all":
                cls = KeepAllMap
                self._stamps.setdefault(name, 0)
            host: CollectionHost = self  # (the handle's view of its record, checked)
            got = self._collections[(name, kind, model)] = cls(host, name, root, model)
        return got

    def _next_token(self) -> str:
        """A token no other write of any replica makes: a keep_all sibling's."""
        self._tokens += 1
        return f"{self.replica.client_id:x}.{self._tokens}"

    @property
    def skipped(self) -> _List[Any]:
        """Corrupt journal entries (:class:`JournalCorrupt`) that were skipped, not applied."""
        return self.replica.skipped

    def view(self, paths: Iterable[str]) -> View:
        """The part of the record a step needs: ``"collection"``, ``"collection/key"`` or
        ``"collection/prefix*"`` paths. ``view.data()`` is that slice as JSON with
        provenance; ``view.map(name)`` and friends are handles that raise
        ``PolicyViolation`` for anything outside it.

        Raises:
            InvalidName: a bad collection name in a path.
        """
        return View(self, paths)

    @property
    def store(self) -> Store:
        """The store this record is open on (its leases, its other runs)."""
        return self._store

    def collections(self) -> dict[str, str]:
        """Every collection of the record: name -> kind (``map``, ``list``, ``text``,
        ``counter``: a declared counter, a map in the document)."""
        out = self.replica.collections()
        for name, spec in self._specs.items():
            if spec.kind == "counter" and out.get(name) == "map":
                out[name] = "counter"
        return out

    def to_dict(self) -> dict[str, Any]:
        """A plain JSON-able snapshot of the whole record: ``{collection: value}``.

        ``keep_all`` maps show each key's value, or ``{"__conflict__": [siblings...]}``. What
        only a plain Yjs client can store shows as JSON too: a nested shared type as its
        contents, binary content as ``{"$bytes": "<base64>"}``.
        """
        out = {name: _plain(value) for name, value in self.replica.to_dict().items()}
        for name, spec in self._specs.items():
            if (spec.conflict == "keep_all" or spec.merge == "fields") and name in out:
                out[name] = self.map(name).to_json()  # type: ignore[attr-defined]
            elif spec.kind == "counter" and name in out:
                out[name] = self.counter(name).value
        return out

    def provenance(self, collection: str, key: str) -> Provenance | None:
        """Who wrote the current value of ``collection[key]`` (None if never written).

        Without the tool-call id (``call`` is None): the live index does not keep call ids;
        :meth:`history` reads them from the journal."""
        meta = self.replica.meta(collection, key)
        if meta is None:
            return None
        return Provenance(
            run=meta.run or self._jrun,
            agent=meta.agent,
            source=meta.source,
            wall_time=meta.wall_time,
            seq=meta.seq,
        )

    async def history(self, collection: str, key: str) -> _List[HistoryEntry]:
        """Every journaled write to ``collection[key]``, overwritten ones included, oldest
        first. Call :meth:`flush` first to include this record's batched writes."""
        self._check_open()
        check_name("collection", collection)
        return await self._store.history(self._jrun, collection, key)

    def __repr__(self) -> str:
        return (
            f"<Record {self.tenant}/{self.run} agent={self.agent!r} {self._state}"
            f" seq={self.applied_seq}>"
        )
