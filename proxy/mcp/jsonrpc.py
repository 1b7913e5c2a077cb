"""JSON-RPC 2.0 as MCP uses it: classify messages, read tool results, render Tripwire's own answers.

Pure: bytes and dicts in, dataclasses and bytes out. Ids are kept exactly as the client sent them
(string or number); `id_key` makes `1` and `"1"` different keys, as JSON-RPC says they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from proxy import jsonparse
from proxy.guards import tool_names
from proxy.guards.signatures import content_text, result_fingerprint

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603
# Server-defined range (-32000..-32099): Tripwire's own codes.
TRIPWIRE_GUARD_ERROR = -32050  # a guard refused the call (terminate, budget, limits, circuit)
TRIPWIRE_UPSTREAM_ERROR = -32051  # the MCP server could not be reached or failed

MessageKind = Literal["request", "notification", "response", "invalid"]


def parse_body(body: bytes) -> tuple[list[Any], bool] | None:
    """The messages of a POST body and whether it was a batch; None when it is not JSON.

    JSON as `json.loads(bytes)` reads it, at any depth (SPEC §4.2, `proxy.jsonparse`).
    """
    try:
        data = jsonparse.loads(body)
    except ValueError:
        return None
    if isinstance(data, list):
        return data, True
    return [data], False


def kind(msg: Any) -> MessageKind:
    """Request (method + id), notification (method, no id), response (result/error + id, no method)."""
    if not isinstance(msg, dict):
        return "invalid"
    if isinstance(msg.get("method"), str):
        return "request" if "id" in msg else "notification"
    if "id" in msg and ("result" in msg or "error" in msg):
        return "response"
    return "invalid"


def id_key(msg_id: Any) -> str:
    return jsonparse.dumps(msg_id).decode()  # any id json.loads reads (big integers, surrogates)


@dataclass
class MCPToolCall:
    """A `tools/call` the client sent: what guards and recording need to know about it."""

    server: str  # the --mcp / --mcp-stdio name
    tool_name: str
    arguments: Any
    jsonrpc_id: Any  # as sent (string or number)
    mcp_session_id: str | None  # Mcp-Session-Id (Streamable HTTP) or the legacy stream's session
    protocol_version: str | None  # MCP-Protocol-Version header, when sent
    transport: Literal["streamable", "legacy"]
    # A 2026-07-28 resend carrying inputResponses/requestState: the same call continuing
    continuation: bool = False
    # WARN: a "[tripwire] ..." text block appended to the result the client receives
    append_text: str | None = None
    # sent through the aggregate endpoint `/mcp`: `tool_name` is then `SERVER__TOOL` (SPEC §3)
    aggregated: bool = False

    @property
    def qualified_name(self) -> str:
        """`SERVER__TOOL`, the name tool permissions match (SPEC §9) on direct and aggregated routes alike."""
        return tool_names.policy_name(self.naming_server, self.tool_name)

    @property
    def naming_server(self) -> str | None:
        """The server guards qualify `tool_name` with (`tool_names.policy_name`): None when aggregated."""
        return tool_names.naming_server(self.server, self.aggregated)


@dataclass
class MCPToolResult:
    """What a `tools/call` came back with."""

    status: Literal["ok", "error"]
    result: Any  # {"content": [...], "structuredContent": ...} as recorded; None on a JSON-RPC error
    error: dict[str, Any] | None  # {error_type, message, details} for the trace
    error_text: str | None  # the error in one string (retry-without-progress compares it)
    fingerprint: str | None  # hash of the result (no-progress poll compares it)
    upstream_failure: bool  # connection error, 5xx, JSON-RPC -32603: counts against the breaker
    input_required: bool = False  # 2026-07-28: the client will resend; not the end of the call


def fingerprint(value: Any) -> str:
    """The guards' own canonical hash (`signatures.result_fingerprint`), so both sides agree."""
    return result_fingerprint(value)


def tool_result(msg: dict[str, Any]) -> MCPToolResult:
    """Read a JSON-RPC response to a `tools/call`."""
    if "error" in msg:
        err = msg.get("error") or {}
        code = err.get("code") if isinstance(err, dict) else None
        message = str(err.get("message", "")) if isinstance(err, dict) else str(err)
        text = f"{code}: {message}" if code is not None else message
        return MCPToolResult(
            status="error",
            result=None,
            error={
                "error_type": "JSONRPCError",
                "message": message,
                "details": {"code": code, "data": err.get("data") if isinstance(err, dict) else None},
            },
            error_text=text,
            fingerprint=fingerprint({"error": text}),
            upstream_failure=code == INTERNAL_ERROR,
        )
    result = msg.get("result")
    if not isinstance(result, dict):
        result = {"value": result}
    if result.get("resultType") == "input_required":
        return MCPToolResult("ok", None, None, None, None, upstream_failure=False, input_required=True)
    recorded: dict[str, Any] = {"content": result.get("content", [])}
    if "structuredContent" in result:
        recorded["structuredContent"] = result["structuredContent"]
    is_error = result.get("isError") is True
    error_text = content_text(recorded["content"]) if is_error else None
    return MCPToolResult(
        status="error" if is_error else "ok",
        result=recorded,
        error={"error_type": "ToolError", "message": error_text, "details": None} if is_error else None,
        error_text=error_text,
        fingerprint=fingerprint(recorded),
        upstream_failure=False,
    )


def failure_result(message: str, *, upstream_failure: bool = True) -> MCPToolResult:
    """No usable answer: the server was unreachable, failed (5xx) or the stream ended without one."""
    return MCPToolResult(
        status="error",
        result=None,
        error={"error_type": "UpstreamError", "message": message, "details": None},
        error_text=message,
        fingerprint=None,
        upstream_failure=upstream_failure,
    )


def render_result(msg_id: Any, result: dict[str, Any]) -> bytes:
    # jsonparse.dumps: what the client sent (a lone surrogate in a tool name) may be quoted back
    return jsonparse.dumps({"jsonrpc": "2.0", "id": msg_id, "result": result})


def render_error(msg_id: Any, code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return jsonparse.dumps({"jsonrpc": "2.0", "id": msg_id, "error": error})


def sse_message(data: bytes) -> bytes:
    """One SSE `message` event carrying one JSON-RPC message."""
    return b"event: message\ndata: " + data + b"\n\n"


def blocked_result(text: str, guard: str, threshold: Any, actual: Any, expose: bool) -> dict[str, Any]:
    """A BLOCK answer (SPEC §5.5): a tool *result* the model sees, not an error the SDK raises."""
    meta: dict[str, Any] = {"loop_blocked": True, "guard": guard}
    if expose:
        meta["threshold"] = threshold
        meta["actual"] = actual
    return {
        "content": [{"type": "text", "text": text}],
        "isError": True,
        "resultType": "complete",
        "_meta": {"tripwire": meta},
    }


def append_text_block(msg: dict[str, Any], text: str) -> dict[str, Any]:
    """WARN: the same response with a text block appended to its result's content."""
    result = msg.get("result")
    if not isinstance(result, dict) or result.get("resultType") == "input_required":
        return msg
    content = result.get("content")
    content = list(content) if isinstance(content, list) else []
    content.append({"type": "text", "text": text})
    return {**msg, "result": {**result, "content": content}}
