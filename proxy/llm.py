"""LLM traffic: parsing a request with its dialect, reading its answer, and the tool results it brings.

The dialect modules (proxy/dialects/) know the wire formats; this module is the protocol adapter
the pipeline asks of an LLM call (`LLMProtocol`: refusals in the dialect's shape, proxy/llm_errors.py;
the budget reservation; the result), reading a body, and writing the TOOL_CALLs of the tool results a
request brings (the parse and tool-results stages are proxy/stages/llm_parse.py and tool_results.py).
What a call writes to the trace is proxy/llm_trace.py's.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import orjson

from proxy import jsonparse
from proxy.constants import TRUNCATED_MARKER, EventType
from proxy.dialects.base import LLMRequest, LLMResult, ToolResult, Usage, estimate_prompt_tokens
from proxy.dialects.contract import Accumulator, Dialect
from proxy.episodes import PRIOR, call_digests, find_prior
from proxy.exchange import Answer, Exchange
from proxy.guards.decision import Decision
from proxy.guards.signatures import signature
from proxy.llm_errors import refusal_429
from proxy.llm_trace import record_llm_call, write_tool_result
from proxy.redact import valid_unicode
from proxy.sessions import PendingToolCall, Session

if TYPE_CHECKING:
    from proxy.services import Services

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

    def __init__(self, dialect: Dialect, services: Services) -> None:
        self.dialect = dialect
        self.services = services

    def continues(self, ex: Exchange) -> bool:
        return False  # every LLM request is a call of its own

    async def await_result(self, ex: Exchange) -> None:
        return None  # the answer is the result

    def render_block(self, ex: Exchange, decision: Decision, text: str) -> Answer:
        # the answer quotes the request (model, tool names): no lone surrogate may reach orjson
        call = replace(
            ex.call,
            model=valid_unicode(ex.call.model) if ex.call.model else ex.call.model,
            previous_response_id=valid_unicode(ex.call.previous_response_id)
            if ex.call.previous_response_id
            else None,
        )
        content_type, body = self.dialect.render_blocked(call, valid_unicode(text), decision.guard)
        # 200 with a synthetic answer, except where the SDK cannot accept one (embeddings: 429)
        return Answer(self.dialect.BLOCKED_STATUS, body, content_type, {"X-Tripwire-Guard": decision.guard})

    def render_refusal(self, ex: Exchange, decision: Decision, text: str) -> Answer:
        return refusal_429(
            decision, valid_unicode(text), self.services.settings.expose_guard_details, self.dialect
        )

    def prompt_tokens(self, call: LLMRequest) -> int:
        """The dialect's prompt estimate; the conversational dialects' sum over the messages comes
        from the conversation's walk, which counts only the messages new since its last request."""
        if self.dialect.estimate_prompt_tokens is not estimate_prompt_tokens:
            return int(self.dialect.estimate_prompt_tokens(call))
        found = call.memo.get("prompt_tokens")
        if found is None:  # kept for the token reservation (estimate_prompt_tokens reads the memo)
            found = call.memo["prompt_tokens"] = call_digests(call).tokens
        return int(found)

    def reservation_estimate(self, ex: Exchange) -> float:
        """USD to reserve against budgets before forwarding: prompt estimate + max_tokens."""
        call: LLMRequest = ex.call
        prompt = self.prompt_tokens(call)
        completion = call.max_tokens or DEFAULT_RESERVED_COMPLETION_TOKENS
        return self.services.pricing.estimate_tokens(prompt, completion, call.model)

    def after_forward(self, ex: Exchange) -> None:
        result = llm_result(ex)
        ex.result = result
        call: LLMRequest = ex.call
        # (cost() skips a missing name; the pair is its cache key as it is)
        # a call the upstream never answered (connection failed) costs nothing and warns of nothing
        answered = ex.upstream_status is not None
        quote = self.services.pricing.cost(result.usage or Usage(), (result.model, call.model), warn=answered)
        ex.cost_usd = quote.cost_usd
        ex.priced_model = quote.model
        ex.tokens = result.usage.total_tokens if result.usage else 0

    def record(self, ex: Exchange, services: Services) -> None:
        if ex.refused or ex.result is None:
            return
        record_llm_call(ex, services)


def read_body(raw: bytes) -> tuple[Any, bool]:
    """(the parsed body, whether orjson read it); ValueError when json.loads would refuse it.

    orjson first (fast); what it refuses is read as `json.loads(bytes)` reads it, at any depth
    (`proxy.jsonparse`, SPEC §4.2). An empty body is `{}`, judged like any other call.
    """
    if not raw:
        return {}, True
    try:
        return orjson.loads(raw), True
    except orjson.JSONDecodeError:
        return jsonparse.loads_lenient(raw), False


def fallback_request(dialect: Dialect, body: dict[str, Any]) -> LLMRequest:
    """What the guards judge when the dialect cannot read a body: the call, without its history."""
    model = body.get("model")
    return LLMRequest(
        dialect=getattr(dialect, "DIALECT", dialect.__name__.rsplit(".", 1)[-1]),
        model=model if isinstance(model, str) else None,
        stream=body.get("stream") is True,
        messages=[],
        temperature=None,
        max_tokens=None,
        tool_results=[],
        steps=[],
        turn_start=0,
    )


