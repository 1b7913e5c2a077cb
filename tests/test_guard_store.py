"""GuardConfigStore: precedence, whole-object overrides, persistence across a restart."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from proxy.guard_store import FILE_NAME, GuardConfigStore, GuardStoreError, config_body, config_from_body
from proxy.guards.config import BudgetConfig, GuardConfig, LoopDetectionConfig
from tests.reference_bodies import LANGSIGHT_BODY

STATIC = GuardConfig(loop_detection=LoopDetectionConfig(threshold=7))
STATIC_AGENT = GuardConfig(budget=BudgetConfig(max_cost_usd=2.0))


def make(tmp_path: Path) -> GuardConfigStore:
    return GuardConfigStore(tmp_path / FILE_NAME, STATIC, {"yaml-agent": STATIC_AGENT})


def test_static_sources_without_api(tmp_path: Path) -> None:
    store = make(tmp_path)
    assert store.effective("anyone") == (STATIC, False)
    assert store.effective("yaml-agent") == (STATIC_AGENT, True)
    assert store.agent_source("anyone") == "default"
    assert store.agent_source("yaml-agent") == "static"
    assert store.project_source() == "static"
    assert not (tmp_path / FILE_NAME).exists()


def test_agent_override_replaces_whole_config(tmp_path: Path) -> None:
    store = make(tmp_path)
    override = GuardConfig(budget=BudgetConfig(max_cost_usd=0.5))
    store.put_agent("research", override)
    cfg, is_override = store.effective("research")
    assert is_override
    # no partial merge: the project default's threshold 7 is not carried over
    assert cfg.loop_detection.threshold == 5
    assert cfg.budget.max_cost_usd == 0.5
    assert store.effective("other") == (STATIC, False)
    assert store.delete_agent("research") is True
    assert store.delete_agent("research") is False
    assert store.effective("research") == (STATIC, False)


def test_api_wins_over_static_agent_until_deleted(tmp_path: Path) -> None:
    store = make(tmp_path)
    api = GuardConfig(budget=BudgetConfig(max_cost_usd=9.0))
    store.put_agent("yaml-agent", api)
    assert store.effective("yaml-agent") == (api, True)
    assert store.agent_source("yaml-agent") == "api"
    store.delete_agent("yaml-agent")
    assert store.effective("yaml-agent") == (STATIC_AGENT, True)
    assert store.configured_agents() == ["yaml-agent"]


def test_project_put_and_delete_back_to_static(tmp_path: Path) -> None:
    store = make(tmp_path)
    proj = GuardConfig(loop_detection=LoopDetectionConfig(action="block"))
    store.put_project(proj)
    assert store.project() == proj
    assert store.effective("x") == (proj, False)
    assert store.delete_project() is True
    assert store.project() == STATIC
    assert store.delete_project() is False


def test_persisted_and_survives_restart(tmp_path: Path) -> None:
    store = make(tmp_path)
    proj = GuardConfig(loop_detection=LoopDetectionConfig(threshold=3, action="terminate"))
    agent = GuardConfig(budget=BudgetConfig(max_cost_usd=1.25, soft_alert_threshold_usd=1.0))
    store.put_project(proj)
    store.put_agent("a", agent)
    data = orjson.loads((tmp_path / FILE_NAME).read_bytes())
    assert data["project"]["loop_detection"]["threshold"] == 3
    assert data["agents"]["a"]["budget"]["max_cost_usd"] == 1.25
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]

    # a restart with different static sources: the API values still win
    again = GuardConfigStore(tmp_path / FILE_NAME, GuardConfig(), {})
    assert again.project() == proj
    assert again.effective("a") == (agent, True)
    again.delete_project()
    third = GuardConfigStore(tmp_path / FILE_NAME, STATIC, {})
    assert third.project() == STATIC
    assert third.effective("a") == (agent, True)


def test_bad_file_refuses_start_naming_field(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    path.write_bytes(orjson.dumps({"version": 1, "agents": {"a": {"loop_detection": {"threshold": 1}}}}))
    with pytest.raises(GuardStoreError, match=r"agents\.a\.loop_detection\.threshold"):
        GuardConfigStore(path, STATIC, {})
    path.write_bytes(b"{not json")
    with pytest.raises(GuardStoreError, match="not valid JSON"):
        GuardConfigStore(path, STATIC, {})


def test_body_round_trip_langsight_shape() -> None:
    body = LANGSIGHT_BODY
    cfg = config_from_body(body)
    assert cfg.loop_detection.max_steps == 50
    assert cfg.limits.max_llm_calls is None  # Tripwire's extra section takes its defaults
    out = config_body("research-agent", cfg, True, "api")
    assert out["agent_name"] == "research-agent"
    assert out["is_agent_override"] is True
    assert out["budget"]["soft_alert_threshold_usd"] == 0.4
    # a GET answer sent back as a PUT body is accepted unchanged
    assert config_from_body(out) == cfg


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"loop_detection": {"threshold": "many"}}, "loop_detection.threshold"),
        ({"budget": {"max_cost_usd": 1, "soft_alert_threshold_usd": 2}}, "budget"),
        ({"nonsense": {}}, "nonsense"),
        ({"circuit_breaker": {"cooldown_seconds": -1}}, "circuit_breaker.cooldown_seconds"),
    ],
)
def test_invalid_body_names_field(body: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        config_from_body(body)
    locs = [".".join(str(p) for p in e["loc"]) for e in err.value.errors()]
    assert any(loc.startswith(field) for loc in locs), locs


def test_failed_write_changes_nothing(tmp_path: Path) -> None:
    store = make(tmp_path)
    proj = GuardConfig(loop_detection=LoopDetectionConfig(action="block"))
    store.put_project(proj)
    (tmp_path / FILE_NAME).unlink()
    (tmp_path / FILE_NAME).mkdir()  # os.replace onto a directory fails, as a read-only disk would
    writes = [
        lambda: store.put_agent("research", GuardConfig()),
        lambda: store.put_project(STATIC),
        store.delete_project,
    ]
    for write in writes:
        with pytest.raises(OSError):
            write()
    assert store.effective("research") == (proj, False)
    assert store.project_source() == "api"
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]  # no temp file left behind


def test_an_override_that_omits_shadow_inherits_the_projects_across_a_restart(tmp_path: Path) -> None:
    store = make(tmp_path)
    store.put_project(config_from_body({"shadow": True, **LANGSIGHT_BODY}))
    store.put_agent("quiet", config_from_body(LANGSIGHT_BODY))  # no `shadow`: inherits
    store.put_agent("loud", config_from_body({"shadow": False, **LANGSIGHT_BODY}))  # its own
    for s in (store, make(tmp_path)):
        assert s.effective("quiet")[0].shadow is True
        assert s.effective("loud")[0].shadow is False
        assert s.effective("yaml-agent")[0].shadow is True  # a static override omits it too
    store.put_project(config_from_body(LANGSIGHT_BODY))
    assert store.effective("quiet")[0].shadow is False


def test_the_config_in_force_is_one_object_per_agent_until_a_write(tmp_path: Path) -> None:
    """Asked on every call, `effective` keeps its answer per agent (an override inheriting the
    project's shadow is the same copy each time) and every write puts the new one in force."""
    store = make(tmp_path)
    store.put_agent("inherits", GuardConfig(budget=BudgetConfig(max_cost_usd=0.5)))
    store.put_project(GuardConfig(shadow=True))
    first = store.effective("inherits")
    assert first[0].shadow and store.effective("inherits") is first
    store.put_project(GuardConfig(shadow=False))
    assert not store.effective("inherits")[0].shadow
    assert store.effective("anyone")[0] == GuardConfig(shadow=False)
    store.delete_agent("inherits")
    assert store.effective("inherits") == (GuardConfig(shadow=False), False)
    store.delete_project()
    assert store.effective("inherits") == (STATIC, False)
    store.replace_api(None, {"inherits": STATIC_AGENT})
    assert store.effective("inherits") == (STATIC_AGENT, True)
