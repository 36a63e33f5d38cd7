"""The record as tools an LLM agent calls, in-process or over MCP.

::

    from crdtstore.tools import Toolset

    async with store.open_record(run="r1", agent="coder", source="model") as rec:
        async with Toolset(rec, view=["findings", "log"]) as tools:
            tools.schemas("anthropic")        # or "openai", "mcp"
            result = await tools.call("store_get", '{"collection": "findings"}')

Tools (names are a contract): ``store_get``, ``store_put``, ``store_delete``,
``store_append``, ``store_text_edit``, ``store_changes``, ``store_claim``,
``store_complete``, ``store_release``, ``lease_acquire``, ``lease_release``,
``store_history``, ``store_describe``. ``crdtstore mcp`` serves them over MCP.
"""

from ._args import TOOL_NAMES as TOOL_NAMES
from ._toolset import Toolset as Toolset

__all__ = ["TOOL_NAMES", "Toolset"]
