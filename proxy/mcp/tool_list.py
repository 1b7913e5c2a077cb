"""A `tools/list` answer as the agent may see it (tool permissions, SPEC §9): the tools whose
`SERVER__TOOL` the permissions deny are left out, on direct routes as on the aggregate."""

from __future__ import annotations

from typing import Any

from proxy.guards import tool_names
from proxy.guards.config import ToolsConfig
from proxy.guards.permissions import permission


def permitted_tools_list(msg: dict[str, Any], server: str, tools: ToolsConfig) -> dict[str, Any] | None:
    """The `tools/list` response `msg` without the tools of `server` that `tools` denies; None when
    none is (or `msg` is an error): relayed as it came. A page keeps its `nextCursor`."""
    result = msg.get("result")
    if not isinstance(result, dict):
        return None
    listed = result.get("tools")
    if not isinstance(listed, list):
        return None
    kept = [tool for tool in listed if not _denied(tool, server, tools)]
    if len(kept) == len(listed):
        return None
    return {**msg, "result": {**result, "tools": kept}}


def _denied(tool: Any, server: str, tools: ToolsConfig) -> bool:
    name = tool.get("name") if isinstance(tool, dict) else None
    return isinstance(name, str) and permission(tools, tool_names.qualified(server, name)) == "deny"
