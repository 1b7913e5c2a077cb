"""Names on the aggregate endpoint (SPEC §3): `SERVER__TOOL`, which server owns a name, which
servers may be aggregated, and Tripwire's own pagination cursors.

Pure. A server name that may prefix tool names has no `__` and does not end in `_`, so the first
`__` of `SERVER__TOOL` always ends the server's name: two servers can never produce the same
prefixed name, and a tool whose own name contains `__` (or starts with `_`) is still owned
unambiguously (`files__read__all` is tool `read__all` of `files`). That is why it is listed
unchanged rather than refused: tools are only known once a server answers, long after start.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from typing import TYPE_CHECKING, Any

import orjson

from proxy.guards.tool_names import SERVER_SEPARATOR, qualified, split

if TYPE_CHECKING:
    from proxy.settings import Settings

# MCP's tool names (2025-11-25 "Tool names"): 1 to 128 of these characters
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
MAX_TOOL_NAME = 128
# a server name that can prefix: tool-name characters, no `__`, not ending in `_`, and room left
# for `__` and at least one character of a tool's name
SERVER_PREFIX = re.compile(r"(?!.*__)[A-Za-z0-9_.-]*[A-Za-z0-9.-]")
MAX_SERVER_NAME = MAX_TOOL_NAME - len(SERVER_SEPARATOR) - 1


def aggregate_servers(settings: Settings) -> tuple[str, ...]:
    """The servers `/mcp` serves: `mcp_aggregate`, else every `mcp` and `mcp_stdio` server."""
    if settings.mcp_aggregate is not None:
        return tuple(settings.mcp_aggregate)
    return (*settings.mcp, *settings.mcp_stdio)


def aggregate_problems(settings: Settings) -> list[str]:
    """Why the aggregate cannot serve this configuration (refused at start), naming the names."""
    configured = (*settings.mcp, *settings.mcp_stdio)
    problems: list[str] = []
    if settings.mcp_aggregate is not None:
        unknown = [n for n in settings.mcp_aggregate if n not in configured]
        if unknown:
            problems.append(
                f"mcp_aggregate names unknown MCP servers {unknown}; configured: {list(configured)}"
            )
    servers = [n for n in aggregate_servers(settings) if n in configured]
    for name in servers:
        why = prefix_problem(name)
        if why is None:
            continue
        clash = [o for o in servers if o != name and _may_collide(name, o)]
        also = f" (its tools' names would read as server {clash[0]!r}'s)" if clash else ""
        problems.append(
            f"MCP server name {name!r} cannot prefix tool names on /mcp ({why}){also}: rename it "
            "or leave it out of mcp_aggregate"
        )
    return problems


def prefix_problem(name: str) -> str | None:
    if not name:
        return "empty"
    if len(name) > MAX_SERVER_NAME:
        return f"longer than {MAX_SERVER_NAME} characters"
    if not TOOL_NAME.fullmatch(name):
        return "only letters, digits, '_', '.' and '-' may appear in a tool name"
    if SERVER_SEPARATOR in name:
        return f"it contains {SERVER_SEPARATOR!r}, the separator of SERVER{SERVER_SEPARATOR}TOOL"
    if name.endswith("_"):
        return f"it ends in '_', which would run into the separator {SERVER_SEPARATOR!r}"
    return None


def _may_collide(bad: str, other: str) -> bool:
    """`a_` and `a` (tool `_x` of `a` and tool `x` of `a_` are both `a___x`)."""
    return bad.rstrip("_") == other or bad.startswith(other + "_")


def prefixed(server: str, name: str) -> str | None:
    """The aggregate's name for tool (or prompt) `name` of `server`; None when it would be too long."""
    full = qualified(server, name)
    return full if name and len(full) <= MAX_TOOL_NAME else None


def owner(full: str) -> tuple[str, str] | None:
    """`SERVER__TOOL` -> (server, tool), split at the first separator; None when it has none."""
    return split(full)


# --- cursors ---------------------------------------------------------------------------------------
# A merged list's page is one page of each server still listing; Tripwire's cursor carries each such
# server's own cursor, opaque to the client and signed (HMAC-SHA256 with the aggregate's own key): a
# cursor Tripwire did not give - a forged one naming a server and any cursor of its - is refused
# (-32602, docs/mcp.md), never handed to a server (issue 30).

_MAC_BYTES = 16


def _mac(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, payload, hashlib.sha256).digest()[:_MAC_BYTES]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode_cursor(method: str, cursors: dict[str, str], *, key: bytes) -> str:
    raw = orjson.dumps({"m": method, "c": cursors})
    return f"{_b64(raw)}.{_b64(_mac(key, raw))}"


def decode_cursor(cursor: Any, method: str, servers: tuple[str, ...], *, key: bytes) -> dict[str, str] | None:
    """Each server's own cursor, or None for a cursor Tripwire did not give for this list."""
    if not isinstance(cursor, str) or not cursor:
        return None
    body, dot, mac = cursor.partition(".")
    try:
        raw = _unb64(body)
        if not dot or not hmac.compare_digest(_unb64(mac), _mac(key, raw)):
            return None
        data = orjson.loads(raw)
    except (ValueError, binascii.Error):
        return None
    if not isinstance(data, dict) or data.get("m") != method or not isinstance(data.get("c"), dict):
        return None
    cursors = data["c"]
    if not cursors or any(s not in servers or not isinstance(c, str) for s, c in cursors.items()):
        return None
    return dict(cursors)
