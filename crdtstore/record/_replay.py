"""Replay: journal entries applied to a replica, one by one in causal order or in bulk.

:meth:`JournalReplay.apply_rows` is what a record's tail, its opening and compaction do
(entry by entry in journal order, in groups of one pycrdt transaction, provenance exact);
:class:`~._bulk_load.BulkLoad` (its own module) applies entries merged in groups first
(PYCRDT-NOTES hazard 1, for entries not in a causal order); :func:`tree_merge` merges many
updates in O(n log n) (hazard 2). A corrupt entry is skipped and recorded, never applied.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from operator import eq, itemgetter
from typing import Any

from pycrdt import merge_updates

from .._errors import InvalidUpdate, JournalCorrupt
from .._journal import Op, Row, checksum
from ..codec import check_update_counts
from ._document import _EMPTY_UPDATES, DEFAULT_MAX_UPDATE, KINDS, ReplicaDocument
from ._provenance import _SETTLE_MIN
from ._pycrdt import ABSENT, map_get, map_reader, raw, update_applier

log = logging.getLogger("crdtstore.replica")
_ABSENT: Any = ABSENT  # (map_reader's: a key that is not there)


def tree_merge(updates: Sequence[bytes], fan_in: int = 64) -> bytes:
    """Merge many updates into one, in O(n log n) instead of ``merge_updates``' O(n^2).

    The result does not depend on the order of ``updates`` (PYCRDT-NOTES hazard 2).
    """
    level = [u for u in updates if u not in _EMPTY_UPDATES]
    if not level:
        return b"\x00\x00"
    while len(level) > 1:
        level = [
            level[i] if len(level[i : i + fan_in]) == 1 else merge_updates(*level[i : i + fan_in])
            for i in range(0, len(level), fan_in)
        ]
    return level[0]


class JournalReplay(ReplicaDocument):
    """Journal entries applied to a replica's document with their provenance."""

    def __init__(self, *, max_update: int = DEFAULT_MAX_UPDATE) -> None:
        super().__init__(max_update=max_update)
        self.seq = 0  # journal position reached, when driven by a replay
        self.skipped: list[JournalCorrupt] = []  # corrupt journal entries not applied

    def apply_rows(
        self, rows: Iterable[Row], run: str = "", *, settle: bool = True, own: bool = True
    ) -> None:
        """Apply journal entries in the given (causal) order, keeping provenance exact.

        ``settle=False`` leaves packing the provenance index to the caller (a record's
        opening packs it once at the end: packing a growing collection every few groups
        merges its keys again each time); until then the positions wait in the packed
        runs' tails (:meth:`_load_keys`), not as a ``str`` key each. ``own=False`` says the
        index holds no write of this replica's that is not journaled yet (a record's
        opening: nothing was written through it), so no key's provenance can name a later
        entry than these (see :meth:`_apply_rows`' ``before``) and that check is skipped.

        Applied in pycrdt transactions of up to ``_APPLY_GROUP`` entries each (see
        :meth:`_apply_rows`): yrs commits a big transaction of interleaved list appends
        slowly (1,000 appends by 3 writers in one transaction: 5x the time of applying them
        one by one), while groups of 8-32 entries are the fastest for maps, lists and texts
        alike (20k journal entries of the resume benchmark's workloads: 0.5-0.8x the time of
        one by one, 0.2x that of one transaction per 1,000 for the log workload).
        """
        if not isinstance(rows, list):
            rows = list(rows)
        if len(rows) <= _APPLY_GROUP:
            self._apply_rows(rows, run, settle, own)
        else:
            for i in range(0, len(rows), _APPLY_GROUP):
                self._apply_rows(rows[i : i + _APPLY_GROUP], run, settle, own)
        if not settle:  # (a load: the keys' positions wait packed for the caller's _settle)
            self._stash()

    def _apply_rows(self, rows: list[Row], run: str, settle: bool, own: bool) -> None:
        """:meth:`apply_rows` of one group of entries, in one pycrdt transaction.

        Provenance follows what the document did, not what the entry wanted: an entry whose
        write to a key lost to a concurrent one (LWW by client id) does not become that key's
        provenance. After the batch, each key it touched is read once and attributed to the
        last entry of the batch whose write left exactly that value (or that delete); when
        none did, a write from before the batch won and keeps its provenance. (Map observers
        would say the same, at several times the cost of the apply itself.) Two concurrent
        writes of the same value are indistinguishable; the one later in the journal is
        named, on every replica (see :meth:`_winners`).

        The batch is applied and read back in one pycrdt transaction (pycrdt otherwise opens
        and commits one per update applied and several per key read); the entries are still
        integrated one by one, in the given order. The value before the batch of a key that
        :meth:`_winners` needs is read just before the batch's first entry that writes it.

        An entry that fails its checksum or does not decode (a torn or corrupted entry) is
        skipped, never applied, and recorded in :attr:`skipped` as a :class:`JournalCorrupt`;
        the entries around it are applied as usual (DESIGN I4: a torn tail is skipped and
        never corrupts earlier entries).
        """
        # (rows come in journal order: a position the index holds is at most head)
        if self.index and (own or rows[0][0] <= self.head):
            self._apply_general(rows, run, settle, late=True)
        else:
            self._apply_fresh(rows, run, settle)

    def _apply_general(self, rows: list[Row], run: str, settle: bool, late: bool) -> None:
        """:meth:`_apply_rows` of any group. ``late``: a key's provenance may name a later
        entry than a row of the group that writes it (its value before is then read)."""
        # keys whose provenance names a later entry (or one not journaled yet) than a row of
        # this batch that writes them: their value before the batch (see _winners)
        before: dict[tuple[str, str], Any] = {}
        # collection -> key -> the batch's write of it, or its writes (in journal order)
        touched: dict[str, dict[str, _Held]] = {}
        item_rows: list[Row] = []  # (for the item provenance index)
        doc = self.doc
        index = self.index
        coll_seq = self.coll_seq
        head = self.head
        name: Any = None  # the collection of the last map op, and its touched keys
        keyed: dict[str, _Held] = {}
        with doc.transaction() as txn:
            rtxn = raw(txn)
            apply = update_applier(doc, rtxn)  # (straight to yrs in this transaction)
            # an update from elsewhere may register a name concurrently as another kind:
            # forget what was cached (see apply_update), the registry is the truth
            self._kinds.clear()
            for row in rows:
                seq, _, _, _, _, update, effect, crc, _, _ = row
                if checksum(update) != crc:
                    self._skip(JournalCorrupt(run, seq, "checksum mismatch"))
                    continue
                if late:
                    for op in effect:
                        if op[0] == "map":
                            named = index.get(op[1], _NO_KEYS).get(op[3])
                            if named is None:  # (settled: packed, out of the dict)
                                named = self.settled_seq(op[1], op[3])
                            if (
                                named is not None
                                and (type(named) is not int or named > seq)
                                and (op[1], op[3]) not in before
                                and op[3] not in touched.get(op[1], _NO_KEYS)
                            ):  # (a Meta: not journaled yet, so later than the row)
                                before[(op[1], op[3])] = self._map_value(op[1], op[3], rtxn)
                if not self._apply_all(apply, [row], [update], run):
                    continue
                if seq > head:
                    head = seq
                items = False
                for op in effect:
                    coll = op[1]
                    coll_seq[coll] = seq
                    if op[0] == "map":
                        if coll != name:
                            name = coll
                            got = touched.get(coll)
                            if got is None:
                                got = touched[coll] = {}
                            keyed = got
                        key = op[3]
                        held = keyed.get(key)
                        if held is None:
                            keyed[key] = (op, row)
                        elif isinstance(held, list):
                            held.append((op, row))
                        else:
                            keyed[key] = [held, (op, row)]
                    else:
                        items = True
                if items:
                    item_rows.append(row)
            self.head = head
            if item_rows:
                self.items.applied_rows(item_rows)
            if not touched:
                return
            winners = self._winners(touched, rtxn, before)
        self._remember_rows([winners[seq] for seq in sorted(winners)])
        # only a collection this batch grew can have reached the size _settle acts on
        if settle and any(len(index.get(name, ())) >= _SETTLE_MIN for name in touched):
            self._settle()

    def _apply_fresh(self, rows: list[Row], run: str, settle: bool) -> None:
        """:meth:`_apply_rows` of a group that no key's provenance places after (no value
        before the group to read): every opening, compaction and most tails.

        Done column by column (``map`` and ``set`` at C speed, not a Python loop per entry:
        a resume applies a group per 32 entries). A group with a damaged entry goes through
        :meth:`_apply_general`, which skips it. When the group sets distinct keys of one map
        and the document kept every one (the usual case of a load), they are indexed at once
        (:meth:`_all_won`); otherwise :meth:`_winners` decides from the same writes. Same
        document and provenance as the general path (tests/record/test_replay_fresh.py).
        """
        updates = list(map(_UPDATE, rows))
        if set(map(type, updates)) != {bytes} or list(map(checksum, updates)) != list(
            map(_CRC, rows)
        ):
            self._apply_general(rows, run, settle, late=False)  # (skips it, entry by entry)
            return
        doc = self.doc
        with doc.transaction() as txn:
            rtxn = raw(txn)
            self._kinds.clear()  # (as in _apply_general)
            applied = self._apply_all(update_applier(doc, rtxn), rows, updates, run)
            if not applied:
                return
            self.head = max(self.head, max(map(_SEQ, applied)))
            effects = list(map(_EFFECT, applied))
            if set(map(len, effects)) == {1}:  # one op an entry (the usual case)
                ops: list[Op] = list(map(_FIRST, effects))
                owners = applied  # (the entry of each op)
            else:
                ops, owners = [], []
                for row, effect in zip(applied, effects, strict=True):
                    ops.extend(effect)
                    owners.extend([row] * len(effect))
            self.coll_seq.update(zip(map(_COLL, ops), map(_SEQ, owners), strict=True))
            if set(map(_KIND, ops)) != {"map"}:
                item_rows: list[Row] = []
                for row, effect in zip(applied, effects, strict=True):
                    if any(op[0] != "map" for op in effect):
                        item_rows.append(row)
                if item_rows:
                    self.items.applied_rows(item_rows)
                maps = [(op, row) for op, row in zip(ops, owners, strict=True) if op[0] == "map"]
                if not maps:
                    return
                ops, owners = [op for op, _ in maps], [row for _, row in maps]
            names = set(map(_COLL, ops))
            won = None
            if owners is applied and len(names) == 1:  # (one op an entry, one collection)
                won = self._all_won(ops, owners, rtxn, load=not settle)
            if won is None:
                winners = self._winners(_touched(ops, owners), rtxn, {})
                won = [winners[seq] for seq in sorted(winners)]
        self._remember_rows(won)
        index = self.index
        if settle and any(len(index.get(name, ())) >= _SETTLE_MIN for name in names):
            self._settle()

    def _apply_all(
        self, apply: Callable[[bytes], None], rows: list[Row], updates: list[bytes], run: str
    ) -> list[Row]:
        """Apply ``updates`` (of ``rows``, their checksums passed) in the open transaction;
        return the rows applied (``rows`` itself when none was refused)."""
        refused: set[int] = set()
        start, n = 0, len(updates)
        while start < n:
            at = start
            try:
                # journal entries passed their checksum: skip the trial decode that untrusted
                # bytes get (pycrdt leaves the doc intact on bytes it rejects); the count
                # check of check_update(trial_decode=False, size_limit=False)
                for at in range(start, n):
                    update = updates[at]
                    check_update_counts(update)
                    apply(update)
                break
            except BaseException as exc:
                self._refused(exc, run, rows[at][0])
                refused.add(at)
                start = at + 1
        if not refused:
            return rows
        return [row for i, row in enumerate(rows) if i not in refused]

    def _all_won(
        self, ops: list[Op], owners: list[Row], rtxn: Any, *, load: bool = False
    ) -> list[Row] | None:
        """:meth:`_winners` when ``owners[i]`` wrote ``ops[i]`` (in journal order, one op
        each) in one collection and there is no value before to compare, if every write is
        a set of a distinct key that the document kept (the usual case of a load): index
        them all at once and return ``owners``; else None, with nothing indexed. ``load``:
        into the packed run's tail when the collection's dict is empty."""
        name = ops[0][1]
        keys = list(map(_KEY, ops))
        if len(set(keys)) != len(keys) or set(map(_ACTION, ops)) != {"set"}:
            return None
        read = self._map_reader(name, rtxn, map_reader(self.registry, rtxn))
        if read is None or not all(map(eq, map(_VALUE, ops), map(read, keys))):
            return None
        got = self.index.get(name)
        if load and not got:
            self._load_keys(name, keys, map(_SEQ, owners))
            return owners
        if got is None:
            got = self.index[name] = {}
        got.update(zip(keys, map(_SEQ, owners), strict=True))
        return owners

    def _map_reader(self, coll: str, rtxn: Any, registry: Any) -> Any:
        """:func:`._pycrdt.map_reader` of collection ``coll`` in the open transaction, or
        None when the registry (``registry``: a reader of it) has it as another kind."""
        kinds = self._kinds
        kind = kinds.get(coll)
        if kind is None:
            kind = registry(coll)
            if kind in KINDS:
                kinds[coll] = kind
        if kind in KINDS and kind != "map":
            return None
        root = self._roots.get((coll, "map"))
        if root is None:
            root = self.root(coll, "map")
        return map_reader(root, rtxn)

    def _refused(self, exc: BaseException, run: str, seq: int) -> None:
        """Record entry ``seq``, whose update was refused with ``exc``, as skipped (a
        ``KeyboardInterrupt`` or ``SystemExit`` is raised again)."""
        if isinstance(exc, InvalidUpdate):
            self._skip(JournalCorrupt(run, seq, exc.reason))
        elif isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise exc
        else:  # pycrdt raises ValueError, RuntimeError or a panic
            self._skip(JournalCorrupt(run, seq, f"{type(exc).__name__}: {exc}"))

    def _remember_rows(self, winners: list[Row]) -> None:
        """Put the entries ``winners`` (in journal order) in the entry table (appended in the
        usual case, as :meth:`ProvenanceIndex.journaled_many` does)."""
        table = self.table
        if not winners:
            return
        table.fit(winners[-1][0])
        tseqs, walls, names = table.seqs, table.walls, table.name_index
        last = tseqs[-1] if tseqs else 0  # the table's last position
        if winners[0][0] > last:
            named = set(map(_WHO, winners))
            if len(named) == 1:  # the usual case: all appended, under one (agent, source, run)
                who_ = names(*named.pop())
                tseqs.extend(map(_SEQ, winners))
                walls.extend(map(_WALL, winners))
                table.who.extend(repeat(who_, len(winners)))
                if len(tseqs) > table.sweep_at and not self._tails():
                    table.keep(self._live_seqs())
                return
        agent_, source_, run_, who_ = "", "", "", -1  # the last entry's names, their index
        for seq, agent, source, _, wall, _, _, _, run, _ in winners:
            if seq <= last:
                table.add(seq, agent, source, wall, run)
            else:  # the usual case: append, the (agent, source, run) shared
                if agent is not agent_ or source is not source_ or run is not run_:
                    agent_, source_, run_ = agent, source, run
                    who_ = names(agent, source, run)
                tseqs.append(seq)
                walls.append(wall)
                table.who.append(who_)  # (not held: a name new to the table widens it)
                last = seq
        # (a load's tails wait: its _settle sweeps once they are packed)
        if len(tseqs) > table.sweep_at and not self._tails():
            table.keep(self._live_seqs())

    def _map_value(self, coll: str, key: str, rtxn: Any) -> Any:
        """The value of ``coll[key]`` inside the open transaction ``rtxn`` (``_ABSENT``: not
        there, or ``coll`` is not a map)."""
        kind = self._kinds.get(coll)
        if kind is None:
            kind = map_get(self.registry, rtxn, coll)
        if kind in KINDS and kind != "map":
            return _ABSENT
        root = self._roots.get((coll, "map"))
        if root is None:
            return _ABSENT  # (never read as a map here: nothing to compare with)
        return map_get(root, rtxn, key)

    def _winners(
        self,
        touched: dict[str, dict[str, _Held]],
        rtxn: Any,
        before: dict[tuple[str, str], Any],
    ) -> dict[int, Row]:
        """For :meth:`apply_rows`, inside its transaction (``rtxn``: :func:`._pycrdt.raw` of
        it): index each touched key under the last entry whose write left its current
        value; return those entries by position.

        Two concurrent writes of one value cannot be told apart, so every replica must name
        the same one: the one latest in the journal. A key that the index names under an
        entry later than this batch's rows (this replica's own write, journaled or not yet)
        and whose value the batch left as it was (``before``) keeps that entry.

        Reads with :func:`._pycrdt.map_reader` in the open transaction. Values are compared
        as yrs returns them (``==`` takes ``1.0`` and ``1`` as equal, as ``from_stored``
        makes them).
        """
        winners: dict[int, Row] = {}
        registry = map_reader(self.registry, rtxn)
        index = self.index
        for coll, keyed in touched.items():
            read = self._map_reader(coll, rtxn, registry)
            if read is None:
                continue  # registered as another kind: not a map key (see root())
            keys = index.get(coll)
            for key, held in keyed.items():
                current = read(key)
                winner: Row | None = None
                if not isinstance(held, list):  # the usual case: one write of the key
                    op, row = held
                    if (
                        op[2] != "set"
                        if current is _ABSENT
                        else (op[2] == "set" and op[4] == current)
                    ):
                        winner = row
                else:
                    for op, row in reversed(held):
                        if current is _ABSENT:
                            if op[2] != "set":
                                winner = row
                                break
                        elif op[2] == "set" and op[4] == current:
                            winner = row
                            break
                if winner is None:
                    continue  # a write from before this batch is still current
                if before and (coll, key) in before and before[(coll, key)] == current:
                    continue  # (the later entry the index names wrote this value too)
                if keys is None:
                    keys = index[coll] = {}
                seq = winner[0]
                keys[key] = seq
                winners[seq] = winner
        return winners

    def _skip(self, error: JournalCorrupt) -> None:
        log.error("%s; entry skipped", error)
        self.skipped.append(error)


