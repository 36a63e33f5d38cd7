"""The blocking facade, for synchronous callers (an agent tool function that is not async).

Every call is funnelled, through an anyio blocking portal, to the one event loop that owns
the store and its documents: pycrdt documents are not thread-safe (PYCRDT-NOTES hazard 9), so
the facade never touches a document from the caller's thread::

    from crdtstore import blocking

    with blocking.open_store("sqlite:///runs/store.db") as store:
        with store.open_record(run="r1", agent="tool-runner", source="tool") as rec:
            rec.map("findings").set("f1", "done")
            rec.flush()
            print(rec.to_dict())

Methods and arguments are those of the async API; errors are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from ._store import Store
from ._store import open_store as _open_store
from .record._record import Record

__all__ = ["BlockingRecord", "BlockingStore", "open_store"]

T = TypeVar("T")


class _Proxy:
    """Runs the wrapped object's methods on the portal's loop; awaits coroutines there."""

    _target: Any
    _portal: BlockingPortal

    def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async def call() -> Any:
            out = fn(*args, **kwargs)
            if hasattr(out, "__await__"):
                out = await out
            return out

        return self._portal.call(call)


class BlockingCollection(_Proxy):
    """A collection whose every method (reads and writes) blocks until done."""

    def __init__(self, portal: BlockingPortal, target: Any) -> None:
        self._portal = portal
        self._target = target
        self.name: str = target.name

    def __getattr__(self, attr: str) -> Any:
        member = getattr(self._target, attr)
        if not callable(member):
            return self._run(lambda: getattr(self._target, attr))
        return lambda *a, **kw: self._run(member, *a, **kw)

    def __len__(self) -> int:
        return int(self._run(len, self._target))

    def __contains__(self, key: object) -> bool:
        return bool(self._run(lambda: key in self._target))

    def __getitem__(self, key: Any) -> Any:
        return self._run(lambda: self._target[key])

    def __iter__(self) -> Iterator[Any]:
        return iter(self._run(lambda: list(self._target)))

    def __str__(self) -> str:
        return str(self._run(str, self._target))


class BlockingRecord(_Proxy):
    """:class:`~crdtstore.Record` with blocking methods."""

    def __init__(self, portal: BlockingPortal, record: Record) -> None:
        self._portal = portal
        self._target = record
        self.run = record.run
        self.agent = record.agent
        self.source = record.source

    def map(self, name: str) -> BlockingCollection:
        return BlockingCollection(self._portal, self._run(self._target.map, name))

    def list(self, name: str) -> BlockingCollection:
        return BlockingCollection(self._portal, self._run(self._target.list, name))

    def text(self, name: str) -> BlockingCollection:
        return BlockingCollection(self._portal, self._run(self._target.text, name))

    def counter(self, name: str) -> BlockingCollection:
        """``rec.counter(name).add(5)`` and ``.value``, blocking."""
        return BlockingCollection(self._portal, self._run(self._target.counter, name))

    def to_dict(self) -> dict[str, Any]:
        return dict(self._run(self._target.to_dict))

    def flush(self) -> None:
        self._run(self._target.flush)

    def attributed(
        self, *, source: str | None = None, call: str | None = None
    ) -> AbstractContextManager[Record]:
        """:meth:`Record.attributed`: the block sets a context variable of the calling thread,
        which every call through the portal carries to the loop (anyio copies the context)."""
        record: Record = self._target
        return record.attributed(source=source, call=call)

    def sync(self) -> int:
        return int(self._run(self._target.sync))

    def provenance(self, collection: str, key: str) -> Any:
        return self._run(self._target.provenance, collection, key)

    def history(self, collection: str, key: str) -> Any:
        return self._run(self._target.history, collection, key)

    def journal(self, after: int = 0, limit: int = 1000) -> Any:
        return self._run(self._target.journal, after, limit)

    def collections(self) -> dict[str, str]:
        return dict(self._run(self._target.collections))

    def changes(self, *, local: bool = True, buffer: int = 1024) -> Iterator[Any]:
        """Iterate changes, blocking for each (stops when the record closes)."""
        stream = self._run(self._target.changes, local=local, buffer=buffer)
        try:
            while True:
                try:
                    yield self._portal.call(stream.__anext__)
                except StopAsyncIteration:
                    return
        finally:
            self._portal.call(stream.aclose)


class BlockingStore(_Proxy):
    """:class:`~crdtstore.Store` with blocking methods; owns a portal thread until closed."""

    def __init__(self, url: str, **options: Any) -> None:
        self._stack = ExitStack()
        try:
            self._portal = self._stack.enter_context(start_blocking_portal())
            store: Store = self._portal.call(lambda: _make(url, options))
            self._target = store
            self._stack.enter_context(self._portal.wrap_async_context_manager(store))
        except BaseException:
            self._stack.close()
            raise
        self.url = url
        self.tenant = store.tenant

    def open_record(
        self, run: str, agent: str, source: str = "model", **options: Any
    ) -> AbstractContextManager[BlockingRecord]:
        """The record as a context manager yielding a :class:`BlockingRecord`."""
        record: Record = self._run(self._target.open_record, run, agent, source, **options)
        return _RecordContext(self._portal, record)

    def __getattr__(self, attr: str) -> Any:
        member = getattr(self._target, attr)
        if not callable(member):
            return member
        return lambda *a, **kw: self._run(member, *a, **kw)

    def close(self) -> None:
        """Close every record and the store, and stop the portal thread. Idempotent."""
        self._stack.close()

    def __enter__(self) -> BlockingStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _make(url: str, options: dict[str, Any]) -> Store:
    return _open_store(url, **options)


class _RecordContext(AbstractContextManager[BlockingRecord]):
    def __init__(self, portal: BlockingPortal, record: Record) -> None:
        self._cm = portal.wrap_async_context_manager(record)
        self._portal = portal

    def __enter__(self) -> BlockingRecord:
        rec = self._cm.__enter__()
        return BlockingRecord(self._portal, rec)

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)


def open_store(url: str, **options: Any) -> BlockingStore:
    """Open a store for synchronous use; arguments as :func:`crdtstore.open_store`."""
    return BlockingStore(url, **options)
