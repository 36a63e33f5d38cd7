"""Foreign updates: bytes made outside the typed API (a Yjs client's, through the hub).

:meth:`ExternalUpdates.apply_external` applies them and derives their effect (map ops read
from the update's bytes, every LWW loser included, with a key index of the document's map
entries; list and text ops from pycrdt's events), records their provenance, and registers
the roots a plain Yjs client wrote without the registry. Only the hub and
:meth:`Record.apply_update` need this; a record's own writes and journal entries never do.
"""

from __future__ import annotations

import logging
from typing import Any, Self

from pycrdt import merge_updates

from .._errors import InvalidUpdate
from .._journal import Op
from ..codec import (
    TYPE_REFS,
    CodecError,
    Decoded,
    KeyIndex,
    decode_delete_set,
    decode_state_vector,
    decode_update,
    encode_state_vector,
    root_kinds,
)
from ._document import DEFAULT_MAX_UPDATE, REGISTRY
from ._effects import (
    _EMPTY_OF,
    _collection_name,
    _list_effect,
    _map_effect,
    _plain,
    _signed,
    _text_effect,
    _within,
)
from ._item_provenance import touches_items
from ._provenance import Meta
from ._pycrdt import DirectTransaction
from ._replay import JournalReplay

log = logging.getLogger("crdtstore.replica")


