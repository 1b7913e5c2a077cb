"""A held `response.create` on the Responses WebSocket (SPEC §5.5a; issue 23 acceptance 2): nothing
is sent on the socket until a person decides; approved, the upstream's real response; denied, the
synthetic completed response carrying the note, and the socket goes on."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.conftest import StartTripwire
from tests.fakes import Reply
from tests.test_approvals import approvals, decide, until
from tests.test_websocket import auth, create, until_done

GUARDS = {"loop_detection": {"action": "ask", "threshold": 3, "max_repeated_tool_steps": 10}}


@pytest.mark.parametrize("decision", ["approve", "deny"])
async def test_a_held_response_create(
    start_tripwire: StartTripwire, fake_upstream: Any, decision: str
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(tool_calls=[(f"call_{i}", "get_weather", {"city": "Paris"})]) for i in range(3)] + [
        Reply(text="Paris is sunny (upstream)")
    ]
    tw = await start_tripwire(upstream={"url": url}, guards=GUARDS, admin_token="hunter2")
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=auth()) as ws,
    ):
        await ws.send_str(create(input="weather in Paris?"))
        events = await until_done(ws)
        for i in range(3):  # the third output's request holds the 3rd identical call: held
            (fc,) = [i for i in events[-1]["response"]["output"] if i["type"] == "function_call"]
            output = {"type": "function_call_output", "call_id": fc["call_id"], "output": "sunny"}
            await ws.send_str(create(previous_response_id=events[-1]["response"]["id"], input=[output]))
            if i < 2:
                events = await until_done(ws)
        (approval,) = await until(lambda: approvals(tw), "the response.create held")
        creates_before = len([m for m in fake.ws_messages if m.get("type") == "response.create"])
        status, _ = await decide(tw, approval["id"], {"decision": decision, "note": "summarise now"})
        assert status == 200
        answer = await until_done(ws)  # the first frame after the decision: nothing was sent while held
        assert answer[0]["type"] == "response.created"
        assert answer[-1]["type"] == "response.completed"
        text = answer[-1]["response"]["output"][0]["content"][0]["text"]
    creates = len([m for m in fake.ws_messages if m.get("type") == "response.create"])
    if decision == "approve":
        assert text == "Paris is sunny (upstream)"
        assert creates == creates_before + 1
    else:
        assert text.startswith("[tripwire] blocked:") and "summarise now" in text
        assert creates == creates_before
