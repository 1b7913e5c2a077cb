"""Max-tokens recovery (opt-in, `max_tokens_recovery`): a non-streamed Chat Completions
answer cut off by its token limit (`finish_reason: "length"`) is continued upstream up to N times
and the agent gets one stitched answer.

Each continuation sends the conversation plus the text so far as an assistant message and a short
user message asking to go on; the pieces are joined, usage is
summed, and the last piece's `finish_reason` wins. The stitched answer is recorded as one LLM_CALL
with the summed usage and cost. Streams, tool calls and `n > 1` are relayed as they are.
"""

from __future__ import annotations

import copy
import logging
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from proxy.content_coding import Codec, ContentDecodeError, content_codings
from proxy.dialects import of_call
from proxy.dialects.base import loads_or_none
from proxy.exchange import Answer, Exchange
from proxy.forward import json_error, request_headers, response_headers
from proxy.pipeline import BaseStage
from proxy.routing import join_upstream

if TYPE_CHECKING:
    from proxy.services import Services

log = logging.getLogger("tripwire.recovery")

CONTINUE_PROMPT = (
    "Your previous answer was cut off by the output token limit. Continue exactly where it "
    "stopped, without repeating anything already written."
)
DROP_HEADERS = frozenset({"content-type", "content-length", "content-encoding", "transfer-encoding"})


def truncated_text(answer: Any) -> str | None:
    """The text of a single-choice answer cut off by its token limit, else None (nothing to do)."""
    if not isinstance(answer, dict):
        return None
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    message = choice.get("message")
    if choice.get("finish_reason") != "length" or not isinstance(message, dict):
        return None
    if message.get("tool_calls") or not isinstance(message.get("content"), str):
        return None
    return message["content"]


def continuation(body: dict[str, Any], text_so_far: str) -> dict[str, Any]:
    """The request that asks the model to go on after `text_so_far`."""
    messages = list(body.get("messages") or [])
    messages += [
        {"role": "assistant", "content": text_so_far},
        {"role": "user", "content": CONTINUE_PROMPT},
    ]
    return {**body, "messages": messages}


def sum_usage(a: Any, b: Any) -> Any:
    """Token counts added field by field (nested details too); anything else from `a`."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: sum_usage(a.get(k), b.get(k)) if k in b else a[k] for k in a} | {
            k: v for k, v in b.items() if k not in a
        }
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return a + b
    return a if a is not None else b


def stitch(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One answer from the first part's envelope, every part's text, the last finish_reason."""
    out = copy.deepcopy(parts[0])
    choice = out["choices"][0]
    choice["message"]["content"] = "".join(p["choices"][0]["message"].get("content") or "" for p in parts)
    choice["finish_reason"] = parts[-1]["choices"][0].get("finish_reason")
    usage = out.get("usage")
    for p in parts[1:]:
        usage = sum_usage(usage, p.get("usage"))
    if usage is not None:
        out["usage"] = usage
    return out


