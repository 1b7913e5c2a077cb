"""The guard-state backend contract, run against both implementations: in memory, and a real Redis.

The Redis backend's Lua scripts and the in-memory backend must follow the same rules (the memory
backend's breaker IS the pure CircuitBreaker, so the breaker test also checks the Lua port of it).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import orjson
import pytest

from proxy.admission.breaker import twin as breaker
from proxy.admission.breaker.twin import BreakerRequest
from proxy.admission.rate_limit.twin import TWIN as RATES
from proxy.admission.rate_limit.twin import RateRequest
from proxy.guard_log import entries
from proxy.guards.breaker import CircuitBreaker, State
from proxy.guards.config import CircuitBreakerConfig, GuardConfig
from proxy.guards.rate_limit import rules_for
from proxy.state import keys
from proxy.state.base import Append, CheckAsk, PendingCall, StateBackend
from proxy.state.memory import MemoryBackend
from proxy.state.redis_backend import RedisBackend

AGENT = "agent:with:colons"


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[StateBackend]:
    if request.param == "memory":
        yield MemoryBackend()
        return
    url = request.getfixturevalue("redis_url")
    b = RedisBackend(url)
    try:
        yield b
    finally:
        await b.close()


def pending_call(call_id: str, tool: str, sigs: tuple[str, ...] = ()) -> PendingCall:
    return PendingCall(
        entries.event("TOOL_CALL", tool, f"event-{call_id}"),
        sigs,
        orjson.dumps({"tool_call_id": call_id, "name": tool}),
    )


async def test_append_returns_what_others_added_since_in_order(backend: StateBackend) -> None:
    a = await backend.append(
        Append(AGENT, "run-1", [b'{"k":"x","n":1}', b'{"k":"x","n":2}'], since=0, idle_s=60)
    )
    assert [e.seq for e in a.entries] == [1, 2] and a.first_own == 1 and not a.was_live
    b = await backend.append(Append(AGENT, "run-1", [b'{"k":"x","n":3}'], since=1, idle_s=60))
    assert [(e.seq, e.body) for e in b.entries] == [(2, b'{"k":"x","n":2}'), (3, b'{"k":"x","n":3}')]
    assert b.first_own == 3 and b.was_live
    assert b.entries[0].t <= b.entries[1].t
    assert [e.seq for e in await backend.read(AGENT, "run-1", since=0)] == [1, 2, 3]
    assert await backend.read(AGENT, "other-run", since=0) == []


async def test_entries_carry_the_config_revision_in_force(backend: StateBackend) -> None:
    first = await backend.append(Append(AGENT, "run-1", [b"{}"], since=0, idle_s=60))
    assert first.entries[0].config_rev == 0
    rev = await backend.publish_config(b'{"version": 1, "project": null, "agents": {}}')
    assert rev == 1
    second = await backend.append(Append(AGENT, "run-1", [b"{}"], since=1, idle_s=60))
    assert second.entries[0].config_rev == 1
    assert await backend.config_snapshot() == (1, b'{"version": 1, "project": null, "agents": {}}')
    assert (await backend.config_snapshot(1))[1] is not None
    assert await backend.publish_config(b"{}") == 2


async def test_pending_tool_calls_are_taken_once_and_logged_before_the_check(backend: StateBackend) -> None:
    await backend.append(
        Append(AGENT, "run-1", [b'{"k":"set"}'], since=0, idle_s=60, put={"c1": pending_call("c1", "search")})
    )
    got = await backend.append(
        Append(
            AGENT,
            "run-1",
            [b'{"k":"rel","ref":0}', b'{"k":"llm"}'],
            since=1,
            idle_s=60,
            take=["c1", "c9"],
            take_at=2,
        )
    )
    assert [e.body for e in got.entries] == [
        b'{"k":"rel","ref":0}',
        entries.event("TOOL_CALL", "search", "event-c1"),
        b'{"k":"llm"}',
    ]
    assert got.first_own == 2
    assert [(i, orjson.loads(d)["name"]) for i, d in got.taken] == [("c1", "search")]
    again = await backend.append(
        Append(AGENT, "run-1", [b'{"k":"llm"}'], since=4, idle_s=60, take=["c1"], take_at=1)
    )
    assert again.taken == [] and [e.body for e in again.entries] == [b'{"k":"llm"}']


async def test_a_call_recorded_as_mcp_is_not_recorded_again_from_the_history(backend: StateBackend) -> None:
    await backend.append(
        Append(
            AGENT,
            "run-1",
            [],
            since=0,
            idle_s=60,
            put={
                "c1": pending_call("c1", "fs__read", ("sig-a", "sig-b")),
                "c2": pending_call("c2", "fs__read", ("sig-b",)),
            },
            signatures=["sig-b"],
        )
    )
    got = await backend.append(
        Append(AGENT, "run-1", [b'{"k":"llm"}'], since=0, idle_s=60, take=["c1", "c2"], take_at=1)
    )
    # c1 matched the one MCP call recorded; c2 (same signature) is a second call: recorded
    assert [i for i, _ in got.taken] == ["c2"]


async def test_explicit_sessions_resolve_to_one_run_until_terminated(backend: StateBackend) -> None:
    one = await backend.resolve(AGENT, "explicit", "run-a", idle_s=60, name="s:1")
    assert (one.outcome, one.run_id) == ("created", "run-a")
    two = await backend.resolve(AGENT, "explicit", "run-b", idle_s=60, name="s:1")
    assert (two.outcome, two.run_id, two.started) == ("existing", "run-a", one.started)
    # the same session id of another agent is another session
    other = await backend.resolve("agent", "explicit", "run-c", idle_s=60, name="with:colons:x:s:1")
    assert other.outcome == "created"
    await backend.terminate(AGENT, "run-a", "guard:max_llm_calls", session_id="s:1", ttl_s=60)
    refused = await backend.resolve(AGENT, "explicit", "run-d", idle_s=60, name="s:1")
    assert (refused.outcome, refused.run_id) == ("terminated", "run-a")
    got = await backend.append(Append(AGENT, "run-a", [b"{}"], since=0, idle_s=60))
    assert got.terminated == "guard:max_llm_calls"


async def test_automatic_sessions_follow_episode_and_lineage(backend: StateBackend) -> None:
    ep = await backend.resolve(AGENT, "episode", "run-ep", idle_s=60, name="codex-123")
    assert ep.outcome == "created"
    assert (await backend.resolve(AGENT, "episode", "x", idle_s=60, name="codex-123")).run_id == "run-ep"

    # MCP calls before any conversation join the latest run; a new conversation takes a run whose
    # lineage is still empty, and a conversation that continues a known history finds its run
    mcp = await backend.resolve("solo", "none", "run-mcp", idle_s=60)
    assert mcp.outcome == "created"
    first = await backend.resolve("solo", "lineage", "run-new", idle_s=60, history=["h1"])
    assert (first.outcome, first.run_id) == ("existing", "run-mcp")
    cont = await backend.resolve("solo", "lineage", "run-new", idle_s=60, history=["h2", "h1"])
    assert (cont.outcome, cont.run_id) == ("existing", "run-mcp")
    other = await backend.resolve("solo", "lineage", "run-other", idle_s=60, history=["z1"])
    assert (other.outcome, other.run_id) == ("created", "run-other")
    # a Responses id linked to a run (on settle) finds it
    await backend.append(
        Append(
            "solo", "run-mcp", [], since=0, idle_s=60, links={keys.slot_response("solo", "resp_1"): "run-mcp"}
        )
    )
    chained = await backend.resolve(
        "solo", "lineage", "run-x", idle_s=60, previous_response_id="resp_1", history=["q"]
    )
    assert chained.run_id == "run-mcp"
    assert (await backend.resolve("solo", "none", "run-y", idle_s=60)).run_id == "run-mcp"  # latest used


async def test_a_first_request_continues_no_run(backend: StateBackend) -> None:
    """SPEC §3: a conversation's first request (mode `first`) starts a run even when another run
    was attached to the same words; it still adopts a run that has seen no conversation yet."""
    mcp = await backend.resolve("batch", "none", "run-mcp", idle_s=60)
    one = await backend.resolve("batch", "first", "run-1", idle_s=60, history=["same"])
    assert (one.outcome, one.run_id) == ("existing", mcp.run_id)  # the MCP-only run is its episode
    two = await backend.resolve("batch", "first", "run-2", idle_s=60, history=["same"])
    three = await backend.resolve("batch", "first", "run-3", idle_s=60, history=["same"])
    assert (two.outcome, two.run_id) == ("created", "run-2")
    assert (three.outcome, three.run_id) == ("created", "run-3")
    # a later request finds its run by the answer it carries (linked on settle)
    await backend.append(
        Append("batch", "run-2", [], since=0, idle_s=60, links={keys.slot_history("batch", "a2"): "run-2"})
    )
    later = await backend.resolve("batch", "lineage", "run-x", idle_s=60, history=["a2", "same"])
    assert later.run_id == "run-2"


async def test_a_terminated_automatic_run_refuses_its_episode(backend: StateBackend) -> None:
    await backend.resolve(AGENT, "episode", "run-ep", idle_s=60, name="e1")
    await backend.terminate(AGENT, "run-ep", "terminated")
    assert (await backend.resolve(AGENT, "episode", "x", idle_s=60, name="e1")).outcome == "terminated"
    assert (await backend.resolve(AGENT, "episode", "run-2", idle_s=60, name="e2")).outcome == "created"


async def test_runs_expire_after_their_idle_time() -> None:
    now = [1000.0]
    backend = MemoryBackend(clock=lambda: now[0])
    await backend.resolve(AGENT, "explicit", "run-a", idle_s=10, name="s")
    await backend.append(
        Append(AGENT, "run-a", [b"{}"], since=0, idle_s=10, keep_alive=[keys.slot_explicit(AGENT, "s")])
    )
    now[0] += 9
    assert (await backend.resolve(AGENT, "explicit", "run-b", idle_s=10, name="s")).run_id == "run-a"
    assert await backend.live_runs([(AGENT, "run-a")]) == [True]
    now[0] += 10.5
    assert await backend.live_runs([(AGENT, "run-a")]) == [False]
    assert (await backend.resolve(AGENT, "explicit", "run-b", idle_s=10, name="s")).outcome == "created"


async def test_redis_runs_expire_after_their_idle_time(redis_url: str) -> None:
    backend = RedisBackend(redis_url)
    try:
        await backend.resolve(AGENT, "explicit", "run-a", idle_s=0.2, name="s")
        assert await backend.live_runs([(AGENT, "run-a")]) == [True]
        for _ in range(500):  # wait on the condition, bounded generously
            if await backend.live_runs([(AGENT, "run-a")]) == [False]:
                break
            await asyncio.sleep(0.02)
        assert (await backend.resolve(AGENT, "explicit", "run-b", idle_s=60, name="s")).outcome == "created"
        # renewing keeps a run alive (a replica with a call in flight does it from its sweeper)
        assert await backend.live_runs([(AGENT, "run-b")], idle_s=60) == [True]
    finally:
        await backend.close()


async def test_breaker_follows_the_pure_circuit_breaker(backend: StateBackend) -> None:
    """Random calls, answers, failures, releases and clock steps: the backend's breaker gives the
    same verdicts, tickets and transitions as proxy/guards/breaker.py's CircuitBreaker."""
    config = CircuitBreakerConfig(open_after_failures=3, cooldown_seconds=5, half_open_max_calls=2)
    rng = random.Random(13)
    pure = CircuitBreaker(config, "llm:default")
    now = 1_000_000.0
    tickets: list = []
    seen: set[State] = set()
    transitions = 0
    for _ in range(400):
        seen.add(pure.state)
        op = rng.random()
        if op < 0.4:
            decision, ticket = pure.before_call(now)
            got = await breaker.admit(backend, AGENT, "llm:default", config, now=now)
            assert (got.ticket is None) == (ticket is None)
            if ticket is None:
                assert got.refusal is not None and got.refusal.message == decision.message
                assert got.refusal.retry_after == decision.retry_after
            else:
                assert got.ticket == ticket
                tickets.append(ticket)
        elif op < 0.8 and tickets:
            ticket = tickets.pop(rng.randrange(len(tickets)))
            failed = rng.random() < 0.6
            want = pure.on_failure(ticket, now) if failed else pure.on_success(ticket, now)
            got_t = await breaker.report(
                backend, AGENT, "llm:default", ticket, config, failed=failed, now=now
            )
            assert got_t == want
            transitions += want is not None
        elif op < 0.85 and tickets:
            ticket = tickets.pop(rng.randrange(len(tickets)))
            pure.release(ticket)
            await breaker.release(backend, AGENT, "llm:default", ticket)
        else:
            now += rng.choice([0.5, 1.0, 2.5, 6.0])
    assert seen == set(State) and transitions > 10  # every state and many moves were exercised
    views = await breaker.views(backend)
    assert [(v.agent, v.upstream, v.state, v.failures) for v in views] == [
        (AGENT, "llm:default", pure.state, pure.failures)
    ]


