"""OpenAI Chat Completions (`POST /v1/chat/completions`), plain JSON and SSE streams.

Streaming usage must be exact even when the client did not ask for it (SPEC §4.2): the request
sent upstream gets `stream_options.include_usage`, and the extra usage-only chunk is removed from
what the client receives, so its SDK sees the same stream it would have seen without Tripwire. A
usage-only chunk is OpenAI's `"choices": []` with `usage`, or the shape LiteLLM's proxy sends,
`"choices": [{"index": 0, "delta": {}}]` with `usage`: every choice without a finish_reason,
logprobs or any non-empty delta field. A chunk carrying content or a finish_reason is never removed.
"""

from __future__ import annotations

import time
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import orjson

from proxy.constants import TRUNCATED_MARKER
from proxy.dialects.base import (
    CODEX_REASON_HEADER,
    NO_ITEMS,
    OP_CHAT,
    PROVIDER_OPENAI,
    BodySniffer,
    KeepTool,
    LLMRequest,
    LLMResult,
    ParseState,
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
    http_error,
    listed_tools,
    loads_or_none,
    new_id,
    openai_bad_request_error,
    openai_error_body,
    openai_usage,
    parse_arguments,
    sse_frame,
    stream_incomplete,
)
from proxy.sse import MAX_EVENT_BYTES, BoundedText, SSEDecoder, SSEEvent

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
    "parse_request_from",
    "parse_response",
    "render_blocked",
    "upstream_body",
    "without_tools",
]

# HTTP status to send render_blocked()'s body with
BLOCKED_STATUS = 200
DIALECT = "openai_chat"
PATHS: tuple[str, ...] = ("/chat/completions",)  # upstream-relative, after an optional /v1; POSTs only
PATH_SUFFIXES: tuple[str, ...] = (
    "/chat/completions",
)  # deployment-style prefixes (Azure: /openai/deployments/NAME/...)
PROVIDER = PROVIDER_OPENAI
OPERATION = OP_CHAT
CONVERSATIONAL = True
CHAINS_RESPONSES = False
WEBSOCKET_CALLS = False
MAX_TOKENS_RECOVERY = True
REFUSAL_REASON_HEADER: str | None = CODEX_REASON_HEADER
error_body = openai_error_body
bad_request_error = openai_bad_request_error
JSON_TYPE = "application/json"
SSE_TYPE = "text/event-stream; charset=utf-8"


def parse_request(body: dict) -> LLMRequest:
    return parse_request_from(body, None)


def parse_request_from(body: dict, prior: ParseState | None) -> LLMRequest:
    """`parse_request`, going on from `prior`: the caller has proven that this request's first
    `prior.messages` messages are those `prior` read (proxy/history.py), so only the rest is read."""
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    if prior is not None and prior.messages <= len(messages):
        steps, results = list(prior.steps), list(prior.tool_results)
        turns = Turns(prior.turn_start, prior.turn_said)
        new = messages[prior.messages :]
    else:
        prior = None
        steps, results, turns = [], [], Turns()
        new = messages
    at = len(messages) - len(new)
    for index, message in enumerate(new, at):
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "assistant":
            steps.append(_message_tool_calls(message, index))
        elif role == "tool":
            results.append(
                ToolResult(
                    tool_call_id=str(message.get("tool_call_id") or ""), content=message.get("content")
                )
            )
        elif role == "function":  # the legacy result of the step's `function_call` (no id of its own)
            results.append(ToolResult(tool_call_id=_legacy_id(index - 1), content=message.get("content")))
        elif role == "user":
            turns.user(message.get("content"), len(steps))
    options = body.get("stream_options")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    temperature = body.get("temperature")
    model = body.get("model")
    return LLMRequest(
        dialect=DIALECT,
        model=model if isinstance(model, str) else None,
        stream=body.get("stream") is True,
        messages=messages,
        temperature=as_float(temperature) if temperature is not None else None,
        max_tokens=(as_int(max_tokens) or None) if max_tokens is not None else None,
        tool_results=results,
        steps=steps,
        turn_start=turns.start,
        turn_said=turns.said,
        turns_opened=turns.opened,
        client_asked_usage=isinstance(options, dict) and options.get("include_usage") is True,
        parsed=ParseState(len(messages), steps or NO_ITEMS, results or NO_ITEMS, turns.start, turns.said),
        continues=prior,
    )


