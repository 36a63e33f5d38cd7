"""Head and lease pushes of the hub to its crdtstore connections (``sync._ops_journal``).

Per loaded run, one task (:func:`push_heads`' leader) watches the journal and sends every
crdtstore connection of the run the new entries with the head; entries of the run's group
commit on the hub are pushed from that commit itself (:func:`_hook_commits`), as the journal
answers them, without a read back and before the appending task runs again. A push goes to
the run's readers before the connections waiting for their own append, as one WebSocket frame
built once. Why pushes carry entries, and how the client keeps them: ``sync._link``.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import anyio
from pydantic import JsonValue

from crdtstore import CrdtStoreError
from crdtstore.backend import NewEntry, Row

from ._frames import encode_head_push
from ._hub_conn import _wire
from ._messages import Push, encode
from ._ops import OpContext

if TYPE_CHECKING:
    from ._hub_conn import _Conn

__all__ = ["b64", "push_heads", "push_leases", "row_to_json", "run_pushes"]

log = logging.getLogger("sync.hub")

HEAD_POLL = 1.0  # seconds before a push leader whose read failed tries again
MAX_PUSH_ROWS = 64  # entries sent with a head push; more at once: the head only
MAX_PUSH_BYTES = 256 * 1024  # update bytes sent with a head push; more: the head only
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode  # as SQLite keeps it


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def row_to_json(row: Row) -> list[JsonValue]:
    out: list[JsonValue] = [
        row.seq,
        row.agent,
        row.source,
        row.client_id,
        row.wall_time,
        b64(row.update),
        cast(JsonValue, row.effect),
        row.checksum,
        row.origin,
    ]
    if row.call:  # (only then: rows without one stay as clients before call ids read them)
        out.append(row.call)
    return out


class _RunPushes:
    """The head pushes of one loaded run (one per :class:`~sync._hub_runs._Room`), shared by its
    crdtstore connections: one of their :func:`push_heads` tasks, the *leader*, watches the
    journal and sends every push to all of them; when its connection leaves, another takes
    over from where it stopped (``last``)."""

    __slots__ = (
        "appending",
        "busy",
        "conns",
        "direct",
        "last",
        "leader",
        "reads",
        "unhook",
        "vacant",
    )

    def __init__(self) -> None:
        self.conns: dict[_Conn, None] = {}  # in joining order
        self.leader: _Conn | None = None
        self.vacant = anyio.Event()  # set (and replaced) when the leader leaves
        self.last = -1  # the journal position pushed up to (-1: not started)
        self.reads = 0  # journal reads made for pushes (tests, metrics)
        self.busy = False  # a task is reading and pushing (see _push_new)
        self.appending: dict[_Conn, int] = {}  # connections waiting for their journal.append
        self.direct = 0  # pushes sent from the group commit, without a read (tests, metrics)
        self.unhook: Any = None  # undoes _hook_commits (when the last connection leaves)

    def send(self, frame: bytes) -> None:
        """Send ``frame`` to every connection, those waiting for their own append last (their
        entries' readers are who waits for the push; the writer waits for its answer)."""
        appending = self.appending
        conns = list(self.conns)
        if appending:
            conns = [c for c in conns if c not in appending] + [c for c in conns if c in appending]
        wire: bytes | None = None  # the WebSocket frame, built once for every connection
        for c in conns:
            if c.writable():
                if wire is None:
                    wire = _wire(frame)
                c.write_now(wire)
            else:
                c.send(frame)  # (queued behind what waits: in order)


_PUSHES: dict[object, _RunPushes] = {}  # by room


def run_pushes(room: object) -> _RunPushes | None:
    """The push state of ``room`` while a crdtstore connection of it is open (tests)."""
    return _PUSHES.get(room)


async def push_heads(conn: _Conn) -> None:
    """Keep ``conn`` (a crdtstore client) told of its run's journal, until cancelled.

    Per run, not per connection: the first connection's task leads (see :class:`_RunPushes`
    and :func:`_lead`), the others only wait to take over if it leaves.

    **Head pushes carry the new entries.** Per run, not per connection: one task per loaded run
    (handed over between its connections' :func:`push_heads` tasks) waits for the journal to
    grow, reads the new entries once from the hub's store (or takes those of the hub's own
    group commit as it commits them, :func:`_hook_commits`) and sends every crdtstore connection
    of the run the same frame ``{"push": "head", "seq": N, "rows": [row, ...]}``: the entries
    after the position pushed before, up to ``N``, each exactly as ``journal.read`` answers it.
    The client keeps them and answers its record's next ``journal.read`` from them when they
    continue where it reads from (one round trip less per update, see ``sync._client``). A
    larger jump (over ``MAX_PUSH_ROWS`` entries or ``MAX_PUSH_BYTES`` of updates) sends the head
    only, and the clients read. A lost wake-up is caught by the store's poll (one
    ``data_version`` check per store every ``poll_interval``, see ``crdtstore._notify``), not by
    a timer per run.
    """
    room = conn.room
    state = _PUSHES.get(room)
    if state is None:
        state = _PUSHES[room] = _RunPushes()
        _hook_commits(room, state)
    state.conns[conn] = None
    try:
        while True:
            if state.leader is None:
                state.leader = conn
                try:
                    await _lead(conn, state)
                finally:
                    state.leader = None
                    vacant, state.vacant = state.vacant, anyio.Event()
                    vacant.set()
            else:
                await state.vacant.wait()
    finally:
        state.conns.pop(conn, None)
        if not state.conns and _PUSHES.get(room) is state:
            del _PUSHES[room]
            if state.unhook is not None:
                state.unhook()
                state.unhook = None


async def _lead(conn: _Conn, state: _RunPushes) -> None:
    """Send every crdtstore connection of ``conn``'s run a :class:`Push` whenever the run's
    journal grows: on every wake-up of the store's notifier that may announce something new
    (this process's commits; on SQLite, other processes' datagrams, and the store's poll when
    the file changed unannounced: a datagram may be lost).

    The new entries are read once for the run and sent with the head, as ``journal.read``
    answers them (``{"push": "head", "seq": N, "rows": [row, ...]}``, the same frame to
    every connection), so that a client's next read is answered without a round trip (see
    ``sync._client``). More than ``MAX_PUSH_ROWS`` entries or ``MAX_PUSH_BYTES`` of updates
    at once: only the head is sent, and the clients read. ``seq`` is the highest position
    pushed; a client reads from where it is, so an early or repeated push costs nothing
    wrong."""
    rec = conn.room.rec
    assert rec is not None
    store, tenant, run = rec.store, conn.room.tenant, conn.room.run
    backend = store.backend
    watch = store.notifier.watch(tenant, run)
    try:
        while True:
            event = watch.event
            blind, announced = watch.blind, watch.head
            try:
                if state.last < 0:  # the clients read what is there already themselves...
                    head = await backend.head(tenant, run)
                    if state.last < 0:
                        state.last = head
                        # ... but one may have read before the entries up to here: tell them
                        state.send(encode(Push(push="head", seq=head)))
                else:
                    await _push_new(backend, tenant, run, state)
            except CrdtStoreError as exc:  # a busy or failing store: try again at the poll
                log.warning("head push of %s/%s: %s", tenant, run, exc)
                await anyio.sleep(HEAD_POLL)
                continue
            # read again only for a wake-up since this read that may announce more (never
            # spin on an announced position the journal does not hold)
            # (the store's poll wakes the watch blind when a wake-up may have been lost)
            while watch.blind == blind and watch.head <= max(state.last, announced):
                await event.wait()
                event = watch.event  # announced what was pushed already: wait again
    finally:
        store.notifier.unwatch(tenant, run)


async def _push_new(backend: Any, tenant: str, run: str, state: _RunPushes) -> None:
    """Push what the journal holds after ``state.last`` (nothing if another task is doing
    so: the leader then reads again, woken by the commit that the other one may miss)."""
    if state.busy:
        return
    state.busy = True
    try:
        state.reads += 1
        rows: list[Row] = await backend.read(tenant, run, state.last, MAX_PUSH_ROWS + 1)
        if not rows:
            return
        size = sum(len(r.update) for r in rows)
        if len(rows) > MAX_PUSH_ROWS or size > MAX_PUSH_BYTES:
            head = max(rows[-1].seq, await backend.head(tenant, run))
            frame = encode(Push(push="head", seq=head))
        else:
            head = rows[-1].seq
            frame = encode_head_push(head, [row_to_json(r) for r in rows])
        state.last = max(state.last, head)
        state.send(frame)
    finally:
        state.busy = False


def _hook_commits(room: Any, state: _RunPushes) -> None:
    """Push the entries of the run's group commit (``room.commit``, see
    ``crdtstore.record._loop_commit``) from the commit itself, once SQLite committed them: as
    the journal would answer them (:func:`_committed_push`), without reading them back and
    without waiting for the appending task to run again. Entries of any other path (the
    record's committer, other processes) are pushed by the leader, which reads them."""
    commit: Any = getattr(room, "commit", None)
    if commit is None:
        return  # (no group commit on the loop: the leader pushes)
    tenant, run = room.tenant, room.run

    def push(t: str, r: str, entries: Sequence[NewEntry], seqs: list[int]) -> None:
        if seqs and t == tenant and r == run:  # (a nested run's entries: the leader pushes)
            try:
                _committed_push(state, seqs, entries)
            except Exception:  # never into the commit: the leader pushes them (it reads)
                log.exception("head push of %s/%s", tenant, run)

    state.unhook = commit.on_committed(push)


def _committed_push(state: _RunPushes, seqs: list[int], entries: Sequence[NewEntry]) -> None:
    """Push entries just committed at ``seqs`` when they continue exactly where the pushes
    stopped (else, or while the leader reads, leave them to the leader: it is woken by the
    same commit). The rows are what ``journal.read`` answers for them: the effect as the
    store keeps it (its JSON, parsed)."""
    n = len(seqs)
    if (
        state.last < 0
        or state.busy
        or not state.conns
        or n > MAX_PUSH_ROWS
        or seqs[0] != state.last + 1
        or seqs[-1] != seqs[0] + n - 1
    ):
        return
    size = 0
    rows: list[JsonValue] = []
    for seq, e in zip(seqs, entries, strict=True):
        size += len(e.update)
        if size > MAX_PUSH_BYTES:
            return
        effect = json.loads(_dumps(e.effect))
        rows.append(
            row_to_json(
                Row(
                    seq,
                    e.agent,
                    e.source,
                    e.client_id,
                    e.wall_time,
                    e.update,
                    effect,
                    e.checksum,
                    e.origin,
                    e.call,
                )
            )
        )
    state.last = seqs[-1]
    state.direct += 1
    state.send(encode_head_push(seqs[-1], rows))  # (the frame of Push(...), without pydantic)


async def _push_committed(ctx: OpContext, seqs: list[int]) -> None:
    """Push a client's entries that the hub just journaled, before answering it (a task
    switch sooner than the leader would; the leader then finds nothing new)."""
    state = _PUSHES.get(ctx.conn.room)
    if state is None or state.last < 0 or not seqs or max(seqs) <= state.last:
        return
    try:
        await _push_new(ctx.store.backend, ctx.tenant, ctx.run, state)
    except CrdtStoreError as exc:  # the leader tries again
        log.warning("head push of %s/%s: %s", ctx.tenant, ctx.run, exc)


async def push_leases(conn: _Conn) -> None:
    """Send ``conn`` (a crdtstore client) ``{"push": "leases"}`` on every change of its tenant's
    leases that the hub's store sees, until cancelled: a grant, release, cancel or reap made
    through this hub (by any of its connections), or committed by another process on the
    same SQLite file (its notifier's datagram). A remote waiter then asks again at once
    instead of at its next heartbeat. Only a hint: a lost push delays a waiter, never more."""
    from crdtstore.backend import LEASE_WAKE_KEY as WAKE_KEY

    rec = conn.room.rec
    assert rec is not None
    notifier, tenant = rec.store.notifier, conn.room.tenant
    watch = notifier.watch(WAKE_KEY, tenant, polled=False)
    try:
        while True:
            await watch.event.wait()
            conn.send(encode(Push(push="leases")))
    finally:
        notifier.unwatch(WAKE_KEY, tenant)