async def test_breakers_are_per_agent_and_upstream(backend: StateBackend) -> None:
    config = CircuitBreakerConfig(open_after_failures=1, cooldown_seconds=30)
    got = await breaker.admit(backend, "a", "llm:x", config)
    assert got.ticket is not None
    moved = await breaker.report(backend, "a", "llm:x", got.ticket, config, failed=True)
    assert moved is not None and moved.new is State.OPEN
    refused = await breaker.admit(backend, "a", "llm:x", config)
    assert refused.ticket is None and refused.refusal is not None and refused.refusal.retry_after
    assert (await breaker.admit(backend, "a", "llm:y", config)).ticket is not None
    assert (await breaker.admit(backend, "b", "llm:x", config)).ticket is not None
    disabled = CircuitBreakerConfig(enabled=False)
    assert (await breaker.admit(backend, "a", "llm:x", disabled)).ticket is not None


async def test_config_snapshots_round_trip(backend: StateBackend) -> None:
    from proxy.guard_store import parse_snapshot, snapshot_bytes

    project = GuardConfig.model_validate({"limits": {"max_llm_calls": 3}})
    rev = await backend.publish_config(snapshot_bytes(project, {"bot": GuardConfig()}))
    got_rev, raw = await backend.config_snapshot()
    assert got_rev == rev and raw is not None
    parsed_project, agents = parse_snapshot(raw, "test")
    assert parsed_project == project and set(agents) == {"bot"}
    assert await backend.config_snapshot(rev + 5) == (rev + 5, None)


