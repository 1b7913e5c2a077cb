"""Which tool is this: the one naming rule (SPEC §3, §9; issue 30).

An MCP tool is `SERVER__TOOL` wherever a rule names it: on the aggregate `/mcp` the client already
calls it so; on a direct route `/mcp/SERVER` it calls the tool's own name, which is qualified
here - always, even when that name itself starts with `SERVER__` (`fs__rm` on `/mcp/fs` is
`fs__fs__rm`: the name its `tools/list` entry is filtered by, so a tool hidden there cannot be
called). A function-calling tool of an LLM request is its plain name. List filtering, permissions,
rate limits, guards, trace and replay all ask this module.

Pure.
"""

from __future__ import annotations

# the separator of an MCP tool's qualified name: `SERVER__TOOL`
SERVER_SEPARATOR = "__"


def qualified(server: str, tool: str) -> str:
    """The name of tool `tool` (its own name) of MCP server `server`: `SERVER__TOOL`."""
    return f"{server}{SERVER_SEPARATOR}{tool}"


def policy_name(server: str | None, tool: str) -> str:
    """The name permissions and rate limits match for a tool call: `server` is the server whose
    tool's own name `tool` is (a direct route), None when `tool` is already `SERVER__TOOL` (the
    aggregate) or a function-calling tool's name."""
    return tool if server is None else qualified(server, tool)


def naming_server(server: str, aggregated: bool) -> str | None:
    """The `server` to hand `policy_name` for a call of `server`'s tool: None when it came through
    the aggregate (its name is `SERVER__TOOL` already)."""
    return None if aggregated else server


def split(full: str) -> tuple[str, str] | None:
    """`SERVER__TOOL` -> (server, tool), at the first separator (a server name has none); None
    when it has none."""
    server, sep, name = full.partition(SERVER_SEPARATOR)
    if not sep or not server or not name:
        return None
    return server, name
