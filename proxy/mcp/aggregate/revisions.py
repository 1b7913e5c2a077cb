"""Translations between MCP revisions for the aggregate endpoint: pure functions, no I/O.

Two eras meet behind `/mcp`: the handshake era (2024-11-05 .. 2025-11-25: `initialize`,
`notifications/initialized`, `Mcp-Session-Id`, server-to-client requests on a stream) and 2026-07-28
(stateless: every request carries its own `_meta` envelope and routing headers, `server/discover`
instead of `initialize`, `input_required` results instead of server-to-client requests,
`subscriptions/listen` instead of the GET stream). A client of one era may sit in front of a server of
the other; each function below answers what one side needs in the words the other side's revision
defines. docs/mcp.md "Aggregation: revisions" quotes the specification for each.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator, Mapping
from typing import Any

JsonObject = dict[str, Any]

HANDSHAKE_REVISIONS: tuple[str, ...] = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
"""Revisions reached through the `initialize` handshake, oldest first."""
STATELESS_REVISIONS: tuple[str, ...] = ("2026-07-28",)
"""Revisions whose requests each carry their own envelope (no handshake, no session)."""
LATEST_HANDSHAKE = HANDSHAKE_REVISIONS[-1]
LATEST_STATELESS = STATELESS_REVISIONS[-1]

# `_meta` keys of the 2026-07-28 per-request envelope (basic/index "Per-request protocol fields")
PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"
CLIENT_INFO_META = "io.modelcontextprotocol/clientInfo"
CLIENT_CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"
LOG_LEVEL_META = "io.modelcontextprotocol/logLevel"
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID_META = "io.modelcontextprotocol/subscriptionId"
RESERVED_META_PREFIX = "io.modelcontextprotocol/"

# HTTP headers (transports "Protocol Version Header", 2026-07-28 "Routing headers")
PROTOCOL_VERSION_HEADER = "MCP-Protocol-Version"
SESSION_ID_HEADER = "Mcp-Session-Id"
METHOD_HEADER = "Mcp-Method"
NAME_HEADER = "Mcp-Name"
PARAM_HEADER_PREFIX = "Mcp-Param-"
X_MCP_HEADER = "x-mcp-header"

# JSON-RPC error codes
METHOD_NOT_FOUND = -32601
INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603
INVALID_PARAMS = -32602
UNSUPPORTED_PROTOCOL_VERSION = -32022
"""2026-07-28's UnsupportedProtocolVersionError: `data = {"supported": [...], "requested": ...}`."""

NAME_BEARING: Mapping[str, str] = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
"""Methods whose `Mcp-Name` header mirrors a body parameter (2026-07-28 routing headers)."""

SERVER_REQUEST_CAPABILITY: Mapping[str, str] = {
    "elicitation/create": "elicitation",
    "sampling/createMessage": "sampling",
    "roots/list": "roots",
}
"""Server-to-client requests and the client capability that allows each (both eras)."""

RESULT_COMPLETE = "complete"
RESULT_INPUT_REQUIRED = "input_required"


def is_stateless(revision: str) -> bool:
    """Whether `revision` is of the 2026-07-28 era (an unknown revision is not assumed to be)."""
    return revision in STATELESS_REVISIONS


# --- the era probe (what the SDK's `mode="auto"` client does, mcp/client/_probe.py) ---


def unsupported_versions(error: Mapping[str, Any] | None) -> list[str] | None:
    """The `supported` list of an UnsupportedProtocolVersionError (-32022), else None."""
    if not error or error.get("code") != UNSUPPORTED_PROTOCOL_VERSION:
        return None
    data = error.get("data")
    supported = data.get("supported") if isinstance(data, Mapping) else None
    if not isinstance(supported, list):
        return None
    return [v for v in supported if isinstance(v, str)]


def mutual_stateless(supported: list[str] | None) -> str | None:
    """The newest stateless revision both sides speak, from a server's `supported` list."""
    mutual = [v for v in STATELESS_REVISIONS if v in (supported or ())]
    return mutual[-1] if mutual else None


