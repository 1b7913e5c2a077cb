"""LLM traffic: parsing a request with its dialect, and what an LLM call writes to the trace.

The dialect modules (proxy/dialects/) know the wire formats; this module knows the session:
which prompt messages are new since the previous call, which tool calls are waiting for a
result, and how an answer becomes LLM_CALL and TOOL_CALL events.
"""

from __future__ import annotations

import logging
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any

import orjson

from proxy import guard_trace
from proxy.dialects import dialect_for
from proxy.dialects.base import LLMRequest, LLMResult, Usage
from proxy.exchange import Answer, Exchange
from proxy.guards.decision import Decision
from proxy.guards.signatures import signature
from proxy.pipeline import BaseStage
from proxy.sessions import PendingToolCall, Session

if TYPE_CHECKING:
    from proxy.engine import Engine

log = logging.getLogger("tripwire.llm")

# Reservation when a request names no max_tokens: a typical answer, so budgets see something.
DEFAULT_RESERVED_COMPLETION_TOKENS = 1024
# Non-streamed answers are kept to parse usage at the end. Larger than the request limit: a big
# embeddings batch answers tens of MB, and an unparsed answer would be charged $0.
RESPONSE_RECORD_LIMIT = 512 * 1024 * 1024


class BodyCollector:
    """Observer for non-streamed answers: pass bytes through, keep them to parse at the end."""

    rewrites = False

    def __init__(self, limit: int) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.limit = limit

    def feed(self, chunk: bytes) -> bytes:
        if self.size < self.limit:
            self.parts.append(chunk)
            self.size += len(chunk)
        return chunk

    def body(self) -> bytes:
        return b"".join(self.parts)


class LLMProtocol:
    """The protocol adapter for LLM calls: render refusals, read the result, record the call."""

    kind = "llm"

    def __init__(self, dialect: ModuleType, engine: Engine) -> None:
        self.dialect = dialect
        self.engine = engine

    def render_block(self, ex: Exchange, decision: Decision, text: str) -> Answer:
        content_type, body = self.dialect.render_blocked(ex.call, text, decision.guard)
        # 200 with a synthetic answer, except where the SDK cannot accept one (embeddings: 429)
        return Answer(self.dialect.BLOCKED_STATUS, body, content_type, {"X-Tripwire-Guard": decision.guard})

    def render_refusal(self, ex: Exchange, decision: Decision, text: str) -> Answer:
        return refusal_429(decision, text, self.engine.settings.expose_guard_details)

    def reservation_estimate(self, ex: Exchange) -> float:
        """USD to reserve against budgets before forwarding: prompt estimate + max_tokens."""
        call: LLMRequest = ex.call
        prompt = self.dialect.estimate_prompt_tokens(call)
        completion = call.max_tokens or DEFAULT_RESERVED_COMPLETION_TOKENS
        usage = Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
        return self.engine.pricing.estimate(usage, [call.model])

    def after_forward(self, ex: Exchange) -> None:
        result = llm_result(ex)
        ex.result = result
        call: LLMRequest = ex.call
        models = [m for m in (result.model, call.model) if m]
        quote = self.engine.pricing.cost(result.usage or Usage(), models)
        ex.extra["cost_usd"] = quote.cost_usd
        ex.extra["priced_model"] = quote.model
        ex.extra["tokens"] = result.usage.total_tokens if result.usage else 0

    def record(self, ex: Exchange, engine: Engine) -> None:
        record_tool_results(ex, engine)
        if ex.refused or ex.result is None:
            return
        record_llm_call(ex, engine)


def refusal_429(decision: Decision, text: str, expose_details: bool) -> Answer:
    """TERMINATE / budget / limits / open circuit for an LLM call (SPEC §5.5)."""
    error: dict[str, Any] = {
        "message": text,
        "type": "tripwire_guard",
        "code": decision.guard,
        "guardrail": decision.guard,
    }
    if expose_details:
        error["threshold"] = decision.threshold
        error["actual"] = decision.actual
    headers = {"x-should-retry": "false", "X-Tripwire-Guard": decision.guard}
    if decision.guard == "circuit_breaker" and decision.retry_after is not None:
        headers["Retry-After"] = str(max(1, int(decision.retry_after + 0.999)))
        # an open circuit is worth retrying later: the SDK honours Retry-After
        headers.pop("x-should-retry")
    return Answer(429, orjson.dumps({"error": error}), "application/json", headers)


