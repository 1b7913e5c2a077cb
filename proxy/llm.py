"""LLM traffic: parsing a request with its dialect, and what an LLM call writes to the trace.

The dialect modules (proxy/dialects/) know the wire formats; this module knows the session:
which prompt messages are new since the previous call, which tool calls are waiting for a
result, and how an answer becomes LLM_CALL and TOOL_CALL events.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import orjson

from proxy import guard_trace, jsonparse
from proxy.constants import (
    DEPTH_LIMIT,
    TRUNCATED_MARKER,
    EventType,
)
from proxy.dialects import dialect_for
from proxy.dialects.base import LLMRequest, LLMResult, ToolResult, Usage, estimate_prompt_tokens
from proxy.dialects.contract import Accumulator, Dialect
from proxy.episodes import PRIOR, call_digests, find_prior
from proxy.exchange import Answer, Exchange
from proxy.guards.decision import Decision
from proxy.guards.signatures import signature
from proxy.llm_errors import bad_request, refusal_429
from proxy.pipeline import BaseStage
from proxy.redact import PLAIN, sanitize, sanitize_text, valid_unicode
from proxy.sessions import Conversation, PendingToolCall, Refused, Session

if TYPE_CHECKING:
    from proxy.engine import Engine

log = logging.getLogger("tripwire.llm")
_LLM_CALL: str = EventType.LLM_CALL.value  # a plain str: an enum member's lookup costs more (per call)

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

    def __init__(self, dialect: Dialect, engine: Engine) -> None:
        self.dialect = dialect
        self.engine = engine
        self.provider = dialect.PROVIDER  # the LLM_CALL's `provider`

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
            decision, valid_unicode(text), self.engine.settings.expose_guard_details, self.dialect
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
        return self.engine.pricing.estimate_tokens(prompt, completion, call.model)

    def after_forward(self, ex: Exchange) -> None:
        result = llm_result(ex)
        ex.result = result
        call: LLMRequest = ex.call
        # (cost() skips a missing name; the pair is its cache key as it is)
        # a call the upstream never answered (connection failed) costs nothing and warns of nothing
        answered = ex.upstream_status is not None
        quote = self.engine.pricing.cost(result.usage or Usage(), (result.model, call.model), warn=answered)
        ex.cost_usd = quote.cost_usd
        ex.priced_model = quote.model
        ex.tokens = result.usage.total_tokens if result.usage else 0

    def record(self, ex: Exchange, engine: Engine) -> None:
        if ex.refused or ex.result is None:
            return
        record_llm_call(ex, engine)


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


class LLMParseStage(BaseStage):
    """Find the dialect from the path and parse the body; unknown endpoints forward unrecorded.

    A call of a known endpoint is never forwarded unjudged (SPEC §4.2): a body `json.loads` would
    refuse (or that is not a JSON object) is answered 400 here and recorded as an ERROR; one the
    dialect fails to read is judged as a call without history.
    """

    name = "parse_llm"

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # one adapter per dialect: it holds nothing of a call (the dialect and the engine only)
        self._protocols: dict[Dialect, LLMProtocol] = {}

    def protocol(self, dialect: Dialect) -> LLMProtocol:
        found = self._protocols.get(dialect)
        if found is None:
            found = self._protocols[dialect] = LLMProtocol(dialect, self.engine)
        return found

    async def request(self, ex: Exchange) -> None:
        dialect = dialect_for(ex.route.path, ex.request.method)
        if dialect is None:
            return
        try:
            body, exact = read_body(ex.body)
        except ValueError as e:  # invalid UTF-8, an integer beyond the digit limit, not JSON
            self.refuse(ex, dialect, f"the request body is not valid JSON: {str(e)[:300]}")
            return
        if not isinstance(body, dict):
            self.refuse(ex, dialect, "the request body must be a JSON object")
            return
        try:
            call: LLMRequest = parse(dialect, body)
        except Exception:
            log.exception("could not parse a %s request; judging it without its history", dialect.__name__)
            call = fallback_request(dialect, body)
        ex.protocol = self._protocols.get(dialect) or self.protocol(dialect)
        ex.call = call
        ex.request_json = body  # the session stage reads the client's episode id in it
        rewritten = dialect.upstream_body(call, body)
        if rewritten is not None:
            # orjson for what orjson read; the rest keeps NaN, big integers, surrogates, any depth
            ex.upstream_body = jsonparse.dumps(rewritten, finite=exact)
        ex.observer = dialect.StreamAccumulator(call) if call.stream else BodyCollector(RESPONSE_RECORD_LIMIT)

    def refuse(self, ex: Exchange, dialect: Dialect, message: str) -> None:
        """Answer 400 and record an ERROR in the session's run, when the call names one."""
        text = f"[tripwire] {message}"
        ex.answer = bad_request(dialect, text)
        route = ex.route
        session: Session | None = None
        if route.session is not None:
            opened = self.engine.open_session(route.agent, route.session, wall=ex.started_wall)
            session = None if isinstance(opened, Refused) else opened
        else:  # the agent's automatic session, when there is exactly one to speak of
            live = [
                s
                for s in self.engine.sessions.live()
                if s.agent == route.agent and not s.explicit and not s.terminated
            ]
            session = live[0] if len(live) == 1 else None
        if session is None or session.ended:
            log.warning(
                "refused an unreadable %s request of agent %s: %s", dialect.__name__, route.agent, message
            )
            return
        event_id = self.engine.write_event(
            session,
            EventType.ERROR,
            "invalid_request_body",
            {
                "error_type": "invalid_request_body",
                "message": text,
                "stack": None,
                "guardrail": None,
                "threshold": None,
                "actual": None,
                "http_status": 400,
                "endpoint": getattr(dialect, "DIALECT", None),
                "upstream": route.upstream,
            },
            ts=ex.started_wall,
        )
        self.engine.observe_event(session, EventType.ERROR, "invalid_request_body", event_id)


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


