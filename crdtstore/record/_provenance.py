"""The provenance index: who wrote the current value of every map key, compactly.

Each key holds the journal position of the entry that wrote it (an int; the entry's
:class:`Meta` while it is not journaled yet), and a per-replica :class:`_EntryTable` holds
agent, source, wall time and nested run once per entry; big collections keep their journaled
positions packed in a :class:`_Settled` run. :class:`ProvenanceIndex` is the replica's part
that keeps them (with the journal positions per collection and of the whole replica, which
versions are made of) and exports them beside a snapshot.
"""

from __future__ import annotations

import base64
import sys
import time
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import compress, islice
from operator import lt
from typing import Any, NamedTuple

from .._heap import release_free_memory
from .._journal import Op
from ._settled import _compact
from ._settled import _Settled as _Settled


class Meta(NamedTuple):
    """Provenance of one journal entry (shared by every key it wrote).

    A tuple of atomic values, so that the garbage collector stops tracking it. ``seq`` is None
    until the entry is journaled: until then the provenance index points at this object
    (one per entry, shared by every key it wrote); once the position is known the index holds
    just the position and the replica's :class:`_EntryTable` the rest (without ``call``: the
    live index does not keep tool-call ids, the journal does).
    """

    agent: str
    source: str
    wall_time: float
    seq: int | None
    run: str = ""  # the nested run that wrote it; "" for the journal's own run
    call: str = ""  # the tool-call id it was written for (Record.attributed); "" for none

    def as_list(self) -> list[Any]:
        return [self.seq, self.agent, self.source, self.wall_time, self.run]


class Writer(NamedTuple):
    """Who made a write: the agent and source kind its journal entry and provenance name.

    A process that journals other writers' bytes through its own record (the hub: the token
    of the connection that sent them) passes one to :meth:`Record.apply_update` and
    :meth:`Record.append_updates`; without one a write is the record's own.
    """

    agent: str
    source: str


_NARROW = 1 << 32  # journal positions below this fit the entry table's 4-byte column


def now() -> float:
    return time.time()


