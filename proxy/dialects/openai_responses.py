"""OpenAI Responses API (`POST /v1/responses`), plain JSON and SSE streams.

The input is a flat list of items: messages, the tool calls the model made earlier and the outputs
that answer them. Consecutive assistant-side items (assistant message, reasoning, tool calls) form one
step. A request that continues a chain with `previous_response_id` carries no history; the pipeline
keeps the chain's tool calls itself.

Tool calls come in two kinds. The agent runs `function_call`, `custom_tool_call`, `local_shell_call`,
`shell_call`, `apply_patch_call`, `computer_call` and a client `tool_search_call`, and answers each
with its `*_output` item in a later request (Codex answers a `local_shell_call` with a
`function_call_output`). The provider runs the hosted ones (`web_search_call`, `file_search_call`,
`code_interpreter_call`, `image_generation_call`, `mcp_call`, a server `tool_search_call`): the item
itself carries the outcome, so their `ToolCall`s are `hosted` with their `result`. Tools are declared
in `tools`, in `additional_tools` input items (Codex's default model declares them only there) and by
a `tool_search_output`; `declared_tools` lists them all. `additional_tools` and `compaction` items are
context: they end a step without starting a turn.
Streams always end with `response.completed` (or `.incomplete` / `.failed`) carrying usage, so
nothing is rewritten and every chunk passes through unchanged.
"""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, Any

import orjson

from proxy.constants import TRUNCATED_MARKER
from proxy.dialects import codex_exec
from proxy.dialects.base import (
    CODEX_REASON_HEADER,
    OP_CHAT,
    PROVIDER_OPENAI,
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
    http_error,
    loads_or_none,
    new_id,
    openai_bad_request_error,
    openai_error_body,
    parse_arguments,
    sse_frame,
    stream_incomplete,
    tool_name,
)
from proxy.sse import MAX_EVENT_BYTES, BoundedText, SSEDecoder, SSEEvent

__all__ = [
    "BLOCKED_STATUS",
    "CALL_ITEM_TYPES",
    "CHAINS_RESPONSES",
    "CLIENT_ITEM_TYPES",
    "CONVERSATIONAL",
    "DIALECT",
    "MAX_TOKENS_RECOVERY",
    "OPERATION",
    "PATHS",
    "PATH_SUFFIXES",
    "PROVIDER",
    "REFUSAL_REASON_HEADER",
    "SYNTHETIC_PREFIX",
    "WEBSOCKET_CALLS",
    "StreamAccumulator",
    "bad_request_error",
    "declared_tools",
    "error_body",
    "estimate_prompt_tokens",
    "is_synthetic_response_id",
    "parse_request",
    "parse_response",
    "render_blocked",
    "rewrite_previous_response",
    "tool_name",
    "upstream_body",
    "without_tools",
]

