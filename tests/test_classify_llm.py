"""Issue 30's breaks on LLM routes (2, 3, 4, 5, 8, 9): a denied tool never reaches the fake upstream,
whatever the path's spelling, the tool's shape or the socket; the history of a denied call is
blocked. Each through one replica and through two sharing Redis (calls alternate between them)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from yarl import URL

from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream

DENIED = "shell"
HEADERS = {"Authorization": f"Bearer {AGENT_KEY}", "X-Tripwire-Agent": "bot", "X-Tripwire-Session": "c1"}
WAIT_S = 30
Replicas = Callable[..., Awaitable[list[Running]]]


@pytest.fixture(params=["one", "two-on-redis"])
def replicas(request: pytest.FixtureRequest, start_tripwire: StartTripwire) -> Replicas:
    """Tripwire as one replica, or as two sharing a real Redis (a test alternates between them)."""

    async def start(**settings: Any) -> list[Running]:
        if request.param == "one":
            return [await start_tripwire(**settings)]
        redis_url = request.getfixturevalue("redis_url")
        return [await start_tripwire(state={"url": redis_url}, **settings) for _ in range(2)]

    return start


def function(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def reached(fake: FakeUpstream, name: str = DENIED) -> list[str]:
    """Every request the fake upstream received whose body names `name` anywhere (a denied tool)."""
    return [f"{s.method} {s.path}" for s in fake.seen if name in json.dumps(s.body)]


async def post(tw: Running, path: str, body: Any) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(URL(tw.url + path, encoded=True), json=body, headers=HEADERS) as r,
    ):
        text = await r.text()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text


CHAT_BODY: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "hi"}],
    "tools": [function("search"), function(DENIED)],
    "tool_choice": {"type": "function", "function": {"name": DENIED}},
}


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat%2Fcompletions",
        "/v1/chat/Completions",
        "/v1/chat/completions;x=1",
        "/v1/chat/completions%20",
        "/v1/chat/completions%09",
        "/v1//chat/completions",
        "/v1/CHAT/COMPLETIONS/",
    ],
)
async def test_a_path_spelling_is_the_endpoint_it_names(
    replicas: Replicas, fake_upstream: tuple[FakeUpstream, str], path: str
) -> None:
    """Break 2: the normalised path is classified and is what reaches the upstream; the filter applies."""
    fake, url = fake_upstream
    for i, tw in enumerate(await replicas(upstream={"url": url}, guards={"tools": {"deny": [DENIED]}})):
        status, answer = await post(tw, path, CHAT_BODY)
        assert status == 200, answer
        seen = fake.calls("/v1/chat/completions")
        assert len(seen) == i + 1, [s.path for s in fake.seen]
        assert [t["function"]["name"] for t in seen[-1].body["tools"]] == ["search"]
        assert "tool_choice" not in seen[-1].body
    assert reached(fake) == []


async def test_an_unknown_post_is_refused_when_policy_applies(
    replicas: Replicas, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """Fail closed: a POST no dialect reads is a 404 in the protocol's shape naming the path."""
    fake, url = fake_upstream
    for tw in await replicas(upstream={"url": url}, guards={"tools": {"deny": [DENIED]}}):
        status, answer = await post(tw, "/v1/chat/completionz", CHAT_BODY)
        assert status == 404
        assert answer["error"]["code"] == "unknown_endpoint"
        assert "/v1/chat/completionz" in answer["error"]["message"]
        assert "passthrough_unknown" in answer["error"]["message"]
        # the same in Anthropic's shape for an Anthropic client
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                tw.url + "/v1/messages/batches/x",
                json={},
                headers={**HEADERS, "anthropic-version": "2023-06-01"},
            ) as r,
        ):
            refused = await r.json()
        assert r.status == 404 and refused["type"] == "error"
        assert refused["error"]["type"] == "not_found_error"
        # known operations without a dialect are still relayed: a models list, a token count, files
        status, _ = await post(tw, "/v1/messages/count_tokens", {"model": "m", "messages": []})
        assert status == 200
        async with aiohttp.ClientSession() as http, http.get(tw.url + "/v1/models", headers=HEADERS) as r:
            assert r.status == 200
    assert fake.calls("/v1/chat/completionz") == [] and reached(fake) == []
    assert len(fake.calls("/v1/messages/count_tokens")) == len(fake.calls("/v1/models")) >= 1


