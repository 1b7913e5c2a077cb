"""Chat Completions dialect: requests, answers, streamed tool-call deltas, usage-chunk filtering,
and blocked answers that the real openai SDK accepts."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest
from canned_server import Canned, canned_app
from openai.types.chat import ChatCompletion

from proxy.dialects import openai_chat as chat
from proxy.dialects.base import ToolCall, ToolResult, Usage
from tests.dialect_cases import Case
from tests.factories import chat_completion, chat_request

# this dialect's sample for tests/test_dialect_contract.py
CONTRACT_CASES = {"openai_chat": Case("/v1/chat/completions", chat_request(), chat_completion("Hello"), True)}


HISTORY: dict[str, Any] = {
    "model": "gpt-4o",
    "temperature": 0.2,
    "max_tokens": 256,
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first question"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"q": "a"}'},
                },
                {"id": "call_2", "type": "function", "function": {"name": "read", "arguments": "not json"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "result a"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "r"}]},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "second question"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_3",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"q": "b"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_3", "content": "result b"},
    ],
}


def chunk(delta: dict | None = None, finish: str | None = None, **extra: Any) -> dict:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}],
        "usage": None,
    }
    body.update(extra)
    return body


def frame(data: Any) -> bytes:
    return b"data: " + (data.encode() if isinstance(data, str) else orjson.dumps(data)) + b"\n\n"


USAGE_CHUNK = frame(
    chunk(
        choices=[],
        usage={
            "prompt_tokens": 120,
            "completion_tokens": 30,
            "total_tokens": 150,
            "prompt_tokens_details": {"cached_tokens": 64},
        },
    )
)
TOOL_STREAM_PARTS = [
    frame(chunk({"role": "assistant", "content": None})),
    frame(
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "search", "arguments": ""},
                    }
                ]
            }
        )
    ),
    frame(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q": '}}]})),
    frame(
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "read", "arguments": ""},
                    }
                ]
            }
        )
    ),
    frame(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"héllo"}'}}]})),
    frame(chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"path": "/x"}'}}]})),
    b": keep-alive\n\n",
    frame(chunk({}, "tool_calls")),
    USAGE_CHUNK,
    frame("[DONE]"),
]
TOOL_STREAM = b"".join(TOOL_STREAM_PARTS)
TEXT_STREAM = b"".join(
    [
        frame(chunk({"role": "assistant", "content": ""})),
        frame(chunk({"content": "Hel"})),
        frame(chunk({"content": "lo"})),
        frame(chunk({}, "stop")),
        USAGE_CHUNK,
        frame("[DONE]"),
    ]
)


def stream_req(asked_usage: bool = False) -> chat.LLMRequest:
    body: dict[str, Any] = {**HISTORY, "stream": True}
    if asked_usage:
        body["stream_options"] = {"include_usage": True}
    return chat.parse_request(body)


# --- requests -------------------------------------------------------------------------------


def test_parse_request_history() -> None:
    req = chat.parse_request(HISTORY)
    assert (req.dialect, req.model, req.stream, req.temperature, req.max_tokens) == (
        "openai_chat",
        "gpt-4o",
        False,
        0.2,
        256,
    )
    assert req.messages == HISTORY["messages"]
    assert req.steps == [
        [ToolCall("call_1", "search", {"q": "a"}), ToolCall("call_2", "read", "not json")],
        [],
        [ToolCall("call_3", "search", {"q": "b"})],
    ]
    assert req.turn_start == 2
    assert req.tool_results == [
        ToolResult("call_1", "result a"),
        ToolResult("call_2", [{"type": "text", "text": "r"}]),
        ToolResult("call_3", "result b"),
    ]
    assert req.client_asked_usage is False


def test_parse_request_max_completion_tokens_and_junk() -> None:
    req = chat.parse_request(
        {"model": 5, "messages": "nope", "max_completion_tokens": 99, "temperature": "x"}
    )
    assert (req.model, req.messages, req.max_tokens, req.temperature, req.steps, req.turn_start) == (
        None,
        [],
        99,
        None,
        [],
        0,
    )


def test_upstream_body_adds_include_usage_only_when_needed() -> None:
    body = {**HISTORY, "stream": True, "stream_options": {"other": 1}}
    rewritten = chat.upstream_body(chat.parse_request(body), body)
    assert rewritten is not None
    assert rewritten["stream_options"] == {"other": 1, "include_usage": True}
    assert body["stream_options"] == {"other": 1}  # the client's body is not mutated
    assert chat.upstream_body(stream_req(asked_usage=True), {}) is None
    assert chat.upstream_body(chat.parse_request(HISTORY), HISTORY) is None


# --- answers --------------------------------------------------------------------------------


def test_parse_response_with_tool_calls_and_cached_tokens() -> None:
    body = {
        "id": "chatcmpl-9",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o-2024-08-06",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "calling",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 7,
            "total_tokens": 107,
            "prompt_tokens_details": {"cached_tokens": 80},
        },
    }
    result = chat.parse_response(200, orjson.dumps(body))
    assert result.model == "gpt-4o-2024-08-06" and result.response_id == "chatcmpl-9"
    assert result.text == "calling" and result.stop_reason == "tool_calls"
    assert result.tool_calls == [ToolCall("c1", "f", {"x": 1})]
    assert result.usage == Usage(100, 7, 107, cached_tokens=80)
    assert result.error is None and result.complete


def test_parse_response_error_and_junk() -> None:
    err = {"error": {"message": "Rate limit", "type": "requests", "code": "rate_limit_exceeded"}}
    result = chat.parse_response(429, orjson.dumps(err))
    assert result.error is not None
    assert result.error["error_type"] == "requests" and result.error["message"] == "Rate limit"
    assert result.error["details"]["status"] == 429
    html = chat.parse_response(502, b"<html>bad gateway</html>")
    assert (
        html.error is not None
        and html.error["error_type"] == "http_502"
        and "bad gateway" in html.error["message"]
    )
    junk = chat.parse_response(200, b"not json")
    assert junk.error is not None and junk.error["error_type"] == "unparseable_response"


def test_parse_response_without_usage_is_estimated() -> None:
    req = chat.parse_request({"model": "m", "messages": [{"role": "user", "content": "x" * 400}]})
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "y" * 40}}]}
    result = chat.parse_response(200, orjson.dumps(body), req)
    assert result.usage is not None and result.usage.estimated
    assert result.usage.completion_tokens == 10
    assert result.usage.prompt_tokens == chat.estimate_prompt_tokens(req) > 100


# --- streams --------------------------------------------------------------------------------


def run(acc: chat.StreamAccumulator, stream: bytes, cuts: list[int], complete: bool = True) -> bytes:
    out = b""
    start = 0
    for cut in [*cuts, len(stream)]:
        out += acc.feed(stream[start:cut])
        start = cut
    return out


def test_tool_call_stream_every_split_filtering() -> None:
    expected_out = TOOL_STREAM.replace(USAGE_CHUNK, b"")
    for cut in range(len(TOOL_STREAM) + 1):
        acc = chat.StreamAccumulator(stream_req())
        assert acc.filtering
        assert run(acc, TOOL_STREAM, [cut]) == expected_out, cut
        result = acc.finish(True)
        assert result.tool_calls == [
            ToolCall("call_a", "search", {"q": "héllo"}),
            ToolCall("call_b", "read", {"path": "/x"}),
        ], cut
        assert result.usage == Usage(120, 30, 150, cached_tokens=64)
        assert (result.stop_reason, result.model, result.response_id) == (
            "tool_calls",
            "gpt-4o-2024-08-06",
            "chatcmpl-1",
        )
        assert result.complete and result.error is None


def test_filter_forwards_each_event_as_soon_as_it_is_complete() -> None:
    acc = chat.StreamAccumulator(stream_req())
    first = TOOL_STREAM_PARTS[0]
    assert acc.feed(first[:-1]) == b""  # the event is not complete yet
    assert acc.feed(first[-1:] + TOOL_STREAM_PARTS[1][:5]) == first  # released at its blank line
    rest = TOOL_STREAM[len(first) + 5 :]
    assert acc.feed(rest) == TOOL_STREAM[len(first) :].replace(USAGE_CHUNK, b"")


def test_text_stream_byte_by_byte() -> None:
    acc = chat.StreamAccumulator(stream_req())
    out = run(acc, TEXT_STREAM, list(range(1, len(TEXT_STREAM))))
    assert out == TEXT_STREAM.replace(USAGE_CHUNK, b"")
    result = acc.finish(True)
    assert (result.text, result.stop_reason) == ("Hello", "stop")
    assert result.usage is not None and result.usage.total_tokens == 150


def test_client_asked_usage_passes_chunks_through_unchanged() -> None:
    acc = chat.StreamAccumulator(stream_req(asked_usage=True))
    assert not acc.filtering
    pieces = [TEXT_STREAM[:7], TEXT_STREAM[7:100], TEXT_STREAM[100:]]
    assert [acc.feed(p) for p in pieces] == pieces
    assert acc.finish(True).usage == Usage(120, 30, 150, cached_tokens=64)


def test_crlf_stream_filtered_keeps_bytes() -> None:
    crlf = TEXT_STREAM.replace(b"\n", b"\r\n")
    usage = USAGE_CHUNK.replace(b"\n", b"\r\n")
    for cut in range(len(crlf) + 1):
        acc = chat.StreamAccumulator(stream_req())
        # a cut inside the dropped chunk's final CRLF must not leave its LF behind
        assert run(acc, crlf, [cut]) == crlf.replace(usage, b""), cut
        assert acc.finish(True).text == "Hello"


def test_stream_without_done_is_incomplete() -> None:
    acc = chat.StreamAccumulator(stream_req())
    broken = TEXT_STREAM.split(b"data: [DONE]")[0]
    acc.feed(TEXT_STREAM[: TEXT_STREAM.index(b'"lo"')])
    result = acc.finish(False)
    assert result.complete is False
    assert result.error is not None and result.error["error_type"] == "stream_incomplete"
    assert (result.text, result.stop_reason) == ("Hel", None)
    # the transport said "complete" but no [DONE] arrived: still incomplete
    acc = chat.StreamAccumulator(stream_req())
    acc.feed(broken)
    assert acc.finish(True).complete is False


def test_stream_without_usage_is_estimated_and_error_event_kept() -> None:
    acc = chat.StreamAccumulator(stream_req())
    stream = frame(chunk({"content": "abcd" * 10})) + frame(
        {"error": {"message": "overloaded", "type": "server"}}
    )
    acc.feed(stream + frame("[DONE]"))
    result = acc.finish(True)
    assert result.usage is not None and result.usage.estimated and result.usage.completion_tokens == 10
    assert result.error is not None and result.error["message"] == "overloaded"


# --- blocked answers, checked by the real SDK ----------------------------------------------


def test_render_blocked_json_validates_as_chat_completion() -> None:
    content_type, body = chat.render_blocked(
        chat.parse_request(HISTORY), "[tripwire] blocked: loop", "loop", now=5
    )
    assert content_type == "application/json"
    completion = ChatCompletion.model_validate(orjson.loads(body))
    assert completion.choices[0].message.content == "[tripwire] blocked: loop"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.total_tokens == 0
    assert completion.created == 5 and completion.model == "gpt-4o"


@pytest.fixture
async def sdk(aiohttp_server: Any) -> tuple[openai.AsyncOpenAI, Canned]:
    canned = Canned()
    server = await aiohttp_server(canned_app(canned), host="127.0.0.1")
    client = openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="sk-test", max_retries=0)
    return client, canned


async def test_sdk_reads_blocked_json(sdk: tuple[openai.AsyncOpenAI, Canned]) -> None:
    client, canned = sdk
    canned.content_type, canned.body = chat.render_blocked(chat.parse_request(HISTORY), "blocked!", "loop")
    completion = await client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "x"}]
    )
    assert completion.choices[0].message.content == "blocked!"
    assert completion.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("asked_usage", [False, True])
async def test_sdk_reads_blocked_stream(sdk: tuple[openai.AsyncOpenAI, Canned], asked_usage: bool) -> None:
    client, canned = sdk
    canned.content_type, canned.body = chat.render_blocked(stream_req(asked_usage), "blocked!", "loop")
    kwargs: dict[str, Any] = {"stream_options": {"include_usage": True}} if asked_usage else {}
    stream = await client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "x"}], stream=True, **kwargs
    )
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "blocked!"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage_chunks = [c for c in chunks if not c.choices]
    assert len(usage_chunks) == (1 if asked_usage else 0)
    if asked_usage:
        assert usage_chunks[0].usage is not None and usage_chunks[0].usage.total_tokens == 0


async def test_sdk_sees_filtered_stream_like_an_unproxied_one(sdk: tuple[openai.AsyncOpenAI, Canned]) -> None:
    """The filtered bytes, served in awkward pieces, parse in the SDK with no usage chunk left."""
    client, canned = sdk
    acc = chat.StreamAccumulator(stream_req())
    canned.content_type = "text/event-stream"
    canned.chunks = [acc.feed(TOOL_STREAM[i : i + 37]) for i in range(0, len(TOOL_STREAM), 37)]
    canned.chunks = [c for c in canned.chunks if c]
    stream = await client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "x"}], stream=True
    )
    chunks = [c async for c in stream]
    assert all(c.choices for c in chunks)
    args = "".join(
        (t.function.arguments or "")
        for c in chunks
        for t in (c.choices[0].delta.tool_calls or [])
        if t.index == 0 and t.function
    )
    assert args == '{"q": "héllo"}'


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"], ids=["lf", "cr", "crlf"])
def test_random_splits_filter_exactly_the_usage_chunk(eol: bytes) -> None:
    import random

    rng = random.Random(7)
    stream = TOOL_STREAM.replace(b"\n", eol)
    expected = stream.replace(USAGE_CHUNK.replace(b"\n", eol), b"")
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(1, 40)))
        acc = chat.StreamAccumulator(stream_req())
        assert run(acc, stream, cuts) == expected, cuts
        assert acc.finish(True).usage == Usage(120, 30, 150, cached_tokens=64)


def test_flush_forwards_an_unterminated_tail_and_accounts_for_it() -> None:
    stream = TEXT_STREAM[: -len(b"\n")]  # "data: [DONE]\n" without the final blank line
    for cut in range(len(stream) + 1):
        acc = chat.StreamAccumulator(stream_req())
        out = acc.feed(stream[:cut]) + acc.feed(stream[cut:]) + acc.flush()
        assert out == stream.replace(USAGE_CHUNK, b""), cut
        result = acc.finish(True)
        assert result.complete and result.text == "Hello", cut


def test_flush_drops_an_unterminated_usage_chunk() -> None:
    stream = TEXT_STREAM.split(USAGE_CHUNK)[0] + USAGE_CHUNK[:-1]
    acc = chat.StreamAccumulator(stream_req())
    out = acc.feed(stream) + acc.flush()
    assert out == TEXT_STREAM.split(USAGE_CHUNK)[0]
    result = acc.finish(False)
    assert result.usage == Usage(120, 30, 150, cached_tokens=64) and result.complete is False
    passthrough = chat.StreamAccumulator(stream_req(asked_usage=True))
    assert passthrough.feed(stream) == stream and passthrough.flush() == b""


async def test_sdk_stream_helper_final_completion_from_filtered_stream(
    sdk: tuple[openai.AsyncOpenAI, Canned],
) -> None:
    client, canned = sdk
    acc = chat.StreamAccumulator(stream_req())
    canned.content_type = "text/event-stream"
    canned.chunks = [
        out for i in range(0, len(TOOL_STREAM), 11) if (out := acc.feed(TOOL_STREAM[i : i + 11]))
    ]
    async with client.chat.completions.stream(
        model="gpt-4o", messages=[{"role": "user", "content": "x"}]
    ) as stream:
        final = await stream.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("call_a", "search", '{"q": "héllo"}'),
        ("call_b", "read", '{"path": "/x"}'),
    ]
    assert final.usage is None  # the client did not ask, and the injected usage chunk is gone
    assert acc.finish(True).usage == Usage(120, 30, 150, cached_tokens=64)


def test_resent_tool_calls_parse_the_same_and_distinct_calls_stay_distinct() -> None:
    # tool calls seen before are taken from a memo: a resent history must parse exactly as the
    # first time, and calls that differ in id, name or arguments must not be confused
    def body(*calls: tuple[object, object, object]) -> dict:
        return {
            "model": "m",
            "messages": [
                {"role": "user", "content": "go"},
                *(
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                        ],
                    }
                    for i, n, a in calls
                ),
            ],
        }

    calls = (
        ("call_1", "read", '{"path": "a.py"}'),
        ("call_1", "read", '{"path": "b.py"}'),
        ("call_2", "read", '{"path": "a.py"}'),
        ("call_3", "write", '{"path": "a.py"'),  # broken JSON stays the raw string
        ("call_4", "read", {"path": "c.py"}),  # arguments sent as an object
        ("call_5", "read", ""),
    )
    first = chat.parse_request(body(*calls))
    again = chat.parse_request(body(*calls))
    expected = [
        [ToolCall(id="call_1", name="read", arguments={"path": "a.py"})],
        [ToolCall(id="call_1", name="read", arguments={"path": "b.py"})],
        [ToolCall(id="call_2", name="read", arguments={"path": "a.py"})],
        [ToolCall(id="call_3", name="write", arguments='{"path": "a.py"')],
        [ToolCall(id="call_4", name="read", arguments={"path": "c.py"})],
        [ToolCall(id="call_5", name="read", arguments={})],
    ]
    assert first.steps == expected
    assert again.steps == expected
    assert again.steps[0] is not first.steps[0]  # each request gets its own step lists