# HTTP status to send render_blocked()'s body with
BLOCKED_STATUS = 200
DIALECT = "openai_responses"
PATHS: tuple[str, ...] = ("/responses",)  # upstream-relative, after an optional /v1; POSTs only
PATH_SUFFIXES: tuple[str, ...] = ()
PROVIDER = PROVIDER_OPENAI
OPERATION = OP_CHAT
CONVERSATIONAL = True
CHAINS_RESPONSES = True
WEBSOCKET_CALLS = True
MAX_TOKENS_RECOVERY = False
REFUSAL_REASON_HEADER: str | None = CODEX_REASON_HEADER
error_body = openai_error_body
bad_request_error = openai_bad_request_error
JSON_TYPE = "application/json"
SSE_TYPE = "text/event-stream; charset=utf-8"
SYNTHETIC_PREFIX = "resp_tripwire_"
# call item type -> (tool name, or None for the item's own `name`; the fields holding its arguments)
_AGENT_CALLS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "function_call": (None, ("arguments",)),
    "custom_tool_call": (None, ("input",)),
    "local_shell_call": ("local_shell", ("action",)),
    "shell_call": ("shell", ("action",)),
    "apply_patch_call": ("apply_patch", ("operation",)),
    "computer_call": ("computer", ("action", "actions")),
    "tool_search_call": ("tool_search", ("arguments",)),
}
_HOSTED_CALLS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "web_search_call": ("web_search", ("action",)),
    "file_search_call": ("file_search", ("queries",)),
    "code_interpreter_call": ("code_interpreter", ("code",)),
    "image_generation_call": ("image_generation", ("revised_prompt", "action")),
    "mcp_call": (None, ("arguments",)),
}
_CALL_TYPES = frozenset((*_AGENT_CALLS, *_HOSTED_CALLS))
_OUTPUT_TYPES = frozenset(
    (
        "function_call_output",
        "custom_tool_call_output",
        "local_shell_call_output",
        "shell_call_output",
        "apply_patch_call_output",
        "computer_call_output",
        "tool_search_output",
    )
)
# items that are context, neither a turn's start nor a step: declared tools, a compacted history
_CONTEXT_TYPES = frozenset(("additional_tools", "compaction", "compaction_trigger"))
# For lineage (proxy/episodes.py): the item types an answer holds as calls, each named by its
# `call_id` (else `id`), as `ToolCall.id` names it; and the role-less items only a client sends
# (the rest of the role-less items an answer holds: reasoning, mcp_list_tools, mcp_approval_request)
CALL_ITEM_TYPES: tuple[str, ...] = tuple(sorted(_CALL_TYPES))
CLIENT_ITEM_TYPES = _OUTPUT_TYPES | {"item_reference", "mcp_approval_response", "compaction_trigger"}
# (a hosted MCP call's arguments stream too, but its whole item is what is kept)
_ARGUMENT_DELTAS = ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta")
_TERMINAL = ("response.completed", "response.incomplete", "response.failed")
# an oversized event's type, from its first bytes when it has no `event:` line
_TYPE = re.compile(rb'"type"\s*:\s*"([A-Za-z0-9_.]+)"')
_USAGE = re.compile(r'"usage"\s*:\s*')
# how much of an oversized final event is kept to find its usage (the response's last fields)
TAIL_BYTES = 64 * 1024


def is_synthetic_response_id(response_id: str | None) -> bool:
    """True for the id of a blocked answer Tripwire made up (the upstream never saw it)."""
    return isinstance(response_id, str) and response_id.startswith(SYNTHETIC_PREFIX)


def _type(item: dict) -> str:
    """An item's type ("" when it is not a string: a hostile body's list is no set member)."""
    kind = item.get("type")
    return kind if isinstance(kind, str) else ""


def _is_hosted(item: dict) -> bool:
    kind = _type(item)
    return kind in _HOSTED_CALLS or (kind == "tool_search_call" and item.get("execution") == "server")


def _tool_call(item: dict) -> ToolCall:
    """The ToolCall of a call item (one of `_CALL_TYPES`)."""
    kind = _type(item)
    name, fields = _AGENT_CALLS.get(kind) or _HOSTED_CALLS[kind]
    raw: Any = None
    for key in fields:
        if item.get(key) is not None:
            raw = item[key]
            break
    call = ToolCall(
        id=str(item.get("call_id") or item.get("id") or ""),
        name=name or str(item.get("name") or ""),
        arguments=parse_arguments(raw) if raw is not None else {},
    )
    if _is_hosted(item):
        call.hosted = True
        call.result = _hosted_result(item, call.id)
    return call


def _calls_of(item: dict) -> list[ToolCall]:
    """A call item's ToolCall; a Codex code-mode `exec` call's followed by those its script makes."""
    return codex_exec.with_nested(_tool_call(item), item)


def _hosted_result(item: dict, call_id: str) -> ToolResult:
    """What a hosted call's item says it gave (an image's bytes left out: its status stands for it)."""
    kind = item.get("type")
    failed = item.get("status") == "failed" or bool(item.get("error"))
    if kind == "mcp_call":
        content = item.get("error") or item.get("output")
    elif kind == "file_search_call":
        content = item.get("results")
    elif kind == "code_interpreter_call":
        content = item.get("outputs")
    else:
        content = item.get("status")
    return ToolResult(call_id, content, failed)


