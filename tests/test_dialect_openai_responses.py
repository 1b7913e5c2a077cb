"""Responses API dialect: input items grouped into steps, function calls and outputs, chains,
streams split at every byte, and blocked answers that the real openai SDK accepts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from canned_server import Canned, canned_app
from openai.types.responses import Response

from proxy.dialects import openai_responses as dialect
from proxy.dialects.base import ToolCall, ToolResult, Usage, tool_name
from tests.dialect_cases import Case
from tests.factories import responses_answer, responses_request

# this dialect's sample for tests/test_dialect_contract.py
CONTRACT_CASES = {
    "openai_responses": Case("/v1/responses", responses_request("hi"), responses_answer("Hello"), True)
}


HISTORY: dict[str, Any] = {
    "model": "gpt-5",
    "instructions": "be brief",
    "max_output_tokens": 500,
    "input": [
        {"role": "user", "content": "find a and b"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "search",
            "arguments": '{"q":"a"}',
        },
        {
            "type": "function_call",
            "id": "fc_2",
            "call_id": "call_2",
            "name": "search",
            "arguments": '{"q":"b"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "A"},
        {"type": "function_call_output", "call_id": "call_2", "output": "B"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "found"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "now c"}]},
        {"type": "function_call", "call_id": "call_3", "name": "search", "arguments": '{"q":"c"}'},
        {"type": "function_call_output", "call_id": "call_3", "output": "C"},
    ],
}


def frame(data: dict) -> bytes:
    return f"event: {data['type']}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"


FINAL = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1,
    "status": "completed",
    "model": "gpt-5-2025-08-07",
    "output": [
        {
            "id": "msg_1",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Looking ✓", "annotations": []}],
        },
        {
            "id": "fc_9",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_9",
            "name": "search",
            "arguments": '{"q": "paris"}',
        },
    ],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "usage": {
        "input_tokens": 200,
        "input_tokens_details": {"cached_tokens": 128, "cache_write_tokens": 0},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 5},
        "total_tokens": 220,
    },
}
START = {**FINAL, "status": "in_progress", "output": [], "usage": None}
MSG_WHERE = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
EVENTS: list[dict[str, Any]] = [
    {"type": "response.created", "response": START},
    {"type": "response.in_progress", "response": START},
    {
        "type": "response.output_item.added",
        "output_index": 0,
        "item": {
            "id": "msg_1",
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        },
    },
    {
        "type": "response.content_part.added",
        **MSG_WHERE,
        "part": {"type": "output_text", "text": "", "annotations": []},
    },
    {"type": "response.output_text.delta", **MSG_WHERE, "delta": "Look", "logprobs": []},
    {"type": "response.output_text.delta", **MSG_WHERE, "delta": "ing ✓", "logprobs": []},
    {"type": "response.output_text.done", **MSG_WHERE, "text": "Looking ✓", "logprobs": []},
    {"type": "response.content_part.done", **MSG_WHERE, "part": FINAL["output"][0]["content"][0]},
    {"type": "response.output_item.done", "output_index": 0, "item": FINAL["output"][0]},
    {
        "type": "response.output_item.added",
        "output_index": 1,
        "item": {**FINAL["output"][1], "status": "in_progress", "arguments": ""},
    },
    {
        "type": "response.function_call_arguments.delta",
        "item_id": "fc_9",
        "output_index": 1,
        "delta": '{"q": ',
    },
    {
        "type": "response.function_call_arguments.delta",
        "item_id": "fc_9",
        "output_index": 1,
        "delta": '"paris"}',
    },
    {
        "type": "response.function_call_arguments.done",
        "item_id": "fc_9",
        "output_index": 1,
        "arguments": '{"q": "paris"}',
    },
    {"type": "response.output_item.done", "output_index": 1, "item": FINAL["output"][1]},
    {"type": "response.completed", "response": FINAL},
]
STREAM = b"".join(frame({**e, "sequence_number": n}) for n, e in enumerate(EVENTS))


def test_parse_request_groups_items_into_steps() -> None:
    req = dialect.parse_request(HISTORY)
    assert (req.dialect, req.model, req.max_tokens, req.stream) == ("openai_responses", "gpt-5", 500, False)
    assert req.messages[0] == {"role": "system", "content": "be brief"}
    assert req.steps == [
        [ToolCall("call_1", "search", {"q": "a"}), ToolCall("call_2", "search", {"q": "b"})],
        [],  # the assistant message after the outputs
        [ToolCall("call_3", "search", {"q": "c"})],
    ]
    assert req.turn_start == 2
    assert req.tool_results == [
        ToolResult("call_1", "A"),
        ToolResult("call_2", "B"),
        ToolResult("call_3", "C"),
    ]
    assert req.previous_response_id is None
    assert dialect.upstream_body(req, HISTORY) is None


def test_chained_request_and_string_input() -> None:
    req = dialect.parse_request(
        {
            "model": "gpt-5",
            "previous_response_id": "resp_0",
            "input": [{"type": "function_call_output", "call_id": "call_9", "output": "sunny"}],
            "stream": True,
        }
    )
    assert req.previous_response_id == "resp_0" and req.stream
    assert req.steps == [] and req.tool_results == [ToolResult("call_9", "sunny")]
    plain = dialect.parse_request({"model": "gpt-5", "input": "hello"})
    assert plain.messages == [{"role": "user", "content": "hello"}] and plain.turn_start == 0


def test_parse_response() -> None:
    result = dialect.parse_response(200, orjson.dumps(FINAL))
    assert (result.text, result.stop_reason, result.model, result.response_id) == (
        "Looking ✓",
        "completed",
        "gpt-5-2025-08-07",
        "resp_1",
    )
    assert result.tool_calls == [ToolCall("call_9", "search", {"q": "paris"})]
    assert result.usage == Usage(200, 20, 220, cached_tokens=128)
    assert result.error is None


def test_parse_response_incomplete_failed_and_http_error() -> None:
    incomplete = {**FINAL, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    assert dialect.parse_response(200, orjson.dumps(incomplete)).stop_reason == "max_output_tokens"
    failed = {**FINAL, "status": "failed", "error": {"code": "server_error", "message": "boom"}}
    error = dialect.parse_response(200, orjson.dumps(failed)).error
    assert error is not None and (error["error_type"], error["message"]) == ("server_error", "boom")
    http = dialect.parse_response(400, b'{"error": {"message": "bad", "type": "invalid_request_error"}}')
    assert http.error is not None and http.error["error_type"] == "invalid_request_error"


def feed_split(stream: bytes, cuts: list[int], complete: bool = True) -> dialect.LLMResult:
    acc = dialect.StreamAccumulator(dialect.parse_request({**HISTORY, "stream": True}))
    start = 0
    for cut in [*cuts, len(stream)]:
        piece = stream[start:cut]
        assert acc.feed(piece) == piece
        start = cut
    return acc.finish(complete)


def test_stream_at_every_split() -> None:
    for cut in range(len(STREAM) + 1):
        result = feed_split(STREAM, [cut])
        assert result.text == "Looking ✓", cut
        assert result.tool_calls == [ToolCall("call_9", "search", {"q": "paris"})]
        assert result.usage == Usage(200, 20, 220, cached_tokens=128)
        assert result.complete and result.error is None and result.response_id == "resp_1"


def test_broken_stream_keeps_what_arrived() -> None:
    broken = STREAM[: STREAM.index(b"event: response.function_call_arguments.done")]
    result = feed_split(broken, [50])
    assert result.complete is False
    assert result.error is not None and result.error["error_type"] == "stream_incomplete"
    assert result.text == "Looking ✓"
    assert result.tool_calls == [ToolCall("call_9", "search", {"q": "paris"})]
    assert result.usage is not None and result.usage.estimated
    assert result.model == "gpt-5-2025-08-07" and result.response_id == "resp_1"


def test_failed_terminal_event_is_clean_end_with_error() -> None:
    failed = {**FINAL, "status": "failed", "error": {"code": "rate_limit_exceeded", "message": "slow down"}}
    stream = frame({"type": "response.created", "response": START, "sequence_number": 0}) + frame(
        {"type": "response.failed", "response": failed, "sequence_number": 1}
    )
    result = feed_split(stream, [])
    assert result.complete is True
    assert result.error is not None and result.error["error_type"] == "rate_limit_exceeded"


def test_synthetic_ids_and_chain_rewrite() -> None:
    req = dialect.parse_request({**HISTORY, "previous_response_id": "resp_parent"})
    _, body = dialect.render_blocked(req, "blocked", "loop")
    rid = orjson.loads(body)["id"]
    assert dialect.is_synthetic_response_id(rid) and not dialect.is_synthetic_response_id("resp_1")
    follow = {"model": "gpt-5", "previous_response_id": rid, "input": "go on"}
    rewritten = dialect.rewrite_previous_response(follow, "resp_parent", "blocked")
    assert rewritten["previous_response_id"] == "resp_parent"
    assert rewritten["input"] == [
        {"role": "assistant", "content": "blocked"},
        {"role": "user", "content": "go on"},
    ]
    assert "previous_response_id" not in dialect.rewrite_previous_response(follow, None, "blocked")
    assert follow["input"] == "go on"


def test_render_blocked_json_validates_as_response() -> None:
    content_type, body = dialect.render_blocked(dialect.parse_request(HISTORY), "[tripwire] blocked", "loop")
    assert content_type == "application/json"
    response = Response.model_validate(orjson.loads(body))
    assert response.status == "completed"
    assert response.output_text == "[tripwire] blocked"
    assert response.usage is not None and response.usage.total_tokens == 0
    assert response.id.startswith("resp_tripwire_")


@pytest.fixture
async def sdk(aiohttp_server: Any) -> tuple[openai.AsyncOpenAI, Canned]:
    canned = Canned()
    server = await aiohttp_server(canned_app(canned), host="127.0.0.1")
    client = openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="sk-test", max_retries=0)
    return client, canned


async def test_sdk_reads_blocked_json(sdk: tuple[openai.AsyncOpenAI, Canned]) -> None:
    client, canned = sdk
    canned.content_type, canned.body = dialect.render_blocked(
        dialect.parse_request(HISTORY), "blocked!", "loop"
    )
    response = await client.responses.create(model="gpt-5", input="x")
    assert response.output_text == "blocked!" and response.status == "completed"


async def test_sdk_raw_stream_reads_blocked_stream(sdk: tuple[openai.AsyncOpenAI, Canned]) -> None:
    client, canned = sdk
    req = dialect.parse_request({**HISTORY, "stream": True})
    canned.content_type, canned.body = dialect.render_blocked(req, "blocked!", "loop")
    stream = await client.responses.create(model="gpt-5", input="x", stream=True)
    events = [e async for e in stream]
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "blocked!"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "blocked!"
    # our accumulator agrees
    acc = dialect.StreamAccumulator(req)
    acc.feed(canned.body)
    result = acc.finish(True)
    assert (result.text, result.complete, result.stop_reason) == ("blocked!", True, "completed")
    assert dialect.is_synthetic_response_id(result.response_id)


async def test_sdk_stream_helper_reads_blocked_stream(sdk: tuple[openai.AsyncOpenAI, Canned]) -> None:
    client, canned = sdk
    canned.content_type, canned.body = dialect.render_blocked(
        dialect.parse_request({**HISTORY, "stream": True}), "blocked!", "loop"
    )
    async with client.responses.stream(model="gpt-5", input="x") as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_response()
    assert final.output_text == "blocked!"
    assert final.status == "completed"


async def test_sdk_stream_helper_accepts_the_fixture_stream(sdk: tuple[openai.AsyncOpenAI, Canned]) -> None:
    """The fixture stream is one the SDK's strict state machine accepts, split in odd pieces."""
    client, canned = sdk
    canned.content_type = "text/event-stream"
    canned.chunks = [STREAM[i : i + 29] for i in range(0, len(STREAM), 29)]
    async with client.responses.stream(model="gpt-5", input="x") as stream:
        final = await stream.get_final_response()
    assert final.output_text == "Looking ✓"
    assert final.output[1].type == "function_call" and final.output[1].arguments == '{"q": "paris"}'


