"""Trace events as OpenTelemetry spans, following the GenAI semantic conventions. Pure: no I/O and no
OpenTelemetry import (the SDK is an optional extra; `proxy.trace.otlp` turns these into SDK spans).

One span per call: an LLM_CALL is an inference span (`chat gpt-4o`), a TOOL_CALL an `execute_tool`
span, and the ERROR of a call a guard refused before it was forwarded is the span of that call with
status ERROR and the guard code as `error.type`. RUN_END closes the run's root span (`invoke_agent`).
Ids come from the trace's own ids, so nothing is remembered between events: the trace id is the
run id (a UUID is 128 bits), a call's span id the low 64 bits of its event id, the root span's those
of the run id. A function-calling TOOL_CALL points at the LLM_CALL that asked for it (its parent_id),
every other span at the root. Only metadata leaves: no prompt, answer, tool argument or result.
Semantic conventions: https://opentelemetry.io/docs/specs/semconv/gen-ai/ (spans, agent spans, MCP).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.constants import EventType
from proxy.dialects import named

AttributeValue = str | bool | int | float | list[str]

# GenAI semantic conventions (opentelemetry-semantic-conventions: gen_ai_attributes, mcp_attributes)
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
SYSTEM = "gen_ai.system"  # the older name of gen_ai.provider.name, still read by many backends
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
CACHE_CREATION_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
TEMPERATURE = "gen_ai.request.temperature"
STREAM = "gen_ai.request.stream"
TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION_ID = "gen_ai.conversation.id"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
MCP_METHOD = "mcp.method.name"
MCP_SESSION_ID = "mcp.session.id"
MCP_PROTOCOL_VERSION = "mcp.protocol.version"
JSONRPC_REQUEST_ID = "jsonrpc.request.id"
ERROR_TYPE = "error.type"
HTTP_STATUS = "http.response.status_code"
# Tripwire's own
RUN_ID = "tripwire.run_id"
SESSION_ID = "tripwire.session_id"
EVENT_ID = "tripwire.event_id"
COST_USD = "tripwire.cost_usd"
UPSTREAM = "tripwire.upstream"
MCP_SERVER = "tripwire.mcp.server"
GUARD = "tripwire.guard"
GUARD_ACTION = "tripwire.guard.action"

OP_CHAT, OP_TOOL, OP_AGENT = "chat", "execute_tool", "invoke_agent"


def operation_of(endpoint: Any) -> str:
    """gen_ai.operation.name of a recorded endpoint (the API dialect): its dialect's, else chat."""
    dialect = named(endpoint) if isinstance(endpoint, str) else None
    return dialect.OPERATION if dialect is not None else OP_CHAT


_LOW_64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class CallSpan:
    """One finished span, ready for an exporter."""

    name: str
    client: bool  # SpanKind CLIENT (a call Tripwire forwarded), else INTERNAL
    trace_id: int
    span_id: int
    parent_span_id: int | None  # None: the run's root span itself
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue]
    error: str | None  # None: status unset (ok); else the ERROR status description


def span_id_of(uuid_text: str) -> int:
    """A span id (64 bits, never 0) from an event or run id (a UUIDv4: its low bits are random)."""
    return (uuid.UUID(uuid_text).int & _LOW_64) or 1