def new_prompt_messages(conversation: Conversation, call: LLMRequest, full: bool) -> tuple[list[Any], str]:
    """The messages new since the session's previous LLM call, and the digest of this call's.

    New means after the previous call's messages, when this call's history starts with exactly
    them (compared by content, not by count); otherwise (the first call, another conversation,
    an edited history) all of them. Storing only the new part keeps a long conversation's trace
    linear, not quadratic.
    """
    seen = conversation.prompt_messages_seen
    messages = call.messages
    # the digests of every prefix, which the session lookup already took (episodes.call_digests)
    digests = call_digests(call).sent
    digest = digests[-1].hex()
    continues = 0 < seen < len(digests) and digests[seen].hex() == conversation.prompt_digest
    # a Responses API chain (previous_response_id) carries only its new input items
    if full or not continues or call.previous_response_id:
        return messages, digest  # the call's own list: the recorder copies it as it sanitises or strips it
    return messages[seen:], digest


def usage_dict(usage: Usage | None) -> dict[str, int]:
    if usage is None:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    out = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cached_tokens or usage.cache_creation_tokens:
        out["cached_tokens"] = usage.cached_tokens
        out["cache_creation_tokens"] = usage.cache_creation_tokens
    return out


def remember_tool_calls(session: Session, result: LLMResult, llm_event_id: str, wall: float) -> None:
    """The calls the agent will run wait for their results; a hosted one (nothing comes back for it)
    is not remembered: record_hosted_calls writes it at once."""
    for tc in result.tool_calls:
        if tc.hosted:
            continue
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


def error_text(content: Any, limit: int = 500) -> str:
    """A failed tool's result as a short text; a deeply nested one as JSON (its repr recurses)."""
    if isinstance(content, str):
        return content[:limit]
    if jsonparse.max_depth(content) > DEPTH_LIMIT:
        return jsonparse.dumps_text(jsonparse.cap_depth(content, DEPTH_LIMIT, TRUNCATED_MARKER))[:limit]
    return str(content)[:limit]


class ToolResultsStage(BaseStage):
    """Function-calling tools: the results a request brings complete calls an earlier answer asked
    for. They happened before this call, so their TOOL_CALLs are written before the guards judge it
    (a LOOP_WARNING / ERROR they cause follows them, as in AgentDbg), and the guards observe them."""

    name = "tool_results"
    fail_open = True  # a bug here must not drop the agent's call

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def request(self, ex: Exchange) -> None:
        session = ex.session
        # a result completes a call an earlier answer asked for: with none pending, nothing to do
        if (
            session is not None
            and session.conversation.pending_tool_calls
            and isinstance(ex.protocol, LLMProtocol)
        ):
            record_tool_results(ex, self.engine)


def record_tool_results(ex: Exchange, engine: Engine) -> None:
    """Function-calling tools: a result in this request completes a call an earlier answer asked for."""
    session = ex.session
    call: LLMRequest = ex.call
    assert session is not None
    for tr in results_to_record(call, session.conversation.pending_tool_calls):
        pending = session.conversation.pending_tool_calls.pop(tr.tool_call_id, None)
        if pending is None or mcp_already_recorded(session, pending.name, pending.arguments):
            continue
        event_id = write_tool_result(
            ex, engine, tr, pending.name, pending.arguments, pending.asked_at, pending.llm_event_id
        )
        engine.observe_event(session, EventType.TOOL_CALL, pending.name, event_id)


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