# ---- Codex 0.171's items (issue 25): recorded requests, and the SDK's own item types -------------

FIXTURES = Path(__file__).parent / "fixtures"
CODEX_WS = json.loads((FIXTURES / "codex_0171_websocket.json").read_text())
CODEX_HTTP = json.loads((FIXTURES / "codex_0171_http.json").read_text())
LOCAL_SHELL_ACTION = {
    "type": "exec",
    "command": ["bash", "-lc", "echo hello-from-local-shell"],
    "timeout_ms": 10000,
    "working_directory": None,
    "env": {},
    "user": None,
}


def test_codex_0171_replayed_session_reads_every_call_and_output() -> None:
    """The resumed turn Codex 0.171 sent (the whole session replayed): apply_patch as a custom tool
    call, a client tool search, a hosted web search and a local shell call are the step's calls, each
    output (Codex answers the local shell call with a function_call_output) its result, the hosted
    search's outcome its own result; `additional_tools` is context, not a step."""
    turn = CODEX_WS["messages"][1]
    req = dialect.parse_request(turn)
    patch = "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch\n"
    assert req.steps == [
        [ToolCall("call_patch1", "apply_patch", patch)],
        [ToolCall("call_ts1", "tool_search", {"query": "calendar"})],
        [
            ToolCall(
                "ws_1",
                "web_search",
                {"type": "search", "query": "tripwire proxy"},
                hosted=True,
                result=ToolResult("ws_1", "completed"),
            ),
            ToolCall("call_ls1", "local_shell", LOCAL_SHELL_ACTION),
        ],
        [],  # the assistant's message after the outputs
    ]
    by_id = {r.tool_call_id: r for r in req.tool_results}
    assert list(by_id) == ["call_patch1", "call_ts1", "ws_1", "call_ls1"]
    assert by_id["call_patch1"].content.startswith("Exit code: 0")
    assert by_id["call_ts1"].content == []  # the tools the search found (none)
    assert by_id["call_ls1"].content == "aborted"
    assert req.turn_start == 4  # "again", the resumed turn's user message, comes after them all


