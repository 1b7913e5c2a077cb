"""Embeddings and legacy completions: reported usage, estimated usage when none, streams, and
answers that the real openai SDK accepts."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest
from canned_server import Canned, canned_app
from openai.types import Completion

from proxy.dialects import completions, embeddings
from proxy.dialects.base import Usage
from tests.dialect_cases import Case

EMBEDDINGS_ANSWER = {
    "object": "list",
    "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
    "model": "text-embedding-3-small",
    "usage": {"prompt_tokens": 5, "total_tokens": 5},
}
COMPLETIONS_ANSWER = {
    "id": "cmpl-fake",
    "object": "text_completion",
    "created": 1700000000,
    "model": "gpt-3.5-turbo-instruct",
    "choices": [{"text": "Hello", "index": 0, "logprobs": None, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}
# these dialects' samples for tests/test_dialect_contract.py
CONTRACT_CASES = {
    "embeddings": Case(
        "/v1/embeddings", {"model": "text-embedding-3-small", "input": "hi"}, EMBEDDINGS_ANSWER, False
    ),
    "completions": Case(
        "/v1/completions", {"model": "gpt-3.5-turbo-instruct", "prompt": "Say hi"}, COMPLETIONS_ANSWER, True
    ),
}


def frame(data: Any) -> bytes:
    return b"data: " + (data.encode() if isinstance(data, str) else orjson.dumps(data)) + b"\n\n"


def cmpl_chunk(text: str, finish: str | None = None, **extra: Any) -> dict:
    body: dict[str, Any] = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "gpt-3.5-turbo-instruct",
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
    }
    body.update(extra)
    return body


USAGE = frame(
    cmpl_chunk("", choices=[], usage={"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8})
)
STREAM = (
    frame(cmpl_chunk("Once"))
    + frame(cmpl_chunk(" upon"))
    + frame(cmpl_chunk("", "length"))
    + USAGE
    + frame("[DONE]")
)


# --- embeddings -----------------------------------------------------------------------------


def test_embeddings_request_and_reported_usage() -> None:
    req = embeddings.parse_request({"model": "text-embedding-3-small", "input": ["a", "b"]})
    assert (req.dialect, req.model, req.stream, req.messages) == (
        "embeddings",
        "text-embedding-3-small",
        False,
        ["a", "b"],
    )
    assert embeddings.upstream_body(req, {}) is None
    body = {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": [0.1]},
            {"object": "embedding", "index": 1, "embedding": [0.2]},
        ],
        "model": "text-embedding-3-small",
        "usage": {"prompt_tokens": 7, "total_tokens": 7},
    }
    result = embeddings.parse_response(200, orjson.dumps(body), req)
    assert result.usage == Usage(prompt_tokens=7, total_tokens=7)
    assert (result.model, result.text, result.error) == ("text-embedding-3-small", "", None)


def test_embeddings_without_usage_are_estimated() -> None:
    req = embeddings.parse_request({"model": "local-embed", "input": "x" * 40})
    body = {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.1]}],
        "model": "local-embed",
    }
    result = embeddings.parse_response(200, orjson.dumps(body), req)
    assert result.usage == Usage(prompt_tokens=10, total_tokens=10, estimated=True)


def test_token_id_inputs_count_as_tokens() -> None:
    assert embeddings.estimate_prompt_tokens(embeddings.parse_request({"input": [1, 2, 3]})) == 3
    assert embeddings.estimate_prompt_tokens(embeddings.parse_request({"input": [[1, 2], [3, 4, 5]]})) == 5
    assert embeddings.estimate_prompt_tokens(embeddings.parse_request({"input": ["abcdefgh", "abcd"]})) == 3


def test_embeddings_error() -> None:
    result = embeddings.parse_response(
        401, b'{"error": {"message": "bad key", "type": "invalid_request_error"}}'
    )
    assert result.error is not None and result.error["message"] == "bad key"


def test_embeddings_accumulator_and_blocked() -> None:
    req = embeddings.parse_request({"model": "m", "input": "x"})
    acc = embeddings.StreamAccumulator(req)
    body = b'{"object":"list","data":[],"model":"m","usage":{"prompt_tokens":2,"total_tokens":2}}'
    assert acc.feed(body[:10]) + acc.feed(body[10:]) == body
    assert acc.finish(True).usage == Usage(prompt_tokens=2, total_tokens=2)
    content_type, blocked = embeddings.render_blocked(req, "no", "loop")
    assert content_type == "application/json"
    assert embeddings.BLOCKED_STATUS == 429 and completions.BLOCKED_STATUS == 200
    assert orjson.loads(blocked)["error"]["code"] == "loop"


# --- legacy completions ---------------------------------------------------------------------


def test_completions_request_and_usage_injection() -> None:
    body = {"model": "gpt-3.5-turbo-instruct", "prompt": "Once", "max_tokens": 16, "stream": True}
    req = completions.parse_request(body)
    assert (req.dialect, req.messages, req.max_tokens, req.stream, req.client_asked_usage) == (
        "completions",
        ["Once"],
        16,
        True,
        False,
    )
    assert completions.upstream_body(req, body) == {**body, "stream_options": {"include_usage": True}}


def test_completions_response_with_and_without_usage() -> None:
    req = completions.parse_request({"model": "m", "prompt": "p" * 80})
    body = {
        "id": "cmpl-2",
        "model": "m",
        "choices": [{"text": "t" * 20, "index": 0, "finish_reason": "stop"}],
    }
    result = completions.parse_response(200, orjson.dumps(body), req)
    assert (result.text, result.stop_reason, result.response_id) == ("t" * 20, "stop", "cmpl-2")
    assert result.usage == Usage(prompt_tokens=20, completion_tokens=5, total_tokens=25, estimated=True)
    body["usage"] = {"prompt_tokens": 21, "completion_tokens": 6, "total_tokens": 27}
    assert completions.parse_response(200, orjson.dumps(body), req).usage == Usage(21, 6, 27)


def test_completions_stream_filters_usage_at_every_split() -> None:
    req = completions.parse_request({"model": "m", "prompt": "Once", "stream": True})
    for cut in range(len(STREAM) + 1):
        acc = completions.StreamAccumulator(req)
        out = acc.feed(STREAM[:cut]) + acc.feed(STREAM[cut:])
        assert out == STREAM.replace(USAGE, b""), cut
        result = acc.finish(True)
        assert (result.text, result.stop_reason, result.complete) == ("Once upon", "length", True)
        assert result.usage == Usage(5, 3, 8)


def test_completions_stream_without_usage_is_estimated() -> None:
    req = completions.parse_request({"model": "m", "prompt": "p" * 40, "stream": True})
    acc = completions.StreamAccumulator(req)
    acc.feed(STREAM.replace(USAGE, b""))
    usage = acc.finish(True).usage
    assert usage == Usage(prompt_tokens=10, completion_tokens=3, total_tokens=13, estimated=True)


def test_completions_blocked_json_validates() -> None:
    content_type, body = completions.render_blocked(
        completions.parse_request({"model": "m", "prompt": "x"}), "blocked", "loop"
    )
    completion = Completion.model_validate(orjson.loads(body))
    assert completion.choices[0].text == "blocked" and completion.choices[0].finish_reason == "stop"
    assert content_type == "application/json"


@pytest.fixture
async def sdk(aiohttp_server: Any) -> tuple[openai.AsyncOpenAI, Canned]:
    canned = Canned()
    server = await aiohttp_server(canned_app(canned), host="127.0.0.1")
    client = openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="sk-test", max_retries=0)
    return client, canned


async def test_sdk_reads_blocked_completion_stream(sdk: tuple[openai.AsyncOpenAI, Canned]) -> None:
    client, canned = sdk
    req = completions.parse_request({"model": "m", "prompt": "x", "stream": True})
    canned.content_type, canned.body = completions.render_blocked(req, "blocked", "loop")
    stream = await client.completions.create(model="m", prompt="x", stream=True)
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks) == "blocked"
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_sdk_reads_blocked_embeddings_as_an_api_error(sdk: tuple[openai.AsyncOpenAI, Canned]) -> None:
    client, canned = sdk
    req = embeddings.parse_request({"model": "m"})
    canned.content_type, canned.body = embeddings.render_blocked(req, "[tripwire] blocked: loop", "loop")
    canned.status = embeddings.BLOCKED_STATUS
    with pytest.raises(openai.RateLimitError) as info:
        await client.embeddings.create(model="m", input="x")
    assert info.value.code == "loop"
    assert "[tripwire] blocked: loop" in str(info.value)
