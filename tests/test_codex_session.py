"""A Codex 0.171-shaped session through Tripwire (issue 25): the items Codex sends and gets (tools
declared in `additional_tools`, apply_patch as a custom tool, a client tool search, a hosted web
search, local shell calls) recorded as one TOOL_CALL each, and a loop of local shell calls caught.

Built from tests/fixtures/codex_0171_websocket.json, recorded from the real CLI: the session's
opening items, the items its answers held and the outputs Codex sent back. Over HTTP (SSE, the whole
history each time, as Codex sends it over HTTP) and over the WebSocket (each turn continuing the
last with `previous_response_id`, as Codex does there)."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import AGENT_KEY, StartTripwire
from tests.fakes import Reply
from tests.schema import assert_run_valid
from tests.test_websocket import until_done

CODEX = json.loads((Path(__file__).parent / "fixtures" / "codex_0171_websocket.json").read_text())
RESUMED = CODEX["messages"][1]["input"]  # the whole session as Codex replayed it
SHELL_OUTPUT = "hello-from-local-shell\n"  # the same every time: no progress
LOOPING_SHELL_CALLS = 8


def opening() -> list[dict[str, Any]]:
    """The session's first input: additional_tools, the developer and user messages."""
    first_call = next(i for i, item in enumerate(RESUMED) if item["type"] == "custom_tool_call")
    return copy.deepcopy(RESUMED[:first_call])


def captured(kind: str) -> dict[str, Any]:
    return copy.deepcopy(next(item for item in RESUMED if item["type"] == kind))


def local_shell(n: int) -> dict[str, Any]:
    call = captured("local_shell_call")
    return {**call, "id": f"lsh_{n}", "call_id": f"call_ls{n}"}


def shell_output(n: int) -> dict[str, Any]:
    """Codex answers a local shell call with a function_call_output (what 0.171 sent)."""
    output = captured("function_call_output")
    return {**output, "id": f"fco_{n}", "call_id": f"call_ls{n}", "output": SHELL_OUTPUT}


def session() -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """(what each answer holds, what Codex sends back for it), in order."""
    patch, search = captured("custom_tool_call"), captured("tool_search_call")
    turns = [
        ([patch], [captured("custom_tool_call_output")]),
        ([search], [captured("tool_search_output")]),
        ([captured("web_search_call"), local_shell(1)], [shell_output(1)]),
    ]
    turns += [([local_shell(n)], [shell_output(n)]) for n in range(2, LOOPING_SHELL_CALLS + 1)]
    return turns


def headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {AGENT_KEY}", "X-Tripwire-Session": "codex-0171"}


def tripwire_answered(status: int, text: str) -> bool:
    """Tripwire's own answer (a blocked answer's synthetic response, a refusal): Codex's turn ends."""
    return status >= 400 or "resp_tripwire_" in text


async def over_http(url: str) -> int:
    """Each request the whole history so far, streamed (SSE), until Tripwire answers itself; returns
    how many answers the agent acted on."""
    history = opening()
    async with aiohttp.ClientSession() as http:
        for n, (answer_items, sent_back) in enumerate(session()):
            body = {**CODEX["messages"][1], "input": history, "stream": True}
            del body["type"], body["previous_response_id"]
            async with http.post(url + "/v1/responses", json=body, headers=headers()) as resp:
                if tripwire_answered(resp.status, await resp.text()):
                    return n
            history = [*history, *copy.deepcopy(answer_items), *sent_back]
    return len(session())


async def over_websocket(url: str) -> int:
    """A warm-up, then each turn continuing the last (`previous_response_id`) with only what is new,
    until Tripwire answers itself; returns how many answers the agent acted on."""
    handshake = {**CODEX["handshake_headers"], **headers()}
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(url + "/v1/responses", headers=handshake) as ws,
    ):
        await ws.send_str(json.dumps(CODEX["messages"][0]))
        previous = (await until_done(ws))[-1]["response"]["id"]
        new_items = opening()
        for n, (_answer_items, sent_back) in enumerate(session()):
            turn = {**CODEX["messages"][1], "input": new_items, "previous_response_id": previous}
            await ws.send_str(json.dumps(turn))
            final = (await until_done(ws))[-1]
            if tripwire_answered(final.get("status", 200), json.dumps(final)):
                return n
            previous = final["response"]["id"]
            new_items = sent_back
    return len(session())


