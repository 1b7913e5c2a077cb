"""Loop guards through the running proxy with the real `openai` SDK (issue 4, acceptance 1 and 6).

The fake model always asks for the same tool with the same arguments; the agent loop below runs
the tool itself and sends the result back, as a function-calling agent does.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream, Reply, webhook_receiver
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.responses_chain_scenario import GUARDS, play_block_and_continuation, script
from tests.schema import assert_run_valid

SESSION = {"X-Tripwire-Session": "loop-1", "X-Tripwire-Agent": "looper"}
CHAT = "/v1/chat/completions"


def same_tool_forever(fake: FakeUpstream, n: int = 30) -> None:
    fake.replies = [
        Reply(tool_calls=[(f"call_{i}", "get_weather", {"city": "Paris", "unit": 1.0})]) for i in range(n)
    ]


async def agent_loop(
    base: str, *, max_steps: int = 20, stream: bool = False, max_retries: int = 2
) -> tuple[list[dict[str, Any]], Any]:
    """Run the SDK agent until the model stops asking for tools; returns (messages, last answer)."""
    client = openai.AsyncOpenAI(
        base_url=base + "/v1", api_key=AGENT_KEY, default_headers=SESSION, max_retries=max_retries
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "weather in Paris?"}]
    answer: Any = None
    for _ in range(max_steps):
        if stream:
            async with client.chat.completions.stream(model="gpt-4o-mini", messages=messages) as s:
                async for _event in s:
                    pass
                answer = await s.get_final_completion()
        else:
            answer = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        msg = answer.choices[0].message
        if not msg.tool_calls:
            messages.append({"role": "assistant", "content": msg.content})
            return messages, answer
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": "sunny, 21C"})
    raise AssertionError("the agent loop never ended")


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["event_type"] for e in events]


def only(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event_type"] == kind]


def loop_warnings(events: list[dict[str, Any]], *kinds: str) -> list[dict[str, Any]]:
    """LOOP_WARNINGs of these kinds (AgentDbg's cycle pattern also warns on any agent loop)."""
    return [e for e in only(events, "LOOP_WARNING") if e["payload"]["kind"] in kinds]


async def one_run(tw: Running) -> tuple[str, list[dict[str, Any]]]:
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    return run_id, events


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_repetition_block_ends_the_sdk_loop_normally(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], stream: bool
) -> None:
    fake, url = fake_upstream
    same_tool_forever(fake)
    guards = {"loop_detection": {"action": "block", "threshold": 5, "max_repeated_tool_steps": 10}}
    tw = await start_tripwire(upstream={"url": url}, guards=guards)
    messages, answer = await agent_loop(tw.url, stream=stream)

    # requests 1..5 went upstream; the 6th holds the 5th identical call in its history
    assert len(fake.calls(CHAT)) == 5
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content.startswith("[tripwire] blocked:")
    assert "get_weather was called 5 times in a row" in choice.message.content
    assert answer.usage is None or answer.usage.total_tokens == 0

    run_id, events = await one_run(tw)
    assert types(events).count("LLM_CALL") == 5
    # the model's own identical call is also polled without progress and counted per tool (warn)
    (warning,) = loop_warnings(events, "repetition", "identical_step")
    assert warning["payload"]["kind"] == "repetition" and warning["payload"]["action"] == "block"
    assert warning["payload"]["repetitions"] == 5
    assert "get_weather" in warning["payload"]["pattern"]
    (error,) = only(events, "ERROR")
    assert error["payload"]["guardrail"] == "loop_detection"
    assert error["payload"]["threshold"] == 5 and error["payload"]["actual"] == 5
    # the 5th call's TOOL_CALL (its result came with the blocked request) is written before the
    # decision it caused; the session goes on: no RUN_END
    assert types(events)[-1] == "ERROR"
    last_tool = max(i for i, t in enumerate(types(events)) if t == "TOOL_CALL")
    assert last_tool < events.index(warning)
    assert len(only(events, "TOOL_CALL")) == 5
    assert "loop_detected" in tw.tripwire_json(run_id)["health_tags"]
    assert tw.run_json(run_id)["status"] == "running"