def _result_of(item: dict) -> ToolResult:
    """The ToolResult of an output item (one of `_OUTPUT_TYPES`)."""
    kind = item.get("type")
    # the SDK's local_shell_call_output names its call by `id`; the others by `call_id`
    call_id = item.get("call_id") or (item.get("id") if kind == "local_shell_call_output" else None)
    content = item.get("tools") if kind == "tool_search_output" else item.get("output")
    failed = kind == "apply_patch_call_output" and item.get("status") == "failed"
    return ToolResult(tool_call_id=str(call_id or ""), content=content, is_error=failed)


def declared_tools(body: dict) -> list[dict]:
    """Every tool the request makes available, in order: its `tools`, those of its `additional_tools`
    items and those a `tool_search_output` loaded, a namespace's tools in its place. The definitions
    themselves, as they are in the body (what a tool permission filter acts on)."""
    sources: list[Any] = [body.get("tools")]
    raw_input = body.get("input")
    for item in raw_input if isinstance(raw_input, list) else []:
        if isinstance(item, dict) and item.get("type") in ("additional_tools", "tool_search_output"):
            sources.append(item.get("tools"))
    found: list[dict] = []
    # an explicit stack of iterators, not recursion: namespaces may nest as deep as a body does
    stack = [iter(tools) for tools in reversed(sources) if isinstance(tools, list)]
    while stack:
        tool = next(stack[-1], _END)
        if tool is _END:
            stack.pop()
        elif (
            isinstance(tool, dict) and tool.get("type") == "namespace" and isinstance(tool.get("tools"), list)
        ):
            stack.append(iter(tool["tools"]))
        elif isinstance(tool, dict):
            found.append(tool)
    return found


_END = object()


def without_tools(body: dict, keep: KeepTool) -> dict | None:
    """The body without the tools `keep` refuses, wherever `declared_tools` finds them (`tools`, a
    namespace's tools, `additional_tools` and `tool_search_output` items); None when none goes. A
    `tool_choice` naming a removed tool is dropped, an `allowed_tools` one loses it, and one forcing
    a call (`required`) goes when no tool is left."""
    f = ToolFilter(keep)
    out = dict(body)
    changed = f.field(out, "tools")
    raw_input = body.get("input")
    if isinstance(raw_input, list):
        items: list[Any] | None = None
        for i, item in enumerate(raw_input):
            if isinstance(item, dict) and item.get("type") in ("additional_tools", "tool_search_output"):
                kept = f.tools(item.get("tools"))
                if kept is not None:
                    items = list(raw_input) if items is None else items
                    items[i] = {**item, "tools": kept}
        if items is not None:
            out["input"] = items
            changed = True
    if not changed:
        return None
    f.choice(out, "tool_choice", tools_left=bool(declared_tools(out)))
    return out


def parse_request(body: dict) -> LLMRequest:
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        items: list[Any] = [{"role": "user", "content": raw_input}]
    else:
        items = list(raw_input) if isinstance(raw_input, list) else []
    steps: list[list[ToolCall]] = []
    results: list[ToolResult] = []
    turns = Turns()
    current: list[ToolCall] | None = None
    nested: dict[str, list[ToolCall]] = {}  # exec call id -> the calls its script makes
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = _type(item) if item.get("type") else "message"
        role = item.get("role")
        if kind in _OUTPUT_TYPES:
            result = _result_of(item)
            results.append(result)
            if result.tool_call_id in nested:
                results.extend(codex_exec.nested_results(result, nested[result.tool_call_id]))
            current = None
        elif kind in _CONTEXT_TYPES:
            current = None
        elif kind == "message" and role != "assistant":
            if role == "user":
                turns.user(item.get("content"), len(steps))
            current = None
        else:  # assistant message, reasoning, tool calls (the agent's and hosted ones)
            if current is None:
                current = []
                steps.append(current)
            if kind in _CALL_TYPES:
                call, *inside = _calls_of(item)
                current.append(call)
                if inside:
                    current.extend(inside)
                    nested[call.id] = inside
                if call.result is not None:  # hosted: its outcome is in the item, no output answers it
                    results.append(call.result)
    messages: list[Any] = list(items)
    instructions = body.get("instructions")
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    previous = body.get("previous_response_id")
    return LLMRequest(
        dialect=DIALECT,
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        stream=body.get("stream") is True,
        messages=messages,
        temperature=as_float(body.get("temperature")),
        max_tokens=as_int(body.get("max_output_tokens")) or None,
        tool_results=results,
        steps=steps,
        turn_start=turns.start,
        turn_said=turns.said,
        turns_opened=turns.opened,
        previous_response_id=previous if isinstance(previous, str) else None,
        client_asked_usage=True,  # the final response event always carries usage
    )