def write_tool_result(
    ex: Exchange,
    engine: Engine,
    tr: ToolResult,
    name: str,
    arguments: Any,
    asked_at: float,
    llm_event_id: str | None,
    meta: dict[str, Any] | None = None,
) -> str:
    """The TOOL_CALL of one function-calling result (the caller lets the guards observe it)."""
    session = ex.session
    assert session is not None
    event_id = engine.write_event(
        session,
        EventType.TOOL_CALL,
        name,
        {
            "tool_name": name,
            "args": arguments,
            "result": tr.content,
            "status": "error" if tr.is_error else "ok",
            "error": {"error_type": "ToolError", "message": error_text(tr.content)} if tr.is_error else None,
            "source": "llm",
            "server": None,
            "tool_call_id": tr.tool_call_id,
        },
        # from the answer that asked for the tool to the request that brings its result
        duration_ms=max(0, int((ex.started_wall - asked_at) * 1000)),
        parent_id=llm_event_id,
        meta=meta,
        ts=ex.started_wall,
    )
    session.conversation.tool_event_ids[tr.tool_call_id] = event_id
    engine.metrics.observe_tool("llm", "error" if tr.is_error else "ok", name)
    return event_id


def record_hosted_calls(ex: Exchange, engine: Engine, result: LLMResult, llm_event_id: str) -> None:
    """The TOOL_CALLs of the tools the provider ran inside this answer (web search, MCP, ...): their
    outcome is in the answer, so they are written with it, marked `hosted` in their meta."""
    session = ex.session
    assert session is not None
    for tc in result.tool_calls:
        if tc.result is None or not tc.hosted or tc.id in session.conversation.tool_event_ids:
            continue
        event_id = write_tool_result(
            ex, engine, tc.result, tc.name, tc.arguments, ex.started_wall, llm_event_id, meta=HOSTED_META
        )
        engine.observe_event(session, EventType.TOOL_CALL, tc.name, event_id)


HOSTED_META = {"hosted": True}


def _as_is(value: Any, max_field_bytes: int, depth: int = 0) -> Any:
    return value


# The names an LLM_CALL repeats from call to call of a session (the models, the upstream, the
# endpoint, the stop reason, the agent and the session id), as sanitize makes them: remembered by
# value, so a session's calls clean them once instead of a sanitize call each per event. Bounded:
# at _NAMES_KEPT sets it starts over; a set with a long value (or not a str) is cleaned every
# time, not kept.
_NAMES: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_NAMES_KEPT = 1024
_NAME_CHARS = 256


def clean_names(names: tuple[Any, ...], max_field_bytes: int) -> tuple[Any, ...]:
    """`sanitize(name, max_field_bytes, 1)` of each of `names` (see _NAMES)."""
    key = (max_field_bytes, *names)
    try:
        found = _NAMES.get(key)
    except TypeError:  # not a name (an unhashable value): cleaned as anything else
        return tuple([sanitize(v, max_field_bytes, 1) for v in names])
    if found is None:
        found = tuple([sanitize(v, max_field_bytes, 1) for v in names])
        # (only strs and None: 1, 1.0 and True are equal keys whose cleaned values differ)
        if all(v is None or (type(v) is str and len(v) <= _NAME_CHARS) for v in names):
            if len(_NAMES) >= _NAMES_KEPT:
                _NAMES.clear()
            _NAMES[key] = found
    return found


_INTS = frozenset({int})


