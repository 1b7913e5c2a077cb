"""Bodies and arguments the fast JSON parser refuses or cannot walk, through the running proxy
(issue 11): Tripwire never forwards a call its guards did not judge (SPEC §4.2).

- a body `json.loads(bytes)` accepts (a lone surrogate escape, NaN, UTF-16, a BOM, a 4,300-digit
  integer, 10,000 levels of nesting) is judged, counted, forwarded byte for byte and recorded;
- anything else is a 400 in the protocol's own error shape, recorded as an ERROR, never forwarded;
- tool-call arguments nested hundreds of levels deep are judged like any others (limits, loops);
- the recorded prompt is the messages actually new since the session's previous LLM call.

Raw bodies go through a plain aiohttp client (what a Node agent's `JSON.stringify` sends for a cut
emoji cannot be produced by the Python SDKs); the rest through the openai SDK.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx2 as httpx
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from proxy import jsonparse
from proxy.guards import signatures
from proxy.guards.session import SessionGuards
from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream, Reply, Seen
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.schema import assert_run_valid

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
SESSION = {"X-Tripwire-Session": "s1", "X-Tripwire-Agent": "bot"}
HEADERS = {**SESSION, "Authorization": f"Bearer {AGENT_KEY}", "Content-Type": "application/json"}
DEEP = 10_000


class RawFake(FakeUpstream):
    """The fake upstream, also keeping each request's exact bytes (and reading any body json.loads
    reads, at any depth, where the plain fake would crash)."""

    def __init__(self, default: Reply) -> None:
        super().__init__(default=default)
        self.raw: list[bytes] = []

    async def _seen(self, request: web.Request) -> Any:
        raw = await request.read()
        self.raw.append(raw)
        try:
            body = jsonparse.loads(raw) if raw else None
        except ValueError:
            body = None
        headers: CIMultiDict[str] = CIMultiDict(request.headers)
        self.seen.append(Seen(request.method, request.path, request.query_string, headers, body))
        return body if isinstance(body, dict) else {}


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[RawFake, str]]:
    fake = RawFake(Reply(text="fine"))
    server = TestServer(fake.app, host="127.0.0.1")
    await server.start_server()
    try:
        yield fake, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def post(
    tw: Running, path: str, body: bytes, *, session: bool = True, **headers: str
) -> tuple[int, Any, bytes]:
    """POST raw bytes as an agent would; `session=False`: no X-Tripwire-Session (automatic session)."""
    base = HEADERS if session else {k: v for k, v in HEADERS.items() if k != "X-Tripwire-Session"}
    async with aiohttp.ClientSession() as http:
        async with http.post(tw.url + path, data=body, headers={**base, **headers}) as resp:
            raw = await resp.read()
            try:
                data = json.loads(raw)
            except ValueError:
                data = None
            return resp.status, data, raw


async def trace(tw: Running) -> tuple[str, list[dict[str, Any]]]:
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    return run_id, events


def only(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event_type"] == kind]


def chat_body(content: str = '"hello"', extra: str = "") -> bytes:
    """A chat request as text, so it can hold what no Python value serialises to."""
    return (
        '{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": ' + content + "}]" + extra + "}"
    ).encode()


def deep(levels: int, leaf: str = '"bottom"') -> str:
    return "[" * levels + leaf + "]" * levels


ACCEPTED = {
    # JSON.stringify of a string cut in the middle of an emoji (Node agents, truncated prompts)
    "lone_surrogate": chat_body('"cut emoji \\ud83d"'),
    "nan_infinity": chat_body('"hello"', ', "temperature": NaN, "top_p": Infinity, "seed": -Infinity'),
    "utf16_bom": chat_body('"utf-16 \u00e9"').decode().encode("utf-16"),
    "utf32_bom": chat_body('"utf-32"').decode().encode("utf-32"),
    "utf8_bom": b"\xef\xbb\xbf" + chat_body(),
    "int_4300_digits": chat_body('"hello"', ', "seed": ' + "7" * 4300),
    "deep_content_10000": chat_body(deep(DEEP, '"\\ud83d"')),
    "deep_metadata_10000": chat_body('"hello"', ', "metadata": ' + '{"a": ' * DEEP + "1" + "}" * DEEP),
}


@pytest.mark.parametrize("name", list(ACCEPTED))
async def test_bodies_json_loads_accepts_are_judged_counted_forwarded_unchanged_and_recorded(
    start_tripwire: StartTripwire, upstream: tuple[RawFake, str], name: str
) -> None:
    fake, url = upstream
    body = ACCEPTED[name]
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_llm_calls": 2}})
    answers = [await post(tw, CHAT, body) for _ in range(4)]
    assert [status for status, _, _ in answers] == [200, 200, 429, 429]  # every one judged
    assert answers[2][1]["error"]["guardrail"] == "max_llm_calls"
    assert answers[3][1]["error"]["guardrail"] == "session_terminated"
    assert fake.raw == [body, body]  # the client's own bytes, unchanged

    _, events = await trace(tw)
    calls = only(events, "LLM_CALL")
    assert len(calls) == 2
    assert all(c["payload"]["status"] == "ok" and c["payload"]["model"] == "gpt-4o-mini" for c in calls)
    assert only(events, "ERROR")[0]["payload"]["guardrail"] == "max_llm_calls"
    prompt = calls[0]["payload"]["prompt"]
    assert prompt[0]["role"] == "user"
    if name == "lone_surrogate":
        # the trace cannot hold a lone surrogate (not UTF-8): it keeps a replacement character
        assert prompt[0]["content"] == "cut emoji \ufffd"
    if name.startswith("deep_content"):
        # recorded, with the sub-tree beyond the trace's depth limit replaced by the marker
        assert "__TRUNCATED__" in json.dumps(prompt)


async def test_streamed_request_with_a_lone_surrogate_is_rewritten_faithfully(
    start_tripwire: StartTripwire, upstream: tuple[RawFake, str]
) -> None:
    """A streamed chat gets `stream_options.include_usage` added: the body is written again,
    keeping the lone surrogate (as its escape) and NaN as they were."""
    fake, url = upstream
    tw = await start_tripwire(upstream={"url": url})
    body = chat_body('"cut \\ud83d"', ', "stream": true, "temperature": NaN, "seed": ' + "9" * 30)
    status, _, raw = await post(tw, CHAT, body)
    assert status == 200 and raw.rstrip().endswith(b"data: [DONE]")
    (sent,) = fake.raw
    upstream_body = json.loads(sent)
    assert upstream_body["messages"][0]["content"] == "cut \ud83d"
    assert upstream_body["stream_options"] == {"include_usage": True}
    assert repr(upstream_body["temperature"]) == "nan" and upstream_body["seed"] == int("9" * 30)
    _, events = await trace(tw)
    (call,) = only(events, "LLM_CALL")
    assert call["payload"]["usage"]["total_tokens"] == 120


async def test_streamed_deep_request_is_rewritten_without_recursion(
    start_tripwire: StartTripwire, upstream: tuple[RawFake, str]
) -> None:
    fake, url = upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_llm_calls": 1}})
    body = chat_body(deep(DEEP, '"\\ud83d"'), ', "stream": true')
    assert (await post(tw, CHAT, body))[0] == 200
    assert (await post(tw, CHAT, body))[0] == 429
    (sent,) = fake.raw
    rewritten = jsonparse.loads(sent)
    assert rewritten.pop("stream_options") == {"include_usage": True}
    assert jsonparse.dumps(rewritten) == jsonparse.dumps(jsonparse.loads(body))
    _, events = await trace(tw)
    (call,) = only(events, "LLM_CALL")
    assert call["payload"]["usage"]["total_tokens"] == 120 and call["payload"]["stream"] is True


REFUSED = {
    "invalid_utf8": chat_body('"bad "').replace(b"bad ", b"bad \xff"),
    "int_5000_digits": chat_body('"hello"', ', "seed": ' + "7" * 5000),
    "garbage": b"this is not json {",
    "truncated": chat_body()[:-1],
    "deep_unclosed": chat_body(deep(DEEP))[:-3],
}


@pytest.mark.parametrize("name", list(REFUSED))
async def test_bodies_json_loads_refuses_get_a_400_in_openai_shape_recorded_never_forwarded(
    start_tripwire: StartTripwire, upstream: tuple[RawFake, str], name: str
) -> None:
    fake, url = upstream
    body = REFUSED[name]
    with pytest.raises((ValueError, RecursionError)):
        json.loads(body)
    tw = await start_tripwire(upstream={"url": url})
    status, data, _ = await post(tw, CHAT, body)
    assert status == 400
    error = data["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert fake.raw == []
    _, events = await trace(tw)
    assert [e["event_type"] for e in events] == ["RUN_START", "ERROR"]
    assert events[1]["payload"]["error_type"] == "invalid_request_body"
    assert events[1]["payload"]["http_status"] == 400


class SendsRaw(httpx.AsyncBaseTransport):
    """An SDK's transport that sends `raw` instead of the body the SDK wrote: a client whose
    serialiser emits bytes json.loads refuses (the Python SDKs cannot), with the SDK still reading
    the answer."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"content-length"]
        sent = httpx.Request(request.method, request.url, headers=headers, content=self.raw)
        return await self.inner.handle_async_request(sent)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_openai_sdk_reads_the_refusal_as_a_bad_request(
    start_tripwire: StartTripwire, upstream: tuple[RawFake, str]
) -> None:
    fake, url = upstream
    tw = await start_tripwire(upstream={"url": url})
    transport = SendsRaw(REFUSED["int_5000_digits"])
    llm = openai.AsyncOpenAI(
        base_url=tw.url + "/v1",
        api_key=AGENT_KEY,
        default_headers=SESSION,
        max_retries=0,
        http_client=httpx.AsyncClient(transport=transport),
    )
    with pytest.raises(openai.BadRequestError) as caught:
        await llm.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 400
    assert caught.value.type == "invalid_request_error"
    assert "4300" in caught.value.message or "digits" in caught.value.message
    assert fake.raw == []


