"""Issue 13 acceptance: three Tripwire replicas (in-process apps on loopback) sharing one real Redis,
an agent (the real openai SDK) whose calls are spread round-robin across them.

Limits, budgets, loops and circuits hold as in one process; 50 concurrent calls of one session
never pass a limit of 20; with Redis stopped mid-run each failure policy holds, and the replicas
recover when it is back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest

from tests.conftest import AGENT_KEY, Running, StartTripwire, serve_fake
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.redis_server import RedisServer

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]
WAIT_S = 30.0


def client(
    tw: Running, session: str | None = "s1", agent: str = "researcher", **kw: Any
) -> openai.AsyncOpenAI:
    headers = {"X-Tripwire-Agent": agent}
    if session is not None:
        headers["X-Tripwire-Session"] = session
    # kept until the test ends and closed then (tests/conftest.py: SDK clients live until their test ends)
    return openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=headers, **kw)


async def settle_all(replicas: list[Running]) -> None:
    """Every replica has recorded its calls and appended their settles (an agent's think time)."""
    for r in replicas:
        await r.flush()
        assert r.engine.shared is not None
        await r.engine.shared.guards.flush()


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not await condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def start_replicas(
    start: StartTripwire, url: str, redis_url: str, n: int = 3, **overrides: Any
) -> list[Running]:
    return [
        await start(
            upstream={"url": url}, state={"url": redis_url, **overrides.pop("state", {})}, **overrides
        )
        for _ in range(n)
    ]


def expected_outage(caplog: pytest.LogCaptureFixture) -> None:
    """The outage was logged loudly (once per replica), and that is all that was logged as an error."""
    errors = [r for r in caplog.records if r.name.startswith("tripwire") and r.levelname == "ERROR"]
    assert errors and all(r.getMessage().startswith("state.unavailable") for r in errors)
    caplog.clear()  # expected: not a pipeline failure (tests/pipeline_errors.py)


async def health(tw: Running) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(tw.admin_url + "/healthz") as resp:
        assert resp.status == 200
        body: dict[str, Any] = await resp.json()
        return body


async def test_max_llm_calls_ten_lets_exactly_ten_through_in_total(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str
) -> None:
    fake, url = fake_upstream
    replicas = await start_replicas(start_tripwire, url, redis_url, guards={"limits": {"max_llm_calls": 10}})
    clients = [client(r, max_retries=0) for r in replicas]
    outcomes: list[int] = []
    for i in range(15):
        try:
            await clients[i % 3].chat.completions.create(model="gpt-4o", messages=HELLO)
            outcomes.append(200)
        except openai.RateLimitError as e:
            outcomes.append(e.status_code)
            assert e.response.headers["X-Tripwire-Guard"] in ("max_llm_calls", "session_terminated")
    assert outcomes == [200] * 10 + [429] * 5
    assert len(fake.calls(CHAT)) == 10
    await settle_all(replicas)
    # one session, one run id, whichever replica served each call (each keeps its own files)
    run_ids = {tuple(r.run_ids()) for r in replicas}
    assert len(run_ids) == 1 and len(next(iter(run_ids))) == 1
    served = sum(len([e for e in r.events() if e["event_type"] == "LLM_CALL"]) for r in replicas)
    assert served == 10
    call_seqs = sorted(
        e["payload"]["call_seq"] for r in replicas for e in r.events() if e["event_type"] == "LLM_CALL"
    )
    assert call_seqs == list(range(1, 11))  # the run's arrival numbers, across replicas


async def budget_trip(replicas: list[Running]) -> int:
    """The number of answers before the budget refuses (each call settles before the next)."""
    clients = [client(r, max_retries=0) for r in replicas]
    answers = 0
    for i in range(20):
        try:
            await clients[i % len(clients)].chat.completions.create(model="gpt-4o", messages=HELLO)
        except openai.RateLimitError as e:
            assert e.response.headers["X-Tripwire-Guard"] == "max_cost_usd"
            return answers
        answers += 1
        if replicas[0].engine.shared is not None:
            await settle_all(replicas)
        else:
            await replicas[0].flush()
    raise AssertionError("the budget never tripped")


async def test_a_budget_trips_at_the_same_call_as_one_process(
    start_tripwire: StartTripwire, redis_url: str
) -> None:
    # gpt-4o: $2.50 / 1M input tokens: each answer costs $0.25
    reply = Reply(text="expensive", prompt_tokens=100_000, completion_tokens=0)
    guards = {"budget": {"max_cost_usd": 0.9}}
    async with serve_fake(reply) as (_, url):
        alone = await start_tripwire(upstream={"url": url}, guards=guards)
        one = await budget_trip([alone])
        replicas = await start_replicas(start_tripwire, url, redis_url, guards=guards)
        shared = await budget_trip(replicas)
    assert one == shared == 4


def looping_replies(n: int) -> list[Reply]:
    return [Reply(tool_calls=[(f"call_{i}", "read_file", {"path": "notes.txt"})]) for i in range(n)]


async def loop_caught_at(replicas: list[Running], fake: FakeUpstream) -> int:
    """An agent loop that reads the same file again and again; the call the guard blocks."""
    fake.replies = looping_replies(30)
    clients = [client(r, session=f"loop-{len(replicas)}") for r in replicas]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "summarise notes.txt"}]
    for i in range(30):
        raw = await clients[i % len(clients)].chat.completions.with_raw_response.create(
            model="gpt-4o", messages=messages
        )
        if raw.headers.get("X-Tripwire-Guard"):
            raw.parse()  # read the answer: the connection goes back to the pool
            return i + 1
        answer = raw.parse().choices[0].message
        messages.append(answer.model_dump(exclude_none=True))
        for tc in answer.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": "the same notes"})
        if replicas[0].engine.shared is not None:
            await settle_all(replicas)
    raise AssertionError("the loop was never caught")