async def test_blocked_answer_carries_the_guard_header(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    same_tool_forever(fake)
    guards = {"loop_detection": {"action": "block", "threshold": 3, "max_repeated_tool_steps": 10}}
    tw = await start_tripwire(upstream={"url": url}, guards=guards)
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for i in range(3):
        history.append(
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": 1}'},
                    }
                ],
            }
        )
        history.append({"role": "tool", "tool_call_id": f"c{i}", "content": "sunny"})
    raw = await client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=history)
    assert raw.headers["X-Tripwire-Guard"] == "loop_detection"
    assert raw.parse().choices[0].finish_reason == "stop"
    assert fake.calls(CHAT) == []
    # the same history again: the same answer, no second LOOP_WARNING
    again = await client.chat.completions.create(model="gpt-4o-mini", messages=history)
    assert again.choices[0].message.content.startswith("[tripwire] blocked:")
    _, events = await one_run(tw)
    assert len(only(events, "LOOP_WARNING")) == 1
    assert len(only(events, "ERROR")) == 2


async def test_identical_step_blocks_at_its_own_count(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    same_tool_forever(fake)
    tw = await start_tripwire(upstream={"url": url}, guards={"loop_detection": {"action": "block"}})
    _, answer = await agent_loop(tw.url)
    # max_repeated_tool_steps 3: the 4th identical step is the one answered (before repetition's 5)
    assert len(fake.calls(CHAT)) == 4
    assert answer.choices[0].message.content.startswith("[tripwire] blocked:")
    _, events = await one_run(tw)
    (warning,) = loop_warnings(events, "repetition", "identical_step")
    assert warning["payload"]["kind"] == "identical_step"
    # evidence names events (the TOOL_CALLs of the repeated steps), never tool_call_ids
    tool_calls = [e["event_id"] for e in only(events, "TOOL_CALL")]
    assert warning["payload"]["evidence_event_ids"] == tool_calls[-4:]
    (error,) = only(events, "ERROR")
    assert error["payload"]["threshold"] == 3


async def test_defaults_warn_at_identical_step_and_forward(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    same_tool_forever(fake, n=5)
    fake.default = Reply(text="it is sunny")
    tw = await start_tripwire(upstream={"url": url})
    _, answer = await agent_loop(tw.url)
    assert answer.choices[0].message.content == "it is sunny"
    assert len(fake.calls(CHAT)) == 6  # warn lets every call through
    run_id, events = await one_run(tw)
    (step,) = loop_warnings(events, "identical_step")
    assert step["payload"]["action"] == "warn" and step["payload"]["threshold"] == 3
    # written before the LLM_CALL of the request whose history held the 4th identical step
    llm_indices = [i for i, e in enumerate(events) if e["event_type"] == "LLM_CALL"]
    assert llm_indices[3] < events.index(step) < llm_indices[4]
    assert only(events, "ERROR") == []
    assert "loop_detected" in tw.tripwire_json(run_id)["health_tags"]


async def test_terminate_is_a_429_the_sdk_does_not_retry(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    same_tool_forever(fake)
    guards = {"loop_detection": {"action": "terminate", "threshold": 5, "max_repeated_tool_steps": 10}}
    tw = await start_tripwire(upstream={"url": url}, guards=guards)
    with pytest.raises(openai.RateLimitError) as caught:
        await agent_loop(tw.url)  # the SDK's default max_retries=2
    assert len(fake.calls(CHAT)) == 5
    err = caught.value
    assert err.response.headers["x-should-retry"] == "false"
    assert err.response.headers["X-Tripwire-Guard"] == "loop_detection"
    body = err.response.json()["error"]
    assert body["type"] == "tripwire_guard" and body["code"] == "loop_detection"
    assert body["guardrail"] == "loop_detection" and body["threshold"] == 5 and body["actual"] == 5

    # every later call of the session is refused, and never reaches the upstream
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}])
    assert len(fake.calls(CHAT)) == 5

    run_id, events = await one_run(tw)
    assert types(events)[-3:] == ["LOOP_WARNING", "ERROR", "RUN_END"]
    assert events[-1]["payload"]["status"] == "error"
    run = tw.run_json(run_id)
    assert run["status"] == "error"
    tags = tw.tripwire_json(run_id)["health_tags"]
    assert "terminated" in tags and "loop_detected" in tags