class _EntryTable:
    """Provenance of journaled entries, by journal position, in parallel arrays.

    One row per entry that is still the provenance of some key: 4 bytes of position (8 once
    one does not fit), 8 of wall time and 1 of the index of a shared ``(agent, source, run)``
    tuple in :attr:`names_of` (wider when there are more), instead of a ``Meta`` tuple and
    its float per key (100k keys: about 1.3 MiB instead of 11). Rows are kept sorted by
    position (entries arrive in journal order but for the odd local commit that lands after
    a later remote entry was applied); rows no key points at any more are dropped when the
    table has grown to twice what was live at the last sweep. Who appends to the columns
    directly first calls :meth:`fit` with the highest position and takes the index of the
    names from :meth:`name_index` (either may replace a column by a wider one).
    """

    __slots__ = ("_last", "_last_i", "_names", "names_of", "seqs", "sweep_at", "walls", "who")

    def __init__(self) -> None:
        self.seqs: array[int] = array("I")
        self.walls = array("d")
        self.who: array[int] = array("B")  # per row, the index of its names in names_of
        self.names_of: list[tuple[str, str, str]] = []
        self._names: dict[tuple[str, str, str], int] = {}
        self._last = ("", "", "")
        self._last_i = -1
        self.sweep_at = 4096

    def __len__(self) -> int:
        return len(self.seqs)

    def fit(self, seq: int) -> None:
        """Make :attr:`seqs` able to hold position ``seq`` (8-byte items, for good, when it
        does not fit in 4)."""
        if not 0 <= seq < _NARROW and self.seqs.typecode == "I":
            self.seqs = array("q", self.seqs)

    def name_index(self, agent: str, source: str, run: str) -> int:
        """The index in :attr:`names_of` of ``(agent, source, run)`` (added if new)."""
        last = self._last
        if last[0] is agent and last[1] is source and last[2] is run:
            return self._last_i
        who = (agent, source, run)
        i = self._names.get(who)
        if i is None:
            i = self._names[who] = len(self.names_of)
            self.names_of.append(who)
            if i >= 1 << (8 * self.who.itemsize):
                self.who = array("H" if i < 1 << 16 else "I", self.who)
        self._last, self._last_i = who, i
        return i

    def add(self, seq: int, agent: str, source: str, wall: float, run: str) -> None:
        who = self.name_index(agent, source, run)
        self.fit(seq)
        seqs = self.seqs
        if not seqs or seq > seqs[-1]:
            seqs.append(seq)
            self.walls.append(wall)
            self.who.append(who)
            return
        i = bisect_left(seqs, seq)
        if i < len(seqs) and seqs[i] == seq:  # the same entry again: it is one entry
            return
        seqs.insert(i, seq)
        self.walls.insert(i, wall)
        self.who.insert(i, who)

    def get(self, seq: int) -> Meta | None:
        seqs = self.seqs
        i = bisect_left(seqs, seq)
        if i == len(seqs) or seqs[i] != seq:
            return None
        agent, source, run = self.names_of[self.who[i]]
        return Meta(agent, source, self.walls[i], seq, run)

    def agent(self, seq: int) -> str | None:
        """``get(seq).agent`` without building the ``Meta``."""
        seqs = self.seqs
        i = bisect_left(seqs, seq)
        if i == len(seqs) or seqs[i] != seq:
            return None
        return self.names_of[self.who[i]][0]

    def keep(self, live: set[Any]) -> None:
        """Drop the rows whose position is not in ``live``."""
        if live.issuperset(self.seqs):  # every row is live (at C speed): nothing to drop
            self.sweep_at = max(4096, 2 * len(self.seqs))
            return
        kept = list(map(live.__contains__, self.seqs))  # (at C speed, no int kept)
        self.seqs = array(self.seqs.typecode, compress(self.seqs, kept))
        self.walls = array("d", compress(self.walls, kept))
        self.who = array(self.who.typecode, compress(self.who, kept))
        self.sweep_at = max(4096, 2 * len(self.seqs))

    def columns(self) -> tuple[array[int], array[float], array[int], list[list[str]]]:
        """The columns to export: positions, wall times, and the names of each row as an
        index into the list of names returned (those some row names, in order of first
        use)."""
        number = {i: n for n, i in enumerate(dict.fromkeys(self.who))}
        names = [list(self.names_of[i]) for i in number]
        return self.seqs, self.walls, array("q", map(number.__getitem__, self.who)), names

    def adopt(
        self, seqs: array[int], walls: array[float], who: array[int], names: Sequence[Any]
    ) -> bool:
        """Take in columns as :meth:`columns` gave them (``who`` indexing ``names``, lists of
        agent, source and run). Returns False, having changed nothing, unless they fit
        together (the same lengths, an index for every row); then the rows are added under
        what is here already.
        """
        if not (len(seqs) == len(walls) == len(who)) or (
            who and not 0 <= min(who) <= max(who) < len(names)
        ):
            return False
        ours = [self.name_index(str(a), str(s), str(r)) for a, s, r in names]
        if not self.seqs and _increasing(seqs):
            # the usual case, a fresh replica: adopt the columns (the positions as 4-byte
            # items while they fit)
            self.seqs = _compact(seqs)
            self.walls = walls
            self.who = array(self.who.typecode, map(ours.__getitem__, who))
            self.sweep_at = max(4096, 2 * len(seqs))
            return True
        names_of = self.names_of
        for seq, wall, i in zip(seqs, walls, who, strict=True):
            agent, source, run = names_of[ours[i]]
            self.add(seq, agent, source, wall, run)
        return True

    def export(self) -> dict[str, Any]:
        """The rows as JSON-able data: the columns packed (see :func:`_pack`)."""
        seqs, walls, who, names = self.columns()
        return {
            "seq": _pack(array("q", seqs)),
            "wall": _pack(walls),
            "who": _pack(who),
            "names": names,
        }

    def load(self, table: dict[str, Any]) -> None:
        """Take in rows as :meth:`export` wrote them.

        Raises:
            ValueError: the columns do not fit together.
        """
        seqs, walls = _unpack("q", table.get("seq", [])), _unpack("d", table.get("wall", []))
        who = _unpack("l", table.get("who", []))
        if not self.adopt(seqs, walls, who, table.get("names", [])):
            raise ValueError("inconsistent provenance table")