async def test_passthrough_unknown_restores_the_relay(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(
        upstream={"url": url}, guards={"tools": {"deny": [DENIED]}}, passthrough_unknown=True
    )
    status, _ = await post(tw, "/v1/chat/completionz", {"model": "m"})
    assert status == 200 and len(fake.calls("/v1/chat/completionz")) == 1


async def test_without_policy_an_unknown_post_is_relayed(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    status, _ = await post(tw, "/v1/chat/completionz", {"model": "m"})
    assert status == 200 and len(fake.calls("/v1/chat/completionz")) == 1


@pytest.mark.parametrize(
    "tool",
    [
        # break 3: a decoy top-level name beside the function's own
        {"type": "function", "name": "harmless", "function": {"name": DENIED, "parameters": {}}},
        # break 4: a custom (free-form) tool
        {"type": "custom", "custom": {"name": DENIED, "description": "runs anything"}},
    ],
    ids=["decoy-name", "custom"],
)
async def test_a_tool_is_known_by_every_name_it_carries(
    replicas: Replicas, fake_upstream: tuple[FakeUpstream, str], tool: dict[str, Any]
) -> None:
    fake, url = fake_upstream
    kind = tool["type"]
    choice = {"type": kind, kind: {"name": DENIED}}
    body = {**CHAT_BODY, "tools": [function("search"), tool], "tool_choice": choice}
    for tw in await replicas(upstream={"url": url}, guards={"tools": {"deny": [DENIED]}}):
        status, answer = await post(tw, "/v1/chat/completions", body)
        assert status == 200, answer
        seen = fake.calls("/v1/chat/completions")[-1].body
        assert seen["tools"] == [function("search")] and "tool_choice" not in seen
    assert reached(fake) == []


@pytest.mark.parametrize(
    "assistant",
    [
        {"role": "assistant", "content": None, "function_call": {"name": DENIED, "arguments": "{}"}},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_c", "type": "custom", "custom": {"name": DENIED, "input": "rm"}}],
        },
    ],
    ids=["legacy-function-call", "custom-tool-call"],
)
async def test_a_history_showing_a_denied_call_of_any_shape_is_blocked(
    replicas: Replicas, fake_upstream: tuple[FakeUpstream, str], assistant: dict[str, Any]
) -> None:
    """Break 5: the history's legacy `function_call` and custom tool calls are judged as function calls."""
    fake, url = fake_upstream
    result = (
        {"role": "function", "name": DENIED, "content": "done"}
        if "function_call" in assistant
        else {"role": "tool", "tool_call_id": "call_c", "content": "done"}
    )
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "go"}, assistant, result]}
    for i, tw in enumerate(await replicas(upstream={"url": url}, guards={"tools": {"deny": [DENIED]}})):
        headers = {**HEADERS, "X-Tripwire-Session": f"h{i}"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(tw.url + "/v1/chat/completions", json=body, headers=headers) as r,
        ):
            answer = await r.json()
            assert r.headers.get("X-Tripwire-Guard") == "tool_denied", answer
        assert answer["choices"][0]["message"]["content"].startswith("[tripwire] denied")
    assert fake.calls("/v1/chat/completions") == []


WS_HEADERS = {**HEADERS, "openai-beta": "responses_websockets=2026-02-06"}


