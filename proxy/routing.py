"""Which upstream a request goes to, and which agent and session it belongs to (SPEC §3).

Pure: a path and a few headers in, a `Route` (or a `RouteError` to answer with) out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote

from proxy.classify import paths

AGENT_HEADER = "X-Tripwire-Agent"
SESSION_HEADER = "X-Tripwire-Session"
TRIPWIRE_HEADER_PREFIX = "x-tripwire-"
DEFAULT_LLM = "default"

Kind = Literal["llm", "mcp", "aggregate"]  # aggregate: `/mcp`, every MCP server behind one endpoint


@dataclass(frozen=True)
class Route:
    kind: Kind
    upstream: str  # upstream name: "default" for /v1, else the --llm / --mcp name
    path: str  # the path to append to the upstream's base URL (query string kept separately)
    agent: str
    session: str | None  # explicit session id, or None for the agent's automatic session
    prefix: str  # the path prefix the client used up to and including the upstream part
    # a call the aggregate endpoint (`/mcp`) makes to its owning server in process: set only there,
    # never from a path or a header, so a client cannot pass a direct call off as an aggregated one
    aggregated: bool = False


@dataclass(frozen=True)
class RouteError:
    status: int
    message: str
    known: tuple[str, ...] = ()


def _take_identity(segments: list[str]) -> tuple[str | None, str | None, list[str]]:
    """Strip `/agents/NAME/` and `/agents/NAME/sessions/ID/` from the front of the path."""
    agent = session = None
    if len(segments) >= 2 and segments[0] == "agents" and segments[1]:
        agent = segments[1]
        segments = segments[2:]
        if len(segments) >= 2 and segments[0] == "sessions" and segments[1]:
            session = segments[1]
            segments = segments[2:]
    return agent, session, segments


def resolve(
    path: str,
    headers: Mapping[str, str],
    *,
    default_agent: str,
    llm_names: tuple[str, ...],
    mcp_names: tuple[str, ...],
) -> Route | RouteError:
    raw_segments = path.split("/")[1:]
    segments = [unquote(s) for s in raw_segments]
    if paths.has_dot_segment(raw_segments):
        # `..` (or `%2e%2e`) would reach the upstream verbatim and climb out of the API's base path
        return RouteError(
            400, "dot segments ('.', '..', also percent-encoded) are not allowed in the path", ()
        )
    path_agent, path_session, rest = _take_identity(segments)
    consumed = len(segments) - len(rest)
    agent = headers.get(AGENT_HEADER) or path_agent or default_agent
    session = headers.get(SESSION_HEADER) or path_session

    def prefix_for(n: int) -> str:
        return "/" + "/".join(raw_segments[: consumed + n]) if consumed + n else ""

    # the upstream path is the normalised one (proxy/classify/paths.py): what Tripwire classifies
    # is what the upstream receives
    if rest and rest[0] == "v1":
        upstream_path = paths.normalised(raw_segments[consumed:])
        return Route("llm", DEFAULT_LLM, upstream_path, agent, session, prefix_for(0))
    if rest in (["mcp"], ["mcp", ""]):
        return Route("aggregate", "", "", agent, session, prefix_for(1))
    if rest and rest[0] in ("llm", "mcp"):
        kind: Kind = "llm" if rest[0] == "llm" else "mcp"
        names = llm_names if kind == "llm" else mcp_names
        name = rest[1] if len(rest) > 1 else ""
        if name not in names:
            return RouteError(
                404,
                f"unknown {kind} upstream {name!r}; configured: {', '.join(names) or 'none'}",
                names,
            )
        upstream_path = paths.normalised(raw_segments[consumed + 2 :])
        return Route(kind, name, upstream_path, agent, session, prefix_for(2))
    return RouteError(
        404, "no route: use /v1/..., /llm/NAME/..., /mcp/NAME or /mcp (optionally under /agents/NAME/)"
    )


def join_upstream(base_url: str, upstream_path: str, query: str) -> str:
    """Append the request path to the upstream's base URL.

    `--upstream https://api.openai.com/v1` is a common way to write it; a client path that starts
    with `/v1` then must not become `/v1/v1/...`.
    """
    base = base_url.rstrip("/")
    if upstream_path.startswith("/v1") and base.endswith("/v1"):
        if upstream_path == "/v1" or upstream_path.startswith("/v1/"):
            upstream_path = upstream_path[3:]
    url = base + upstream_path
    return f"{url}?{query}" if query else url
