"""A long history read on from the previous request decides exactly as one read whole.

The dialect reads a conversation that continues a recent request from where that one ended
(`openai_chat.parse_request_from`), and the guards then read only its new steps
(`LoopDetector.check_llm_history` with `reading` / `read_from`, `guard_trace.llm_inputs` with
`known`). These tests run the same agent sessions both ways, side by side, and compare every
decision, every count and every replay delta.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from factories import chat_completion, make_engine, make_exchange, play_upstream

from proxy.dialects import openai_chat
from proxy.dialects.base import LLMRequest, ParseState
from proxy.guard_trace import llm_inputs
from proxy.guards.config import GuardConfig
from proxy.guards.session import SessionGuards
from proxy.pipelines import llm_stages

SYSTEM = {"role": "system", "content": "You are a coding agent."}


def step(i: int, tool: str, args: dict[str, Any], result: str, *, user: str | None = None) -> list[Any]:
    """One agent step (assistant tool call + its result), after a user message when `user` is set."""
    out: list[Any] = [{"role": "user", "content": user}] if user else []
    out.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": tool, "arguments": json.dumps(args)},
                }
            ],
        }
    )
    out.append({"role": "tool", "tool_call_id": f"call_{i}", "content": result})
    return out


def agent_session(n: int) -> list[list[Any]]:
    """The message list of each request of an agent loop: honest work, a stuck poll, a new user
    turn, then the same step over and over (identical_step, repetition and per-tool fire)."""
    messages: list[Any] = [SYSTEM, {"role": "user", "content": "fix the tests"}]
    requests = []
    for i in range(n):
        if i < n // 4:
            messages += step(i, "read_file", {"path": f"src/m{i}.py"}, f"content {i}")
        elif i < n // 2:
            messages += step(i, "run_tests", {}, "1 failed")
        elif i == n // 2:
            messages += step(i, "grep", {"q": "x"}, "found", user="try again")
        else:
            messages += step(i, "get_status", {"id": 7}, "pending")
        requests.append(list(messages))
    return requests


def test_a_continued_parse_reads_the_same_steps_as_a_whole_one() -> None:
    prior: ParseState | None = None
    for messages in agent_session(40):
        whole = openai_chat.parse_request({"model": "m", "messages": messages})
        continued = openai_chat.parse_request_from({"model": "m", "messages": messages}, prior)
        assert continued.steps == whole.steps
        assert continued.tool_results == whole.tool_results
        assert continued.turn_start == whole.turn_start
        assert continued.continues is prior
        prior = continued.parsed


def judge_both_ways(config: GuardConfig, requests: list[list[Any]]) -> None:
    whole = SessionGuards(config, started_at=0.0)
    incremental = SessionGuards(config, started_at=0.0)
    prior: ParseState | None = None
    previous_ids: tuple[list[tuple[str, ...]], list[tuple[str, ...]]] = ([], [])
    for k, messages in enumerate(requests):
        body = {"model": "m", "messages": messages}
        a: LLMRequest = openai_chat.parse_request(body)
        b: LLMRequest = openai_chat.parse_request_from(body, prior)
        assert b.parsed is not None
        now = float(k)
        va = whole.before_llm_call(a.steps, a.turn_start, a.tool_results, estimate_usd=0.0, now=now)
        vb = incremental.before_llm_call(
            b.steps,
            b.turn_start,
            b.tool_results,
            estimate_usd=0.0,
            now=now,
            reading=b.parsed,
            read_from=b.continues,
        )
        assert vb.decisions == va.decisions, k
        assert incremental.budget.tool_calls == whole.budget.tool_calls
        assert incremental.loop.stats(now) == whole.loop.stats(now)
        ia, ids_a = llm_inputs(previous_ids[0], a.steps, a.turn_start, a.tool_results, 0.0, 0)
        known = len(prior.steps) if prior is not None else 0
        ib, ids_b = llm_inputs(previous_ids[1], b.steps, b.turn_start, b.tool_results, 0.0, 0, known=known)
        assert (ib, ids_b) == (ia, ids_a)
        previous_ids = (ids_a, ids_b)
        whole.release(va.reservation)
        incremental.release(vb.reservation)
        prior = b.parsed


@pytest.mark.parametrize(
    "config",
    [
        GuardConfig(),
        GuardConfig.model_validate({"loop_detection": {"max_repeated_tool_steps": 2, "threshold": 3}}),
        GuardConfig.model_validate({"loop_detection": {"per_tool_mode": "count"}}),
        GuardConfig.model_validate({"loop_detection": {"enabled": False}, "limits": {"max_tool_calls": 30}}),
        GuardConfig.model_validate({"shadow": True}),
    ],
)
def test_guards_reading_only_the_new_steps_decide_as_reading_the_whole(config: GuardConfig) -> None:
    judge_both_ways(config, agent_session(60))


def test_a_history_that_does_not_continue_the_last_one_is_read_whole() -> None:
    """An edited history (the earlier requests' reading is not the one named) is read in full."""
    requests = agent_session(30)
    edited = [dict(m) for m in requests[-1]]
    edited[3] = {**edited[3], "content": "edited"}
    judge_both_ways(GuardConfig(), [*requests[:-1], edited, requests[-1]])


async def run_session(tmp_path: Path, requests: list[list[Any]]) -> list[dict[str, Any]]:
    """Every request through the pipeline's stages (the upstream played), as in the proxy; the
    LLM_CALL events' guard fields and decisions."""
    async with make_engine(tmp_path) as engine:
        stages = llm_stages(engine.services)
        run_id = None
        for k, messages in enumerate(requests):
            ex = make_exchange(body={"model": "gpt-4o-mini", "messages": messages}, engine=engine)
            for stage in stages:
                if ex.answer is not None or stage.name == "forward":
                    break
                await stage.request(ex)
            if ex.answer is None:
                answer = chat_completion("ok")
                answer["choices"][0]["message"]["tool_calls"] = [
                    {"id": f"call_{k + 1}", "type": "function", "function": {"name": "t", "arguments": "{}"}}
                ]
                play_upstream(ex, answer)
            for stage in reversed(stages):
                await stage.finish(ex)
            if ex.session is not None:  # (a terminated session refuses the rest: the same both ways)
                run_id = ex.session.run_id
        await engine.recorder.flush()
        path = engine.data_dir / "runs" / str(run_id) / "events.jsonl"
        events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    keep = ("call_seq", "guard_input", "args_fingerprint")
    return [
        {"type": e["event_type"], **{k: e["payload"].get(k) for k in keep}}
        for e in events
        if e["event_type"] in ("LLM_CALL", "TOOL_CALL", "LOOP_WARNING", "ERROR")
    ]


async def test_the_trace_of_a_long_session_is_the_same_read_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = agent_session(50)  # 100+ messages: well past history.MIN_MESSAGES
    continued = await run_session(tmp_path / "a", requests)
    monkeypatch.setattr("proxy.history.MIN_MESSAGES", 10**9)  # nothing kept: every request read whole
    whole = await run_session(tmp_path / "b", requests)
    for event in continued + whole:
        if event["guard_input"]:
            event["guard_input"].pop("t", None)  # the clock
            event["guard_input"].pop("t_end", None)
    assert continued == whole
    assert any(e["type"] == "LOOP_WARNING" for e in whole)