def upstream_body(req: LLMRequest, body: dict) -> dict | None:
    return None


def rewrite_previous_response(body: dict, parent_id: str | None, synthetic_text: str) -> dict:
    """A request that continues a synthetic (blocked) answer, made to continue its real parent.

    The upstream never saw the synthetic response, so its text goes in as an assistant input item
    before the request's own input, and `previous_response_id` becomes the real parent (or goes).
    """
    raw_input = body.get("input")
    own = [{"role": "user", "content": raw_input}] if isinstance(raw_input, str) else list(raw_input or [])
    rewritten = {**body, "input": [{"role": "assistant", "content": synthetic_text}, *own]}
    if parent_id:
        rewritten["previous_response_id"] = parent_id
    else:
        rewritten.pop("previous_response_id", None)
    return rewritten


def usage_of(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    prompt = as_int(raw.get("input_tokens"))
    output = as_int(raw.get("output_tokens"))
    details = raw.get("input_tokens_details")
    if not isinstance(details, dict):
        details = {}
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=output,
        total_tokens=as_int(raw.get("total_tokens")) or prompt + output,
        cached_tokens=as_int(details.get("cached_tokens")),
        cache_creation_tokens=as_int(details.get("cache_write_tokens")),
    )


def _output(items: Any) -> tuple[str, list[ToolCall]]:
    text: list[str] = []
    calls: list[ToolCall] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            for part in item.get("content") or []:
                if (
                    isinstance(part, dict)
                    and part.get("type") == "output_text"
                    and isinstance(part.get("text"), str)
                ):
                    text.append(part["text"])
        elif _type(item) in _CALL_TYPES:
            calls.extend(_calls_of(item))
    return "".join(text), calls


def _result(data: dict, req: LLMRequest | None) -> LLMResult:
    text, calls = _output(data.get("output"))
    status = data.get("status")
    stop = status
    details = data.get("incomplete_details")
    if status == "incomplete" and isinstance(details, dict) and details.get("reason"):
        stop = details["reason"]
    error = None
    if status == "failed" or isinstance(data.get("error"), dict):
        err = data.get("error")
        if not isinstance(err, dict):
            err = {}
        error = error_dict(str(err.get("code") or "response_failed"), str(err.get("message") or ""), err)
    usage = usage_of(data.get("usage")) or estimate_usage(req, text, calls)
    return LLMResult(
        model=data.get("model") if isinstance(data.get("model"), str) else None,
        text=text,
        tool_calls=calls,
        usage=usage,
        stop_reason=stop if isinstance(stop, str) else None,
        response_id=data.get("id") if isinstance(data.get("id"), str) else None,
        error=error,
    )


def parse_response(status: int, body: bytes, req: LLMRequest | None = None) -> LLMResult:
    data = loads_or_none(body)
    if status >= 400:
        return LLMResult(None, "", [], None, None, error=http_error(status, data, body))
    if not isinstance(data, dict):
        error = error_dict("unparseable_response", "responses answer is not JSON")
        return LLMResult(None, "", [], None, None, error=error)
    return _result(data, req)