def llm_call_payload(
    ex: Exchange, prompt: list[Any], max_field_bytes: int | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The LLM_CALL's payload and meta, in the trace's field order.

    With `max_field_bytes`, built already as `sanitize` would make them (each value sanitised in
    place, at the depth it has in the event; the names a session repeats cleaned once, see
    clean_names), so the recorder takes them as they are: one pass, not a build and then a walk.
    The payload's own keys are fixed names, none secret-named (tests/test_stage_record.py).
    Without, the values are the call's own (record_content: false strips the payload before
    sanitising it).
    """
    session = ex.session
    call: LLMRequest = ex.call
    result: LLMResult = ex.result
    protocol = ex.protocol
    assert session is not None and isinstance(protocol, LLMProtocol)
    clean = _as_is if max_field_bytes is None else sanitize
    m = max_field_bytes or 0
    plain = PLAIN  # numbers, bools and None: sanitize keeps them as they are, so they skip it
    usage = result.usage
    names = (
        result.model or call.model or "unknown",
        call.model,
        ex.route.upstream,
        call.dialect,
        result.stop_reason,
        session.agent,
        session.session_id,
    )
    if max_field_bytes is not None:
        names = clean_names(names, max_field_bytes)
    model, request_model, upstream, endpoint, stop_reason, agent, session_id = names
    ok = result.error is None and (ex.upstream_status or 0) < 400 and result.complete
    tool_calls = (
        [
            {"id": clean(tc.id, m, 4), "name": clean(tc.name, m, 4), "arguments": clean(tc.arguments, m, 4)}
            for tc in result.tool_calls
        ]
        if result.tool_calls
        else []  # (most answers: no comprehension run for nothing)
    )
    counts = usage_dict(usage)  # Tripwire's own keys, none secret-named
    if not _INTS.issuperset(map(type, counts.values())):
        counts = clean(counts, m, 1)
    text = result.text
    text = sanitize_text(text, m) if type(text) is str and clean is sanitize else clean(text, m, 2)
    temperature, cost, stream, status = call.temperature, ex.cost_usd, call.stream, ex.upstream_status
    payload: dict[str, Any] = {
        "model": model,
        "request_model": request_model,  # what was asked for; `model` is what answered (OTLP)
        "prompt": clean(prompt, m, 1),
        "prompt_messages_total": len(call.messages),
        "response": {"text": text, "tool_calls": tool_calls},
        "usage": counts,
        "provider": protocol.provider,
        "temperature": temperature if type(temperature) in plain else clean(temperature, m, 1),
        "stop_reason": stop_reason,
        "status": "ok" if ok else "error",
        "error": None if ok else clean(result.error or http_error(ex), m, 1),
        "cost_usd": cost if type(cost) in plain else clean(cost, m, 1),
        "upstream": upstream,
        "stream": stream if type(stream) in plain else clean(stream, m, 1),
        "endpoint": endpoint,
        "http_status": status if type(status) in plain else clean(status, m, 1),
    }
    guard_trace.call_fields(ex, max_field_bytes, into=payload)
    if usage is not None and usage.estimated:
        payload["usage_estimated"] = True
    meta: dict[str, Any] = {"agent": agent, "session_id": session_id}
    if ex.upstream_retries:
        meta["upstream_retries"] = clean(ex.upstream_retries, m, 1)
    if ex.first_byte_at is not None and ex.upstream_started is not None:
        meta["ttfb_ms"] = int((ex.first_byte_at - ex.upstream_started) * 1000)
    return payload, meta


def record_llm_call(ex: Exchange, engine: Engine) -> None:
    session = ex.session
    call: LLMRequest = ex.call
    result: LLMResult = ex.result
    assert session is not None
    recorder = engine.recorder
    usage = result.usage
    prompt, prompt_digest = new_prompt_messages(
        session.conversation, call, engine.settings.record_full_prompts
    )
    model = result.model or call.model or "unknown"
    if recorder.record_content:
        # built already sanitised (sanitize cuts at DEPTH_LIMIT itself)
        payload, meta = llm_call_payload(ex, prompt, recorder.max_field_bytes)
        # the event's name is the model, cleaned already (sanitize of a str is the payload's model)
        name = payload["model"] if type(model) is str else sanitize(str(model), recorder.max_field_bytes)
    else:
        # a body may nest 10,000 levels deep: the trace keeps DEPTH_LIMIT of them (as sanitize does),
        # so nothing that walks the payload recursively (strip_content) meets the rest
        prompt = jsonparse.cap_depth(prompt, DEPTH_LIMIT, TRUNCATED_MARKER)
        payload, meta = llm_call_payload(ex, prompt, None)
        name = model
    end = ex.upstream_done or time.monotonic()
    event_id = recorder.record(  # (Engine.write_event's, without its hop: one per call)
        session.run_id,
        _LLM_CALL,
        name,
        payload,
        duration_ms=int((end - ex.started) * 1000),
        meta=meta,
        ts=ex.started_wall,
        sanitized=recorder.record_content,
    )
    engine.observe_event(session, _LLM_CALL, model, event_id)
    ex.llm_event_id = event_id
    if ex.upstream_failed():
        # SPEC §4.1: an upstream failure is also an ERROR event (counts.errors)
        error_id = engine.write_event(
            session,
            EventType.ERROR,
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
        engine.observe_event(session, EventType.ERROR, "upstream_error", error_id)
    recorder.add_usage(session.run_id, ex.cost_usd, usage.total_tokens if usage else 0)
    session.conversation.prompt_messages_seen = len(call.messages)
    session.conversation.prompt_digest = prompt_digest
    if result.tool_calls:
        remember_tool_calls(session, result, event_id, time.time())
        record_hosted_calls(ex, engine, result, event_id)
    engine.metrics.observe_llm(
        session.agent,
        ex.priced_model or model,
        usage.prompt_tokens if usage else 0,
        usage.completion_tokens if usage else 0,
        ex.cost_usd,
    )


def http_error(ex: Exchange) -> dict[str, Any]:
    return {
        "error_type": "HTTPError",
        "message": f"upstream answered HTTP {ex.upstream_status}",
        "details": None,
        "stack": None,
    }