async def test_hidden_guard_details_stay_in_the_trace(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    same_tool_forever(fake)
    guards = {"loop_detection": {"action": "terminate", "threshold": 3, "max_repeated_tool_steps": 10}}
    tw = await start_tripwire(upstream={"url": url}, guards=guards, expose_guard_details=False)
    with pytest.raises(openai.RateLimitError) as caught:
        await agent_loop(tw.url, max_retries=0)
    body = caught.value.response.json()["error"]
    assert body["guardrail"] == "loop_detection"
    assert "threshold" not in body and "actual" not in body
    assert "3" not in body["message"]
    _, events = await one_run(tw)
    (error,) = only(events, "ERROR")
    assert error["payload"]["threshold"] == 3 and error["payload"]["actual"] == 3


async def test_kill_switch_refuses_the_next_llm_call(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    import aiohttp

    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    await client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    await tw.flush()
    (run_id,) = tw.run_ids()
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer hunter2"}) as http:
        # the fixture's engine has no token configured; the header does no harm
        async with http.post(f"{tw.admin_url}/api/runs/{run_id}/terminate") as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["terminated"] is True
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert len(fake.calls(CHAT)) == 1
    _, events = await one_run(tw)
    assert types(events)[-2:] == ["ERROR", "RUN_END"]
    assert events[-2]["payload"]["guardrail"] == "kill_switch"
    assert events[-1]["payload"]["status"] == "error"
    assert "terminated" in tw.tripwire_json(run_id)["health_tags"]
    assert json.loads((tw.data_dir / "runs" / run_id / "run.json").read_text())["status"] == "error"


async def test_stop_on_loop_ends_the_session_after_the_event_that_caused_it(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """AgentDbg's cycle with stop_on_loop: the triggering event, then LOOP_WARNING, ERROR, RUN_END."""
    fake, url = fake_upstream
    same_tool_forever(fake)
    loop = {"stop_on_loop": True, "threshold": 50, "max_repeated_tool_steps": 50, "no_progress_halt": 50}
    loop |= {"no_progress_warn": 50, "idempotent": [50, 50, 50]}
    tw = await start_tripwire(upstream={"url": url}, guards={"loop_detection": loop})
    with pytest.raises(openai.RateLimitError) as caught:
        await agent_loop(tw.url)
    assert caught.value.response.json()["error"]["guardrail"] == "stop_on_loop"
    run_id, events = await one_run(tw)
    kinds = types(events)
    assert kinds[-3:] == ["LOOP_WARNING", "ERROR", "RUN_END"]
    assert kinds[-4] in ("LLM_CALL", "TOOL_CALL")  # the event that completed the cycle
    assert events[-3]["payload"]["kind"] == "cycle" and events[-3]["payload"]["action"] == "terminate"
    assert events[-2]["payload"]["guardrail"] == "stop_on_loop"
    assert events[-1]["payload"]["status"] == "error"
    assert tw.run_json(run_id)["status"] == "error"
    assert {"loop_detected", "terminated"} <= set(tw.tripwire_json(run_id)["health_tags"])
    # nothing after RUN_END, even though the call that caused it was still being recorded
    upstream_hits = len(fake.calls(CHAT))
    assert upstream_hits == len(only(events, "LLM_CALL"))


async def test_alert_webhook_gets_a_post_when_a_guard_fires(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    import asyncio

    async with webhook_receiver() as webhook:
        fake, url = fake_upstream
        tw = await start_tripwire(
            upstream={"url": url},
            guards={"limits": {"max_llm_calls": 1}},
            alert_webhook=webhook.url,
        )
        client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
        await client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "a"}])
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "b"}]
            )
        await asyncio.wait_for(webhook.arrived.wait(), 5)
    (alert,) = webhook.got
    assert alert["guardrail"] == "max_llm_calls" and alert["action"] == "terminate"
    assert alert["agent"] == "looper" and alert["session_id"] == "loop-1"
    assert alert["threshold"] == 1 and alert["actual"] == 2


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_responses_chain_block_and_continuation_of_the_synthetic_id(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], stream: bool
) -> None:
    """A Responses agent chaining with previous_response_id: the chain's history is judged, the
    block gets a `resp_tripwire_` id, and continuing it goes to the real parent."""
    fake, url = fake_upstream
    script(fake)
    tw = await start_tripwire(upstream={"url": url}, guards=GUARDS)
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    await play_block_and_continuation(fake, lambda: client, stream)
    _, events = await one_run(tw)
    assert len(loop_warnings(events, "repetition")) == 1
    assert len(only(events, "ERROR")) == 1


