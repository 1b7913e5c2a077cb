"""Tool permissions (SPEC §9): which tools an agent may call, must ask for, or may not call.

Pure: a `ToolsConfig` and a tool's name in, a verdict out. Names are matched as the agent sees
them: `SERVER__TOOL` for an MCP tool (direct and aggregated routes alike), the function's own name
for a function-calling tool. Globs are fnmatch's, case-sensitive (tool names are), compiled once per
config: a check is a few regex matches, cheap enough for every call and every listed tool.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import translate
from functools import lru_cache
from typing import Literal

from proxy.guards import tool_names
from proxy.guards.config import ToolsConfig

Permission = Literal["allow", "ask", "deny"]

# (the naming rule lives in proxy/guards/tool_names.py; these names are kept for their callers)
SERVER_SEPARATOR = tool_names.SERVER_SEPARATOR
mcp_tool_name = tool_names.qualified
qualified_tool_name = tool_names.policy_name


@dataclass(frozen=True)
class _Compiled:
    allow: re.Pattern[str] | None  # None: no allow-list, everything not denied is allowed
    ask: re.Pattern[str] | None
    deny: re.Pattern[str] | None


def _union(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{translate(p)})" for p in patterns))


@lru_cache(maxsize=256)
def _compiled(tools: ToolsConfig) -> _Compiled:
    return _Compiled(
        allow=None if tools.allow is None else (_union(tools.allow) or re.compile(r"(?!)")),
        ask=_union(tools.ask),
        deny=_union(tools.deny),
    )


# Codex's tools that run a shell command (outside code mode declared as such, inside it called by an
# `exec` script): a pattern matching `shell` matches them too, so `deny: [shell]` means the shell
SHELL = "shell"
SHELL_TOOLS = frozenset(("exec_command", "write_stdin", "shell_command", "local_shell"))


def permission(tools: ToolsConfig, name: str) -> Permission:
    """deny beats ask beats allow; with `allow` given, whatever it does not match is denied."""
    if not tools.restricts:
        return "allow"
    c = _compiled(tools)
    names = (name, SHELL) if name in SHELL_TOOLS else (name,)
    if c.deny is not None and any(c.deny.match(n) for n in names):
        return "deny"
    if c.allow is not None and not any(c.allow.match(n) for n in names):
        return "deny"
    if c.ask is not None and any(c.ask.match(n) for n in names):
        return "ask"
    return "allow"