def parse(dialect: Dialect, body: dict[str, Any]) -> LLMRequest:
    """The dialect's parse; a long conversation that continues a recent request (its messages
    proven to start with that request's, proxy/history.py) is read from there on only."""
    parse_from = getattr(dialect, "parse_request_from", None)
    messages = body.get("messages")
    if parse_from is None or type(messages) is not list:
        return dialect.parse_request(body)
    prior = find_prior(messages)
    state = None
    if prior is not None and prior.parsed is not None and prior.parsed.messages == len(prior.messages):
        state = prior.parsed
    call: LLMRequest = parse_from(body, state)
    call.memo[PRIOR] = prior  # the digests go on from the same request, without comparing again
    return call


def llm_result(ex: Exchange) -> LLMResult:
    """What the upstream answered, parsed; for failures, an error result."""
    protocol = ex.protocol
    assert isinstance(protocol, LLMProtocol)
    dialect = protocol.dialect
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
        if ex.content_truncated:  # its start alone does not parse
            result = truncated_result(protocol, ex.call)
        else:
            result = dialect.parse_response(ex.upstream_status, observer.body(), req=ex.call)
    else:
        accumulator = cast("Accumulator", observer)  # the parse stage set the dialect's accumulator
        relayed = ex.stream_complete and ex.upstream_error is None
        result = accumulator.finish(relayed)
        if ex.content_truncated:
            # it read the stream's start only: its end (terminator, usage) went to the client unread
            if not result.text.endswith(TRUNCATED_MARKER):
                result.text += TRUNCATED_MARKER
            if relayed and (result.error or {}).get("error_type") == "stream_incomplete":
                result.error, result.complete = None, True
    reason = ex.incomplete_reason
    if reason:
        # the client hung up, or shutdown cut the stream, before the whole answer reached the
        # client: not the upstream's failure (which may have sent it all), but not a delivered answer
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


def truncated_result(protocol: LLMProtocol, call: LLMRequest) -> LLMResult:
    """A body decoded past `max_decoded_bytes`: relayed whole, recorded as `__TRUNCATED__` with the
    prompt's estimated usage."""
    prompt = protocol.prompt_tokens(call)
    usage = Usage(prompt_tokens=prompt, total_tokens=prompt, estimated=True)
    return LLMResult(None, TRUNCATED_MARKER, [], usage, None)


def mcp_already_recorded(session: Session, name: str, arguments: Any) -> bool:
    """A tool the agent ran through Tripwire's MCP route is recorded once, as the MCP event."""
    sigs = session.conversation.mcp_signatures
    for candidate in (signature(name, arguments), signature(name.split("__", 1)[-1], arguments)):
        if sigs.get(candidate, 0) > 0:
            sigs[candidate] -= 1
            return True
    return False


def record_tool_results(ex: Exchange, services: Services) -> None:
    """Function-calling tools: a result in this request completes a call an earlier answer asked for."""
    session = ex.session
    call: LLMRequest = ex.call
    assert session is not None
    for tr in results_to_record(call, session.conversation.pending_tool_calls):
        pending = session.conversation.pending_tool_calls.pop(tr.tool_call_id, None)
        if pending is None or mcp_already_recorded(session, pending.name, pending.arguments):
            continue
        event_id = write_tool_result(
            ex, services, tr, pending.name, pending.arguments, pending.asked_at, pending.llm_event_id
        )
        services.policy.observe_event(session, EventType.TOOL_CALL, pending.name, event_id)
        if pending.nested:
            record_nested_calls(ex, services, tr, pending, event_id)


def record_nested_calls(
    ex: Exchange, services: Services, tr: ToolResult, pending: PendingToolCall, exec_event_id: str
) -> None:
    """The calls a Codex code-mode `exec` call's script made, each its own TOOL_CALL under the
    exec call's, with the exec call's output (Codex reports no per-call result); an MCP call that
    went through Tripwire's MCP route is recorded there already."""
    session = ex.session
    assert session is not None
    meta = {"inside": "exec", "exec_call_id": tr.tool_call_id}
    for nested in pending.nested:
        if mcp_already_recorded(session, nested.name, nested.arguments):
            continue
        result = ToolResult(nested.id, tr.content, tr.is_error)
        event_id = write_tool_result(
            ex, services, result, nested.name, nested.arguments, pending.asked_at, exec_event_id, meta=meta
        )
        services.policy.observe_event(session, EventType.TOOL_CALL, nested.name, event_id)


def results_to_record(call: LLMRequest, pending: dict[str, PendingToolCall]) -> list[ToolResult]:
    """The results that may complete a pending call, in request order: all of them, or, when the
    dialect read the request on from an earlier one (its results indexed), the first result of
    each pending id: the same ones the whole list would pop, without walking a long history."""
    state = call.parsed
    if state is None or call.continues is None or not pending:
        return call.tool_results if pending else []
    first = state.first_results(call.continues)
    found = sorted(i for i in (first.get(call_id) for call_id in pending) if i is not None)
    return [call.tool_results[i] for i in found]
