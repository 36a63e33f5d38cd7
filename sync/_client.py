"""The ``ws://`` store: a crdtstore journal backend served by a hub.

::

    async with crdtstore.open_store("ws://127.0.0.1:8765/acme", token=token) as store:
        async with store.open_record("r1", "ignored") as rec:   # writes as the token's agent
            await rec.map("notes").set("a", 1)
            await rec.flush()                                   # the hub journaled it

:class:`WsJournal` is registered for the ``ws`` and ``wss`` schemes in the
``crdtstore.backends`` entry-point group; the URL names the hub and the tenant
(``ws://host:port/<tenant>``) and ``token=`` is the access token (``crdtstore token``). The
``Record`` code is the same as on SQLite: it tails the run's journal (``journal.read`` on the
hub, with the hub's journal positions, so versions agree with every other writer) and appends
its writes through the committer (``journal.append``, answered once the hub journaled them: so
``await rec.flush()`` returns when the hub holds everything written so far). The hub derives
what each entry did and attributes it to the token's agent and source (never to what the
client says); a record on a ``ws://`` store takes the token's agent and source as its own
(a ``source`` given to ``rec.attributed`` is not applied there). The tool-call id of an entry
(``rec.attributed(call=...)``) is sent with it, and the hub journals it as given.

**One connection per run**, to ``ws://host:port/<tenant>/<run>?token=...`` with the
subprotocol ``crdtstore``: the hub then sends it no Yjs sync or update frames (whose content
may not be journaled yet), only a push when the run's journal head moves, which wakes the
record's tail. Requests use the extension messages of :class:`ClientSession`.

**Pushed entries.** A head push usually carries the new journal entries themselves (see
``sync._ops_journal``). The connection keeps them (the newest ``_KEEP_ROWS``) and answers the
record's next ``journal.read`` from them, without a round trip, when they hold every position
from the one asked for up to the newest position the connection knows the journal holds
(from pushes and from answers: its own appends included); anything else (a hole, a position
at or past that one, a new connection: the kept entries are dropped on every connect) is
asked of the hub. So a read answered from them is what the hub answered, or would have,
when its head was that position: no entry is skipped or given twice, whatever the order of
pushes, answers and reconnects.

**Offline.** When the connection drops, it is re-opened with exponential backoff (up to
``max_backoff`` seconds). Meanwhile writes go on locally and stay pending in the record's
committer, whose appends wait for the connection (up to ``offline_timeout`` seconds, then
fail with ``BackendError`` and are retried). After a reconnect the record re-reads the journal
after the last position it applied, and each record attached to the store
(:meth:`WsJournal.attach`, which ``Record`` calls once it has loaded) first compares itself
with the hub (``journal.state``, one request, before any other of the connection): the
hub's journal head, its state vector and the checksum of its entry at the record's
position. Usually they agree and nothing more is sent. When the hub lost entries the record
had taken in (the hub's store restored from a backup, or its last ``synchronous=NORMAL``
commits lost: the head is below the record's position, the entry there is another one, or
the hub's state vector lacks what the record holds besides its pending writes), the record
sends what the hub lacks (``doc.get_update(hub_state_vector)``, every delete with it) as
an ordinary append, journaled as the token's writes (also another writer's lost entries
the record had seen: the hub believes only the token; a read-only token sends nothing),
and moves its journal position back to the last entry it read that the hub still holds
(the link keeps the checksums of the latest ``_MARKS`` positions), so that it reads the
positions the hub reused instead of skipping them; knowing none, it takes in what the hub
holds that it lacks (no provenance for that content in this record) and reads on from the
hub record's position. A delete that was the only content lost is sent again only when
something else tells the loss (a state vector does not hold deletes). An
append whose answer was lost is sent again; the hub does not journal it twice. Reads and
idempotent requests (opening a record: ``run.ensure``, ``whoami``, the first reads) are sent
again the same way; other requests (a guarded write, a lease request or release) whose answer
was lost fail with ``BackendError`` (they may or may not have been done). A connection that
gives no answer within a request's timeout (a silent network, a stalled hub) counts as lost:
it is closed and re-opened.

**Closing while offline** (``rec.aclose()``, leaving the store): the record tries to send
what is pending for up to ``offline_timeout`` seconds, then closes anyway and logs (error,
logger ``crdtstore.record``) that it closed with unjournaled writes, and how many; those
writes are lost to the hub. Give ``offline_timeout=`` to ``open_store`` to choose the bound.

**Guarded writes** (``expected_version``, ``based_on``, fenced writes and claims) are made on a
scratch copy of the document and sent with their guard (``journal.append_guarded``); the hub
checks the guard and journals them atomically. Refusals arrive as the same crdtstore errors as
on SQLite (``StaleVersion`` with the current version and value, ``LeaseLost``, ...).

**Final refusals**: a refused token (HTTP 401/403 at the upgrade), an unknown or closed run
(close 4404/4410) or a token closed while connected (4401/4403) raise the typed error at the
next call instead of reconnecting; a write through a read-only token fails with
:class:`crdtstore.ReadOnlyAccess` (final: the record stops journaling, as for a closed run).

Not supported through a hub (``UnsupportedOperation``): compaction and snapshots, deleting or
closing runs, nested runs, raw journal transactions (``authority``); ``store.runs()`` lists
only the runs this store has opened. Leases go to the hub
(:class:`~sync._lease_rpc.RemoteLeases`) over the connection of a run this store has open.

Works on asyncio and trio (``websockets``' implementation for each).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, cast
from urllib.parse import quote, unquote, urlsplit

import anyio
import sniffio
from anyio.abc import TaskGroup
from pycrdt import Doc
from pydantic import JsonValue
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Subprotocol

from crdtstore import (
    BackendError,
    CrdtStoreError,
    InvalidValue,
    ReadOnlyAccess,
    RunClosed,
    StoreClosed,
    UnknownRun,
    UnsupportedOperation,
    UnsupportedURL,
)
from crdtstore._errors import error_from_dict
from crdtstore._journal import (
    Authority,
    JournalBackend,
    NewEntry,
    Row,
    RunRow,
    SnapshotRow,
)
from crdtstore._leases import LeaseBackend
from crdtstore._names import check_name

from ._document import PycrdtDocument
from ._errors import CloseCode, ProtocolError
from ._lease_rpc import RemoteLeases, error_from_info
from ._messages import DEFAULT_MAX_MESSAGE_SIZE, Push, Response, decode_state_vector
from ._session import ClientSession
from ._tokens import Forbidden, TokenInvalid

__all__ = ["WsJournal"]

log = logging.getLogger("sync.client")

SUBPROTOCOL = "crdtstore"
_APPEND_BYTES = 4 * 1024 * 1024  # update bytes per journal.append request
_KEEP_ROWS = 1024  # pushed journal entries kept per run (the newest), ...
_KEEP_BYTES = 16 * 1024 * 1024  # ... and their update bytes at most
_EMPTY_UPDATES = (b"\x00\x00",)
_MARKS = 256  # journal positions whose entry's checksum a link keeps (MAX_MARKS of the hub)
_FINAL_CLOSES = {
    CloseCode.UNAUTHORIZED,
    CloseCode.FORBIDDEN,
    CloseCode.UNKNOWN_RUN,
    CloseCode.RUN_CLOSED,
}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _row(item: Any) -> Row:
    try:
        # a tenth item, the call id, only when the entry has one (see sync._ops_journal)
        seq, agent, source, client_id, wall, update, effect, crc, origin, *rest = item
        if len(rest) > 1 or (rest and type(rest[0]) is not str):
            raise ValueError(f"a row has 9 or 10 items, the last a call id: {item!r}"[:200])
        return Row(
            int(seq),
            str(agent),
            str(source),
            int(client_id),
            float(wall),
            base64.b64decode(update),
            list(effect),
            int(crc),
            str(origin),
            rest[0] if rest else "",
        )
    except (TypeError, ValueError) as exc:
        raise BackendError("ws", f"malformed journal row from the hub: {exc}") from None


def _entry_json(entry: NewEntry) -> JsonValue:
    """An entry as ``journal.append`` sends it: the update and the client id, and the call id
    when it has one (the hub decides agent, source, time and effect itself)."""
    out: dict[str, JsonValue] = {"update": _b64(entry.update), "client_id": entry.client_id}
    if entry.call:
        out["call"] = entry.call
    return out


def _run_row(item: Any) -> RunRow:
    if not isinstance(item, dict):
        raise BackendError("ws", f"malformed run from the hub: {item!r}")
    try:
        return RunRow(**item)
    except TypeError as exc:
        raise BackendError("ws", f"malformed run from the hub: {exc}") from None


class _ConnectionLost(BackendError):
    """The connection dropped before the answer came (the request may have been done).
    Internal: callers get a plain ``BackendError`` (see :meth:`WsJournal._request`)."""


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


class _Waiter:
    __slots__ = ("event", "response")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.response: Response | None = None


class _Link:
    """The connection of one run: kept open (reconnecting with backoff) until closed."""

    def __init__(self, journal: WsJournal, run: str) -> None:
        self.journal = journal
        self.run = run
        self.url = (
            f"{journal.base}/{quote(journal.tenant, safe='')}/{quote(run, safe='')}"
            f"?token={quote(journal.token, safe='')}"
        )
        self.ws: Any = None
        self.session: ClientSession | None = None
        self.up = anyio.Event()  # set while connected; replaced when the connection drops
        self.changed = anyio.Event()  # fired on every connect, drop and final refusal
        self.final: CrdtStoreError | None = None
        self.waiters: dict[int | str, _Waiter] = {}
        self.identity: tuple[str, str] | None = None
        self.read_only = False
        self.connects = 0
        self._scope: anyio.CancelScope | None = None  # the open connection's session
        # journal entries the hub pushed on this connection (by position), and the highest
        # journal position this connection learnt of (pushes, answers): see `cached`
        self.rows: dict[int, Row] = {}
        self.rows_bytes = 0
        self.known = 0
        # the state-vector exchange of the open connection is done (see `_resync`): until
        # then only its own requests go out; `epoch` counts the records' journal positions
        # moved back (a read asked before that answers nothing: the record reads again)
        self.synced = False
        self.exchanging = False  # from a connect until its exchange is done
        self.epoch = 0
        # the checksum of the entry at each of the latest journal positions this store read
        # or wrote (kept across connections: the exchange compares them with the hub's)
        self.marks: dict[int, int] = {}

    def mark(self, seq: int, crc: int) -> None:
        if self.exchanging:  # a connection not compared yet may reuse what a mark names
            return
        self.marks[seq] = crc
        if len(self.marks) > 2 * _MARKS:
            self.marks = dict(sorted(self.marks.items())[-_MARKS:])

    def _fire(self) -> None:
        old, self.changed = self.changed, anyio.Event()
        old.set()

    def _connect(self) -> AbstractAsyncContextManager[Any]:
        kwargs: dict[str, Any] = {
            "subprotocols": [Subprotocol(SUBPROTOCOL)],
            "compression": None,
            "open_timeout": self.journal.connect_timeout,
            "close_timeout": 1.0,
            "max_size": 2 * DEFAULT_MAX_MESSAGE_SIZE,
            "proxy": None,
        }
        if sniffio.current_async_library() == "trio":
            from websockets.trio.client import connect as trio_connect

            return trio_connect(self.url, **kwargs)
        from websockets.asyncio.client import connect as asyncio_connect

        return asyncio_connect(self.url, **kwargs)

    def _refused(self, exc: InvalidStatus) -> CrdtStoreError:
        status = exc.response.status_code
        body = exc.response.body.decode(errors="replace").strip() if exc.response.body else ""
        code, _, reason = body.partition(": ")
        if status in (401, 403):
            if code.isupper():  # the hub's "CODE: reason"
                return error_from_dict({"code": code, "message": reason or body})
            return TokenInvalid(body) if status == 401 else Forbidden(body)
        return BackendError("ws", f"the hub refused the connection: HTTP {status} {body}")

    def _closed_error(self, code: int, reason: str) -> CrdtStoreError:
        tenant = self.journal.tenant
        if code == CloseCode.UNKNOWN_RUN:
            return UnknownRun(tenant, self.run)
        if code == CloseCode.RUN_CLOSED:
            return RunClosed(tenant, self.run, "closed")
        name, _, _ = reason.partition(":")
        return error_from_dict({"code": name or "TOKEN_INVALID", "message": reason})

    async def serve(self) -> None:
        """Keep the connection open until cancelled, or until a final refusal."""
        backoff = self.journal.min_backoff
        while True:
            connected = False
            try:
                async with self._connect() as ws:
                    connected = True
                    try:
                        with anyio.CancelScope() as self._scope:
                            await self._session(ws)
                    finally:  # also when the store closes: do not leak the socket
                        with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                            close = getattr(ws, "aclose", None) or ws.close  # trio: aclose
                            await close()
            except InvalidStatus as exc:
                if exc.response.status_code in (400, 401, 403, 404):
                    self.final = self._refused(exc)
                    log.warning("ws %s/%s: %s", self.journal.tenant, self.run, self.final)
            except (OSError, InvalidHandshake, TimeoutError, ConnectionClosed) as exc:
                log.debug("ws %s/%s: connection failed: %s", self.journal.tenant, self.run, exc)
            finally:
                self._down()
            if self.final is not None:
                return
            backoff = self.journal.min_backoff if connected else backoff * 2
            backoff = min(backoff, self.journal.max_backoff)
            await anyio.sleep(backoff)

    async def _session(self, ws: Any) -> None:
        self.session = ClientSession(PycrdtDocument(Doc()))
        self.ws = ws
        self.synced = False
        self.exchanging = True
        self.connects += 1
        self.forget()  # a new connection (maybe to a restarted hub): nothing kept is trusted
        self.up.set()
        self._fire()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._resync, ws)
            await self._receive(ws)
            tg.cancel_scope.cancel()

    async def _receive(self, ws: Any) -> None:
        assert self.session is not None
        try:
            while True:
                frame = await ws.recv()
                if isinstance(frame, str):
                    raise ProtocolError("the hub sent a text frame")
                received = self.session.receive(frame)
                message = received.message
                if isinstance(message, Response):
                    waiter = self.waiters.pop(message.id, None)
                    if waiter is not None:
                        waiter.response = message
                        waiter.event.set()
                elif isinstance(message, Push):
                    if message.push == "head":
                        self.pushed(message)
                    elif message.push == "leases":
                        self.journal._leases_changed()
        except ConnectionClosed as exc:
            rcvd = exc.rcvd
            if rcvd is not None and rcvd.code in _FINAL_CLOSES:
                self.final = self._closed_error(rcvd.code, rcvd.reason)
                log.warning("ws %s/%s: %s", self.journal.tenant, self.run, self.final)
            else:
                log.info("ws %s/%s: connection lost (%s)", self.journal.tenant, self.run, exc)
        except ProtocolError as exc:
            log.warning("ws %s/%s: %s; reconnecting", self.journal.tenant, self.run, exc)

    # -- the state-vector exchange -------------------------------------------------------------

    async def _resync(self, ws: Any) -> None:
        """Compare the attached records with the hub (:meth:`_exchange`), then let the
        other requests go and wake the run's readers (they read after what they applied).
        A connection lost meanwhile leaves it to the next one; an error (an older hub
        without ``journal.state``) is logged and the resync is by journal position only."""
        try:
            await self._exchange()
        except _ConnectionLost:
            return
        except CrdtStoreError as exc:
            log.warning(
                "ws %s/%s: state-vector exchange failed: %s", self.journal.tenant, self.run, exc
            )
        if self.ws is not ws:
            return
        self.synced = True
        self.exchanging = False
        self._fire()
        self.journal._wake_run(self.run)  # resync: the tail re-reads after what it applied
        self.journal._leases_changed()  # lease pushes may have been missed while down

    async def _state(self, params: dict[str, JsonValue]) -> dict[str, Any]:
        got = await self.call("journal.state", params, self.journal.connect_timeout, early=True)
        malformed = BackendError("ws", f"malformed journal.state answer {got!r}")
        if not isinstance(got, dict):
            raise malformed
        out: dict[str, Any] = {}
        for name in ("head", "applied", "match", "at_checksum"):
            value = got.get(name)
            if not (type(value) is int or (value is None and name not in ("head", "applied"))):
                raise malformed
            out[name] = value
        try:
            for name in ("state", "missing"):
                out[name] = base64.b64decode(str(got.get(name, "AAA=")), validate=True)
            out["sv"] = decode_state_vector(out["state"])
        except ValueError:  # ProtocolError included
            raise malformed from None
        return out

    async def _exchange(self) -> None:
        """The state-vector exchange of each record attached to this run (see
        :meth:`WsJournal.attach`), before any of their requests go out on the connection.

        One ``journal.state`` request per record gives the hub's journal head, its state
        vector and the checksum of its entry at the record's journal position. The hub lost
        entries the record took in (its store was restored from a backup, or lost its last
        commits) when its head is below that position, or the entry there is another one
        (the hub reused the position), or its state vector lacks what the record's document
        holds (when the record has no pending write: those are in the document, and the
        committer sends them). Then the record sends what the hub's state vector lacks as
        an ordinary ``journal.append`` (journaled as the token's agent: the hub believes
        only the token), and moves its journal position back to the highest one whose
        entry it read is still the hub's (a second ``journal.state``, with the positions
        and checksums this link kept), so that its tail reads again what follows; when
        none is, it takes in what the hub holds that it lacks (``missing``) and moves back
        to where the hub's record holds every entry. Nothing is sent when nothing was
        lost."""
        journal = self.journal
        for rec in list(journal._attached.get(self.run, ())):
            if rec._state != "open":
                continue
            seq = rec.applied_seq
            crc = self.marks.get(seq)
            hub = await self._state({} if crc is None else {"at": seq})
            journal.exchanges += 1
            doc = rec.replica.doc
            hub_sv = hub["sv"]
            lacking = any(  # inserts the hub lacks
                clock > hub_sv.get(client, 0)
                for client, clock in decode_state_vector(bytes(doc.get_state())).items()
            )
            moved = crc is not None and hub["at_checksum"] != crc
            if not (seq > hub["head"] or moved or (lacking and not rec._pending)):
                continue
            journal.losses += 1
            log.warning(
                "ws %s/%s: the hub lost journal entries this record took in (its position %d,"
                " the hub's head %d); sending what it lacks",
                journal.tenant,
                self.run,
                seq,
                hub["head"],
            )
            # what the hub's state vector lacks, with every delete (a state vector does not
            # tell which deletes the hub holds: a lost delete must come back too)
            diff = bytes(doc.get_update(hub["state"]))
            if diff not in _EMPTY_UPDATES and not self.read_only:
                entry: JsonValue = {"update": _b64(diff), "client_id": rec.replica.client_id}
                try:
                    await self.call(
                        "journal.append",
                        {"entries": [entry], "durable": True},
                        journal.offline_timeout,
                        early=True,
                    )
                    journal.resent += 1
                except _ConnectionLost:
                    raise
                except CrdtStoreError as exc:  # refused (a budget, a policy, its size)
                    log.error(
                        "ws %s/%s: the hub refused what it lost (%d bytes), it stays lost to"
                        " the hub: %s",
                        journal.tenant,
                        self.run,
                        len(diff),
                        exc,
                    )
            marks = [[s, c] for s, c in sorted(self.marks.items()) if s <= seq][-_MARKS:]
            params: dict[str, JsonValue] = {"state": _b64(bytes(doc.get_state()))}
            if marks:
                params["marks"] = cast(JsonValue, marks)
            hub = await self._state(params)
            target = hub["match"] if hub["match"] is not None and hub["match"] >= 0 else -1
            while rec._txn_task is not None:  # never inside a local transaction
                await rec._txn_idle.wait()
            if target < 0:  # no entry in common that this link knows of
                target = hub["applied"]
                if hub["missing"] not in _EMPTY_UPDATES:
                    rec.replica.apply_update(hub["missing"], trial_decode=False, size_limit=False)
                    rec._invalidate_all()
            if target < rec.applied_seq:
                rec.applied_seq = target
                rec._applied_foreign = {s for s in rec._applied_foreign if s <= target}
                self.marks = {s: c for s, c in self.marks.items() if s <= target}
                self.epoch += 1

    # -- pushed journal entries ----------------------------------------------------------------

    def forget(self) -> None:
        self.rows = {}
        self.rows_bytes = 0
        self.known = 0

    def saw(self, seq: int) -> None:
        """The journal holds position ``seq`` (an answer said so)."""
        if seq > self.known:
            self.known = seq

    def pushed(self, push: Push) -> None:
        """A head push: keep its entries, then wake the run's readers."""
        if push.rows:
            try:
                rows = [_row(item) for item in push.rows]
            except BackendError as exc:  # kept nothing: the readers ask the hub
                log.warning("ws %s/%s: %s (push ignored)", self.journal.tenant, self.run, exc)
                rows = []
            for row in rows:
                if row.seq not in self.rows:
                    self.rows[row.seq] = row
                    self.rows_bytes += len(row.update)
                self.mark(row.seq, row.checksum)
            if len(self.rows) > 2 * _KEEP_ROWS or self.rows_bytes > _KEEP_BYTES:
                self._trim(max(self.rows) - _KEEP_ROWS)
        self.saw(push.seq)
        self.journal._wake_run(self.run, push.seq)

    def _trim(self, upto: int) -> None:
        """Drop the kept entries at positions up to ``upto``."""
        if self.rows_bytes > _KEEP_BYTES:
            self.rows, self.rows_bytes = {}, 0
            return
        self.rows = {s: r for s, r in self.rows.items() if s > upto}
        self.rows_bytes = sum(len(r.update) for r in self.rows.values())

    def cached(self, after: int, limit: int, skip_client: int) -> list[Row] | None:
        """``journal.read(after, limit, skip_client)`` answered from the pushed entries, or
        None (then ask the hub).

        Only when they hold every position from ``after + 1`` up to the highest position
        this connection knows the journal holds (``known``: pushes and answers), which the
        hub's answer would start with: the answer is the one the hub gave when its journal
        head was ``known``. Entries are never skipped (no hole is crossed) nor given twice
        by a read from the same position; a read from ``known`` or later asks the hub (it
        may hold more)."""
        known, rows = self.known, self.rows
        if after >= known or after + 1 not in rows or self.exchanging:
            return None  # (exchanging: the record's position may be moved back first)
        out: list[Row] = []
        seq = after + 1
        while seq <= known and len(out) < limit:
            row = rows.get(seq)
            if row is None:  # a hole: the hub knows
                return None
            if row.client_id != skip_client:
                out.append(row)
            self.mark(seq, row.checksum)  # (pushed before the exchange: not marked then)
            seq += 1
        if after in rows:  # read by position: those up to `after` are done with
            self._trim(after)
        return out

    def _abort(self, ws: Any) -> None:
        """Give up on ``ws`` (it did not answer in time): end its session now (its requests
        fail, ``serve`` closes it and reconnects)."""
        if self.ws is ws and self._scope is not None:
            self._scope.cancel()
            self._down()

    def _down(self) -> None:
        self.ws = None
        self.session = None
        self.up = anyio.Event()
        waiters, self.waiters = self.waiters, {}
        for waiter in waiters.values():
            waiter.event.set()  # with no response: the connection was lost
        self._fire()

    async def ready(
        self,
        timeout: float,  # noqa: ASYNC109 - then BackendError
        *,
        early: bool = False,
    ) -> None:
        """Wait until connected and the state-vector exchange is done (``early``: connected
        only); raise the final refusal, or BackendError after ``timeout``."""
        with anyio.move_on_after(timeout):
            while self.ws is None or not (early or self.synced):
                if self.final is not None:
                    raise self.final
                await self.changed.wait()
            return
        if self.final is not None:
            raise self.final
        raise BackendError("ws", f"the hub at {self.journal.base} is unreachable ({timeout:g} s)")

    async def call(
        self,
        op: str,
        params: dict[str, JsonValue],
        timeout: float,  # noqa: ASYNC109 - then BackendError or _ConnectionLost
        *,
        early: bool = False,
    ) -> JsonValue:
        """The result of ``op``: wait up to ``timeout`` seconds for the connection (and its
        state-vector exchange, unless ``early``: the exchange's own requests) and its
        answer. A connection that gives no answer in time is treated as lost (it is closed
        and re-opened: a silent network or a stalled hub, which TCP may not notice for
        minutes): ``_ConnectionLost``, as for a drop."""
        deadline = anyio.current_time() + timeout
        await self.ready(timeout, early=early)
        ws, session = self.ws, self.session
        assert ws is not None
        assert session is not None
        try:
            request, frame = session.request(op, dict(params))
        except ProtocolError as exc:
            raise BackendError("ws", str(exc)) from None
        waiter = self.waiters[request.id] = _Waiter()
        with anyio.move_on_after(max(0.0, deadline - anyio.current_time())) as waiting:
            try:
                await ws.send(frame)
            except ConnectionClosed:
                self.waiters.pop(request.id, None)
            else:
                await waiter.event.wait()
        if waiting.cancelled_caught:
            self.waiters.pop(request.id, None)
            log.warning(
                "ws %s/%s: no answer to %s within %g s; reconnecting",
                self.journal.tenant,
                self.run,
                op,
                timeout,
            )
            self._abort(ws)
            raise _ConnectionLost("ws", f"no answer from the hub to {op} within {timeout:g} s")
        response = waiter.response
        if response is None:
            with anyio.move_on_after(self.journal.connect_timeout):
                while self.ws is ws:  # let the reader see the close code: final or not
                    await self.changed.wait()
            if self.final is not None:
                raise self.final
            raise _ConnectionLost("ws", f"connection to the hub lost during {op}")
        if response.error is not None:
            if response.error.code == ReadOnlyAccess.code:  # the hub's dispatch says only that
                raise ReadOnlyAccess(self.journal.tenant, self.run)
            raise error_from_info(response.error)
        return response.result