@pytest.mark.parametrize("path", ["/v1/realtime", "/v1/chat/completions", "/v1/somewhere/else"])
async def test_a_socket_without_a_dialect_is_refused_when_policy_applies(
    replicas: Replicas, fake_upstream: tuple[FakeUpstream, str], path: str
) -> None:
    """Break 8: a WebSocket on a path no dialect reads calls over would go unjudged: refused."""
    fake, url = fake_upstream
    for tw in await replicas(upstream={"url": url}, guards={"tools": {"deny": [DENIED]}}):
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(tw.url + path, headers=WS_HEADERS)
            assert refused.value.status == 404
            upgrade = {
                "Upgrade": "websocket",
                "Connection": "Upgrade",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            }
            async with http.get(tw.url + path, headers={**WS_HEADERS, **upgrade}) as r:
                body = await r.json()
            assert r.status == 404 and body["error"]["code"] == "unknown_endpoint"
            assert "passthrough_unknown" in body["error"]["message"]
    assert fake.ws_handshakes == []


async def test_a_socket_without_a_dialect_is_relayed_with_passthrough_unknown(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(
        upstream={"url": url}, guards={"tools": {"deny": [DENIED]}}, passthrough_unknown=True
    )
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/realtime", headers=WS_HEADERS) as ws,
    ):
        await ws.send_str("hi")
        assert (await asyncio.wait_for(ws.receive(), WAIT_S)).data == "echo:hi"
    assert len(fake.ws_handshakes) == 1


async def test_tools_nested_under_response_on_a_responses_socket_are_filtered(
    replicas: Replicas, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """Break 9: a `response.create` carrying its tools under `response` (the Realtime shape)."""
    fake, url = fake_upstream
    create = {
        "type": "response.create",
        "model": "gpt-4o",
        "input": "hi",
        "response": {
            "tools": [{"type": "function", "name": "search"}, {"type": "function", "name": DENIED}],
            "tool_choice": {"type": "function", "name": DENIED},
        },
    }
    for tw in await replicas(upstream={"url": url}, guards={"tools": {"deny": [DENIED]}}):
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(tw.url + "/v1/responses", headers=WS_HEADERS) as ws,
        ):
            await ws.send_str(json.dumps(create))
            while True:
                event = json.loads((await asyncio.wait_for(ws.receive(), WAIT_S)).data)
                if event["type"] in ("response.completed", "error"):
                    break
        assert event["type"] == "response.completed", event
    assert fake.ws_messages, "the call reached the upstream"
    for sent in fake.ws_messages:
        assert sent["response"]["tools"] == [{"type": "function", "name": "search"}]
        assert DENIED not in json.dumps(sent)


async def test_a_history_showing_an_ask_tools_custom_call_is_held(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """Break 5, `ask`: the custom tool call in the history holds the request for a person, as a
    function call does; denied, it is blocked unforwarded."""
    from tests.test_approvals import approvals, decide, until

    fake, url = fake_upstream
    tw = await start_tripwire(
        upstream={"url": url}, guards={"tools": {"ask": [DENIED]}}, admin_token="hunter2"
    )
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_a", "type": "custom", "custom": {"name": DENIED, "input": "ls"}}],
    }
    result = {"role": "tool", "tool_call_id": "call_a", "content": "done"}
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "go"}, assistant, result]}
    held = asyncio.create_task(post(tw, "/v1/chat/completions", body))
    (approval,) = await until(lambda: approvals(tw), "the history's ask call held")
    assert approval["guard"] == "tool_ask"
    status, _ = await decide(tw, approval["id"], {"decision": "deny", "note": "not now"})
    assert status == 200
    status, answer = await asyncio.wait_for(held, WAIT_S)
    assert status == 200 and "not now" in answer["choices"][0]["message"]["content"]
    assert fake.calls("/v1/chat/completions") == []


async def test_tools_in_a_shape_no_dialect_reads_are_refused_when_policy_applies(
    replicas: Replicas, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """A `tools` object (not a list) would pass the filter unread: a 400 in the dialect's shape."""
    fake, url = fake_upstream
    body = {**CHAT_BODY, "tools": {"0": function(DENIED)}}
    for tw in await replicas(upstream={"url": url}, guards={"tools": {"deny": [DENIED]}}):
        status, answer = await post(tw, "/v1/chat/completions", body)
        assert status == 400 and "'tools'" in answer["error"]["message"]
    assert fake.calls("/v1/chat/completions") == []
