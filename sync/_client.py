"""The ``ws://`` store: a crdtstore journal backend served by a hub.

::

    async with crdtstore.open_store("ws://127.0.0.1:8765/acme", token=token) as store:
        async with store.open_record("r1", "ignored") as rec:   # writes as the token's agent
            await rec.map("notes").set("a", 1)
            await rec.flush()                                   # the hub journaled it

:class:`WsJournal` is registered for the ``ws`` and ``wss`` schemes in the
``crdtstore.backends`` entry-point group. It is a journal backend, not a sync provider, so
the ``Record`` code is the same as on SQLite: it tails the run's journal through the hub
(``journal.read``, with the hub's positions, so versions agree with every other writer) and
appends through its committer (``journal.append``, answered once the hub journaled it). The
hub attributes every entry to the token's agent and source, never to what the client says.

One connection per run, with the subprotocol ``crdtstore``: the hub sends it no Yjs frames
(their content may not be journaled yet), only pushes when the journal head moves. The
connection, its reconnects and the exchange after each one: :mod:`sync._link`. Works on
asyncio and trio. What a hub refuses or does not support: :class:`WsJournal`.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any, Literal
from urllib.parse import quote, unquote, urlsplit

import anyio
from anyio.abc import TaskGroup
from pydantic import JsonValue

from crdtstore import (
    BackendError,
    CompactionResult,
    InvalidValue,
    StoreClosed,
    UnknownRun,
    UnsupportedOperation,
    UnsupportedURL,
)
from crdtstore.backend import (
    Authority,
    JournalBackend,
    LeaseBackend,
    NewEntry,
    RemoteJournal,
    Row,
    RunRow,
    SnapshotRow,
    check_name,
)

from ._client_append import append_chunk
from ._frames import APPEND_OP
from ._lease_rpc import RemoteLeases
from ._link import _EMPTY_UPDATES, _ConnectionLost, _Link
from ._redact_rpc import forget_redacted, request_redact
from ._rows import _entry_json, _row, _run_row

__all__ = ["WsJournal"]

log = logging.getLogger("sync.client")

_APPEND_BYTES = 4 * 1024 * 1024  # update bytes per journal.append request


# Ops that may be sent again when the connection drops before their answer: they read, or
# they are idempotent (run.ensure; a heartbeat renews). The others are not retried here:
# journal.append has its own retry (the hub does not journal a repeat twice); a guarded
# write, config.put and lease request/release/cancel fail with BackendError instead.
_RETRIED = frozenset(
    {
        "whoami",
        "run.ensure",
        "run.info",
        "journal.head",
        "journal.read",
        "journal.history",
        "journal.snapshot",
        "config.get",
        "lease.status",
        "lease.check",
        "lease.heartbeat",
        "lease.reap",
    }
)


class WsJournal(JournalBackend, RemoteJournal):
    """The journals of one tenant, served by the hub at ``url`` (``ws[s]://host:port/<tenant>``).

    A record on a ``ws://`` store takes the token's agent and source as its own (a ``source``
    given to ``rec.attributed`` is not applied there); the tool-call id of an entry
    (``rec.attributed(call=...)``) is sent with it, and the hub journals it as given. Each run
    has one connection, to ``ws://host:port/<tenant>/<run>?token=...``; requests use the
    extension messages of :class:`ClientSession`.

    **Closing while offline** (``rec.aclose()``, leaving the store): the record tries to send
    what is pending for up to ``offline_timeout`` seconds, then closes anyway and logs (error,
    logger ``crdtstore.record``) that it closed with unjournaled writes, and how many; those
    writes are lost to the hub. Give ``offline_timeout=`` to ``open_store`` to choose the bound.

    **Guarded writes** (``expected_version``, ``based_on``, fenced writes and claims) are made
    on a scratch copy of the document and sent with their guard (``journal.append_guarded``);
    the hub checks the guard and journals them atomically. Refusals arrive as the same crdtstore
    errors as on SQLite (``StaleVersion`` with the current version and value, ``LeaseLost``,
    ...).

    **Final refusals**: a refused token (HTTP 401/403 at the upgrade), an unknown or closed run
    (close 4404/4410) or a token closed while connected (4401/4403) raise the typed error at the
    next call instead of reconnecting; a write through a read-only token fails with
    :class:`crdtstore.ReadOnlyAccess` (final: the record stops journaling, as for a closed run).

    **Appends** go as binary append frames (no JSON or base64) to a hub whose ``whoami``
    lists ``journal.append`` in ``frames``, asked once per connection, else as JSON (see
    :mod:`sync._client_append`); ``append_frames = False`` sends the JSON ``journal.append``
    as clients before the frame did (``appends_framed`` counts the frames sent).

    **Redaction** (``store.redact``) is done by the hub on its store, as the token's agent,
    for a token with the ``redact`` right (else ``Forbidden``): see :mod:`sync._ops_redact`.

    Not supported through a hub (``UnsupportedOperation``): compaction and snapshots, deleting
    or closing runs, nested runs, raw journal transactions (``authority``); ``store.runs()``
    lists only the runs this store has opened. Leases go to the hub
    (:class:`~sync._lease_rpc.RemoteLeases`) over the connection of a run this store has open.

    Args:
        url: the hub and the tenant.
        token: the access token (required); its agent and source write every entry.
        connect_timeout: seconds opening a record waits for the connection of its run (and
            for each answer while it opens).
        offline_timeout: seconds a request waits for the connection to come back and for
            its answer before it fails with ``BackendError`` (the record's committer then
            retries its appends); also the bound on closing a record while offline.
        min_backoff, max_backoff: reconnect delays (doubling from the first to the second).

    Raises:
        UnsupportedURL: not ``ws[s]://host[:port]/<tenant>``.
        InvalidValue: no token, or a bad option.
    """

    name = "ws"

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        token: str | None = None,
        connect_timeout: float = 10.0,
        offline_timeout: float = 30.0,
        min_backoff: float = 0.05,
        max_backoff: float = 2.0,
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        urls = [u.strip() for part in urls for u in part.split(",") if u.strip()]
        if not urls:
            raise UnsupportedURL(str(url), "expected ws://host:port/<tenant> (or wss://)")
        bases: list[str] = []
        tenants: set[str] = set()
        for one in urls:
            parts = urlsplit(one)
            if parts.scheme not in ("ws", "wss") or not parts.netloc:
                raise UnsupportedURL(one, "expected ws://host:port/<tenant> (or wss://)")
            segments = [s for s in parts.path.split("/") if s]
            if len(segments) != 1 or parts.query or parts.fragment:
                raise UnsupportedURL(one, "expected ws://host:port/<tenant>: one path segment")
            tenants.add(unquote(segments[0]))
            bases.append(f"{parts.scheme}://{parts.netloc}")
        if len(tenants) != 1:
            raise UnsupportedURL(",".join(urls), "every hub URL must name the same tenant")
        segments = [tenants.pop()]
        self.tenant = check_name("tenant", unquote(segments[0]))
        if not isinstance(token, str) or not token:
            raise InvalidValue("a ws:// store needs token=... (see `crdtstore token`)")
        for what, value in (
            ("connect_timeout", connect_timeout),
            ("offline_timeout", offline_timeout),
            ("min_backoff", min_backoff),
            ("max_backoff", max_backoff),
        ):
            if not (isinstance(value, int | float) and value > 0):
                raise InvalidValue(f"{what} must be > 0 seconds, not {value!r}")
        self.url = ",".join(urls)
        self.bases = bases  # the hubs, tried in turn (see hub_failed)
        self.base = bases[0]
        self.token = token
        self.connect_timeout = float(connect_timeout)
        self.offline_timeout = float(offline_timeout)
        self.min_backoff = float(min_backoff)
        self.max_backoff = float(max(max_backoff, min_backoff))
        self._links: dict[str, _Link] = {}
        self._lease_backends: list[RemoteLeases] = []
        self._tg: TaskGroup | None = None
        self._wake: Callable[..., None] | None = None
        self.reads_kept = 0  # journal reads answered from pushed entries (tests, metrics)
        self.reads_asked = 0  # journal.read requests sent to the hub
        self._attached: dict[str, list[Any]] = {}  # run -> records (see `attach`)
        # run -> (the connection's session, whether its hub takes append frames): see `whoami`
        self._frames: dict[str, tuple[object, bool]] = {}
        self.append_frames = True  # send appends as frames to hubs that take them
        self.appends_framed = 0  # appends sent as frames (tests, metrics)
        self.exchanges = 0  # state-vector exchanges (one per attached record and connect)
        self.losses = 0  # exchanges that found the hub's journal behind a record
        self.resent = 0  # appends of what the hub lacked, sent by an exchange
        self._state: Literal["new", "open", "closed"] = "new"

    def __repr__(self) -> str:
        return f"<WsJournal {self.base}/{self.tenant}>"

    def hub_url(self, run: str, base: str, create: bool = True) -> str:
        """The WebSocket URL of ``run``'s connection to the hub at ``base`` (``create``
        False: the hub refuses a missing run with 4404 instead of creating it)."""
        return (
            f"{base}/{quote(self.tenant, safe='')}/{quote(run, safe='')}"
            f"?token={quote(self.token, safe='')}{'' if create else '&create=0'}"
        )

    def hub_failed(self, base: str) -> str:
        """A connection to ``base`` could not be made: the hub to try next (the one after it
        in the list, round). Hubs sharing one Redis hold no state that matters, so a run's
        connection may move to any; its state-vector exchange on connect (see ``_Link``)
        then sends what the new hub's journal lacks, so nothing acknowledged is lost."""
        if len(self.bases) == 1 or base not in self.bases:
            return base
        nxt = self.bases[(self.bases.index(base) + 1) % len(self.bases)]
        log.info("ws %s: hub %s unreachable, trying %s", self.tenant, base, nxt)
        return nxt

    # -- lifecycle and wiring ---------------------------------------------------------------

    def bind(self, wake: Callable[[str, str], None]) -> None:
        self._wake = wake

    def attach(self, tenant: str, run: str, record: Any) -> None:
        """Take part in ``record``'s resync: on every reconnect of ``run``'s connection, its
        document and journal position are compared with the hub's (the state-vector
        exchange, see ``_Link._exchange``) before its requests go out. Called by the
        record once it has loaded (and :meth:`detach` when it closes)."""
        if tenant == self.tenant:
            self._attached.setdefault(run, []).append(record)

    def detach(self, tenant: str, run: str, record: Any) -> None:
        records = self._attached.get(run, [])
        if record in records:
            records.remove(record)
        if not records:
            self._attached.pop(run, None)

    def _wake_run(self, run: str, seq: int | None = None) -> None:
        """Wake the readers of ``run`` (the store's notifier: ``wake(tenant, run, seq)``);
        ``seq``, when known, the journal position the hub announced (readers that applied
        it need not read)."""
        if self._wake is not None:
            if seq is None:
                self._wake(self.tenant, run)
            else:
                self._wake(self.tenant, run, seq)

    async def open(self) -> None:
        if self._state != "new":
            raise StoreClosed("ws journal")
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._state = "open"

    async def aclose(self) -> None:
        if self._state != "open":
            self._state = "closed"
            return
        self._state = "closed"
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)

    async def _link(self, tenant: str, run: str, create: bool | None = None) -> _Link:
        """The connection of ``run`` (made on first use). ``create``: whether connecting may
        create the run (only ``ensure_run(create=True)`` asks; a read of a missing run must
        not create it); a connection refused for a missing run is made again by the next
        call (the run may exist by then)."""
        if self._state != "open":
            raise StoreClosed("ws journal")
        if tenant != self.tenant:
            raise InvalidValue(f"this ws:// store serves tenant {self.tenant!r}, not {tenant!r}")
        link = self._links.get(run)
        if link is not None and isinstance(link.final, UnknownRun):
            link = None  # (ended: its serve task returned with the refusal)
        if link is None:
            link = self._links[run] = _Link(self, run, create=create is True)
            assert self._tg is not None
            self._tg.start_soon(link.serve)
        return link

    async def call(
        self, run: str, op: str, params: dict[str, JsonValue] | None = None
    ) -> JsonValue:
        """The result of the hub's op ``op`` on ``run``'s connection, or its error raised.

        A dropped connection is waited out (up to ``offline_timeout``) and a read or
        idempotent op sent again; then ``BackendError``."""
        link = await self._link(self.tenant, run)
        return await self._request(link, op, params or {}, self.offline_timeout)

    async def _request(
        self,
        link: _Link,
        op: str,
        params: dict[str, JsonValue],
        timeout: float,  # noqa: ASYNC109 - for the connection only, then BackendError
    ) -> JsonValue:
        """``link.call``, sent again after a drop while ``timeout`` seconds have not passed
        (ops in ``_RETRIED`` only). A drop it gives up on raises a plain ``BackendError``."""
        deadline = anyio.current_time() + timeout
        while True:
            try:
                return await link.call(op, params, max(0.0, deadline - anyio.current_time()))
            except _ConnectionLost as exc:
                if op in _RETRIED and anyio.current_time() < deadline:
                    log.info("ws %s/%s: %s; asking again", self.tenant, link.run, exc)
                    continue
                if op in _RETRIED:
                    raise BackendError(
                        "ws", f"{exc}; the hub did not come back within {timeout:g} s"
                    ) from None
                raise BackendError("ws", f"{exc} (it may or may not have been done)") from None

    async def _leases_call(self, op: str, params: dict[str, JsonValue]) -> JsonValue:
        # leases belong to the tenant: any open run's connection carries them
        for run in self._links:
            return await self.call(run, op, params)
        raise UnsupportedOperation("ws", "leases", "open a record first: they use its connection")

    def lease_backend(self) -> LeaseBackend:
        """The hub's leases, over the connection of a run this store has open; its waiters
        wake on the hub's lease pushes."""
        leases = RemoteLeases(self._leases_call)
        self._lease_backends.append(leases)
        return leases

    def _leases_changed(self) -> None:
        for leases in self._lease_backends:
            leases.pushed()

    async def identity(self, tenant: str, run: str) -> tuple[str, str]:
        link = await self._link(tenant, run)
        if link.identity is None:
            claims = await self._whoami(link, self.connect_timeout)
            link.identity = (str(claims.get("agent")), str(claims.get("source", "model")))
            link.read_only = claims.get("mode") == "ro"
        return link.identity

    async def _whoami(self, link: _Link, timeout: float) -> dict[str, Any]:  # noqa: ASYNC109
        """The hub's ``whoami``; noted for the connection that answered it (when it did not
        change meanwhile): whether its hub takes append frames."""
        connects, session = link.connects, link.session
        claims = await self._request(link, "whoami", {}, timeout)
        if not isinstance(claims, dict):
            raise BackendError("ws", f"malformed whoami answer {claims!r}")
        if session is not None and link.connects == connects and link.session is session:
            frames = claims.get("frames")
            self._frames[link.run] = (session, isinstance(frames, list) and APPEND_OP in frames)
        return claims

    async def read_only(self, tenant: str, run: str) -> bool:
        await self.identity(tenant, run)
        return (await self._link(tenant, run)).read_only

    # -- runs -------------------------------------------------------------------------------

    async def ensure_run(
        self, tenant: str, run: str, *, create: bool, parent: str | None = None
    ) -> RunRow:
        if parent is not None:
            raise UnsupportedOperation("ws", "nested runs")
        link = await self._link(tenant, run, create)
        await link.ready(self.connect_timeout)
        got = await self._request(link, "run.ensure", {"create": create}, self.connect_timeout)
        return _run_row(got)

    async def get_run(self, tenant: str, run: str) -> RunRow | None:
        await self._link(tenant, run)
        try:
            got = await self.call(run, "run.info")
        except UnknownRun:  # its connection was refused: the run does not exist
            return None
        return None if got is None else _run_row(got)

    async def set_run(
        self,
        tenant: str,
        run: str,
        *,
        state: str | None = None,
        delete_after: float | Literal["keep"] | None = "keep",
    ) -> RunRow:
        raise UnsupportedOperation("ws", "closing runs and retention", "ask the hub's operator")

    async def list_runs(self, tenant: str) -> list[RunRow]:
        """The runs this store has a connection to (a token reaches its own runs only)."""
        rows = [await self.get_run(tenant, run) for run in list(self._links)]
        return sorted((r for r in rows if r is not None), key=lambda r: r.created)

    async def delete_run(self, tenant: str, run: str) -> bool:
        raise UnsupportedOperation("ws", "deleting runs", "ask the hub's operator")

    # -- journal ----------------------------------------------------------------------------

    async def append(
        self, tenant: str, run: str, entries: Sequence[NewEntry], *, durable: bool
    ) -> list[int]:
        await self._link(tenant, run)
        seqs: list[int] = []
        chunk: list[NewEntry] = []
        size = 0
        for entry in entries:
            if chunk and size + len(entry.update) > _APPEND_BYTES:
                seqs.extend(await self._append_chunk(run, chunk, durable))
                chunk, size = [], 0
            chunk.append(entry)
            size += len(entry.update)
        if chunk:
            seqs.extend(await self._append_chunk(run, chunk, durable))
        return seqs

    async def _append_chunk(self, run: str, chunk: list[NewEntry], durable: bool) -> list[int]:
        return await append_chunk(self, run, chunk, durable)  # (as a frame or JSON: there)

    async def append_guarded(
        self,
        tenant: str,
        run: str,
        entry: NewEntry,
        *,
        expected: tuple[str, str, int] | None = None,
        based_on: tuple[str, int] | None = None,
        fence: tuple[str, int, str] | None = None,
    ) -> int:
        """Send a guarded entry: the hub checks the guards and journals it atomically (see
        ``Record._write_guarded_remote``); its journal position, or the guard's error."""
        await self._link(tenant, run)
        params: dict[str, JsonValue] = {"entry": _entry_json(entry)}
        if expected is not None:
            params["expected"] = list(expected)
        if based_on is not None:
            params["based_on"] = list(based_on)
        if fence is not None:
            params["fence"] = list(fence)
        got = await self.call(run, "journal.append_guarded", params)
        if type(got) is not int:
            raise BackendError("ws", f"malformed journal.append_guarded answer {got!r}")
        link = await self._link(tenant, run)
        link.saw(got)
        if entry.update not in _EMPTY_UPDATES:  # else `got` is a version, not its entry
            link.mark(got, entry.checksum)
        return got

    async def read(
        self, tenant: str, run: str, after: int, limit: int = 10_000, *, skip_client: int = -1
    ) -> list[Row]:
        """The run's entries after ``after``: from the entries the hub pushed when they
        continue from ``after`` up to the newest position known (see ``_Link.cached``), else
        from the hub (``journal.read``)."""
        link = await self._link(tenant, run)
        kept = link.cached(after, limit, skip_client)
        if kept is not None:
            self.reads_kept += 1
            return forget_redacted(link, kept)
        epoch = link.epoch
        out: list[Row] = []
        while len(out) < limit:
            params: dict[str, JsonValue] = {
                "after": out[-1].seq if out else after,
                "limit": limit - len(out),
                "skip_client": skip_client,
            }
            self.reads_asked += 1
            got = await self.call(run, "journal.read", params)
            if not isinstance(got, dict) or not isinstance(got.get("rows"), list):
                raise BackendError("ws", "malformed journal.read answer")
            rows = got["rows"]
            assert isinstance(rows, list)
            if link.epoch != epoch:  # asked from a position the exchange moved back
                return []
            got_rows = [_row(r) for r in rows]
            for row in got_rows:
                link.mark(row.seq, row.checksum)
            out.extend(got_rows)
            if out:
                link.saw(out[-1].seq)
            if not rows or got.get("more") is not True:
                break
        return forget_redacted(link, out)

    def kept(self, tenant: str, run: str, after: int, limit: int) -> list[Row] | None:
        """A record tail's read answered now from the entries the hub pushed, or None (then
        it reads): see ``_Link.kept``."""
        link = self._links.get(run) if tenant == self.tenant else None
        return None if link is None else link.kept(after, limit)

    async def head(self, tenant: str, run: str) -> int:
        await self._link(tenant, run)
        got = await self.call(run, "journal.head")
        if type(got) is not int:
            raise BackendError("ws", f"malformed journal.head answer {got!r}")
        (await self._link(tenant, run)).saw(got)
        return got

    async def load_snapshot(self, tenant: str, run: str) -> SnapshotRow | None:
        await self._link(tenant, run)
        got = await self.call(run, "journal.snapshot")
        if got is None:
            return None
        if not isinstance(got, dict):
            raise BackendError("ws", "malformed journal.snapshot answer")
        try:
            return SnapshotRow(
                int(got["seq"]),  # type: ignore[arg-type]
                base64.b64decode(str(got["update"])),
                dict(got["state"]),  # type: ignore[arg-type]
                float(got["created"]),  # type: ignore[arg-type]
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendError("ws", f"malformed journal.snapshot answer: {exc}") from None

    async def save_snapshot(
        self, tenant: str, run: str, snapshot: SnapshotRow, *, drop_journal: bool
    ) -> None:
        raise UnsupportedOperation("ws", "compaction", "compact on the hub's store")

    async def history(self, tenant: str, run: str, collection: str, key: str) -> list[Row]:
        await self._link(tenant, run)
        got = await self.call(run, "journal.history", {"collection": collection, "key": key})
        if not isinstance(got, list):
            raise BackendError("ws", "malformed journal.history answer")
        return [_row(r) for r in got]

    async def redact(
        self,
        tenant: str,
        run: str,
        collection: str,
        key: str | None,
        *,
        field: str | None,
        index: int | None,
        span: tuple[int, int] | None,
        reason: str,
    ) -> CompactionResult:
        """The hub redacts (``run.redact``): see :func:`sync._redact_rpc.request_redact`."""
        await self._link(tenant, run)
        return await request_redact(
            partial(self.call, run), collection, key, field, index, span, reason
        )

    # -- config -----------------------------------------------------------------------------

    async def get_config(self, tenant: str, run: str) -> dict[str, Any]:
        await self._link(tenant, run)
        got = await self.call(run, "config.get")
        if not isinstance(got, dict):
            raise BackendError("ws", "malformed config.get answer")
        return dict(got)

    async def update_config(
        self, tenant: str, run: str, update: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        """Compare-and-set on the hub (a function cannot travel): read, apply ``update``,
        put it if the config is still what was read, else start again."""
        from crdtstore import StaleVersion

        while True:
            current = await self.get_config(tenant, run)
            new = update(dict(current))
            if new == current:
                return current
            try:
                got = await self.call(run, "config.put", {"expected": current, "new": new})
            except StaleVersion:
                continue
            if not isinstance(got, dict):
                raise BackendError("ws", "malformed config.put answer")
            return dict(got)

    def authority(
        self, tenant: str, run: str, *, durable: bool
    ) -> AbstractAsyncContextManager[Authority]:
        raise UnsupportedOperation(
            "ws", "journal transactions", "guarded writes are sent to the hub instead"
        )
