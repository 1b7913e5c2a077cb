"""A run's name from its first call (proxy/run_names.py, issue 25): the client's title, else what
the user asked, read from the conversations today's agent CLIs send."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from proxy.dialects import anthropic, openai_responses
from proxy.run_names import last_user_text, run_name, shorten

FIXTURES = Path(__file__).parent / "fixtures"


def body_of(name: str) -> dict[str, Any]:
    data = json.loads((FIXTURES / name).read_text())
    return dict(data.get("body", data))


def test_codex_and_claude_code_runs_are_named_by_the_prompt_not_their_context_blocks() -> None:
    codex = openai_responses.parse_request(body_of("codex_exec_responses_request.json"))
    assert run_name({}, codex.messages, record_content=True) == "PROMPT"  # not <environment_context>
    claude = anthropic.parse_request(body_of("claude_code_messages_request.json"))
    assert run_name({}, claude.messages, record_content=True) == "PROMPT"  # not <system-reminder>


def test_claude_codes_title_request_is_named_by_the_prompt_it_quotes() -> None:
    """Claude Code's first call (recorded with Claude Code 2.1.197) asks for a title of the session,
    quoting the person's prompt in <session> tags before its instructions."""
    title_request = [
        {
            "role": "user",
            "content": "<session>\nadd 2 and 3 with the demo tool\n</session>\n\nWrite a title for this session.",
        }
    ]
    assert last_user_text(title_request) == "add 2 and 3 with the demo tool"
    reminder_then_prompt = [
        {"role": "user", "content": "<system-reminder>\nbe careful\n</system-reminder>\nfix it"}
    ]
    assert last_user_text(reminder_then_prompt) == "fix it"
    assert (
        last_user_text(
            [{"role": "user", "content": "<environment_context><cwd>/x</cwd></environment_context>"}]
        )
        is None
    )
    assert last_user_text([{"role": "user", "content": "use <b>bold</b> here"}]) == "use <b>bold</b> here"


def test_the_latest_user_text_wins_and_tool_results_are_skipped() -> None:
    messages: list[Any] = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": [{"type": "text", "text": "second question"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a b"}]},
    ]
    assert last_user_text(messages) == "second question"
    assert last_user_text([{"role": "system", "content": "be brief"}]) is None


def test_a_name_is_one_short_line_with_secrets_scrubbed() -> None:
    assert shorten("  fix\nthe   build ") == "fix the build"
    long = "Refactor the payment module so that every call to the gateway goes through one retrying client"
    assert shorten(long) == "Refactor the payment module so that every call to the…"
    assert shorten("deploy with key sk-proj-abcdefghijklmnopqrstuvwxyz0123456789") == (
        "deploy with key __REDACTED__"
    )
    assert run_name(
        {"X-Tripwire-Run-Name": "  "}, [{"role": "user", "content": "hi there"}], record_content=True
    ) == (
        "hi there"  # a blank title is no title
    )
    assert run_name({}, [{"role": "user", "content": "hi there"}], record_content=False) is None
