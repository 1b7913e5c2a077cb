"""The real `anthropic` SDK through `--llm anthropic=URL` (issue 2, acceptance 4)."""

from __future__ import annotations

import anthropic
import pytest

from proxy.dialects.base import Usage
from proxy.pricing import Pricing
from tests.conftest import AGENT_KEY, StartTripwire
from tests.fakes import Reply
from tests.schema import assert_run_valid

MODEL = "claude-sonnet-4-5"


async def test_messages_streamed_and_not(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    fake.replies = [
        Reply(text="plain answer", prompt_tokens=30, completion_tokens=7),
        Reply(
            text="streamed answer",
            tool_calls=[("toolu_1", "search", {"q": "x"})],
            prompt_tokens=50,
            completion_tokens=12,
        ),
    ]
    tw = await start_tripwire(llm={"anthropic": {"url": url}})
    # one session for both calls (each a first request, alone a run of its own: SPEC §3)
    c = anthropic.AsyncAnthropic(
        base_url=tw.url + "/agents/default/sessions/s/llm/anthropic", api_key=AGENT_KEY, max_retries=0
    )
    msg = await c.messages.create(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].text == "plain answer"
    async with c.messages.stream(
        model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        final = await stream.get_final_message()
    assert final.content[0].text == "streamed answer" and final.content[1].input == {"q": "x"}
    sent = fake.calls("/v1/messages")[0].headers
    # the SDK's own auth header (x-api-key, or Authorization in newer SDKs) reaches the upstream
    assert AGENT_KEY in (sent.get("x-api-key", "") + sent.get("Authorization", ""))
    await tw.flush()
    (run_id,) = tw.run_ids()
    llm = [e["payload"] for e in tw.events(run_id) if e["event_type"] == "LLM_CALL"]
    assert [p["usage"] for p in llm] == [
        {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37},
        {"prompt_tokens": 50, "completion_tokens": 12, "total_tokens": 62},
    ]
    assert [p["stream"] for p in llm] == [False, True]
    assert llm[1]["stop_reason"] == "tool_use"
    assert llm[1]["response"]["tool_calls"] == [{"id": "toolu_1", "name": "search", "arguments": {"q": "x"}}]
    pricing = Pricing()
    for p in llm:
        u = p["usage"]
        quote = pricing.cost(Usage(u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]), [MODEL])
        assert quote.known and p["cost_usd"] == pytest.approx(quote.cost_usd) and p["cost_usd"] > 0
        assert p["provider"] == "anthropic" and p["upstream"] == "anthropic"
    assert_run_valid(tw.data_dir, run_id)
