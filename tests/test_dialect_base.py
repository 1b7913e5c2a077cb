"""Shared dialect helpers: prompt estimates (attachments counted sensibly), tool arguments, sniffing,
where a turn begins."""

from __future__ import annotations

import base64

import pytest

from proxy.dialects import anthropic, openai_chat, openai_responses
from proxy.dialects.base import (
    ATTACHMENT_TOKENS,
    BodySniffer,
    ToolCall,
    estimate_prompt_tokens,
    parse_arguments,
    said,
)
from proxy.responses_chain import ResponsesChains

IMAGE = base64.b64encode(bytes(range(256)) * 4000).decode()  # ~1.3 MB of base64


def test_text_is_chars_over_four() -> None:
    req = openai_chat.parse_request({"messages": [{"role": "user", "content": "word " * 800}]})
    assert 1000 <= estimate_prompt_tokens(req) < 1020


def test_inline_images_count_as_attachments_not_by_size() -> None:
    chat = openai_chat.parse_request(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{IMAGE}"}},
                    ],
                }
            ]
        }
    )
    assert ATTACHMENT_TOKENS <= estimate_prompt_tokens(chat) < ATTACHMENT_TOKENS + 50
    claude = anthropic.parse_request(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": IMAGE},
                        }
                    ],
                }
            ]
        }
    )
    assert ATTACHMENT_TOKENS <= estimate_prompt_tokens(claude) < ATTACHMENT_TOKENS + 50


def test_long_prose_is_not_an_attachment() -> None:
    prose = "The quick brown fox jumps over the lazy dog. " * 200
    req = openai_chat.parse_request({"messages": [{"role": "user", "content": prose}]})
    assert estimate_prompt_tokens(req) > len(prose) // 4


def test_parse_arguments() -> None:
    assert parse_arguments('{"a": [1, 2.5]}') == {"a": [1, 2.5]}
    assert parse_arguments("{broken") == "{broken"
    assert parse_arguments("") == {}
    assert parse_arguments({"already": "parsed"}) == {"already": "parsed"}


def test_body_sniffer() -> None:
    sse = BodySniffer()
    assert sse.feed(b"\n") is True and sse.mode is None  # blank bytes: undecided, nothing to decode
    assert sse.feed(b"da") is False and sse.mode == "sse"
    body = BodySniffer()
    assert body.feed(b'  {"error"') is True and body.mode == "body"
    assert body.feed(b": 1}") is True
    assert bytes(body.body) == b'  {"error": 1}'


def test_token_counts_are_read_defensively() -> None:
    from proxy.dialects.base import as_int, openai_usage

    assert [as_int(v) for v in (3, 3.0, 3.5, "3", None, True)] == [3, 3, 0, 0, 0, 0]
    usage = openai_usage({"prompt_tokens": 10.0, "completion_tokens": 2, "prompt_tokens_details": None})
    assert usage is not None and (usage.prompt_tokens, usage.total_tokens, usage.cached_tokens) == (10, 12, 0)
    assert openai_usage(None) is None


# -- turns: a nudge that repeats the turn's words goes on with it (SPEC §5.1) ----------------------


def _chat(*users: str) -> list[dict]:
    """A chat history: each user message followed by one tool-calling step and its result."""
    messages: list[dict] = []
    for i, text in enumerate(users):
        messages.append({"role": "user", "content": text})
        call = {"id": f"c{i}", "type": "function", "function": {"name": "t", "arguments": "{}"}}
        messages.append({"role": "assistant", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "ok"})
    return messages


def _anthropic(*users: str) -> list[dict]:
    """Claude Code's shape: the previous step's tool results and the user's words in one message."""
    messages: list[dict] = []
    for i, text in enumerate(users):
        blocks: list[dict] = (
            [{"type": "tool_result", "tool_use_id": f"t{i - 1}", "content": "ok"}] if i else []
        )
        messages.append({"role": "user", "content": [*blocks, {"type": "text", "text": text}]})
        messages.append(
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "t", "input": {}}]}
        )
    return messages


def _responses(*users: str) -> list[dict]:
    items: list[dict] = []
    for i, text in enumerate(users):
        items.append({"role": "user", "content": [{"type": "input_text", "text": text}]})
        items.append({"type": "function_call", "call_id": f"c{i}", "name": "t", "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": f"c{i}", "output": "ok"})
    return items


PARSERS = {
    "openai_chat": lambda users: openai_chat.parse_request({"messages": _chat(*users)}),
    "anthropic": lambda users: anthropic.parse_request({"messages": _anthropic(*users)}),
    "openai_responses": lambda users: openai_responses.parse_request({"input": _responses(*users)}),
}


@pytest.mark.parametrize("dialect", sorted(PARSERS))
def test_a_nudge_repeating_the_turns_words_continues_it_and_a_new_question_begins_one(dialect: str) -> None:
    parse = PARSERS[dialect]
    assert parse(["Fix the bug", "Continue.", "Continue.", "Continue."]).turn_start == 1  # the first nudge
    assert parse(["Fix the bug", "Continue.", "continue.", "Continue."]).turn_start == 3  # other words
    assert parse(["Fix the bug", "Continue.", "  Continue.\n", "Continue."]).turn_start == 1  # spaces
    assert parse(["Fix the bug", "Continue.", "Now the docs", "Continue."]).turn_start == 3
    req = parse(["Fix the bug", "Fix the bug"])
    assert (req.turn_start, req.turns_opened, req.turn_said) == (0, 1, said("Fix the bug"))


def test_a_chat_history_read_on_from_before_keeps_the_turns_words() -> None:
    first = openai_chat.parse_request({"messages": _chat("Fix the bug", "Continue.")})
    longer = _chat("Fix the bug", "Continue.", "Continue.")
    assert first.parsed is not None and first.parsed.turn_said == said("Continue.")
    assert openai_chat.parse_request_from({"messages": longer}, first.parsed).turn_start == 1
    assert openai_chat.parse_request({"messages": longer}).turn_start == 1


def test_a_responses_chain_nudged_with_the_same_words_keeps_its_turn() -> None:
    chains = ResponsesChains()

    def ask(previous: str | None, items: list[dict], answer_id: str) -> int:
        call = openai_responses.parse_request({"input": items, "previous_response_id": previous})
        history = chains.history("bot", call)
        chains.remember_answer("bot", call, answer_id, [ToolCall(f"{answer_id}-c", "t", {})])
        return history.turn_start

    def step(previous: str, text: str) -> list[dict]:
        output = {"type": "function_call_output", "call_id": f"{previous}-c", "output": "ok"}
        return [output, {"role": "user", "content": text}]

    assert ask(None, [{"role": "user", "content": "Fix the bug"}], "r1") == 0
    assert ask("r1", step("r1", "Continue."), "r2") == 1  # other words than the task's: a turn
    assert ask("r2", step("r2", "Continue."), "r3") == 1  # the same words: the same turn
    assert ask("r3", step("r3", "Continue."), "r4") == 1
    assert ask("r4", step("r4", "Now the docs"), "r5") == 4
