"""proxy/history.py: a long conversation's digests and token count go on from its previous request,
walking only the new messages, and always equal a walk of the whole conversation."""

from __future__ import annotations

from typing import Any

import pytest

from proxy import history
from proxy.episodes import _normalised, message_tokens
from proxy.history import RecentConversations, Walked


def conversation(steps: int, task: str = "fix the bug", marked_at: int | None = None) -> list[Any]:
    messages: list[Any] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": task}]
    for i in range(steps):
        messages.append(
            {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function"}]}
        )
        content: Any = f"result {i}"
        if i == marked_at:  # an Anthropic cache_control marker, which lineage leaves out
            content = [{"type": "text", "text": content, "cache_control": {"type": "ephemeral"}}]
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": content})
    return messages


class Counting:
    """normalise, counting the messages it is asked about: a walk asks once per message it walks."""

    def __init__(self) -> None:
        self.walked = 0

    def __call__(self, message: Any) -> Any:
        self.walked += 1
        return _normalised(message)


def whole(messages: list[Any]) -> Walked:
    return Walked(list(messages), _normalised, message_tokens)


def same(a: Walked, b: Walked) -> None:
    assert a.sent == b.sent
    assert a.lineage == b.lineage
    assert a.tokens == b.tokens


@pytest.mark.parametrize("marked_at", [None, 3, 25])
def test_a_continued_conversation_walks_only_its_new_messages(marked_at: int | None) -> None:
    recent = RecentConversations()
    seen = Counting()
    first = recent.walk(conversation(20, marked_at=marked_at), seen, message_tokens)
    same(first, whole(conversation(20, marked_at=marked_at)))
    assert first.tokens  # counted, so the next request goes on from it
    for steps in (21, 22, 30):
        seen.walked = 0
        messages = conversation(steps, marked_at=marked_at)
        walked = recent.walk(messages, seen, message_tokens)
        same(walked, whole(messages))
        assert seen.walked == len(messages) - len(conversation(steps - (1 if steps < 30 else 8)))


def test_an_edited_history_is_walked_whole() -> None:
    recent = RecentConversations()
    recent.walk(conversation(20), _normalised, message_tokens)
    edited = conversation(21)
    edited[5] = {"role": "tool", "tool_call_id": "c1", "content": "compacted"}
    seen = Counting()
    same(recent.walk(edited, seen, message_tokens), whole(edited))
    assert seen.walked == len(edited)


def test_a_token_count_never_taken_is_taken_whole_later() -> None:
    recent = RecentConversations()
    recent.walk(conversation(20), _normalised, message_tokens)  # digests only, no token count
    later = recent.walk(conversation(21), _normalised, message_tokens)
    assert later.tokens == whole(conversation(21)).tokens


def test_short_conversations_are_not_kept_and_the_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history, "MAX_CONVERSATIONS", 3)
    recent = RecentConversations()
    seen = Counting()
    recent.walk(conversation(2), seen, message_tokens)
    recent.walk(conversation(2), seen, message_tokens)
    assert seen.walked == 2 * len(conversation(2))  # below MIN_MESSAGES: walked whole every time
    for n in range(5):
        recent.walk(conversation(20, task=f"task {n}"), _normalised, message_tokens)
    seen.walked = 0
    recent.walk(conversation(21, task="task 0"), seen, message_tokens)
    assert seen.walked == len(conversation(21))  # the oldest conversation was let go
    seen.walked = 0
    recent.walk(conversation(21, task="task 4"), seen, message_tokens)
    assert seen.walked == 2  # the newest is kept


def test_a_kept_conversation_is_keyed_by_its_walks_digest_of_the_first_two_messages() -> None:
    """walk keys a conversation by its sent[2] instead of hashing the first two messages again:
    the same bytes as _key, which find computes; the kept list is a copy of the caller's."""
    recent = RecentConversations()
    messages = conversation(20, marked_at=0)  # lineage forks at once; the sent chain keys it
    walked = recent.walk(messages, _normalised, message_tokens)
    assert walked.sent[2] == RecentConversations._key(messages)
    assert walked.messages == messages and walked.messages is not messages
    messages.append({"role": "user", "content": "and now?"})  # the caller's list changes after
    assert recent.find(messages) is walked
    later = recent.walk(messages, _normalised, message_tokens)
    same(later, whole(messages))
    assert recent.find(messages + [{"role": "user", "content": "more"}]) is later