_NO_KEYS: dict[str, Any] = {}
# a row's columns (position, wall time, (agent, source, origin), update, effect, checksum)
_SEQ, _WALL, _WHO = itemgetter(0), itemgetter(4), itemgetter(1, 2, 8)
_UPDATE, _EFFECT, _CRC = itemgetter(5), itemgetter(6), itemgetter(7)
# an op's parts (kind, collection, action, key, value), and an effect's first op
_KIND, _COLL, _ACTION, _KEY, _VALUE = (itemgetter(i) for i in range(5))
_FIRST = itemgetter(0)


def _touched(ops: list[Op], owners: list[Row]) -> dict[str, dict[str, _Held]]:
    """The writes ``ops`` (``owners[i]`` wrote ``ops[i]``, in journal order) by collection and
    key, as :meth:`JournalReplay._apply_rows` gathers them for :meth:`~JournalReplay._winners`."""
    touched: dict[str, dict[str, _Held]] = {}
    for op, row in zip(ops, owners, strict=True):
        keyed = touched.get(op[1])
        if keyed is None:
            keyed = touched[op[1]] = {}
        held = keyed.get(op[3])
        if held is None:
            keyed[op[3]] = (op, row)
        elif isinstance(held, list):
            held.append((op, row))
        else:
            keyed[op[3]] = [held, (op, row)]
    return touched


# a key's write in a batch, or its writes when several (see JournalReplay._apply_rows)
_Held = tuple[Op, Row] | list[tuple[Op, Row]]


_APPLY_GROUP = 32  # journal entries Replica.apply_rows applies in one pycrdt transaction