def _message_tool_calls(message: dict, index: int = -1) -> list[ToolCall]:
    """The step's calls: its `tool_calls` (functions, and custom tools with their free-form `input`),
    and a legacy `function_call` (issue 30: judged as any call, e.g. a denied tool's)."""
    calls = []
    for call in message.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        custom = call.get("custom")
        if not isinstance(function, dict) and isinstance(custom, dict):
            name, raw = custom.get("name"), custom.get("input")
            calls.append(ToolCall(id=str(call.get("id") or ""), name=str(name or ""), arguments=raw))
            continue
        if not isinstance(function, dict):
            function = {}
        call_id, name, raw = call.get("id"), function.get("name"), function.get("arguments")
        if type(call_id) is str and type(name) is str and type(raw) is str and len(raw) <= _KEPT_ARGUMENTS:
            calls.append(_tool_call(call_id, name, raw))
        else:
            calls.append(
                ToolCall(id=str(call_id or ""), name=str(name or ""), arguments=parse_arguments(raw))
            )
    legacy = message.get("function_call")
    if isinstance(legacy, dict) and not calls:
        name = legacy.get("name")
        calls.append(
            ToolCall(
                id=_legacy_id(index), name=str(name or ""), arguments=parse_arguments(legacy.get("arguments"))
            )
        )
    return calls


def _legacy_id(index: int) -> str:
    """A legacy `function_call` has no id: its message's place in the conversation stands for one."""
    return f"function_call:{index}"


# Agents resend every earlier tool call on every request: a call seen before is not parsed again
# (its arguments are read-only to every reader). Bounded: short arguments, recent calls.
_KEPT_ARGUMENTS = 4096


@lru_cache(maxsize=4096)
def _tool_call(call_id: str, name: str, raw: str) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=parse_arguments(raw))


def declared_tools(body: dict) -> list[dict]:
    """The tools the request makes available: `tools`, then the legacy `functions`."""
    return listed_tools(body, "tools", "functions")


def without_tools(body: dict, keep: KeepTool) -> dict | None:
    """The body without the tools `keep` refuses (`tools`, legacy `functions`); None when none goes.
    A `tool_choice` / `function_call` naming a removed tool is dropped (the model chooses among the
    rest); a list left empty goes with its options, which the API refuses without tools."""
    f = ToolFilter(keep)
    out = dict(body)
    changed = False
    if f.field(out, "tools"):
        changed = True
        if not out["tools"]:
            del out["tools"]
            out.pop("parallel_tool_calls", None)
        f.choice(out, "tool_choice", tools_left="tools" in out)
    if f.field(out, "functions"):
        changed = True
        if not out["functions"]:
            del out["functions"]
        f.choice(out, "function_call", tools_left="functions" in out)
    return out if changed else None


def upstream_body(req: LLMRequest, body: dict) -> dict | None:
    """Ask a streaming upstream for the usage chunk when the client did not."""
    if not req.stream or req.client_asked_usage:
        return None
    options = body.get("stream_options")
    options = dict(options) if isinstance(options, dict) else {}
    options["include_usage"] = True
    return {**body, "stream_options": options}


def parse_response(status: int, body: bytes, req: LLMRequest | None = None) -> LLMResult:
    data = loads_or_none(body)
    if status >= 400 or (isinstance(data, dict) and data.get("error")):
        return LLMResult(None, "", [], None, None, error=http_error(status, data, body))
    if not isinstance(data, dict):
        error = error_dict("unparseable_response", "chat completion answer is not JSON")
        return LLMResult(None, "", [], None, None, error=error)
    text, calls, stop = "", [], None
    choices = data.get("choices")
    if type(choices) is list and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if not isinstance(message, dict):
            message = {}
        content = message.get("content")
        text = content if isinstance(content, str) else _parts_text(content)
        calls = _message_tool_calls(message) if "tool_calls" in message else []
        stop = choices[0].get("finish_reason")
    usage = openai_usage(data.get("usage")) or estimate_usage(req, text, calls)
    model, response_id = data.get("model"), data.get("id")
    return LLMResult(
        model if isinstance(model, str) else None,  # (positional: one answer per call)
        text,
        calls,
        usage,
        stop,
        response_id if isinstance(response_id, str) else None,
    )