@pytest.mark.parametrize("transport", ["http", "websocket"])
async def test_codex_session_records_every_call_once_and_catches_the_shell_loop(
    transport: str, start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(output_items=items) for items, _ in session()]
    fake.default = Reply(text="done.")
    tw = await start_tripwire(upstream={"url": url})
    acted_on = await (over_http if transport == "http" else over_websocket)(tw.url)
    assert 3 < acted_on < len(session()), "the loop of local shell calls was not stopped"
    shell_calls = acted_on - 2  # the answers after apply_patch and the tool search
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    tool_calls = [e for e in events if e["event_type"] == "TOOL_CALL"]
    ids = [e["payload"]["tool_call_id"] for e in tool_calls]
    assert len(ids) == len(set(ids)), "a call recorded twice"
    names = Counter(e["name"] for e in tool_calls)
    assert names == {"apply_patch": 1, "tool_search": 1, "web_search": 1, "local_shell": shell_calls}
    by_name = {e["name"]: e for e in tool_calls}
    assert by_name["apply_patch"]["payload"]["result"].startswith("Exit code: 0")
    assert by_name["local_shell"]["payload"]["args"]["command"] == [
        "bash",
        "-lc",
        "echo hello-from-local-shell",
    ]
    assert by_name["local_shell"]["payload"]["result"] == SHELL_OUTPUT
    assert by_name["web_search"]["meta"]["hosted"] is True
    assert by_name["web_search"]["payload"]["args"] == {"type": "search", "query": "tripwire proxy"}
    assert not by_name["local_shell"]["meta"].get("hosted")
    warnings = [e for e in events if e["event_type"] == "LOOP_WARNING"]
    assert warnings and all("local_shell" in w["name"] for w in warnings)
    (stopped,) = [e for e in events if e["event_type"] == "ERROR"]
    assert stopped["name"] == "loop_detection" and "local_shell" in stopped["payload"]["message"]
    assert tw.run_json(run_id)["counts"]["tool_calls"] == 3 + shell_calls


# ---- a refusal Codex shows (issue 25 item 2) ------------------------------------------------------
# Codex 0.171 (codex-rs `map_api_error`) turns any 429 into "exceeded retry limit, last status: 429
# Too Many Requests[, request id: <x-request-id>]" and does not retry it; the body is never shown.
# Over the WebSocket the `error` event's `status` and `headers` are read as an HTTP answer's.


def codex_prints(status: int, headers: dict[str, str]) -> str:
    request_id = headers.get("x-request-id")
    return f"exceeded retry limit, last status: {status} Too Many Requests" + (
        f", request id: {request_id}" if request_id else ""
    )


def first_turn() -> dict[str, Any]:
    body = {**CODEX["messages"][1], "input": opening(), "stream": True}
    del body["type"], body["previous_response_id"]
    return body


async def test_a_refusal_tells_codex_why_over_http(start_tripwire: StartTripwire, fake_upstream) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_llm_calls": 1}})
    async with aiohttp.ClientSession() as http:
        async with http.post(tw.url + "/v1/responses", json=first_turn(), headers=headers()) as ok:
            assert ok.status == 200
            await ok.read()
        async with http.post(tw.url + "/v1/responses", json=first_turn(), headers=headers()) as refused:
            body = await refused.json()
            status, answer_headers = refused.status, {k.lower(): v for k, v in refused.headers.items()}
    reason = body["error"]["message"]
    assert (status, body["error"]["code"], answer_headers["x-should-retry"]) == (
        429,
        "max_llm_calls",
        "false",
    )
    assert answer_headers["x-request-id"] == reason
    assert "max_llm_calls" in codex_prints(status, answer_headers)


async def test_a_refusal_tells_codex_why_over_the_websocket(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_llm_calls": 1}})
    handshake = {**CODEX["handshake_headers"], **headers()}
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=handshake) as ws,
    ):
        for _ in range(2):
            await ws.send_str(
                json.dumps({**CODEX["messages"][1], "input": opening(), "previous_response_id": None})
            )
            final = (await until_done(ws))[-1]
    assert (final["type"], final["status"], final["error"]["code"]) == ("error", 429, "max_llm_calls")
    assert final["headers"]["x-should-retry"] == "false"
    assert final["headers"]["x-request-id"] == final["error"]["message"]
    assert "max_llm_calls" in codex_prints(final["status"], final["headers"])


def test_the_reason_as_a_header_is_plain_ascii_on_one_line() -> None:
    from proxy.llm_errors import HEADER_TEXT_CHARS, header_text

    assert header_text("[tripwire] refusé: a ≥ b\r\nX-Evil: 1") == "[tripwire] refuse: a  b X-Evil: 1"
    assert len(header_text("x" * 5000)) == HEADER_TEXT_CHARS


def test_only_an_openai_style_429_carries_the_reason_as_its_request_id() -> None:
    """A 503 (shared state unreachable) Codex shows with its message already; Anthropic clients show
    the body: neither gets the reason twice."""
    from proxy.constants import GUARD_STATE_UNAVAILABLE
    from proxy.dialects import anthropic, openai_chat, openai_responses
    from proxy.guards.decision import Action, Decision
    from proxy.llm_errors import refusal_429

    limit = Decision(Action.TERMINATE, "max_llm_calls", "over")
    for dialect in (openai_responses, openai_chat):
        assert refusal_429(limit, "why", True, dialect).headers["x-request-id"] == "why"
    assert "x-request-id" not in refusal_429(limit, "why", True, anthropic).headers
    down = Decision(Action.TERMINATE, GUARD_STATE_UNAVAILABLE, "down", retry_after=2.0)
    unavailable = refusal_429(down, "why", True, openai_responses)
    assert unavailable.status == 503 and "x-request-id" not in unavailable.headers