def probe_verdict(error: Mapping[str, Any] | None, result: Mapping[str, Any] | None) -> str:
    """What a `server/discover` probe's answer says about the server: "stateless", "handshake" or
    "incompatible".

    2026-07-28 (basic/versioning, "Backward compatibility"): a client that supports both eras probes
    with `server/discover`; any error other than an UnsupportedProtocolVersionError naming only
    revisions the client does not speak means the server predates 2026-07-28, and the client falls back
    to `initialize`. A server that answers `server/discover` but lists no stateless revision in
    `supportedVersions` is advertising the handshake era.
    """
    if result is not None:
        versions = result.get("supportedVersions")
        if isinstance(versions, list) and mutual_stateless([v for v in versions if isinstance(v, str)]):
            return "stateless"
        return "handshake"
    supported = unsupported_versions(error)
    if supported is not None:
        if mutual_stateless(supported):
            return "stateless"
        if not any(v in HANDSHAKE_REVISIONS for v in supported):
            return "incompatible"
    return "handshake"


def newest_handshake(offered: str) -> str | None:
    """The handshake revision to keep after the server's `initialize` answer `offered`, or None when
    the client cannot speak it (lifecycle "Version Negotiation": the client SHOULD disconnect)."""
    return offered if offered in HANDSHAKE_REVISIONS else None


# --- the per-request envelope (2026-07-28) ---


def with_envelope(
    params: Mapping[str, Any] | None,
    revision: str,
    client_info: Mapping[str, Any],
    capabilities: Mapping[str, Any],
    log_level: str | None = None,
) -> JsonObject:
    """`params` with the 2026-07-28 `_meta` envelope: protocol version, client info and capabilities.

    A stateless client's own info and capabilities (already in `_meta`) are kept: they are what the
    server must judge the request by. A handshake client's (from its `initialize`) are given as
    `client_info` / `capabilities`. The log level a handshake client set with `logging/setLevel` rides
    each request (`io.modelcontextprotocol/logLevel`), as 2026-07-28 has no `logging/setLevel`.
    """
    out: JsonObject = dict(params or {})
    meta: JsonObject = dict(out.get("_meta") or {})
    meta[PROTOCOL_VERSION_META] = revision
    meta.setdefault(CLIENT_INFO_META, dict(client_info))
    meta.setdefault(CLIENT_CAPABILITIES_META, dict(capabilities))
    if log_level is not None:
        meta.setdefault(LOG_LEVEL_META, log_level)
    out["_meta"] = meta
    return out


def without_envelope(params: Mapping[str, Any] | None) -> JsonObject | None:
    """`params` for a handshake-era server: the `io.modelcontextprotocol/` `_meta` keys removed (that
    prefix is reserved; a handshake server learnt the client's info and capabilities at `initialize`)."""
    if params is None:
        return None
    out = dict(params)
    meta = out.get("_meta")
    if isinstance(meta, Mapping):
        kept = {k: v for k, v in meta.items() if not k.startswith(RESERVED_META_PREFIX)}
        if kept:
            out["_meta"] = kept
        else:
            out.pop("_meta")
    return out


def envelope_of(params: Mapping[str, Any] | None) -> tuple[str | None, Any, Any]:
    """(revision, client info, client capabilities) a stateless client's request carries."""
    meta = (params or {}).get("_meta")
    if not isinstance(meta, Mapping):
        return None, None, None
    revision = meta.get(PROTOCOL_VERSION_META)
    return (
        (revision if isinstance(revision, str) else None),
        meta.get(CLIENT_INFO_META),
        meta.get(CLIENT_CAPABILITIES_META),
    )


def encode_header_value(value: str) -> str:
    """A header-safe rendering: printable ASCII as is, anything else in the `=?base64?...?=` form."""
    if re.fullmatch(r"[\x20-\x7E]*", value) and value == value.strip() and not value.startswith("=?base64?"):
        return value
    return f"=?base64?{base64.b64encode(value.encode()).decode('ascii')}?="


def routing_headers(method: str, params: Mapping[str, Any] | None, revision: str) -> dict[str, str]:
    """The 2026-07-28 routing headers of one request: `MCP-Protocol-Version`, `Mcp-Method`, and
    `Mcp-Name` for the methods that name a tool, prompt or resource."""
    headers = {PROTOCOL_VERSION_HEADER: revision, METHOD_HEADER: method}
    key = NAME_BEARING.get(method)
    value = (params or {}).get(key) if key else None
    if isinstance(value, str):
        headers[NAME_HEADER] = encode_header_value(value)
    return headers