async def test_a_log_that_lost_its_entries_is_seeded_again_once(backend: StateBackend) -> None:
    first = await backend.append(Append(AGENT, "run-1", [b"{}", b"{}"], since=0, idle_s=60))
    copy = first.entries
    # the replica that followed this log asks beyond the end of another one: nothing is appended
    lost = await backend.append(
        Append(AGENT, "run-2", [b'{"k":"new"}'], since=2, idle_s=60, epoch=first.epoch)
    )
    assert lost.lost and await backend.read(AGENT, "run-2", since=0) == []
    assert await backend.seed(AGENT, "run-2", copy, idle_s=60)
    assert not await backend.seed(AGENT, "run-2", copy, idle_s=60)  # the first seed wins
    again = await backend.append(Append(AGENT, "run-2", [b'{"k":"new"}'], since=2, idle_s=60))
    assert not again.lost and [e.body for e in again.entries] == [b'{"k":"new"}']
    # the same length but another epoch (the run started again): not the log it followed
    other = await backend.append(Append(AGENT, "run-2", [b"{}"], since=1, idle_s=60, epoch="1.000000"))
    assert other.lost
    assert (
        await backend.append(Append(AGENT, "run-2", [b"{}"], since=1, idle_s=60, epoch=again.epoch))
    ).first_own == 4


