"""repeated_reply: the model answers every nudge with the same text and no tool call (issue 31).

A harness that answers each step with "continue" keeps a model going; a model that has nothing left
to do says the same thing again ("Shall I continue with the next step?") on every nudge, with no
tool call, and no tool pattern ever sees it. The conversation an LLM request carries shows it: its
end is the same assistant text (folded as short texts are, per-call noise out:
`volatile.fold_text`, `volatile.stable_text`) answered to the same user words, k times in a row.

`repeated_reply(dialect, messages)` reads that run from the request's messages as sent (Chat
Completions, Anthropic Messages, a Responses input with the model's earlier messages in it: a
chained request naming `previous_response_id` carries only its new input, so the run is not seen
there). `judge(echo, config)` warns at `REPLY_WARN` texts the same and refuses from `threshold` on
(`action`, at least BLOCK: the refusal's synthetic answer ends the turn, which a nudge cannot).

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action
from proxy.guards.loop.pattern import ACTIONS, Firing
from proxy.guards.volatile import FOLD_LIMIT, fold_text, stable_text

KINDS = {"repeated_reply": "the model keeps answering with the same text"}
REPLY_WARN = 3  # the same text this many times in a row warns
MAX_READ = 200  # messages read back from the end (a run longer than that is long enough)
TEXT_LIMIT = 4000  # characters of a reply compared (the rest of a long reply rarely differs alone)


@dataclass(frozen=True, slots=True)
class Echo:
    """The end of a conversation: one text answered to one nudge `count` times in a row."""

    count: int
    text: str  # the reply's digest
    start: int  # the message index where the run begins (names the streak)
    sample: str  # the reply's first words, for the message

    def record(self) -> list[Any]:
        """As the trace and the shared state keep it (replay and replicas judge it the same)."""
        return [self.count, self.text, self.start, self.sample]

    @classmethod
    def read(cls, value: Any) -> Echo | None:
        """A recorded echo (`record`), or None for anything else."""
        if isinstance(value, list | tuple) and len(value) == 4:
            count, text, start, sample = value
            if isinstance(count, int) and isinstance(start, int) and isinstance(text, str):
                return cls(count, text, start, str(sample))
        return None


def _text(content: Any) -> str | None:
    """The words of a message's content (a string, or text parts); None when it holds a tool call
    or a tool result (then it is no plain reply, no plain nudge)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return "" if content is None else None
    words = []
    for part in content:
        if isinstance(part, str):
            words.append(part)
            continue
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("tool_use", "tool_result", "function_call", "function_call_output", "server_tool_use"):
            return None
        text = part.get("text")
        if isinstance(text, str):
            words.append(text)
    return " ".join(words)


def _said(message: Any) -> tuple[str, str] | None:
    """(role, words) of a plain message: a user's or the model's words, no tool call or result."""
    if not isinstance(message, dict):
        return None
    role = message.get("role")
    kind = message.get("type", "message")
    if role not in ("user", "assistant") or kind != "message" or message.get("tool_calls"):
        return None
    text = _text(message.get("content"))
    return None if text is None else (role, text)


def _normal(text: str) -> str:
    text = stable_text(text[:TEXT_LIMIT])
    return fold_text(text) if len(text) <= FOLD_LIMIT else " ".join(text.lower().split())


def _alike(a: str, b: str) -> bool:
    """Two texts the same once folded and without noise. Cheap first: most replies differ in length
    or are the same words already, so the noise rules run only on near misses."""
    if a == b:
        return True
    if abs(len(a) - len(b)) > max(len(a), len(b)) // 5 + 8:
        return False
    return " ".join(a.lower().split()) == " ".join(b.lower().split()) or _normal(a) == _normal(b)


def repeated_reply(dialect: str, messages: Sequence[Any]) -> Echo | None:
    """The run of the same reply to the same nudge at the end of `messages`, or None (fewer than
    two, or the conversation does not end with a nudge after a reply)."""
    if dialect not in ("openai_chat", "anthropic", "openai_responses") or len(messages) < 4:
        return None
    i = len(messages) - 1
    stop = max(-1, i - MAX_READ)
    reply = nudge = ""
    count = 0
    start = i
    while i - 1 > stop:
        said_user, said_model = _said(messages[i]), _said(messages[i - 1])
        if said_user is None or said_model is None or said_user[0] != "user" or said_model[0] != "assistant":
            break
        words, text = said_user[1], said_model[1]
        if not text.strip():
            break
        if count == 0:
            reply, nudge = text, words
        elif not _alike(text, reply) or not _alike(words, nudge):
            break
        count += 1
        start = i - 1
        i -= 2
    if count < 2:
        return None
    normal = _normal(reply)
    digest = hashlib.blake2b(normal.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return Echo(count, digest, start, normal[:60])


def judge(echo: Echo | None, config: LoopDetectionConfig) -> Firing | None:
    """WARN from `REPLY_WARN` replies the same, refused from `threshold` on."""
    if echo is None or echo.count < min(REPLY_WARN, config.threshold):
        return None
    if echo.count >= config.threshold:
        action, limit = max(ACTIONS[config.action], Action.BLOCK), config.threshold
    else:
        action, limit = Action.WARN, REPLY_WARN
    return Firing(
        "repeated_reply",
        ("repeated_reply", echo.start, echo.text, action),
        action,
        f"the model answered the same text {echo.count} times in a row to the same message,"
        f" without a tool call: {echo.sample!r}",
        pattern=echo.sample,
        threshold=limit,
        actual=echo.count,
        repetitions=echo.count,
        window_size=2 * echo.count,
        evidence=(),
    )