class LLMParseStage(BaseStage):
    """Find the dialect from the path and parse the body; unknown endpoints forward unrecorded."""

    name = "parse_llm"

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def request(self, ex: Exchange) -> None:
        dialect = dialect_for(ex.route.path, ex.request.method)
        if dialect is None:
            return
        try:
            body = orjson.loads(ex.body) if ex.body else {}
        except orjson.JSONDecodeError:
            return  # let the upstream say what is wrong with it; we only record what we understand
        if not isinstance(body, dict):
            return
        try:
            call: LLMRequest = dialect.parse_request(body)
        except Exception:
            log.exception("could not parse a %s request; forwarding it unrecorded", dialect.__name__)
            return
        ex.protocol = LLMProtocol(dialect, self.engine)
        ex.call = call
        rewritten = dialect.upstream_body(call, body)
        if rewritten is not None:
            ex.upstream_body = orjson.dumps(rewritten)
        ex.observer = dialect.StreamAccumulator(call) if call.stream else BodyCollector(RESPONSE_RECORD_LIMIT)


def llm_result(ex: Exchange) -> LLMResult:
    """What the upstream answered, parsed; for failures, an error result."""
    dialect = ex.protocol.dialect
    observer = ex.observer
    if ex.upstream_status is None:
        return LLMResult(
            model=None,
            text="",
            tool_calls=[],
            usage=None,
            stop_reason=None,
            error={
                "error_type": "UpstreamError",
                "message": ex.upstream_error or "no answer",
                "details": None,
            },
            complete=False,
        )
    if isinstance(observer, BodyCollector):
        result = dialect.parse_response(ex.upstream_status, observer.body(), req=ex.call)
    else:
        result = observer.finish(ex.stream_complete and ex.upstream_error is None)
    reason = ex.extra.get("incomplete_reason")
    if reason and not result.complete:
        # the client hung up, or shutdown cut the stream: not the upstream's failure
        result.error = {"error_type": "Incomplete", "message": reason, "details": None, "stack": None}
    elif not result.complete and ex.upstream_error is None:
        # a stream that ended without its terminator broke, even on a clean EOF (SPEC §5.3)
        ex.upstream_error = "upstream stream ended before its terminator"
    if ex.upstream_error and result.error is None:
        result.error = {
            "error_type": "UpstreamError",
            "message": ex.upstream_error,
            "details": None,
            "stack": None,
        }
        result.complete = False
    return result


def new_prompt_messages(session: Session, call: LLMRequest, full: bool) -> list[Any]:
    """The messages new since the session's previous LLM call (all of them on the first call).

    Storing only the new part keeps a long conversation's trace linear, not quadratic.
    """
    seen = session.conversation.prompt_messages_seen
    messages = call.messages
    # a Responses API chain (previous_response_id) carries only its new input items
    if full or seen == 0 or len(messages) < seen or call.previous_response_id:
        return list(messages)
    return list(messages[seen:])


def usage_dict(usage: Usage | None) -> dict[str, int]:
    if usage is None:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def tool_calls_payload(result: LLMResult) -> list[dict[str, Any]]:
    return [{"id": tc.id, "name": tc.name, "arguments": tc.arguments} for tc in result.tool_calls]


def remember_tool_calls(session: Session, result: LLMResult, llm_event_id: str, wall: float) -> None:
    for tc in result.tool_calls:
        session.conversation.pending_tool_calls[tc.id] = PendingToolCall(
            name=tc.name, arguments=tc.arguments, asked_at=wall, llm_event_id=llm_event_id
        )
    if result.response_id and result.tool_calls:
        session.conversation.response_tool_calls[result.response_id] = list(result.tool_calls)


def mcp_already_recorded(session: Session, name: str, arguments: Any) -> bool:
    """A tool the agent ran through Tripwire's MCP route is recorded once, as the MCP event."""
    sigs = session.conversation.mcp_signatures
    for candidate in (signature(name, arguments), signature(name.split("__", 1)[-1], arguments)):
        if sigs.get(candidate, 0) > 0:
            sigs[candidate] -= 1
            return True
    return False


