"""One replica of a run's record: a pycrdt Doc plus crdtstore's bookkeeping. No I/O.

The replica is the pure core that the record (live, with a journal behind it), compaction,
replay and the simulator all drive. It knows how to

- make a local transaction and capture its update delta (exactly one per transaction);
- apply a journal entry from elsewhere, checking its checksum and refusing bad bytes;
- keep the provenance of the current value of every map key;
- list the collections (a registry kept *in the document*, so every replica and every Yjs
  client agrees on which root is a map, a list or a text).
"""

from __future__ import annotations

import difflib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from pycrdt import Array, Doc, Map, Text, merge_updates

from ._errors import CollectionKindMismatch, InvalidUpdate, JournalCorrupt, PayloadTooLarge
from ._journal import NewEntry, Op, Row, checksum
from ._values import from_stored

log = logging.getLogger("crdtstore.replica")
_ABSENT: Any = object()

REGISTRY = "__crdtstore_collections"
KINDS: dict[str, type[Any]] = {"map": Map, "list": Array, "text": Text}
DEFAULT_MAX_UPDATE = 16 * 1024 * 1024
_EMPTY_UPDATES = (b"\x00\x00",)


class Meta(NamedTuple):
    """Provenance of one journal entry (shared by every key it wrote).

    A tuple of atomic values, so that the garbage collector stops tracking it: a record holds
    one per written key, and tracked objects by the hundred thousand make every full
    collection slow. ``seq`` is None until the entry is journaled; the record then replaces
    the index entries with a copy carrying the position.
    """

    agent: str
    source: str
    wall_time: float
    seq: int | None
    run: str = ""  # the nested run that wrote it; "" for the journal's own run

    def as_list(self) -> list[Any]:
        return [self.seq, self.agent, self.source, self.wall_time, self.run]


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


_CHAR_DIFF_LIMIT = 4096  # characters: above this a changed block is replaced whole


