"""Which dialect module handles which path, and that every module has the common interface."""

from __future__ import annotations

import inspect

import pytest

from proxy.dialects import dialect_for, dialect_name
from proxy.dialects.base import LLMRequest

MODULE_API = ("parse_request", "upstream_body", "parse_response", "StreamAccumulator", "render_blocked")


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/v1/chat/completions", "openai_chat"),
        ("/chat/completions", "openai_chat"),
        ("/v1/chat/completions/", "openai_chat"),
        ("/v1/chat/completions?api-version=1", "openai_chat"),
        ("/openai/deployments/gpt4/chat/completions", "openai_chat"),
        ("/v1/responses", "openai_responses"),
        ("/responses", "openai_responses"),
        ("/v1/messages", "anthropic"),
        ("/v1/embeddings", "embeddings"),
        ("/v1/completions", "completions"),
        ("/completions", "completions"),
    ],
)
def test_recorded_paths(path: str, name: str) -> None:
    module = dialect_for(path, "POST")
    assert module is not None and module.DIALECT == name
    assert dialect_name(path, "post") == name


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/v1/models", "GET"),
        ("/v1/chat/completions", "GET"),
        ("/v1/responses/resp_1", "GET"),
        ("/v1/responses/resp_1/cancel", "POST"),
        ("/v1/messages/count_tokens", "POST"),
        ("/v1/threads/t1/messages", "POST"),
        ("/v1/files", "POST"),
        ("/v2/chat", "POST"),
    ],
)
def test_everything_else_is_forwarded_unrecorded(path: str, method: str) -> None:
    assert dialect_for(path, method) is None


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/embeddings", "/v1/completions"]
)
def test_every_module_has_the_common_interface(path: str) -> None:
    module = dialect_for(path, "POST")
    assert module is not None
    for name in MODULE_API:
        assert callable(getattr(module, name)), name
    assert module.BLOCKED_STATUS in (200, 429)
    assert "req" in inspect.signature(module.parse_response).parameters
    req = module.parse_request(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "input": "hi", "prompt": "hi"}
    )
    assert isinstance(req, LLMRequest) and req.dialect == module.DIALECT
    assert module.estimate_prompt_tokens(req) > 0
    content_type, body = module.render_blocked(req, "blocked", "loop")
    assert content_type == "application/json" and body
    accumulator = module.StreamAccumulator(req)
    assert accumulator.feed(b"") == b""
    assert accumulator.finish(False).complete is False


ERROR_BODIES = [
    (b'{"error": {"message": "bad model", "type": "invalid_request_error"}}', "bad model"),
    (b'{"type": "error", "error": {"type": "invalid_request_error", "message": "bad model"}}', "bad model"),
    (b"<html><body>\n\n502 Bad Gateway\n\n</body></html>", "502 Bad Gateway"),
]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/completions"])
@pytest.mark.parametrize(("body", "message"), ERROR_BODIES)
def test_a_plain_error_body_answering_a_stream_passes_through(path: str, body: bytes, message: str) -> None:
    module = dialect_for(path, "POST")
    assert module is not None
    req = module.parse_request({"model": "m", "stream": True, "messages": [], "input": "x", "prompt": "x"})
    for cut in range(len(body) + 1):
        acc = module.StreamAccumulator(req)
        acc.status = 400
        assert acc.feed(body[:cut]) + acc.feed(body[cut:]) == body, cut
        result = acc.finish(True)
        assert result.error is not None, cut
        assert message in result.error["message"] or message in str(result.error["details"]), cut
