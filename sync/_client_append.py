"""The ``ws://`` client's ``journal.append``: a chunk of a record's entries sent to the hub.

As a binary append frame (:class:`~sync._frames.Append`: the update bytes as they are, no
JSON or base64) to a hub whose ``whoami`` lists ``journal.append`` in ``frames``, asked once
per connection (a connection may move to another hub, of another version); to any other hub
as the JSON ``journal.append``. A lost connection is waited out and the chunk sent again.

Apart from :class:`~sync._client.WsJournal` because the frame has its own way through the
connection: the request id is taken from the session, the frame sent on the socket and its
answer awaited as :meth:`sync._link._Link.call` does for a JSON request.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
from pydantic import JsonValue
from websockets.exceptions import ConnectionClosed

from crdtstore import BackendError, ReadOnlyAccess
from crdtstore.backend import NewEntry

from ._errors import ProtocolError
from ._frames import APPEND_OP, AppendEntry
from ._lease_rpc import error_from_info
from ._link import _ConnectionLost, _Link, _Waiter
from ._rows import _entry_json

if TYPE_CHECKING:
    from ._client import WsJournal

__all__ = ["append_chunk"]

log = logging.getLogger("sync.client")


async def append_chunk(
    journal: WsJournal, run: str, chunk: list[NewEntry], durable: bool
) -> list[int]:
    """``journal.append`` of ``chunk`` on the connection of ``run``: its journal positions."""
    # A lost connection is waited out (up to offline_timeout) and the append sent again:
    # the hub does not journal twice what it already holds, and the record's writers see
    # no failure for a hub restart.
    link = await journal._link(journal.tenant, run)
    deadline = anyio.current_time() + journal.offline_timeout
    while True:
        try:
            got = await _append_once(journal, link, chunk, durable, deadline)
            break
        except _ConnectionLost as exc:
            if anyio.current_time() >= deadline:
                raise BackendError(
                    "ws", f"{exc}; the hub did not come back within {journal.offline_timeout:g} s"
                ) from None
    if not isinstance(got, list) or len(got) != len(chunk):
        raise BackendError("ws", f"malformed journal.append answer {got!r}")
    seqs = [int(s) for s in got]  # type: ignore[arg-type]
    if seqs:
        link.saw(max(seqs))
    for seq, entry in zip(seqs, chunk, strict=True):
        link.mark(seq, entry.checksum)  # the hub journals the bytes as sent (or found them so)
    return seqs


async def _append_once(
    journal: WsJournal, link: _Link, chunk: list[NewEntry], durable: bool, deadline: float
) -> JsonValue:
    """One ``journal.append`` of ``chunk``: an append frame when the hub of the open
    connection takes them (asked once per connection), else the JSON op."""
    while journal.append_frames:
        if link.ws is None or not link.synced:  # (else ready: not waited for)
            await link.ready(max(0.0, deadline - anyio.current_time()))
        known = journal._frames.get(link.run)
        if known is None or known[0] is not link.session:
            await journal._whoami(link, max(0.0, deadline - anyio.current_time()))
            continue
        if known[1]:
            return await _call_frame(journal, link, chunk, durable, deadline)
        break
    params: dict[str, JsonValue] = {
        "entries": [_entry_json(e) for e in chunk],
        "durable": durable,
    }
    return await link.call(APPEND_OP, params, max(0.0, deadline - anyio.current_time()))


async def _call_frame(
    journal: WsJournal, link: _Link, chunk: list[NewEntry], durable: bool, deadline: float
) -> JsonValue:
    """``link.call(journal.append)`` sent as an append frame on the open connection: the
    same waiting, timeout and errors (see ``_Link.call``)."""
    ws, session = link.ws, link.session
    assert ws is not None
    assert session is not None
    try:
        request, frame = session.append_request(
            tuple(AppendEntry(e.update, e.client_id, e.call) for e in chunk), durable
        )
    except ProtocolError as exc:
        raise BackendError("ws", str(exc)) from None
    journal.appends_framed += 1
    waiter = link.waiters[request.id] = _Waiter()
    with anyio.move_on_after(max(0.0, deadline - anyio.current_time())) as waiting:
        try:
            await ws.send(frame)
        except ConnectionClosed:
            link.waiters.pop(request.id, None)
        else:
            await waiter.event.wait()
    if waiting.cancelled_caught:
        link.waiters.pop(request.id, None)
        log.warning(
            "ws %s/%s: no answer to %s within the offline timeout; reconnecting",
            journal.tenant,
            link.run,
            APPEND_OP,
        )
        link._abort(ws)
        raise _ConnectionLost("ws", f"no answer from the hub to {APPEND_OP} in time")
    response = waiter.response
    if response is None:
        with anyio.move_on_after(journal.connect_timeout):
            while link.ws is ws:  # let the reader see the close code: final or not
                await link.changed.wait()
        if link.final is not None:
            raise link.final
        raise _ConnectionLost("ws", f"connection to the hub lost during {APPEND_OP}")
    if response.error is not None:
        if response.error.code == ReadOnlyAccess.code:
            raise ReadOnlyAccess(journal.tenant, link.run)
        raise error_from_info(response.error)
    return response.result
