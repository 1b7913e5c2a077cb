"""`tripwire replay` and shadow mode (SPEC §5.7): real agents through the proxy, then their runs replayed.

Determinism is the promise: a run replayed under the config it ran with takes, call for call, the
decisions the live guards took (MCP and function-calling). Under another config it shows what that
config would have done. Shadow mode evaluates and records everything and refuses nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

from mcp import Client  # noqa: E402

from proxy import cli  # noqa: E402
from proxy.guards.config import GuardConfig  # noqa: E402
from proxy.replay import RunReplay, replay_dir  # noqa: E402
from tests.conftest import AGENT_KEY, Running, StartTripwire  # noqa: E402
from tests.fakes import FakeUpstream, Reply  # noqa: E402
from tests.pipeline_errors import no_pipeline_errors  # noqa: E402, F401 (autouse fixture)
from tests.schema import assert_run_valid  # noqa: E402
from tests.test_guards_e2e_config import api  # noqa: E402
from tests.test_guards_e2e_mcp import SESSION_URL, shop, text_of  # noqa: E402

HEADERS = {"X-Tripwire-Session": "replay-1", "X-Tripwire-Agent": "looper"}
CHAT = "/v1/chat/completions"


async def run_dir_of(tw: Running) -> tuple[Path, list[dict[str, Any]]]:
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    return tw.data_dir / "runs" / run_id, events


def firings(replay: RunReplay) -> list[tuple[int | None, str, str | None, str]]:
    return [(d.call_index, d.guard, d.kind, d.action) for d in replay.decisions]


def assert_replays_live(replay: RunReplay) -> None:
    """Call for call, the replay decided what the live guards decided."""
    assert replay.live, "no guarded calls recorded"
    assert replay.replayed_checks == replay.live


async def admin_text(tw: Running, path: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(tw.admin_url + path) as resp:
        return await resp.text()


async def mcp_loop(tw: Running, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    async with Client(tw.url + SESSION_URL, cache=None) as client:
        return [await client.call_tool(name, args) for name, args in calls]


# the same status polled (it never changes), some honest reads, then a stuck 3-call cycle
LOOPING = (
    [("job_status", {"job_id": "j1"})] * 6
    + [("get_record", {"record_id": i}) for i in range(3)]
    + [("fetch_user", {"user_id": 7}), ("fetch_orders", {"user_id": 7}), ("fetch_invoice", {"user_id": 7})]
    * 4
)


async def test_an_mcp_run_replays_exactly_as_it_was_decided_live(start_tripwire: StartTripwire) -> None:
    with shop() as upstream:
        tw = await start_tripwire(mcp={"shop": {"url": upstream}})
        await mcp_loop(tw, LOOPING)
        d, events = await run_dir_of(tw)
    replay = replay_dir(d)
    assert_replays_live(replay)
    kinds = {k for _, _, k, _ in firings(replay)}
    assert {"no_progress", "repetition", "ping_pong"} <= kinds
    # every call's event carries its arrival number and fingerprints
    tool_calls = [e["payload"] for e in events if e["event_type"] == "TOOL_CALL"]
    assert [p["call_seq"] for p in tool_calls] == list(range(1, len(LOOPING) + 1))
    # a 24-hex hash, then what the guards compare by structure (issue 31: the values the arguments
    # name, a result's counters and tokens; proxy/guards/structure.py)
    hashed = re.compile(r"[0-9a-f]{24}(?:\|\d+)*(?:~.*)?")
    assert all(
        hashed.fullmatch(p["args_fingerprint"]) and hashed.fullmatch(p["result_fingerprint"])
        for p in tool_calls
    )


async def test_refusals_replay_too(start_tripwire: StartTripwire) -> None:
    with shop() as upstream:
        tw = await start_tripwire(
            mcp={"shop": {"url": upstream}}, guards={"loop_detection": {"action": "block"}}
        )
        results = await mcp_loop(tw, LOOPING)
        d, events = await run_dir_of(tw)
    assert any(r.is_error for r in results)
    refused = [e for e in events if e["event_type"] == "ERROR" and "call_seq" in e["payload"]]
    assert refused, "a refused call's ERROR carries its call_seq"
    replay = replay_dir(d)
    assert_replays_live(replay)
    assert {d.action for d in replay.decisions} >= {"block"}


async def test_a_function_calling_run_replays_exactly(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(tool_calls=[(f"c{i}", "get_weather", {"city": "Paris"})]) for i in range(7)]
    fake.replies += [Reply(tool_calls=[(f"p{i}", "list_items", {"page": i})]) for i in range(6)]
    fake.default = Reply(text="done")
    tw = await start_tripwire(upstream={"url": url})
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=HEADERS)
    messages: list[Any] = [{"role": "user", "content": "weather?"}]
    for _ in range(20):
        answer = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        msg = answer.choices[0].message
        if not msg.tool_calls:
            break
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls:
            content = "sunny" if tc.function.name == "get_weather" else f"items of {tc.function.arguments}"
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": content})
    d, events = await run_dir_of(tw)
    replay = replay_dir(d)
    assert_replays_live(replay)
    assert {"identical_step", "repetition"} <= {k for _, _, k, _ in firings(replay)}
    llm_calls = [e["payload"] for e in events if e["event_type"] == "LLM_CALL"]
    assert [p["call_seq"] for p in llm_calls] == list(range(1, len(llm_calls) + 1))
    # the history is recorded as what is new in it: one step per request, never the whole history
    assert all(len(p["guard_input"]["hist"]["add"]) <= 1 for p in llm_calls)


async def test_a_higher_threshold_moves_the_firing_later_or_away(start_tripwire: StartTripwire) -> None:
    with shop() as upstream:
        tw = await start_tripwire(mcp={"shop": {"url": upstream}})
        await mcp_loop(tw, LOOPING)
        d, _ = await run_dir_of(tw)
    live = replay_dir(d)
    lenient = GuardConfig.model_validate(
        {"loop_detection": {"threshold": 10, "no_progress_warn": 7, "no_progress_halt": 20}}
    )
    later = replay_dir(d, lenient)
    first_live = min(c for c, *_ in firings(live) if c is not None)
    later_calls = [c for c, *_ in firings(later) if c is not None]
    assert not later_calls or min(later_calls) > first_live

    def first_cycle(r: RunReplay) -> int:
        return min(c for c, _, k, _ in firings(r) if k == "ping_pong" and c is not None)

    # the cycle starts at call 10: caught at its 6th call by default, at its 10th under threshold 10
    assert (first_cycle(live), first_cycle(later)) == (15, 19)


async def test_a_metadata_only_run_replays_like_its_full_content_twin(start_tripwire: StartTripwire) -> None:
    got = []
    for record_content in (True, False):
        with shop() as upstream:
            tw = await start_tripwire(mcp={"shop": {"url": upstream}}, record_content=record_content)
            await mcp_loop(tw, LOOPING)
            d, events = await run_dir_of(tw)
        if not record_content:
            assert all(
                e["payload"].get("args") in (None, {}) for e in events if e["event_type"] == "TOOL_CALL"
            )
        got.append([(c, g, k, a) for c, g, k, a in firings(replay_dir(d))])
    assert got[0] == got[1] and got[0]


async def test_the_cli_prints_json_and_a_summary(
    start_tripwire: StartTripwire, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with shop() as upstream:
        tw = await start_tripwire(mcp={"shop": {"url": upstream}})
        await mcp_loop(tw, LOOPING)
        d, _ = await run_dir_of(tw)
    assert cli.main(["replay", d.name, "--data-dir", str(tw.data_dir), "--json"]) == 0
    decisions = json.loads(capsys.readouterr().out)
    assert decisions and all(
        set(x) == {"run_id", "call_index", "event_id", "guard", "kind", "action"} for x in decisions
    )
    assert {x["run_id"] for x in decisions} == {d.name}
    config = tmp_path / "lenient.yaml"
    config.write_text("loop_detection:\n  enabled: false\n")
    assert cli.main(["replay", str(d), "--config", str(config)]) == 0
    assert "nothing fired" in capsys.readouterr().out
    assert cli.main(["replay", "--all", "--data-dir", str(tw.data_dir)]) == 0
    out = capsys.readouterr().out
    assert "1 runs: 0 would be warned, 0 blocked, 1 ended" in out or "1 runs: 1 would be warned" in out
    assert cli.main(["replay", "not-a-run", "--data-dir", str(tw.data_dir)]) == 2


def test_runs_written_by_agentdbgs_own_sdk_replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agentdbg = pytest.importorskip("agentdbg")
    monkeypatch.setenv("AGENTDBG_DATA_DIR", str(tmp_path))
    with agentdbg.traced_run("sdk-run"):
        for _ in range(6):
            agentdbg.record_tool_call("get_status", args={"job": 1}, result="pending")
    (d,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    replay = replay_dir(d)
    assert replay.recorded_by == "agentdbg" and replay.calls == 6
    assert ("no_progress", "warn") in {(k, a) for _, _, k, a in firings(replay)}


# -- shadow mode ---------------------------------------------------------------------------------


async def test_shadow_mode_records_everything_and_refuses_nothing(start_tripwire: StartTripwire) -> None:
    guards = {"shadow": True, "loop_detection": {"action": "block"}, "limits": {"max_tool_calls": 8}}
    with shop() as upstream:
        tw = await start_tripwire(mcp={"shop": {"url": upstream}}, guards=guards)
        results = await mcp_loop(tw, LOOPING)
        d, events = await run_dir_of(tw)
        metrics = await admin_text(tw, "/metrics")
    # the agent saw exactly what the server said: no refusal, no warning text
    assert not any(r.is_error for r in results)
    assert all(not any(t.startswith("[tripwire]") for t in text_of(r)) for r in results)
    assert len([e for e in events if e["event_type"] == "TOOL_CALL"]) == len(LOOPING)
    warnings = [e["payload"] for e in events if e["event_type"] == "LOOP_WARNING"]
    errors = [e["payload"] for e in events if e["event_type"] == "ERROR"]
    assert warnings and all(w["shadow"] is True for w in warnings)
    assert {"block", "terminate"} & {e["action"] for e in errors} and all(e["shadow"] is True for e in errors)
    assert "max_tool_calls" in {e["guardrail"] for e in errors}
    assert len([e for e in errors if e["guardrail"] == "max_tool_calls"]) == 1  # once, not per call
    assert events[-1]["event_type"] != "RUN_END"  # a shadow TERMINATE ends nothing
    tags = tw.tripwire_json(d.name)["health_tags"]
    assert tags == ["shadow_fired"]
    assert 'tripwire_guard_decisions_total{action="block",guard="loop_detection",shadow="true"}' in metrics
    # replayed under its own (shadow) config: the same decisions, nothing refused
    assert_replays_live(replay_dir(d))


async def test_switching_an_agent_from_shadow_to_enforce_applies_on_the_next_call(
    start_tripwire: StartTripwire,
) -> None:
    guards = {"shadow": True, "loop_detection": {"action": "block"}}
    with shop() as upstream:
        tw = await start_tripwire(mcp={"shop": {"url": upstream}}, guards=guards)
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            shadowed = [await client.call_tool("job_status", {"job_id": "j1"}) for _ in range(5)]
            assert not any(r.is_error for r in shadowed)
            body = {"shadow": False, "loop_detection": {"action": "block"}}
            status, answer = await api(tw, "PUT", "/api/agents/bot/prevention-config", body)
            assert status == 200, answer
            enforced = await client.call_tool("job_status", {"job_id": "j1"})
        d, _ = await run_dir_of(tw)
    assert enforced.is_error and text_of(enforced)[0].startswith("[tripwire] blocked:")
    replay = replay_dir(d)
    assert_replays_live(replay)  # the change of config is recorded and followed


async def test_an_over_budget_agent_in_shadow_is_never_refused(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="expensive", prompt_tokens=100_000, completion_tokens=0)  # $0.25 each
    budget = {"max_cost_usd": 0.6, "soft_alert_threshold_usd": 0.3}
    tw = await start_tripwire(upstream={"url": url}, guards={"shadow": True, "budget": budget})
    llm = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=HEADERS)
    for _ in range(6):  # enforce mode refuses the 4th (see test_guards_e2e_budget)
        answer = await llm.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content == "expensive"
    assert len(fake.calls(CHAT)) == 6
    d, events = await run_dir_of(tw)
    errors = [e["payload"] for e in events if e["event_type"] == "ERROR"]
    assert [(e["guardrail"], e["action"], e["shadow"]) for e in errors] == [
        ("max_cost_usd", "terminate", True)
    ]
    soft = [e["payload"] for e in events if e["event_type"] == "STATE_UPDATE"]
    assert [s.get("shadow") for s in soft if s.get("guardrail") == "soft_alert_threshold_usd"] == [True]
    assert events[-1]["event_type"] == "LLM_CALL"  # no RUN_END: nothing was ended
    assert tw.tripwire_json(d.name)["health_tags"] == ["shadow_fired"]
    replay = replay_dir(d)
    assert_replays_live(replay)
    assert [(x.call_index, x.guard) for x in replay.decisions if x.action == "terminate"] == [
        (4, "max_cost_usd"),
        (5, "max_cost_usd"),
        (6, "max_cost_usd"),
    ]