def span_for(event: Mapping[str, Any], ts: float, *, agent: str, session_id: str) -> CallSpan | None:
    """The span of one recorded event, or None for events that are not a call (nor a run's end).

    `ts` is the event's time in epoch seconds (its envelope's `ts` to the millisecond only).
    """
    kind = event.get("event_type")
    payload = event.get("payload") or {}
    try:
        run_id = str(event["run_id"])
        trace_id = uuid.UUID(run_id).int
        event_id = str(event["event_id"])
    except (KeyError, ValueError):
        return None
    common: dict[str, AttributeValue] = {
        AGENT_NAME: agent,
        CONVERSATION_ID: session_id,
        SESSION_ID: session_id,
        RUN_ID: run_id,
    }
    root = span_id_of(run_id)
    duration_ns = max(0, int(event.get("duration_ms") or 0)) * 1_000_000
    start_ns = int(ts * 1e9)
    if kind == EventType.LLM_CALL:
        attrs, name = llm_attributes(payload, event.get("meta") or {})
        error = None if payload.get("status") == "ok" else error_text(payload.get("error"), "upstream_error")
        if error is not None:
            attrs[ERROR_TYPE] = error_type(payload.get("error"), "upstream_error")
        client, parent = True, root
    elif kind == EventType.TOOL_CALL:
        attrs, name = tool_attributes(payload, event.get("meta") or {})
        error = None if payload.get("status") == "ok" else error_text(payload.get("error"), "tool_error")
        if error is not None:
            attrs[ERROR_TYPE] = error_type(payload.get("error"), "tool_error")
        client = payload.get("source") == "mcp"  # forwarded by Tripwire; a function tool ran in the agent
        parent = root
        if payload.get("source") == "llm":
            # recorded when its result comes back: ts is the end, duration reaches back to the ask
            start_ns -= duration_ns
            if event.get("parent_id"):
                parent = span_id_of(str(event["parent_id"]))
    elif kind == EventType.ERROR:
        refused = refused_call(payload)
        if refused is None:
            return None
        attrs, name, client = refused
        error = str(payload.get("message") or payload.get("guardrail"))
        parent = root
    elif kind == EventType.RUN_END:
        return root_span(payload, ts, trace_id, root, agent, common)
    else:
        return None
    attrs.update(common)
    attrs[EVENT_ID] = event_id
    return CallSpan(
        name=name,
        client=client,
        trace_id=trace_id,
        span_id=span_id_of(event_id),
        parent_span_id=parent,
        start_ns=start_ns,
        end_ns=start_ns + duration_ns,
        attributes=attrs,
        error=error,
    )


def llm_attributes(
    payload: Mapping[str, Any], meta: Mapping[str, Any]
) -> tuple[dict[str, AttributeValue], str]:
    operation = operation_of(payload.get("endpoint"))
    response_model = payload.get("model")
    request_model = payload.get("request_model") or response_model or "unknown"
    attrs: dict[str, AttributeValue] = {OPERATION: operation, REQUEST_MODEL: str(request_model)}
    provider = payload.get("provider")
    if provider:
        attrs[PROVIDER] = attrs[SYSTEM] = str(provider)
    if response_model and response_model != "unknown" and payload.get("status") == "ok":
        attrs[RESPONSE_MODEL] = str(response_model)
    usage = payload.get("usage") or {}
    for key, attr in (
        ("prompt_tokens", INPUT_TOKENS),
        ("completion_tokens", OUTPUT_TOKENS),
        ("cached_tokens", CACHE_READ_TOKENS),
        ("cache_creation_tokens", CACHE_CREATION_TOKENS),
    ):
        if isinstance(usage.get(key), int):
            attrs[attr] = usage[key]
    if payload.get("stop_reason"):
        attrs[FINISH_REASONS] = [str(payload["stop_reason"])]
    if isinstance(payload.get("temperature"), int | float):
        attrs[TEMPERATURE] = float(payload["temperature"])
    if isinstance(payload.get("stream"), bool):
        attrs[STREAM] = payload["stream"]
    if isinstance(payload.get("cost_usd"), int | float):
        attrs[COST_USD] = float(payload["cost_usd"])
    if payload.get("upstream"):
        attrs[UPSTREAM] = str(payload["upstream"])
    if isinstance(payload.get("http_status"), int):
        attrs[HTTP_STATUS] = payload["http_status"]
    if isinstance(meta.get("ttfb_ms"), int):
        attrs[TIME_TO_FIRST_CHUNK] = meta["ttfb_ms"] / 1000
    return attrs, f"{operation} {request_model}"


