"""`proxy/guard_events.py` alone: the LOOP_WARNING and ERROR payloads of a decision, and what a
refused call's ERROR says of the call. Pure: the engine only parses the call here."""

from __future__ import annotations

from proxy.engine import Engine
from proxy.guard_events import call_summary, guard_error, is_tool_call, loop_warning
from proxy.guards.decision import Action, Decision
from proxy.stages.llm_parse import LLMParseStage
from tests.factories import chat_request, make_exchange


def test_a_loop_warning_names_its_pattern_and_evidence() -> None:
    d = Decision(
        Action.WARN,
        "loop_detected",
        "same call",
        kind="identical",
        pattern="search x3",
        threshold=3,
        actual=3,
        evidence=("e1", "e2", "e3"),
    )
    name, payload = loop_warning(d)
    assert name == "search x3"
    assert payload["pattern"] == "search x3" and payload["evidence_event_ids"] == ["e1", "e2", "e3"]
    assert (payload["action"], payload["guardrail"], payload["kind"]) == (
        "warn",
        "loop_detected",
        "identical",
    )
    assert (payload["threshold"], payload["actual"], payload["message"]) == (3, 3, "same call")


def test_an_error_payload_rounds_retry_after_and_takes_extras() -> None:
    d = Decision(Action.BLOCK, "circuit_breaker", "open", retry_after=1.23456)
    payload = guard_error(d, shadow=True)
    assert payload["error_type"] == "circuit_breaker" and payload["action"] == "block"
    assert payload["retry_after"] == 1.235 and payload["shadow"] is True and payload["stack"] is None
    assert "retry_after" not in guard_error(Decision(Action.TERMINATE, "max_llm_calls", "limit"))


async def test_a_refused_llm_call_is_summarised_by_its_upstream_and_model(engine: Engine) -> None:
    ex = make_exchange(body=chat_request(), engine=engine)
    await LLMParseStage(engine.services).request(ex)
    assert not is_tool_call(ex)
    summary = call_summary(ex)
    assert summary == {
        "kind": "llm",
        "upstream": ex.route.upstream,
        "model": ex.call.model,
        "endpoint": "openai_chat",
    }
