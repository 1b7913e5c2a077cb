"""Tripwire's own error answers to an LLM call (SPEC §5.5), in the shape of the call's dialect.

A refusal (TERMINATE, budgets, limits, an open circuit, shared state unreachable), a 400 for a body
Tripwire cannot read, and Tripwire's own upstream errors (502, 504, 503, ...) all reach the agent as
its SDK's own error: each dialect says how its errors look (`error_body`, `bad_request_error`) and
which header a client that shows no body reads (`REFUSAL_REASON_HEADER`), proxy/dialects/contract.py.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

import orjson

from proxy.constants import GUARD_STATE_UNAVAILABLE, RETRYABLE_GUARDS
from proxy.dialects.base import CODEX_REASON_HEADER, openai_error_body
from proxy.dialects.contract import Dialect
from proxy.exchange import Answer, Exchange
from proxy.guards.decision import Decision, retry_after_seconds


def refusal_429(
    decision: Decision, text: str, expose_details: bool, dialect: Dialect | None = None
) -> Answer:
    """TERMINATE / budget / limits / open circuit for an LLM call (SPEC §5.5), in the dialect's shape."""
    error: dict[str, Any] = {
        "message": text,
        "type": "tripwire_guard",
        "code": decision.guard,
        "guardrail": decision.guard,
    }
    if expose_details:
        error["threshold"] = decision.threshold
        error["actual"] = decision.actual
    if decision.resets_at is not None:  # a budget over time: when the agent may call again (SPEC §9)
        error["resets_at"] = decision.resets_at
    headers = {"x-should-retry": "false", "X-Tripwire-Guard": decision.guard}
    retry_later = decision.guard in RETRYABLE_GUARDS or decision.guard == GUARD_STATE_UNAVAILABLE
    if retry_later and decision.retry_after is not None:
        headers["Retry-After"] = str(retry_after_seconds(decision.retry_after))
        # an open circuit (or shared state coming back, or a rate limit's window moving) is worth
        # retrying later: the SDK honours Retry-After
        headers.pop("x-should-retry")
    # shared guard state unreachable under fail_closed: 503, the service is what is missing (SPEC §8)
    status = 503 if decision.guard == GUARD_STATE_UNAVAILABLE else 429
    reason_header = dialect.REFUSAL_REASON_HEADER if dialect is not None else CODEX_REASON_HEADER
    if status == 429 and reason_header is not None:
        # Codex CLI never shows a 429's body, only its request id ("exceeded retry limit, last
        # status: 429 Too Many Requests, request id: ..."): the reason goes there too, so its user
        # reads why (over HTTP, and in the WebSocket error event's `headers`). A 503 it shows.
        headers[reason_header] = header_text(text)
    body = dialect.error_body(status, error) if dialect is not None else openai_error_body(status, error)
    return Answer(status, body, "application/json", headers)


_NOT_HEADER_TEXT = re.compile(r"[^\x20-\x7e]+")
HEADER_TEXT_CHARS = 1000


def header_text(text: str) -> str:
    """`text` as a header value every client accepts: printable ASCII (accents dropped, anything
    else, line breaks too, a space), at most HEADER_TEXT_CHARS characters."""
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return _NOT_HEADER_TEXT.sub(" ", folded)[:HEADER_TEXT_CHARS].strip()


def error_in_dialect(ex: Exchange, answer: Answer) -> Answer:
    """Tripwire's own OpenAI-style error answer (502, 504, 503, ...) in the shape of the call's dialect."""
    dialect: Dialect | None = getattr(ex.protocol, "dialect", None)
    # (an OpenAI-shaped dialect's error is the answer as it is)
    if answer.status < 400 or dialect is None or dialect.error_body is openai_error_body:
        return answer
    try:
        error = orjson.loads(answer.body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return answer
    if not isinstance(error, dict):
        return answer
    answer.body = dialect.error_body(answer.status, error)
    return answer


def bad_request(dialect: Dialect, message: str) -> Answer:
    """A 400 in the protocol's own error shape, so each SDK raises its own BadRequestError."""
    body = dialect.error_body(400, dialect.bad_request_error(message))
    return Answer(400, body, "application/json", {"x-should-retry": "false"})
