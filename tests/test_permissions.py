"""Tool permissions (SPEC §9) and the gateway's config keys (§5.4): the pure matcher and validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from proxy.guards.config import GuardConfig, ToolsConfig
from proxy.guards.permissions import mcp_tool_name, permission


def test_default_allows_everything() -> None:
    assert not ToolsConfig().restricts
    assert permission(ToolsConfig(), "anything__at_all") == "allow"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("fs__read_file", "allow"),
        ("fs__write_file", "ask"),  # ask beats allow
        ("fs__delete", "deny"),  # deny beats ask and allow
        ("search", "allow"),
        ("shell", "deny"),  # an allow-list denies the rest
        ("fs__deletex", "allow"),  # globs match the whole name
        ("FS__read_file", "deny"),  # case-sensitive, as tool names are
    ],
)
def test_deny_beats_ask_beats_allow(name: str, expected: str) -> None:
    tools = ToolsConfig(allow=("fs__*", "search"), ask=("fs__write*", "fs__delete"), deny=("fs__delete",))
    assert permission(tools, name) == expected


def test_empty_allow_list_denies_everything() -> None:
    assert permission(ToolsConfig(allow=()), "fs__read") == "deny"


def test_mcp_names_are_server_double_underscore_tool() -> None:
    assert mcp_tool_name("github", "create_issue") == "github__create_issue"
    assert permission(ToolsConfig(deny=("github__*",)), mcp_tool_name("github", "create_issue")) == "deny"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tools": {"deny": [""]}}, "tools.deny"),
        ({"tools": {"allow": ["a[b"]}}, "tools.allow"),
        ({"rate_limits": [{"match": "llm", "max_calls": 0, "per_s": 60}]}, "rate_limits.0.max_calls"),
        ({"rate_limits": [{"match": "llm", "max_calls": 5, "per_s": -1}]}, "rate_limits.0.per_s"),
        ({"rate_limits": [{"match": " x", "max_calls": 5, "per_s": 1}]}, "rate_limits.0.match"),
        ({"budget_windows": [{"period": "day"}]}, "budget_windows.0"),
        ({"budget_windows": [{"period": "year", "max_cost_usd": 1}]}, "budget_windows.0.period"),
        (
            {"budget_windows": [{"period": "day", "max_cost_usd": 1, "soft_alert_pct": 120}]},
            "budget_windows.0.soft_alert_pct",
        ),
        (
            {"budget_windows": [{"period": "day", "max_cost_usd": 1}, {"period": "day", "max_tokens": 9}]},
            "budget_windows",
        ),
        ({"budget_timezone": "Mars/Olympus_Mons"}, "budget_timezone"),
        ({"budget_timezone": "../../etc/passwd"}, "budget_timezone"),
        ({"ask_timeout_s": 0}, "ask_timeout_s"),
        ({"ask_fallback": "allow"}, "ask_fallback"),
    ],
)
def test_bad_gateway_config_is_refused_naming_the_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        GuardConfig.model_validate(body)
    assert field in str(caught.value)


def test_gateway_config_round_trips() -> None:
    body = {
        "tools": {"allow": ["fs__*"], "deny": ["fs__rm"]},
        "rate_limits": [
            {"match": "llm", "max_calls": 10, "per_s": 60},
            {"match": "fs__*", "max_calls": 3, "per_s": 1},
        ],
        "budget_windows": [
            {"period": "day", "max_cost_usd": 5, "soft_alert_pct": 80},
            {"period": "month", "max_tokens": 10**7},
        ],
        "budget_timezone": "Europe/Paris",
    }
    config = GuardConfig.model_validate(body)
    assert GuardConfig.model_validate(config.dump()) == config
    assert config.rate_limits[1].match == "fs__*"
    assert config.budget_windows[0].soft_alert_pct == 80
