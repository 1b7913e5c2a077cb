"""`POST /api/runs/{run_id}/resume` (SPEC §5.5a, issue 23 item 4) through the running proxy with the
real `openai` SDK: a session ended by a limit, a loop `terminate` or the kill switch goes on in a new
run naming `resumed_from`, its spend and counts carried over; explicit and automatic sessions."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest

from proxy.replay import replay_dir
from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.schema import assert_run_valid

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]


def client(tw: Running, **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=tw.url + "/v1",
        api_key=AGENT_KEY,
        default_headers={"X-Tripwire-Agent": "bot", **headers},
        max_retries=0,
    )


async def api(tw: Running, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.request(method, tw.admin_url + path, json=body) as resp:
            return resp.status, await resp.json(content_type=None)


async def resume(tw: Running, run_id: str, body: Any = None) -> tuple[int, Any]:
    return await api(tw, "POST", f"/api/runs/{run_id}/resume", body)


def start_payload(tw: Running, run_id: str) -> dict[str, Any]:
    _, events = assert_run_valid(tw.data_dir, run_id)
    assert events[0]["event_type"] == "RUN_START"
    payload: dict[str, Any] = events[0]["payload"]
    return payload


async def test_a_limit_ended_session_resumes_with_a_raise_in_a_linked_run(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="ok", prompt_tokens=10, completion_tokens=5)
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_llm_calls": 2}})
    llm = client(tw, **{"X-Tripwire-Session": "s1"})
    for _ in range(2):
        await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    with pytest.raises(openai.RateLimitError):
        await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    await tw.flush()
    (old,) = tw.run_ids()

    # no raise: the limit that ended it would refuse the next call at once
    status, body = await resume(tw, old)
    assert status == 400 and "max_llm_calls" in body["detail"] and "raise" in body["detail"]
    status, body = await resume(tw, old, {"raise": {"max_llm_calls": 2}})  # not above the 2 made
    assert status == 400 and "not above" in body["detail"]
    status, body = await resume(tw, old, {"raise": {"max_llm_calls": 4}})
    assert status == 200, body
    new = body["run_id"]
    assert body["resumed_from"] == old and new != old
    # the agent's next calls are served in the new run, up to the raised limit (counts carried over)
    for _ in range(2):
        answer = await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
        assert answer.choices[0].message.content == "ok"
    with pytest.raises(openai.RateLimitError):
        await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert len(fake.calls(CHAT)) == 4
    await tw.flush()
    assert sorted(tw.run_ids()) == sorted([old, new])
    started = start_payload(tw, new)
    assert started["resumed_from"] == old
    assert started["carried_over"]["llm_calls"] == 2
    _, events = assert_run_valid(tw.data_dir, new)
    kinds = [e["event_type"] for e in events]
    assert kinds.count("LLM_CALL") == 2 and kinds[-2:] == ["ERROR", "RUN_END"]
    raised = [e for e in events if e["event_type"] == "STATE_UPDATE" and e["name"] == "limits_raised"]
    assert raised[0]["payload"]["raised"] == {"max_llm_calls": 4}
    assert events[-2]["payload"]["threshold"] == 4
    assert tw.tripwire_json(old)["resumed_as"] == new
    assert tw.tripwire_json(new)["resumed_from"] == old
    assert tw.run_json(new)["run_name"] == tw.run_json(old)["run_name"] == "hello"
    # replay of the new run starts from the counts its RUN_START carried over: decides as live
    replayed = replay_dir(tw.data_dir / "runs" / new)
    assert [(d.call_index, d.guard, d.action) for d in replayed.decisions] == [
        (3, "max_llm_calls", "terminate")
    ]
    assert replayed.live[3] == [["max_llm_calls", None, "terminate"]]
    # the new run, ended by the raised limit, resumes again; the old one is no longer held
    status, body = await resume(tw, old, {"raise": {"max_llm_calls": 9}})
    assert status == 409


async def test_a_killed_automatic_session_resumes_by_its_announced_episode(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    llm = client(tw)
    # the Codex-style header announces the episode: an automatic session
    extra = {"extra_headers": {"session_id": "episode-7"}}
    await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO, **extra)  # type: ignore[arg-type]
    await tw.flush()
    (old,) = tw.run_ids()
    status, _ = await api(tw, "POST", f"/api/runs/{old}/terminate")
    assert status == 200
    with pytest.raises(openai.RateLimitError):
        await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO, **extra)  # type: ignore[arg-type]
    status, body = await resume(tw, old)
    assert status == 200, body
    new = body["run_id"]
    await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO, **extra)  # type: ignore[arg-type]
    assert len(fake.calls(CHAT)) == 2
    await tw.flush()
    assert sorted(tw.run_ids()) == sorted([old, new])
    assert start_payload(tw, new)["resumed_from"] == old
    _, events = assert_run_valid(tw.data_dir, new)
    assert [e["event_type"] for e in events] == ["RUN_START", "LLM_CALL"]


async def test_resume_answers_404_409_and_400(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    llm = client(tw, **{"X-Tripwire-Session": "s1"})
    await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    await tw.flush()
    (run,) = tw.run_ids()
    assert (await resume(tw, "not-a-run"))[0] == 400
    assert (await resume(tw, "0b5c4a36-4c7e-4b8e-9b0e-3b4e5f6a7b8c"))[0] == 404
    status, body = await resume(tw, run)
    assert status == 409 and "running" in body["detail"]  # a live run
    status, body = await api(tw, "POST", f"/api/runs/{run}/terminate")
    assert status == 200
    for bad in (
        {"raise": {"max_cost_usd": 1}},
        {"raise": {"temperature": 1}},
        {"raise": []},
        {"other": 1},
        [1],
    ):
        status, body = await resume(tw, run, bad)
        assert status == 400, bad
        assert body["detail"]
    # a run that ended normally has nothing to resume
    tw.engine.policy.end_all("shutdown")
    llm2 = client(tw, **{"X-Tripwire-Session": "s2"})
    await llm2.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    await tw.flush()
    (ended,) = [r for r in tw.run_ids() if r != run]
    tw.engine.policy.end_all("shutdown")
    status, body = await resume(tw, ended)
    assert status == 409 and "ended normally" in body["detail"]


async def test_a_raise_in_a_live_session_is_replayed_where_it_stands(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_llm_calls": 1}})
    llm = client(tw, **{"X-Tripwire-Session": "s1"})
    await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    await tw.flush()
    (run,) = tw.run_ids()
    session = tw.engine.sessions.by_run_id(run)
    assert session is not None
    await tw.engine.policy.raise_limits(session, {"max_llm_calls": 2})
    await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    with pytest.raises(openai.RateLimitError):
        await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    await tw.flush()
    replayed = replay_dir(tw.data_dir / "runs" / run)
    assert [(d.call_index, d.guard, d.action) for d in replayed.decisions] == [
        (3, "max_llm_calls", "terminate")
    ]


async def test_a_limit_ended_automatic_session_found_by_lineage_resumes(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """No session header, nothing announced: the conversation's next request finds the new run by
    the answer its history carries."""
    fake, url = fake_upstream
    fake.default = Reply(text="step done", prompt_tokens=10, completion_tokens=5)
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_llm_calls": 1}})
    llm = client(tw)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "plan a trip"}]
    answer = await llm.chat.completions.create(model="gpt-4o-mini", messages=messages)
    messages += [
        answer.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "and then?"},
    ]
    with pytest.raises(openai.RateLimitError):
        await llm.chat.completions.create(model="gpt-4o-mini", messages=messages)
    await tw.flush()
    (old,) = tw.run_ids()
    status, body = await resume(tw, old, {"raise": {"max_llm_calls": 3}})
    assert status == 200, body
    new = body["run_id"]
    answer = await llm.chat.completions.create(model="gpt-4o-mini", messages=messages)
    messages += [answer.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    await llm.chat.completions.create(model="gpt-4o-mini", messages=messages)
    # another conversation of the agent is another run, not the resumed one
    await llm.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "other"}])
    await tw.flush()
    assert len(tw.run_ids()) == 3
    _, events = assert_run_valid(tw.data_dir, new)
    assert [e["event_type"] for e in events].count("LLM_CALL") == 2
    assert start_payload(tw, new)["resumed_from"] == old
