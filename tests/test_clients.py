"""docs/clients.md's lines for the Python clients, each used exactly as documented (environment
variables only, or the one URL) against a fake upstream through Tripwire; each call lands in a run
of the agent the URL names. The Agents SDK and LangChain are not in the dev extra: their tests skip
where they are not installed (run them with `pip install openai-agents langchain-openai`)."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream

pytest.importorskip("mcp")  # the mitmproxy environment has no mcp
from tests.mcp_servers import MCP_MAJOR, serve  # noqa: E402


def runs_by_agent(tw: Running) -> dict[str, dict[str, Any]]:
    out = {}
    for run_id in tw.run_ids():
        fields = tw.tripwire_json(run_id)
        out[fields["agent_name"]] = {"run": tw.run_json(run_id), "events": tw.events(run_id)}
    return out


async def test_openai_sdk_from_the_environment(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    monkeypatch.setenv("OPENAI_BASE_URL", f"{tw.url}/agents/my-agent/v1")
    monkeypatch.setenv("OPENAI_API_KEY", AGENT_KEY)
    answer = await openai.AsyncOpenAI(max_retries=0).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}]
    )
    assert answer.choices[0].message.content == "Hello from the fake upstream"
    await tw.flush()
    assert runs_by_agent(tw)["my-agent"]["run"]["counts"]["llm_calls"] == 1
    assert fake.calls("/v1/chat/completions")[0].headers["Authorization"] == f"Bearer {AGENT_KEY}"


async def test_anthropic_sdk_from_the_environment(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(llm={"anthropic": {"url": url}})
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"{tw.url}/agents/my-agent/llm/anthropic")
    monkeypatch.setenv("ANTHROPIC_API_KEY", AGENT_KEY)
    answer = await anthropic.AsyncAnthropic(max_retries=0).messages.create(
        model="claude-sonnet-4-5", max_tokens=100, messages=[{"role": "user", "content": "hello"}]
    )
    assert answer.content[0].type == "text" and answer.content[0].text == "Hello from the fake upstream"
    await tw.flush()
    assert runs_by_agent(tw)["my-agent"]["run"]["counts"]["llm_calls"] == 1
    sent = fake.calls("/v1/messages")[0].headers  # the SDK's key reaches the upstream, as it sent it
    assert AGENT_KEY in (sent.get("x-api-key", "") + sent.get("Authorization", ""))


async def test_openai_agents_sdk_from_the_environment(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    agents = pytest.importorskip("agents")  # openai-agents
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    monkeypatch.setenv("OPENAI_BASE_URL", f"{tw.url}/agents/my-agent/v1")
    monkeypatch.setenv("OPENAI_API_KEY", AGENT_KEY)
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")  # else its traces go to api.openai.com
    agent = agents.Agent(name="helper", instructions="Be brief.", model="gpt-4o-mini")
    result = await agents.Runner.run(agent, "hello")
    assert result.final_output == "Hello from the fake upstream"
    await tw.flush()
    (call,) = [e for e in runs_by_agent(tw)["my-agent"]["events"] if e["event_type"] == "LLM_CALL"]
    assert call["payload"]["response"]["text"] == "Hello from the fake upstream"


async def test_langchain_from_the_environment(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    monkeypatch.setenv("OPENAI_BASE_URL", f"{tw.url}/agents/my-agent/v1")
    monkeypatch.setenv("OPENAI_API_KEY", AGENT_KEY)
    llm = langchain_openai.ChatOpenAI(model="gpt-4o-mini", max_retries=0)
    answer = await llm.ainvoke("hello")
    assert answer.content == "Hello from the fake upstream"
    await tw.flush()
    assert runs_by_agent(tw)["my-agent"]["run"]["counts"]["llm_calls"] == 1


async def test_mcp_sdk_with_the_url(start_tripwire: StartTripwire) -> None:
    if MCP_MAJOR < 2:
        pytest.skip("mcp 2.x's Client (tests/test_mcp_v1.py drives 1.x's streamablehttp_client)")
    from mcp import Client

    with serve() as upstream:
        tw = await start_tripwire(mcp={"files": {"url": upstream}})
        async with Client(f"{tw.url}/agents/my-agent/mcp/files") as client:
            result = await client.call_tool("add", {"a": 2, "b": 3})
        assert result.structured_content == {"result": 5}
        await tw.flush()
    (call,) = [e for e in runs_by_agent(tw)["my-agent"]["events"] if e["event_type"] == "TOOL_CALL"]
    assert call["name"] == "add"
