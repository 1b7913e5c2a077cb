"""Tripwire's own error answers to an LLM call in the call's dialect (proxy/llm_errors.py): each
dialect's shape comes from the dialect (its `error_body`, `bad_request_error`,
`REFUSAL_REASON_HEADER`), whichever dialect it is."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest

from proxy.constants import GUARD_STATE_UNAVAILABLE
from proxy.dialects import anthropic, completions, embeddings, openai_chat, openai_responses
from proxy.dialects.contract import Dialect
from proxy.exchange import Answer, Exchange
from proxy.forward import json_error
from proxy.guards.decision import Action, Decision
from proxy.llm_errors import bad_request, error_in_dialect, refusal_429

DIALECTS: list[Any] = [openai_chat, openai_responses, anthropic, embeddings, completions]


def exchange_of(dialect: Any) -> Exchange:
    return cast(Exchange, SimpleNamespace(protocol=SimpleNamespace(dialect=dialect)))


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.DIALECT)
def test_a_refusal_is_the_dialects_error_with_its_reason_header(dialect: Dialect) -> None:
    decision = Decision(Action.TERMINATE, guard="budget", threshold=1.0, actual=2.0, message="over")
    answer = refusal_429(decision, "over budget", True, dialect)
    assert answer.status == 429 and answer.headers["X-Tripwire-Guard"] == "budget"
    assert answer.body == dialect.error_body(
        429, orjson.loads(answer.body)["error"] | {"type": "tripwire_guard"}
    )
    header = dialect.REFUSAL_REASON_HEADER
    assert (header is not None and answer.headers[header] == "over budget") or (
        header is None and "x-request-id" not in answer.headers
    )


def test_unreachable_shared_state_is_a_503_without_the_reason_header() -> None:
    decision = Decision(Action.TERMINATE, guard=GUARD_STATE_UNAVAILABLE, message="down")
    answer = refusal_429(decision, "down", False, openai_chat)
    assert answer.status == 503 and "x-request-id" not in answer.headers
    assert "threshold" not in orjson.loads(answer.body)["error"]


def test_an_openai_shaped_dialect_keeps_tripwires_own_error_as_it_is() -> None:
    answer = json_error(502, "upstream unreachable", "upstream_unreachable", "upstream_unreachable")
    body = answer.body
    assert error_in_dialect(exchange_of(openai_responses), answer).body is body
    assert error_in_dialect(exchange_of(None), answer).body is body  # not an LLM call


def test_tripwires_own_error_is_reshaped_for_anthropic() -> None:
    answer = json_error(504, "too slow", "upstream_timeout", "upstream_timeout")
    body = orjson.loads(error_in_dialect(exchange_of(anthropic), answer).body)
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    assert body["error"]["message"] == "too slow" and body["error"]["code"] == "upstream_timeout"
    ok = Answer(200, b"{}", "application/json", {})
    assert error_in_dialect(exchange_of(anthropic), ok).body == b"{}"  # only errors


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.DIALECT)
def test_a_bad_request_is_a_400_the_sdk_reads(dialect: Dialect) -> None:
    answer = bad_request(dialect, "not JSON")
    assert answer.status == 400 and answer.headers == {"x-should-retry": "false"}
    error = orjson.loads(answer.body)["error"]
    assert error["message"] == "not JSON" and error["type"] == "invalid_request_error"
