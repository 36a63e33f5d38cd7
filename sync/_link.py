"""The connection of one run of a ``ws://`` store (:class:`_Link`): kept open with
reconnects, answering requests, keeping pushed journal entries, and the state-vector
exchange after every connect.

Why it is shaped so: the record above it must see one journal whatever the network does.
Pushed entries spare a round trip per update, but a read is answered from them only when
they hold every position asked for, so no entry is skipped or given twice. After every
reconnect the record first compares itself with the hub (``journal.state``), because the
hub may have lost entries the record took in (a restored backup, lost ``synchronous=NORMAL``
commits); what the hub lacks is sent back as the token's writes. Requests whose answer was
lost are sent again only when that is safe (reads, idempotent requests, appends the hub
de-duplicates); the rules are in :class:`_Link`'s docstring.
"""

from __future__ import annotations

import base64
import logging
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, cast

import anyio
import sniffio
from pycrdt import Doc
from pydantic import JsonValue
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Subprotocol

from crdtstore import (
    BackendError,
    CrdtStoreError,
    ReadOnlyAccess,
    RunClosed,
    UnknownRun,
)
from crdtstore.backend import Row, error_from_dict

from ._document import PycrdtDocument
from ._errors import CloseCode, ProtocolError
from ._frames import Append, AppendEntry, decode_head_push
from ._lease_rpc import error_from_info
from ._messages import DEFAULT_MAX_MESSAGE_SIZE, Push, Response, decode_state_vector, encode
from ._redact_rpc import forget_redacted
from ._rows import _b64, _row
from ._session import ClientSession
from ._tokens import Forbidden, TokenInvalid

if TYPE_CHECKING:
    from ._client import WsJournal

__all__ = ["SUBPROTOCOL", "_ConnectionLost", "_Link"]

log = logging.getLogger("sync.client")

SUBPROTOCOL = "crdtstore"
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


class _ConnectionLost(BackendError):
    """The connection dropped before the answer came (the request may have been done).
    Internal: callers get a plain ``BackendError`` (see :meth:`WsJournal._request`)."""


class _Waiter:
    __slots__ = ("event", "response")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.response: Response | None = None


class _LinkSession(ClientSession):
    """The client session of a link, which also sends append frames."""

    def append_request(
        self, entries: tuple[AppendEntry, ...], durable: bool
    ) -> tuple[Append, bytes]:
        """:meth:`request` of ``journal.append`` as an append frame: the request (pending
        under a fresh id, as ``request`` leaves it) and its frame, without the JSON request
        that ``request`` would build (on the path of every write).

        Raises:
            ProtocolError: as :meth:`request`, or an entry that cannot be encoded.
        """
        if len(self._pending) >= self.max_pending_requests:
            raise ProtocolError(
                f"more than {self.max_pending_requests} requests in flight",
                CloseCode.TOO_MANY_REQUESTS,
            )
        request = Append.of(self._next_id, entries, durable)
        frame = encode(request)
        self._next_id += 1
        self._pending[request.id] = request
        return request, frame


