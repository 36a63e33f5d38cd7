"""Public conformance checks for storage backends.

Every journal backend (memory, SQLite, and later Redis, or a third party's) must pass
:func:`check_journal_backend`. Call it from your test suite with a factory that returns a new,
empty backend each time it is called::

    async def test_my_backend(tmp_path):
        await check_journal_backend(lambda: MyJournal(f"my://{tmp_path}/x"))

Failures raise ``AssertionError`` with a message naming the broken rule.

A backend that *attributes* writes itself (``ws://``: the hub applies each update to its
record, derives its effect and journals it as the token's agent; one tenant per store; no
authority transactions, compaction or run deletion from a client) runs
:func:`check_attributing_journal_backend` instead: the same rules where they apply, with
real Yjs updates, and ``UnsupportedOperation`` where a rule's operation is the server's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import anyio
from pycrdt import Doc, Map

from ._errors import UnknownRun, UnsupportedOperation
from ._journal import MAX_CALL, JournalBackend, NewEntry, SnapshotRow, checksum
from ._leases._conformance import check_lease_backend
from ._remote_journal import RemoteJournal
from .record._document import REGISTRY

__all__ = ["check_attributing_journal_backend", "check_journal_backend", "check_lease_backend"]


def _entry(i: int, effect: list[list[Any]] | None = None, call: str = "") -> NewEntry:
    update = f"update-{i}".encode()
    return NewEntry(
        f"agent{i % 3}",
        "tool",
        1000 + i,
        time.time(),
        update,
        effect if effect is not None else [],
        checksum(update),
        call=call,
    )


async def check_journal_backend(make: Callable[[], JournalBackend]) -> None:
    """Run every conformance rule against fresh backends from ``make``.

    Raises:
        AssertionError: a rule is broken.
    """
    for check in _CHECKS:
        backend = make()
        await backend.open()
        try:
            await check(backend)
        except AssertionError as exc:
            raise AssertionError(f"{check.__name__}: {exc}") from exc
        finally:
            await backend.aclose()
            await backend.aclose()  # aclose is idempotent


async def _runs_are_created_on_request(b: JournalBackend) -> None:
    try:
        await b.ensure_run("t", "r", create=False)
    except UnknownRun:
        pass
    else:
        raise AssertionError("ensure_run(create=False) of a missing run must raise UnknownRun")
    assert await b.get_run("t", "r") is None, "a refused run must not be created"
    info = await b.ensure_run("t", "r", create=True)
    assert (info.tenant, info.run, info.head, info.snapshot_seq) == ("t", "r", 0, 0)
    again = await b.ensure_run("t", "r", create=True)
    assert again.created == info.created, "ensure_run must not recreate an existing run"
    await b.ensure_run("t", "r2", create=True)
    await b.ensure_run("other", "r", create=True)
    assert [r.run for r in await b.list_runs("t")] == ["r", "r2"]
    assert [r.run for r in await b.list_runs("other")] == ["r"]


async def _append_assigns_dense_positions(b: JournalBackend) -> None:
    await b.ensure_run("t", "r", create=True)
    assert await b.append("t", "r", [], durable=False) == []
    assert await b.append("t", "r", [_entry(0), _entry(1)], durable=False) == [1, 2]
    assert await b.append("t", "r", [_entry(2)], durable=True) == [3]
    assert await b.head("t", "r") == 3
    rows = await b.read("t", "r", 0)
    assert [r.seq for r in rows] == [1, 2, 3]
    first = rows[0]
    assert (first.agent, first.source, first.client_id, first.update) == (
        "agent0",
        "tool",
        1000,
        b"update-0",
    )
    assert first.checksum == checksum(b"update-0")
    assert [r.seq for r in await b.read("t", "r", 1)] == [2, 3]
    assert [r.seq for r in await b.read("t", "r", 1, limit=1)] == [2]
    assert await b.read("t", "r", 3) == []
    try:
        await b.append("t", "missing", [_entry(9)], durable=False)
    except UnknownRun:
        pass
    else:
        raise AssertionError("append to an unknown run must raise UnknownRun")


async def _runs_and_tenants_are_isolated(b: JournalBackend) -> None:
    for tenant, run in [("t", "a"), ("t", "b"), ("u", "a")]:
        await b.ensure_run(tenant, run, create=True)
    await b.append("t", "a", [_entry(0, [["map", "m", "set", "k", 1]])], durable=False)
    assert await b.read("t", "b", 0) == []
    assert await b.read("u", "a", 0) == []
    assert await b.history("u", "a", "m", "k") == []
    assert await b.head("u", "a") == 0


async def _effects_and_history(b: JournalBackend) -> None:
    await b.ensure_run("t", "r", create=True)
    effects: list[list[list[Any]]] = [
        [["map", "m", "set", "k", {"v": 1}], ["list", "l", "ins", 0, [1]]],
        [["map", "m", "set", "other", 2]],
        [["map", "m", "del", "k"]],
        [["map", "n", "set", "k", 3]],
    ]
    await b.append("t", "r", [_entry(i, e) for i, e in enumerate(effects)], durable=False)
    rows = await b.read("t", "r", 0)
    assert [r.effect for r in rows] == effects, "effects must round-trip as JSON"
    assert [r.seq for r in await b.history("t", "r", "m", "k")] == [1, 3]
    assert [r.seq for r in await b.history("t", "r", "n", "k")] == [4]
    assert await b.history("t", "r", "m", "nothing") == []


async def _snapshots(b: JournalBackend) -> None:
    await b.ensure_run("t", "r", create=True)
    await b.append("t", "r", [_entry(i) for i in range(5)], durable=False)
    assert await b.load_snapshot("t", "r") is None
    snap = SnapshotRow(3, b"merged", {"index": {"m": {"k": [2, "a", "tool", 1.0]}}}, time.time())
    await b.save_snapshot("t", "r", snap, drop_journal=False)
    got = await b.load_snapshot("t", "r")
    assert got is not None and (got.seq, got.update, got.state) == (3, b"merged", snap.state)
    assert (await b.get_run("t", "r")).snapshot_seq == 3  # type: ignore[union-attr]
    assert [r.seq for r in await b.read("t", "r", 0)] == [1, 2, 3, 4, 5], "journal is kept"
    older = SnapshotRow(2, b"older", {}, time.time())
    await b.save_snapshot("t", "r", older, drop_journal=False)
    got = await b.load_snapshot("t", "r")
    assert got is not None and got.seq == 3, "an older snapshot must not replace a newer one"
    await b.save_snapshot("t", "r", SnapshotRow(2, b"old", {}, time.time()), drop_journal=True)
    assert [r.seq for r in await b.read("t", "r", 0)] == [4, 5], (
        "drop_journal with an older snapshot drops up to the newer one that is kept"
    )
    await b.save_snapshot("t", "r", SnapshotRow(4, b"m4", {}, time.time()), drop_journal=True)
    assert [r.seq for r in await b.read("t", "r", 0)] == [5], "drop_journal drops the prefix"
    assert await b.append("t", "r", [_entry(6)], durable=False) == [6]


async def _delete_run_leaves_nothing(b: JournalBackend) -> None:
    await b.ensure_run("t", "r", create=True)
    await b.ensure_run("t", "keep", create=True)
    await b.append("t", "r", [_entry(0, [["map", "m", "set", "k", "secret"]])], durable=False)
    await b.append("t", "keep", [_entry(1)], durable=False)
    await b.save_snapshot("t", "r", SnapshotRow(1, b"s", {}, time.time()), drop_journal=False)
    assert await b.delete_run("t", "r") is True
    assert await b.delete_run("t", "r") is False
    assert await b.get_run("t", "r") is None
    assert [r.run for r in await b.list_runs("t")] == ["keep"]
    assert [r.seq for r in await b.read("t", "keep", 0)] == [1]
    # a run created again under the same name starts empty
    await b.ensure_run("t", "r", create=True)
    assert await b.read("t", "r", 0) == []
    assert await b.load_snapshot("t", "r") is None
    assert await b.history("t", "r", "m", "k") == []


async def _config_is_per_run_and_atomic(b: JournalBackend) -> None:
    await b.ensure_run("t", "r", create=True)
    await b.ensure_run("t", "other", create=True)
    assert await b.get_config("t", "r") == {}
    new = await b.update_config("t", "r", lambda c: {**c, "collections": {"m": {"policy": "x"}}})
    assert new == {"collections": {"m": {"policy": "x"}}}
    assert await b.get_config("t", "r") == new
    assert await b.get_config("t", "other") == {}, "config must not leak across runs"

    def refuse(_: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("no")

    with contextlib.suppress(ValueError):
        await b.update_config("t", "r", refuse)
    assert await b.get_config("t", "r") == new, "a failed update must change nothing"


async def _authority_serialises_and_rolls_back(b: JournalBackend) -> None:
    await b.ensure_run("t", "r", create=True)
    await b.append("t", "r", [_entry(0)], durable=False)
    async with b.authority("t", "r", durable=True) as auth:
        assert [r.seq for r in await auth.read(0)] == [1]
        assert await auth.append([_entry(1)]) == [2]
    assert await b.head("t", "r") == 2
    try:
        async with b.authority("t", "r", durable=True) as auth:
            assert await auth.append([_entry(2)]) == [3]
            raise _Abort
    except _Abort:
        pass
    assert await b.head("t", "r") == 2, "leaving an authority with an error must roll back"
    assert [r.seq for r in await b.read("t", "r", 0)] == [1, 2]
    # a plain append waits for an open authority transaction, then lands after it
    order: list[str] = []

    async def plain() -> None:
        await b.append("t", "r", [_entry(5)], durable=False)
        order.append("plain")

    async with anyio.create_task_group() as tg:
        async with b.authority("t", "r", durable=False) as auth:
            tg.start_soon(plain)
            await anyio.sleep(0.05)
            await auth.append([_entry(4)])
            order.append("authority")
    assert order == ["authority", "plain"]
    assert [r.update for r in await b.read("t", "r", 2)] == [b"update-4", b"update-5"]


async def _call_ids_round_trip(b: JournalBackend) -> None:
    await b.ensure_run("t", "r", create=True)
    calls = ["", "call_1", "toolu_01Ä✓", "c" * MAX_CALL]
    set_k: list[list[Any]] = [["map", "m", "set", "k", 1]]
    await b.append("t", "r", [_entry(i, set_k, c) for i, c in enumerate(calls)], durable=False)
    rows = await b.read("t", "r", 0)
    assert [r.call for r in rows] == calls, "read must return each entry's call id"
    assert [r.call for r in await b.history("t", "r", "m", "k")] == calls, "history too"
    async with b.authority("t", "r", durable=True) as auth:
        assert [r.call for r in await auth.read(0)] == calls, "an authority's read too"
        await auth.append([_entry(9, call="in-authority")])
    assert [r.call for r in await b.read("t", "r", 4)] == ["in-authority"]
    # many entries at once (a backend may store older entries otherwise than recent ones)
    many = [_entry(i, call=f"c{i}" if i % 2 else "") for i in range(2_000)]
    await b.append("t", "r", many, durable=False)
    got = await b.read("t", "r", 5, limit=len(many))
    assert [r.call for r in got] == [e.call for e in many], "call ids of many entries"


async def _rewrite_entries_in_place(b: JournalBackend) -> None:
    """``rewrite_entries`` replaces the update, effect and checksum of the entries named,
    in place: every position, agent and call stays, other entries and runs are untouched,
    a position no longer in the journal is ignored (redaction, ``Store.redact``)."""
    await b.ensure_run("t", "r", create=True)
    await b.ensure_run("t", "other", create=True)
    set_k: list[list[Any]] = [["map", "m", "set", "k", "secret"]]
    await b.append("t", "r", [_entry(i, set_k, f"c{i}") for i in range(5)], durable=True)
    await b.append("t", "other", [_entry(7, set_k)], durable=True)
    before = await b.read("t", "r", 0)
    blank = b"blanked"
    marked: list[list[Any]] = [["map", "m", "set", "k", {"$redacted": {"agent": "dpo"}}]]
    new = [
        row._replace(update=blank, effect=marked, checksum=checksum(blank))
        for row in before
        if row.seq in (2, 4)
    ]
    await b.rewrite_entries("t", "r", [*new, before[0]._replace(seq=99)])
    after = await b.read("t", "r", 0)
    assert [(r.seq, r.agent, r.call, r.wall_time) for r in after] == [
        (r.seq, r.agent, r.call, r.wall_time) for r in before
    ], "a rewrite keeps every entry, its position, agent, call and time"
    for row, old in zip(after, before, strict=True):
        if row.seq in (2, 4):
            assert (row.update, row.effect, row.checksum) == (blank, marked, checksum(blank))
        else:
            assert row == old, "an entry not named must not change"
    assert [r.update for r in await b.history("t", "r", "m", "k")] == [r.update for r in after]
    assert [r.update for r in await b.read("t", "other", 0)] == [b"update-7"]
    assert await b.head("t", "r") == 5
    await b.append("t", "r", [_entry(5)], durable=True)
    assert [r.seq for r in await b.read("t", "r", 4)] == [5, 6], "appends go on after it"


class _Abort(Exception):
    pass


_CHECKS = [
    _runs_are_created_on_request,
    _append_assigns_dense_positions,
    _runs_and_tenants_are_isolated,
    _effects_and_history,
    _snapshots,
    _delete_run_leaves_nothing,
    _config_is_per_run_and_atomic,
    _authority_serialises_and_rolls_back,
    _call_ids_round_trip,
    _rewrite_entries_in_place,
]


# -- backends that attribute writes themselves (ws://) -------------------------------------


async def check_attributing_journal_backend(
    make: Callable[[], JournalBackend], tenant: str
) -> None:
    """Run the rules that apply to a backend that derives each entry's effect and writer
    itself (see the module docstring) against fresh backends from ``make``, serving
    ``tenant``; each rule uses runs of its own (the backend may share one server).

    Raises:
        AssertionError: a rule is broken.
    """
    for i, check in enumerate(_ATTRIBUTING_CHECKS):
        backend = make()
        await backend.open()
        try:
            await check(backend, tenant, f"conf{i}")
        except AssertionError as exc:
            raise AssertionError(f"{check.__name__}: {exc}") from exc
        finally:
            await backend.aclose()
            await backend.aclose()  # aclose is idempotent


class _Writer:
    """A plain Yjs document writing map entries: each :meth:`set` is one real update."""

    def __init__(self, client_id: int) -> None:
        self.doc: Doc[Any] = Doc(client_id=client_id)
        self.map: Map[Any] = self.doc.get("m", type=Map)
        self.client_id = client_id
        # declared in the collection registry, as a record's first write of it does
        self.doc.get(REGISTRY, type=Map)["m"] = "map"
        self._sent = b"\x00"  # the state vector of what was sent: nothing yet

    def set(self, key: str, value: str, call: str = "") -> NewEntry:
        self.map[key] = value
        update = self.doc.get_update(self._sent)
        self._sent = self.doc.get_state()
        return NewEntry(
            "ignored", "tool", self.client_id, time.time(), update, [], checksum(update), call=call
        )


async def _a_runs_are_created_on_request(b: JournalBackend, t: str, r: str) -> None:
    try:
        await b.ensure_run(t, r, create=False)
    except UnknownRun:
        pass
    else:
        raise AssertionError("ensure_run(create=False) of a missing run must raise UnknownRun")
    assert await b.get_run(t, r) is None, "a refused run must not be created"
    try:
        await b.read(t, r, 0)
    except UnknownRun:
        pass
    else:
        raise AssertionError("reading a missing run must raise UnknownRun")
    assert await b.get_run(t, r) is None, "a read must not create the run"
    info = await b.ensure_run(t, r, create=True)
    assert (info.tenant, info.run, info.head, info.snapshot_seq) == (t, r, 0, 0)
    again = await b.ensure_run(t, r, create=True)
    assert again.created == info.created, "ensure_run must not recreate an existing run"
    assert r in [x.run for x in await b.list_runs(t)]
    listed = await b.tenants()
    assert listed is None or t in listed, "tenants() lists every tenant with a run"


async def _a_append_assigns_dense_positions(b: JournalBackend, t: str, r: str) -> None:
    await b.ensure_run(t, r, create=True)
    w = _Writer(4242)
    assert await b.append(t, r, [], durable=False) == []
    first, second = w.set("a", "1"), w.set("b", "2")
    assert await b.append(t, r, [first, second], durable=False) == [1, 2]
    assert await b.append(t, r, [w.set("c", "3")], durable=True) == [3]
    assert await b.head(t, r) == 3
    rows = await b.read(t, r, 0)
    assert [x.seq for x in rows] == [1, 2, 3]
    assert (rows[0].client_id, rows[0].update) == (4242, first.update)
    assert rows[0].checksum == checksum(first.update)
    assert isinstance(b, RemoteJournal), "an attributing backend is a RemoteJournal"
    identity = await b.identity(t, r)
    assert identity is not None, "an attributing backend names its writer (identity)"
    assert (rows[0].agent, rows[0].source) == identity, "entries carry the backend's writer"
    assert [x.seq for x in await b.read(t, r, 1)] == [2, 3]
    assert [x.seq for x in await b.read(t, r, 1, limit=1)] == [2]
    assert await b.read(t, r, 3) == []
    try:
        await b.append(t, f"{r}-missing", [w.set("d", "4")], durable=False)
    except UnknownRun:
        pass
    else:
        raise AssertionError("append to an unknown run must raise UnknownRun")


async def _a_effects_are_derived_and_history_follows(b: JournalBackend, t: str, r: str) -> None:
    await b.ensure_run(t, r, create=True)
    await b.ensure_run(t, f"{r}-other", create=True)
    w = _Writer(77)
    entries = [w.set("k", "v1"), w.set("other", "x"), w.set("k", "v2")]
    entries[0] = entries[0]._replace(effect=[["map", "m", "set", "k", "a lie"]])
    await b.append(t, r, entries, durable=False)
    rows = await b.read(t, r, 0)
    assert [x.effect for x in rows] == [
        [["map", "m", "set", "k", "v1"]],
        [["map", "m", "set", "other", "x"]],
        [["map", "m", "set", "k", "v2"]],
    ], "the effect is derived from the update, not taken from the writer"
    assert [x.seq for x in await b.history(t, r, "m", "k")] == [1, 3]
    assert await b.history(t, r, "m", "nothing") == []
    assert await b.read(t, f"{r}-other", 0) == [], "runs are isolated"
    assert await b.history(t, f"{r}-other", "m", "k") == []


async def _a_config_is_per_run_and_atomic(b: JournalBackend, t: str, r: str) -> None:
    await _config_is_per_run_and_atomic(_Renamed(b, t, r))  # type: ignore[arg-type]


async def _a_call_ids_round_trip(b: JournalBackend, t: str, r: str) -> None:
    await b.ensure_run(t, r, create=True)
    w = _Writer(5)
    calls = ["", "call_1", "toolu_01Ä✓", "c" * MAX_CALL]
    await b.append(t, r, [w.set("k", str(i), c) for i, c in enumerate(calls)], durable=False)
    assert [x.call for x in await b.read(t, r, 0)] == calls, "read returns each call id"
    assert [x.call for x in await b.history(t, r, "m", "k")] == calls, "history too"


async def _a_server_operations_are_refused(b: JournalBackend, t: str, r: str) -> None:
    """What only the server does is refused with UnsupportedOperation, changing nothing."""
    await b.ensure_run(t, r, create=True)
    w = _Writer(9)
    await b.append(t, r, [w.set("k", "v")], durable=False)
    snapshot = SnapshotRow(1, b"", {}, 0.0)
    attempts: list[tuple[str, Callable[[], Any]]] = [
        ("authority", lambda: b.authority(t, r, durable=True)),
        ("save_snapshot", lambda: b.save_snapshot(t, r, snapshot, drop_journal=True)),
        ("delete_run", lambda: b.delete_run(t, r)),
        ("rewrite_entries", lambda: b.rewrite_entries(t, r, [])),
    ]
    for name, attempt in attempts:
        try:
            got = attempt()
            if hasattr(got, "__await__"):
                await got
        except UnsupportedOperation:
            continue
        raise AssertionError(f"{name} must raise UnsupportedOperation on this backend")
    assert [x.seq for x in await b.read(t, r, 0)] == [1], "a refused operation changes nothing"


class _Renamed:
    """A view of a backend in which the rule's tenant ``t`` and runs ``r``/``other`` are the
    attributing backend's tenant and runs of this rule (for rules shared with the suite)."""

    def __init__(self, b: JournalBackend, tenant: str, run: str) -> None:
        self._b, self._tenant, self._run = b, tenant, run

    def _names(self, tenant: str, run: str) -> tuple[str, str]:
        return self._tenant, f"{self._run}-{run}"

    async def ensure_run(self, tenant: str, run: str, *, create: bool) -> Any:
        return await self._b.ensure_run(*self._names(tenant, run), create=create)

    async def get_config(self, tenant: str, run: str) -> dict[str, Any]:
        return await self._b.get_config(*self._names(tenant, run))

    async def update_config(
        self, tenant: str, run: str, update: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        return await self._b.update_config(*self._names(tenant, run), update)


_ATTRIBUTING_CHECKS = [
    _a_runs_are_created_on_request,
    _a_append_assigns_dense_positions,
    _a_effects_are_derived_and_history_follows,
    _a_config_is_per_run_and_atomic,
    _a_call_ids_round_trip,
    _a_server_operations_are_refused,
]