class StreamAccumulator:
    """Reads a Responses event stream as it is relayed; chunks pass through unchanged.

    Memory stays bounded: text and tool arguments are kept up to `limit_text()` characters, and an
    event larger than `MAX_EVENT_BYTES` is not parsed. The final event repeats the whole output, so
    a long answer makes it oversized: it still ends the stream, its usage is read from its last
    `TAIL_BYTES` (where the response's `usage` field is), and the output is what the deltas said.
    A skipped delta leaves `__TRUNCATED__` in the text.
    """

    terminator = "response.completed"

    def __init__(self, req: LLMRequest) -> None:
        self.req = req
        self.status: int | None = None  # the caller may set the upstream status for error bodies
        self._sniffer = BodySniffer()
        self._decoder = SSEDecoder(MAX_EVENT_BYTES)
        self._text = BoundedText()
        self._big_kind: str | None = None  # the type of the oversized event being skipped
        self._big_tail = b""
        self._calls: dict[int, ToolCallBuilder] = {}  # calls whose arguments are streaming
        # whole call items (output_item.done; hosted ones as added), an exec call's nested calls after it
        self._done: dict[int, list[ToolCall]] = {}
        self._model: str | None = None
        self._id: str | None = None
        self._final: LLMResult | None = None
        self._error: dict | None = None

    def feed(self, chunk: bytes) -> bytes:
        if self._sniffer.feed(chunk):
            return chunk
        for event in self._decoder.feed(chunk):
            if event.oversized:
                self._oversized(event)
            elif event.data is not None:
                self._event(event.data)
        return chunk

    def limit_text(self, chars: int) -> None:
        """Keep at most `chars` characters of text and of each tool call's arguments."""
        self._text.limit = chars

    def finish(self, complete: bool) -> LLMResult:
        if self._sniffer.mode == "body":  # a plain body (an error, usually) answered the stream request
            result = parse_response(self.status or 200, bytes(self._sniffer.body), self.req)
            result.complete = complete
            return result
        for event in self._decoder.flush():
            if event.data is not None:
                self._event(event.data)
        final = self._final
        ok = complete and final is not None
        if final is None:
            calls = self._streamed_calls()
            text = "".join(self._text)
            final = LLMResult(self._model, text, calls, self._estimate(text, calls), None, self._id, None, ok)
        final.complete = ok
        if self._error is not None and final.error is None:
            final.error = self._error
        if not ok and final.error is None:
            final.error = stream_incomplete(self.terminator)
        return final

    def _streamed_calls(self) -> list[ToolCall]:
        """The calls the events announced, in output order: whole items where they came, else what
        the argument deltas said."""
        calls: list[ToolCall] = []
        for i in sorted(self._calls.keys() | self._done.keys()):
            calls.extend(self._done[i] if i in self._done else (self._calls[i].build(),))
        return calls

    def _estimate(self, text: str, calls: list[ToolCall]) -> Usage:
        usage = estimate_usage(self.req, text, calls)
        dropped = (self._text.dropped + sum(c.parts.dropped for c in self._calls.values())) // 4
        usage.completion_tokens += dropped
        usage.total_tokens += dropped
        return usage

    def _oversized(self, event: SSEEvent) -> None:
        """A piece of an event too large to parse: note its type; keep a final event's tail."""
        if self._big_kind is None:
            match = _TYPE.search(event.raw, 0, 4096)
            self._big_kind = event.event or (match.group(1).decode() if match else "")
            self._big_tail = b""
            if self._big_kind.endswith(".delta"):  # its content is lost (the .done events repeat it)
                self._text.append(TRUNCATED_MARKER)
        if self._big_kind.endswith(".delta"):
            self._text.dropped += len(event.raw)
        elif self._big_kind in _TERMINAL:
            self._big_tail = (self._big_tail + event.raw)[-TAIL_BYTES:]
        if event.complete:
            kind, tail = self._big_kind, self._big_tail
            self._big_kind, self._big_tail = None, b""
            if kind in _TERMINAL:
                self._final = self._oversized_final(kind, tail)

    def _oversized_final(self, kind: str, tail: bytes) -> LLMResult:
        text = "".join(self._text)
        calls = self._streamed_calls()
        usage = usage_of(_usage_in(tail)) or self._estimate(text, calls)
        error = None
        if kind == "response.failed":
            error = error_dict(
                "response_failed", "the response failed (its final event was too large to read)"
            )
        stop = kind.removeprefix("response.")
        return LLMResult(self._model, text, calls, usage, stop, self._id, error)

    def _event(self, data_text: str) -> None:
        data = loads_or_none(data_text)
        if not isinstance(data, dict):
            return
        kind = data.get("type")
        response = data.get("response")
        if isinstance(response, dict):
            self._model = response.get("model") if isinstance(response.get("model"), str) else self._model
            self._id = response.get("id") if isinstance(response.get("id"), str) else self._id
        if kind in _TERMINAL and isinstance(response, dict):
            final = _result(response, self.req)
            if not final.text and not final.tool_calls:  # a terminal event without output: use ours
                final.text = "".join(self._text)
                final.tool_calls = self._streamed_calls()
            self._final = final
        elif kind == "response.output_item.added" and isinstance(data.get("item"), dict):
            item = data["item"]
            if _is_hosted(item):  # nothing of it streams but an MCP call's arguments
                self._done[as_int(data.get("output_index"))] = [_tool_call(item)]
            elif _type(item) in _CALL_TYPES:
                started = ToolCallBuilder(
                    id=str(item.get("call_id") or item.get("id") or ""),
                    name=_tool_call(item).name,
                    parts=BoundedText(self._text.limit),
                )
                if isinstance(item.get("arguments"), str) and item["arguments"]:
                    started.parts.append(item["arguments"])
                self._calls[as_int(data.get("output_index"))] = started
        elif kind == "response.output_item.done" and isinstance(data.get("item"), dict):
            if _type(data["item"]) in _CALL_TYPES:  # the whole call, whatever its deltas said
                self._done[as_int(data.get("output_index"))] = _calls_of(data["item"])
        elif kind in _ARGUMENT_DELTAS:
            builder = self._calls.get(as_int(data.get("output_index")))
            if builder is not None and isinstance(data.get("delta"), str):
                builder.parts.append(data["delta"])
        elif kind == "response.function_call_arguments.done":
            builder = self._calls.get(as_int(data.get("output_index")))
            if builder is not None and isinstance(data.get("arguments"), str):
                builder.parts = BoundedText(self._text.limit)
                builder.parts.append(data["arguments"])
        elif kind == "response.output_text.delta" and isinstance(data.get("delta"), str):
            self._text.append(data["delta"])
        elif kind == "error":
            err = data.get("error")
            if not isinstance(err, dict):
                err = data
            self._error = error_dict(
                str(err.get("code") or err.get("type") or "error"), str(err.get("message") or ""), err
            )