def test_codex_0171_declares_its_tools_only_in_additional_tools() -> None:
    turn = CODEX_WS["messages"][1]
    assert turn.get("tools", []) == []
    names = [tool_name(t) for t in dialect.declared_tools(turn)]
    # the `functions`, `clock` and `collaboration` namespaces' tools, in order
    assert names[:3] == ["exec", "wait", "request_user_input"]
    assert {"sleep", "spawn_agent", "wait_agent"} <= set(names)
    assert "functions" not in names
    # those of the `tools` field and of a tool search's output count too
    found = {"type": "function", "name": "calendar_add", "parameters": {}}
    body = {
        "tools": [{"type": "web_search"}],
        "input": [{"type": "tool_search_output", "call_id": "c", "execution": "client", "tools": [found]}],
    }
    assert [tool_name(t) for t in dialect.declared_tools(body)] == ["web_search", "calendar_add"]


def test_namespaces_nested_deeper_than_recursion_goes_are_read() -> None:
    tool: dict[str, Any] = {"type": "function", "name": "deep"}
    for _ in range(5000):
        tool = {"type": "namespace", "name": "ns", "tools": [tool]}
    assert dialect.declared_tools({"tools": [tool]}) == [{"type": "function", "name": "deep"}]


def test_codex_0171_compaction_is_context_not_a_step() -> None:
    """Over HTTP Codex 0.171 compacts with a `compaction_trigger` as the last input item, then goes
    on from the `compaction` item the answer gave: neither is an assistant step."""
    turn, compact, after = CODEX_HTTP["requests"]
    assert dialect.parse_request(turn).steps == []
    compacting = dialect.parse_request(compact)
    assert compacting.steps == [[ToolCall("call_fc1", "exec", {})]]  # a namespaced function call
    assert compacting.tool_results == [ToolResult("call_fc1", "aborted")]
    assert compact["input"][-1] == {"type": "compaction_trigger"}
    assert after["input"][-1]["type"] == "compaction"
    resumed = dialect.parse_request(after)
    assert resumed.steps == [] and resumed.tool_results == []


