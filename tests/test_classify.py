"""The classifier alone (proxy/classify/, issue 30): paths normalised once, each call's type, whether
policy applies, the one tool-naming rule, who owns an aggregated resource URI. Pure: no server."""

from __future__ import annotations

import pytest

from proxy.classify import paths
from proxy.classify.calls import (
    LLMCall,
    MCPCall,
    MCPMessage,
    Relayed,
    SocketCall,
    Unknown,
    classify_http,
    classify_llm,
    classify_mcp,
    classify_socket,
)
from proxy.classify.policy import fail_closed, policy_applies
from proxy.guards import tool_names
from proxy.guards.config import GuardConfig
from proxy.mcp.aggregate.resources import Ambiguous, ResourceOwners
from proxy.routing import Route, resolve


def upstream_path(path: str) -> str:
    route = resolve(path, {}, default_agent="a", llm_names=("x",), mcp_names=("fs",))
    assert isinstance(route, Route), route
    return route.path


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/chat%2Fcompletions", "/v1/chat/completions"),
        ("/v1/chat/completions;x=1", "/v1/chat/completions"),
        ("/v1/chat;b/completions;c", "/v1/chat/completions"),
        ("/v1/chat/completions%20", "/v1/chat/completions"),
        ("/v1/chat/completions%20%09%0A", "/v1/chat/completions"),
        ("/v1//chat///completions", "/v1/chat/completions"),
        ("/v1/chat/completions/", "/v1/chat/completions/"),
        ("/v1/files/a%20b", "/v1/files/a%20b"),  # an inner space stays, encoded
        ("/v1/files/%25", "/v1/files/%25"),
        ("/agents/bot/sessions/s1/v1/models", "/v1/models"),
        ("/llm/x/v1/chat%2fcompletions", "/v1/chat/completions"),
        ("/mcp/fs", ""),
        ("/mcp/fs/", "/"),
        ("/mcp/fs/messages/", "/messages/"),
    ],
)
def test_paths_are_decoded_and_normalised_once(path: str, expected: str) -> None:
    assert upstream_path(path) == expected
    # normalising is idempotent: the normalised path reads as itself
    if expected.startswith("/v1"):
        assert upstream_path(expected) == expected


@pytest.mark.parametrize("path", ["/v1/../admin", "/v1/%2e%2e/x", "/v1/.;x/models", "/v1/%2E%20/models"])
def test_dot_segments_are_refused_however_spelled(path: str) -> None:
    found = resolve(path, {}, default_agent="a", llm_names=(), mcp_names=())
    assert not isinstance(found, Route) and found.status == 400


def test_a_route_prefix_is_spelled_exactly() -> None:
    """`/v1`, `/llm/NAME`, `/mcp/NAME` are matched as decoded: another spelling is no route (404)."""
    for path in ("/v1;a/chat/completions", "/mcp/fs;x", "/mcp/fs%20", "/llm/x;y/v1/models"):
        found = resolve(path, {}, default_agent="a", llm_names=("x",), mcp_names=("fs",))
        assert not isinstance(found, Route) and found.status == 404, path


def test_segments() -> None:
    assert paths.segments(["a%2Fb", "", " c ;p", "d"]) == ["a", "b", "c", "d"]
    assert paths.normalised([]) == ""


@pytest.mark.parametrize(
    ("path", "dialect", "canonical"),
    [
        ("/v1/chat/completions", "openai_chat", "/v1/chat/completions"),
        ("/v1/chat/Completions", "openai_chat", "/v1/chat/completions"),
        ("/V1/CHAT/COMPLETIONS", "openai_chat", "/v1/chat/completions"),
        ("/chat/completions", "openai_chat", "/chat/completions"),
        (
            "/openai/deployments/MyModel/chat/Completions",
            "openai_chat",
            "/openai/deployments/MyModel/chat/completions",
        ),
        ("/v1/Responses", "openai_responses", "/v1/responses"),
        ("/v1/messages", "anthropic", "/v1/messages"),
        ("/v1/embeddings", "embeddings", "/v1/embeddings"),
        ("/v1/completions", "completions", "/v1/completions"),
    ],
)
def test_an_llm_post_is_its_dialect_in_the_dialects_spelling(path: str, dialect: str, canonical: str) -> None:
    call = classify_llm(path, "POST")
    assert isinstance(call, LLMCall)
    assert (call.dialect, call.path) == (dialect, canonical)


@pytest.mark.parametrize(
    ("method", "path", "operation"),
    [
        ("GET", "/v1/models", "read"),
        ("GET", "/v1/responses/resp_1", "read"),
        ("DELETE", "/v1/files/f1", "delete"),
        ("POST", "/v1/files", "files"),
        ("POST", "/v1/messages/count_tokens", "count_tokens"),
        ("POST", "/v1/responses/input_tokens", "count_tokens"),
        ("POST", "/v1/responses/resp_1/cancel", "cancel"),
        ("POST", "/v1/responses/compact", "compact"),
    ],
)
def test_known_operations_without_a_dialect_are_relayed(method: str, path: str, operation: str) -> None:
    assert classify_llm(path, method) == Relayed(operation)


