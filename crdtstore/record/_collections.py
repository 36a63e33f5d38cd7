"""Typed views of a record's root collections, and what they use of the record.

A collection handle validates every write completely before the document is touched (pycrdt
has no rollback) and hands it to its record as ops, one journal entry per write, each op an
*effect* (see ``_journal``). It uses its record only through :class:`CollectionHost`, which
:class:`~._record.Record` implements. Maps are in :mod:`._maps`; lists and texts here.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel

from .._errors import InvalidValue
from .._journal import Op
from .._model_plan import ModelPlan
from .._models import Span, Version
from .._semantics import validate_value
from .._values import encodable, from_stored, to_stored
from ._item_provenance import text_authorship, to_provenance
from ._pycrdt import list_values
from ._text_ids import char_id, item_id
from ._textdiff import apply_text_edits, text_diff

if TYPE_CHECKING:
    from .._leases import Lease
    from .._models import HistoryEntry, Provenance
    from ._replica import Replica

_MISSING: Any = object()


class CollectionHost(Protocol):
    """What a collection handle uses of its record, and all it uses: :class:`~._record.Record`
    implements it. The write members are the record's write pipeline (:mod:`._pipeline`) and
    guarded writes (:mod:`._guarded`); the others are reads the record offers publicly."""

    run: str
    agent: str  # provenance of keep_all siblings
    source: str
    replica: Replica  # (its item provenance index: ListCollection.provenance, authorship)
    _jrun: str  # the run whose journal holds the record

    @property
    def _models(self) -> Mapping[str, type[BaseModel]]:
        """The run's declared models, by collection (a handle's own model comes first)."""
        ...

    @property
    def _budgeted(self) -> frozenset[str]:
        """The run's budgeted collections (a write to them is sized)."""
        ...

    def _stage(
        self,
        ops: list[Any],
        apply: Callable[[], None] | None = None,
        root: Any = None,
        size: int = -1,
    ) -> Coroutine[Any, Any, None] | None:
        """Check, apply and queue a write (``apply`` None: ``ops`` is one map set op alone,
        on ``root``, and ``size``, if not -1, its value's ``value_size``); return what to
        await, if anything (``WritePipeline._stage``)."""
        ...

    async def _write_guarded(
        self,
        name: str,
        key: str,
        expected: int | None,
        ops: list[Op],
        apply: Callable[[], None],
        current: Callable[[], Any],
        based_on: Version | None = None,
        fence: tuple[Lease, str] | None = None,
    ) -> int:
        """A guarded or fenced map write (``GuardedWrites._write_guarded``)."""
        ...

    def _stamp(self, name: str) -> int:
        """Changes seen of collection ``name``, for caches of what the document holds."""
        ...

    def _next_token(self) -> str:
        """A token no other write makes (a keep_all sibling's)."""
        ...

    def fenced_resource(self, collection: str, key: str, lease: Lease) -> str: ...

    def version(self, collection: str, key: str) -> int | None: ...

    def current_version(self, collection: str | None = None) -> Version: ...

    def provenance(self, collection: str, key: str) -> Provenance | None: ...

    async def history(self, collection: str, key: str) -> list[HistoryEntry]: ...


class _Collection:
    kind = ""

    def __init__(
        self, rec: CollectionHost, name: str, root: Any, model: type[BaseModel] | None
    ) -> None:
        self._rec = rec
        self.name = name
        self._root = root
        self._model = model
        self._cache: tuple[int, dict[str, dict[str, Any]]] | None = None
        self._plan: ModelPlan | None = None  # of the model writes use now (see MapCollection.set)

    @property
    def model(self) -> type[BaseModel] | None:
        """The pydantic model values are validated against (this handle's, else the run's)."""
        return self._model or self._rec._models.get(self.name)

    def _in(self, key: str | None, value: Any) -> Any:
        """Validate a value for writing (schema, then JSON-likeness); return what to store."""
        model = self._model or self._rec._models.get(self.name)
        if model is not None:
            value = validate_value(None, model, self.name, key, value)
        return to_stored(value)

    def _out(self, stored: Any) -> Any:
        value = from_stored(stored)
        model = self._model or self._rec._models.get(self.name)
        if model is not None:
            # what model.model_validate does, without its Python overhead
            return model.__pydantic_validator__.validate_python(value)
        return value

    async def _write(self, ops: list[Op], apply: Callable[[], None]) -> None:
        """Hand a validated write to the record's write pipeline."""
        wait = self._rec._stage(ops, apply)
        if wait is not None:
            await wait

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} of run {self._rec.run!r}>"