def _pack(values: array[Any]) -> str:
    """An array as base64 of its items in little-endian order: a snapshot's provenance
    columns are read back without a Python object per item."""
    if sys.byteorder == "big":
        values = array(values.typecode, values)
        values.byteswap()
    if values.typecode == "l":  # "l" is 4 or 8 bytes by platform: store 8
        values = array("q", values)
    return base64.b64encode(values.tobytes()).decode("ascii")


def _unpack(typecode: str, data: str | list[Any]) -> array[Any]:
    """The inverse of :func:`_pack` (a list is taken as is: an earlier layout)."""
    if isinstance(data, list):
        return array(typecode, data)
    out = array("q" if typecode == "l" else typecode)
    out.frombytes(base64.b64decode(data))
    if sys.byteorder == "big":
        out.byteswap()
    return out


def _increasing(items: Sequence[Any]) -> bool:
    """Whether ``items`` is strictly increasing (compared at C speed)."""
    return all(map(lt, items, islice(items, 1, None)))


_SETTLE_MIN = 4096  # index entries of a collection kept as a dict before settling them


class ProvenanceIndex:
    """The provenance of a replica's map keys (see the module docstring); a base of
    :class:`~crdtstore.record.Replica`, whose document writes update :attr:`index`."""

    settle_min = _SETTLE_MIN  # (an instance's own, smaller, in tests of settling)

    def __init__(self) -> None:
        # collection -> key -> the journal position of the entry that wrote the current value
        # (its provenance is in self.table), or the entry's Meta while it is not journaled, or
        # (from snapshots of older versions, until first asked) [seq, agent, source, wall, run]
        # (Bulk loads move the journaled positions of big collections into self._settled.)
        self.index: dict[str, dict[str, Any]] = {}
        self._settled: dict[str, _Settled] = {}
        # collection -> the size of its dict at which the write path settles it next (see
        # _settle_one; a collection not here settles at settle_min)
        self._settle_at: dict[str, int] = {}
        self.table = _EntryTable()
        self.head = 0  # highest journal position reflected here (applied or own, journaled)
        self.coll_seq: dict[str, int] = {}  # last journal position that touched a collection

    def journaled(self, ops: list[Op], meta: Meta, seq: int) -> None:
        """A local entry got its journal position: point its keys' provenance at it.

        One table row per entry (none if every key it wrote was overwritten since), and a
        dict store per key still pointing at ``meta``; no per-key tuple is rebuilt.
        """
        index = self.index
        if seq > self.head:
            self.head = seq
        coll_seq = self.coll_seq
        held = False
        for op in ops:
            coll_seq[op[1]] = seq
            if op[0] == "map":
                keys = index.get(op[1])
                if keys is not None and keys.get(op[3]) is meta:
                    keys[op[3]] = seq
                    held = True
        if held:
            self._remember(seq, meta.agent, meta.source, meta.wall_time, meta.run)
            self._settle_grown({op[1] for op in ops if op[0] == "map"})

    def journaled_many(
        self, batch: Sequence[tuple[bytes, list[Op], Meta]], seqs: Sequence[int]
    ) -> None:
        """:meth:`journaled` for a committed batch of ``(update, ops, meta)`` entries (the
        committer's path: the same work without a call per entry)."""
        if len(seqs) == 1:  # (a lone guarded write's group: the loop's setup costs more)
            _, ops, meta = batch[0]
            ProvenanceIndex.journaled(self, ops, meta, seqs[0])
            return
        index, coll_seq, table = self.index, self.coll_seq, self.table
        if seqs:
            table.fit(max(seqs))
        tseqs = table.seqs
        add_seq, add_wall, add_who = tseqs.append, table.walls.append, table.who.append
        names = table.name_index
        last = tseqs[-1] if tseqs else 0  # the table's last position
        name: Any = None  # the collection of the last map op, and its keys
        keys: dict[str, Any] | None = None
        grown: set[str] = set()  # the collections whose dict took in a position
        agent_, source_, run_, who_ = "", "", "", -1  # the last entry's names, their index
        for (_, ops, meta), seq in zip(batch, seqs, strict=True):
            held = False
            for op in ops:
                coll_seq[op[1]] = seq
                if op[0] == "map":
                    if op[1] is not name:
                        name = op[1]
                        keys = index.get(name)
                    if keys is not None and keys.get(op[3]) is meta:
                        keys[op[3]] = seq
                        if not held:
                            held = True
                            grown.add(name)
            if held:
                agent, source, wall, _, run, _ = meta
                if seq <= last:
                    table.add(seq, agent, source, wall, run)
                    add_who = table.who.append  # (names new to the table widen the column)
                else:  # the usual case: append, the (agent, source, run) shared
                    if agent is not agent_ or source is not source_ or run is not run_:
                        agent_, source_, run_ = agent, source, run
                        who_ = names(agent, source, run)
                        add_who = table.who.append
                    add_seq(seq)
                    add_wall(wall)
                    add_who(who_)
                    last = seq
        if seqs:
            self.head = max(self.head, max(seqs))
        if grown:
            self._settle_grown(grown)
        if len(tseqs) > table.sweep_at:
            table.keep(self._live_seqs())

    def adopt(
        self, collection: str, key: str, seq: int, agent: str, source: str, wall: float, run: str
    ) -> None:
        """Name entry ``seq`` (written by ``agent``...) as the provenance of ``collection[key]``:
        when two entries left the same value (or both deleted the key), which one is named is
        not decided by the document, and the journal's authority has the last word (a guarded
        write refused by a server names the version it holds; see ``Record``)."""
        self._remember(seq, agent, source, wall, run)
        keys = self.index.get(collection)
        if keys is None:
            keys = self.index[collection] = {}
        keys[key] = seq

    def _remember(self, seq: int, agent: str, source: str, wall: float, run: str) -> None:
        table = self.table
        table.add(seq, agent, source, wall, run)
        if len(table) > table.sweep_at:
            table.keep(self._live_seqs())

    def _live_seqs(self) -> set[Any]:
        """The journal positions some key's provenance points at (plus the ``Meta`` of
        entries not journaled yet: harmless in a set of positions, and leaving them in lets
        the values go in at C speed)."""
        live: set[Any] = set()
        for keys in self.index.values():
            try:
                live.update(keys.values())
            except TypeError:  # an older snapshot's [seq, agent, ...] lists: unhashable
                live.update(v for v in keys.values() if type(v) is int)
        for settled in self._settled.values():
            for seqs in settled.all_seqs():
                live.update(seqs)
        return live

    def _settle(self, *, every: bool = False) -> None:
        """After a bulk load: pack what it added to the packed runs' tails (see
        :meth:`_load_keys`), then :meth:`_settle_one` the collections whose dict has grown
        enough (see :meth:`_settle_size`; ``every``: all collections)."""
        if self._tails():
            for settled in self._settled.values():
                settled._pack()
            table = self.table
            if len(table) > table.sweep_at:  # (the sweep the load left, see _remember_rows)
                at = max(4096, 2 * len(table))  # (made before the set of positions, see _pack)
                live = self._live_seqs()
                if live.issuperset(table.seqs):
                    del live
                    table.sweep_at = at
                else:
                    table.keep(live)
        for name, keys in list(self.index.items()):
            if every or len(keys) >= self._settle_size(name):
                self._settle_one(name, keys)

    def _settle_grown(self, names: set[str]) -> None:
        """On the write path: :meth:`_settle_one` each collection of ``names`` whose dict has
        grown enough (see :meth:`_settle_size`), then give the freed memory back to the
        system (the dicts' tables and the merge's pieces; cheap beside a merge)."""
        index = self.index
        settled = False
        for name in names:
            keys = index.get(name)
            if keys is not None and len(keys) >= self._settle_size(name):
                self._settle_one(name, keys)
                settled = True
        if settled:
            release_free_memory()

    def _settle_size(self, name: str) -> int:
        """The size of collection ``name``'s dict at which it is settled next: when it has
        grown by half its settled run (at least :attr:`settle_min`) since it was last settled.
        Amortised: each settling merges the whole run, which grows by a third each time."""
        at = self._settle_at.get(name)
        if at is not None:
            return at
        settled = self._settled.get(name)
        return max(self.settle_min, len(settled) // 2 if settled else 0)

    def _settle_one(self, name: str, keys: dict[str, Any]) -> None:
        """Move the journaled positions of collection ``name`` from its dict ``keys`` into its
        :class:`_Settled` run; the dict keeps the rest (entries not journaled yet, an older
        snapshot's lists) and is replaced by a new one, which frees the keys' ``str``."""
        if set(map(type, keys.values())) == {int}:  # (every key journaled: a replay's)
            journaled, rest = keys, {}
        else:
            journaled = {k: v for k, v in keys.items() if type(v) is int}
            rest = {k: v for k, v in keys.items() if type(v) is not int}
        settled = self._settled.get(name)
        if journaled:
            if settled is None:
                settled = self._settled[name] = _Settled()
            settled.merge(journaled)
            self.index[name] = rest
        # (the rest counts: a dict of entries not journaled yet must not settle on every write)
        self._settle_at[name] = len(rest) + max(
            self.settle_min, len(settled) // 2 if settled is not None else 0
        )

    def _load_keys(self, collection: str, keys: Sequence[str], seqs: Iterable[int]) -> None:
        """A load (replay entries whose caller packs at the end, :meth:`_settle`) names entry
        ``seqs[i]`` as the provenance of ``collection[keys[i]]``, none of them held in the
        collection's dict (which would take precedence): into the tail of its packed run."""
        settled = self._settled.get(collection)
        if settled is None:
            settled = self._settled[collection] = _Settled()
            self.index.setdefault(collection, {})  # (as settling leaves it: see _apply_rows)
        settled.append(keys, seqs)

    def _stash(self) -> None:
        """A load's step is done: move the journaled positions the dicts took in (a group
        of entries that :meth:`_load_keys` could not take) to the packed runs' tails, so
        that no key is held as a ``str`` until the load ends (see :meth:`_Settled.append`)."""
        for name, keys in self.index.items():
            if keys and set(map(type, keys.values())) == {int}:
                self._load_keys(name, list(keys), keys.values())
                keys.clear()

    def _tails(self) -> bool:
        """Whether a load left positions in a packed run's tail (see :meth:`_load_keys`)."""
        return any(settled.all_seqs()[1] for settled in self._settled.values())

    def settled_seq(self, collection: str, key: str) -> int | None:
        """The journal position packed for ``collection[key]`` (None if none: its entry, if
        any, is in :attr:`index`, which comes first)."""
        settled = self._settled.get(collection)
        return None if settled is None else settled.get(key)

    def meta(self, collection: str, key: str) -> Meta | None:
        """The provenance of the current value of ``collection[key]`` (None if unknown)."""
        keys = self.index.get(collection)
        value: Any = None if keys is None else keys.get(key)
        if value is None:
            settled = self._settled.get(collection)
            seq = None if settled is None else settled.get(key)
            return None if seq is None else self.table.get(seq)
        if type(value) is int:
            return self.table.get(value)
        if isinstance(value, Meta):
            return value
        assert keys is not None
        seq, agent, source, wall, *rest = value  # as an older snapshot stored it
        meta = Meta(agent, source, wall, seq, rest[0] if rest else "")
        if type(seq) is int:
            self._remember(seq, agent, source, wall, meta.run)
            keys[key] = seq
        return meta

    def agent_of(self, collection: str, key: str) -> str | None:
        """``meta(collection, key).agent`` without building the ``Meta`` (the owner policy's
        lookup on every overwrite)."""
        keys = self.index.get(collection)
        value: Any = None if keys is None else keys.get(key)
        if value is None:
            settled = self._settled.get(collection)
            value = None if settled is None else settled.get(key)
            if value is None:
                return None
        if type(value) is int:
            return self.table.agent(value)
        if type(value) is Meta:
            agent: str = value[0]
            return agent
        meta = self.meta(collection, key)  # an older snapshot's list: converted once
        return None if meta is None else meta.agent

    def export_state(self) -> dict[str, Any]:
        """crdtstore's bookkeeping to store beside a snapshot's update.

        ``settled`` holds, per collection, the journaled keys sorted and their journal
        positions packed (see :func:`_pack`); ``index`` the other keys (an entry not yet
        journaled, or adopted from an older snapshot) as ``[seq, agent, source, wall, run]``;
        ``table`` the provenance of the positions (see :class:`_EntryTable`). Older
        snapshots, with every key in ``index``, are read as well.
        """
        self._settle(every=True)
        self.table.keep(self._live_seqs())
        return {
            "index": {
                name: {
                    key: meta.as_list() if isinstance(meta, Meta) else meta
                    for key, meta in keys.items()
                }
                for name, keys in self.index.items()
                if keys
            },
            "settled": {
                name: {"keys": settled.keys, "seqs": _pack(array("q", settled.sorted_seqs()))}
                for name, settled in self._settled.items()
            },
            "table": self.table.export(),
            "head": self.head,
            "coll_seq": self.coll_seq,
        }

    def import_state(self, state: dict[str, Any]) -> None:
        self.head = max(self.head, int(state.get("head", 0)))
        for name, seq in state.get("coll_seq", {}).items():
            self.coll_seq[name] = max(self.coll_seq.get(name, 0), int(seq))
        # The index is adopted as parsed: key -> position (and the table's arrays at C
        # speed), or, from older snapshots, [seq, agent, source, wall, run] lists turned into
        # a position only when asked for (see meta()): building a tuple per key made resuming
        # a 100k-key snapshot spend half its time here.
        if "table" in state:
            self.table.load(state["table"])
        for name, run in state.get("settled", {}).items():
            skeys, sseqs = run["keys"], _unpack("q", run["seqs"])
            # str and other types do not compare: an increasing list opening with a str is
            # all str
            if len(skeys) != len(sseqs) or (skeys and type(skeys[0]) is not str):
                raise ValueError("inconsistent settled index")
            try:
                ordered = _increasing(skeys)
            except TypeError:
                raise ValueError("inconsistent settled index") from None
            if name not in self._settled and ordered:
                self._settled[name] = _Settled.of_sorted(skeys, sseqs)
            else:  # merge under what this replica knows already
                into = self.index.setdefault(name, {})
                for key, seq in zip(skeys, sseqs, strict=True):
                    if key not in into and self.meta(name, key) is None:
                        into[key] = seq
        for name, keys in state.get("index", {}).items():
            target = self.index.get(name)
            if target is None and name not in self._settled:
                self.index[name] = keys
            else:
                target = self.index.setdefault(name, {})
                for key, value in keys.items():
                    if key not in target and self.meta(name, key) is None:
                        target[key] = value
        self._settle()
