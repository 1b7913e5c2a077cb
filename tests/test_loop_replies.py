"""The model's own text, repeated on every nudge (proxy/guards/loop/replies.py, issue 31): read from
a request's messages in the three dialects, judged warn then refuse."""

from __future__ import annotations

from typing import Any

from proxy.dialects import anthropic, openai_chat, openai_responses
from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action
from proxy.guards.loop import replies
from proxy.guards.loop.detector import LoopDetector

TEXT = "I have reviewed the plan. Shall I continue with the next step?"


def chat(texts: list[str], nudge: str = "continue") -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Migrate the orders table."}]
    for text in texts:
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": nudge}]
    return {"model": "gpt-4o", "messages": messages}


def claude(texts: list[str], nudge: str = "continue") -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Migrate the orders table."}]
    for text in texts:
        messages += [
            {"role": "assistant", "content": [{"type": "text", "text": text}]},
            {"role": "user", "content": [{"type": "text", "text": nudge}]},
        ]
    return {"model": "claude-sonnet-4-5", "max_tokens": 512, "messages": messages}


def responses(texts: list[str], nudge: str = "continue") -> dict[str, Any]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "Migrate the orders table."}]
    for text in texts:
        items += [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]},
            {"role": "user", "content": nudge},
        ]
    return {"model": "gpt-5", "input": items, "store": False}


DIALECTS = (
    (openai_chat.parse_request, chat),
    (anthropic.parse_request, claude),
    (openai_responses.parse_request, responses),
)


def echo_of(parse: Any, body: dict[str, Any]) -> replies.Echo | None:
    request = parse(body)
    return replies.repeated_reply(request.dialect, request.messages)


def test_the_same_text_on_every_nudge_is_counted_in_every_dialect() -> None:
    for parse, body in DIALECTS:
        texts = [TEXT if i % 2 else TEXT.upper() + "  " for i in range(4)]  # case and spaces aside
        echo = echo_of(parse, body(texts))
        assert echo is not None and echo.count == 4, parse
        assert echo_of(parse, body(texts[:1])) is None  # once is no repetition


def test_a_changing_text_a_changing_nudge_or_a_tool_call_ends_the_run() -> None:
    for parse, body in DIALECTS:
        assert echo_of(parse, body([f"Part {i}: the {i}th table moves." for i in range(5)])) is None
        texts = ["Done with part one.", TEXT, TEXT, TEXT]
        echo = echo_of(parse, body(texts))
        assert echo is not None and echo.count == 3
    # a user who asks something else is no nudge
    messages = chat([TEXT, TEXT])["messages"] + [{"role": "assistant", "content": TEXT}]
    messages.append({"role": "user", "content": "what is left?"})
    request = openai_chat.parse_request({"model": "gpt-4o", "messages": messages})
    echo = replies.repeated_reply(request.dialect, request.messages)
    assert echo is None
    # an assistant step that called a tool is work, not a repeated reply
    with_tool = chat([TEXT, TEXT])
    with_tool["messages"][-2] = {
        "role": "assistant",
        "content": TEXT,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}],
    }
    with_tool["messages"].insert(-1, {"role": "tool", "tool_call_id": "c1", "content": "a b"})
    request = openai_chat.parse_request(with_tool)
    assert replies.repeated_reply(request.dialect, request.messages) is None


def test_three_warn_threshold_refuses_and_each_level_writes_one_warning() -> None:
    config = LoopDetectionConfig()
    d = LoopDetector(config)
    seen = []
    for k in range(1, 8):
        request = openai_chat.parse_request(chat([TEXT] * k))
        echo = replies.repeated_reply(request.dialect, request.messages)
        decisions = d.check_llm_history(
            request.steps, request.turn_start, request.tool_results, float(k), echo=echo
        )
        seen.append([(x.kind, x.action, x.new_finding) for x in decisions])
    assert seen[:2] == [[], []]
    assert seen[2] == [("repeated_reply", Action.WARN, True)]
    assert seen[3] == [("repeated_reply", Action.WARN, False)]
    assert seen[4] == [("repeated_reply", Action.BLOCK, True)]  # threshold 5, at least BLOCK
    assert seen[5] == [("repeated_reply", Action.BLOCK, False)]


def test_an_echo_is_recorded_and_read_back_for_replay() -> None:
    echo = replies.Echo(4, "ab12", 3, "shall i continue")
    assert replies.Echo.read(echo.record()) == echo
    assert replies.Echo.read(None) is None and replies.Echo.read(["x"]) is None