class MaxTokensRecoveryStage(BaseStage):
    """Runs instead of the forward stage for the calls it recovers (it sets `ex.answer`)."""

    name = "max_tokens_recovery"

    def __init__(self, services: Services) -> None:
        self.services = services

    def eligible(self, ex: Exchange) -> dict[str, Any] | None:
        if self.services.settings.max_tokens_recovery <= 0 or ex.protocol is None:
            return None
        call = ex.call
        if ex.protocol.kind != "llm" or call.stream:
            return None
        dialect = of_call(call)
        if dialect is None or not dialect.MAX_TOKENS_RECOVERY:
            return None
        try:
            body = orjson.loads(ex.upstream_body if ex.upstream_body is not None else ex.body)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(body, dict) or body.get("n", 1) != 1:
            return None
        return body

    async def request(self, ex: Exchange) -> None:
        if self.services.settings.max_tokens_recovery <= 0:
            return  # off (the default)
        original = self.eligible(ex)
        protocol = ex.protocol
        if original is None or protocol is None:
            return
        route = ex.route
        upstream = self.services.upstreams.get(route.kind, route.upstream)
        url = join_upstream(upstream.url, route.path, ex.request.rel_url.raw_query_string)
        headers = request_headers(ex.request.headers, upstream, identity_encoding=True)
        ex.forwarded = True
        ex.upstream_started = time.monotonic()
        first: tuple[int, dict[str, str], bytes] | None = None
        parts: list[dict[str, Any]] = []
        try:
            body = original
            for attempt in range(self.services.settings.max_tokens_recovery + 1):
                status, out_headers, raw = await self.post(ex, url, headers, body)
                answer = loads_or_none(raw) if status == 200 else None
                if attempt == 0:
                    first = (status, out_headers, raw)
                elif not (isinstance(answer, dict) and answer.get("choices")):
                    break  # a continuation failed: the agent gets what there is
                if attempt == 0 and truncated_text(answer) is None:
                    break  # not cut off: relayed as it came
                parts.append(answer)  # type: ignore[arg-type]
                if truncated_text(answer) is None:
                    break
                text = "".join(p["choices"][0]["message"].get("content") or "" for p in parts)
                body = continuation(original, text)
        except TimeoutError:
            ex.upstream_error = "upstream timed out"
        except aiohttp.ClientError as e:
            ex.upstream_error = f"upstream connection failed: {type(e).__name__}: {e}".rstrip(": ")
        finally:
            ex.upstream_done = time.monotonic()
        if first is None:  # the first request failed: as the forward stage answers it
            code = 504 if ex.upstream_error == "upstream timed out" else 502
            ex.answer = json_error(
                code,
                f"Tripwire: the upstream failed ({ex.upstream_error})",
                "upstream_error",
                "upstream_error",
            )
            protocol.after_forward(ex)
            return
        status, out_headers, raw = first
        if len(parts) > 1:
            raw = orjson.dumps(stitch(parts))
            out_headers["X-Tripwire-Max-Tokens-Recoveries"] = str(len(parts) - 1)
            ex.upstream_error = None  # a continuation that failed still leaves an answer
            log.info("max-tokens recovery: stitched %d answers for %s", len(parts), route.upstream)
        ex.upstream_status = status
        if ex.observer is not None:
            ex.observer.feed(raw)
        ex.answer = Answer(status, raw, out_headers.pop("Content-Type", "application/json"), out_headers)
        protocol.after_forward(ex)

    async def post(
        self, ex: Exchange, url: str, headers: Any, body: dict[str, Any]
    ) -> tuple[int, dict[str, str], bytes]:
        async with await self.services.forwarder.send(ex, "POST", url, headers, orjson.dumps(body)) as resp:
            raw = await resp.read()
            if ex.first_byte_at is None:
                ex.first_byte_at = time.monotonic()
            kept = {
                k: v
                for k, v in response_headers(resp.headers, drop_length=True).items()
                if k.lower() not in DROP_HEADERS
            }
            kept["Content-Type"] = resp.headers.get("Content-Type", "application/json")
            codings = content_codings(resp.headers)
            if codings:  # compressed although Tripwire asked for identity
                decoded = self.decoded(codings, raw)
                if decoded is None:  # relayed as it came, its coding still named
                    kept["Content-Encoding"] = ", ".join(codings)
                else:
                    raw = decoded
            return resp.status, kept, raw

    def decoded(self, codings: list[str], raw: bytes) -> bytes | None:
        """`raw` decoded, or None when Tripwire cannot decode it or it grows past `max_decoded_bytes`
        (a bomb is relayed compressed and not continued, never inflated whole)."""
        if not Codec.decodes(codings):
            return None
        limit = self.services.settings.max_decoded_bytes
        out: list[bytes] = []
        size = 0
        try:
            for piece in Codec(codings).decode(raw):
                size += len(piece)
                if size > limit:
                    return None
                out.append(piece)
        except ContentDecodeError:
            return None
        return b"".join(out)
