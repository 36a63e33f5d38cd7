"""A bulk load of journal entries into a replica (opening a run, compaction, replay): the
document and provenance :meth:`Replica.apply_rows` would give, with the entries applied in
merged groups and each key's provenance resolved once for many entries (see
:class:`BulkLoad`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pycrdt import merge_updates

from .._errors import CollectionKindMismatch, InvalidUpdate, JournalCorrupt, PayloadTooLarge
from .._journal import Op, Row, checksum
from ._pycrdt import map_reader, raw
from ._replay import _ABSENT, JournalReplay

# entries a bulk load merges into one apply: measured on 20k-100k entries, groups of 16-64
# apply in 0.6-0.7x the time of one apply per entry; much larger groups of list appends by
# several writers are slower than one by one (yrs integrates a big interleaved merge slowly)
_BULK_GROUP = 32

_BULK_PENDING_KEYS = 10_000  # keys whose winner a bulk load holds before resolving them

# one journaled write a bulk load keeps per key and slot:
# seq, op, agent, source, wall time, origin, slot (see BulkLoad)
_Write = tuple[int, Op, str, str, float, str, int]

_DELETES = -(1 << 62)  # the slot of a key's deletes (a client id is >= 0, -seq is above it)


def _by_seq(write: _Write) -> int:
    return write[0]


class _OneByOne(Exception):
    pass


class BulkLoad:
    """Apply many journal entries to a replica (compaction, replay) with the same document and
    provenance as :meth:`Replica.apply_rows`, resolving each key once for many entries (a key
    written many times costs one read of the document, not one per batch).

    The entries passed to :meth:`feed` are checked (CRC-32), merged in groups of
    ``_BULK_GROUP`` and each group applied to the document once (entry by entry only if the
    merge or the apply of a group is refused, so that a bad entry is skipped alone).
    Provenance is resolved as in :meth:`Replica.apply_rows`, but once for many chunks: per
    key only the last set of each writer (``client_id``; a writer's later set supersedes its
    own earlier ones) and the last delete are kept, and the keys are read from the document
    when :meth:`finish` runs (or when more than ``_BULK_PENDING_KEYS`` keys are pending, which
    bounds the memory held). Once an entry has been skipped, the rest is applied entry by
    entry (yrs integrates entries after a gap one by one differently from a merge of them)
    and every write is kept (a writer's entries after a skipped one may be left pending, so
    its earlier write may be the current one). Two writes of the same value are told apart as
    in :meth:`Replica.apply_rows`, except that a writer's superseded set is never named.
    """

    def __init__(self, replica: JournalReplay, run: str = "") -> None:
        self.replica = replica
        self.run = run
        # collection -> key -> the last write, or client id -> last write when several wrote
        self._pending: dict[str, dict[str, _Write | dict[int, _Write]]] = {}
        self._count = 0  # keys pending
        self._every_write = False  # set once an entry was skipped

    def feed(self, rows: Sequence[Row]) -> None:
        replica = self.replica
        good: list[Row] = []
        for row in rows:
            if checksum(row.update) != row.checksum:
                replica._skip(JournalCorrupt(self.run, row.seq, "checksum mismatch"))
                self._every_write = True
            else:
                good.append(row)
        applied: list[Row] = []
        for at in range(0, len(good), _BULK_GROUP):
            group = good[at : at + _BULK_GROUP]
            try:
                if self._every_write:  # after a skipped entry: one by one, as apply_rows
                    raise _OneByOne
                # our own journal's entries: no size limit, no trial decode (as in apply_rows)
                merged = merge_updates(*[row.update for row in group])
                replica.apply_update(merged, trial_decode=False, size_limit=False)
                applied.extend(group)
                continue
            except Exception:  # an entry is refused: apply them one by one, skipping it
                pass  # (also _OneByOne)
            for row in group:
                try:
                    replica.apply_update(row.update, trial_decode=False, size_limit=False)
                except (InvalidUpdate, PayloadTooLarge) as exc:
                    reason = exc.reason if isinstance(exc, InvalidUpdate) else str(exc)
                    replica._skip(JournalCorrupt(self.run, row.seq, reason))
                    self._every_write = True
                    continue
                applied.append(row)
        replica.items.applied_rows(applied)
        pending, coll_seq = self._pending, replica.coll_seq
        head, every, count = replica.head, self._every_write, self._count
        name: Any = None  # the collection of the last map op, and its pending keys
        keyed: dict[str, _Write | dict[int, _Write]] = {}
        for row in applied:
            seq = row.seq
            if seq > head:
                head = seq
            if not row.effect:
                continue
            # the slot a write replaces: the writer's last set, or the last delete (every
            # write its own slot once an entry was skipped)
            client = row.client_id
            agent, source, wall, origin = row.agent, row.source, row.wall_time, row.origin
            for op in row.effect:
                coll = op[1]
                coll_seq[coll] = seq
                if op[0] != "map":
                    continue
                if coll != name:
                    name = coll
                    got = pending.get(coll)
                    if got is None:
                        got = pending[coll] = {}
                    keyed = got
                slot = -seq if every else client if op[2] == "set" else _DELETES
                write: _Write = (seq, op, agent, source, wall, origin, slot)
                key = op[3]
                held = keyed.get(key)
                if held is None:
                    keyed[key] = write
                    count += 1
                elif isinstance(held, dict):
                    held[slot] = write
                elif held[6] == slot:
                    keyed[key] = write
                else:
                    keyed[key] = {held[6]: held, slot: write}
        replica.head = head
        self._count = count
        if count > _BULK_PENDING_KEYS:
            self.finish(settle=False)

    def finish(self, *, settle: bool = True) -> None:
        """Attribute every pending key to the entry whose write the document kept; then, with
        ``settle``, pack the provenance index (once at the end of a load, not per group of
        pending keys: each packing merges every key of the collection settled so far)."""
        replica, pending = self.replica, self._pending
        self._pending, self._count = {}, 0
        winners: dict[int, _Write] = {}
        # every key read in one transaction (map_reader), as JournalReplay._winners does
        with replica.doc.transaction() as txn:
            rtxn = raw(txn)
            for name, keyed in pending.items():
                try:
                    root = replica.root(name, "map")
                except CollectionKindMismatch:
                    continue
                read = map_reader(root, rtxn)
                index = replica.index.setdefault(name, {})
                for key, held in keyed.items():
                    current = read(key)
                    # (== compares 1.0 and 1 equal, as from_stored would make them)
                    if not isinstance(held, dict):  # the usual case: one write of the key
                        op = held[1]
                        if (
                            op[2] != "set"
                            if current is _ABSENT
                            else (op[2] == "set" and op[4] == current)
                        ):
                            index[key] = held[0]
                            winners[held[0]] = held
                        continue
                    for write in sorted(held.values(), key=_by_seq, reverse=True):
                        op = write[1]
                        if (current is _ABSENT and op[2] != "set") or (
                            current is not _ABSENT and op[2] == "set" and op[4] == current
                        ):
                            index[key] = write[0]
                            winners[write[0]] = write
                            break
                    # no write matched: a write from before these entries is still current
        del pending
        table = replica.table
        if winners:
            table.fit(max(winners))
        tseqs, walls = table.seqs, table.walls
        for seq in sorted(winners):  # in journal order: the table appends
            _, _, agent, source, wall, origin, _ = winners[seq]
            if tseqs and seq <= tseqs[-1]:
                table.add(seq, agent, source, wall, origin)
            else:  # the usual case (as in Replica.journaled_many)
                who = table.name_index(agent, source, origin)
                tseqs.append(seq)
                walls.append(wall)
                table.who.append(who)
        if len(tseqs) > table.sweep_at:
            table.keep(replica._live_seqs())
        if settle:
            replica._settle()