async def test_anthropic_route_refuses_in_anthropic_error_shape(
    start_tripwire: StartTripwire, upstream: tuple[RawFake, str]
) -> None:
    import anthropic

    fake, url = upstream
    tw = await start_tripwire(llm={"anthropic": {"url": url}})
    body = (
        b'{"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": "\xff"}]}'
    )
    status, data, _ = await post(tw, "/llm/anthropic" + MESSAGES, body, **{"x-api-key": AGENT_KEY})
    assert status == 400
    assert data["type"] == "error"
    assert data["error"]["type"] == "invalid_request_error" and data["error"]["message"]
    # the SDK reads it as its own bad request
    client = anthropic.AsyncAnthropic(
        base_url=tw.url + "/llm/anthropic",
        api_key=AGENT_KEY,
        default_headers=SESSION,
        max_retries=0,
        http_client=httpx.AsyncClient(transport=SendsRaw(body)),
    )
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(
            model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.status_code == 400
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert fake.raw == []
    _, events = await trace(tw)
    assert [e["event_type"] for e in events] == ["RUN_START", "ERROR", "ERROR"]


async def test_a_lone_surrogate_in_an_anthropic_body_is_judged_and_forwarded(
    start_tripwire: StartTripwire, upstream: tuple[RawFake, str]
) -> None:
    fake, url = upstream
    tw = await start_tripwire(llm={"anthropic": {"url": url}}, guards={"limits": {"max_llm_calls": 1}})
    body = b'{"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": "\\ud83d"}]}'
    first, _, _ = await post(tw, "/llm/anthropic" + MESSAGES, body, **{"x-api-key": AGENT_KEY})
    second, data, _ = await post(tw, "/llm/anthropic" + MESSAGES, body, **{"x-api-key": AGENT_KEY})
    assert (first, second) == (200, 429)
    assert fake.raw == [body]
    _, events = await trace(tw)
    assert only(events, "ERROR")[0]["payload"]["guardrail"] == "max_llm_calls"
    (call,) = only(events, "LLM_CALL")
    assert call["payload"]["prompt"] == [{"role": "user", "content": "\ufffd"}]


# --- deep tool-call arguments (issue 11, 2) ----------------------------------------------------------


def deep_args(levels: int) -> str:
    """A valid JSON object string nested `levels` deep (what a model may emit as arguments)."""
    return '{"q": ' * levels + '"x"' + "}" * levels


def tool_history(n: int, args: str) -> list[dict[str, Any]]:
    """A user message then `n` assistant tool calls with the same arguments, each with its result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "search until found"}]
    for i in range(n):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "search", "arguments": args}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "nothing found"})
    return messages


@pytest.mark.parametrize("levels", [600, 3000])
async def test_deep_tool_arguments_count_against_max_tool_calls(
    start_tripwire: StartTripwire, upstream: tuple[RawFake, str], levels: int
) -> None:
    fake, url = upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_tool_calls": 2}})
    llm = openai.AsyncOpenAI(
        base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION, max_retries=0
    )
    args = deep_args(levels)
    answered = 0
    with pytest.raises(openai.RateLimitError) as caught:
        for n in range(1, 6):
            await llm.chat.completions.create(model="gpt-4o-mini", messages=tool_history(n, args))  # type: ignore[arg-type]
            answered += 1
    assert answered == 2 and len(fake.calls(CHAT)) == 2
    assert caught.value.body["guardrail"] == "max_tool_calls"  # type: ignore[index]
    _, events = await trace(tw)
    assert [e["payload"]["guardrail"] for e in only(events, "ERROR")] == ["max_tool_calls"]


@pytest.mark.parametrize("levels", [600, 3000])
async def test_a_repetition_loop_of_deep_argument_calls_is_blocked(
    start_tripwire: StartTripwire, upstream: tuple[RawFake, str], levels: int
) -> None:
    fake, url = upstream
    guards = {"loop_detection": {"action": "block", "threshold": 3, "max_repeated_tool_steps": 10}}
    tw = await start_tripwire(upstream={"url": url}, guards=guards)
    llm = openai.AsyncOpenAI(
        base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION, max_retries=0
    )
    args = deep_args(levels)
    texts = []
    for n in range(1, 6):
        resp = await llm.chat.completions.with_raw_response.create(
            model="gpt-4o-mini",
            messages=tool_history(n, args),  # type: ignore[arg-type]
        )
        texts.append((resp.headers.get("X-Tripwire-Guard"), resp.parse().choices[0].message.content))
        if resp.headers.get("X-Tripwire-Guard"):
            break
    guard, text = texts[-1]
    assert guard == "loop_detection" and text.startswith("[tripwire] blocked:")
    assert len(texts) == 3  # the request whose history holds the 3rd repetition is answered
    assert len(fake.calls(CHAT)) == 2
    _, events = await trace(tw)
    assert len(only(events, "LOOP_WARNING")) == 1


# --- the recorded prompt is what is new (issue 11, 7) ------------------------------------------------


async def test_responses_call_after_chat_calls_records_its_own_message(
    start_tripwire: StartTripwire, upstream: tuple[RawFake, str]
) -> None:
    fake, url = upstream
    tw = await start_tripwire(upstream={"url": url})
    llm = openai.AsyncOpenAI(
        base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION, max_retries=0
    )
    await llm.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "one"}])
    await llm.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "two"}])
    await llm.responses.create(model="gpt-4o-mini", input="hello")
    history = [
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "fine"},
        {"role": "user", "content": "three"},
    ]
    await llm.chat.completions.create(model="gpt-4o-mini", messages=history)  # type: ignore[arg-type]
    await llm.chat.completions.create(
        model="gpt-4o-mini",
        messages=[*history, {"role": "assistant", "content": "fine"}, {"role": "user", "content": "four"}],  # type: ignore[list-item]
    )
    _, events = await trace(tw)
    prompts = [c["payload"]["prompt"] for c in only(events, "LLM_CALL")]
    assert prompts == [
        [{"role": "user", "content": "one"}],
        [{"role": "user", "content": "two"}],  # one message each: a new conversation, not [] by count
        [{"role": "user", "content": "hello"}],
        history,  # starts with a message that differs from the previous call's: all of it
        [{"role": "assistant", "content": "fine"}, {"role": "user", "content": "four"}],  # continues
    ]
    totals = [c["payload"]["prompt_messages_total"] for c in only(events, "LLM_CALL")]
    assert totals == [1, 1, 1, 3, 5]


async def test_deep_bodies_are_recorded_without_content_too(
    start_tripwire: StartTripwire, upstream: tuple[RawFake, str]
) -> None:
    """record_content: false keeps a deep prompt's structure only, and still records the call."""
    fake, url = upstream
    tw = await start_tripwire(upstream={"url": url}, record_content=False)
    extra = ', "cache_control": ' + '{"a": ' * DEEP + "1" + "}" * DEEP
    body = b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"' + extra.encode() + b"}]}"
    status, _, _ = await post(tw, CHAT, body)
    assert status == 200
    _, events = await trace(tw)
    (call,) = only(events, "LLM_CALL")
    assert call["payload"]["status"] == "ok" and call["payload"]["prompt_messages_total"] == 1


