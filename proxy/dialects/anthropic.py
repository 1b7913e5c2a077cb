"""Anthropic Messages (`POST /v1/messages`), plain JSON and SSE streams.

Anthropic sends tool results as `tool_result` blocks inside *user* messages, so a user message
made only of tool results does not start a new turn. Its `input_tokens` exclude prompt-cache
reads and writes; Tripwire's `prompt_tokens` include them (SPEC §4.2), so they are added here.
Streams always carry usage (`message_start`, then cumulative counts in `message_delta`), so
nothing is rewritten and every chunk passes through unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from proxy.constants import TRUNCATED_MARKER
from proxy.dialects.base import (
    OP_CHAT,
    BodySniffer,
    KeepTool,
    LLMRequest,
    LLMResult,
    ToolCall,
    ToolCallBuilder,
    ToolFilter,
    ToolResult,
    Turns,
    Usage,
    as_float,
    as_int,
    error_dict,
    estimate_prompt_tokens,
    estimate_usage,
    hosted_mcp_names,
    http_error,
    listed_tools,
    loads_or_none,
    new_id,
    sse_frame,
    stream_incomplete,
)
from proxy.sse import MAX_EVENT_BYTES, BoundedText, SSEDecoder

__all__ = [
    "BLOCKED_STATUS",
    "CHAINS_RESPONSES",
    "CONVERSATIONAL",
    "DIALECT",
    "MAX_TOKENS_RECOVERY",
    "OPERATION",
    "PATHS",
    "PATH_SUFFIXES",
    "PROVIDER",
    "REFUSAL_REASON_HEADER",
    "WEBSOCKET_CALLS",
    "StreamAccumulator",
    "bad_request_error",
    "declared_tools",
    "error_body",
    "estimate_prompt_tokens",
    "parse_request",
    "parse_response",
    "render_blocked",
    "upstream_body",
    "without_tools",
]

# HTTP status to send render_blocked()'s body with
BLOCKED_STATUS = 200
DIALECT = "anthropic"
PATHS: tuple[str, ...] = ("/messages",)  # upstream-relative, after an optional /v1; POSTs only
PATH_SUFFIXES: tuple[str, ...] = ()
PROVIDER = "anthropic"
OPERATION = OP_CHAT
CONVERSATIONAL = True
CHAINS_RESPONSES = False
WEBSOCKET_CALLS = False
MAX_TOKENS_RECOVERY = False
REFUSAL_REASON_HEADER: str | None = None  # its SDKs show an error's message
JSON_TYPE = "application/json"
SSE_TYPE = "text/event-stream; charset=utf-8"


# Anthropic's error type per HTTP status (its SDK picks the exception class by status; the body's
# `type` is what a client shows)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def error_body(status: int, error: dict[str, Any]) -> bytes:
    """`{"type": "error", "error": {"type": ..., "message": ..., ...}}` with Tripwire's fields inside
    `error` (their OpenAI-style `type` replaced by Anthropic's for the status)."""
    fields = {k: v for k, v in error.items() if k != "type"}
    kind = ERROR_TYPES.get(status, "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, **fields}})


def bad_request_error(message: str) -> dict[str, Any]:
    return {"message": message}


def _blocks(content: Any) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def parse_request(body: dict) -> LLMRequest:
    raw_messages = body.get("messages")
    raw_messages = raw_messages if isinstance(raw_messages, list) else []
    steps: list[list[ToolCall]] = []
    results: list[ToolResult] = []
    turns = Turns()
    for message in raw_messages:
        if not isinstance(message, dict):
            continue
        blocks = _blocks(message.get("content"))
        if message.get("role") == "assistant":
            steps.append(
                [
                    ToolCall(
                        id=str(b.get("id") or ""), name=str(b.get("name") or ""), arguments=b.get("input")
                    )
                    for b in blocks
                    if b.get("type") == "tool_use"
                ]
            )
        elif message.get("role") == "user":
            tool_results = [b for b in blocks if b.get("type") == "tool_result"]
            for block in tool_results:
                results.append(
                    ToolResult(
                        tool_call_id=str(block.get("tool_use_id") or ""),
                        content=block.get("content"),
                        is_error=block.get("is_error") is True,
                    )
                )
            if len(tool_results) < len(blocks) or not blocks:
                turns.user([b for b in blocks if b.get("type") != "tool_result"], len(steps))
    messages: list[Any] = list(raw_messages)
    system = body.get("system")
    if system:
        messages.insert(0, {"role": "system", "content": system})
    return LLMRequest(
        dialect=DIALECT,
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        stream=body.get("stream") is True,
        messages=messages,
        temperature=as_float(body.get("temperature")),
        max_tokens=as_int(body.get("max_tokens")) or None,
        tool_results=results,
        steps=steps,
        turn_start=turns.start,
        turn_said=turns.said,
        turns_opened=turns.opened,
        client_asked_usage=True,  # Anthropic streams always carry usage
    )


def declared_tools(body: dict) -> list[dict]:
    """The tools the request makes available (client tools and server tools alike)."""
    return listed_tools(body, "tools")


def without_tools(body: dict, keep: KeepTool) -> dict | None:
    """The body without the tools `keep` refuses; None when none goes. A `tool_choice` naming a
    removed tool is dropped (the model chooses among the rest), and so is any choice when none is
    left (the API refuses one with no tools). An emptied `tools` stays, `[]`: the API accepts it,
    and a history holding `tool_use` blocks may need the field."""
    f = ToolFilter(keep)
    out = dict(body)
    servers_changed = without_mcp_servers(out, keep)
    if not f.field(out, "tools") and not servers_changed:
        return None
    if isinstance(out.get("tools"), list):
        f.choice(out, "tool_choice", tools_left=bool(out["tools"]))
    return out


def without_mcp_servers(out: dict, keep: KeepTool) -> bool:
    """The MCP connector's remote servers (`mcp_servers`, which the API calls itself): a server
    stays when each tool its `tool_configuration.allowed_tools` lists (`SERVER__TOOL`) is kept, or
    its tools are disabled; else it goes, with the `mcp_toolset` tools naming it (attack round 2:
    a deny on `fs__rm` must hold there too). True when something went."""
    servers = out.get("mcp_servers")
    if not isinstance(servers, list):
        return False
    kept, gone = [], set()
    for server in servers:
        config = server.get("tool_configuration") if isinstance(server, dict) else None
        config = config if isinstance(config, dict) else {}
        name = server.get("name") if isinstance(server, dict) else None
        names = hosted_mcp_names(name, config.get("allowed_tools")) if isinstance(name, str) else ()
        if config.get("enabled") is False or (names and all(keep(n) for n in names)):
            kept.append(server)
        else:
            gone.add(name)
    if not gone:
        return False
    out["mcp_servers"] = kept
    tools = out.get("tools")
    if isinstance(tools, list):
        out["tools"] = [
            t
            for t in tools
            if not (
                isinstance(t, dict) and t.get("type") == "mcp_toolset" and t.get("mcp_server_name") in gone
            )
        ]
    return True


def upstream_body(req: LLMRequest, body: dict) -> dict | None:
    return None


def usage_of(raw: Any) -> Usage | None:
    """Anthropic usage → ours: prompt tokens include cache reads and cache writes."""
    if not isinstance(raw, dict):
        return None
    read = as_int(raw.get("cache_read_input_tokens"))
    write = as_int(raw.get("cache_creation_input_tokens"))
    prompt = as_int(raw.get("input_tokens")) + read + write
    output = as_int(raw.get("output_tokens"))
    return Usage(prompt, output, prompt + output, cached_tokens=read, cache_creation_tokens=write)


def _content(blocks: list[dict]) -> tuple[str, list[ToolCall]]:
    text = "".join(b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str))
    calls = [
        ToolCall(id=str(b.get("id") or ""), name=str(b.get("name") or ""), arguments=b.get("input"))
        for b in blocks
        if b.get("type") == "tool_use"
    ]
    return text, calls


def parse_response(status: int, body: bytes, req: LLMRequest | None = None) -> LLMResult:
    data = loads_or_none(body)
    if status >= 400 or (isinstance(data, dict) and data.get("type") == "error"):
        return LLMResult(None, "", [], None, None, error=http_error(status, data, body))
    if not isinstance(data, dict):
        error = error_dict("unparseable_response", "messages answer is not JSON")
        return LLMResult(None, "", [], None, None, error=error)
    text, calls = _content(_blocks(data.get("content")))
    usage = usage_of(data.get("usage")) or estimate_usage(req, text, calls)
    return LLMResult(
        model=data.get("model") if isinstance(data.get("model"), str) else None,
        text=text,
        tool_calls=calls,
        usage=usage,
        stop_reason=data.get("stop_reason"),
        response_id=data.get("id") if isinstance(data.get("id"), str) else None,
    )


class StreamAccumulator:
    """Reads an Anthropic event stream as it is relayed; chunks pass through unchanged.

    Memory stays bounded: text and tool inputs are kept up to `limit_text()` characters, and an
    event larger than `MAX_EVENT_BYTES` is skipped, not parsed (`__TRUNCATED__` marks the text).
    """

    terminator = "message_stop"

    def __init__(self, req: LLMRequest) -> None:
        self.req = req
        self.status: int | None = None  # the caller may set the upstream status for error bodies
        self._sniffer = BodySniffer()
        self._decoder = SSEDecoder(MAX_EVENT_BYTES)
        self._text = BoundedText()
        self._skipping = False  # inside an oversized event
        self._tools: dict[int, ToolCallBuilder] = {}
        self._usage: dict[str, Any] = {}
        self._stop: str | None = None
        self._model: str | None = None
        self._id: str | None = None
        self._error: dict | None = None
        self._done = False

    def feed(self, chunk: bytes) -> bytes:
        if self._sniffer.feed(chunk):
            return chunk
        for event in self._decoder.feed(chunk):
            if event.oversized:
                if not self._skipping:
                    self._text.append(TRUNCATED_MARKER)
                self._text.dropped += len(event.raw)
                self._skipping = not event.complete
            elif event.data is not None:
                self._event(event.data)
        return chunk

    def limit_text(self, chars: int) -> None:
        """Keep at most `chars` characters of text and of each tool call's input."""
        self._text.limit = chars

    def finish(self, complete: bool) -> LLMResult:
        if self._sniffer.mode == "body":  # a plain body (an error, usually) answered the stream request
            result = parse_response(self.status or 200, bytes(self._sniffer.body), self.req)
            result.complete = complete
            return result
        for event in self._decoder.flush():
            if event.data is not None:
                self._event(event.data)
        calls = [self._tools[i].build() for i in sorted(self._tools)]
        text = "".join(self._text)
        ok = complete and self._done
        error = self._error
        if not ok and error is None:
            error = stream_incomplete(self.terminator)
        usage = usage_of(self._usage) if self._usage else None
        if usage is None:
            usage = estimate_usage(self.req, text, calls)
            dropped = (self._text.dropped + sum(t.parts.dropped for t in self._tools.values())) // 4
            usage.completion_tokens += dropped
            usage.total_tokens += dropped
        return LLMResult(self._model, text, calls, usage, self._stop, self._id, error, ok)

    def _event(self, data_text: str) -> None:
        data = loads_or_none(data_text)
        if not isinstance(data, dict):
            return
        kind = data.get("type")
        if kind == "message_start" and isinstance(data.get("message"), dict):
            message = data["message"]
            self._model = message.get("model") if isinstance(message.get("model"), str) else None
            self._id = message.get("id") if isinstance(message.get("id"), str) else None
            self._merge_usage(message.get("usage"))
        elif kind == "content_block_start" and isinstance(data.get("content_block"), dict):
            block = data["content_block"]
            if block.get("type") == "tool_use":
                started = ToolCallBuilder(
                    id=str(block.get("id") or ""),
                    name=str(block.get("name") or ""),
                    parts=BoundedText(self._text.limit),
                )
                self._tools[as_int(data.get("index"))] = started
                if block.get("input"):  # a complete input in the start block (not the usual {})
                    started.parts.append(orjson.dumps(block["input"]).decode())
            elif block.get("type") == "text" and isinstance(block.get("text"), str):
                self._text.append(block["text"])
        elif kind == "content_block_delta" and isinstance(data.get("delta"), dict):
            delta = data["delta"]
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                self._text.append(delta["text"])
            elif delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
                builder = self._tools.get(as_int(data.get("index")))
                if builder is not None:
                    builder.parts.append(delta["partial_json"])
        elif kind == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason"):
                self._stop = delta["stop_reason"]
            self._merge_usage(data.get("usage"))
        elif kind == "message_stop":
            self._done = True
        elif kind == "error":
            self._error = http_error(200, data, data_text.encode())

    def _merge_usage(self, usage: Any) -> None:
        """message_delta counts are cumulative: they replace, and absent ones keep the start's."""
        if isinstance(usage, dict):
            self._usage.update({k: v for k, v in usage.items() if v is not None})


def render_blocked(req: LLMRequest, text: str, guard: str) -> tuple[str, bytes]:
    """An assistant message that ends the turn normally (`end_turn`, usage zero)."""
    model = req.model or "tripwire"
    message: dict[str, Any] = {
        "id": new_id("msg_tripwire_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }
    if not req.stream:
        return JSON_TYPE, orjson.dumps(message)
    start = {**message, "content": [], "stop_reason": None}
    frames = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 0},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return SSE_TYPE, b"".join(sse_frame(data, event) for event, data in frames)


if TYPE_CHECKING:  # mypy checks this module against the contract
    from proxy.dialects import anthropic as _this
    from proxy.dialects.contract import Dialect

    _checked: Dialect = _this