def _annotated(schema: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(properties, Mapping):
        return
    for name, sub in properties.items():
        if not isinstance(sub, Mapping):
            continue
        token = sub.get(X_MCP_HEADER)
        if isinstance(token, str):
            yield (*path, name), token
        yield from _annotated(sub, (*path, name))


def param_headers(input_schema: Any, arguments: Mapping[str, Any] | None) -> dict[str, str]:
    """The `Mcp-Param-*` headers a 2026-07-28 `tools/call` mirrors from its arguments, for each
    property the tool's `inputSchema` annotates with `x-mcp-header` (reached through `properties`)."""
    headers: dict[str, str] = {}
    for path, token in _annotated(input_schema):
        node: Any = arguments or {}
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        if node is None or isinstance(node, dict | list):
            continue
        rendered = ("true" if node else "false") if isinstance(node, bool) else str(node)
        headers[f"{PARAM_HEADER_PREFIX}{token}"] = encode_header_value(rendered)
    return headers


# --- what a server says about itself: `initialize` result <-> `server/discover` result ---


def initialize_from_discover(discover: Mapping[str, Any], revision: str, fallback_name: str) -> JsonObject:
    """A stateless server's `server/discover` result as the `initialize` result a handshake client
    expects: the same capabilities and instructions, `serverInfo` from the result's
    `io.modelcontextprotocol/serverInfo` (2026-07-28 servers SHOULD stamp it on every result), and the
    handshake revision the client negotiated as `protocolVersion`."""
    meta = discover.get("_meta")
    info = meta.get(SERVER_INFO_META) if isinstance(meta, Mapping) else None
    out: JsonObject = {
        "protocolVersion": revision,
        "capabilities": dict(discover.get("capabilities") or {}),
        "serverInfo": dict(info)
        if isinstance(info, Mapping)
        else {"name": fallback_name, "version": "unknown"},
    }
    if isinstance(discover.get("instructions"), str):
        out["instructions"] = discover["instructions"]
    return out


def discover_from_initialize(initialize: Mapping[str, Any]) -> JsonObject:
    """A handshake server's `initialize` result as the `server/discover` result a stateless client
    expects: `supportedVersions` the stateless revisions the aggregate speaks for it, the same
    capabilities and instructions, `serverInfo` in `_meta`, `resultType: "complete"`, and cache hints
    that promise nothing (`ttlMs: 0`, `cacheScope: "private"`: the aggregate's answer depends on who
    asks and on which servers are up)."""
    capabilities = dict(initialize.get("capabilities") or {})
    out: JsonObject = {
        "resultType": RESULT_COMPLETE,
        "supportedVersions": list(STATELESS_REVISIONS),
        "capabilities": capabilities,
        "ttlMs": 0,
        "cacheScope": "private",
    }
    if isinstance(initialize.get("instructions"), str):
        out["instructions"] = initialize["instructions"]
    if isinstance(initialize.get("serverInfo"), Mapping):
        out["_meta"] = {SERVER_INFO_META: dict(initialize["serverInfo"])}
    return out


# --- results ---


def result_type(result: Mapping[str, Any]) -> str:
    """A result's `resultType`; absent means "complete" (2026-07-28: a client MUST treat a result from
    an earlier revision's server, which has no `resultType`, as complete)."""
    value = result.get("resultType")
    return value if isinstance(value, str) else RESULT_COMPLETE


def as_stateless_result(result: Mapping[str, Any]) -> JsonObject:
    """A handshake server's result for a stateless client: `resultType: "complete"` added (servers of
    2026-07-28 MUST include it)."""
    out = dict(result)
    out.setdefault("resultType", RESULT_COMPLETE)
    return out


def as_handshake_result(result: Mapping[str, Any]) -> JsonObject:
    """A stateless server's complete result for a handshake client: `resultType` dropped (the field
    does not exist before 2026-07-28; the rest of the result is the same shape)."""
    return {k: v for k, v in result.items() if k != "resultType"}


# --- server-to-client requests <-> `input_required` (2026-07-28 multi round-trip requests) ---


def input_required(requests: Mapping[str, Mapping[str, Any]], request_state: str | None) -> JsonObject:
    """An `input_required` result asking for `requests` ({key: {method, params}}), with the opaque
    `requestState` the client echoes on its retry. This is how a handshake server's
    `elicitation/create` / `sampling/createMessage` / `roots/list` on a POST's stream reaches a
    2026-07-28 client (mrtr: servers MUST send server-to-client requests this way)."""
    out: JsonObject = {
        "resultType": RESULT_INPUT_REQUIRED,
        "inputRequests": {
            key: {"method": r["method"], **({"params": r["params"]} if "params" in r else {})}
            for key, r in requests.items()
        },
    }
    if request_state is not None:
        out["requestState"] = request_state
    return out


def input_requests(result: Mapping[str, Any]) -> list[tuple[str, str, JsonObject | None]]:
    """(key, method, params) of each request an `input_required` result asks the client to answer:
    for a handshake client, each becomes a server-to-client request on its POST's stream, the answer
    goes back under the same key in the retry's `inputResponses`."""
    requests = result.get("inputRequests")
    if not isinstance(requests, Mapping):
        return []
    out: list[tuple[str, str, JsonObject | None]] = []
    for key, request in requests.items():
        if isinstance(request, Mapping) and isinstance(request.get("method"), str):
            params = request.get("params")
            out.append((str(key), request["method"], dict(params) if isinstance(params, Mapping) else None))
    return out


def retry_params(
    params: Mapping[str, Any] | None, responses: Mapping[str, Any], request_state: str | None
) -> JsonObject:
    """The original request's params again, with `inputResponses` ({key: result}) and the echoed
    `requestState`: the retry of a multi round-trip request (mrtr step 3)."""
    out = {k: v for k, v in dict(params or {}).items() if k not in ("inputResponses", "requestState")}
    if responses:
        out["inputResponses"] = dict(responses)
    if request_state is not None:
        out["requestState"] = request_state
    return out


def split_retry(params: Mapping[str, Any] | None) -> tuple[JsonObject, dict[str, Any], str | None]:
    """(params without the round-trip fields, inputResponses, requestState) of a retried request."""
    plain = {k: v for k, v in dict(params or {}).items() if k not in ("inputResponses", "requestState")}
    responses = (params or {}).get("inputResponses")
    state = (params or {}).get("requestState")
    return (
        plain,
        dict(responses) if isinstance(responses, Mapping) else {},
        state if isinstance(state, str) else None,
    )


def may_ask(method: str, capabilities: Mapping[str, Any]) -> bool:
    """Whether a client with `capabilities` may be sent the server-to-client request `method`
    (elicitation, sampling and roots each need the client's capability, in both eras)."""
    capability = SERVER_REQUEST_CAPABILITY.get(method)
    return capability is not None and capabilities.get(capability) is not None


# --- what one era has and the other has not ---


def local_answer(method: str, revision: str) -> JsonObject | None:
    """The answer to a handshake client's request that a stateless server has no method for, or None
    to forward it: `ping` (2026-07-28 has no ping; the server is reachable per request, so the
    aggregate answers the empty result the handshake era requires) and `logging/setLevel` (replaced by
    the per-request `io.modelcontextprotocol/logLevel`; the level is kept and sent with each request)."""
    if is_stateless(revision) and method in ("ping", "logging/setLevel"):
        return {}
    return None


def cancels_by_notification(revision: str) -> bool:
    """How a request is cancelled: handshake era, a `notifications/cancelled` naming its id; 2026-07-28
    (transports: "closing the response stream is cancellation"), by closing that request's stream."""
    return not is_stateless(revision)


def listen_filter(capabilities: Mapping[str, Any], resource_uris: list[str] | None = None) -> JsonObject:
    """The `subscriptions/listen` filter asking a 2026-07-28 server for every list-changed
    notification its capabilities announce (what a handshake server sends on its GET stream unasked),
    and for `notifications/resources/updated` of the URIs a handshake client subscribed to with
    `resources/subscribe` (2026-07-28: `resourceSubscriptions` "replaces the former
    `resources/subscribe` RPC")."""
    wanted: JsonObject = {}
    for kind, flag in (
        ("tools", "toolsListChanged"),
        ("prompts", "promptsListChanged"),
        ("resources", "resourcesListChanged"),
    ):
        entry = capabilities.get(kind)
        if isinstance(entry, Mapping) and entry.get("listChanged"):
            wanted[flag] = True
    if resource_uris:
        wanted["resourceSubscriptions"] = list(resource_uris)
    return wanted


def listen_notification(params: Mapping[str, Any] | None) -> JsonObject | None:
    """A notification from a `subscriptions/listen` stream as a handshake client would see it on the
    GET stream: the `io.modelcontextprotocol/subscriptionId` stamp removed."""
    if params is None:
        return None
    out = dict(params)
    meta = out.get("_meta")
    if isinstance(meta, Mapping):
        kept = {k: v for k, v in meta.items() if k != SUBSCRIPTION_ID_META}
        if kept:
            out["_meta"] = kept
        else:
            out.pop("_meta")
    return out
