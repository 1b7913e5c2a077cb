"""What an LLM call writes to the trace, built without a pipeline (proxy/llm_trace.py): the prompt
messages new since the session's previous call, the usage counts, a failed tool's error text. The
whole LLM_CALL and TOOL_CALL events are tests/test_stage_record.py's and tests/test_stage_tool_results.py's."""

from __future__ import annotations

from proxy.constants import DEPTH_LIMIT
from proxy.dialects import openai_chat, openai_responses
from proxy.dialects.base import Usage
from proxy.llm_trace import error_text, new_prompt_messages, usage_dict
from proxy.sessions import Conversation
from tests.factories import chat_request, responses_request


def test_only_the_messages_new_since_the_previous_call_are_recorded() -> None:
    conversation = Conversation()
    first = openai_chat.parse_request(chat_request("hello"))
    prompt, digest = new_prompt_messages(conversation, first, full=False)
    assert prompt == first.messages  # the first call: all of it
    conversation.prompt_messages_seen, conversation.prompt_digest = len(first.messages), digest
    more = [*first.messages, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "again"}]
    second = openai_chat.parse_request({**chat_request("x"), "messages": more})
    assert new_prompt_messages(conversation, second, full=False)[0] == more[len(first.messages) :]
    assert new_prompt_messages(conversation, second, full=True)[0] == more  # record_full_prompts
    edited = openai_chat.parse_request(
        {**chat_request("x"), "messages": [{"role": "user", "content": "no"}, *more[1:]]}
    )
    assert new_prompt_messages(conversation, edited, full=False)[0] == edited.messages  # another history


def test_a_responses_chain_records_its_input_as_sent() -> None:
    conversation = Conversation(prompt_messages_seen=1)
    call = openai_responses.parse_request(responses_request("more", previous_response_id="resp_1"))
    assert new_prompt_messages(conversation, call, full=False)[0] == call.messages


def test_usage_counts_name_cache_tokens_only_when_there_are_some() -> None:
    assert usage_dict(None) == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    assert usage_dict(Usage(3, 2, 5)) == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    cached = usage_dict(Usage(3, 2, 5, cached_tokens=1))
    assert cached["cached_tokens"] == 1 and cached["cache_creation_tokens"] == 0


def test_a_failed_tools_error_text_is_short_even_when_deeply_nested() -> None:
    assert error_text("x" * 900) == "x" * 500
    assert error_text({"code": 1}) == "{'code': 1}"
    deep: object = "bottom"
    for _ in range(5000):  # deeper than repr can go (RecursionError)
        deep = [deep]
    text = error_text(deep)
    assert text.startswith("[" * DEPTH_LIMIT) and len(text) <= 500  # capped, as JSON
    assert "bottom" not in text
