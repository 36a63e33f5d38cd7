"""The tool list in each vendor's format, generated from the argument models.

- ``openai``: Chat Completions function tools, ``{"type": "function", "function": {"name",
  "description", "parameters"}}``.
- ``anthropic``: Messages API tools, ``{"name", "description", "input_schema"}``.
- ``mcp``: MCP ``Tool`` objects, ``{"name", "description", "inputSchema", "annotations"}``.

Schemas are self-contained (``$ref`` into ``$defs`` is inlined and pydantic's ``title`` keys
dropped), because not every vendor resolves references.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any, Literal

from ._args import TOOLS, ToolSpec

Format = Literal["openai", "anthropic", "mcp"]
FORMATS: tuple[str, ...] = ("openai", "anthropic", "mcp")


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            target = _inline(defs[ref[len("#/$defs/") :]], defs)
            rest = {k: _inline(v, defs) for k, v in node.items() if k != "$ref"}
            return {**target, **rest}
        return {
            k: _inline(v, defs)
            for k, v in node.items()
            if k != "$defs" and not (k == "title" and isinstance(v, str))
        }
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


@cache
def _parameters(name: str) -> dict[str, Any]:
    model = TOOLS[name].args
    raw = model.model_json_schema()
    schema: dict[str, Any] = _inline(raw, raw.get("$defs", {}))
    schema.pop("description", None)  # it is the tool's description
    schema.setdefault("properties", {})
    schema["type"] = "object"
    schema["additionalProperties"] = False
    return schema


def parameters(name: str) -> dict[str, Any]:
    """The JSON schema of tool ``name``'s arguments (a fresh copy)."""
    return copy.deepcopy(_parameters(name))


def description(spec: ToolSpec) -> str:
    doc = spec.args.__doc__ or spec.name
    return " ".join(doc.split())


def tool_annotations(spec: ToolSpec) -> dict[str, bool]:
    """MCP tool annotations (hints for clients: which tools only read)."""
    return {
        "readOnlyHint": not spec.writes,
        "destructiveHint": spec.destructive,
        "idempotentHint": spec.idempotent,
        "openWorldHint": False,
    }


def tool_schema(spec: ToolSpec, fmt: str) -> dict[str, Any]:
    """One tool in format ``fmt``.

    Raises:
        ValueError: an unknown format.
    """
    params = parameters(spec.name)
    desc = description(spec)
    if fmt == "openai":
        return {
            "type": "function",
            "function": {"name": spec.name, "description": desc, "parameters": params},
        }
    if fmt == "anthropic":
        return {"name": spec.name, "description": desc, "input_schema": params}
    if fmt == "mcp":
        return {
            "name": spec.name,
            "description": desc,
            "inputSchema": params,
            "annotations": tool_annotations(spec),
        }
    raise ValueError(f"format must be one of {list(FORMATS)}, not {fmt!r}")