class ExternalUpdates(JournalReplay):
    """Foreign updates applied to a replica with their effect (see the module docstring)."""

    fused = True  # the usual update takes _apply_maps (False: the general path, for tests)

    def __init__(self, *, max_update: int = DEFAULT_MAX_UPDATE) -> None:
        super().__init__(max_update=max_update)
        self._undetermined: set[str] = set()  # unregistered roots of no single kind
        self._roots_checked: frozenset[str] = frozenset()  # registered, reserved or invalid
        self._texts: dict[str, tuple[str, int]] = {}  # see _texts_cached
        self._texts_at = -1  # self._transactions when self._texts was last right
        # apply_external: the map entries of the document by item id (see _key_index), the
        # state vector it covers and self._transactions when it covered the whole document
        self._keys: KeyIndex | None = None
        self._keys_sv: dict[int, int] = {}
        self._keys_at = -1
        # whether the last apply_external registered roots (its delta holds a transaction of
        # this replica's own, not only what the update carried)
        self.external_registered = False

    def apply_external(
        self,
        update: bytes,
        meta: Meta | None = None,
        *,
        register: bool = False,
        checked: bool = False,
    ) -> tuple[list[Op], bytes | None]:
        """Apply update bytes made outside the typed API; return their effect and the delta the
        document integrated (None if nothing was new), recording ``meta`` as the provenance of
        every map key whose value (or deletion) they leave in the document.

        The effect, per registered collection:

        - map ``set`` ops are read from the update's bytes: every entry it carries that the
          document did not hold (an entry it held already, a duplicate delivery, says
          nothing), *including a set that lost against a concurrent one*
          (LWW): that write is history too. The set that the document shows afterwards comes
          last for its key, so replaying the effect leaves that value; a set that lost against
          a value the document held already is listed although the key keeps that value, and
          provenance (``self.index``) names only the writer of what the document shows.
          Values are as pycrdt shows them (:func:`_plain`: ints as floats). A nested shared
          type written as a value (only a foreign client writes one) is read from the document
          when it won; when it lost it is recorded as an empty value of its kind (``{}``,
          ``[]``, ``""``; None for other content whose value the bytes do not give): its
          contents are other items, which are not decoded;
        - map ``del`` ops: a key whose visible entry the update deleted (found in the
          transaction's delete set) and that it did not set again;
        - list and text inserts and deletes from pycrdt's events (observers on the list and
          text roots the update touches, for this update only), each index counted after the
          ops before it (text indices in characters, as the typed API's ops; pycrdt's deltas
          count UTF-8 bytes);
        - for a collection the update registers, its whole content (``set`` of every key, or
          one ``ins`` at 0).

        An overwrite does not carry its key in the bytes (only its origin, the entry it
        replaces), nor does a deletion: the replica keeps a :class:`crdtstore.codec.KeyIndex`
        of the map entries by item id, filled from the updates applied here and, when other
        transactions (local writes, journal entries) changed the document since, from the
        document's encoding of what they added (each item decoded once: the first call on a
        large document pays for all of it, ~5 us per item on the 2-core dev VM, 0.5 s for
        100k entries; the index takes ~24 bytes per entry plus each key once). Whether an
        entry is new (a duplicate delivery says nothing) is whether the index knew it.
        Updates this decoder cannot read take the old way (observers on every collection,
        which see only what changed the visible document, so LWW losers are missing).

        ``register``: also register the root types the document holds that the registry does
        not name (what a plain Yjs client's ``doc.getMap("notes")`` writes): their kind is
        read from the items of ``update`` (:func:`crdtstore.codec.root_kinds`), or of the
        whole document for a root the update only appends to. They are registered in a
        transaction of this replica whose update is merged into the returned delta, so the
        entry journaled with it registers them for every replica. A name registered already
        (whatever its kind), reserved (``__``), invalid, or whose items show no single kind
        is left alone.

        ``checked``: the caller passed ``update`` through :meth:`check_update` already (with
        its size limit and trial decode); only the cheap count check is made again.

        Raises:
            PayloadTooLarge, InvalidUpdate: see :meth:`check_update`; the doc is unchanged.
        """
        if not checked:
            self.check_update(update)
        # (outside any transaction, as always here: no transaction since the cache was
        # made means no change to the registry since, without asking its size)
        before = self._colls if self._colls_at[0] == self._transactions else self.collections()
        last = self.last_checked
        try:
            if last is not None and last[0] is update:
                decoded: Decoded | None = last[1]
            else:
                decoded = decode_update(update)
        except CodecError as exc:
            log.warning("cannot decode an external update, effect from events: %s", exc)
            decoded = None
        kinds_held = before.values()
        lists_or_texts = "list" in kinds_held or "text" in kinds_held
        plan = None if decoded is None else self._plan(decoded, lists_or_texts)
        if plan is None:
            observed = self._apply_observed(update, meta, before, register=register)
            if meta is not None and observed[1] is not None and touches_items(observed[0]):
                self.items.foreign(observed[1], meta)  # (what the document took in)
            return observed
        assert decoded is not None
        refs, fresh, others, registry_touched = plan
        if (
            self.fused
            and others is not None
            and not others
            and not registry_touched
            and not decoded.nested
            and (not register or (not self._undetermined and self._roots_known(refs)))
        ):
            return self._apply_maps(update, decoded, refs, fresh, before, meta)
        ops: list[Op] = []
        texts_after: dict[str, tuple[str, int] | None] = {}
        watched = [
            (name, kind)
            for name, kind in before.items()
            if kind != "map" and (others is None or name in others)
        ]
        cached = self._texts_cached() if any(k == "text" for _, k in watched) else None
        subs = self._observe(watched, ops, cached, texts_after)
        kinds = self._kinds
        self._kinds = {}  # (apply_update empties the cache; it is kept if the registry is)
        self._captured = self._captured_deletes = None
        self._capturing = self._deletes_wanted = True
        synced = self._keys_at == self._transactions
        try:
            nested = decoded is None or decoded.nested
            self.apply_update(update, trial_decode=False, size_limit=False, nested=nested)
        except BaseException:
            # the index took in entries the document refused: rebuild it from the document
            self._keys, self._keys_sv, self._keys_at = None, {}, -1
            raise
        finally:
            self._capturing = self._deletes_wanted = False
            for root, sub in subs:
                root.unobserve(sub)
        delta, self._captured = self._captured, None
        deleted, self._captured_deletes = self._captured_deletes, None
        if synced:  # what the update wrote is in the key index: it covers the document still
            self._keys_at = self._transactions
        map_ops, unregistered = self._map_ops(update, decoded, refs, fresh, deleted, before, meta)
        registry_touched = registry_touched or unregistered
        registered = self._register_roots(update, decoded, refs, others) if register else None
        self.external_registered = registered is not None
        if registered is not None:
            delta = registered if delta is None else merge_updates(delta, registered)
        changed = registry_touched or registered is not None
        self._after_external(ops, before, kinds, changed, cached, texts_after, meta)
        if meta is not None and delta is not None and touches_items(ops):
            self.items.foreign(delta, meta)  # (only what the document took in)
        if map_ops:
            ops[:0] = map_ops
        return ops, delta

    def trial_copy(self) -> Self:
        """A scratch replica holding this one's document, to try an external update on (its
        effect judged by policies) before it reaches this one; it gets a copy of the key index
        (:meth:`apply_external`), so that it does not decode the whole document again."""
        scratch = type(self)(max_update=self.max_update)
        scratch.apply_update(self.doc.get_update())
        if self._keys is not None:
            try:
                self._catch_up()
            except CodecError:
                return scratch
            scratch._keys = self._keys.copy()
            scratch._keys_sv = dict(self._keys_sv)
            scratch._keys_at = scratch._transactions
        return scratch

    def _key_index(self) -> KeyIndex:
        keys = self._keys
        if keys is None:
            keys = self._keys = KeyIndex()
        return keys

    def _catch_up(self) -> bool:
        """Add the map entries of what other transactions wrote since the key index covered
        the whole document (the document's encoding of it, decoded once); False if it covers
        it already.

        Raises:
            CodecError: the document holds content this decoder cannot read.
        """
        if self._keys_at == self._transactions:
            return False
        diff = self.doc.get_update(encode_state_vector(self._keys_sv))
        self._key_index().index(decode_update(diff))
        self._keys_sv = decode_state_vector(self.doc.get_state())
        self._keys_at = self._transactions
        return True

    def _roots_known(self, refs: list[Any]) -> bool:
        """Whether every root the entries ``refs`` write to is checked (registered, reserved
        or invalid: with no root undetermined, :meth:`_register_roots` would register none)."""
        checked = self._roots_checked
        for ref in refs:  # noqa: SIM110 (a loop: any() of a generator costs more on this path)
            if ref is None or ref[0] not in checked:
                return False
        return True

    def _apply_maps(
        self,
        update: bytes,
        decoded: Decoded,
        refs: list[Any],
        fresh: list[bool],
        before: dict[str, str],
        meta: Meta | None,
    ) -> tuple[list[Op], bytes | None]:
        """:meth:`apply_external` of an update that writes and deletes only map entries, none
        of the registry nor of a root to register (a map set): the general path without what
        it cannot need (effect observers, text caches, root registration, item provenance)."""
        kinds = self._kinds
        self._kinds = {}  # (apply_update empties the cache; it is kept if the registry is)
        self._captured = self._captured_deletes = None
        self._capturing = self._deletes_wanted = True
        direct = self._direct or DirectTransaction(self.doc)
        self._direct = direct
        try:
            if not direct.apply(update):  # (pycrdt's apply_update without its Python frames)
                self.apply_update(update, trial_decode=False, size_limit=False, nested=False)
        except BaseException as exc:
            # the index took in entries the document refused: rebuild it from the document
            self._keys, self._keys_sv, self._keys_at = None, {}, -1
            if isinstance(exc, (KeyboardInterrupt, SystemExit, InvalidUpdate)):
                raise
            raise InvalidUpdate(f"{type(exc).__name__}: {exc}") from None
        finally:
            self._capturing = self._deletes_wanted = False
        delta, self._captured = self._captured, None
        deleted, self._captured_deletes = self._captured_deletes, None
        self._keys_at = self._transactions  # (_plan synced it: what the update wrote is in)
        ops, unregistered = self._map_ops(update, decoded, refs, fresh, deleted, before, meta)
        self.external_registered = False
        if unregistered:  # it deleted a registry entry: the collections are read again
            self._after_external(ops, before, kinds, True, None, {}, meta)
        else:
            kinds.update(self._kinds)
            self._kinds = kinds
            self._colls, self._colls_at = before, (self._transactions, self._colls_at[1])
        return ops, delta

    def _plan(
        self, decoded: Decoded, lists_or_texts: bool
    ) -> tuple[list[Any], list[bool], set[str] | None, bool] | None:
        """Before applying ``decoded``: index its map entries; return the ``(parent, key)`` of
        each (None: its origin is not in the document), whether each is new to the document,
        the list and text roots the update may touch (None: any; only looked for when
        ``lists_or_texts`` are registered) and whether its entries write to the registry.
        None when the document holds what this decoder cannot read."""
        keys = self._key_index()
        if self._keys_at != self._transactions:
            try:
                self._catch_up()
            except CodecError as exc:
                log.warning("cannot decode the map entries held (effect from events): %s", exc)
                return None
        refs, fresh = keys.index(decoded)
        others = decoded.others
        registry_touched = False
        for ref in refs:
            if ref is None or ref[0] == REGISTRY:
                registry_touched = True
                break
        if others is not None and lists_or_texts:
            for client, clock, length in decoded.deletes:
                if not keys.covers(client, clock, length):
                    # not (only) map entries: list or text content, or not in the document
                    others = None
                    break
        # (a deletion of a registry entry is found in the transaction's delete set, which
        # holds only what the update deleted: its own delete set may hold a whole history)
        return refs, fresh, others, registry_touched

    def _map_ops(
        self,
        update: bytes,
        decoded: Decoded,
        refs: list[Any],
        fresh: list[bool],
        deleted: bytes | None,
        before: dict[str, str],
        meta: Meta | None,
    ) -> tuple[list[Op], bool]:
        """The map ops of an applied update (see :meth:`apply_external`): sets that lost, then
        sets that won, then deletes; ``meta`` becomes the provenance of the won and deleted
        keys. ``deleted``: the transaction's delete set. Also whether it deleted a registry
        entry."""
        gone: list[tuple[int, int, int]] = []
        if deleted is not None:
            if decoded.deletes and update.endswith(deleted):
                gone = decoded.deletes  # (the usual case: it deleted what the update says)
            else:
                try:
                    gone = decode_delete_set(deleted)
                except CodecError:  # pragma: no cover - pycrdt's own encoding
                    log.warning("cannot read a transaction's delete set")
        lost: list[Op] = []
        won: list[Op] = []
        won_keys: set[tuple[str, str]] = set()
        new_ids: list[tuple[int, int, int]] = []
        for item, ref, new in zip(decoded.entries, refs, fresh, strict=True):
            if not new:  # (also every entry whose origin is unknown: ref None)
                continue
            client, clock = item.client, item.clock
            new_ids.append((client, clock, clock + item.length))
            name, key = ref
            if item.content == 1 or before.get(name) != "map":  # (1: deleted content)
                continue
            alive = True
            for c, a, n in gone:
                if c == client and a <= clock < a + n:
                    alive = False
                    break
            if item.content == 8:
                value = _plain(item.value)
            elif alive:
                value = _plain(self.root(name, "map").get(key))
            elif item.content == 7:
                empty = _EMPTY_OF.get(TYPE_REFS.get(item.value, ""))
                value = None if empty is None else empty()
            else:  # string content, or content the bytes do not give as a value
                value = _plain(item.value)
            if alive:
                won.append(["map", name, "set", key, value])
                won_keys.add(ref)
            else:
                lost.append(["map", name, "set", key, value])
        dels: list[Op] = []
        unregistered = False
        if gone:
            keys = self._key_index()
            for client, a, n in gone:
                for start, end, ref in keys.overlapping(client, a, n):
                    if ref[0] == REGISTRY:
                        unregistered = True
                    # an entry of the document before the update (so its visible one, as it
                    # was not deleted), not one of the update's own sets that lost
                    if (
                        ref not in won_keys
                        and before.get(ref[0]) == "map"
                        and not _within(client, max(start, a), min(end, a + n), new_ids)
                    ):
                        won_keys.add(ref)  # (once)
                        dels.append(["map", ref[0], "del", ref[1]])
        if meta is not None:
            index = self.index
            for op in won:
                keys_of = index.get(op[1])
                if keys_of is None:
                    keys_of = index[op[1]] = {}
                keys_of[op[3]] = meta
            for op in dels:
                index.setdefault(op[1], {})[op[3]] = meta
        if lost:
            return lost + won + dels, unregistered
        return (won + dels if dels else won), unregistered

    def _observe(
        self,
        watched: list[tuple[str, str]],
        ops: list[Op],
        cached: dict[str, tuple[str, int]] | None,
        texts_after: dict[str, tuple[str, int] | None],
    ) -> list[tuple[Any, Any]]:
        """Subscribe the effect observers of the ``(name, kind)`` collections for one update."""
        subs = []
        roots = self._roots
        for name, kind in watched:
            root = roots.get((name, kind))
            if root is None:
                root = self.root(name, kind)  # (the registry gives it this kind: no mismatch)
            if kind == "map":
                observer = _map_effect(name, ops)
            elif kind == "list":
                observer = _list_effect(name, ops)
            else:
                assert cached is not None
                old = cached.get(name)
                size = len(root)  # (UTF-8 bytes)
                if old is None or old[1] != size:
                    old = cached[name] = (str(root), size)
                observer = _text_effect(name, ops, old, texts_after)
            subs.append((root, root.observe(observer)))
        return subs

    def _after_external(
        self,
        ops: list[Op],
        before: dict[str, str],
        kinds: dict[str, str],
        registry_changed: bool,
        cached: dict[str, tuple[str, int]] | None,
        texts_after: dict[str, tuple[str, int] | None],
        meta: Meta | None,
    ) -> None:
        """After an external update: restore or refresh the collection caches, take in the
        texts' new values, and add the whole content of the collections it registered to
        ``ops`` (recording ``meta`` as the provenance of their keys)."""
        if registry_changed:
            now = self.collections()
        else:  # the registry is as it was: so are the collections and their kinds
            now = before
            kinds.update(self._kinds)
            self._kinds = kinds
            self._colls, self._colls_at = before, (self._transactions, self._colls_at[1])
        if cached is not None:
            for name, after in texts_after.items():
                if after is None:
                    cached.pop(name, None)
                else:
                    cached[name] = after
            self._texts_at = self._transactions
        for name, kind in now.items():
            if name in before:
                continue
            root = self.root(name, kind)
            if kind == "map":
                added = [["map", name, "set", k, _plain(v)] for k, v in root.items()]
                ops.extend(added)
                if meta is not None:
                    keys = self.index.setdefault(name, {})
                    for op in added:
                        keys[op[3]] = meta
            elif kind == "list":
                values = [_plain(v) for v in root]
                if values:
                    ops.append(["list", name, "ins", 0, values])
            else:
                text = str(root)
                if text:
                    ops.append(["text", name, "ins", 0, text])

    def _apply_observed(
        self, update: bytes, meta: Meta | None, before: dict[str, str], *, register: bool
    ) -> tuple[list[Op], bytes | None]:
        """:meth:`apply_external` with every effect from pycrdt's events (observers on every
        collection and the registry): for updates the decoder cannot read. A map set that lost
        LWW makes no event, so it is missing from this effect."""
        ops: list[Op] = []
        texts_after: dict[str, tuple[str, int] | None] = {}
        cached = self._texts_cached() if "text" in before.values() else None
        registry_events: list[Any] = []

        def on_registry(event: Any) -> None:
            registry_events.append(event)

        subs = [(self.registry, self.registry.observe(_signed(on_registry)))]
        subs += self._observe(list(before.items()), ops, cached, texts_after)
        self._captured = None
        self._capturing = True
        kinds = self._kinds
        self._kinds = {}
        try:
            self.apply_update(update, trial_decode=False, size_limit=False, nested=True)
        finally:
            self._capturing = False
            for root, sub in subs:
                root.unobserve(sub)
        delta, self._captured = self._captured, None
        self._keys_at = -1  # not decoded: the key index no longer covers the document
        registered = self._register_roots(update) if register else None
        self.external_registered = registered is not None
        if registered is not None:
            delta = registered if delta is None else merge_updates(delta, registered)
        if meta is not None:
            for op in ops:
                if op[0] == "map":
                    self.index.setdefault(op[1], {})[op[3]] = meta
        changed = bool(registry_events) or registered is not None
        self._after_external(ops, before, kinds, changed, cached, texts_after, meta)
        return ops, delta

    def _texts_cached(self) -> dict[str, tuple[str, int]]:
        """The text collections (text, UTF-8 length) as of the last :meth:`apply_external`,
        kept so that deriving a text effect does not read a long text whole on every update
        (``str`` of a 1 MB text typed in 20,000 pieces takes 5.6 ms). Valid while no other
        transaction changed the document since (and, per text, checked again against its
        UTF-8 length); emptied otherwise."""
        if self._transactions != self._texts_at:
            self._texts.clear()
        return self._texts

    def _register_roots(
        self,
        update: bytes,
        decoded: Decoded | None = None,
        refs: list[Any] | None = None,
        others: set[str] | None = None,
    ) -> bytes | None:
        """Register the unregistered root types of the document whose kind the items show (see
        :meth:`apply_external`); return the update of that transaction (None: none).

        With the update's ``decoded`` entries, their ``refs`` and the ``others`` roots it
        names (see :meth:`_plan`): when every root it writes to is known to be checked, the
        document's roots are not listed at all (the usual case)."""
        if decoded is not None and refs is not None and others is not None:
            checked = self._roots_checked
            if (
                not self._undetermined
                and others <= checked
                and all(ref is not None and ref[0] in checked for ref in refs)
            ):
                return None
        names = set(self.doc.keys())
        if names <= self._roots_checked and not self._undetermined:
            return None  # the usual case: no root the registry does not name
        registry = self.registry
        unknown = [n for n in names if n != REGISTRY and n not in registry]
        unknown = [n for n in unknown if _collection_name(n)]
        if not unknown:
            self._roots_checked = frozenset(names)
            return None
        try:
            found = root_kinds(update)
            fresh = [n for n in unknown if n not in self._undetermined]
            if any(len(found.get(n, ())) != 1 for n in fresh):
                # a root the update only appends to: its first items are in the document
                whole = root_kinds(self.doc.get_update())
                found = {n: found.get(n) or whole.get(n, set()) for n in unknown}
        except CodecError as exc:
            log.warning("cannot read the roots of an external update: %s", exc)
            return None
        kinds: dict[str, str] = {}
        for name in unknown:
            shown = found.get(name, set())
            if len(shown) == 1:
                kinds[name] = next(iter(shown))
                self._undetermined.discard(name)
            else:
                # empty, only deleted items, or several kinds: left alone, and the whole
                # document is not decoded for it again (only the updates that come)
                if len(shown) > 1:
                    log.warning("root %r holds items of kinds %s: not registered", name, shown)
                self._undetermined.add(name)
        self._roots_checked = frozenset(n for n in names if n not in self._undetermined)
        if not kinds:
            return None
        self._captured = None
        self._capturing = True
        try:
            with self.doc.transaction():
                for name, kind in sorted(kinds.items()):
                    self._register(name, kind)
        finally:
            self._capturing = False
        registered, self._captured = self._captured, None
        return registered
