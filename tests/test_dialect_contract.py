"""Every dialect keeps the same contract (proxy/dialects/contract.py), exercised alike for each
module `dialect_for` can return: a request parses as its own dialect, an upstream answer (whole
or streamed through its accumulator) reads back with its usage, the blocked answer it renders
carries the guard's text in a shape its own parser and accumulator read, and a prompt is
estimated. A new dialect joins by its `CONTRACT_CASES` in its own test file (tests/dialect_cases.py)."""

from __future__ import annotations

import orjson
import pytest

from proxy.dialects import dialect_for
from proxy.dialects.contract import Dialect
from tests.dialect_cases import contract_cases
from tests.factories import (
    chat_completion_sse,
    chat_request,
)

DIALECTS = contract_cases()


def dialect(name: str) -> Dialect:
    module = dialect_for(DIALECTS[name].path, "POST")
    assert module is not None
    return module


def test_every_routed_dialect_has_a_case() -> None:
    from proxy.dialects import registry

    assert set(registry().modules) == set(DIALECTS)


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_a_request_parses_as_its_own_dialect(name: str) -> None:
    d = dialect(name)
    req = d.parse_request(DIALECTS[name].request)
    assert d.DIALECT == name and req.dialect == name
    assert req.model == DIALECTS[name].request["model"]
    assert d.estimate_prompt_tokens(req) > 0
    body = d.upstream_body(req, dict(DIALECTS[name].request))
    assert body is None or isinstance(body, dict)


# each dialect's own way to declare a tool "search" (and a hosted or server tool where it has one)
DECLARED = {
    "openai_chat": (
        {
            "tools": [{"type": "function", "function": {"name": "search", "parameters": {}}}],
            "functions": [{"name": "legacy", "parameters": {}}],
        },
        ["search", "legacy"],
    ),
    "openai_responses": (
        {
            "tools": [{"type": "function", "name": "search", "parameters": {}}, {"type": "web_search"}],
            "input": [
                {
                    "type": "additional_tools",
                    "role": "developer",
                    "tools": [
                        {"type": "namespace", "name": "ns", "tools": [{"type": "custom", "name": "exec"}]}
                    ],
                }
            ],
        },
        ["search", "web_search", "exec"],
    ),
    "anthropic": (
        {
            "tools": [
                {"name": "search", "input_schema": {}},
                {"type": "web_search_20250305", "name": "web_search"},
            ]
        },
        ["search", "web_search"],
    ),
    "embeddings": ({"tools": [{"name": "search"}]}, []),
    "completions": ({"tools": [{"name": "search"}]}, []),
}


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_the_tools_a_request_declares_are_listed(name: str) -> None:
    from proxy.dialects.base import tool_name

    tools, names = DECLARED[name]
    declared = dialect(name).declared_tools({**DIALECTS[name].request, **tools})
    assert [tool_name(t) for t in declared] == names
    assert dialect(name).declared_tools({**DIALECTS[name].request, "tools": "junk"}) == []


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_a_permission_filter_removes_declared_tools_and_only_then_rewrites(name: str) -> None:
    from proxy.dialects.base import tool_name

    tools, names = DECLARED[name]
    body = {**DIALECTS[name].request, **tools}
    d = dialect(name)
    assert d.without_tools(body, lambda n: True) is None  # nothing removed: the body is not rewritten
    for gone in names:
        out = d.without_tools(body, lambda n, gone=gone: n != gone)
        assert out is not None
        assert [tool_name(t) for t in d.declared_tools(out)] == [n for n in names if n != gone]
        assert d.declared_tools(body) == d.declared_tools({**DIALECTS[name].request, **tools})  # untouched
    if not names:
        assert d.without_tools(body, lambda n: False) is None


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_an_answer_reads_back_whole_and_through_the_accumulator(name: str) -> None:
    d = dialect(name)
    req = d.parse_request(DIALECTS[name].request)
    raw = orjson.dumps(DIALECTS[name].answer)
    whole = d.parse_response(200, raw, req)
    assert whole.error is None and whole.usage is not None and whole.usage.total_tokens > 0
    acc = d.StreamAccumulator(req)
    acc.status = 200
    passed = b"".join(acc.feed(raw[i : i + 7]) for i in range(0, len(raw), 7))
    assert passed == raw  # a plain body passes through byte for byte
    fed = acc.finish(True)
    assert (fed.text, fed.usage) == (whole.text, whole.usage)


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_an_error_answer_is_an_error_whichever_way_it_is_read(name: str) -> None:
    d = dialect(name)
    req = d.parse_request(DIALECTS[name].request)
    raw = orjson.dumps({"error": {"message": "quota", "type": "insufficient_quota"}})
    assert d.parse_response(429, raw, req).error is not None
    acc = d.StreamAccumulator(req)
    acc.status = 429
    acc.feed(raw)
    assert acc.finish(True).error is not None