def _parts_text(content: Any) -> str:
    if not isinstance(content, list):
        return ""
    return "".join(
        p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
    )


class StreamAccumulator:
    """Reads a chat SSE stream as it is relayed; drops the usage chunk the proxy injected.

    Pass-through (client asked for usage, or the request was not a stream) returns every chunk
    unchanged. Filtering returns each complete event byte-identical as soon as its blank line
    arrives, minus the usage-only chunk; only the current partial event is held back, and
    `flush()` hands it over when the upstream body ends. A plain (error) body answering the
    stream request passes through untouched.

    Memory stays bounded whatever the stream: the text and each tool call's arguments are kept up
    to `limit_text()` characters (the rest is counted for usage estimates), and an event larger
    than `MAX_EVENT_BYTES` is relayed piece by piece as it arrives, not parsed (the recorded text
    gets `__TRUNCATED__` where its content was skipped).
    """

    terminator = "[DONE]"

    @property
    def rewrites(self) -> bool:
        """Bytes may be dropped (the injected usage chunk): the forwarder must not pass Content-Length."""
        return self.filtering

    def __init__(self, req: LLMRequest) -> None:
        self.req = req
        self.status: int | None = None  # the caller may set the upstream status for error bodies
        self._sniffer = BodySniffer()
        self.filtering = req.stream and not req.client_asked_usage
        self._decoder = SSEDecoder(MAX_EVENT_BYTES)
        self._text = BoundedText()
        self._calls: dict[int, ToolCallBuilder] = {}
        self._skipping = False  # inside an oversized event
        self._usage: Usage | None = None
        self._stop: str | None = None
        self._model: str | None = None
        self._id: str | None = None
        self._error: dict | None = None
        self._done = False
        # the previous chunk ended an event with CR: an LF starting the next chunk completes that
        # CRLF, so it goes (or is dropped) with that event, not with the next one
        self._prev_cr = False
        self._prev_sent = True
        self._strip_lf = False

    def limit_text(self, chars: int) -> None:
        """Keep at most `chars` characters of text and of each tool call's arguments."""
        self._text.limit = chars

    def feed(self, chunk: bytes) -> bytes:
        if not chunk:
            return b""
        if self._sniffer.feed(chunk):
            return chunk
        events = self._decoder.feed(chunk)
        if not self.filtering:
            for event in events:
                self._event(event)
            return chunk
        out = bytearray()
        if self._prev_cr and chunk[:1] == b"\n":
            if self._prev_sent:
                out += b"\n"
            self._strip_lf = True
        for event in events:
            raw = event.raw
            if self._strip_lf:
                raw, self._strip_lf = raw[1:], False
            drop = self._event(event)
            if not drop:
                out += raw
            self._prev_sent = not drop
        self._prev_cr = bool(events) and not self._decoder.pending and chunk.endswith(b"\r")
        return bytes(out)

    def flush(self) -> bytes:
        """At the end of the upstream body: the unterminated tail the filter still holds, if any.

        SSE clients discard such a tail, but it is the upstream's bytes, so it is forwarded too
        (unless it is the injected usage chunk).
        """
        if not self.filtering or self._sniffer.mode != "sse":
            return b""
        out = bytearray()
        for event in self._decoder.flush():
            raw = event.raw
            if self._strip_lf:
                raw, self._strip_lf = raw[1:], False
            if not self._event(event):
                out += raw
        return bytes(out)

    def finish(self, complete: bool) -> LLMResult:
        if self._sniffer.mode == "body":
            return _body_result(self, complete)
        for event in self._decoder.flush():
            self._event(event)
        calls = [self._calls[i].build() for i in sorted(self._calls)]
        text = "".join(self._text)
        error = self._error
        ok = complete and self._done
        if not ok and error is None:
            error = stream_incomplete(self.terminator)
        usage = self._usage
        if usage is None:
            usage = estimate_usage(self.req, text, calls)
            dropped = (self._text.dropped + sum(c.parts.dropped for c in self._calls.values())) // 4
            usage.completion_tokens += dropped
            usage.total_tokens += dropped
        return LLMResult(self._model, text, calls, usage, self._stop, self._id, error, ok)

    @staticmethod
    def parse_body(status: int, body: bytes, req: LLMRequest) -> LLMResult:
        return parse_response(status, body, req)

    def _event(self, event: SSEEvent) -> bool:
        """Account for one event; True when it is the injected usage chunk to drop."""
        if event.oversized:  # too big to parse (and never the usage chunk): its content is lost
            if not self._skipping:
                self._text.append(TRUNCATED_MARKER)
            self._text.dropped += len(event.raw)
            self._skipping = not event.complete
            return False
        if event.data is None:
            return False
        if event.data.strip() == "[DONE]":
            self._done = True
            return False
        data = loads_or_none(event.data)
        if not isinstance(data, dict):
            return False
        if data.get("error"):
            self._error = http_error(200, data, event.data.encode())
            return False
        if isinstance(data.get("model"), str):
            self._model = data["model"]
        if isinstance(data.get("id"), str):
            self._id = data["id"]
        usage = openai_usage(data.get("usage"))
        if usage is not None:
            self._usage = usage
        choices = data.get("choices")
        if not isinstance(choices, list):
            return False
        for choice in choices:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._choice(choice)
        return self.filtering and usage is not None and all(_usage_only_choice(c) for c in choices)

    def _choice(self, choice: dict) -> None:
        if choice.get("finish_reason"):
            self._stop = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        if isinstance(delta.get("content"), str):
            self._text.append(delta["content"])
        for part in delta.get("tool_calls") or []:
            if not isinstance(part, dict):
                continue
            index = as_int(part.get("index"))
            builder = self._calls.get(index)
            if builder is None:
                builder = self._calls[index] = ToolCallBuilder(parts=BoundedText(self._text.limit))
            if part.get("id"):
                builder.id = str(part["id"])
            function = part.get("function")
            if isinstance(function, dict):
                if function.get("name") and not builder.name:
                    builder.name = str(function["name"])
                if isinstance(function.get("arguments"), str):
                    builder.parts.append(function["arguments"])


