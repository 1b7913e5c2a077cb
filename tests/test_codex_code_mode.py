"""Codex code mode through Tripwire (issue 32 item 5), replayed from the real CLI's traffic.

Codex 0.171's default model gets one JavaScript `exec` tool that calls every other tool
(`tools.exec_command(...)`, `tools.mcp__demo__echo(...)`); Codex answers each `exec` call with the
script's output and reports no nested call on its own (tests/fixtures/codex_0171_code_mode_*.json,
captured with the real CLI). Tripwire records what each script ran as its own TOOL_CALL inside the
exec call's, and a denied nested tool (`tools.deny: [shell]`) refuses the request that brings the
exec call's output: the model never sees it. Over HTTP (the whole history each time) and over the
WebSocket (each request continuing the last), as Codex sent them."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.dialects.base import ToolCall
from proxy.dialects.codex_exec import nested_calls
from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import Reply
from tests.schema import assert_run_valid
from tests.test_websocket import until_done

FIXTURES = Path(__file__).parent / "fixtures"
HTTP = json.loads((FIXTURES / "codex_0171_code_mode_http.json").read_text())
WS = json.loads((FIXTURES / "codex_0171_code_mode_websocket.json").read_text())
EXEC_OUTPUT_1 = HTTP["requests"][1]["body"]["input"][-1]["output"]  # what Codex sent back for exec 1


def replies() -> list[Reply]:
    return [Reply(output_items=copy.deepcopy(items)) for items in HTTP["answers"]]


def headers() -> dict[str, str]:
    return {**HTTP["headers"], "Authorization": f"Bearer {AGENT_KEY}"}


async def over_http(
    tw: Running, requests: list[dict[str, Any]] | None = None, sent_headers: dict[str, str] | None = None
) -> list[tuple[int, str]]:
    """The three POSTs Codex sent, until Tripwire answers one itself (Codex's turn then ends);
    (status, body) of each answer."""
    out = []
    async with aiohttp.ClientSession() as http:
        for request in requests or HTTP["requests"]:
            body, url = request["body"], tw.url + request["path"]
            async with http.post(url, json=body, headers=sent_headers or headers()) as resp:
                out.append((resp.status, await resp.text()))
            if "resp_tripwire_" in out[-1][1]:
                break
    return out


async def over_websocket(tw: Running) -> list[dict[str, Any]]:
    """The warm-up and the three turns Codex sent on its socket, each continuing the response
    before it; the final event of each."""
    handshake = {**WS["handshake_headers"], "Authorization": f"Bearer {AGENT_KEY}"}
    finals = []
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=handshake) as ws,
    ):
        previous = None
        for message in WS["messages"]:
            if message.get("previous_response_id"):
                message = {**message, "previous_response_id": previous}
            await ws.send_str(json.dumps(message))
            final = (await until_done(ws))[-1]
            finals.append(final)
            if final["type"] != "response.completed" or "resp_tripwire_" in json.dumps(final):
                break
            previous = final["response"]["id"]
    return finals


def unannounced(tw: Running) -> Any:
    """The HTTP replay without Codex's session id (its headers and `prompt_cache_key`): lineage alone
    must keep the exec answers in the run (the calls read from a script are no part of the answer)."""
    requests = copy.deepcopy(HTTP["requests"])
    for request in requests:
        del request["body"]["prompt_cache_key"]
    drop = {"session-id", "thread-id", "x-client-request-id", "x-codex-window-id", "x-codex-turn-metadata"}
    bare = {k: v for k, v in headers().items() if k.lower() not in drop}
    return over_http(tw, requests, bare)


@pytest.mark.parametrize("transport", ["http", "websocket", "http-lineage"])
async def test_what_exec_ran_is_recorded_call_by_call(
    transport: str, start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    fake.replies = replies()
    fake.default = Reply(text="done.")
    tw = await start_tripwire(upstream={"url": url})
    if transport == "http-lineage":
        assert [status for status, _ in await unannounced(tw)] == [200, 200, 200]
    elif transport == "http":
        assert [status for status, _ in await over_http(tw)] == [200, 200, 200]
    else:
        assert [f["type"] for f in await over_websocket(tw)] == ["response.completed"] * 4
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    calls = [e for e in events if e["event_type"] == "TOOL_CALL"]
    assert [(e["name"], e["payload"]["tool_call_id"]) for e in calls] == [
        ("exec", "call_exec1"),
        ("exec_command", "call_exec1:1"),
        ("demo__echo", "call_exec1:2"),
        ("exec", "call_exec2"),
        ("exec_command", "call_exec2:1"),
    ]
    execs = {e["payload"]["tool_call_id"]: e for e in calls if e["name"] == "exec"}
    shell, echo, listing = (e for e in calls if e["name"] != "exec")
    assert shell["payload"]["args"] == {"cmd": "echo hello-from-exec"}
    assert echo["payload"]["args"] == {"text": "hi from exec"}
    assert listing["payload"]["args"] == {"cmd": "ls", "max_output_tokens": 200}
    for nested, exec_id in ((shell, "call_exec1"), (echo, "call_exec1"), (listing, "call_exec2")):
        assert nested["meta"]["inside"] == "exec" and nested["meta"]["exec_call_id"] == exec_id
        assert nested["parent_id"] == execs[exec_id]["event_id"]
        assert nested["payload"]["result"] == execs[exec_id]["payload"]["result"]
    assert shell["payload"]["result"][-1] == EXEC_OUTPUT_1[-1]  # the script's output, as Codex sent it
    # the LLM_CALL keeps the answer as the model gave it: one exec call
    answers = [e["payload"]["response"]["tool_calls"] for e in events if e["event_type"] == "LLM_CALL"]
    assert [[c["name"] for c in calls] for calls in answers] == [["exec"], ["exec"], []]
    assert tw.run_json(run_id)["counts"]["tool_calls"] == 5


@pytest.mark.parametrize("transport", ["http", "websocket"])
async def test_a_denied_nested_tool_refuses_the_exec_output(
    transport: str, start_tripwire: StartTripwire, fake_upstream
) -> None:
    """`tools.deny: [shell]` (which covers Codex's shell tool, `exec_command`): the exec call's script ran (Codex runs it, Tripwire cannot stop it), but
    the request bringing its output is blocked, never forwarded: the model does not see it."""
    fake, url = fake_upstream
    fake.replies = replies()
    fake.default = Reply(text="done.")
    tw = await start_tripwire(upstream={"url": url}, guards={"tools": {"deny": ["shell"]}})
    if transport == "http":
        answers = await over_http(tw)
        status, blocked = answers[1]
        assert status == 200 and "resp_tripwire_" in blocked and "'exec_command'" in blocked
    else:
        finals = await over_websocket(tw)
        assert "resp_tripwire_" in json.dumps(finals[2]) and "'exec_command'" in json.dumps(finals[2])
    forwarded = [c.body for c in fake.calls("/v1/responses")] if transport == "http" else fake.ws_messages
    assert not any("custom_tool_call_output" in json.dumps(body) for body in forwarded), "output forwarded"
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    (denied,) = [e for e in events if e["event_type"] == "ERROR" and e["name"] == "tool_denied"]
    assert "'exec_command'" in denied["payload"]["message"]


def exec_call(source: str) -> ToolCall:
    return ToolCall("call_x", "exec", source)


def test_the_captured_scripts_name_their_calls() -> None:
    first, second = (answer[0]["input"] for answer in HTTP["answers"])
    assert [(c.name, c.arguments, c.inside) for c in nested_calls(exec_call(first))] == [
        ("exec_command", {"cmd": "echo hello-from-exec"}, "call_x"),
        ("demo__echo", {"text": "hi from exec"}, "call_x"),
    ]
    # after the `// @exec: {...}` pragma line; single quotes, spaces and a second key
    assert [(c.name, c.arguments) for c in nested_calls(exec_call(second))] == [
        ("exec_command", {"cmd": "ls", "max_output_tokens": 200})
    ]


def test_only_calls_of_the_global_tools_object_in_code_count() -> None:
    source = """
    // tools.commented({cmd: "no"})
    /* tools.block_comment() */
    const s = "tools.in_a_string('no')";
    helper.tools.not_global(1); mytools.other(2);
    await tools['apply_patch']("*** Begin Patch\\n*** End Patch\\n");
    await tools.exec_command({ cmd: 'echo ")" it\\'s', workdir: "/w", });
    const r = await tools.view_image({path: somePath});
    await tools.write_stdin();
    """
    assert [(c.id, c.name, c.arguments) for c in nested_calls(exec_call(source))] == [
        ("call_x:1", "apply_patch", "*** Begin Patch\n*** End Patch\n"),
        ("call_x:2", "exec_command", {"cmd": 'echo ")" it\'s', "workdir": "/w"}),
        ("call_x:3", "view_image", {"source": "{path: somePath}"}),
        ("call_x:4", "write_stdin", {}),
    ]


async def test_an_mcp_call_exec_made_through_tripwire_is_recorded_once(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    """As Codex ran it: the script's `tools.mcp__demo__echo(...)` went through Tripwire's /mcp/demo
    (recorded there, source "mcp") before the exec output came back; it is not recorded again."""
    pytest.importorskip("mcp")
    from tests.mcp_servers import MCP_MAJOR, connect, serve

    if MCP_MAJOR < 2:
        pytest.skip("the mcp 2.x client")
    fake, url = fake_upstream
    fake.replies = replies()
    fake.default = Reply(text="done.")
    with serve() as mcp_url:
        tw = await start_tripwire(upstream={"url": url}, mcp={"demo": {"url": mcp_url}})
        async with aiohttp.ClientSession() as http:
            for n, request in enumerate(HTTP["requests"]):
                if n == 1:  # the script runs between the answer and the request bringing its output
                    async with connect("streamable", tw.url + "/mcp/demo") as client:
                        await client.call_tool("echo", {"text": "hi from exec"})
                async with http.post(tw.url + request["path"], json=request["body"], headers=headers()) as r:
                    assert r.status == 200
                    await r.read()
        await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    calls = [(e["name"], e["payload"]["source"]) for e in events if e["event_type"] == "TOOL_CALL"]
    assert calls == [
        ("echo", "mcp"),
        ("exec", "llm"),
        ("exec_command", "llm"),
        ("exec", "llm"),
        ("exec_command", "llm"),
    ]


def test_a_shell_pattern_covers_codexs_shell_tools() -> None:
    from proxy.guards.config import ToolsConfig
    from proxy.guards.permissions import permission

    deny = ToolsConfig(deny=("shell",))
    assert [permission(deny, n) for n in ("exec_command", "write_stdin", "shell", "exec", "view_image")] == [
        "deny",
        "deny",
        "deny",
        "allow",
        "allow",
    ]
    allow_shell = ToolsConfig(allow=("sh*",))
    assert permission(allow_shell, "exec_command") == "allow"
    assert permission(ToolsConfig(ask=("shell",)), "exec_command") == "ask"


def test_an_argument_json_cannot_hold_is_kept_as_its_source() -> None:
    big = "123456789012345678901234567890"
    deep = "[" * 5000 + "]" * 5000
    calls = nested_calls(
        exec_call(f"await tools.a({{n: {big}}}); await tools.b({deep}); await tools.c(1e999)")
    )
    assert [c.arguments for c in calls] == [{"source": f"{{n: {big}}}"}, {"source": deep}, None]


async def test_a_shell_loop_inside_exec_scripts_is_caught(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    """Each answer a different script (its comment), each script the same `ls` with the same output:
    the exec calls differ, the shell calls inside them repeat; loop detection sees the shell calls
    (without them it would see only the exec calls)."""
    fake, url = fake_upstream
    turns = 8
    answers = []
    for n in range(1, turns + 1):
        item = copy.deepcopy(HTTP["answers"][1][0])
        item.update(id=f"ctc_loop{n}", call_id=f"call_loop{n}")
        item["input"] = f"// attempt {n}\n" + item["input"]
        answers.append(item)
    fake.replies = [Reply(output_items=[a]) for a in answers]
    fake.default = Reply(text="done.")
    tw = await start_tripwire(upstream={"url": url})
    output = copy.deepcopy(HTTP["requests"][2]["body"]["input"][-1])  # exec 2's output, as Codex sent it
    body = copy.deepcopy(HTTP["requests"][0]["body"])
    async with aiohttp.ClientSession() as http:
        for n in range(turns + 1):
            async with http.post(tw.url + "/v1/responses", json=body, headers=headers()) as resp:
                text = await resp.text()
            if resp.status != 200 or "resp_tripwire_" in text:
                break  # Tripwire answered itself: the loop was stopped
            if n < turns:
                body["input"] += [copy.deepcopy(answers[n]), {**output, "call_id": answers[n]["call_id"]}]
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    warnings = [e for e in events if e["event_type"] == "LOOP_WARNING"]
    assert any(w["name"].startswith("exec_command") for w in warnings), [
        (e["event_type"], e["name"]) for e in events if e["event_type"] not in ("LLM_CALL", "TOOL_CALL")
    ]