class ListCollection(_Collection):
    """An ordered list of JSON-like values; concurrent inserts all survive."""

    kind = "list"

    def __len__(self) -> int:
        return len(self._root)

    def __getitem__(self, index: int) -> Any:
        return self._out(self._root[index])

    def __iter__(self) -> Iterator[Any]:
        return iter(self.to_list())

    def to_list(self) -> list[Any]:
        values = list_values(self._root)  # (one read of the whole list, see there)
        model = self._model or self._rec._models.get(self.name)
        if model is None:
            return values
        validate = model.__pydantic_validator__.validate_python
        return [validate(v) for v in values]

    def provenance(self, index: int) -> Provenance | None:
        """Who added the item at ``index`` (negative counts from the end): the agent, source
        kind, wall time and journal position of the entry that wrote it, the same on every
        replica and after resume and compaction (``seq`` None while that entry is not
        journaled; None for an item applied without provenance).

        Raises:
            IndexError: ``index`` out of range. InvalidValue: not an int.
        """
        index = self._check_index(index, end=False)
        ident = item_id(self._root, index)
        if ident is None:
            return None
        return to_provenance(self._rec.replica.items.meta(*ident), self._rec._jrun)

    def provenances(self) -> list[Provenance | None]:
        """:meth:`provenance` of every item, in list order."""
        items, run, root = self._rec.replica.items, self._rec._jrun, self._root
        out: list[Provenance | None] = []
        with root.doc.transaction():
            for i in range(len(root)):
                ident = item_id(root, i)
                out.append(None if ident is None else to_provenance(items.meta(*ident), run))
        return out

    def _check_index(self, index: int, *, end: bool) -> int:
        if type(index) is not int:
            raise InvalidValue(f"list index must be an int, not {type(index).__name__}")
        n = len(self._root)
        if index < 0:
            index += n
        if not 0 <= index <= (n if end else n - 1):
            raise IndexError(f"list index {index} out of range for length {n}")
        return index

    async def append(self, value: Any) -> None:
        """Append ``value``. Raises ``InvalidValue`` for a value that is not JSON-like."""
        await self.extend([value])

    async def extend(self, values: Iterable[Any]) -> None:
        """Append several values in one transaction."""
        stored = [self._in(None, v) for v in values]
        if not stored:
            return
        root = self._root
        at = len(root)

        def apply() -> None:
            root.extend(stored)

        await self._write([["list", self.name, "ins", at, stored]], apply)

    async def insert(self, index: int, value: Any) -> None:
        """Insert ``value`` before ``index`` (negative counts from the end).

        Raises:
            IndexError: ``index`` out of range. InvalidValue: not JSON-like.
        """
        index = self._check_index(index, end=True)
        stored = self._in(None, value)
        root = self._root

        def apply() -> None:
            root.insert(index, stored)

        await self._write([["list", self.name, "ins", index, [stored]]], apply)

    async def delete(self, index: int, count: int = 1) -> None:
        """Delete ``count`` items from ``index``.

        Raises:
            IndexError: the range is not inside the list.
        """
        index = self._check_index(index, end=False)
        if type(count) is not int or count < 1 or index + count > len(self._root):
            raise IndexError(f"cannot delete {count!r} items at {index} of {len(self._root)}")
        root = self._root

        def apply() -> None:
            del root[index : index + count]

        await self._write([["list", self.name, "del", index, count]], apply)