def tool_attributes(
    payload: Mapping[str, Any], meta: Mapping[str, Any]
) -> tuple[dict[str, AttributeValue], str]:
    tool = str(payload.get("tool_name") or "unknown")
    attrs: dict[str, AttributeValue] = {OPERATION: OP_TOOL, TOOL_NAME: tool}
    if payload.get("source") == "mcp":
        attrs[MCP_METHOD] = "tools/call"
        if payload.get("server"):
            attrs[MCP_SERVER] = attrs[UPSTREAM] = str(payload["server"])
        if meta.get("mcp_session_id"):
            attrs[MCP_SESSION_ID] = str(meta["mcp_session_id"])
        if meta.get("jsonrpc_id") is not None:
            attrs[JSONRPC_REQUEST_ID] = str(meta["jsonrpc_id"])
        if meta.get("mcp_protocol_version"):
            attrs[MCP_PROTOCOL_VERSION] = str(meta["mcp_protocol_version"])
    else:
        attrs[TOOL_TYPE] = "function"
        if payload.get("tool_call_id"):
            attrs[TOOL_CALL_ID] = str(payload["tool_call_id"])
    return attrs, f"{OP_TOOL} {tool}"


def refused_call(payload: Mapping[str, Any]) -> tuple[dict[str, AttributeValue], str, bool] | None:
    """The span of a call a guard refused (an ERROR naming the call); None for other ERRORs (an
    upstream failure is on its LLM_CALL already, and a shadow refusal's call went on)."""
    call = payload.get("call")
    guard = payload.get("guardrail")
    if not isinstance(call, Mapping) or not guard or payload.get("shadow"):
        return None
    if call.get("kind") == "tool":
        attrs, name = tool_attributes(
            {"tool_name": call.get("tool_name"), "source": "mcp", "server": call.get("server")}, {}
        )
        client = True
    else:
        operation = operation_of(call.get("endpoint"))
        model = str(call.get("model") or "unknown")
        attrs = {OPERATION: operation, REQUEST_MODEL: model}
        if call.get("upstream"):
            attrs[UPSTREAM] = str(call["upstream"])
        name, client = f"{operation} {model}", True
    attrs[ERROR_TYPE] = attrs[GUARD] = str(guard)
    if payload.get("action"):
        attrs[GUARD_ACTION] = str(payload["action"])
    return attrs, name, client


def root_span(
    payload: Mapping[str, Any],
    ts: float,
    trace_id: int,
    span_id: int,
    agent: str,
    common: dict[str, AttributeValue],
) -> CallSpan:
    """The run's `invoke_agent` span, from RUN_END: its summary has the run's duration and totals."""
    summary = payload.get("summary") or {}
    end_ns = int(ts * 1e9)
    start_ns = end_ns - max(0, int(summary.get("duration_ms") or 0)) * 1_000_000
    attrs: dict[str, AttributeValue] = {OPERATION: OP_AGENT, **common}
    for key in ("llm_calls", "tool_calls", "errors", "loop_warnings", "total_tokens"):
        if isinstance(summary.get(key), int):
            attrs[f"tripwire.{key}"] = summary[key]
    if isinstance(summary.get("cost_usd"), int | float):
        attrs[COST_USD] = float(summary["cost_usd"])
    reason = str(payload.get("reason") or "")
    if reason:
        attrs["tripwire.end_reason"] = reason
    error = None
    if payload.get("status") == "error":
        error = f"run ended: {reason or 'error'}"
        attrs[ERROR_TYPE] = reason or "error"
    return CallSpan(
        name=f"{OP_AGENT} {agent}",
        client=False,
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=None,
        start_ns=start_ns,
        end_ns=end_ns,
        attributes=attrs,
        error=error,
    )


def error_type(error: Any, default: str) -> str:
    if isinstance(error, Mapping) and error.get("error_type"):
        return str(error["error_type"])
    return default


def error_text(error: Any, default: str) -> str:
    if isinstance(error, Mapping) and error.get("message"):
        return str(error["message"])[:500]
    return error_type(error, default)