async def test_a_new_user_message_after_a_block_is_answered(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    same_tool_forever(fake, n=5)
    fake.default = Reply(text="Sorry, the weather service keeps answering the same thing.")
    guards = {"loop_detection": {"action": "block", "threshold": 5, "max_repeated_tool_steps": 10}}
    tw = await start_tripwire(upstream={"url": url}, guards=guards)
    messages, answer = await agent_loop(tw.url)
    assert answer.choices[0].message.content.startswith("[tripwire] blocked:")
    messages.append({"role": "user", "content": "ok, just tell me what you know"})
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    after = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
    assert after.choices[0].message.content.startswith("Sorry")
    assert len(fake.calls(CHAT)) == 6


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_anthropic_agent_is_blocked_with_end_turn(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], stream: bool
) -> None:
    """Anthropic sends tool results as user messages: they do not start a new turn, so the loop
    is seen, and the blocked answer ends the SDK's loop with stop_reason end_turn."""
    import anthropic

    fake, url = fake_upstream
    fake.replies = [Reply(tool_calls=[(f"toolu_{i}", "get_weather", {"city": "Paris"})]) for i in range(20)]
    guards = {"loop_detection": {"action": "block", "threshold": 4, "max_repeated_tool_steps": 10}}
    tw = await start_tripwire(llm={"anthropic": {"url": url}}, guards=guards)
    client = anthropic.AsyncAnthropic(
        base_url=tw.url + "/llm/anthropic", api_key=AGENT_KEY, default_headers=SESSION
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "weather in Paris?"}]
    for _ in range(10):
        if stream:
            async with client.messages.stream(
                model="claude-sonnet-4-5", max_tokens=200, messages=messages
            ) as s:
                msg = await s.get_final_message()
        else:
            msg = await client.messages.create(model="claude-sonnet-4-5", max_tokens=200, messages=messages)
        if msg.stop_reason != "tool_use":
            break
        messages.append({"role": "assistant", "content": [b.model_dump() for b in msg.content]})
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": "sunny"}
            for b in msg.content
            if b.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    assert msg.stop_reason == "end_turn"
    assert msg.content[0].text.startswith("[tripwire] blocked:")
    assert len(fake.calls("/v1/messages")) == 4
    _, events = await one_run(tw)
    (warning,) = loop_warnings(events, "repetition")
    assert warning["payload"]["action"] == "block"


async def test_history_tool_calls_count_toward_max_tool_calls(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(tool_calls=[(f"call_{i}", "get_weather", {"city": f"city {i}"})]) for i in range(5)]
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_tool_calls": 2}})
    with pytest.raises(openai.RateLimitError) as caught:
        await agent_loop(tw.url)
    # requests 1-3 went upstream; the 4th holds the 3rd tool call the agent ran itself
    assert len(fake.calls(CHAT)) == 3
    body = caught.value.response.json()["error"]
    assert (body["guardrail"], body["threshold"], body["actual"]) == ("max_tool_calls", 2, 3)
    _, events = await one_run(tw)
    assert types(events)[-2:] == ["ERROR", "RUN_END"]


async def test_max_time_per_turn_blocks_until_a_new_user_message(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    import asyncio

    fake, url = fake_upstream
    fake.replies = [Reply(tool_calls=[(f"call_{i}", "get_weather", {"city": f"c{i}"})]) for i in range(2)]
    fake.default = Reply(text="new turn answered")
    tw = await start_tripwire(upstream={"url": url}, guards={"loop_detection": {"max_time_per_turn": 0.3}})
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "weather?"}]

    async def step() -> Any:
        answer = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        msg = answer.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": "sunny"})
        return answer

    await step()
    await step()
    await asyncio.sleep(0.4)
    blocked = await step()  # same turn, now older than max_time_per_turn
    assert blocked.choices[0].finish_reason == "stop"
    text = blocked.choices[0].message.content
    assert text.startswith("[tripwire] blocked: this turn has run 0.") and "longer than 0.3s" in text
    assert len(fake.calls(CHAT)) == 2
    messages.append({"role": "user", "content": "and tomorrow?"})
    after = await step()
    assert after.choices[0].message.content == "new turn answered"
    _, events = await one_run(tw)
    (error,) = only(events, "ERROR")
    assert error["payload"]["guardrail"] == "max_time_per_turn" and error["payload"]["action"] == "block"