def _blank(value: Any) -> bool:
    return value is None or value in ("", [], {})


def _usage_only_choice(choice: Any) -> bool:
    """A choice in a usage chunk: no finish_reason, no logprobs, no delta (or text) with content."""
    if not isinstance(choice, dict):
        return False
    if not (_blank(choice.get("finish_reason")) and _blank(choice.get("logprobs"))):
        return False
    if not _blank(choice.get("text")):  # legacy completions
        return False
    delta = choice.get("delta")
    return delta is None or (isinstance(delta, dict) and all(_blank(v) for v in delta.values()))


def _body_result(acc: StreamAccumulator, complete: bool) -> LLMResult:
    """A plain body answered the streaming request (an error, usually): parse it as one."""
    result = type(acc).parse_body(acc.status or 200, bytes(acc._sniffer.body), acc.req)
    result.complete = complete
    return result


def render_blocked(req: LLMRequest, text: str, guard: str, now: float | None = None) -> tuple[str, bytes]:
    """A normal assistant answer (finish_reason "stop", usage zero) saying what was blocked."""
    created = int(now if now is not None else time.time())
    rid = new_id("chatcmpl-tripwire-")
    model = req.model or "tripwire"
    if not req.stream:
        body = {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
        return JSON_TYPE, orjson.dumps(body)

    def chunk(delta: dict, finish: str | None) -> dict:
        return {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    frames = [
        chunk({"role": "assistant", "content": ""}, None),
        chunk({"content": text}, None),
        chunk({}, "stop"),
    ]
    if req.client_asked_usage:
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        frames.append({**chunk({}, None), "choices": [], "usage": usage})
    return SSE_TYPE, b"".join(sse_frame(f) for f in frames) + sse_frame("[DONE]")


if TYPE_CHECKING:  # mypy checks this module against the contract
    from proxy.dialects import openai_chat as _this
    from proxy.dialects.contract import Dialect

    _checked: Dialect = _this
