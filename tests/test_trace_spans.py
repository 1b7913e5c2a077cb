"""proxy/trace/spans.py (events as GenAI-convention spans, pure) and the recorder's event sinks."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from proxy.recorder import TraceRecorder
from proxy.settings import Settings
from proxy.trace import sinks
from proxy.trace.spans import span_for, span_id_of

RUN = str(uuid.uuid4())
T0 = 1_760_000_000.25


def event(event_type: str, payload: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"event_type": event_type, "run_id": RUN, "event_id": str(uuid.uuid4()), "payload": payload, **kw}


def test_a_failed_llm_call_is_an_error_span_without_a_response_model() -> None:
    e = event(
        "LLM_CALL",
        {
            "model": "claude-x",
            "request_model": "claude-x",
            "endpoint": "anthropic",
            "provider": "anthropic",
            "status": "error",
            "error": {"error_type": "HTTPError", "message": "upstream answered HTTP 500"},
            "usage": None,
            "http_status": 500,
        },
        duration_ms=40,
    )
    span = span_for(e, T0, agent="a", session_id="s")
    assert span is not None
    assert span.name == "chat claude-x" and span.client
    assert span.error == "upstream answered HTTP 500"
    a = span.attributes
    assert a["error.type"] == "HTTPError" and a["http.response.status_code"] == 500
    assert a["gen_ai.provider.name"] == "anthropic" and "gen_ai.response.model" not in a
    assert "gen_ai.usage.input_tokens" not in a
    assert (span.start_ns, span.end_ns) == (int(T0 * 1e9), int(T0 * 1e9) + 40_000_000)
    assert span.trace_id == uuid.UUID(RUN).int and span.parent_span_id == span_id_of(RUN)


def test_operation_follows_the_endpoint() -> None:
    e = event("LLM_CALL", {"model": "text-embedding-3-small", "endpoint": "embeddings", "status": "ok"})
    span = span_for(e, T0, agent="a", session_id="s")
    assert span is not None and span.name == "embeddings text-embedding-3-small"
    assert span.attributes["gen_ai.operation.name"] == "embeddings"


def test_a_function_tool_ends_when_its_result_arrives_under_the_llm_call_that_asked() -> None:
    asked_by = str(uuid.uuid4())
    e = event(
        "TOOL_CALL",
        {"tool_name": "shell", "source": "llm", "status": "ok", "tool_call_id": "call_1"},
        duration_ms=1500,
        parent_id=asked_by,
    )
    span = span_for(e, T0, agent="a", session_id="s")
    assert span is not None and not span.client
    assert span.end_ns == int(T0 * 1e9) and span.end_ns - span.start_ns == 1_500_000_000
    assert span.parent_span_id == span_id_of(asked_by)
    assert span.attributes["gen_ai.tool.call.id"] == "call_1"


def test_a_refused_tool_call_is_an_error_span_naming_the_guard() -> None:
    e = event(
        "ERROR",
        {
            "error_type": "loop_detection",
            "message": "search called 5 times with the same arguments",
            "guardrail": "loop_detection",
            "action": "block",
            "call": {"kind": "tool", "server": "web", "tool_name": "search", "args": {"q": "x"}},
        },
    )
    span = span_for(e, T0, agent="a", session_id="s")
    assert span is not None and span.name == "execute_tool search"
    assert span.error == "search called 5 times with the same arguments"
    a = span.attributes
    assert (
        a["error.type"] == a["tripwire.guard"] == "loop_detection" and a["tripwire.guard.action"] == "block"
    )
    assert a["tripwire.mcp.server"] == "web" and "q" not in str(a)  # no arguments leave
    assert span.start_ns == span.end_ns


@pytest.mark.parametrize(
    "e",
    [
        event("ERROR", {"error_type": "upstream_error", "guardrail": None, "message": "HTTP 500"}),
        event("ERROR", {"guardrail": "max_llm_calls", "shadow": True, "call": {"kind": "llm", "model": "m"}}),
        event("LOOP_WARNING", {"pattern": "a -> b"}),
        event("STATE_UPDATE", {"state": {}}),
        event("RUN_START", {"run_name": "r"}),
        {**event("LLM_CALL", {"model": "m", "status": "ok"}), "run_id": "not-a-uuid"},
    ],
    ids=["upstream-error", "shadow-refusal", "loop-warning", "state-update", "run-start", "bad-run-id"],
)
def test_events_that_are_not_calls_have_no_span(e: dict[str, Any]) -> None:
    assert span_for(e, T0, agent="a", session_id="s") is None


def test_run_end_is_the_root_span_over_the_whole_run() -> None:
    summary = {
        "llm_calls": 3,
        "tool_calls": 2,
        "errors": 0,
        "duration_ms": 9000,
        "cost_usd": 0.5,
        "total_tokens": 700,
    }
    e = event("RUN_END", {"status": "ok", "summary": summary, "reason": "idle_timeout"})
    span = span_for(e, T0, agent="research", session_id="s")
    assert span is not None and span.parent_span_id is None and span.span_id == span_id_of(RUN)
    assert span.name == "invoke_agent research" and span.error is None
    assert span.end_ns - span.start_ns == 9_000_000_000
    a = span.attributes
    assert a["gen_ai.operation.name"] == "invoke_agent" and a["tripwire.cost_usd"] == 0.5
    assert a["tripwire.llm_calls"] == 3 and a["tripwire.end_reason"] == "idle_timeout"


class Collecting:
    name = "collect"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[tuple[str, str, str]] = []
        self.closed = False

    def accept(self, event: dict[str, Any], ts: float, *, agent: str, session_id: str) -> None:
        if self.fail:
            raise RuntimeError("sink bug")
        self.seen.append((event["event_type"], agent, session_id))

    def health(self) -> dict[str, Any]:
        return {"seen": len(self.seen)}

    async def close(self) -> None:
        self.closed = True


async def test_every_event_reaches_the_sinks_and_a_failing_sink_fails_nothing(tmp_path: Path) -> None:
    good, bad = Collecting(), Collecting(fail=True)
    rec = TraceRecorder(tmp_path, sinks=[bad])
    rec.add_sink(good)
    await rec.start()
    run_id = rec.start_run(run_name="r", agent_name="bot", session_id="s1")
    rec.record(run_id, "LLM_CALL", "m", {"model": "m"})
    rec.end_run(run_id, status="ok", reason="done")
    await rec.close()
    assert good.seen == [("RUN_START", "bot", "s1"), ("LLM_CALL", "bot", "s1"), ("RUN_END", "bot", "s1")]
    assert rec.sink_errors == 3 and good.closed and bad.closed
    assert rec.health()["exporters"] == {"collect": {"seen": 3}}
    events = (tmp_path / "runs" / run_id / "events.jsonl").read_text().splitlines()
    assert len(events) == 3  # the files are untouched by the failing sink


def test_no_sinks_by_default_and_a_clear_error_without_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sinks.from_settings(Settings()) == []
    monkeypatch.setitem(sys.modules, "proxy.trace.otlp", None)  # as if the otlp extra were missing
    with pytest.raises(sinks.SinkUnavailable, match=r"pip install 'tripwire\[otlp\]'"):
        sinks.from_settings(Settings.model_validate({"otlp": {"endpoint": "http://127.0.0.1:4318"}}))
