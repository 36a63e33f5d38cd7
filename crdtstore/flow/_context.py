"""What a ``python`` or ``agent`` step receives: :class:`StepContext`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .._errors import CrdtStoreError
from .._leases import canonical_resource, item_resource

if TYPE_CHECKING:
    from .._leases import Lease
    from .._store import Store
    from ..record import ListCollection, MapCollection, Record, ScopedMap, TextCollection, View
    from ..tools import Toolset

__all__ = ["StepContext"]


class StepContext:
    """The step's view of the world, built by the kernel for one attempt.

    Attributes:
        store: the open store.
        record: the run's record opened as the step's agent. Every write the step makes
            inside the attempt (through ``record``, ``map()``, the tools) is journaled with
            ``call_id`` (``Record.attributed``).
        run: the run the step writes under (a nested workflow's: the nested run).
        root_run: the run the kernel was started for.
        step: the step's path (``verify/lint``); ``attempt``: 1, 2, ...
        call_id: ``<root run>:<path>#<attempt>``.
        agent: the step's agent id.
        inputs: the step's ``inputs``.
        results: the results of the steps it depends on, by step id.
        lease: the lease on ``files`` (its ``owned_files``), held while the step runs; writes
            to keys naming those files are fenced by it (:meth:`put`, the tools).
        view: the step's slice (``view`` in the spec), or None for the whole record.
        tools: the step's :class:`~crdtstore.tools.Toolset` (restricted to ``view``).
        tool_schemas: ``agent`` steps: the store tools' schemas in the executor's
            ``tools_format`` (always all of them); ``python`` steps: empty.
        allowed_tools: ``agent`` steps: the executor's ``tools`` allowlist of the agent's
            own tools (None: no restriction).
    """

    def __init__(
        self,
        *,
        store: Store,
        record: Record,
        run: str,
        root_run: str,
        step: str,
        attempt: int,
        call_id: str,
        agent: str,
        inputs: Mapping[str, Any],
        results: Mapping[str, Any],
        lease: Lease | None,
        view: View | None,
        tools: Callable[[], Toolset],
        tool_schemas: list[dict[str, Any]] | None = None,
        allowed_tools: list[str] | None = None,
    ) -> None:
        self.store = store
        self.record = record
        self.run = run
        self.root_run = root_run
        self.step = step
        self.attempt = attempt
        self.call_id = call_id
        self.agent = agent
        self.inputs = dict(inputs)
        self.results = dict(results)
        self.lease = lease
        self.files: tuple[str, ...] = lease.resources if lease is not None else ()
        self.view = view
        self._make_tools = tools
        self._tools: Toolset | None = None
        self.tool_schemas = list(tool_schemas or [])
        self.allowed_tools = allowed_tools

    @property
    def tools(self) -> Toolset:
        """The step's toolset (made on first use: a step that does not use it does not pay
        for it)."""
        if self._tools is None:
            self._tools = self._make_tools()
        return self._tools

    def map(self, name: str) -> MapCollection | ScopedMap:
        """The map ``name``, through the step's view if it has one (``PolicyViolation``
        outside it)."""
        return self.view.map(name) if self.view is not None else self.record.map(name)

    def list(self, name: str) -> ListCollection:
        """The list ``name`` (``PolicyViolation`` if the view does not cover it)."""
        return self.view.list(name) if self.view is not None else self.record.list(name)

    def text(self, name: str) -> TextCollection:
        """The text ``name`` (``PolicyViolation`` if the view does not cover it)."""
        return self.view.text(name) if self.view is not None else self.record.text(name)

    def fence(self, collection: str, key: str) -> Lease | None:
        """The step's lease if it covers ``collection[key]`` (the key as a repo path, or as
        the work item ``item:<collection>/<key>``), else None."""
        lease = self.lease
        if lease is None:
            return None
        with contextlib.suppress(CrdtStoreError):
            if canonical_resource(key) in lease.resources:  # the key as a repo path
                return lease
        with contextlib.suppress(CrdtStoreError):
            if item_resource(collection, key) in lease.resources:  # as a work item
                return lease
        return None

    async def put(self, collection: str, key: str, value: Any, **options: Any) -> None:
        """``map(collection).set(key, value)``, fenced by the step's lease when it covers the
        key (``LeaseLost`` if the lease was lost meanwhile: nothing is written).

        Raises:
            LeaseLost, PolicyViolation, SchemaInvalid, InvalidValue: as ``MapCollection.set``.
        """
        lease = self.fence(collection, key)
        if lease is not None and "lease" not in options:
            options["lease"] = lease
        await self.map(collection).set(key, value, **options)

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any] | str | None = None,
        *, call_id: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Run a store tool (``await ctx.tools.call(...)``); a model's tool-call id is
        journaled as ``<call_id of the step>/<call_id>``, so the step stays identifiable."""
        cid = self.call_id if call_id is None else f"{self.call_id}/{call_id}"[:256]
        return await self.tools.call(name, arguments, call_id=cid)

    def __repr__(self) -> str:
        return f"<StepContext {self.call_id} agent={self.agent!r}>"
