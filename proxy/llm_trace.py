"""What an LLM call writes to the trace: its LLM_CALL (the payload built as the recorder keeps it,
only the prompt messages new since the session's previous call), an ERROR when the upstream failed,
and the TOOL_CALLs of the tool results a later request brings and of the tools the provider ran
itself. proxy/llm.py's protocol adapter and tool-results stage call it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from proxy import guard_trace, jsonparse
from proxy.constants import DEPTH_LIMIT, TRUNCATED_MARKER, EventType
from proxy.dialects import of_call
from proxy.dialects.base import PROVIDER_OPENAI, LLMRequest, LLMResult, ToolResult, Usage
from proxy.episodes import call_digests
from proxy.exchange import Exchange
from proxy.redact import PLAIN, sanitize, sanitize_text
from proxy.sessions import Conversation, PendingToolCall, Session

if TYPE_CHECKING:
    from proxy.metrics import Metrics
    from proxy.recorder import TraceRecorder
    from proxy.session_policy import SessionPolicy
    from proxy.settings import Settings


class Engine(Protocol):
    """What the trace of an LLM call uses of the engine (proxy/engine.py satisfies it): no import of it."""

    @property
    def settings(self) -> Settings: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def recorder(self) -> TraceRecorder: ...
    @property
    def policy(self) -> SessionPolicy: ...


_LLM_CALL: str = EventType.LLM_CALL.value  # a plain str: an enum member's lookup costs more (per call)


def new_prompt_messages(conversation: Conversation, call: LLMRequest, full: bool) -> tuple[list[Any], str]:
    """The messages new since the session's previous LLM call, and the digest of this call's.

    New means after the previous call's messages, when this call's history starts with exactly
    them (compared by content, not by count, as lineage compares them: an Anthropic client moves its
    `cache_control` markers on every request, which is no edit); otherwise (the first call, another
    conversation, an edited history) all of them. Storing only the new part keeps a long
    conversation's trace linear, not quadratic.
    """
    seen = conversation.prompt_messages_seen
    messages = call.messages
    # the digests of every prefix, which the session lookup already took (episodes.call_digests)
    digests = call_digests(call).lineage
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
    if not result.tool_calls:
        return  # (most answers: no dict of pending calls made for them)
    pending = session.conversation.pending_tool_calls
    for tc in result.tool_calls:
        if tc.hosted:
            continue
        if tc.inside is not None:  # ran by an exec call's script: recorded with that call's result
            if tc.inside in pending:
                pending[tc.inside].nested.append(tc)
            continue
        pending[tc.id] = PendingToolCall(
            name=tc.name, arguments=tc.arguments, asked_at=wall, llm_event_id=llm_event_id
        )
    if result.response_id and result.tool_calls:
        session.conversation.response_tool_calls[result.response_id] = list(result.tool_calls)


def error_text(content: Any, limit: int = 500) -> str:
    """A failed tool's result as a short text; a deeply nested one as JSON (its repr recurses)."""
    if isinstance(content, str):
        return content[:limit]
    if jsonparse.max_depth(content) > DEPTH_LIMIT:
        return jsonparse.dumps_text(jsonparse.cap_depth(content, DEPTH_LIMIT, TRUNCATED_MARKER))[:limit]
    return str(content)[:limit]


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
    event_id = engine.policy.write_event(
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
        engine.policy.observe_event(session, EventType.TOOL_CALL, tc.name, event_id)


HOSTED_META = {"hosted": True}


def _as_is(value: Any, max_field_bytes: int, depth: int = 0) -> Any:
    return value


# The names an LLM_CALL repeats from call to call of a session (the models, the upstream, the
# endpoint, the stop reason, the agent and the session id), as sanitize makes them: remembered by
# value, so a session's calls clean them once instead of a sanitize call each per event. Bounded:
# at _NAMES_KEPT sets it starts over; a set with a long value (or not a str) is cleaned every
# time, not kept. The names but the last (the session id) are remembered apart too (`_SHARED`): a
# stateless service's every call is a new session (issue 33), whose other names are those of the
# calls before it, so a new session cleans its own id only.
_NAMES: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_SHARED: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_NAMES_KEPT = 1024
_NAME_CHARS = 256


def _keep(memo: dict[tuple[Any, ...], tuple[Any, ...]], key: tuple[Any, ...], found: tuple[Any, ...]) -> None:
    """Remember `found` for `key` (`max_field_bytes`, the names), unless a name is not a short str or None
    (1, 1.0 and True are equal keys whose cleaned values differ)."""
    if all(v is None or (type(v) is str and len(v) <= _NAME_CHARS) for v in key[1:]):
        if len(memo) >= _NAMES_KEPT:
            memo.clear()
        memo[key] = found


def clean_names(names: tuple[Any, ...], max_field_bytes: int) -> tuple[Any, ...]:
    """`sanitize(name, max_field_bytes, 1)` of each of `names`, the session id last (see _NAMES)."""
    key = (max_field_bytes, *names)
    try:
        found = _NAMES.get(key)
    except TypeError:  # not a name (an unhashable value): cleaned as anything else
        return tuple([sanitize(v, max_field_bytes, 1) for v in names])
    if found is None:
        shared_key = key[:-1]
        shared = _SHARED.get(shared_key)
        if shared is None:
            shared = tuple([sanitize(v, max_field_bytes, 1) for v in names[:-1]])
            _keep(_SHARED, shared_key, shared)
        found = (*shared, sanitize(names[-1], max_field_bytes, 1))
        _keep(_NAMES, key, found)
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
    assert session is not None
    dialect = of_call(call)
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
            if tc.inside is None  # the answer as the model gave it (an exec call, not its script's calls)
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
        "provider": dialect.PROVIDER if dialect is not None else PROVIDER_OPENAI,
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
    engine.policy.observe_event(session, _LLM_CALL, model, event_id)
    ex.llm_event_id = event_id
    if ex.upstream_failed():
        # SPEC §4.1: an upstream failure is also an ERROR event (counts.errors)
        error_id = engine.policy.write_event(
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
        engine.policy.observe_event(session, EventType.ERROR, "upstream_error", error_id)
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