@pytest.mark.parametrize("path", ["/v1/chat/completionz", "/v1/threads/t1/messages", "/v1/realtime", "/v1"])
def test_any_other_post_is_unknown_naming_its_path(path: str) -> None:
    call = classify_llm(path, "POST")
    assert isinstance(call, Unknown) and path in call.what


def test_sockets() -> None:
    route = Route("llm", "default", "/v1/Responses", "a", None, "")
    assert classify_socket(route) == SocketCall("openai_responses", "/v1/responses")
    for path in ("/v1/realtime", "/v1/chat/completions"):
        assert isinstance(classify_socket(Route("llm", "default", path, "a", None, "")), Unknown)
    assert isinstance(classify_socket(Route("mcp", "fs", "/ws", "a", None, "")), Unknown)


def test_mcp_messages_every_batch_element_and_id_less_calls() -> None:
    body = (
        b'[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"rm"}},'
        b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":"ls"}},'
        b'{"jsonrpc":"2.0","id":2,"result":{}},{"jsonrpc":"2.0","method":"notifications/x"},7]'
    )
    call = classify_mcp(body)
    assert isinstance(call, MCPCall) and call.batch
    assert call.messages == (
        MCPMessage("request", "tools/call", "rm"),
        MCPMessage("notification", "tools/call", "ls"),
        MCPMessage("response", None, None),
        MCPMessage("notification", "notifications/x", None),
        MCPMessage("invalid", None, None),
    )
    assert [m.tool for m in call.tool_calls] == ["rm", "ls"]
    single = classify_mcp(b'{"jsonrpc":"2.0","id":"a","method":"tools/list"}')
    assert isinstance(single, MCPCall) and not single.batch and single.tool_calls == ()
    assert isinstance(classify_mcp(b"{not json"), Unknown)
    route = Route("mcp", "fs", "", "a", None, "")
    assert classify_http(route, "GET", b"") == Relayed("get")
    assert classify_http(route, "POST", body) == call


def test_policy_applies() -> None:
    assert not policy_applies(GuardConfig(), keys_required=False)  # the defaults only warn
    assert policy_applies(GuardConfig(), keys_required=True)
    for config in (
        {"tools": {"deny": ["x"]}},
        {"tools": {"ask": ["x"]}},
        {"tools": {"allow": ["x"]}},
        {"rate_limits": [{"match": "llm", "max_calls": 1, "per_s": 1}]},
        {"budget_windows": [{"period": "day", "max_cost_usd": 1}]},
        {"budget": {"max_cost_usd": 1}},
        {"limits": {"max_llm_calls": 3}},
        {"loop_detection": {"action": "block"}},
    ):
        guards = GuardConfig.model_validate(config)
        assert policy_applies(guards, keys_required=False), config
        assert not policy_applies(guards.model_copy(update={"shadow": True}), keys_required=False)
        assert fail_closed(guards, False, passthrough_unknown=False)
        assert not fail_closed(guards, True, passthrough_unknown=True)


def test_the_one_tool_naming_rule() -> None:
    assert tool_names.qualified("fs", "rm") == "fs__rm"
    # a direct route's tool is always qualified, whatever its own name looks like
    assert tool_names.policy_name("fs", "fs__rm") == "fs__fs__rm"
    assert tool_names.policy_name(tool_names.naming_server("fs", aggregated=False), "rm") == "fs__rm"
    # an aggregated call already carries SERVER__TOOL
    assert tool_names.policy_name(tool_names.naming_server("fs", aggregated=True), "fs__rm") == "fs__rm"
    assert tool_names.split("fs__read__all") == ("fs", "read__all")
    assert tool_names.split("plain") is None


def test_resource_owners() -> None:
    owners = ResourceOwners()
    owners.resource("file:///a", "one")
    owners.resource("file:///a", "one")
    owners.resource("file:///b", "one")
    owners.resource("file:///b", "two")
    assert owners.owner("file:///a") == "one"
    assert owners.owner("file:///b") == Ambiguous(("one", "two"))
    assert owners.template("file:///docs/{name}", "one")
    assert owners.template("file:///docs/{+rest}", "two")
    assert not owners.template("{uri}", "two") and not owners.template("{+uri}", "two")
    assert owners.template("db://{table}/{id}", "two")
    assert owners.owner("file:///docs/readme") == Ambiguous(("one", "two"))  # equal literal starts
    assert owners.owner("file:///docs/deep/er") == "two"  # only `{+rest}` matches a '/'
    assert owners.owner("db://users/7") == "two"
    assert owners.owner("https://x/y") is None
    owners.resource("file:///docs/readme", "one")  # a listed URI beats every template
    assert owners.owner("file:///docs/readme") == "one"
