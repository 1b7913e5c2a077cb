"""Anthropic Messages dialect: tool_use/tool_result history, cache tokens, streams split at every
byte, and blocked answers that the real anthropic SDK accepts."""

from __future__ import annotations

from typing import Any

import anthropic
import orjson
import pytest
from anthropic.types import Message
from canned_server import Canned, canned_app

from proxy.dialects import anthropic as dialect
from proxy.dialects.base import ToolCall, ToolResult, Usage
from tests.dialect_cases import Case
from tests.factories import anthropic_message, anthropic_request

# this dialect's sample for tests/test_dialect_contract.py
CONTRACT_CASES = {
    "anthropic": Case("/v1/messages", anthropic_request("hi"), anthropic_message("Hello"), True)
}


HISTORY: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 1024,
    "temperature": 0.5,
    "system": [{"type": "text", "text": "be brief"}],
    "messages": [
        {"role": "user", "content": "weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "checking"},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Rome"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "x"}],
                    "is_error": True,
                },
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_3", "name": "weather", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_3", "content": "rain"}]},
    ],
}


def sse(event: str, data: dict) -> bytes:
    return f"event: {event}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"


STREAM = b"".join(
    [
        sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-sonnet-4-5-20250929",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": 10,
                        "cache_creation_input_tokens": 100,
                        "cache_read_input_tokens": 1000,
                        "output_tokens": 1,
                    },
                },
            },
        ),
        sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        b'event: ping\ndata: {"type": "ping"}\n\n',
        sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me "}},
        ),
        sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "look ✓"}},
        ),
        sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_9", "name": "search", "input": {}},
            },
        ),
        sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": ""},
            },
        ),
        sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"q": "pa'},
            },
        ),
        sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": 'ris"}'},
            },
        ),
        sse("content_block_stop", {"type": "content_block_stop", "index": 1}),
        sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 42},
            },
        ),
        sse("message_stop", {"type": "message_stop"}),
    ]
)


def test_parse_request_tool_results_are_not_user_turns() -> None:
    req = dialect.parse_request(HISTORY)
    assert (req.dialect, req.model, req.stream, req.max_tokens, req.temperature) == (
        "anthropic",
        "claude-sonnet-4-5",
        False,
        1024,
        0.5,
    )
    assert req.messages[0] == {"role": "system", "content": HISTORY["system"]}
    assert req.messages[1:] == HISTORY["messages"]
    assert req.steps == [
        [ToolCall("toolu_1", "weather", {"city": "Paris"}), ToolCall("toolu_2", "weather", {"city": "Rome"})],
        [ToolCall("toolu_3", "weather", {})],
    ]
    assert req.turn_start == 0  # both later user messages carry only tool results
    assert req.tool_results == [
        ToolResult("toolu_1", "sunny"),
        ToolResult("toolu_2", [{"type": "text", "text": "x"}], is_error=True),
        ToolResult("toolu_3", "rain"),
    ]
    assert dialect.upstream_body(req, HISTORY) is None


def test_user_text_next_to_tool_results_starts_a_turn() -> None:
    body = {
        **HISTORY,
        "messages": [
            *HISTORY["messages"],
            {"role": "assistant", "content": "ok"},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"},
                    {"type": "text", "text": "now something else"},
                ],
            },
        ],
    }
    req = dialect.parse_request(body)
    assert len(req.steps) == 3 and req.turn_start == 3


def test_parse_response_adds_cache_tokens_to_prompt() -> None:
    body = {
        "id": "msg_2",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "text", "text": "Sure."},
            {"type": "tool_use", "id": "toolu_5", "name": "run", "input": {"cmd": "ls"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 5,
            "cache_creation_input_tokens": 20,
            "cache_read_input_tokens": 300,
            "output_tokens": 9,
        },
    }
    result = dialect.parse_response(200, orjson.dumps(body))
    assert (result.text, result.stop_reason, result.response_id) == ("Sure.", "tool_use", "msg_2")
    assert result.tool_calls == [ToolCall("toolu_5", "run", {"cmd": "ls"})]
    assert result.usage == Usage(325, 9, 334, cached_tokens=300, cache_creation_tokens=20)


def test_parse_response_error() -> None:
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    result = dialect.parse_response(529, orjson.dumps(body))
    assert result.error is not None
    assert (result.error["error_type"], result.error["message"]) == ("overloaded_error", "Overloaded")


def feed_split(stream: bytes, cuts: list[int], complete: bool = True) -> dialect.LLMResult:
    acc = dialect.StreamAccumulator(dialect.parse_request({**HISTORY, "stream": True}))
    start = 0
    for cut in [*cuts, len(stream)]:
        piece = stream[start:cut]
        assert acc.feed(piece) == piece  # pass-through, unchanged
        start = cut
    return acc.finish(complete)