async def test_a_loop_is_caught_at_the_same_call(start_tripwire: StartTripwire, redis_url: str) -> None:
    guards = {"loop_detection": {"action": "block"}}
    async with serve_fake(Reply(text="done")) as (fake, url):
        alone = await start_tripwire(upstream={"url": url}, guards=guards)
        one = await loop_caught_at([alone], fake)
        replicas = await start_replicas(start_tripwire, url, redis_url, guards=guards)
        shared = await loop_caught_at(replicas, fake)
    assert one == shared
    # the function-calling TOOL_CALLs were recorded once each, by whichever replica got the result
    await settle_all(replicas)
    tool_ids = [
        e["payload"]["tool_call_id"] for r in replicas for e in r.events() if e["event_type"] == "TOOL_CALL"
    ]
    assert len(tool_ids) == len(set(tool_ids)) == shared - 1


async def test_a_circuit_opened_via_one_replica_is_open_on_all(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(status=500)
    breaker = {"open_after_failures": 2, "cooldown_seconds": 60}
    replicas = await start_replicas(start_tripwire, url, redis_url, guards={"circuit_breaker": breaker})
    first = client(replicas[0], max_retries=0)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            await first.chat.completions.create(model="gpt-4o", messages=HELLO)
    await settle_all(replicas)
    for r in replicas:
        with pytest.raises(openai.RateLimitError) as refused:
            await client(r, session=f"other-{id(r)}", max_retries=0).chat.completions.create(
                model="gpt-4o", messages=HELLO
            )
        assert refused.value.response.headers["X-Tripwire-Guard"] == "circuit_breaker"
        assert int(refused.value.response.headers["Retry-After"]) > 0
    assert len(fake.calls(CHAT)) == 2


async def test_fifty_concurrent_calls_over_three_replicas_never_exceed_twenty(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str
) -> None:
    fake, url = fake_upstream
    replicas = await start_replicas(start_tripwire, url, redis_url, guards={"limits": {"max_llm_calls": 20}})
    clients = [client(r, max_retries=0) for r in replicas]

    async def one(i: int) -> int:
        try:
            await clients[i % 3].chat.completions.create(model="gpt-4o", messages=HELLO)
            return 200
        except openai.APIStatusError as e:
            return e.status_code

    statuses = await asyncio.gather(*(one(i) for i in range(50)))
    assert statuses.count(200) == 20
    assert set(statuses) == {200, 429}
    assert len(fake.calls(CHAT)) == 20


async def test_redis_stopped_mid_run_fail_open_goes_on_and_recovers(
    own_redis: RedisServer,  # first: it outlives the replicas (they close before it stops)
    start_tripwire: StartTripwire,
    fake_upstream: tuple[FakeUpstream, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, url = fake_upstream
    replicas = await start_replicas(
        start_tripwire, url, own_redis.url, n=2, guards={"limits": {"max_llm_calls": 8}}
    )
    for r in replicas:
        assert r.engine.shared is not None
        r.engine.shared.link.probe_interval_s = 0.1
    clients = [client(r, max_retries=0) for r in replicas]
    for i in range(3):
        await clients[i % 2].chat.completions.create(model="gpt-4o", messages=HELLO)
        await settle_all(replicas)
    await clients[0].chat.completions.create(model="gpt-4o", messages=HELLO)  # replica 0 has seen all 4
    await settle_all(replicas)
    own_redis.stop()
    # fail_open: calls are answered, guarded from the replica's memory; /healthz says so, readiness does not
    for _ in range(2):
        await clients[0].chat.completions.create(model="gpt-4o", messages=HELLO)
    report = await health(replicas[0])
    assert report["state"]["up"] is False and report["state"]["on_unavailable"] == "fail_open"
    async with aiohttp.ClientSession() as s, s.get(replicas[0].admin_url + "/readyz") as resp:
        assert resp.status == 200
    async with aiohttp.ClientSession() as s, s.get(replicas[0].admin_url + "/metrics") as resp:
        assert "tripwire_state_backend_up 0.0" in await resp.text()
    own_redis.start()

    async def back() -> bool:
        return (await health(replicas[0]))["state"]["up"] is True

    await until(back, "replica 0 to see Redis back")
    expected_outage(caplog)
    await settle_all(replicas)
    # what replica 0 served meanwhile counts everywhere: 6 so far, so 2 more and then the limit
    outcomes = []
    for i in range(4):
        try:
            await clients[(i + 1) % 2].chat.completions.create(model="gpt-4o", messages=HELLO)
            outcomes.append(200)
        except openai.RateLimitError:
            outcomes.append(429)
        await settle_all(replicas)
    assert outcomes == [200, 200, 429, 429]
    assert len(fake.calls(CHAT)) == 8


async def test_redis_stopped_mid_run_fail_closed_refuses_and_recovers(
    own_redis: RedisServer,  # first: it outlives the replicas (they close before it stops)
    start_tripwire: StartTripwire,
    fake_upstream: tuple[FakeUpstream, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, url = fake_upstream
    (tw,) = await start_replicas(
        start_tripwire, url, own_redis.url, n=1, state={"on_unavailable": "fail_closed"}
    )
    assert tw.engine.shared is not None
    tw.engine.shared.link.probe_interval_s = 0.1
    llm = client(tw, max_retries=0)
    await llm.chat.completions.create(model="gpt-4o", messages=HELLO)
    await settle_all([tw])
    own_redis.stop()
    with pytest.raises(openai.InternalServerError) as refused:
        await llm.chat.completions.create(model="gpt-4o", messages=HELLO)
    err = refused.value.response
    assert err.status_code == 503
    assert err.headers["X-Tripwire-Guard"] == "state_unavailable"
    assert int(err.headers["Retry-After"]) >= 1
    assert err.json()["error"]["code"] == "state_unavailable"
    # a new session too: its run cannot be resolved
    with pytest.raises(openai.InternalServerError):
        await client(tw, session="new", max_retries=0).chat.completions.create(model="gpt-4o", messages=HELLO)
    assert len(fake.calls(CHAT)) == 1
    own_redis.start()

    async def back() -> bool:
        return (await health(tw))["state"]["up"] is True

    await until(back, "the replica to see Redis back")
    expected_outage(caplog)
    await llm.chat.completions.create(model="gpt-4o", messages=HELLO)
    assert len(fake.calls(CHAT)) == 2


async def api(tw: Running, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.request(method, tw.admin_url + path, json=body) as resp:
        return resp.status, await resp.json(content_type=None)


async def test_a_config_put_on_one_replica_applies_on_all_at_the_next_call(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str
) -> None:
    fake, url = fake_upstream
    replicas = await start_replicas(start_tripwire, url, redis_url)
    clients = [client(r, max_retries=0) for r in replicas]
    await clients[1].chat.completions.create(model="gpt-4o", messages=HELLO)
    status, _ = await api(
        replicas[0], "PUT", "/api/agents/researcher/prevention-config", {"limits": {"max_llm_calls": 2}}
    )
    assert status == 200
    await clients[2].chat.completions.create(model="gpt-4o", messages=HELLO)  # the 2nd: allowed
    with pytest.raises(openai.RateLimitError) as refused:
        await clients[1].chat.completions.create(model="gpt-4o", messages=HELLO)
    assert refused.value.response.headers["X-Tripwire-Guard"] == "max_llm_calls"

    async def shown() -> bool:  # the admin API of the other replicas shows what was PUT
        status, body = await api(replicas[2], "GET", "/api/agents/researcher/prevention-config")
        return status == 200 and body["is_agent_override"] is True and body["limits"]["max_llm_calls"] == 2

    await until(shown, "replica 2's admin API to show the PUT")


async def test_the_kill_switch_on_one_replica_refuses_the_session_on_all(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str
) -> None:
    fake, url = fake_upstream
    replicas = await start_replicas(start_tripwire, url, redis_url)
    clients = [client(r, max_retries=0) for r in replicas]
    for c in clients[:2]:
        await c.chat.completions.create(model="gpt-4o", messages=HELLO)
    await settle_all(replicas)
    (run_id,) = replicas[0].run_ids()
    status, _ = await api(replicas[0], "POST", f"/api/runs/{run_id}/terminate")
    assert status == 200
    await settle_all(replicas)
    for c in clients[1:]:
        with pytest.raises(openai.RateLimitError) as refused:
            await c.chat.completions.create(model="gpt-4o", messages=HELLO)
        assert refused.value.response.headers["X-Tripwire-Guard"] in ("kill_switch", "session_terminated")
    assert len(fake.calls(CHAT)) == 2
    await settle_all(replicas)
    # replica 1 served the run too: its copy of the run ended as well
    assert replicas[1].run_json(run_id)["status"] == "error"


async def test_an_automatic_session_is_one_run_across_replicas(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str
) -> None:
    """No session header: the conversation's lineage names the run, whichever replica sees it."""
    fake, url = fake_upstream
    replicas = await start_replicas(start_tripwire, url, redis_url)
    clients = [client(r, session=None, agent="auto") for r in replicas]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "plan a trip"}]
    for i in range(6):
        answer = await clients[i % 3].chat.completions.create(model="gpt-4o", messages=messages)
        messages += [
            answer.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": f"and {i}?"},
        ]
        await settle_all(replicas)
    runs = {tuple(r.run_ids()) for r in replicas}
    assert len(runs) == 1 and len(next(iter(runs))) == 1
    # another conversation of the same agent is another run
    await clients[1].chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "other"}])
    await settle_all(replicas)
    assert len(set(replicas[1].run_ids())) == 2


async def test_an_evaluation_batch_over_three_replicas_is_one_run_per_conversation(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str
) -> None:
    """SPEC §3: six conversations that start with the same words are six runs, each conversation's
    second call (served by another replica than its first) in its own run."""
    fake, url = fake_upstream
    fake.replies = [Reply(text=f"answer number {i}") for i in range(6)]
    replicas = await start_replicas(start_tripwire, url, redis_url)
    clients = [client(r, session=None, agent="batch") for r in replicas]
    histories = [[{"role": "user", "content": "solve task 17"}] for _ in range(6)]
    for i, messages in enumerate(histories):
        answer = await clients[i % 3].chat.completions.create(model="gpt-4o", messages=messages)
        messages += [
            answer.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": f"and check it (conversation {i})"},
        ]
    for i, messages in enumerate(histories):
        await clients[(i + 1) % 3].chat.completions.create(model="gpt-4o", messages=messages)
    await settle_all(replicas)
    calls: dict[str, list[str]] = {}
    for r in replicas:
        for run_id in r.run_ids():
            for e in r.events(run_id):
                if e["event_type"] == "LLM_CALL":
                    calls.setdefault(run_id, []).append(json.dumps(e["payload"]["prompt"]))
    assert len(calls) == 6 and all(len(c) == 2 for c in calls.values())
    # each run's second call is its own conversation's
    marked = sorted(
        next(f"conversation {i})" for i in range(6) if f"conversation {i})" in "".join(c))
        for c in calls.values()
    )
    assert marked == [f"conversation {i})" for i in range(6)]


def test_the_state_flag_and_its_url_are_checked() -> None:
    from proxy.cli import build_parser, check_startup, cli_overrides
    from proxy.settings import Settings

    args = build_parser().parse_args(["serve", "--state", "redis://127.0.0.1:6379/0"])
    settings = Settings.model_validate(cli_overrides(args))
    assert settings.state.url == "redis://127.0.0.1:6379/0" and settings.state.on_unavailable == "fail_open"
    check_startup(settings)
    with pytest.raises(ValueError, match="redis://"):
        Settings.model_validate({"state": {"url": "http://redis:6379"}})
    with pytest.raises(ValueError):
        Settings.model_validate({"state": {"url": "redis://x", "on_unavailable": "maybe"}})