class _Link:
    """The connection of one run: kept open (reconnecting with backoff) until closed.

    **Pushed entries.** A head push usually carries the new journal entries themselves (see
    ``sync._ops_journal``). The connection keeps them (the newest ``_KEEP_ROWS``) and answers
    the record's next ``journal.read`` from them, without a round trip, when they hold every
    position from the one asked for up to the newest position the connection knows the journal
    holds (from pushes and from answers: its own appends included); anything else (a hole, a
    position at or past that one, a new connection: the kept entries are dropped on every
    connect) is asked of the hub. So a read answered from them is what the hub answered, or
    would have, when its head was that position: no entry is skipped or given twice, whatever
    the order of pushes, answers and reconnects.

    **Offline.** When the connection drops, it is re-opened with exponential backoff (up to
    ``max_backoff`` seconds). Meanwhile writes go on locally and stay pending in the record's
    committer, whose appends wait for the connection (up to ``offline_timeout`` seconds, then
    fail with ``BackendError`` and are retried). After a reconnect the record re-reads the
    journal after the last position it applied, and each record attached to the store
    (:meth:`WsJournal.attach`, which ``Record`` calls once it has loaded) first compares itself
    with the hub (``journal.state``, one request, before any other of the connection): the hub's
    journal head, its state vector and the checksum of its entry at the record's position.
    Usually they agree and nothing more is sent. When the hub lost entries the record had taken
    in (the hub's store restored from a backup, or its last ``synchronous=NORMAL`` commits lost:
    the head is below the record's position, the entry there is another one, or the hub's state
    vector lacks what the record holds besides its pending writes), the record sends what the
    hub lacks (``doc.get_update(hub_state_vector)``, every delete with it) as an ordinary
    append, journaled as the token's writes (also another writer's lost entries the record had
    seen: the hub believes only the token; a read-only token sends nothing), and moves its
    journal position back to the last entry it read that the hub still holds (the link keeps the
    checksums of the latest ``_MARKS`` positions), so that it reads the positions the hub reused
    instead of skipping them; knowing none, it takes in what the hub holds that it lacks (no
    provenance for that content in this record) and reads on from the hub record's position. A
    delete that was the only content lost is sent again only when something else tells the loss
    (a state vector does not hold deletes). An append whose answer was lost is sent again; the
    hub does not journal it twice. Reads and idempotent requests (opening a record:
    ``run.ensure``, ``whoami``, the first reads) are sent again the same way; other requests (a
    guarded write, a lease request or release) whose answer was lost fail with ``BackendError``
    (they may or may not have been done). A connection that gives no answer within a request's
    timeout (a silent network, a stalled hub) counts as lost: it is closed and re-opened.
    """

    def __init__(self, journal: WsJournal, run: str, *, create: bool = True) -> None:
        self.journal = journal
        self.run = run
        self.create = create  # connecting may create the run (else the hub refuses: 4404)
        self.hub = journal.base  # the hub this run connects to (moves: see serve)
        self.url = journal.hub_url(run, self.hub, create)
        self.ws: Any = None
        self.session: _LinkSession | None = None
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
            if not connected:  # the hub is gone: the next of the journal's hubs
                self.hub = self.journal.hub_failed(self.hub)
                self.url = self.journal.hub_url(self.run, self.hub, self.create)
            backoff = self.journal.min_backoff if connected else backoff * 2
            backoff = min(backoff, self.journal.max_backoff)
            await anyio.sleep(backoff)

    async def _session(self, ws: Any) -> None:
        self.session = _LinkSession(PycrdtDocument(Doc()))
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
        session = self.session
        assert session is not None
        max_size = session.max_message_size
        try:
            while True:
                frame = await ws.recv()
                if isinstance(frame, str):
                    raise ProtocolError("the hub sent a text frame")
                head = decode_head_push(frame) if len(frame) <= max_size else None
                if head is not None:  # (the frame of every update: not through pydantic)
                    session.frames_received += 1
                    self.pushed_rows(*head)
                    continue
                received = session.receive(frame)
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
            if not rec.is_open:
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
            if not (seq > hub["head"] or moved or (lacking and not rec.pending_writes)):
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
            missing = None
            if target < 0:  # no entry in common that this link knows of
                target = hub["applied"]
                missing = hub["missing"]
            if await rec.reset_position(target, missing=missing):
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
        self.pushed_rows(push.seq, push.rows)

    def pushed_rows(self, seq: int, items: list[Any] | None) -> None:
        """A head push to ``seq`` with the entries ``items`` (as JSON; None: none): keep
        them, then wake the run's readers (a record's tail waiting on the run may apply them
        at once, in this task: see :meth:`kept`)."""
        if items:
            try:
                rows = [_row(item) for item in items]
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
        self.saw(seq)
        self.journal._wake_run(self.run, seq)

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

    def kept(self, after: int, limit: int) -> list[Row] | None:
        """A record tail's read after ``after`` answered from the pushed entries now (see
        :meth:`cached`; own entries included: the record skips them), or None: the tail
        reads. The store's notifier calls it (``Watch.direct``) on the wake-up of a push,
        so the entries are applied without waking the tail task."""
        rows = self.cached(after, limit, -1)
        if rows is None:
            return None
        self.journal.reads_kept += 1
        return forget_redacted(self, rows)

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
