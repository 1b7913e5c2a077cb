"""After a scripted agent run through the proxy, /metrics holds exactly the numbers in the trace (issue 5, acceptance 3)."""

from __future__ import annotations

import errno
import json
import time
from collections import Counter
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy import storage
from tests.conftest import AGENT_KEY, StartTripwire
from tests.fakes import Reply
from tests.viewer_fixtures import immutable


def totals(text: str, family: str, sample: str, **match: str) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != family:
            continue
        for s in fam.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in match.items()):
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


async def test_metrics_match_the_trace(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    same_tool = Reply(
        tool_calls=[("call_x", "lookup", {"q": "same"})], prompt_tokens=321, completion_tokens=17
    )
    fake.default = same_tool
    tw = await start_tripwire(
        upstream={"url": url},
        guards={"loop_detection": {"threshold": 3, "action": "block", "max_repeated_tool_steps": 10}},
        agents={"capped": {"limits": {"max_llm_calls": 2}}},
    )
    # agent 1: its model asks for the same tool forever; the repetition is blocked
    looping = openai.AsyncOpenAI(base_url=tw.url + "/agents/looper/v1", api_key=AGENT_KEY, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for i in range(6):
        resp = await looping.chat.completions.create(model="gpt-4o-mini", messages=messages)
        msg = resp.choices[0].message
        if not msg.tool_calls:
            break
        messages.append(msg.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": f"{msg.tool_calls[0].id}", "content": "same answer"})
        fake.default = Reply(
            tool_calls=[(f"call_{i}", "lookup", {"q": "same"})], prompt_tokens=321, completion_tokens=17
        )
    # agent 2: an unknown model, capped at two LLM calls
    fake.default = Reply(text="fine", prompt_tokens=1000, completion_tokens=100, model="my-custom-model")
    # one session for its three calls (alone, each first request would start a run: SPEC §3)
    capped = openai.AsyncOpenAI(
        base_url=tw.url + "/agents/capped/sessions/c/v1", api_key=AGENT_KEY, max_retries=0
    )
    for _ in range(2):
        await capped.chat.completions.create(
            model="my-custom-model", messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(openai.RateLimitError):
        await capped.chat.completions.create(
            model="my-custom-model", messages=[{"role": "user", "content": "x"}]
        )
    await tw.flush()

    events = [e for run_id in tw.run_ids() for e in tw.events(run_id)]
    llm = [e["payload"] for e in events if e["event_type"] == "LLM_CALL"]
    errors = Counter(e["payload"]["guardrail"] for e in events if e["event_type"] == "ERROR")
    assert errors["max_llm_calls"] == 1 and errors["loop_detection"] >= 1

    async with aiohttp.ClientSession() as http, http.get(tw.admin_url + "/metrics") as r:
        text = await r.text()
    prompt = sum(totals(text, "tripwire_llm_tokens", "tripwire_llm_tokens_total", type="prompt").values())
    completion = sum(
        totals(text, "tripwire_llm_tokens", "tripwire_llm_tokens_total", type="completion").values()
    )
    cost = sum(totals(text, "tripwire_llm_cost_usd", "tripwire_llm_cost_usd_total").values())
    calls = sum(totals(text, "tripwire_llm_calls", "tripwire_llm_calls_total").values())
    assert calls == len(llm)
    assert prompt == sum(p["usage"]["prompt_tokens"] for p in llm)
    assert completion == sum(p["usage"]["completion_tokens"] for p in llm)
    assert cost == pytest.approx(sum(p["cost_usd"] for p in llm), abs=1e-12)
    # every refusal is one decision and one ERROR event
    for guard, n in errors.items():
        refused = sum(
            v
            for labels, v in totals(
                text, "tripwire_guard_decisions", "tripwire_guard_decisions_total", guard=guard
            ).items()
            if dict(labels)["action"] in ("block", "terminate")
        )
        assert refused == n, (guard, refused, n, json.dumps(errors))


def gauge(text: str, family: str, sample: str | None = None) -> float:
    ((_, value),) = totals(text, family, sample or family).items()
    return value


async def test_full_disk_reported_in_healthz_and_metrics_while_traffic_goes_on(
    start_tripwire: StartTripwire, fake_upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC §6: trace-store trouble is in /healthz's body and in a metric, readiness and calls go on."""
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    llm = openai.AsyncOpenAI(base_url=tw.url + "/agents/a/v1", api_key=AGENT_KEY, max_retries=0)
    ask = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(storage, "append_lines", full)
        m.setattr(storage, "write_json_atomic", full)
        for _ in range(2):
            assert (await llm.chat.completions.create(**ask)).choices[0].message.content
        await tw.flush()
        async with aiohttp.ClientSession(base_url=tw.admin_url) as s:
            async with s.get("/healthz") as r:
                assert r.status == 200
                health = await r.json()
            async with s.get("/readyz") as r:
                assert r.status == 200
            assert health["status"] == "degraded" and "No space left" in health["trace_store"]["last_error"]
            async with s.get("/metrics") as r:
                text = await r.text()
            assert gauge(text, "tripwire_event_store_healthy") == 0
            errors = "tripwire_event_store_write_errors_total"
            assert (
                gauge(text, "tripwire_event_store_write_errors", errors)
                == health["trace_store"]["write_errors"]
            )
            # the periodic sweep sees no new error since: the disk is still full, the metric says so
            tw.engine.sweep(time.monotonic())
            async with s.get("/metrics") as r:
                assert gauge(await r.text(), "tripwire_event_store_healthy") == 0
    # space again: the next call is written and both reports clear
    await llm.chat.completions.create(**ask)
    await tw.flush()
    async with aiohttp.ClientSession(base_url=tw.admin_url) as s:
        async with s.get("/healthz") as r:
            assert (await r.json())["status"] == "ok"
        async with s.get("/metrics") as r:
            text = await r.text()
    assert gauge(text, "tripwire_event_store_healthy") == 1
    assert gauge(text, "tripwire_event_store_write_errors", errors) == health["trace_store"]["write_errors"]


async def test_live_sessions_follow_terminate_and_delete_at_once(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    """The gauge drops when the kill switch ends a run (not a sweep later); deleting the run's files
    leaves the traffic counters as they were."""
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    llm = openai.AsyncOpenAI(base_url=tw.url + "/agents/a/v1", api_key=AGENT_KEY, max_retries=0)
    await llm.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}])
    await tw.flush()
    (run_id,) = tw.run_ids()
    async with aiohttp.ClientSession(base_url=tw.admin_url, headers={"Authorization": "Bearer hunter2"}) as s:
        async with s.get("/metrics") as r:
            assert gauge(await r.text(), "tripwire_live_sessions") == 1
        async with s.post(f"/api/runs/{run_id}/terminate") as r:
            assert r.status == 200
        await tw.flush()
        async with s.get("/metrics") as r:
            assert gauge(await r.text(), "tripwire_live_sessions") == 0
        async with s.delete(f"/api/runs/{run_id}") as r:
            assert r.status == 204
        async with s.get("/metrics") as r:
            text = await r.text()
    assert gauge(text, "tripwire_live_sessions") == 0
    assert gauge(text, "tripwire_llm_calls", "tripwire_llm_calls_total") == 1
    assert totals(text, "tripwire_guard_decisions", "tripwire_guard_decisions_total", guard="kill_switch")


async def test_read_only_runs_dir_reported_while_traffic_goes_on(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    """The same with a real filesystem refusal (an immutable runs/ directory: no run dir can be made)."""
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    llm = openai.AsyncOpenAI(base_url=tw.url + "/agents/a/sessions/s/v1", api_key=AGENT_KEY, max_retries=0)
    ask = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}
    runs = tw.data_dir / "runs"
    runs.mkdir(exist_ok=True)
    async with aiohttp.ClientSession(base_url=tw.admin_url) as s:
        with immutable(runs):
            for _ in range(2):
                assert (await llm.chat.completions.create(**ask)).choices[0].message.content
            await tw.flush()
            async with s.get("/healthz") as r:
                health = await r.json()
            async with s.get("/readyz") as r:
                assert r.status == 200
            async with s.get("/metrics") as r:
                assert gauge(await r.text(), "tripwire_event_store_healthy") == 0
        assert (
            health["status"] == "degraded"
            and "Operation not permitted" in health["trace_store"]["last_error"]
        )
        assert health["trace_store"]["write_errors"] >= 1
        # writable again: the run is written from here on (the same session: each first request
        # alone would start a run of its own, SPEC §3)
        await llm.chat.completions.create(**ask)
        await tw.flush()
        async with s.get("/healthz") as r:
            assert (await r.json())["status"] == "ok"
    # the first calls' events were lost (counted in write_errors); the run goes on from the next one
    assert [e["event_type"] for e in tw.events()].count("LLM_CALL") == 1
