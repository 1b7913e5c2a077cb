"""Tool permissions in the session guards (SPEC §9): an MCP call judged by `SERVER__TOOL`, an LLM
request's history showing a denied call, `ask` patterns; pure, as replay runs them."""

from __future__ import annotations

from typing import Any

from proxy.constants import GUARD_TOOL_ASK, GUARD_TOOL_DENIED
from proxy.guards.config import GuardConfig, ToolsConfig
from proxy.guards.decision import Action
from proxy.guards.describe import describe
from proxy.guards.session import SessionGuards


def guards(**tools: Any) -> SessionGuards:
    return SessionGuards(GuardConfig(tools=ToolsConfig(**tools)), started_at=0.0)


def asking(**tools: Any) -> SessionGuards:
    """A config with `ask` patterns, built past the validator that refuses them until the hold lands."""
    config = GuardConfig.model_construct(**{**dict(GuardConfig()), "tools": ToolsConfig(**tools)})
    return SessionGuards(config, started_at=0.0)


def test_a_denied_mcp_tool_is_blocked_by_its_server_qualified_name() -> None:
    g = guards(deny=("files__write*",))
    v = g.before_tool_call("write_file", {"p": "x"}, now=1.0, server="files")
    assert v.refused and v.reservation is None
    assert v.decision.action is Action.BLOCK and v.decision.guard == GUARD_TOOL_DENIED
    assert v.decision.actual == "files__write_file"
    assert describe(v.decision, False).startswith("[tripwire] denied: tool 'files__write_file'")
    # another server's tool of the same name, and another tool of this server, go through
    assert not g.before_tool_call("write_file", {}, now=2.0, server="notes").refused
    assert not g.before_tool_call("read_file", {}, now=3.0, server="files").refused
    assert g.stats()["budget"]["tool_calls"] == 0  # nothing settled yet; the denied one never reserved


def test_an_allow_list_denies_the_rest() -> None:
    g = guards(allow=("files__read_*",))
    assert not g.before_tool_call("read_file", {}, now=1.0, server="files").refused
    assert g.before_tool_call("list_dir", {}, now=2.0, server="files").decision.guard == GUARD_TOOL_DENIED


def test_a_denied_call_is_not_an_attempt_the_loop_patterns_count() -> None:
    g = SessionGuards(
        GuardConfig.model_validate(
            {"tools": {"deny": ["files__rm"]}, "loop_detection": {"threshold": 2, "action": "block"}}
        ),
        started_at=0.0,
    )
    for i in range(4):
        v = g.before_tool_call("rm", {"p": "/"}, now=float(i), server="files")
        assert [d.guard for d in v.decisions] == [GUARD_TOOL_DENIED]


def test_the_default_config_decides_nothing() -> None:
    g = SessionGuards(GuardConfig(), started_at=0.0)
    assert g.before_tool_call("anything", {}, now=1.0, server="s").decisions == []
    assert g.before_llm_call([[("c1", "rm", {})]], 0, {}, estimate_usd=0.0, now=2.0).decisions == []


def test_a_history_showing_a_denied_call_is_blocked_once() -> None:
    g = guards(deny=("shell",))
    first = [[("c1", "search", {"q": "x"})]]
    assert g.before_llm_call(first, 0, {}, estimate_usd=0.0, now=1.0).decisions == []
    ran_anyway = [*first, [("c2", "shell", {"cmd": "rm -rf /"})]]
    v = g.before_llm_call(ran_anyway, 0, {"c2": ("r", None)}, estimate_usd=0.0, now=2.0)
    assert v.refused and v.decision.action is Action.BLOCK and v.decision.guard == GUARD_TOOL_DENIED
    assert v.decision.actual == "shell"
    # the agent goes on from the blocked answer: that call is not judged again
    later = [*ran_anyway, [("c3", "search", {"q": "y"})]]
    assert g.before_llm_call(later, 0, {}, estimate_usd=0.0, now=3.0).decisions == []


def test_ask_patterns_decide_ask_for_mcp_calls_and_histories() -> None:
    g = asking(ask=("files__write*", "deploy"), deny=("files__write_secret",))
    v = g.before_tool_call("write_file", {}, now=1.0, server="files")
    assert v.decision.action is Action.ASK and v.decision.guard == GUARD_TOOL_ASK
    assert not v.refused and v.reservation is not None  # ASK holds, the ask helper decides the rest
    assert g.before_tool_call("write_secret", {}, now=2.0, server="files").decision.guard == GUARD_TOOL_DENIED
    v = g.before_llm_call([[("c1", "deploy", {})]], 0, {}, estimate_usd=0.0, now=3.0)
    assert v.decision.action is Action.ASK and v.decision.guard == GUARD_TOOL_ASK
    # a denied call in the same history beats the ask
    v = g.before_llm_call(
        [[("c1", "deploy", {})], [("c2", "files__write_secret", {})]], 0, {}, estimate_usd=0.0, now=4.0
    )
    assert v.decision.guard == GUARD_TOOL_DENIED


def test_a_loop_block_beats_an_ask() -> None:
    config = GuardConfig.model_construct(
        **{
            **dict(GuardConfig.model_validate({"loop_detection": {"threshold": 2, "action": "block"}})),
            "tools": ToolsConfig(ask=("s__t",)),
        }
    )
    g = SessionGuards(config, started_at=0.0)
    v = g.before_tool_call("t", {"a": 1}, now=0.0, server="s")
    g.after_tool_call(v.reservation, "t", {"a": 1}, result_fingerprint="r", error=None, now=0.0)
    v = g.before_tool_call("t", {"a": 1}, now=1.0, server="s")
    assert {d.guard for d in v.decisions} >= {GUARD_TOOL_ASK, "loop_detection"}
    assert v.decision.action is Action.BLOCK and v.decision.guard == "loop_detection"