async def test_the_longest_copy_of_a_lost_log_wins_until_the_log_goes_on(backend: StateBackend) -> None:
    """Replicas put a lost log back from their copies (each a prefix of the one log): a longer copy
    extends a log that is still only a seed of the same epoch, never one appended to since."""
    full = (
        await backend.append(Append(AGENT, "run-1", [b'{"n":1}', b'{"n":2}', b'{"n":3}'], since=0, idle_s=60))
    ).entries
    epoch = (await backend.append(Append(AGENT, "run-1", [b'{"n":4}'], since=3, idle_s=60))).epoch
    # run-2 stands for run-1 after Redis lost it: one replica saw 2 entries, another all 3
    assert await backend.seed(AGENT, "run-2", full[:2], idle_s=60, epoch=epoch)
    assert await backend.seed(AGENT, "run-2", full, idle_s=60, epoch=epoch)
    assert not await backend.seed(AGENT, "run-2", full[:1], idle_s=60, epoch=epoch)  # shorter: kept
    assert [e.body for e in await backend.read(AGENT, "run-2", since=0)] == [e.body for e in full]
    followed = await backend.append(Append(AGENT, "run-2", [b'{"n":5}'], since=3, idle_s=60, epoch=epoch))
    assert not followed.lost and followed.epoch == epoch  # the replicas' epoch was put back too
    longer = [*full, full[0]]
    assert not await backend.seed(AGENT, "run-2", longer, idle_s=60, epoch=epoch)  # appended to since
    # another epoch (not the log that copy was of) is never extended
    assert await backend.seed(AGENT, "run-3", full[:1], idle_s=60, epoch=epoch)
    assert not await backend.seed(AGENT, "run-3", full, idle_s=60, epoch="1.000000")


