"""One `response.create` on a Responses socket, without a socket (proxy/websocket/calls.py): its
events reach the dialect's stream accumulator as the SSE stream's would, a request-level error is
read as an HTTP error answer, and a refusal becomes the protocol's `error` event (a BLOCK: the
synthetic response's events). The whole path is tests/test_websocket.py's."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.dialects import openai_responses
from proxy.exchange import Answer
from proxy.forward import json_error
from proxy.guards.decision import Action, Decision
from proxy.llm_errors import refusal_429
from proxy.sse import SSEDecoder
from proxy.websocket.calls import SocketCall, refusal_messages, sse_of
from tests.factories import RESPONSES, make_exchange, responses_request


def test_a_message_is_one_sse_event_whatever_its_line_breaks() -> None:
    text = '{"type":\r\n"response.created",\r"n":\n1}'
    events = SSEDecoder().feed(sse_of(text))
    assert len(events) == 1 and orjson.loads(events[0].data or "") == {"type": "response.created", "n": 1}


def test_a_refusal_is_the_error_event_with_the_http_refusals_fields() -> None:
    decision = Decision(Action.TERMINATE, guard="budget", threshold=1.0, actual=2.0, message="over")
    answer = refusal_429(decision, "over budget", True, openai_responses)
    (message,) = refusal_messages(answer, "lane-1")
    event = orjson.loads(message)
    assert event["type"] == "error" and event["status"] == 429 and event["stream_id"] == "lane-1"
    assert event["error"]["code"] == "budget" and event["error"]["param"] is None
    assert event["headers"]["x-tripwire-guard"] == "budget"  # lower-cased, as a socket's headers
    (unreadable,) = refusal_messages(Answer(500, b"<html>oops", "text/html", {}), None)
    error = orjson.loads(unreadable)
    assert "stream_id" not in error and error["error"] == {
        "type": "tripwire_error",
        "code": None,
        "message": "<html>oops",
        "param": None,
    }


def test_a_block_is_the_synthetic_responses_events_on_the_callers_lane() -> None:
    call = openai_responses.parse_request(responses_request("hi", stream=True))
    content_type, body = openai_responses.render_blocked(call, "blocked by tripwire", "loop")
    messages = [orjson.loads(m) for m in refusal_messages(Answer(200, body, content_type, {}), "s")]
    assert messages[-1]["type"] == "response.completed" and {m["stream_id"] for m in messages} == {"s"}


async def noop(call: SocketCall) -> None:
    return None


def exchange_with_accumulator() -> Any:
    ex = make_exchange("POST", RESPONSES, body=responses_request("hi", stream=True))
    ex.call = openai_responses.parse_request(responses_request("hi", stream=True))
    ex.observer = openai_responses.StreamAccumulator(ex.call)
    return ex


async def test_only_a_response_event_starts_the_call() -> None:
    call = SocketCall(noop, "{}", None)
    call.ex = exchange_with_accumulator()
    call.feed('{"type": "codex.rate_limits"}', "codex.rate_limits", None)
    assert not call.started and call.ex.first_byte_at is not None
    call.feed('{"type": "response.created", "response": {"id": "resp_1"}}', "response.created", "resp_1")
    assert call.started and call.response_id == "resp_1" and call.fed


async def test_a_request_error_answers_the_call_as_an_http_error() -> None:
    call = SocketCall(noop, "{}", None)
    ex = call.ex = exchange_with_accumulator()
    error = json_error(429, "slow down", "rate_limit_exceeded", "rate_limited").body.decode()
    call.fail_with(error, 429)
    assert call.done.done() and call.admitted.result() is False
    assert ex.upstream_status == 429 and ex.observer.status == 429
    result = ex.observer.finish(True)
    assert result.error is not None and "slow down" in str(result.error)


async def test_a_call_settles_once_and_keeps_the_first_reason() -> None:
    call = SocketCall(noop, "{}", None)
    ex = call.ex = exchange_with_accumulator()
    call.settle(reason="the client closed the WebSocket before the answer ended")
    call.settle(upstream_error="later")
    assert ex.stream_complete is False and ex.upstream_error is None
    assert ex.incomplete_reason == "the client closed the WebSocket before the answer ended"
