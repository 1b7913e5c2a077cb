"""The aggregate's names (SPEC §3): `SERVER__TOOL`, owners, Tripwire's cursors, the servers it may
serve (refused at start with the names), and the `/mcp` route."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli import check_startup
from proxy.mcp.aggregate.names import (
    aggregate_problems,
    aggregate_servers,
    decode_cursor,
    encode_cursor,
    owner,
    prefixed,
)
from proxy.routing import Route, RouteError, resolve
from proxy.settings import ConfigError, Settings

NAMES = {"default_agent": "cli", "llm_names": ("fast",), "mcp_names": ("files", "git")}


def settings(tmp_path: Path, **kw: object) -> Settings:
    return Settings.model_validate({"data_dir": tmp_path, **kw})


def test_prefixed_names_and_their_owner() -> None:
    assert prefixed("files", "read") == "files__read"
    assert owner("files__read") == ("files", "read")
    # a tool whose own name has `__` or starts with `_` is still owned unambiguously (first `__`)
    assert owner(prefixed("files", "read__all") or "") == ("files", "read__all")
    assert owner(prefixed("files", "_hidden") or "") == ("files", "_hidden")
    assert owner("files") is None and owner("__x") is None and owner("files__") is None
    assert prefixed("s", "t" * 125) == "s__" + "t" * 125  # 128: the longest MCP tool name
    assert prefixed("s", "t" * 126) is None


def test_cursors_are_tripwires_own_and_checked() -> None:
    key = b"k" * 32
    cursor = encode_cursor("tools/list", {"files": "page-2", "git": "abc"}, key=key)
    assert decode_cursor(cursor, "tools/list", ("files", "git"), key=key) == {"files": "page-2", "git": "abc"}
    assert decode_cursor(cursor, "prompts/list", ("files", "git"), key=key) is None  # another list's
    assert decode_cursor(cursor, "tools/list", ("files",), key=key) is None  # names a server not served
    assert decode_cursor("not-a-cursor!", "tools/list", ("files",), key=key) is None
    assert decode_cursor(None, "tools/list", ("files",), key=key) is None
    # signed: another key's cursor, or one whose servers' cursors were changed, is not Tripwire's
    assert decode_cursor(cursor, "tools/list", ("files", "git"), key=b"x" * 32) is None
    body, _, mac = cursor.partition(".")
    forged = encode_cursor("tools/list", {"files": "page-9"}, key=key).partition(".")[0] + "." + mac
    assert decode_cursor(forged, "tools/list", ("files", "git"), key=key) is None
    assert decode_cursor(body, "tools/list", ("files", "git"), key=key) is None  # unsigned


def test_every_server_unless_narrowed(tmp_path: Path) -> None:
    s = settings(
        tmp_path, mcp={"files": {"url": "http://127.0.0.1:1"}}, mcp_stdio={"local": {"command": "cmd"}}
    )
    assert aggregate_servers(s) == ("files", "local")
    narrowed = settings(tmp_path, mcp={"files": {"url": "http://127.0.0.1:1"}}, mcp_aggregate=["files"])
    assert aggregate_servers(narrowed) == ("files",)
    assert aggregate_problems(s) == [] and aggregate_problems(narrowed) == []


@pytest.mark.parametrize(
    "mcp,narrow,named",
    [
        ({"a": "u", "a_": "u"}, None, ["'a_'", "'a'"]),  # tool `_x` of a and `x` of a_: both a___x
        ({"my__files": "u"}, None, ["'my__files'", "'__'"]),
        ({"has space": "u"}, None, ["'has space'"]),
        ({"x" * 126: "u"}, None, ["longer than 125"]),
        ({"files": "u"}, ["files", "nope"], ["['nope']", "['files']"]),
    ],
)
def test_bad_names_refused_at_start_with_the_names(
    tmp_path: Path, mcp: dict[str, str], narrow: list[str] | None, named: list[str]
) -> None:
    s = settings(
        tmp_path,
        mcp={n: {"url": "http://127.0.0.1:1"} for n in mcp},
        **({"mcp_aggregate": narrow} if narrow is not None else {}),
    )
    with pytest.raises(ConfigError) as refused:
        check_startup(s)
    for name in named:
        assert name in str(refused.value)


def test_a_bad_name_left_out_of_the_aggregate_is_fine(tmp_path: Path) -> None:
    s = settings(
        tmp_path,
        mcp={"a_": {"url": "http://127.0.0.1:1"}, "b": {"url": "http://127.0.0.1:2"}},
        mcp_aggregate=["b"],
    )
    check_startup(s)


def test_the_aggregate_route() -> None:
    for path, agent, session in (
        ("/mcp", "cli", None),
        ("/mcp/", "cli", None),
        ("/agents/bot/mcp", "bot", None),
        ("/agents/bot/sessions/s1/mcp", "bot", "s1"),
    ):
        route = resolve(path, {}, **NAMES)
        assert isinstance(route, Route)
        assert (route.kind, route.agent, route.session, route.aggregated) == (
            "aggregate",
            agent,
            session,
            False,
        )
    # `/mcp/NAME` still names one server; an unknown one is still the 404 listing the names
    direct = resolve("/mcp/files", {}, **NAMES)
    assert isinstance(direct, Route) and direct.kind == "mcp" and not direct.aggregated
    unknown = resolve("/mcp/nope", {}, **NAMES)
    assert isinstance(unknown, RouteError) and unknown.status == 404 and unknown.known == ("files", "git")


def test_no_header_makes_a_direct_call_aggregated() -> None:
    route = resolve("/mcp/files", {"X-Tripwire-Aggregated": "1", "X-Tripwire-Aggregate": "true"}, **NAMES)
    assert isinstance(route, Route) and route.aggregated is False


def test_a_calls_permission_name_is_server__tool_either_way() -> None:
    from proxy.mcp.jsonrpc import MCPToolCall

    direct = MCPToolCall("files", "read", {}, 1, None, None, "streamable")
    aggregated = MCPToolCall("files", "files__read", {}, 1, None, None, "streamable", aggregated=True)
    assert direct.qualified_name == aggregated.qualified_name == "files__read"


def test_list_timeout_from_the_environment(tmp_path: Path) -> None:
    from proxy.settings import load_settings

    loaded = load_settings({}, environ={"TRIPWIRE_LIST_TIMEOUT_S": "2.5"}, cwd=tmp_path, home=tmp_path)
    assert loaded.list_timeout_s == 2.5
