"""A run's name: what the run is about, rather than `AGENT auto-337769a72f30`.

RUN_START (and run.json's `run_name`) is written when the session's first call arrives, after that
call was parsed, so the name comes from it: a title the client sends (the `X-Tripwire-Run-Name`
header, never forwarded), else what the user asked in that call's conversation (its last user
message's text, skipping the context blocks agent CLIs send as user messages wrapped in tags:
Codex's `<environment_context>`, Claude Code's `<system-reminder>`; Claude Code's first call asks
for a title of the prompt it quotes in `<session>`, which is then read), on one line, shortened. A run
whose first call has no conversation (an MCP call), or recorded without content, keeps
`AGENT SESSION_ID`. The viewer's Rename (POST /api/runs/{id}/rename) still changes it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from proxy.redact import scrub_text, valid_unicode

RUN_NAME_HEADER = "X-Tripwire-Run-Name"
MAX_NAME_CHARS = 60
WINDOW_CHARS = 2000  # of the text, read to make the name
# text parts of a user message, as the dialects spell them (chat, Responses, Anthropic)
_TEXT_PARTS = ("text", "input_text")
# a `<tag ...>...</tag>` block at the start of a text (Codex's <environment_context>, Claude Code's
# <system-reminder>): context the client adds, not the person's words
_LEADING_BLOCK = re.compile(r"\s*<([A-Za-z][\w-]*)\b[^>]*>(.*?)</\1\s*>", re.DOTALL)
QUOTING_TAG = "session"


def default_name(agent: str, session_id: str) -> str:
    return f"{agent} {session_id}"


def run_name(headers: Mapping[str, str], messages: list[Any] | None, *, record_content: bool) -> str | None:
    """The first call's name for its run, or None (the default name then)."""
    title = headers.get(RUN_NAME_HEADER)
    if title and title.strip():
        return shorten(title)
    if not record_content or not messages:
        return None  # a prompt's words must not reach run.json when content is not recorded
    asked = last_user_text(messages)
    return shorten(asked) if asked else None


def last_user_text(messages: list[Any]) -> str | None:
    """The text of the latest user message that has some (tool results and tagged context skipped)."""
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        parts = [content] if isinstance(content, str) else content if isinstance(content, list) else []
        for part in reversed(parts):
            text = part if isinstance(part, str) else _part_text(part)
            asked = _untagged(text) if text else None
            if asked:
                return asked
    return None


def _part_text(part: Any) -> str | None:
    if isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str):
        return str(part["text"])
    return None


def _untagged(text: str) -> str | None:
    """What the person typed: the text after the `<tag>...</tag>` context blocks an agent CLI puts
    first (None when nothing else is there); but a leading `<session>` block is Claude Code's
    title request quoting the person's prompt, so its inside is what the run is about."""
    rest = text
    while True:
        block = _LEADING_BLOCK.match(rest)
        if block is None:
            break
        if block.group(1) == QUOTING_TAG and block.group(2).strip():
            return block.group(2).strip()
        rest = rest[block.end() :]
    rest = rest.strip()
    return rest or None


def shorten(text: str) -> str:
    """One line of at most MAX_NAME_CHARS characters, cut at a word, secrets scrubbed (before the
    cut: a key cut in half would no longer look like one). Only the start is read: a pasted file
    as a prompt costs no more than a sentence."""
    line = " ".join(scrub_text(valid_unicode(text[:WINDOW_CHARS])).split())
    if len(line) <= MAX_NAME_CHARS:
        return line
    cut = line[: MAX_NAME_CHARS - 1]
    space = cut.rfind(" ")
    if space >= MAX_NAME_CHARS // 2:
        cut = cut[:space]
    return cut.rstrip(" ,.;:") + "…"
