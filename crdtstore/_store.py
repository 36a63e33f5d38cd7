"""Stores: where records live, opened from a URL.

``open_store(url)`` finds the backend for the URL's scheme in a registry filled from the
``crdtstore.backends`` entry-point group (as SQLAlchemy finds its dialects), so other packages,
``sync`` among them, add schemes without crdtstore importing them.

:class:`Store` is opened here; its replay and compaction (``_store_compaction``) and the life
of its runs after they are made (``_store_runs``: close, archive, retention, delete, redact)
are mixins of their own modules.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, Literal

import anyio
from anyio.abc import TaskGroup

from . import _history
from ._backends.memory import MemoryJournal
from ._backends.sqlite import SQLiteJournal
from ._errors import InvalidValue, StoreClosed, UnsupportedURL
from ._journal import Durability, JournalBackend, JournalEntry, RunInfo
from ._leases import Lease, Leases, lease_backend_for
from ._models import HistoryEntry
from ._names import check_name
from ._notify import Notifier
from ._semantics import CollectionSpec
from ._store_compaction import COMPACTION_ITEMS as COMPACTION_ITEMS
from ._store_compaction import CompactionResult as CompactionResult
from ._store_compaction import _Compaction
from ._store_runs import _info, _RunLifecycle
from ._store_sweep import check_sweep_interval, sweep_forever
from .record._document import DEFAULT_MAX_UPDATE
from .record._record import Record

DEFAULT_AUTO_COMPACT: int | None = None
"""Journal entries after a run's snapshot that make a record compact the run in the
background (see :func:`open_store`); None: off unless asked for. A compaction runs in the
writing process: it slows a long stream of small writes and the resident memory of a writer
that compacted stays higher (figures in bench/README.md, ``memory.py``), so it is opt-in."""


_BUILTIN: dict[str, Callable[[str], JournalBackend]] = {
    "memory": MemoryJournal,
    "sqlite": SQLiteJournal,
}


def _backend_for(url: str, **options: Any) -> JournalBackend:
    if not isinstance(url, str) or "://" not in url:
        raise UnsupportedURL(str(url), "expected SCHEME://...")
    scheme = url.split("://", 1)[0].lower()
    factory = _BUILTIN.get(scheme)
    if factory is None:
        for ep in entry_points(group="crdtstore.backends"):
            if ep.name == scheme:
                factory = ep.load()
                break
    if factory is None:
        raise UnsupportedURL(url, f"no backend for scheme {scheme!r} is installed")
    if not options:
        return factory(url)
    if scheme in _BUILTIN:
        raise InvalidValue(f"the {scheme} backend takes no options, got {sorted(options)}")
    return factory(url, **options)


def open_store(
    url: str | Sequence[str],
    *,
    tenant: str | None = None,
    durability: Durability = "batched",
    poll_interval: float = 0.25,
    max_update: int = DEFAULT_MAX_UPDATE,
    token: str | None = None,
    auto_compact: int | Literal["default"] | None = "default",
    sweep_interval: float | None = None,
    **backend_options: Any,
) -> Store:
    """Open the store at ``url``: ``memory://[name]``, ``sqlite:///path/store.db``, or a
    scheme of an installed backend (``ws://host:port/<tenant>`` with ``sync`` installed).

    Use it as ``async with open_store(url) as store:`` (or ``await store.start()`` and
    ``await store.aclose()``).

    Args:
        url: where the store lives; a sqlite file and its folder are created if missing.
            Several URLs of one backend (a list, or one string with commas), for a backend
            served by several servers: ``ws://`` hubs sharing one Redis (the client moves to
            the next when its hub goes away).
        tenant: the tenant every run of this store object belongs to (default ``default``,
            or the tenant the URL names; an argument contradicting the URL is refused).
        durability: default durability of records: ``batched`` (writes return at once; flush
            is the durability barrier; a group commit runs as soon as the previous one ends)
            or ``durable`` (each write returns once committed with ``synchronous=FULL``).
        poll_interval: seconds between journal re-reads when no wake-up arrives.
        max_update: largest update (bytes) accepted from elsewhere.
        token: the access token of a server backend (``ws://``); over ``ws://`` the token
            also names the writer: records write as its agent and source.
        auto_compact: when a record of this store has committed entries that leave more than
            this many journal entries after its run's snapshot, the store compacts the run in
            the background (:meth:`Store.compact`, journal kept), so that opening the run
            reads a snapshot plus at most about this many entries (or, once this store made
            a snapshot of more than ``auto_compact`` KB, one entry per KB of it). None turns
            it off, and is the default (``DEFAULT_AUTO_COMPACT``): a compaction costs the
            writing process CPU and resident memory, so it is opt-in (e.g. 50,000 on a
            long-lived ``sqlite://`` run); ``ws://`` ignores it (compact on the hub's store).
        sweep_interval: seconds between retention sweeps in the background (each deletes
            the runs whose ``set_retention`` deadline passed, as :meth:`Store.sweep`, and
            logs them to the ``crdtstore.retention`` logger); None (the default) sweeps only
            when :meth:`Store.sweep` is called. The hub and ``crdtstore serve`` sweep every
            60 s unless told otherwise.
        backend_options: further options of the URL's backend (see its documentation).
            ``ws://`` takes ``connect_timeout`` (default 10 s) and ``offline_timeout``
            (default 30 s): how long a request, and so ``rec.flush()`` and closing a record,
            waits for the hub (to come back, or to answer) before it gives up with
            ``BackendError``. **Closing a ``ws://`` record while offline** tries to send what
            is pending until ``offline_timeout`` has passed, then closes anyway and logs an
            error naming the record and how many of its writes were not journaled: those
            are lost to the hub (they were only in this process).

    Raises:
        UnsupportedURL: no backend handles the URL's scheme, or the URL is malformed.
        InvalidName: a bad tenant name.
        InvalidValue: options the backend does not take, or a contradicting ``tenant``.
    """
    if tenant is not None:
        check_name("tenant", tenant)
    if durability not in ("durable", "batched"):
        raise InvalidValue(f"durability must be 'durable' or 'batched', not {durability!r}")
    if auto_compact not in ("default", None) and (
        type(auto_compact) is not int or auto_compact < 1
    ):
        raise InvalidValue(f"auto_compact must be a positive int or None, not {auto_compact!r}")
    sweep_interval = check_sweep_interval(sweep_interval)
    if token is not None:
        backend_options["token"] = token
    if not isinstance(url, str):
        url = ",".join(url)
    backend = _backend_for(url, **backend_options)
    url_tenant: str | None = getattr(backend, "tenant", None)
    if url_tenant is not None and tenant is not None and tenant != url_tenant:
        raise InvalidValue(f"tenant {tenant!r} contradicts the tenant {url_tenant!r} of {url!r}")
    tenant = tenant or url_tenant or "default"
    if auto_compact == "default":
        persistent = url.split("://", 1)[0].lower() in ("sqlite", "memory")
        auto_compact = DEFAULT_AUTO_COMPACT if persistent else None
    return Store(
        backend,
        url=url,
        tenant=tenant,
        durability=durability,
        poll_interval=poll_interval,
        max_update=max_update,
        auto_compact=auto_compact,
        sweep_interval=sweep_interval,
    )


class Store(_RunLifecycle, _Compaction):
    """An open store. Records of its runs are opened with :meth:`open_record`."""

    def __init__(
        self,
        backend: JournalBackend,
        *,
        url: str,
        tenant: str,
        durability: Durability,
        poll_interval: float,
        max_update: int,
        auto_compact: int | None = None,
        sweep_interval: float | None = None,
    ) -> None:
        self.url = url
        self.tenant = tenant
        self.durability = durability
        self.poll_interval = poll_interval
        self.max_update = max_update
        self.auto_compact = auto_compact
        self.sweep_interval = sweep_interval
        # runs being compacted in the background, and the snapshot position last seen per run
        self._compacting: set[str] = set()
        self._snapshot_at: dict[str, int] = {}
        self._snapshot_bytes: dict[str, int] = {}  # of the last snapshot this store made
        self._head_seen: dict[str, int] = {}  # highest position its records committed
        self._backend = backend
        key = backend.notify_url()
        # one socket folder per file and tenant: a commit wakes the stores of its own tenant
        # only (a hub holds a store per tenant: with one folder per file, every commit sent
        # a datagram to, and woke, every tenant's store)
        self._notifier = Notifier(None if key is None else f"{key}\x00{tenant}")
        backend.bind(self._notifier.notify)
        self._records: set[Record] = set()
        self._tg: TaskGroup | None = None
        self._state = "new"
        self._leases = Leases(
            lease_backend_for(backend),
            notifier=self._notifier,
            tenant=tenant,
            check_open=self._check_open,
            task_group=lambda: self._tg,
        )

    # -- lifecycle --

    async def start(self) -> Store:
        """Open the backend and start listening for other processes' writes.

        ``start()`` and :meth:`aclose` must be called from the same task.
        """
        if self._state != "new":
            raise StoreClosed("store", self._state)
        await self._backend.open()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        await self._tg.start(self._notifier.serve)
        self._tg.start_soon(
            self._notifier.poll, self.poll_interval, self._backend.changes, self._backend.heads
        )
        self._state = "open"
        if self.sweep_interval is not None:
            self._tg.start_soon(sweep_forever, self.tenant, self.sweep, self.sweep_interval)
        return self

    async def aclose(self) -> None:
        """Close every record opened from this store, then the backend. Idempotent."""
        if self._state != "open":
            self._state = "closed"
            return
        self._state = "closing"
        try:
            with anyio.CancelScope(shield=True):
                for rec in list(self._records):
                    await rec.aclose()
        finally:
            self._state = "closed"
            assert self._tg is not None
            self._tg.cancel_scope.cancel()
            await self._tg.__aexit__(None, None, None)
            self._notifier.close()
            await self._backend.aclose()

    async def __aenter__(self) -> Store:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _check_open(self) -> None:
        if self._state != "open":
            raise StoreClosed("store", "new" if self._state == "new" else "closed")

    async def _spawn(self, fn: Callable[..., Coroutine[Any, Any, None]]) -> None:
        """Start a background task of a record in the store's task group."""
        self._check_open()
        assert self._tg is not None
        await self._tg.start(fn)

    @property
    def backend(self) -> JournalBackend:
        return self._backend

    @property
    def notifier(self) -> Notifier:
        """The store's wake-ups: ``watch(tenant, run)`` gives a :class:`~crdtstore._notify.Watch`
        that is set when the run's journal may have grown (a commit here or in another
        process; the poll catches a lost wake-up), ``unwatch`` ends it,
        ``others_listening()`` tells whether another process has the store open."""
        return self._notifier

    # -- leases --

    @property
    def leases(self) -> Leases:
        """The leases of this store and tenant: ``await store.leases.status()``."""
        return self._leases

    def lease(
        self,
        resources: Iterable[str],
        *,
        ttl: float = 30.0,
        owner: str | None = None,
        wait: bool = True,
        timeout: float | None = None,
        key: tuple[str, int] | None = None,
    ) -> Lease:
        """An exclusive lease on files (repo-relative paths) or work items
        (``item:<collection>/<id>``): ``async with store.lease(["src/a.py"]) as lease:``.

        Renewed in the background every ``ttl/3`` while held, released on exit (also on error
        or cancellation). ``lease.token`` is its fencing token. See :meth:`Leases.lease`.

        Raises:
            InvalidResource: a bad path or item, or an empty set.
            InvalidValue: a bad ``ttl``, ``owner``, ``timeout`` or ``key``.
            LeaseHeld: on entering, with ``wait=False``, when a resource is taken.
            LeaseTimeout: on entering, when ``timeout`` passed (the request is withdrawn).
        """
        self._check_open()
        return self._leases.lease(
            resources, ttl=ttl, owner=owner, wait=wait, timeout=timeout, key=key
        )

    # -- records --

    def open_record(
        self,
        run: str,
        agent: str,
        source: str = "model",
        *,
        durability: Durability | None = None,
        create: bool = True,
        schema: Mapping[str, CollectionSpec] | None = None,
        parent: str | None = None,
        salvage: bool = False,
    ) -> Record:
        """The record of ``run`` opened as writer ``agent`` (use with ``async with``).

        Raises:
            InvalidName: a bad run or agent name (nothing is created).
            InvalidValue: an unknown ``source`` or ``durability``.
            UnknownRun: on entering, when the run does not exist and ``create`` is False.
            InvalidValue: on entering, when ``schema`` contradicts the run's declarations.

        ``schema`` declares collections (:class:`CollectionSpec`: kind, policies, budgets,
        model) for the whole run on entering; the first declaration of a name wins.

        ``parent`` opens a nested run: it shares the record (and journal) of its root run,
        and its writes are attributed to it (``Provenance.run``, ``JournalEntry.origin_run``);
        deleting the parent deletes it.

        A damaged journal entry at the end of the journal (a torn tail) is skipped and listed
        in ``rec.skipped``; one followed by other entries raises :class:`JournalCorrupt` on
        entering, unless ``salvage`` (then the record opens with what can be read).
        """
        self._check_open()
        return Record(
            self,
            run,
            agent,
            source,
            durability=durability,
            create=create,
            schema=schema,
            parent=parent,
            salvage=salvage,
        )

    # -- runs and journals --

    async def runs(self) -> list[RunInfo]:
        """Every run of this store's tenant, oldest first."""
        self._check_open()
        return [_info(r) for r in await self._backend.list_runs(self.tenant)]

    async def run_info(self, run: str) -> RunInfo:
        """The run's journal head and snapshot position. Raises ``UnknownRun``."""
        self._check_open()
        row = await self._backend.ensure_run(self.tenant, check_name("run", run), create=False)
        return _info(row)

    async def journal(self, run: str, *, after: int = 0, limit: int = 1000) -> list[JournalEntry]:
        """The run's journal entries after position ``after``. Raises ``UnknownRun``."""
        await self.run_info(run)
        rows = await self._backend.read(self.tenant, run, after, limit)
        return [JournalEntry.from_row(run, r) for r in rows]

    async def history(self, run: str, collection: str, key: str) -> list[HistoryEntry]:
        """Every journaled write to ``collection[key]`` of ``run``, oldest first."""
        await self.run_info(run)
        rows = await self._backend.history_rows(self.tenant, run, collection, key)
        notes = (await self._backend.get_config(self.tenant, run)).get("redactions")
        if notes:
            seen = {row.seq for row in rows}
            gone = _history.redaction_rows(notes, run, collection, key, seen)
            if gone:
                rows = sorted([*rows, *gone], key=lambda r: r.seq)
        return _history.entries(run, collection, key, rows)
