"""Each dialect's `without_tools` (tool permissions, SPEC §9): the denied tools go, and what names or
forces them goes with them so the upstream does not reject the request."""

from __future__ import annotations

from typing import Any

from proxy.dialects import anthropic, openai_chat, openai_responses


def fn(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {}}}


def not_shell(name: str) -> bool:
    return name != "shell"


def test_chat_drops_a_tool_choice_naming_a_removed_tool() -> None:
    body = {"model": "m", "tools": [fn("search"), fn("shell")], "tool_choice": fn("shell")}
    out = openai_chat.without_tools(body, not_shell)
    assert out == {"model": "m", "tools": [fn("search")]}
    kept = openai_chat.without_tools({**body, "tool_choice": fn("search")}, not_shell)
    assert kept is not None and kept["tool_choice"] == fn("search")


def test_chat_without_any_tool_left_drops_the_tool_options() -> None:
    body = {
        "model": "m",
        "tools": [fn("shell")],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "functions": [{"name": "shell"}],
        "function_call": {"name": "shell"},
    }
    assert openai_chat.without_tools(body, not_shell) == {"model": "m"}


def test_chat_allowed_tools_choice_loses_the_removed_tool() -> None:
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "required", "tools": [fn("search"), fn("shell")]},
    }
    out = openai_chat.without_tools({"tools": [fn("search"), fn("shell")], "tool_choice": choice}, not_shell)
    assert out is not None
    assert out["tool_choice"] == {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "required", "tools": [fn("search")]},
    }


def test_responses_filters_namespaces_and_additional_tools_items() -> None:
    shell = {"type": "function", "name": "shell"}
    search = {"type": "function", "name": "search"}
    body = {
        "tools": [{"type": "namespace", "name": "ns", "tools": [shell]}, search],
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "additional_tools", "tools": [shell, {"type": "web_search"}]},
        ],
        "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [shell, search]},
    }
    out = openai_responses.without_tools(body, not_shell)
    assert out is not None
    assert out["tools"] == [search]  # the emptied namespace went too
    assert out["input"][1] == {"type": "additional_tools", "tools": [{"type": "web_search"}]}
    assert out["input"][0] is body["input"][0]
    assert out["tool_choice"] == {"type": "allowed_tools", "mode": "auto", "tools": [search]}
    assert body["input"][1]["tools"][0] is shell  # the client's body is not changed


def test_responses_required_choice_goes_with_the_last_tool() -> None:
    body = {"tools": [{"type": "function", "name": "shell"}], "tool_choice": "required"}
    assert openai_responses.without_tools(body, not_shell) == {"tools": []}


def test_anthropic_drops_a_choice_of_a_removed_tool_and_any_with_none_left() -> None:
    shell = {"name": "shell", "input_schema": {}}
    search = {"name": "search", "input_schema": {}}
    out = anthropic.without_tools(
        {"tools": [search, shell], "tool_choice": {"type": "tool", "name": "shell"}}, not_shell
    )
    assert out == {"tools": [search]}
    out = anthropic.without_tools({"tools": [search, shell], "tool_choice": {"type": "any"}}, not_shell)
    assert out == {"tools": [search], "tool_choice": {"type": "any"}}
    assert anthropic.without_tools({"tools": [shell], "tool_choice": {"type": "any"}}, not_shell) == {
        "tools": []
    }
