"""Codex's warm-up (`generate: false`) offers no denied tool either (issue 32 item 6).

Codex opens its Responses socket with a warm-up that declares the session's tools; Tripwire relays
it as it is (it is not a call), but a tool the agent may not call must not reach the model from it
any more than from a call. The warm-up is the one Codex 0.169 sent (tests/fixtures/
codex_0169_websocket.json: its tools in `tools`; 0.171's warm-up declares none)."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from proxy.dialects import openai_responses
from proxy.dialects.base import tool_name
from tests.conftest import AGENT_KEY, StartTripwire
from tests.test_websocket import until_done

CODEX = json.loads((Path(__file__).parent / "fixtures" / "codex_0169_websocket.json").read_text())
WARMUP = CODEX["messages"][0]


def offered(body: dict) -> set[str]:
    return {tool_name(t) for t in openai_responses.declared_tools(body)}


async def test_the_warmup_is_tool_filtered(start_tripwire: StartTripwire, fake_upstream) -> None:
    """`deny: [shell]` covers Codex's shell tools (`exec_command`, `write_stdin`)."""
    fake, url = fake_upstream
    assert WARMUP["generate"] is False and {"exec_command", "write_stdin", "view_image"} <= offered(WARMUP)
    tw = await start_tripwire(upstream={"url": url}, guards={"tools": {"deny": ["shell"]}})
    handshake = {**CODEX["handshake_headers"], "Authorization": f"Bearer {AGENT_KEY}"}
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=handshake) as ws,
    ):
        await ws.send_str(json.dumps(WARMUP))
        assert (await until_done(ws))[-1]["type"] == "response.completed"
    (sent,) = fake.ws_messages
    assert sent["generate"] is False
    assert offered(sent) == offered(WARMUP) - {"exec_command", "write_stdin"}


async def test_a_warmup_without_a_denied_tool_is_relayed_as_it_came(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"tools": {"deny": ["not_offered"]}})
    handshake = {**CODEX["handshake_headers"], "Authorization": f"Bearer {AGENT_KEY}"}
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=handshake) as ws,
    ):
        await ws.send_str(json.dumps(WARMUP))
        await until_done(ws)
    assert fake.ws_messages == [WARMUP]