class TextCollection(_Collection):
    """Collaborative free text, changed by character edits, never by whole rewrites."""

    kind = "text"

    def __str__(self) -> str:
        return str(self._root)

    def read(self) -> str:
        return str(self._root)

    def __len__(self) -> int:
        return len(str(self._root))

    def authorship(self, start: int = 0, end: int | None = None) -> list[Span]:
        """Who wrote every part of the text: the maximal spans written by one journal entry
        each, in text order, covering characters ``start`` to ``end`` (default: the whole
        text; clipped to it), see :class:`~crdtstore.Span`; the same on every replica and
        after resume and compaction. Costs a pycrdt sticky index per character (a walk of
        the text each), not a read of the journal.

        Raises:
            InvalidValue: ``start`` or ``end`` is not an int.
        """
        if type(start) is not int or (end is not None and type(end) is not int):
            raise InvalidValue("authorship start and end must be ints")
        items, run = self._rec.replica.items, self._rec._jrun
        return [
            Span(start=s, end=e, text=t, provenance=p)
            for s, e, t, p in text_authorship(self._root, items, run, start, end)
        ]

    def provenance(self, index: int) -> Provenance | None:
        """Who wrote the character at ``index`` (negative counts from the end): the agent,
        source kind, wall time and journal position of the entry that wrote it, as
        :meth:`authorship` gives it for the span holding it, the same on every replica and
        after resume and compaction (None for a character applied without provenance).
        One pycrdt sticky index when the text is ASCII up to ``index``; else a few (a
        bisection) and a read of the writing client's structs from that block on.

        Raises:
            IndexError: ``index`` out of range. InvalidValue: not an int.
        """
        if type(index) is not int:
            raise InvalidValue(f"text index must be an int, not {type(index).__name__}")
        root = self._root
        text = str(root)
        n = len(text)
        if not -n <= index < n:
            raise IndexError(f"text index {index} out of range for length {n}")
        ident = char_id(root, text, index % n)
        if ident is None:
            return None
        return to_provenance(self._rec.replica.items.meta(*ident), self._rec._jrun)

    async def edit(self, new_text: str) -> None:
        """Make the text equal ``new_text`` by the minimal character edits.

        An agent that "rewrites" the text only changes what differs, so concurrent edits by
        others to other parts survive (the ``rewrite-drop`` failure mode).
        """
        if not isinstance(new_text, str):
            raise InvalidValue(f"text must be a str, not {type(new_text).__name__}")
        if "\x00" in new_text:
            raise InvalidValue("text must not contain NUL")
        if not new_text.isascii() and not encodable(new_text):
            raise InvalidValue("text must be valid Unicode (no lone surrogates)")
        edits = text_diff(str(self._root), new_text)
        if not edits:
            return
        root = self._root
        old = str(root)

        def apply() -> None:
            apply_text_edits(root, old, edits)

        await self._write([["text", self.name, k, at, arg] for k, at, arg in edits], apply)

    async def insert(self, index: int, text: str) -> None:
        """Insert ``text`` at character ``index``. Raises ``IndexError``, ``InvalidValue``."""
        if not isinstance(text, str) or "\x00" in text:
            raise InvalidValue("text must be a str without NUL")
        if not text.isascii() and not encodable(text):
            raise InvalidValue("text must be valid Unicode (no lone surrogates)")
        current = str(self._root)
        n = len(current)
        if type(index) is not int or not 0 <= index <= n:
            raise IndexError(f"text index {index!r} out of range for length {n}")
        if not text:
            return
        root = self._root
        start = _utf8_len(current[:index])

        def apply() -> None:
            root.insert(start, text)

        await self._write([["text", self.name, "ins", index, text]], apply)

    async def append(self, text: str) -> None:
        """Append ``text`` at the end."""
        await self.insert(len(str(self._root)), text)

    async def delete(self, index: int, count: int) -> None:
        """Delete ``count`` characters from ``index``. Raises ``IndexError``."""
        current = str(self._root)
        n = len(current)
        if (
            type(index) is not int
            or type(count) is not int
            or index < 0
            or count < 1
            or (index + count > n)
        ):
            raise IndexError(f"cannot delete {count!r} characters at {index!r} of {n}")
        root = self._root
        start = _utf8_len(current[:index])
        size = _utf8_len(current[index : index + count])

        def apply() -> None:
            del root[start : start + size]

        await self._write([["text", self.name, "del", index, count]], apply)


def _utf8_len(text: str) -> int:
    return len(text.encode())