def answer_stream(output: list[dict[str, Any]], final_output: bool) -> bytes:
    """A stream of `output` as the Responses API sends it (each item added, then done); the final
    event repeats the output, or (`final_output` False) leaves it empty as some servers do."""
    response = {**FINAL, "output": output if final_output else []}
    events: list[dict[str, Any]] = [{"type": "response.created", "response": START}]
    for i, item in enumerate(output):
        started = {**item, "status": "in_progress"}
        events.append({"type": "response.output_item.added", "output_index": i, "item": started})
        for part in item.get("content") or [] if item["type"] == "message" else []:
            delta = {"item_id": item["id"], "output_index": i, "content_index": 0, "delta": part["text"]}
            events.append({"type": "response.output_text.delta", **delta})
        events.append({"type": "response.output_item.done", "output_index": i, "item": item})
    events.append({"type": "response.completed", "response": response})
    return b"".join(frame({**e, "sequence_number": n}) for n, e in enumerate(events))


@pytest.mark.parametrize("final_output", [True, False])
def test_codex_0171_answers_streamed(final_output: bool) -> None:
    """The answers the capture gave Codex 0.171 (which it ran and replayed as above), streamed: the
    calls are read from the items, whether the final event repeats them or not."""
    patch, search, rest = CODEX_WS["answers"]
    expected = [
        [ToolCall("call_patch1", "apply_patch", patch[0]["input"])],
        [ToolCall("call_ts1", "tool_search", {"query": "calendar"})],
        [
            ToolCall(
                "ws_1",
                "web_search",
                {"type": "search", "query": "tripwire proxy"},
                hosted=True,
                result=ToolResult("ws_1", "completed"),
            ),
            ToolCall("call_ls1", "local_shell", rest[1]["action"]),
        ],
    ]
    for output, calls in zip([patch, search, rest], expected, strict=True):
        stream = answer_stream(output, final_output)
        for cut in range(0, len(stream) + 1, 97):
            result = feed_split(stream, [cut])
            assert result.tool_calls == calls, cut
            assert result.complete and result.error is None
    assert feed_split(answer_stream(rest, final_output), []).text == "searched."
    image, message = CODEX_HTTP["answers"][1]  # what the HTTP capture answered after the compaction
    drawn = feed_split(answer_stream([image, message], final_output), [77])
    status = ToolResult("ig_1", "completed")
    assert drawn.tool_calls == [ToolCall("ig_1", "image_generation", {}, hosted=True, result=status)]
    assert drawn.text == "drawn."


