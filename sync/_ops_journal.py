"""Journal ops of the hub: what the ``ws://`` client backend (:mod:`sync._client`) asks for.

A crdtstore client (a connection that chose the ``crdtstore`` subprotocol) does not take part
in the Yjs sync exchange: its record tails the run's journal through ``journal.read``, with
the hub's journal positions, so versions agree everywhere, and it writes through
``journal.append``. The hub tells it when the journal head moves (:func:`push_heads`) and when
the tenant's leases change (:func:`push_leases`, which wakes remote lease waiters), and
sends it no Yjs updates (their content may not be journaled yet).

Why it is shaped so: the client is not trusted. The hub applies each entry to the run's record
itself, as the token's agent and source, derives its effect and enforces the run's policies;
what the client says about who wrote it, when, or what it did is never taken. Every op acts on
the connection's run only. The ops, their params and results, are drawn in the comment above
the first op below; the (re)connect check in :func:`_state`.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Sequence
from typing import Any

from pydantic import JsonValue

from crdtstore import InvalidValue, PolicyViolation, StaleVersion
from crdtstore.backend import RunRow, check_call, fence_error

from ._document import ReplicaDocument
from ._errors import ProtocolError
from ._frames import Append, Appended
from ._hub_conn import _CURRENT
from ._messages import Response, Update, decode_state_vector, encode
from ._ops import OpContext, frame, op
from ._ops_push import (  # (the pushes: there)
    _PUSHES,
    _push_committed,
    b64,
    push_heads,
    push_leases,
    row_to_json,
    run_pushes,
)
from ._ops_push import MAX_PUSH_ROWS as MAX_PUSH_ROWS
from ._ops_redact import REDACT_OP as REDACT_OP  # registers run.redact (of this run too)

__all__ = ["push_heads", "push_leases", "row_to_json", "run_pushes"]

log = logging.getLogger("sync.hub")

MAX_READ = 1000
MAX_READ_BYTES = 4 * 1024 * 1024
MAX_MARKS = 256  # (position, checksum) pairs a journal.state request may ask about


def unb64(text: object, what: str) -> bytes:
    if not isinstance(text, str):
        raise InvalidValue(f"{what} must be a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidValue(f"{what} is not valid base64") from None


def _int(params: dict[str, JsonValue], name: str, default: int | None = None) -> int:
    value = params.get(name, default)
    if type(value) is not int or value < -1:
        raise InvalidValue(f"{name} must be an int, not {value!r}")
    return value


def _run_json(row: RunRow | None) -> JsonValue:
    return None if row is None else dict(row._asdict())


# Every op acts on the connection's run only. Bytes travel base64 (standard alphabet) in the
# JSON. Params and results::
#
#     run.ensure       {create: bool}                      -> run       (UNKNOWN_RUN)
#     run.info         {}                                  -> run | null
#     journal.head     {}                                  -> int
#     journal.state    {state?: str, at?: int, marks?: [[seq, checksum], ...]}
#                      -> {head, applied, state, missing?, at_checksum?, match?}
#     journal.read     {after: int, limit?: int, skip_client?: int}
#                      -> {rows: [row, ...], more: bool}
#     journal.history  {collection: str, key: str}         -> [row, ...]
#     journal.snapshot {}                                  -> {seq, update, state, created} | null
#     config.get       {}                                  -> config
#     config.put       {expected: config, new: config}     -> config    (write; STALE_VERSION)
#     journal.append   {entries: [{update, client_id, call?}, ...], durable?: bool}
#                                                          -> [seq, ...]      (write)
#     journal.append_guarded {entry: {update, client_id, call?},
#                             expected?: [collection, key, version],
#                             based_on?: [scope, seq],
#                             fence?: [lease_id, token, resource]} -> seq        (write)
#     run.redact       see sync._ops_redact (needs the token's redact right)
#
#     run = {tenant, run, created, head, snapshot_seq, parent, state, delete_after}
#     row = [seq, agent, source, client_id, wall_time, update, effect, checksum, origin, call?]
#
# ``call`` (an entry's, and a row's tenth item, present only when the entry has one: rows
# without one stay as clients before it read them) is the tool-call id the writer made the
# entry for (``Record.attributed``): a string of at most 256 characters without NUL, else the
# request is refused with ``INVALID_VALUE`` and nothing of it is journaled.
#
# **Appends are untrusted.** The hub applies each entry's update to the run's record itself, as
# the token's agent and source, derives the effect, enforces the run's policies and budgets
# and journals it (``Record.append_updates``); the client's say-so about who wrote it, when,
# or what it did is never taken. An unguarded ``journal.append`` (``durable`` false, or a
# durable hub record) is a local write of the hub's record (``Record._append_fast``: applied at
# once, checked against the record's current state, journaled by its group commit with the
# other updates of that loop iteration, answered once committed); a guarded one, and one the
# fast path cannot take, runs in an authority transaction (catch-up read first).
#
# ``client_id`` is a label only: it lets the writer skip its own entries when it tails the
# journal (a client lying about it can only hide entries from the client it names, which Yjs's
# unauthenticated client ids allow anyway). ``call`` is a label too, journaled as given: the
# agent and source stay the token's whatever the client's record was told
# (``rec.attributed(source=...)`` is not applied on a ``ws://`` store). An append whose answer
# was lost may be sent again: bytes the record already holds, journaled recently by the same
# client id, are not journaled twice (the position of the entry holding them is answered).
#
# **A fence must be the writer's own lease.** ``fence`` names a lease granted to the token's
# agent; a lease of another agent (lease ids are visible in ``lease.status``, tokens are small
# ints) is refused with the ``LeaseLost`` an unknown lease gets, and nothing is journaled.
#
# ``config.put`` may only add collection declarations (the first declaration of a name wins):
# every other key, and every existing declaration, must stay as it is; anything else is
# refused with ``POLICY_VIOLATION`` (a client must not lift the run's policies).
#
# ``journal.append``'s ``durable`` (default true) is the client record's durability: false
# commits without waiting for the disk (SQLite ``synchronous=NORMAL``), as an embedded
# ``batched`` record's group commit does; a guarded append is always durable.
@op("run.ensure")
async def _run_ensure(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    create = params.get("create", False) is True and not ctx.claims.read_only
    backend = ctx.store.backend
    return _run_json(await backend.ensure_run(ctx.tenant, ctx.run, create=create))


@op("run.info")
async def _run_info(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    return _run_json(await ctx.store.backend.get_run(ctx.tenant, ctx.run))


@op("journal.head")
async def _head(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    return await ctx.store.backend.head(ctx.tenant, ctx.run)


@op("journal.state")
async def _state(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    """``journal.state``: the state-vector exchange.

    Asked by a ``ws://`` client on every (re)connect (see ``sync._client``): ``head`` is the
    journal head, ``applied`` the position up to which the hub's record holds every entry (its
    document may hold more: updates applied and not yet journaled), ``state`` that document's
    state vector. Optional, each answered only when asked: ``at`` (a journal position) ->
    ``at_checksum``, the checksum of the entry there (null: none); ``state`` (the client's state
    vector) -> ``missing``, what the document holds that the client lacks
    (``doc.get_update(state)``); ``marks`` (at most ``MAX_MARKS`` pairs of a position and the
    checksum of the entry the client read there) -> ``match``, the highest of those positions
    whose entry has that checksum (-1: none). A client whose journal position is past ``head``,
    or whose entry there differs, or whose document holds what ``state`` lacks, took in entries
    that the hub lost (its store was restored from a backup, or lost its last commits): it sends
    what ``state`` lacks as an ordinary ``journal.append`` and reads the journal again after
    ``match`` (or takes ``missing`` in and reads after ``applied``).
    """
    client = params.get("state")
    sv = None
    if client is not None:
        sv = unb64(client, "state")
        try:
            decode_state_vector(sv)
        except ProtocolError as exc:
            raise InvalidValue(f"state is not a state vector: {exc.reason}") from None
    at = None if params.get("at") is None else _int(params, "at")
    marks = _marks(params.get("marks"))
    rec, backend = ctx.rec, ctx.store.backend
    head = await backend.head(ctx.tenant, ctx.run)
    doc = ReplicaDocument(rec.replica)
    out: dict[str, JsonValue] = {
        "head": head,
        "applied": min(rec.applied_seq, head),
        "state": b64(doc.get_state()),
    }
    if sv is not None:
        out["missing"] = b64(doc.get_update(sv))
    if at is not None:
        rows = await backend.read(ctx.tenant, ctx.run, at - 1, 1) if at > 0 else []
        out["at_checksum"] = rows[0].checksum if rows and rows[0].seq == at else None
    if marks:
        high = max(marks)  # a bounded read: the highest match is what is asked
        low = max(min(marks), high - 4 * MAX_MARKS + 1)
        rows = await backend.read(ctx.tenant, ctx.run, low - 1, high - low + 1)
        have = {r.seq: r.checksum for r in rows}
        out["match"] = max((s for s, c in marks.items() if have.get(s) == c), default=-1)
    return out


def _marks(value: JsonValue) -> dict[int, int]:
    if value is None:
        return {}
    if not isinstance(value, list) or len(value) > MAX_MARKS:
        raise InvalidValue(f"marks must be a list of at most {MAX_MARKS} [seq, checksum] pairs")
    out: dict[int, int] = {}
    for pair in value:
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or type(pair[0]) is not int
            or type(pair[1]) is not int
            or pair[0] < 1
        ):
            raise InvalidValue(f"a mark is a pair [seq >= 1, checksum], not {pair!r}")
        out[pair[0]] = pair[1]
    return out


@op("journal.read")
async def _read(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    after = _int(params, "after", 0)
    limit = max(1, min(_int(params, "limit", MAX_READ), MAX_READ))
    skip = _int(params, "skip_client", -1)
    rows = await ctx.store.backend.read(ctx.tenant, ctx.run, after, limit, skip_client=skip)
    out: list[JsonValue] = []
    size = 0
    more = len(rows) == limit
    for row in rows:  # bounded answer: the client asks again from the last position
        if out and size + len(row.update) > MAX_READ_BYTES:
            more = True
            break
        size += len(row.update)
        out.append(row_to_json(row))
    return {"rows": out, "more": more}


@op("journal.history")
async def _history(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    collection, key = params.get("collection"), params.get("key")
    if not isinstance(collection, str) or not isinstance(key, str):
        raise InvalidValue("collection and key must be strings")
    rows = await ctx.store.backend.history(ctx.tenant, ctx.run, collection, key)
    return [row_to_json(r) for r in rows]


@op("journal.snapshot")
async def _snapshot(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    snap = await ctx.store.backend.load_snapshot(ctx.tenant, ctx.run)
    if snap is None:
        return None
    return {
        "seq": snap.seq,
        "update": b64(snap.update),
        "state": snap.state,
        "created": snap.created,
    }


@op("config.get")
async def _config_get(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    config: JsonValue = await ctx.store.backend.get_config(ctx.tenant, ctx.run)
    return config


@op("config.put", write=True)
async def _config_put(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    expected, new = params.get("expected"), params.get("new")
    if not isinstance(expected, dict) or not isinstance(new, dict):
        raise InvalidValue("expected and new must be objects")
    _check_only_adds(ctx.claims.agent, expected, new)

    def swap(current: dict[str, Any]) -> dict[str, Any]:
        if current != expected:
            raise StaleVersion("config", None, "the config the client read", "another")
        return dict(new)

    config: JsonValue = await ctx.store.backend.update_config(ctx.tenant, ctx.run, swap)
    return config


def _check_only_adds(agent: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    def refuse(reason: str) -> PolicyViolation:
        return PolicyViolation("config", agent, "config", None, reason)

    if {k: v for k, v in old.items() if k != "collections"} != {
        k: v for k, v in new.items() if k != "collections"
    }:
        raise refuse("a client may only add collection declarations")
    old_cols, new_cols = old.get("collections", {}), new.get("collections", {})
    if not isinstance(old_cols, dict) or not isinstance(new_cols, dict):
        raise InvalidValue("collections must be an object")
    for name, decl in old_cols.items():
        if new_cols.get(name) != decl:
            raise refuse(f"the declaration of {name!r} cannot change")


def _entry(value: JsonValue) -> tuple[bytes, int, str]:
    if not isinstance(value, dict):
        raise InvalidValue("an entry is an object {update, client_id, call?}")
    client_id = value.get("client_id")
    if type(client_id) is not int or client_id < 0:
        raise InvalidValue(f"client_id must be an int >= 0, not {client_id!r}")
    call = check_call(value.get("call", ""))
    return unb64(value.get("update"), "update"), client_id, call


async def _append(
    ctx: OpContext, updates: list[bytes], client_id: int, calls: list[str], **guards: Any
) -> list[int]:
    """Journal client entries as the token's agent (one transaction), each with its call id;
    send what the hub's record took in to the plain Yjs connections of the run."""
    rec = ctx.rec
    room = ctx.conn.room
    before = rec.applied_seq
    # held to the run's document size limit as a plain Yjs client's updates are (refused:
    # PayloadTooLarge, as an error response; nothing applied or journaled)
    limit = ctx.conn.limits.max_document_bytes
    reserved = 0
    token = _CURRENT.set(ctx.conn)
    state = _PUSHES.get(room)
    if state is not None:  # pushed to the run's other connections first
        state.appending[ctx.conn] = state.appending.get(ctx.conn, 0) + 1
    try:
        for update in updates:  # (the record refuses what is not bytes)
            reserved += room.reserve(len(update) if isinstance(update, bytes) else 0, limit)
        seqs = await rec.append_updates(
            updates,
            client_id=client_id,
            writer=ctx.conn.writer,
            calls=calls if any(calls) else None,
            **guards,
        )
    finally:
        _CURRENT.reset(token)
        room.release(reserved)
        if state is not None:
            left = state.appending.pop(ctx.conn, 1) - 1
            if left:
                state.appending[ctx.conn] = left
    fresh = {s for s in seqs if s > before}
    if rec.applied_seq - before > len(fresh):
        # entries of other processes that the append applied first, with the connection's
        # identity set: the room did not broadcast them (it does so outside of a connection)
        rows = await ctx.store.backend.read(ctx.tenant, ctx.run, before, rec.applied_seq - before)
        own = rec.replica.client_id
        for row in rows:
            if row.client_id != own and row.seq <= rec.applied_seq and row.seq not in fresh:
                room.broadcast(encode(Update(row.update)))
    for update in updates:
        room.broadcast(encode(Update(update)), exclude=ctx.conn)
    await _push_committed(ctx, seqs)
    return seqs