def test_stream_at_every_split() -> None:
    for cut in range(len(STREAM) + 1):
        result = feed_split(STREAM, [cut])
        assert result.text == "Let me look ✓", cut
        assert result.tool_calls == [ToolCall("toolu_9", "search", {"q": "paris"})]
        assert result.usage == Usage(1110, 42, 1152, cached_tokens=1000, cache_creation_tokens=100)
        assert (result.stop_reason, result.model, result.response_id) == (
            "tool_use",
            "claude-sonnet-4-5-20250929",
            "msg_1",
        )
        assert result.complete and result.error is None


def test_message_delta_usage_is_cumulative_and_overrides() -> None:
    stream = STREAM.replace(
        b'"usage":{"output_tokens":42}', b'"usage":{"input_tokens":12,"output_tokens":42}'
    )
    assert stream != STREAM
    result = feed_split(stream, [])
    assert result.usage is not None and result.usage.prompt_tokens == 1112


def test_stream_without_message_stop_is_incomplete() -> None:
    broken = STREAM[: STREAM.index(b"event: message_stop")]
    result = feed_split(broken, [100])
    assert result.complete is False
    assert result.error is not None and result.error["error_type"] == "stream_incomplete"
    assert result.tool_calls[0].arguments == {"q": "paris"}


def test_stream_error_event() -> None:
    stream = (
        STREAM[:300]
        + b"\n\n"
        + sse("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    )
    result = feed_split(stream, [])
    assert result.error is not None and result.error["error_type"] == "overloaded_error"
    assert result.complete is False


def test_render_blocked_json_validates_as_message() -> None:
    content_type, body = dialect.render_blocked(dialect.parse_request(HISTORY), "[tripwire] blocked", "loop")
    assert content_type == "application/json"
    message = Message.model_validate(orjson.loads(body))
    assert message.stop_reason == "end_turn"
    assert message.content[0].type == "text" and message.content[0].text == "[tripwire] blocked"
    assert message.usage.input_tokens == 0 and message.usage.output_tokens == 0
    assert message.id.startswith("msg_tripwire_")


@pytest.fixture
async def sdk(aiohttp_server: Any) -> tuple[anthropic.AsyncAnthropic, Canned]:
    canned = Canned()
    server = await aiohttp_server(canned_app(canned), host="127.0.0.1")
    client = anthropic.AsyncAnthropic(base_url=str(server.make_url("")), api_key="sk-ant-test", max_retries=0)
    return client, canned


async def test_sdk_reads_blocked_json(sdk: tuple[anthropic.AsyncAnthropic, Canned]) -> None:
    client, canned = sdk
    canned.content_type, canned.body = dialect.render_blocked(
        dialect.parse_request(HISTORY), "blocked!", "loop"
    )
    message = await client.messages.create(
        model="claude-tripwire-test", max_tokens=10, messages=[{"role": "user", "content": "x"}]
    )
    assert message.content[0].type == "text" and message.content[0].text == "blocked!"
    assert message.stop_reason == "end_turn"


async def test_sdk_stream_helper_reads_blocked_stream(sdk: tuple[anthropic.AsyncAnthropic, Canned]) -> None:
    client, canned = sdk
    req = dialect.parse_request({**HISTORY, "stream": True})
    canned.content_type, canned.body = dialect.render_blocked(req, "blocked!", "loop")
    assert canned.content_type.startswith("text/event-stream")
    async with client.messages.stream(
        model="claude-tripwire-test", max_tokens=10, messages=[{"role": "user", "content": "x"}]
    ) as stream:
        texts = [t async for t in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(texts) == "blocked!"
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 0


async def test_sdk_raw_stream_of_blocked_answer_and_our_accumulator(
    sdk: tuple[anthropic.AsyncAnthropic, Canned],
) -> None:
    client, canned = sdk
    req = dialect.parse_request({**HISTORY, "stream": True})
    canned.content_type, canned.body = dialect.render_blocked(req, "blocked!", "loop")
    stream = await client.messages.create(
        model="claude-tripwire-test", max_tokens=10, messages=[{"role": "user", "content": "x"}], stream=True
    )
    types = [event.type async for event in stream]
    assert types == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    # our own accumulator reads our synthetic stream too (e.g. when a test drives the proxy)
    acc = dialect.StreamAccumulator(req)
    acc.feed(canned.body)
    result = acc.finish(True)
    assert (result.text, result.stop_reason, result.complete) == ("blocked!", "end_turn", True)


async def test_sdk_reads_a_real_shaped_stream_split_in_pieces(
    sdk: tuple[anthropic.AsyncAnthropic, Canned],
) -> None:
    """The stream fixture is what the SDK itself accepts (so the accumulator tests use a real shape)."""
    client, canned = sdk
    canned.content_type = "text/event-stream"
    canned.chunks = [STREAM[i : i + 23] for i in range(0, len(STREAM), 23)]
    async with client.messages.stream(
        model="claude-tripwire-test", max_tokens=10, messages=[{"role": "user", "content": "x"}]
    ) as stream:
        final = await stream.get_final_message()
    assert final.content[1].type == "tool_use" and final.content[1].input == {"q": "paris"}
    assert final.usage.output_tokens == 42