def record_tool_results(ex: Exchange, engine: Engine) -> None:
    """Function-calling tools: a result in this request completes a call an earlier answer asked for."""
    session = ex.session
    call: LLMRequest = ex.call
    assert session is not None
    for tr in call.tool_results:
        pending = session.conversation.pending_tool_calls.pop(tr.tool_call_id, None)
        if pending is None or mcp_already_recorded(session, pending.name, pending.arguments):
            continue
        session.conversation.tool_event_ids[tr.tool_call_id] = engine.record_event(
            session,
            "TOOL_CALL",
            pending.name,
            {
                "tool_name": pending.name,
                "args": pending.arguments,
                "result": tr.content,
                "status": "error" if tr.is_error else "ok",
                "error": {"error_type": "ToolError", "message": str(tr.content)[:500]}
                if tr.is_error
                else None,
                "source": "llm",
                "server": None,
                "tool_call_id": tr.tool_call_id,
            },
            # from the answer that asked for the tool to the request that brings its result
            duration_ms=max(0, int((ex.started_wall - pending.asked_at) * 1000)),
            parent_id=pending.llm_event_id,
            ts=ex.started_wall,
        )
        engine.metrics.observe_tool("llm", "error" if tr.is_error else "ok", pending.name)


def record_llm_call(ex: Exchange, engine: Engine) -> None:
    session = ex.session
    call: LLMRequest = ex.call
    result: LLMResult = ex.result
    assert session is not None
    settings = engine.settings
    usage = result.usage
    model = result.model or call.model or "unknown"
    ok = result.error is None and (ex.upstream_status or 0) < 400 and result.complete
    payload: dict[str, Any] = {
        "model": model,
        "prompt": new_prompt_messages(session, call, settings.record_full_prompts),
        "prompt_messages_total": len(call.messages),
        "response": {"text": result.text, "tool_calls": tool_calls_payload(result)},
        "usage": usage_dict(usage),
        "provider": provider_name(ex.protocol.dialect.__name__),
        "temperature": call.temperature,
        "stop_reason": result.stop_reason,
        "status": "ok" if ok else "error",
        "error": None if ok else (result.error or http_error(ex)),
        "cost_usd": ex.extra.get("cost_usd", 0.0),
        "upstream": ex.route.upstream,
        "stream": call.stream,
        "endpoint": call.dialect,
        "http_status": ex.upstream_status,
        **guard_trace.call_fields(ex),
    }
    if usage is not None and usage.estimated:
        payload["usage_estimated"] = True
    if usage is not None and (usage.cached_tokens or usage.cache_creation_tokens):
        payload["usage"]["cached_tokens"] = usage.cached_tokens
        payload["usage"]["cache_creation_tokens"] = usage.cache_creation_tokens
    end = ex.upstream_done or time.monotonic()
    meta: dict[str, Any] = {"agent": session.agent, "session_id": session.session_id}
    if ex.extra.get("upstream_retries"):
        meta["upstream_retries"] = ex.extra["upstream_retries"]
    if ex.first_byte_at is not None and ex.upstream_started is not None:
        meta["ttfb_ms"] = int((ex.first_byte_at - ex.upstream_started) * 1000)
    event_id = engine.record_event(
        session,
        "LLM_CALL",
        model,
        payload,
        duration_ms=int((end - ex.started) * 1000),
        meta=meta,
        ts=ex.started_wall,
    )
    ex.extra["llm_event_id"] = event_id
    if ex.upstream_failed():
        # SPEC §4.1: an upstream failure is also an ERROR event (counts.errors)
        engine.record_event(
            session,
            "ERROR",
            "upstream_error",
            {
                "error_type": "upstream_error",
                "message": ex.upstream_error or f"upstream answered HTTP {ex.upstream_status}",
                "stack": None,
                "guardrail": None,
                "threshold": None,
                "actual": None,
                "upstream": ex.route.upstream,
                "http_status": ex.upstream_status,
            },
            parent_id=event_id,
        )
    engine.recorder.add_usage(session.run_id, payload["cost_usd"], usage.total_tokens if usage else 0)
    session.conversation.prompt_messages_seen = len(call.messages)
    remember_tool_calls(session, result, event_id, time.time())
    engine.metrics.observe_llm(
        session.agent,
        ex.extra.get("priced_model") or model,
        usage.prompt_tokens if usage else 0,
        usage.completion_tokens if usage else 0,
        payload["cost_usd"],
    )


def http_error(ex: Exchange) -> dict[str, Any]:
    return {
        "error_type": "HTTPError",
        "message": f"upstream answered HTTP {ex.upstream_status}",
        "details": None,
        "stack": None,
    }


def provider_name(dialect_module: str) -> str:
    short = dialect_module.rsplit(".", 1)[-1]
    return "anthropic" if short == "anthropic" else "openai"