class WsJournal(JournalBackend):
    """The journals of one tenant, served by the hub at ``url`` (``ws[s]://host:port/<tenant>``).

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
    remote = True

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        connect_timeout: float = 10.0,
        offline_timeout: float = 30.0,
        min_backoff: float = 0.05,
        max_backoff: float = 2.0,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("ws", "wss") or not parts.netloc:
            raise UnsupportedURL(url, "expected ws://host:port/<tenant> (or wss://)")
        segments = [s for s in parts.path.split("/") if s]
        if len(segments) != 1 or parts.query or parts.fragment:
            raise UnsupportedURL(url, "expected ws://host:port/<tenant>: one path segment")
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
        self.url = url
        self.base = f"{parts.scheme}://{parts.netloc}"
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
        self.exchanges = 0  # state-vector exchanges (one per attached record and connect)
        self.losses = 0  # exchanges that found the hub's journal behind a record
        self.resent = 0  # appends of what the hub lacked, sent by an exchange
        self._state: Literal["new", "open", "closed"] = "new"

    def __repr__(self) -> str:
        return f"<WsJournal {self.base}/{self.tenant}>"

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

    async def _link(self, tenant: str, run: str) -> _Link:
        if self._state != "open":
            raise StoreClosed("ws journal")
        if tenant != self.tenant:
            raise InvalidValue(f"this ws:// store serves tenant {self.tenant!r}, not {tenant!r}")
        link = self._links.get(run)
        if link is None:
            link = self._links[run] = _Link(self, run)
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
            claims = await self._request(link, "whoami", {}, self.connect_timeout)
            if not isinstance(claims, dict):
                raise BackendError("ws", f"malformed whoami answer {claims!r}")
            link.identity = (str(claims.get("agent")), str(claims.get("source", "model")))
            link.read_only = claims.get("mode") == "ro"
        return link.identity

    async def read_only(self, tenant: str, run: str) -> bool:
        await self.identity(tenant, run)
        return (await self._link(tenant, run)).read_only

    # -- runs -------------------------------------------------------------------------------

    async def ensure_run(
        self, tenant: str, run: str, *, create: bool, parent: str | None = None
    ) -> RunRow:
        if parent is not None:
            raise UnsupportedOperation("ws", "nested runs")
        link = await self._link(tenant, run)
        await link.ready(self.connect_timeout)
        got = await self._request(link, "run.ensure", {"create": create}, self.connect_timeout)
        return _run_row(got)

    async def get_run(self, tenant: str, run: str) -> RunRow | None:
        await self._link(tenant, run)
        got = await self.call(run, "run.info")
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
        chunk: list[JsonValue] = []
        crcs: list[int] = []
        size = 0
        for entry in entries:
            if chunk and size + len(entry.update) > _APPEND_BYTES:
                seqs.extend(await self._append_chunk(run, chunk, crcs, durable))
                chunk, crcs, size = [], [], 0
            chunk.append(_entry_json(entry))
            crcs.append(entry.checksum)
            size += len(entry.update)
        if chunk:
            seqs.extend(await self._append_chunk(run, chunk, crcs, durable))
        return seqs

    async def _append_chunk(
        self, run: str, chunk: list[JsonValue], crcs: list[int], durable: bool
    ) -> list[int]:
        # A lost connection is waited out (up to offline_timeout) and the append sent again:
        # the hub does not journal twice what it already holds, and the record's writers see
        # no failure for a hub restart.
        link = await self._link(self.tenant, run)
        deadline = anyio.current_time() + self.offline_timeout
        while True:
            try:
                got = await link.call(
                    "journal.append",
                    {"entries": chunk, "durable": durable},
                    max(0.0, deadline - anyio.current_time()),
                )
                break
            except _ConnectionLost as exc:
                if anyio.current_time() >= deadline:
                    raise BackendError(
                        "ws", f"{exc}; the hub did not come back within {self.offline_timeout:g} s"
                    ) from None
        if not isinstance(got, list) or len(got) != len(chunk):
            raise BackendError("ws", f"malformed journal.append answer {got!r}")
        seqs = [int(s) for s in got]  # type: ignore[arg-type]
        if seqs:
            link.saw(max(seqs))
        for seq, crc in zip(seqs, crcs, strict=True):
            link.mark(seq, crc)  # the hub journals the bytes as sent (or found them so)
        return seqs

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
            return kept
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
        return out

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