async def test_a_restored_run_is_terminated_and_named_again(backend: StateBackend) -> None:
    slot = keys.slot_explicit(AGENT, "s1")
    await backend.seed(AGENT, "run-9", [], idle_s=60, terminated="terminated", slots=[slot])
    resolved = await backend.resolve(AGENT, "explicit", "run-new", idle_s=60, name="s1")
    assert (resolved.outcome, resolved.run_id) == ("terminated", "run-9")


async def test_the_data_set_id_is_the_first_one_set(backend: StateBackend) -> None:
    first = await backend.dataset("id-a")
    assert first == "id-a" and await backend.dataset("id-b") == "id-a"


async def test_responses_links_come_back_as_their_chain_newest_first(backend: StateBackend) -> None:
    await backend.put_links("bot", {"resp_1": (b"one", None)}, idle_s=60)
    await backend.put_links("bot", {"resp_2": (b"two", "resp_1"), "resp_3": (b"three", "resp_2")}, idle_s=60)
    assert await backend.chain("bot", "resp_3", limit=10, idle_s=60) == [
        ("resp_3", b"three"),
        ("resp_2", b"two"),
        ("resp_1", b"one"),
    ]
    assert await backend.chain("bot", "resp_3", limit=2, idle_s=60) == [
        ("resp_3", b"three"),
        ("resp_2", b"two"),
    ]
    assert await backend.chain("other-agent", "resp_3", limit=10, idle_s=60) == []  # per agent
    # a link not shared ends the chain (expired, or answered before the replicas shared state)
    await backend.put_links("bot", {"resp_9": (b"nine", "resp_gone")}, idle_s=60)
    assert await backend.chain("bot", "resp_9", limit=10, idle_s=60) == [("resp_9", b"nine")]


def rate_request(member: str, max_calls: int = 2, per_s: float = 60) -> tuple[RateRequest]:
    config = GuardConfig.model_validate(
        {"rate_limits": [{"match": "llm", "max_calls": max_calls, "per_s": per_s}]}
    )
    return (RateRequest(AGENT, member, rules_for(config.rate_limits, None)),)