def _usage_in(tail: bytes) -> Any:
    """The last `"usage": {...}` object in the tail of an event too large to parse whole, if any."""
    text = tail.decode("utf-8", "replace")
    for match in reversed(list(_USAGE.finditer(text))):
        try:
            value, _ = _JSON.raw_decode(text, match.end())
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


_JSON = json.JSONDecoder()


def render_blocked(req: LLMRequest, text: str, guard: str, now: float | None = None) -> tuple[str, bytes]:
    """A completed response whose only output is a message saying what was blocked; usage zero.

    Its id starts with `resp_tripwire_` (see `is_synthetic_response_id`).
    """
    created = int(now if now is not None else time.time())
    rid = new_id(SYNTHETIC_PREFIX)
    mid = new_id("msg_tripwire_")
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    message = {"id": mid, "type": "message", "status": "completed", "role": "assistant", "content": [part]}
    usage = {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }
    response: dict[str, Any] = {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": "completed",
        "model": req.model or "tripwire",
        "output": [message],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "previous_response_id": req.previous_response_id,
        "metadata": {"tripwire_guard": guard},
        "usage": usage,
    }
    if not req.stream:
        return JSON_TYPE, orjson.dumps(response)
    start = {**response, "status": "in_progress", "output": [], "usage": None}
    empty_part = {**part, "text": ""}
    where = {"item_id": mid, "output_index": 0, "content_index": 0}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**message, "status": "in_progress", "content": []},
        },
        {"type": "response.content_part.added", **where, "part": empty_part},
        {"type": "response.output_text.delta", **where, "delta": text, "logprobs": []},
        {"type": "response.output_text.done", **where, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **where, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": message},
        {"type": "response.completed", "response": response},
    ]
    body = b"".join(
        sse_frame({**event, "sequence_number": n}, event["type"]) for n, event in enumerate(events)
    )
    return SSE_TYPE, body


if TYPE_CHECKING:  # mypy checks this module against the contract
    from proxy.dialects import openai_responses as _this
    from proxy.dialects.contract import Dialect

    _checked: Dialect = _this