@pytest.mark.parametrize("name", sorted(DIALECTS))
@pytest.mark.parametrize("stream", [False, True])
def test_the_blocked_answer_carries_the_guards_text_in_the_dialects_shape(name: str, stream: bool) -> None:
    d = dialect(name)
    case = DIALECTS[name]
    body = {**case.request, "stream": True} if stream else case.request
    req = d.parse_request(body)
    text = "[tripwire] blocked: the same call 4 times"
    content_type, rendered = d.render_blocked(req, text, "loop_detection")
    if d.BLOCKED_STATUS >= 400:  # an error the client's SDK raises (embeddings: 429)
        assert content_type.startswith("application/json")
        result = d.parse_response(d.BLOCKED_STATUS, rendered, req)
        assert result.error is not None and text in orjson.dumps(result.error).decode()
        return
    if stream and case.streams:
        assert content_type.startswith("text/event-stream")
        acc = d.StreamAccumulator(req)
        acc.status = d.BLOCKED_STATUS
        acc.feed(rendered)
        result = acc.finish(True)
    else:
        assert content_type.startswith("application/json")
        result = d.parse_response(d.BLOCKED_STATUS, rendered, req)
    assert result.error is None and text in result.text


def test_a_streamed_answer_reads_as_the_whole_one() -> None:
    d = dialect("openai_chat")
    req = d.parse_request(chat_request(stream=True))
    acc = d.StreamAccumulator(req)
    acc.status = 200
    acc.feed(chat_completion_sse("Hello there"))
    assert acc.finish(True).text == "Hello there"


# --- what the rest of Tripwire asks of a dialect instead of testing its name ----------------------

CONTRACT_MEMBERS = sorted(
    ({n for n in vars(Dialect) if not n.startswith("_")} | set(Dialect.__annotations__)) - {"__name__"}
)
# OpenTelemetry's gen_ai.operation.name values (semantic conventions for generative AI)
GEN_AI_OPERATIONS = {"chat", "text_completion", "embeddings", "generate_content", "create_agent"}


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_every_dialect_answers_every_contract_member(name: str) -> None:
    d = dialect(name)
    missing = [m for m in CONTRACT_MEMBERS if not hasattr(d, m)]
    assert not missing
    for flag in ("CONVERSATIONAL", "CHAINS_RESPONSES", "WEBSOCKET_CALLS", "MAX_TOKENS_RECOVERY"):
        assert type(getattr(d, flag)) is bool, flag
    assert isinstance(d.PROVIDER, str) and d.PROVIDER
    assert d.OPERATION in GEN_AI_OPERATIONS
    assert d.REFUSAL_REASON_HEADER is None or d.REFUSAL_REASON_HEADER.islower()


@pytest.mark.parametrize("name", sorted(DIALECTS))
@pytest.mark.parametrize("status", [400, 429, 502, 503])
def test_an_error_body_carries_tripwires_fields_where_the_sdk_reads_them(name: str, status: int) -> None:
    d = dialect(name)
    error = {"message": "why", "type": "tripwire_guard", "code": "budget", "guardrail": "budget"}
    body = orjson.loads(d.error_body(status, error))
    # both SDK families read `error.message` (Anthropic's inside `{"type": "error", ...}`)
    assert body["error"]["message"] == "why" and body["error"]["guardrail"] == "budget"
    bad = d.bad_request_error("unreadable")
    assert orjson.loads(d.error_body(400, bad))["error"]["message"] == "unreadable"


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_a_dialect_that_chains_responses_reads_the_parent_id(name: str) -> None:
    d = dialect(name)
    body = {**DIALECTS[name].request, "previous_response_id": "resp_parent"}
    parent = d.parse_request(body).previous_response_id
    assert (parent == "resp_parent") is d.CHAINS_RESPONSES
    assert not d.WEBSOCKET_CALLS or d.CHAINS_RESPONSES  # a socket's calls chain (proxy/websocket/)


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_a_conversational_dialect_reads_the_conversation(name: str) -> None:
    d = dialect(name)
    assert bool(d.parse_request(DIALECTS[name].request).messages) or not d.CONVERSATIONAL


def test_each_dialect_is_found_by_its_recorded_name() -> None:
    from proxy.dialects import named, of_call

    for name in DIALECTS:
        d = dialect(name)
        assert named(name) is d and of_call(d.parse_request(DIALECTS[name].request)) is d
    assert named("mcp") is None and of_call(object()) is None


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_a_dialect_is_routed_by_the_paths_it_declares(name: str) -> None:
    from proxy.dialects import dialect_name

    d = dialect(name)
    assert d.PATHS and d.DIALECT == name
    for path in d.PATHS:
        assert dialect_name(path, "POST") == dialect_name(f"/v1{path}", "post") == name
        assert dialect_name(f"/v1{path}", "GET") is None
    for suffix in d.PATH_SUFFIXES:
        assert dialect_name(f"/openai/deployments/mine{suffix}", "POST") == name