async def test_rate_limits_admit_across_runs_and_a_refused_check_is_not_appended(
    backend: StateBackend,
) -> None:
    # two checks of one run and one of another run of the same agent: the third is over 2 per 60 s
    (r1,) = rate_request("c1")
    (r2,) = rate_request("c2")
    both = await backend.append(
        Append(
            AGENT,
            "run-1",
            [b'{"k":"a"}', b'{"k":"b"}'],
            since=0,
            idle_s=60,
            checks=[CheckAsk(RATES, 1, r1), CheckAsk(RATES, 2, r2)],
        )
    )
    assert both.answers == [None, None] and [e.body for e in both.entries] == [b'{"k":"a"}', b'{"k":"b"}']
    pending = {"t1": pending_call("t1", "search")}
    await backend.append(Append(AGENT, "run-2", [b'{"k":"s"}'], since=0, idle_s=60, put=pending))
    (r3,) = rate_request("c3")
    circuit = BreakerRequest(AGENT, "llm:default", CircuitBreakerConfig())
    refused = await backend.append(
        Append(
            AGENT,
            "run-2",
            [b'{"k":"event"}', b'{"k":"c"}'],
            since=1,
            idle_s=60,
            take=["t1"],
            take_at=2,
            checks=[CheckAsk(RATES, 2, r3), CheckAsk(breaker.TWIN, 2, circuit)],
        )
    )
    refusal, circuit_answer = refused.answers
    assert refusal is not None and refusal.count == 2 and refusal.rule.key == r3.rules[0].key
    assert 59 < refusal.retry_after <= 60
    assert circuit_answer is None and refused.refused == {2}  # never went upstream: no circuit asked
    # the event before it went in; the refused check did not, nor the tool call it would have taken
    assert [e.body for e in refused.entries] == [b'{"k":"event"}'] and refused.taken == []
    assert refused.first_own == 2
    # another agent has its own window
    other = RateRequest("other", "c4", r3.rules)
    again = await backend.append(
        Append("other", "run-3", [b'{"k":"d"}'], since=0, idle_s=60, checks=[CheckAsk(RATES, 1, other)])
    )
    assert again.answers == [None]


async def test_a_rate_window_moves_with_the_backend_clock(backend: StateBackend) -> None:
    (first,) = rate_request("c1", max_calls=1, per_s=0.2)
    assert (
        await backend.append(
            Append(AGENT, "run-1", [b"{}"], since=0, idle_s=60, checks=[CheckAsk(RATES, 1, first)])
        )
    ).answers == [None]
    (second,) = rate_request("c2", max_calls=1, per_s=0.2)
    since = 1
    while True:  # refused until the first call is 0.2 s old (refusals take no slot)
        got = await backend.append(
            Append(AGENT, "run-1", [b"{}"], since=since, idle_s=60, checks=[CheckAsk(RATES, 1, second)])
        )
        since += len(got.entries)
        if got.answers == [None]:
            break
        refusal = got.answers[0]
        assert refusal is not None and 0 < refusal.retry_after <= 0.2
        await asyncio.sleep(0.02)


async def test_a_check_can_take_several_slots_of_a_window(backend: StateBackend) -> None:
    (one,) = rate_request("c1", max_calls=3)
    rules = one.rules
    two = RateRequest(AGENT, "c2", rules, (2,))
    got = await backend.append(
        Append(AGENT, "run-1", [b"{}", b"{}"], since=0, idle_s=60, checks=[CheckAsk(RATES, 1, two)])
    )
    assert got.answers == [None]
    again = RateRequest(AGENT, "c3", rules, (2,))
    got = await backend.append(
        Append(AGENT, "run-1", [b"{}"], since=2, idle_s=60, checks=[CheckAsk(RATES, 1, again)])
    )
    (refusal,) = got.answers
    assert refusal is not None and refusal.count == 2 and 59 < refusal.retry_after <= 60
    last = RateRequest(AGENT, "c4", rules, (1,))
    got = await backend.append(
        Append(AGENT, "run-1", [b"{}"], since=2, idle_s=60, checks=[CheckAsk(RATES, 1, last)])
    )
    assert got.answers == [None]
