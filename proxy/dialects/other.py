"""Other recorded LLM endpoints: embeddings (`/v1/embeddings`) and legacy completions
(`/v1/completions`).

They count against budgets like chat calls (SPEC §4.2), so they are parsed for usage; where an
answer reports none (some OpenAI-compatible servers), usage is estimated by the chars/4 rule
(token-id inputs are counted as they are) and marked `estimated`. `embeddings.py` and
`completions.py` expose these functions under the names every dialect module has.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from proxy.dialects import openai_chat
from proxy.dialects.base import (
    TOKENS_PER_MESSAGE,
    LLMRequest,
    LLMResult,
    Usage,
    as_float,
    as_int,
    error_dict,
    estimate_text_tokens,
    estimate_usage,
    estimate_value_tokens,
    http_error,
    loads_or_none,
    new_id,
    openai_usage,
    sse_frame,
)

JSON_TYPE = "application/json"
SSE_TYPE = "text/event-stream; charset=utf-8"


def _inputs(value: Any) -> list[Any]:
    """A prompt/input field as a list of inputs: a string, token ids, or a list of either."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [value]  # one input given as token ids
    return list(value) if isinstance(value, list) else []


def estimate_prompt_tokens(req: LLMRequest) -> int:
    """Token ids count as themselves; text by chars/4."""
    total = 0
    for item in req.messages:
        if isinstance(item, list) and all(isinstance(v, int) for v in item):
            total += len(item)
        elif isinstance(item, str):
            total += estimate_text_tokens(item)
        else:
            total += estimate_value_tokens(item) + TOKENS_PER_MESSAGE
    return total


def _estimated(req: LLMRequest | None, text: str) -> Usage:
    usage = estimate_usage(None, text, [])
    usage.prompt_tokens = estimate_prompt_tokens(req) if req is not None else 0
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
    return usage


def _model(data: dict) -> str | None:
    return data.get("model") if isinstance(data.get("model"), str) else None


# --- embeddings -----------------------------------------------------------------------------


def embeddings_parse_request(body: dict) -> LLMRequest:
    return LLMRequest(
        dialect="embeddings",
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        stream=False,
        messages=_inputs(body.get("input")),
        temperature=None,
        max_tokens=None,
        tool_results=[],
        steps=[],
        turn_start=0,
        client_asked_usage=True,
    )


def embeddings_parse_response(status: int, body: bytes, req: LLMRequest | None = None) -> LLMResult:
    """Usage and model only: the vectors are not worth recording."""
    data = loads_or_none(body)
    if status >= 400 or (isinstance(data, dict) and data.get("error")):
        return LLMResult(None, "", [], None, None, error=http_error(status, data, body))
    if not isinstance(data, dict):
        return LLMResult(None, "", [], None, None, error=error_dict("unparseable_response", "not JSON"))
    usage = openai_usage(data.get("usage"))
    if usage is not None:
        usage.total_tokens = usage.total_tokens or usage.prompt_tokens
    else:
        usage = _estimated(req, "")
    count = len(data["data"]) if isinstance(data.get("data"), list) else 0
    return LLMResult(_model(data), "", [], usage, f"{count} embeddings")


class EmbeddingsAccumulator:
    """Embeddings do not stream; this only exists so every dialect has the same interface."""

    status: int | None = None  # the caller may set the upstream status for error bodies

    def __init__(self, req: LLMRequest) -> None:
        self.req = req
        self._body = bytearray()

    def feed(self, chunk: bytes) -> bytes:
        self._body += chunk
        return chunk

    def finish(self, complete: bool) -> LLMResult:
        result = embeddings_parse_response(self.status or 200, bytes(self._body), self.req)
        result.complete = complete
        return result


def embeddings_render_blocked(req: LLMRequest, text: str, guard: str) -> tuple[str, bytes]:
    """An OpenAI error body, to be sent with `EMBEDDINGS_BLOCKED_STATUS` (429).

    An embeddings answer has no text to carry the reason, and SDKs reject an empty `data` list,
    so a refusal here takes the shape of the other guard refusals (SPEC §5.5).
    """
    error = {"message": text, "type": "tripwire_guard", "code": guard, "guardrail": guard}
    return JSON_TYPE, orjson.dumps({"error": error})


EMBEDDINGS_BLOCKED_STATUS = 429


# --- legacy completions ---------------------------------------------------------------------


def completions_parse_request(body: dict) -> LLMRequest:
    options = body.get("stream_options")
    return LLMRequest(
        dialect="completions",
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        stream=body.get("stream") is True,
        messages=_inputs(body.get("prompt")),
        temperature=as_float(body.get("temperature")),
        max_tokens=as_int(body.get("max_tokens")) or None,
        tool_results=[],
        steps=[],
        turn_start=0,
        client_asked_usage=isinstance(options, dict) and options.get("include_usage") is True,
    )


# same rule as chat: a streaming request asks for the usage chunk, which is filtered out
completions_upstream_body = openai_chat.upstream_body


def completions_parse_response(status: int, body: bytes, req: LLMRequest | None = None) -> LLMResult:
    data = loads_or_none(body)
    if status >= 400 or (isinstance(data, dict) and data.get("error")):
        return LLMResult(None, "", [], None, None, error=http_error(status, data, body))
    if not isinstance(data, dict):
        return LLMResult(None, "", [], None, None, error=error_dict("unparseable_response", "not JSON"))
    text, stop = "", None
    choices = data.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        first = choices[0].get("text")
        text = first if isinstance(first, str) else ""
        stop = choices[0].get("finish_reason")
    usage = openai_usage(data.get("usage")) or _estimated(req, text)
    rid = data.get("id") if isinstance(data.get("id"), str) else None
    return LLMResult(_model(data), text, [], usage, stop, rid)


class CompletionsAccumulator(openai_chat.StreamAccumulator):
    """The chat stream reader (usage-chunk filter included); choices carry `text`, not `delta`."""

    @staticmethod
    def parse_body(status: int, body: bytes, req: LLMRequest) -> LLMResult:
        return completions_parse_response(status, body, req)

    def _choice(self, choice: dict) -> None:
        if choice.get("finish_reason"):
            self._stop = choice["finish_reason"]
        if isinstance(choice.get("text"), str):
            self._text.append(choice["text"])

    def finish(self, complete: bool) -> LLMResult:
        result = super().finish(complete)
        if result.usage is not None and result.usage.estimated:
            result.usage = _estimated(self.req, result.text)
        return result


def completions_render_blocked(
    req: LLMRequest, text: str, guard: str, now: float | None = None
) -> tuple[str, bytes]:
    """A completion with the reason as its text, finish_reason "stop", usage zero."""
    created = int(now if now is not None else time.time())
    head = {"id": new_id("cmpl-tripwire-"), "object": "text_completion", "created": created}
    head["model"] = req.model or "tripwire"
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    if not req.stream:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": "stop"}
        return JSON_TYPE, orjson.dumps({**head, "choices": [choice], "usage": usage})
    frames = [
        {**head, "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": None}]},
        {**head, "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "stop"}]},
    ]
    if req.client_asked_usage:
        frames.append({**head, "choices": [], "usage": usage})
    return SSE_TYPE, b"".join(sse_frame(f) for f in frames) + sse_frame("[DONE]")
