"""The prevention-config API of a running Tripwire drives the proxy's next decision (issue 4,
acceptance 5): LangSight's example bodies round-trip, invalid ones are refused naming the field,
what was PUT survives a restart, and a PUT changes the very next call."""

from __future__ import annotations

import copy
from typing import Any

import aiohttp
import openai
import pytest

from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.reference_bodies import LANGSIGHT_BODY

AGENT = "/api/agents/research-agent/prevention-config"
PROJECT = "/api/projects/prevention-config"
HELLO = [{"role": "user", "content": "hello"}]


async def api(tw: Running, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.request(method, tw.admin_url + path, json=body) as resp:
            return resp.status, await resp.json(content_type=None)


def assert_has(got: dict[str, Any], sent: dict[str, Any]) -> None:
    for section, fields in sent.items():
        for name, value in fields.items():
            assert got[section][name] == pytest.approx(value), f"{section}.{name}"


async def test_langsight_bodies_round_trip_and_survive_a_restart(
    start_tripwire: StartTripwire, tmp_path: Any
) -> None:
    data_dir = tmp_path / "cfg"
    tw = await start_tripwire(data_dir=data_dir)
    status, put = await api(tw, "PUT", AGENT, LANGSIGHT_BODY)
    assert status == 200, put
    status, got = await api(tw, "GET", AGENT)
    assert status == 200
    assert got["agent_name"] == "research-agent" and got["is_agent_override"] is True
    assert_has(got, LANGSIGHT_BODY)
    assert got["limits"]["max_llm_calls"] is None  # Tripwire's extra section takes its defaults

    project = copy.deepcopy(LANGSIGHT_BODY)
    project["loop_detection"]["action"] = "warn"
    assert (await api(tw, "PUT", PROJECT, project))[0] == 200

    # a restart on the same data dir: what the API set is still in force
    tw2 = await start_tripwire(data_dir=data_dir)
    status, again = await api(tw2, "GET", AGENT)
    assert status == 200 and again["is_agent_override"] is True
    assert_has(again, LANGSIGHT_BODY)
    status, proj = await api(tw2, "GET", PROJECT)
    assert proj["loop_detection"]["action"] == "warn"
    assert tw2.engine.guard_config("research-agent").loop_detection.action == "terminate"
    assert tw2.engine.guard_config("someone-else").loop_detection.action == "warn"

    # DELETE: the agent falls back to the project default
    assert (await api(tw2, "DELETE", AGENT))[0] in (200, 204)
    status, back = await api(tw2, "GET", AGENT)
    assert back["is_agent_override"] is False and back["loop_detection"]["action"] == "warn"


@pytest.mark.parametrize(
    "section,field,value",
    [
        ("loop_detection", "action", "explode"),
        ("budget", "soft_alert_threshold_usd", 0.9),  # must be below max_cost_usd (0.50)
        ("circuit_breaker", "open_after_failures", 0),
    ],
)
async def test_invalid_body_is_refused_naming_the_field(
    start_tripwire: StartTripwire, section: str, field: str, value: Any
) -> None:
    tw = await start_tripwire()
    assert (await api(tw, "PUT", AGENT, LANGSIGHT_BODY))[0] == 200
    bad = copy.deepcopy(LANGSIGHT_BODY)
    bad[section][field] = value
    status, body = await api(tw, "PUT", AGENT, bad)
    assert status == 422
    assert field in str(body)
    # the old config stays
    assert tw.engine.guard_config("research-agent").loop_detection.action == "terminate"
    assert tw.engine.guard_config("research-agent").budget.max_cost_usd == 0.5


async def test_a_put_changes_the_very_next_call(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="fine")
    tw = await start_tripwire(upstream={"url": url})
    headers = {"X-Tripwire-Session": "s1", "X-Tripwire-Agent": "research-agent"}
    llm = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=headers)
    for _ in range(2):
        await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    body = {**LANGSIGHT_BODY, "limits": {"max_llm_calls": 2}}
    assert (await api(tw, "PUT", AGENT, body))[0] == 200
    # same session, no restart: the third call is now over the limit
    with pytest.raises(openai.RateLimitError) as caught:
        await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert caught.value.response.json()["error"]["guardrail"] == "max_llm_calls"
    assert len(fake.calls("/v1/chat/completions")) == 2