def _common_prefix(a: str, b: str) -> int:
    # binary search over slice equality: the comparisons run at C speed
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid :] == b[len(b) - mid :]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def text_diff(old: str, new: str) -> list[tuple[str, int, Any]]:
    """The character edits turning ``old`` into ``new``, last first (so indices stay valid).

    A real diff, not a whole rewrite: an agent that rewrites a text with two distant changes
    produces two small edits, and a concurrent edit between them survives. To stay fast on
    long texts it trims the common prefix and suffix, matches lines, and compares characters
    only inside changed blocks of lines (a block longer than a few thousand characters is
    replaced whole).
    """
    if old == new:
        return []
    p = _common_prefix(old, new)
    q = _common_suffix(old, new, min(len(old), len(new)) - p)
    a, b = old[p : len(old) - q], new[p : len(new) - q]
    groups: list[list[tuple[str, int, Any]]] = []  # in text order, old coordinates

    def replace(at: int, old_part: str, new_part: str) -> None:
        group: list[tuple[str, int, Any]] = []
        if old_part:
            group.append(("del", at, len(old_part)))
        if new_part:
            group.append(("ins", at, new_part))
        groups.append(group)

    def chars(at: int, old_part: str, new_part: str) -> None:
        if len(old_part) > _CHAR_DIFF_LIMIT and len(new_part) > _CHAR_DIFF_LIMIT:
            replace(at, old_part, new_part)
            return
        matcher = difflib.SequenceMatcher(None, old_part, new_part, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag != "equal":
                replace(at + i1, old_part[i1:i2], new_part[j1:j2])

    if not a or not b:
        replace(p, a, b)
    else:
        la, lb = a.splitlines(keepends=True), b.splitlines(keepends=True)
        offsets = [0]
        for line in la:
            offsets.append(offsets[-1] + len(line))
        lines = difflib.SequenceMatcher(None, la, lb, autojunk=False)
        for tag, i1, i2, j1, j2 in lines.get_opcodes():
            if tag != "equal":
                chars(p + offsets[i1], "".join(la[i1:i2]), "".join(lb[j1:j2]))
    return [op for group in reversed(groups) for op in group]


def apply_text_edits(text: Any, old: str, edits: list[tuple[str, int, Any]]) -> None:
    """Apply :func:`text_diff` edits (character positions into ``old``, last first) to a
    pycrdt ``Text`` holding ``old``. pycrdt's Text counts UTF-8 bytes: since the edits come
    last first, the text before each edit point is still the old one, and its UTF-8 length
    is the byte offset."""
    for kind, at, arg in edits:
        start = len(old[:at].encode())
        if kind == "del":
            del text[start : start + len(old[at : at + arg].encode())]
        else:
            text.insert(start, arg)


def _varuint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise InvalidUpdate("truncated variable-length integer")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _check_counts(update: bytes) -> None:
    """Refuse an update whose leading counts cannot fit in its bytes, before pycrdt's
    decoder pre-allocates for them (4 bytes claiming 2**28 clients made it allocate about
    500 MiB). A v1 update starts with the number of clients, then per client the number of
    structs: each client and each struct takes at least one byte."""
    clients, pos = _varuint(update, 0)
    if clients > len(update) - pos:
        raise InvalidUpdate(f"claims {clients} clients in {len(update)} bytes")
    if clients:
        structs, pos = _varuint(update, pos)
        if structs > len(update) - pos:
            raise InvalidUpdate(f"claims {structs} structs in {len(update)} bytes")


class Replica:
    """A Doc with its collection registry, update capture and provenance index."""

    def __init__(self, *, max_update: int = DEFAULT_MAX_UPDATE) -> None:
        # A fresh random client id for every replica: a reused id makes peers drop writes
        # (PYCRDT-NOTES hazard 5). The agent identity lives in the journal, not here.
        self.doc: Doc[Any] = Doc()
        self.client_id: int = self.doc.client_id
        self.max_update = max_update
        self.registry: Map[Any] = self.doc.get(REGISTRY, type=Map)
        self._roots: dict[tuple[str, str], Any] = {}
        self._kinds: dict[str, str] = {}
        # collection -> key -> Meta (or, until first asked, the list a snapshot stored)
        self.index: dict[str, dict[str, Any]] = {}
        self.seq = 0  # journal position reached, when driven by a replay
        self.skipped: list[JournalCorrupt] = []  # corrupt journal entries not applied
        self.head = 0  # highest journal position reflected here (applied or own, journaled)
        self.coll_seq: dict[str, int] = {}  # last journal position that touched a collection
        self._captured: bytes | None = None
        self._capturing = False
        self._txn_cm: Any = None
        self.partial_update: bytes | None = None
        self.doc.observe(self._on_transaction)

    # -- collections --------------------------------------------------------------------------

    def kind_of(self, name: str) -> str | None:
        """The kind the registry gives ``name`` (None when unregistered or not a kind)."""
        kind = self._kinds.get(name)
        if kind is None:
            kind = self.registry.get(name)
            if kind not in KINDS:
                return None
            self._kinds[name] = kind
        return kind

    def root(self, name: str, kind: str) -> Any:
        """The root shared type of a collection, checking its kind against the registry.

        Raises:
            CollectionKindMismatch: the name is registered as another kind.
        """
        existing = self.kind_of(name)
        if existing is not None and existing != kind:
            raise CollectionKindMismatch(name, existing, kind)
        got = self._roots.get((name, kind))
        if got is None:
            got = self._roots[(name, kind)] = self.doc.get(name, type=KINDS[kind])
        return got

    def collections(self) -> dict[str, str]:
        """Registered collections: name -> kind, sorted by name (entries that are not a known
        kind, which only a foreign or corrupted update can write, are left out)."""
        return dict(sorted((str(k), str(v)) for k, v in self.registry.items() if v in KINDS))

    def read(self, name: str, kind: str) -> Any:
        root = self.root(name, kind)
        if kind == "map":
            return {k: from_stored(v) for k, v in root.items()}
        if kind == "list":
            return [from_stored(v) for v in root]
        return str(root)

    def to_dict(self) -> dict[str, Any]:
        return {name: self.read(name, kind) for name, kind in self.collections().items()}

    # -- local transactions -------------------------------------------------------------------

    def _on_transaction(self, event: Any) -> None:
        if self._capturing:
            self._captured = event.update

    def begin(self) -> None:
        """Open a local transaction whose update :meth:`end` returns."""
        self._captured = None
        self._capturing = True
        self._txn_cm = self.doc.transaction(origin=self.client_id)
        self._txn_cm.__enter__()

    def do(self, ops: list[Op], apply: Callable[[], None], meta: Meta) -> None:
        """Inside :meth:`begin`/:meth:`end`: run ``apply`` (which makes exactly the changes
        described by ``ops``) and record provenance.

        Collections touched for the first time are registered in the same transaction, so
        the registry never names a collection whose first write is missing, or vice versa.
        """
        for op in ops:
            if self._kinds.get(op[1]) != op[0]:
                self._register(op[1], op[0])
        apply()
        for op in ops:
            if op[0] == "map":
                self.index.setdefault(op[1], {})[op[3]] = meta

    def journaled(self, ops: list[Op], meta: Meta, seq: int) -> None:
        """A local entry got its journal position: point its keys' provenance at it."""
        done = meta._replace(seq=seq)
        index = self.index
        if seq > self.head:
            self.head = seq
        coll_seq = self.coll_seq
        for op in ops:
            coll_seq[op[1]] = seq
            if op[0] == "map":
                keys = index.get(op[1])
                if keys is not None and keys.get(op[3]) is meta:
                    keys[op[3]] = done

    def end(self) -> bytes | None:
        """Commit the local transaction; return its update (None when nothing changed).

        There is no rollback in pycrdt: whatever was applied before an error is committed
        (and must be journaled by the caller).
        """
        cm, self._txn_cm = self._txn_cm, None
        try:
            if cm is not None:
                cm.__exit__(None, None, None)
        finally:
            self._capturing = False
        update, self._captured = self._captured, None
        return update

    def local(self, ops: list[Op], apply: Callable[[], None], meta: Meta) -> bytes | None:
        """One local transaction (the hot path, equivalent to :meth:`begin`, :meth:`do`,
        :meth:`end`): return its update, None when nothing changed.

        If ``apply`` raises, what it applied is committed anyway (no rollback in pycrdt): the
        update is left in :attr:`partial_update` for the caller to journal, then the error
        propagates.
        """
        self._captured = None
        self._capturing = True
        kinds = self._kinds
        try:
            with self.doc.transaction(origin=self.client_id):
                for op in ops:
                    if kinds.get(op[1]) != op[0]:
                        self._register(op[1], op[0])
                apply()
        except BaseException:
            self.partial_update = self._captured
            raise
        finally:
            self._capturing = False
        index = self.index
        for op in ops:
            if op[0] == "map":
                keys = index.get(op[1])
                if keys is None:
                    keys = index[op[1]] = {}
                keys[op[3]] = meta
        update, self._captured = self._captured, None
        return update

    def _register(self, name: str, kind: str) -> None:
        current = self.registry.get(name)
        if current in KINDS and current != kind:
            raise CollectionKindMismatch(name, current, kind)
        if current != kind:
            self.registry[name] = kind
        self._kinds[name] = kind

    def entry(
        self, agent: str, source: str, update: bytes, ops: list[Op], wall: float, origin: str = ""
    ) -> NewEntry:
        return NewEntry(agent, source, self.client_id, wall, update, ops, checksum(update), origin)

    # -- applying entries from elsewhere -------------------------------------------------------

    def check_update(
        self, update: bytes, *, trial_decode: bool = True, size_limit: bool = True
    ) -> None:
        """Reject update bytes that cannot be right before they reach the document.

        Raises:
            PayloadTooLarge: larger than ``max_update``.
            InvalidUpdate: not bytes, or not decodable as a v1 update.
        """
        if not isinstance(update, bytes):
            raise InvalidUpdate(f"expected bytes, got {type(update).__name__}")
        if size_limit and len(update) > self.max_update:
            raise PayloadTooLarge("update", len(update), self.max_update)
        _check_counts(update)
        if not trial_decode:
            return
        try:
            # decoding the state vector parses the whole structure without touching the doc
            from pycrdt import get_state

            get_state(update)
        except BaseException as exc:  # pycrdt raises ValueError, RuntimeError or a panic
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise InvalidUpdate(f"{type(exc).__name__}: {exc}") from None

    def apply_update(
        self, update: bytes, *, trial_decode: bool = True, size_limit: bool = True
    ) -> None:
        """Apply raw update bytes (no provenance).

        Raises:
            PayloadTooLarge, InvalidUpdate: see :meth:`check_update`; the doc is unchanged.
        """
        self.check_update(update, trial_decode=trial_decode, size_limit=size_limit)
        # an update from elsewhere may register a name concurrently as another kind (the
        # registry's last writer wins): forget what was cached, the registry is the truth.
        # (Observing the registry instead would change how pycrdt encodes the document.)
        self._kinds.clear()
        try:
            self.doc.apply_update(update)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise InvalidUpdate(f"{type(exc).__name__}: {exc}") from None

    def apply_external(
        self, update: bytes, meta: Meta | None = None
    ) -> tuple[list[Op], bytes | None]:
        """Apply update bytes made outside the typed API; return the effect they had on map
        collections (sets with their values, deletes) and the delta the document integrated
        (None if nothing was new), recording ``meta`` as the provenance of every key they
        changed.

        Raises:
            PayloadTooLarge, InvalidUpdate: see :meth:`check_update`; the doc is unchanged.
        """
        before = {n for n, k in self.collections().items() if k == "map"}
        changes: list[tuple[str, str, Any]] = []
        subs = []
        for name in before:
            root = self.root(name, "map")
            subs.append((root, root.observe(self._effect_observer(name, changes))))
        # no enclosing transaction: map events fire when apply_update's own one commits
        self._captured = None
        self._capturing = True
        try:
            self.apply_update(update)
        finally:
            self._capturing = False
            for root, sub in subs:
                root.unobserve(sub)
        delta, self._captured = self._captured, None
        ops: list[Op] = []
        for name, key, change in changes:
            if change.get("action") == "delete":
                ops.append(["map", name, "del", key])
            else:
                ops.append(["map", name, "set", key, change.get("newValue")])
        for name, kind in self.collections().items():
            if kind == "map" and name not in before:
                ops.extend(["map", name, "set", k, v] for k, v in self.root(name, "map").items())
        if meta is not None:
            for op in ops:
                self.index.setdefault(op[1], {})[op[3]] = meta
        return ops, delta

    @staticmethod
    def _effect_observer(name: str, changes: list[tuple[str, str, Any]]) -> Callable[[Any], None]:
        def on_event(event: Any) -> None:
            for key, change in event.keys.items():
                changes.append((name, key, change))

        return on_event

    def apply_rows(self, rows: Iterable[Row], run: str = "") -> None:
        """Apply journal entries in the given (causal) order, keeping provenance exact.

        Provenance follows what the document did, not what the entry wanted: an entry whose
        write to a key lost to a concurrent one (LWW by client id) does not become that key's
        provenance. After the batch, each key it touched is read once and attributed to the
        last entry of the batch whose write left exactly that value (or that delete); when
        none did, a write from before the batch won and keeps its provenance. (Map observers
        would say the same, at several times the cost of the apply itself.) Two concurrent
        writes of the same value are indistinguishable; the later one is named.

        An entry that fails its checksum or does not decode (a torn or corrupted entry) is
        skipped, never applied, and recorded in :attr:`skipped` as a :class:`JournalCorrupt`;
        the entries around it are applied as usual (DESIGN I4: a torn tail is skipped and
        never corrupts earlier entries).
        """
        touched: dict[tuple[str, str], list[tuple[Op, Meta]]] = {}
        for row in rows:
            if checksum(row.update) != row.checksum:
                self._skip(JournalCorrupt(run, row.seq, "checksum mismatch"))
                continue
            try:
                # journal entries passed their checksum: skip the trial decode that
                # untrusted bytes get (pycrdt leaves the doc intact on bytes it rejects)
                self.apply_update(row.update, trial_decode=False, size_limit=False)
            except (InvalidUpdate, PayloadTooLarge) as exc:
                reason = exc.reason if isinstance(exc, InvalidUpdate) else str(exc)
                self._skip(JournalCorrupt(run, row.seq, reason))
                continue
            if row.seq > self.head:
                self.head = row.seq
            if row.effect:
                meta = Meta(row.agent, row.source, row.wall_time, row.seq, row.origin)
                for op in row.effect:
                    self.coll_seq[op[1]] = row.seq
                    if op[0] == "map":
                        touched.setdefault((op[1], op[3]), []).append((op, meta))
        for (name, key), writes in touched.items():
            try:
                root = self.root(name, "map")
            except CollectionKindMismatch:
                continue
            current = root.get(key, _ABSENT)
            value = None if current is _ABSENT else from_stored(current)
            winner = None
            for op, meta in reversed(writes):
                if current is _ABSENT:
                    if op[2] != "set":
                        winner = meta
                        break
                elif op[2] == "set" and from_stored(op[4]) == value:
                    winner = meta
                    break
            if winner is not None:  # else a write from before this batch is still current
                self.index.setdefault(name, {})[key] = winner

    def _skip(self, error: JournalCorrupt) -> None:
        log.error("%s; entry skipped", error)
        self.skipped.append(error)

    def meta(self, collection: str, key: str) -> Meta | None:
        """The provenance of the current value of ``collection[key]`` (None if unknown)."""
        keys = self.index.get(collection)
        if keys is None:
            return None
        value = keys.get(key)
        if value is None or isinstance(value, Meta):
            return value
        seq, agent, source, wall, *rest = value  # as imported from a snapshot
        meta = keys[key] = Meta(agent, source, wall, seq, rest[0] if rest else "")
        return meta

    def export_state(self) -> dict[str, Any]:
        """crdtstore's bookkeeping to store beside a snapshot's update."""
        return {
            "index": {
                name: {
                    key: meta.as_list() if isinstance(meta, Meta) else meta
                    for key, meta in keys.items()
                }
                for name, keys in self.index.items()
            },
            "head": self.head,
            "coll_seq": self.coll_seq,
        }

    def import_state(self, state: dict[str, Any]) -> None:
        self.head = max(self.head, int(state.get("head", 0)))
        for name, seq in state.get("coll_seq", {}).items():
            self.coll_seq[name] = max(self.coll_seq.get(name, 0), int(seq))
        # Adopted as parsed ([seq, agent, source, wall, run] lists), turned into Meta only
        # when asked for (see meta()): building a tuple per key made resuming a 100k-key
        # snapshot spend half its time here.
        for name, keys in state.get("index", {}).items():
            target = self.index.get(name)
            if target is None:
                self.index[name] = keys
            else:
                for key, value in keys.items():
                    target.setdefault(key, value)


def now() -> float:
    return time.time()