async def test_stop_on_loop_ends_the_session_once_with_calls_in_flight(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """Calls still in flight when stop_on_loop ended the session are recorded before RUN_END; the
    cycle they extend is the same finding: one LOOP_WARNING, one ERROR, not one per late event."""
    import asyncio

    fake, url = fake_upstream
    fake.default = Reply(text="slow answer", chunk_delay=0.05)
    loop = {"stop_on_loop": True, "repetitions": 3, "stop_on_loop_min_repetitions": 3}
    tw = await start_tripwire(upstream={"url": url}, guards={"loop_detection": loop})
    client = openai.AsyncOpenAI(
        base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION, max_retries=0
    )

    async def one() -> str:
        stream = await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    assert await asyncio.gather(*(one() for _ in range(5))) == ["slow answer"] * 5
    run_id, events = await one_run(tw)
    kinds = types(events)
    assert kinds.count("LLM_CALL") == 5 and kinds[-1] == "RUN_END"
    assert [e["payload"]["kind"] for e in only(events, "LOOP_WARNING")] == ["cycle"]
    (error,) = only(events, "ERROR")
    assert error["payload"]["guardrail"] == "stop_on_loop"
    assert tw.run_json(run_id)["status"] == "error"


async def test_identical_step_over_a_responses_chain(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """A Responses chain sends only the new tool output each time: the chain's steps are judged,
    so the request whose chain holds the 4th identical step is the one answered (SPEC §5.1)."""
    fake, url = fake_upstream
    fake.replies = [Reply(tool_calls=[(f"call_{i}", "get_weather", {"city": "Paris"})]) for i in range(9)]
    tw = await start_tripwire(upstream={"url": url}, guards={"loop_detection": {"action": "block"}})
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    response = await client.responses.create(model="gpt-4o", input="weather in Paris?")
    for _ in range(8):
        (call,) = [item for item in response.output if item.type == "function_call"]
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        response = await client.responses.create(
            model="gpt-4o", previous_response_id=response.id, input=[output]
        )
        if response.id.startswith("resp_tripwire_"):
            break
    assert response.output_text.startswith("[tripwire] blocked:")
    assert len(fake.calls("/v1/responses")) == 4
    _, events = await one_run(tw)
    (warning,) = loop_warnings(events, "repetition", "identical_step")
    assert warning["payload"]["kind"] == "identical_step" and warning["payload"]["actual"] == 3


async def test_a_call_answered_with_the_next_user_message_counts_toward_max_tool_calls(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """The model asked for a tool in an answer Tripwire relayed; the agent sends its result together
    with the next user message (so it sits before the new turn): it is still a tool call of the
    session, as its TOOL_CALL event says, and max_tool_calls counts it."""
    fake, url = fake_upstream
    fake.replies = [Reply(tool_calls=[(f"call_{i}", "get_weather", {"city": f"c{i}"})]) for i in range(2)]
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_tool_calls": 1}})
    client = openai.AsyncOpenAI(
        base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION, max_retries=0
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "weather?"}]
    for question in ("and tomorrow?", "and next week?"):
        answer = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        msg = answer.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": "sunny"})
        messages.append({"role": "user", "content": question})
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
    body = caught.value.response.json()["error"]
    assert (body["guardrail"], body["threshold"], body["actual"]) == ("max_tool_calls", 1, 2)
    assert len(fake.calls(CHAT)) == 2
    _, events = await one_run(tw)
    assert len(only(events, "TOOL_CALL")) == 2
    assert types(events)[-2:] == ["ERROR", "RUN_END"]


async def test_per_tool_escalation_of_function_calling_tools(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """`per_tool_mode: count` (Loop Guard's rule): a mutating tool the agent runs itself, other
    arguments each time: the request whose history holds its 3rd call of the turn is warned
    (forwarded), the one holding the 5th is blocked. The default (progress) leaves it alone."""
    fake, url = fake_upstream
    fake.replies = [Reply(tool_calls=[(f"call_{i}", "write_note", {"text": f"n{i}"})]) for i in range(9)]
    tw = await start_tripwire(upstream={"url": url}, guards={"loop_detection": {"per_tool_mode": "count"}})
    _, answer = await agent_loop(tw.url)
    assert answer.choices[0].message.content.startswith("[tripwire] blocked:")
    assert len(fake.calls(CHAT)) == 5
    _, events = await one_run(tw)
    per_tool = [w["payload"] for w in loop_warnings(events, "per_tool")]
    assert [(w["action"], w["threshold"], w["actual"]) for w in per_tool] == [("warn", 3, 3), ("block", 5, 5)]
    llm_calls = [i for i, e in enumerate(events) if e["event_type"] == "LLM_CALL"]
    warn_at = events.index(loop_warnings(events, "per_tool")[0])
    assert llm_calls[2] < warn_at < llm_calls[3]  # before the 4th request, which held the 3rd call
    (error,) = only(events, "ERROR")
    assert error["payload"]["kind"] == "per_tool"
