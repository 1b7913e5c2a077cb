"""Lineage across every Responses output item type (issue 32 item 4).

A Responses conversation that announces no session is one run as long as each request's history
carries the answer the run gave: whatever items that answer held. Codex's answers hold
`local_shell_call`, `web_search_call` and the other call items, not only `function_call`s; a
history that carries them must still be recognised as the run's, and the local shell call the
agent ran is recorded as a TOOL_CALL."""

from __future__ import annotations

import copy
from typing import Any

import aiohttp
import pytest

from proxy.dialects import openai_responses
from tests.conftest import AGENT_KEY, StartTripwire
from tests.fakes import Reply
from tests.schema import assert_run_valid

# one answer per item type the dialect reads as a call: (the answer's items, what the agent sends back)
ANSWERS: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [
    (
        [
            {
                "type": "web_search_call",
                "id": "ws_1",
                "status": "completed",
                "action": {"type": "search", "query": "q"},
            },
            {
                "type": "local_shell_call",
                "id": "lsh_1",
                "call_id": "call_ls1",
                "status": "completed",
                "action": {"type": "exec", "command": ["bash", "-lc", "ls"], "env": {}, "timeout_ms": 1000},
            },
        ],
        [{"type": "function_call_output", "call_id": "call_ls1", "output": "README.md\n"}],
    ),
    (
        [
            {
                "type": "shell_call",
                "id": "sh_1",
                "call_id": "call_sh1",
                "status": "completed",
                "action": {"commands": ["pwd"]},
            }
        ],
        [{"type": "shell_call_output", "call_id": "call_sh1", "output": [{"stdout": "/w", "stderr": ""}]}],
    ),
    (
        [
            {
                "type": "apply_patch_call",
                "id": "ap_1",
                "call_id": "call_ap1",
                "status": "completed",
                "operation": {"type": "create_file", "path": "a.txt", "diff": "+a"},
            }
        ],
        [{"type": "apply_patch_call_output", "call_id": "call_ap1", "status": "completed", "output": "ok"}],
    ),
    (
        [
            {
                "type": "computer_call",
                "id": "cu_1",
                "call_id": "call_cu1",
                "status": "completed",
                "action": {"type": "click", "x": 1, "y": 2, "button": "left"},
                "pending_safety_checks": [],
            }
        ],
        [{"type": "computer_call_output", "call_id": "call_cu1", "output": {"type": "computer_screenshot"}}],
    ),
    (
        [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_c1", "name": "grep", "input": "x"},
            {"type": "function_call", "id": "fc_1", "call_id": "call_f1", "name": "read", "arguments": "{}"},
        ],
        [
            {"type": "custom_tool_call_output", "call_id": "call_c1", "output": "1 match"},
            {"type": "function_call_output", "call_id": "call_f1", "output": "text"},
        ],
    ),
    (
        [
            {
                "type": "tool_search_call",
                "id": "ts_1",
                "call_id": "call_ts1",
                "execution": "client",
                "status": "completed",
                "arguments": {"query": "calendar"},
            }
        ],
        [{"type": "tool_search_output", "call_id": "call_ts1", "execution": "client", "tools": []}],
    ),
    (
        [
            {
                "type": "file_search_call",
                "id": "fs_1",
                "status": "completed",
                "queries": ["q"],
                "results": [],
            },
            {
                "type": "code_interpreter_call",
                "id": "ci_1",
                "status": "completed",
                "code": "1+1",
                "outputs": [],
            },
            {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": "aGk="},
            {
                "type": "mcp_call",
                "id": "mcp_1",
                "server_label": "files",
                "name": "read",
                "arguments": "{}",
                "output": "text",
            },
            {"type": "mcp_list_tools", "id": "mlt_1", "server_label": "files", "tools": []},
            {
                "type": "mcp_approval_request",
                "id": "mar_1",
                "server_label": "files",
                "name": "delete",
                "arguments": "{}",
            },
        ],
        [{"type": "mcp_approval_response", "approval_request_id": "mar_1", "approve": False}],
    ),
]


def test_the_answers_cover_every_call_item_type_the_dialect_knows() -> None:
    used = {item["type"] for items, _ in ANSWERS for item in items}
    assert set(openai_responses.CALL_ITEM_TYPES) <= used


@pytest.mark.parametrize("stream", [False, True])
async def test_a_conversation_of_every_item_type_is_one_run(
    stream: bool, start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(output_items=copy.deepcopy(items)) for items, _ in ANSWERS]
    fake.default = Reply(text="done.")
    tw = await start_tripwire(upstream={"url": url})
    history: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "tidy the repo"}]
    headers = {"Authorization": f"Bearer {AGENT_KEY}"}  # no session announced: lineage alone decides
    async with aiohttp.ClientSession() as http:
        for items, sent_back in [*ANSWERS, ([], [])]:
            body = {"model": "gpt-5", "input": history, "stream": stream}
            async with http.post(tw.url + "/v1/responses", json=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
            history = [*history, *copy.deepcopy(items), *sent_back]
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    assert sum(e["event_type"] == "LLM_CALL" for e in events) == len(ANSWERS) + 1
    tool_calls = {e["name"]: e for e in events if e["event_type"] == "TOOL_CALL"}
    shell = tool_calls["local_shell"]
    assert shell["payload"]["args"]["command"] == ["bash", "-lc", "ls"]
    assert shell["payload"]["result"] == "README.md\n"
    assert {"shell", "apply_patch", "computer", "grep", "read", "tool_search", "web_search"} <= set(
        tool_calls
    )


async def test_codexs_compaction_request_stays_in_the_run(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    """Codex 0.171's compaction request (tests/fixtures/codex_0171_http.json, its session id taken
    out): the history it sends ends with a `compaction_trigger` item, the client's, not an answer; the
    newest answer it carries is the run's, so the request is the run's."""
    import json
    from pathlib import Path

    codex = json.loads((Path(__file__).parent / "fixtures" / "codex_0171_http.json").read_text())
    fake, url = fake_upstream
    fake.replies = [Reply(output_items=codex["answers"][0])]
    fake.default = Reply(text="compacted.")
    tw = await start_tripwire(upstream={"url": url})
    async with aiohttp.ClientSession() as http:
        for body in codex["requests"][:2]:
            body = {k: v for k, v in body.items() if k != "prompt_cache_key"}
            headers = {"Authorization": f"Bearer {AGENT_KEY}"}
            async with http.post(tw.url + "/v1/responses", json=body, headers=headers) as resp:
                assert resp.status == 200
                await resp.read()
    assert codex["requests"][1]["input"][-1] == {"type": "compaction_trigger"}
    await tw.flush()
    (run_id,) = tw.run_ids()
    assert tw.run_json(run_id)["counts"]["llm_calls"] == 2
