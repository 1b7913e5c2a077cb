"""ConfigDumps: a guard config's recorded dump and its sanitised forms, made once per config."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.config_dumps import ConfigDumps
from proxy.guards.config import GuardConfig, ToolsConfig
from proxy.redact import sanitize

SECRET = "sk-proj-" + "Q1w2E3r4T5" * 3


def hostile() -> GuardConfig:
    """A config whose dump sanitize changes: a secret and a long name among its tool patterns."""
    return GuardConfig(tools=ToolsConfig(deny=(f"leak {SECRET}", "t" * 3000, f"Bearer {SECRET}")))


def test_the_dump_is_recordeds_made_once_per_config() -> None:
    dumps = ConfigDumps()
    config = hostile()
    first = dumps.recorded(config)
    assert first == config.recorded()
    assert dumps.recorded(config) is first
    # a config that dumps alike (another object, e.g. after a write of the same values) shares it
    assert dumps.recorded(hostile()) is first
    other = GuardConfig()
    assert dumps.recorded(other) == other.recorded()
    assert dumps.recorded(other) is not first


@pytest.mark.parametrize("max_field_bytes", [8, 64, 20000])
@pytest.mark.parametrize("depth", [0, 2])
def test_sanitized_is_sanitize_of_the_dump(max_field_bytes: int, depth: int) -> None:
    dumps = ConfigDumps()
    for config in (hostile(), GuardConfig()):
        dump = dumps.recorded(config)
        clean = dumps.sanitized(dump, max_field_bytes, depth)
        expected = sanitize(config.recorded(), max_field_bytes, depth)
        assert orjson.dumps(clean) == orjson.dumps(expected)
        assert dumps.sanitized(dump, max_field_bytes, depth) is clean  # made once
    assert SECRET not in orjson.dumps(dumps.sanitized(dumps.recorded(hostile()), 64, 2)).decode()


def test_a_dict_it_did_not_make_is_sanitised_as_it_comes() -> None:
    dumps = ConfigDumps()
    dumps.recorded(GuardConfig())
    foreign: dict[str, Any] = {"admin_token": "hunter2", "name": "x" * 100}
    first = dumps.sanitized(foreign, 16)
    assert first == sanitize(foreign, 16)
    foreign["name"] = "changed"  # not kept: a caller's dict may change
    assert dumps.sanitized(foreign, 16) == sanitize(foreign, 16)
    # an equal copy of a dump it made is not one it made: sanitised, not looked up by value
    copy = dict(dumps.recorded(GuardConfig()))
    assert dumps.sanitized(copy, 64) == sanitize(copy, 64)


def test_past_its_limit_it_starts_over_and_stays_right() -> None:
    dumps = ConfigDumps(kept=2)
    configs = [GuardConfig(tools=ToolsConfig(deny=(f"tool_{i}",))) for i in range(5)]
    for config in configs * 2:
        dump = dumps.recorded(config)
        assert dump == config.recorded()
        assert dumps.sanitized(dump, 64, 2) == sanitize(config.recorded(), 64, 2)