# --- deep MCP arguments (issue 11, 2) ------------------------------------------------------------------


class JsonRpcServer:
    """A minimal MCP server (JSON answers): every tools/call succeeds, whatever its arguments'
    depth (the Python SDK's server refuses nesting beyond ~200 levels; others need not)."""

    def __init__(self) -> None:
        self.calls = 0
        self.app = web.Application()
        self.app.router.add_post("/mcp", self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        msg = jsonparse.loads(await request.read())
        if "id" not in msg:
            return web.Response(status=202)
        self.calls += msg["method"] == "tools/call"
        result = {"content": [{"type": "text", "text": "stored"}], "isError": False}
        return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": result})


MCP_ARGUMENTS = {
    "deep_600": '{"data": ' + deep_args(600) + "}",
    "deep_3000": '{"data": ' + deep_args(3000) + "}",
    "lone_surrogate": '{"text": "cut \\ud83d", "n": NaN}',
}


@pytest.mark.parametrize("name", list(MCP_ARGUMENTS))
async def test_mcp_arguments_orjson_refuses_count_against_max_tool_calls(
    start_tripwire: StartTripwire, name: str
) -> None:
    server = JsonRpcServer()
    upstream = TestServer(server.app, host="127.0.0.1")
    await upstream.start_server()
    try:
        url = str(upstream.make_url("/mcp"))
        tw = await start_tripwire(mcp={"deep": {"url": url}}, guards={"limits": {"max_tool_calls": 2}})
        answers = []
        for i in range(4):
            body = (
                '{"jsonrpc": "2.0", "id": ' + str(i) + ', "method": "tools/call", '
                '"params": {"name": "store", "arguments": ' + MCP_ARGUMENTS[name] + "}}"
            )
            status, data, _ = await post(
                tw, "/mcp/deep", body.encode(), Accept="application/json, text/event-stream"
            )
            assert status == 200
            answers.append(data)
    finally:
        await upstream.close()
    assert [("result" in a) for a in answers] == [True, True, False, False]
    assert answers[2]["error"]["data"]["guardrail"] == "max_tool_calls"
    assert server.calls == 2
    _, events = await trace(tw)
    assert len(only(events, "TOOL_CALL")) == 2


# --- deep and odd arguments in the signature code (issue 11, 2) ------------------------------------


def nested(levels: int, leaf: Any) -> Any:
    value = leaf
    for i in range(levels):
        value = {"q": value, "request_id": i} if i % 2 else [value, {"content": [{"text": "x"}]}]
    return value


@pytest.mark.parametrize("levels", [600, 3000, DEEP])
def test_signatures_of_deep_arguments_are_computed_and_distinguish_calls(levels: int) -> None:
    a, b = nested(levels, "x"), nested(levels, "y")
    assert signatures.signature("t", a) == signatures.signature("t", nested(levels, "x"))
    assert signatures.signature("t", a) != signatures.signature("t", b)
    assert signatures.stable_signature("t", a) != signatures.stable_signature("t", b)
    assert signatures.result_fingerprint(a) != signatures.result_fingerprint(b)
    assert signatures.call_fingerprints("t", a) != signatures.call_fingerprints("t", b)
    text = jsonparse.dumps(a).decode()  # the same arguments as a model's JSON string
    assert signatures.signature("t", text) == signatures.signature("t", a)
    text_a = signatures.content_text(a)
    assert 0 < len(text_a) <= 500 and text_a == signatures.content_text(nested(levels, "x"))
    assert signatures.content_text({"content": a}) == signatures.content_text(a)


def test_lone_surrogates_and_huge_integers_in_arguments_are_judged() -> None:
    args = {"text": "cut \ud83d", "n": int("9" * 4000), "created_at": int("1" * 400)}
    sig = signatures.signature("t", args)
    assert sig == signatures.signature("t", dict(args))
    assert signatures.stable_signature("t", args)
    assert signatures.result_fingerprint(args) == signatures.result_fingerprint(dict(args))
    assert signatures.call_fingerprints("t", args)
    assert signatures.error_fingerprint("failed: \ud83d")


@pytest.mark.parametrize("levels", [600, DEEP])
def test_session_guards_judge_deep_mcp_arguments(levels: int) -> None:
    from proxy.guards.config import GuardConfig, LoopDetectionConfig

    config = GuardConfig(loop_detection=LoopDetectionConfig(threshold=3, action="block", no_progress_warn=3))
    g = SessionGuards(config, started_at=0.0)
    args = nested(levels, "same")
    for i in range(2):
        v = g.before_tool_call("store", args, now=float(i))
        assert not v.refused
        fingerprint = signatures.result_fingerprint(nested(levels, "stored"))
        g.after_tool_call(
            v.reservation, "store", args, result_fingerprint=fingerprint, error=None, now=float(i)
        )
    v = g.before_tool_call("store", args, now=3.0)
    assert v.refused and v.decision.kind == "repetition"


async def test_a_loop_of_calls_with_lone_surrogates_is_blocked_and_answered(
    start_tripwire: StartTripwire, upstream: tuple[RawFake, str]
) -> None:
    """A tool name and arguments holding lone surrogates: judged, blocked, and the blocked answer
    (which quotes the call) is still valid UTF-8 JSON; /metrics still renders."""
    fake, url = upstream
    guards = {"loop_detection": {"action": "block", "threshold": 3, "max_repeated_tool_steps": 10}}
    tw = await start_tripwire(upstream={"url": url}, guards=guards)
    history = tool_history(5, '{"q": "cut \\ud83d"}')
    for m in history:
        for call in m.get("tool_calls") or []:
            call["function"]["name"] = "search\ud83d"
    answers = []
    for n in range(1, 6):
        text = json.dumps({"model": "gpt-4o\ud83d", "messages": history[: 1 + 2 * n]})  # ASCII escapes
        answers.append(await post(tw, CHAT, text.encode()))
        if answers[-1][1]["choices"][0]["message"]["content"].startswith("[tripwire]"):
            break
    assert len(answers) == 3 and all(status == 200 for status, _, _ in answers)
    assert len(fake.raw) == 2
    _, events = await trace(tw)
    assert len(only(events, "LOOP_WARNING")) == 1
    async with aiohttp.ClientSession() as http:
        async with http.get(tw.admin_url + "/metrics") as resp:
            assert resp.status == 200


async def test_an_mcp_loop_with_a_lone_surrogate_in_the_tool_name_is_blocked(
    start_tripwire: StartTripwire,
) -> None:
    server = JsonRpcServer()
    upstream = TestServer(server.app, host="127.0.0.1")
    await upstream.start_server()
    try:
        url = str(upstream.make_url("/mcp"))
        guards = {"loop_detection": {"action": "block", "threshold": 3}}
        tw = await start_tripwire(mcp={"deep": {"url": url}}, guards=guards)
        answers = []
        for i in range(4):
            body = (
                '{"jsonrpc": "2.0", "id": ' + str(i) + ', "method": "tools/call", '
                '"params": {"name": "store\\ud83d", "arguments": {"q": "\\ud83d"}}}'
            )
            status, data, _ = await post(
                tw, "/mcp/deep", body.encode(), Accept="application/json, text/event-stream"
            )
            assert status == 200
            answers.append(data["result"])
    finally:
        await upstream.close()
    assert [a["isError"] for a in answers] == [False, False, True, True]
    assert answers[2]["content"][0]["text"].startswith("[tripwire] blocked:")
    assert server.calls == 2
    _, events = await trace(tw)
    assert [e["payload"]["tool_name"] for e in only(events, "TOOL_CALL")] == ["store\ufffd"] * 2
    async with aiohttp.ClientSession() as http:
        async with http.get(tw.admin_url + "/metrics") as resp:
            assert resp.status == 200


async def test_an_unreadable_body_without_a_session_header_lands_in_the_agents_automatic_run(
    start_tripwire: StartTripwire, upstream: tuple[RawFake, str]
) -> None:
    fake, url = upstream
    tw = await start_tripwire(upstream={"url": url})
    auto: dict[str, Any] = {"session": False, "X-Tripwire-Agent": "solo"}
    status, data, _ = await post(tw, CHAT, REFUSED["garbage"], **auto)
    assert status == 400 and data["error"]["type"] == "invalid_request_error"
    await tw.flush()
    assert tw.run_ids() == []  # no run to name yet: logged, not recorded in a run of its own
    assert (await post(tw, CHAT, chat_body(), **auto))[0] == 200
    assert (await post(tw, CHAT, REFUSED["invalid_utf8"], **auto))[0] == 400
    _, events = await trace(tw)
    assert [e["event_type"] for e in events] == ["RUN_START", "LLM_CALL", "ERROR"]
    assert len(fake.raw) == 1


DEEP_JSON = deep(DEEP, '"\\ud83d"')
OTHER_DIALECTS = {
    "responses": (
        "/v1/responses",
        '{"model": "gpt-4o", "input": [{"role": "user", "content": "go"}, '
        '{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "'
        + deep_args(DEEP).replace('"', '\\"')
        + '"}, {"type": "function_call_output", "call_id": "c1", "output": '
        + DEEP_JSON
        + "}, "
        '{"role": "user", "content": ' + DEEP_JSON + "}]}",
    ),
    "anthropic": (
        "/llm/anthropic/v1/messages",
        '{"model": "claude-sonnet-4-5", "max_tokens": 10, "system": ' + DEEP_JSON + ', "messages": ['
        '{"role": "user", "content": "go"}, '
        '{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": '
        + DEEP_JSON
        + "}}]}, "
        '{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": true, '
        '"content": ' + DEEP_JSON + "}]}]}",
    ),
    "embeddings": ("/v1/embeddings", '{"model": "text-embedding-3-small", "input": ' + DEEP_JSON + "}"),
}


@pytest.mark.parametrize("name", list(OTHER_DIALECTS))
@pytest.mark.parametrize("stream", [False, True])
async def test_deep_bodies_of_every_dialect_are_judged(
    start_tripwire: StartTripwire, upstream: tuple[RawFake, str], name: str, stream: bool
) -> None:
    fake, url = upstream
    path, text = OTHER_DIALECTS[name]
    if stream:
        text = text[:-1] + ', "stream": true}'
    body = text.encode()
    tw = await start_tripwire(
        upstream={"url": url}, llm={"anthropic": {"url": url}}, guards={"limits": {"max_llm_calls": 1}}
    )
    first, _, _ = await post(tw, path, body, **{"x-api-key": AGENT_KEY})
    second, _, _ = await post(tw, path, body, **{"x-api-key": AGENT_KEY})
    assert (first, second) == (200, 429)
    assert fake.raw == [body]  # none of these dialects rewrites a body
    _, events = await trace(tw)
    assert len(only(events, "LLM_CALL")) == 1
