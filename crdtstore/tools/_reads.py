"""The read tools of a :class:`~crdtstore.tools.Toolset` (``store_get``, ``store_changes``,
``store_history``, ``store_describe``) and the scope every tool is held to.

Reads take in what other writers journaled first (``rec.sync()``), so a version an agent
echoes back is one it has seen; pages and chunks are cut to the toolset's token budget and
say so with a ``next_cursor``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .._errors import PolicyViolation
from .._models import Change, Conflict, Provenance
from .._names import check_name
from . import _args as A
from ._results import (
    Page,
    ToolFailure,
    decode_cursor,
    dumps,
    encode_cursor,
    jsonable,
    provenance,
    tokens_of,
)

if TYPE_CHECKING:
    from .._leases import Lease
    from .._store import Store
    from ..record import Claim, Record, View


class Reads:
    """The read tools, and the scope checks the write tools share (a base of ``Toolset``)."""

    record: Record
    view: View | None
    source: str
    read_only: bool
    max_result_tokens: int
    page_size: int
    _leases: dict[str, Lease]
    _claims: dict[tuple[str, str], Claim]

    # -- scope ----------------------------------------------------------------------------------

    @property
    def _store(self) -> Store:
        return self.record.store  # the store the record is open on (for leases)

    def _kind(self, collection: str) -> str | None:
        check_name("collection", collection)
        spec = self.record.spec(collection)
        if spec is not None:
            return spec.kind
        return self.record.collections().get(collection)

    def _see(self, collection: str, key: str | None = None) -> None:
        """Refuse what the view does not cover (``key`` None: the whole collection)."""
        view = self.view
        if view is None:
            return
        ok = view.covers(collection) if key is None else view.allows(collection, key)
        if not ok:
            raise PolicyViolation("scope", self.record.agent, collection, key, "outside this view")

    def _see_all(self, collection: str) -> None:
        if self.view is not None and not self.view.allows(collection):
            raise PolicyViolation("scope", self.record.agent, collection, None, "outside this view")

    def _keys_visible(self, collection: str) -> Any:
        view = self.view
        if view is None or view.allows(collection):
            return None
        return lambda key: view.allows(collection, key)

    def _coll_version(self, collection: str) -> int:
        return self.record.current_version(collection).seq

    def _rec_version(self) -> int:
        return self.record.current_version().seq

    # -- reads ----------------------------------------------------------------------------------

    async def _store_get(self, a: A.StoreGet) -> dict[str, Any]:
        rec = self.record
        await rec.sync()
        await rec.flush()  # versions of this record's own writes are journal positions
        kind = self._kind(a.collection)  # after the sync: another agent may just have made it
        if a.key is not None:
            if kind not in (None, "map"):
                raise ToolFailure(
                    "INVALID_ARGUMENTS",
                    f"{a.collection!r} is a {kind}: omit `key` and page with `cursor`",
                )
            self._see(a.collection, a.key)
            return self._entry(a.collection, a.key, a.cursor)
        self._see(a.collection)
        if kind == "counter":
            self._see_all(a.collection)
            c = rec.counter(a.collection)
            return {
                "collection": a.collection,
                "kind": "counter",
                "value": c.value,
                "contributions": c.contributions(),
                "max_value": c.max_value,
            }
        if kind == "list":
            self._see_all(a.collection)
            return self._list_page(a.collection, a.cursor)
        if kind == "text":
            self._see_all(a.collection)
            return self._text_page(a.collection, a.cursor)
        return self._map_page(a.collection, a.cursor, exists=kind is not None)

    def _entry(self, collection: str, key: str, cursor: str | None) -> dict[str, Any]:
        m = self.record.map(collection)
        value, version = m.get_versioned(key)
        out: dict[str, Any] = {
            "collection": collection,
            "key": key,
            "exists": value is not None or key in m,
            "version": version or 0,
            "provenance": provenance(m.provenance(key)),
            "collection_version": self._coll_version(collection),
        }
        _put_value(out, value)
        if tokens_of(out) <= self.max_result_tokens and cursor is None:
            return out
        # too large for one result: the value's JSON in chunks, each with the next cursor
        text = dumps(out["value"])
        out["value"] = None  # in `value_json`, chunk by chunk
        start = 0
        if cursor is not None:
            start, at = decode_cursor(cursor, "value")
            if not isinstance(start, int) or not 0 <= start <= len(text):
                raise ToolFailure("INVALID_ARGUMENTS", "cursor out of range; omit it")
            out["changed_since_cursor"] = at != out["version"]
        room = self.max_result_tokens - tokens_of(out) - 50
        chunk = text[start : start + max(1, room * 3)]
        while len(chunk) > 1 and tokens_of(chunk) > room:  # escapes take more room: shrink
            chunk = chunk[: len(chunk) * 3 // 4]
        end = start + len(chunk)
        out.update(value_json=chunk, value_json_offset=start, value_json_total=len(text))
        out["next_cursor"] = (
            encode_cursor("value", end, out["version"]) if end < len(text) else None
        )
        return out

    def _map_page(self, collection: str, cursor: str | None, *, exists: bool) -> dict[str, Any]:
        m = self.record.map(collection)
        version = self._coll_version(collection)
        out: dict[str, Any] = {"collection": collection, "kind": "map" if exists else None}
        after: str | None = None
        if cursor is not None:
            after, at = decode_cursor(cursor, "map")
            if not isinstance(after, str):
                raise ToolFailure("INVALID_ARGUMENTS", "malformed cursor; omit it")
            out["changed_since_cursor"] = at != version
        visible = self._keys_visible(collection)
        keys = sorted(k for k in m if visible is None or visible(k))
        page = Page(self.max_result_tokens, 60, self.page_size)
        rest = [k for k in keys if after is None or k > after]
        for key in rest:
            # the cursor holds the page's last key: room for it is kept (keys are up to 1 KB)
            page.reserve = tokens_of(encode_cursor("map", key, version))
            value, kv = m.get_versioned(key)
            item: dict[str, Any] = {"key": key, "version": kv or 0}
            _put_value(item, value)
            prov = m.provenance(key)
            if prov is not None:
                item["agent"], item["source"] = prov.agent, prov.source
            if tokens_of(item) > self.max_result_tokens // 2:
                item.pop("value", None)
                item.pop("siblings", None)
                item["value_omitted"] = "too large for a page: read it with store_get(key=...)"
            if not page.add(item):
                break
        more = len(page.items) < len(rest)
        out.update(
            version=version,
            total=len(keys),
            entries=page.items,
            next_cursor=encode_cursor("map", page.items[-1]["key"], version) if more else None,
        )
        return out

    def _list_page(self, collection: str, cursor: str | None) -> dict[str, Any]:
        lst = self.record.list(collection)
        items = lst.to_list()
        version = self._coll_version(collection)
        out: dict[str, Any] = {"collection": collection, "kind": "list"}
        start = 0
        if cursor is not None:
            start, at = decode_cursor(cursor, "list")
            if not isinstance(start, int) or start < 0:
                raise ToolFailure("INVALID_ARGUMENTS", "malformed cursor; omit it")
            out["changed_since_cursor"] = at != version
        page = Page(self.max_result_tokens, 60, self.page_size)
        for i in range(start, len(items)):
            item: dict[str, Any] = {"index": i, "value": jsonable(items[i])}
            if tokens_of(item) > self.max_result_tokens // 2:
                item = {"index": i, "value_omitted": "too large for a page"}
            item["provenance"] = _positioned(lst.provenance(i))  # who added it
            if not page.add(item):
                break
        end = start + len(page.items)
        out.update(
            version=version,
            total=len(items),
            items=page.items,
            next_cursor=encode_cursor("list", end, version) if end < len(items) else None,
        )
        return out

    def _text_page(self, collection: str, cursor: str | None) -> dict[str, Any]:
        handle = self.record.text(collection)
        text = handle.read()
        version = self._coll_version(collection)
        out: dict[str, Any] = {"collection": collection, "kind": "text"}
        start = 0
        if cursor is not None:
            start, at = decode_cursor(cursor, "text")
            if not isinstance(start, int) or not 0 <= start <= len(text):
                raise ToolFailure("INVALID_ARGUMENTS", "cursor out of range; omit it")
            out["changed_since_cursor"] = at != version
        size = max(1, (self.max_result_tokens - 60) * 3)  # characters: ~4 bytes a token
        chunk = text[start : start + size]
        while chunk and tokens_of(chunk) > self.max_result_tokens - 60:
            chunk = chunk[: len(chunk) * 3 // 4]
        end = start + len(chunk)
        # who wrote each part of the chunk: spans of one journal entry, clipped to it
        spans = [
            {"start": span.start, "end": span.end, "provenance": _positioned(span.provenance)}
            for span in handle.authorship(start, end)
        ]
        out.update(
            version=version,
            length=len(text),
            offset=start,
            text=chunk,
            authorship=spans,
            next_cursor=encode_cursor("text", end, version) if end < len(text) else None,
        )
        return out

    async def _store_changes(self, a: A.StoreChanges) -> dict[str, Any]:
        rec = self.record
        await rec.sync()
        changes = await rec.changes_since(a.since_version)
        out: list[dict[str, Any]] = []
        budget = self.max_result_tokens - 80
        used = 0
        last_complete = a.since_version
        more = False
        for seq, group in _by_seq(changes):
            # one entry's lines stay together; the first is cut to fit (more_keys, more_ops)
            room = budget if not out else budget - used
            lines = [c for c in (self._change(ch, room // max(1, len(group))) for ch in group) if c]
            cost = sum(tokens_of(line) for line in lines)
            if out and used + cost > budget:
                more = True
                break
            out.extend(lines)
            used += cost
            last_complete = seq
        return {
            "since_version": a.since_version,
            "version": self._rec_version(),
            "changes": out,
            "more": more,
            "next_since": last_complete if more else None,
        }

    def _change(self, ch: Change, room: int) -> dict[str, Any] | None:
        """One line of ``store_changes``: at most ``room`` tokens, what does not fit counted
        in ``more_keys`` / ``more_ops``."""
        view = self.view
        keys = list(ch.keys)
        if view is not None:
            if not view.covers(ch.collection):
                return None
            if ch.kind == "map":
                keys = [k for k in keys if view.allows(ch.collection, k)]
                if not keys:
                    return None
            elif not view.allows(ch.collection):
                return None
        line: dict[str, Any] = {
            "version": ch.seq,
            "collection": ch.collection,
            "kind": ch.kind,
            "agent": ch.agent,
            "source": ch.source,
        }
        field, more, items = (
            ("keys", "more_keys", keys) if ch.kind == "map"
            else ("ops", "more_ops", [_op_summary(op) for op in ch.ops])
        )  # fmt: skip
        used = tokens_of(line) + 10
        shown: list[Any] = []
        for item in items[:50]:
            used += tokens_of(item)
            if shown and used > room:
                break
            shown.append(item)
        line[field] = shown
        if len(shown) < len(items):
            line[more] = len(items) - len(shown)
        return line

    async def _store_history(self, a: A.StoreHistory) -> dict[str, Any]:
        self._see(a.collection, a.key)
        if self._kind(a.collection) not in (None, "map"):
            raise ToolFailure("INVALID_ARGUMENTS", f"{a.collection!r} is not a map")
        await self.record.flush()
        entries = await self.record.history(a.collection, a.key)
        start = 0
        if a.cursor is not None:
            start, _ = decode_cursor(a.cursor, "history")
            if not isinstance(start, int) or not 0 <= start <= len(entries):
                raise ToolFailure("INVALID_ARGUMENTS", "cursor out of range; omit it")
        page = Page(self.max_result_tokens, 60, self.page_size)
        for h in entries[start:]:
            item: dict[str, Any] = {"version": h.provenance.seq}
            item.update(provenance(h.provenance) or {})
            if h.redacted:
                item["redacted"] = True
            elif h.deleted:
                item["deleted"] = True
            else:
                item["value"] = jsonable(h.value)
            if tokens_of(item) > self.max_result_tokens // 2:
                item.pop("value", None)
                item["value_omitted"] = "too large for a page"
            if not page.add(item):
                break
        end = start + len(page.items)
        return {
            "collection": a.collection,
            "key": a.key,
            "total": len(entries),
            "entries": page.items,
            "next_cursor": encode_cursor("history", end, 0) if end < len(entries) else None,
        }

    async def _store_describe(self, a: A.StoreDescribe) -> dict[str, Any]:
        rec = self.record
        await rec.sync()
        sizes = rec.size()
        names = set(rec.collections())
        names.update(n for n in sizes if n != "*")
        declared = {n: rec.spec(n) for n in names}
        collections: dict[str, Any] = {}
        for name in sorted(names):
            if self.view is not None and not self.view.covers(name):
                continue
            spec = declared.get(name)
            kind = spec.kind if spec is not None else rec.collections().get(name)
            info: dict[str, Any] = {"kind": kind, "version": self._coll_version(name)}
            if spec is not None:
                info.update(
                    policy=spec.policy,
                    conflict=spec.conflict,
                    budgets={
                        "max_entries": spec.max_entries,
                        "max_bytes": spec.max_bytes,
                        "max_value_bytes": spec.max_value_bytes,
                    },
                    model=spec.model.model_json_schema() if spec.model is not None else None,
                )
            else:
                info.update(policy="open", conflict="lww", budgets=None, model=None)
            info["size"] = sizes.get(name, {"entries": 0, "bytes": 0, "tokens": 0})
            collections[name] = info
        return {
            "run": rec.run,
            "agent": rec.agent,
            "source": self.source,
            "read_only": self.read_only,
            "view": self.view.patterns if self.view is not None else None,
            "version": self._rec_version(),
            "collections": collections,
            "size": sizes.get("*"),
            "claims": [f"{c}/{i}" for c, i in self._claims],
            "leases": [
                {"lease_id": lid, "resources": list(lease.resources)}
                for lid, lease in self._leases.items()
            ],
            "max_result_tokens": self.max_result_tokens,
        }


def _put_value(out: dict[str, Any], value: Any) -> None:
    """``value`` into a result: a keep_all conflict as its siblings, each with who wrote it."""
    if isinstance(value, Conflict):
        out["value"] = None
        out["conflict"] = True
        out["siblings"] = [
            {"value": jsonable(s.value), "agent": s.agent, "source": s.source,
             "wall_time": s.wall_time}
            for s in value.siblings
        ]  # fmt: skip
    else:
        out["value"] = jsonable(value)


def _by_seq(changes: list[Change]) -> Iterable[tuple[int, list[Change]]]:
    group: list[Change] = []
    seq: int | None = None
    for ch in changes:
        if group and ch.seq != seq:
            yield seq or 0, group
            group = []
        seq = ch.seq
        group.append(ch)
    if group:
        yield seq or 0, group


def _positioned(p: Provenance | None) -> dict[str, Any] | None:
    """:func:`provenance` with the journal position of the entry (``seq``; None while it is
    not journaled): a list item's or a text span's, which no version names."""
    out = provenance(p)
    if out is not None and p is not None:
        out["seq"] = p.seq
    return out


def _op_summary(op: tuple[Any, ...]) -> list[Any]:
    """A list or text op without its payload: ``["ins", index, count]``, ``["del", ...]``."""
    _, _, verb, index, arg = op[:5]
    if verb == "ins":
        return ["ins", index, len(arg)]
    return [verb, index, arg]