# items of the SDK's own types (openai.types.responses) that Codex 0.171 does not send
MCP_ERROR = {"type": "http_error", "code": 502, "message": "server down"}
SDK_OUTPUT_ITEMS: list[tuple[dict[str, Any], ToolCall]] = [
    (
        {
            "type": "mcp_call",
            "id": "mcp_1",
            "server_label": "docs",
            "name": "lookup",
            "arguments": '{"q": "x"}',
            "output": "found x",
            "status": "completed",
        },
        ToolCall("mcp_1", "lookup", {"q": "x"}, hosted=True, result=ToolResult("mcp_1", "found x")),
    ),
    (
        {
            "type": "mcp_call",
            "id": "mcp_2",
            "server_label": "docs",
            "name": "lookup",
            "arguments": "{}",
            "error": MCP_ERROR,
            "status": "failed",
        },
        ToolCall("mcp_2", "lookup", {}, hosted=True, result=ToolResult("mcp_2", MCP_ERROR, True)),
    ),
    (
        {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": "aGVsbG8="},
        ToolCall("ig_1", "image_generation", {}, hosted=True, result=ToolResult("ig_1", "completed")),
    ),
    (
        {
            "type": "computer_call",
            "id": "cu_1",
            "call_id": "call_cu1",
            "status": "completed",
            "pending_safety_checks": [],
            "action": {"type": "click", "button": "left", "x": 1, "y": 2},
        },
        ToolCall("call_cu1", "computer", {"type": "click", "button": "left", "x": 1, "y": 2}),
    ),
    (
        {
            "type": "local_shell_call",
            "id": "lsh_9",
            "call_id": "call_ls9",
            "status": "completed",
            "action": {"type": "exec", "command": ["ls"], "env": {}},
        },
        ToolCall("call_ls9", "local_shell", {"type": "exec", "command": ["ls"], "env": {}}),
    ),
    (
        {
            "type": "tool_search_call",
            "id": "ts_9",
            "call_id": None,
            "execution": "server",
            "status": "completed",
            "arguments": {"query": "mail"},
        },
        ToolCall(
            "ts_9", "tool_search", {"query": "mail"}, hosted=True, result=ToolResult("ts_9", "completed")
        ),
    ),
]
SDK_OUTPUTS: list[tuple[dict[str, Any], ToolResult]] = [
    (
        {
            "type": "computer_call_output",
            "call_id": "call_cu1",
            "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="},
        },
        ToolResult("call_cu1", {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="}),
    ),
    (
        {"type": "local_shell_call_output", "id": "call_ls9", "output": "a.txt\n"},
        ToolResult("call_ls9", "a.txt\n"),
    ),
    (
        {
            "type": "apply_patch_call_output",
            "call_id": "call_ap1",
            "status": "failed",
            "output": "no such file",
        },
        ToolResult("call_ap1", "no such file", True),
    ),
]


def test_sdk_item_types_are_calls_and_results() -> None:
    """Each item validates as the openai SDK's own type, and reads as the call or result it is."""
    from openai.types.responses import ResponseOutputItem
    from openai.types.responses.response_input_item_param import ResponseInputItemParam
    from pydantic import TypeAdapter

    output_type: TypeAdapter[Any] = TypeAdapter(ResponseOutputItem)
    input_type: TypeAdapter[Any] = TypeAdapter(ResponseInputItemParam)
    for item, call in SDK_OUTPUT_ITEMS:
        assert output_type.validate_python(item).type == item["type"]
        assert dialect.parse_response(200, orjson.dumps({**FINAL, "output": [item]})).tool_calls == [call]
        assert feed_split(answer_stream([item], final_output=False), [40]).tool_calls == [call]
        assert dialect.parse_request({"input": [item]}).steps == [[call]]
    for item, result in SDK_OUTPUTS:
        input_type.validate_python(item)
        assert dialect.parse_request({"input": [item]}).tool_results == [result]


def test_an_item_type_that_is_not_a_string_is_no_call() -> None:
    odd: list[Any] = [{"type": ["function_call"], "call_id": "x"}, {"type": {"a": 1}}, {"type": 7}]
    req = dialect.parse_request({"input": [{"role": "user", "content": "hi"}, *odd]})
    assert req.steps == [[]] and req.tool_results == []
    assert dialect.parse_response(200, orjson.dumps({**FINAL, "output": odd})).tool_calls == []
    assert feed_split(answer_stream(odd, final_output=False), [10]).tool_calls == []