@op("journal.append", write=True)
async def _journal_append(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    entries = params.get("entries")
    if not isinstance(entries, list):
        raise InvalidValue("entries must be a list")
    durable = params.get("durable", True)
    if not isinstance(durable, bool):
        raise InvalidValue("durable must be a bool")
    parsed = [_entry(e) for e in entries]  # all checked before any is journaled
    seqs: list[JsonValue] = []
    start = 0
    while start < len(parsed):  # one transaction per run of entries of one client id
        end = start + 1
        while end < len(parsed) and parsed[end][1] == parsed[start][1]:
            end += 1
        updates = [u for u, _, _ in parsed[start:end]]
        calls = [c for _, _, c in parsed[start:end]]
        seqs.extend(await _append(ctx, updates, parsed[start][1], calls, durable=durable))
        start = end
    return seqs


@frame(Append)
async def _append_frame(ctx: OpContext, request: Append) -> Response:
    """``journal.append`` of an append frame: as the JSON op does it (one transaction per run
    of entries of one client id, every entry checked before any is journaled), answered as a
    binary :class:`~sync._frames.Appended`."""
    entries = request.entries
    calls = [check_call(e.call) for e in entries]
    seqs: list[int] = []
    start = 0
    while start < len(entries):
        client_id = entries[start].client_id
        end = start + 1
        while end < len(entries) and entries[end].client_id == client_id:
            end += 1
        updates = [e.update for e in entries[start:end]]
        seqs.extend(
            await _append(ctx, updates, client_id, calls[start:end], durable=request.durable)
        )
        start = end
    return Appended.of(request.id, seqs)


def _triple(value: JsonValue, what: str, types: Sequence[type]) -> tuple[Any, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != len(types):
        raise InvalidValue(f"{what} must be a list of {len(types)} items")
    for item, t in zip(value, types, strict=True):
        if type(item) is not t:
            raise InvalidValue(f"{what}: {item!r} is not a {t.__name__}")
    return tuple(value)


async def _check_fence_owner(ctx: OpContext, fence: tuple[Any, ...]) -> None:
    """Refuse a fence naming a lease that is not a grant of the token's agent, with the very
    error a lease that does not exist gets (it tells nothing about another agent's lease).

    The owner of a lease id never changes, so checking it before the write's transaction is
    sound; the transaction then checks the grant, the resource, the token and the TTL.
    """
    lease_id, token, resource = fence
    status = await ctx.store.leases.backend.status(ctx.tenant)
    if not any(h.lease_id == lease_id and h.owner == ctx.claims.agent for h in status.holders):
        err = fence_error(None, resource, token, 0.0, "")
        assert err is not None
        raise err


@op("journal.append_guarded", write=True)
async def _journal_append_guarded(ctx: OpContext, params: dict[str, JsonValue]) -> JsonValue:
    update, client_id, call = _entry(params.get("entry"))
    expected = _triple(params.get("expected"), "expected", (str, str, int))
    based_on = _triple(params.get("based_on"), "based_on", (str, int))
    fence = _triple(params.get("fence"), "fence", (str, int, str))
    if fence is not None:
        await _check_fence_owner(ctx, fence)
    (seq,) = await _append(
        ctx, [update], client_id, [call], expected=expected, based_on=based_on, fence=fence
    )
    return seq
