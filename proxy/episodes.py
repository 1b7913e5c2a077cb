"""Which episode a call belongs to, when the agent names no session (SPEC §3 "Session").

An automatic session is one episode of an agent: one `codex exec`, one `claude -p`, one
conversation of an SDK script. This module reads what a request says about its episode; the
`SessionManager` (proxy/sessions.py) decides the run from it. Two kinds of evidence:

- an **announced** id: a session or conversation id the client sends with every request of the
  episode. It alone decides: same id, same run (sub-agents and compaction included); new id, new
  run. `EXTRACTORS` is the table of where clients put it, first match wins;
- **lineage**, only when nothing is announced: the newest answer the request's history carries
  (`answer`: a key of that answer and of the conversation before it; the run that gave the answer
  is the request's run), the Responses API `previous_response_id` (a response the run produced),
  and digests of every prefix of the conversation. A request whose history carries no answer is a
  conversation's first request: it starts a run of its own, even when another conversation began
  with the same words (an evaluation batch running one task six times is six runs).

A call that carries no conversation (an MCP tool call, embeddings, legacy completions, a body
too broken to read its history) has neither; it joins the agent's most recently used automatic run.

Pure: headers, the parsed body and the parsed `LLMRequest` in, an `Episode` out.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.dialects import of_call
from proxy.dialects.base import CHARS_PER_TOKEN, TOKENS_PER_MESSAGE, estimate_value_tokens
from proxy.dialects.openai_responses import CALL_ITEM_TYPES, CLIENT_ITEM_TYPES
from proxy.history import FIND, RecentConversations, Walked

MAX_ID_CHARS = 256  # a longer announced id is not an id (a prompt pasted into a header): ignored
_PRINTABLE = re.compile(r"[\x21-\x7e][\x20-\x7e]*")


@dataclass(slots=True)
class Episode:
    """What one request says about its episode (read-only; not frozen: one is made per call, and a
    frozen dataclass pays a guarded setattr per field)."""

    announced: str | None = None  # the client's own episode id
    source: str | None = None  # which extractor found it (recorded in tripwire.json)
    # digests of messages[:1], messages[:2], ... messages[:n], shortest first; the last is the
    # request's whole history, which the run remembers for the requests that continue it
    history: tuple[bytes, ...] = ()
    previous_response_id: str | None = None
    # the newest answer the history carries (`answer_key`), and how many messages precede it; None:
    # the history carries no answer (a conversation's first request)
    answer: bytes | None = None
    answer_at: int = 0

    @property
    def has_lineage(self) -> bool:
        return bool(self.history) or self.previous_response_id is not None

    @property
    def first(self) -> bool:
        """A conversation's first request: no earlier answer in its history, no previous response."""
        return self.answer is None and self.previous_response_id is None


NO_CONVERSATION = Episode()


def clean_id(value: Any) -> str | None:
    """An announced id as Tripwire keys it: a printable string of at most MAX_ID_CHARS, else None."""
    if not isinstance(value, str):
        return None
    value = value.strip()
    if not value or len(value) > MAX_ID_CHARS or not _PRINTABLE.fullmatch(value):
        return None
    return value


class _header:  # noqa: N801 (an extractor, as the functions of the table below)
    """The id a client sends in one header (`announced` reads `name` itself: most requests send
    none of these headers, and a lookup is all it takes to see that)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, headers: Mapping[str, str], body: dict[str, Any]) -> str | None:
        return clean_id(headers.get(self.name))


_CLAUDE_LEGACY_USER_ID = re.compile(r"_session_([0-9A-Za-z-]{8,})$")


def claude_code_metadata(headers: Mapping[str, str], body: dict[str, Any]) -> str | None:
    """Anthropic Messages `metadata.user_id` as Claude Code fills it: the session part only.

    Older versions: `user_<sha256>_account_<uuid>_session_<uuid>`; newer ones: a JSON string
    `{"device_id": ..., "account_uuid": ..., "session_id": ...}`. A plain user id (any other SDK
    user) names a user, not an episode: ignored.
    """
    metadata = body.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    if not isinstance(user_id, str):
        return None
    if user_id.startswith("{"):
        try:
            parsed = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return None
        return clean_id(parsed.get("session_id")) if isinstance(parsed, dict) else None
    m = _CLAUDE_LEGACY_USER_ID.search(user_id)
    return clean_id(m.group(1)) if m else None


class body_field:  # noqa: N801 (an extractor, as the functions of the table below)
    """The id a client sends in one top-level body field."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, headers: Mapping[str, str], body: dict[str, Any]) -> str | None:
        return clean_id(body.get(self.name))


def responses_conversation(headers: Mapping[str, str], body: dict[str, Any]) -> str | None:
    """Responses API `conversation`: a Conversations API id, `"conv_..."` or `{"id": "conv_..."}`."""
    conversation = body.get("conversation")
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
    return clean_id(conversation)


# Where clients announce their episode, first match wins. Add a client: one row (see docs/sessions.md).
EXTRACTORS: tuple[tuple[str, Callable[[Mapping[str, str], dict[str, Any]], str | None]], ...] = (
    # Claude Code >= 2.1.86: one UUID per session, on every Messages request
    ("header:x-claude-code-session-id", _header("X-Claude-Code-Session-Id")),
    # Codex CLI (codex-rs): the session (thread) UUID, `session_id` (older builds also send
    # `conversation_id` with the same value; some builds and ports spell it `session-id`)
    ("header:session_id", _header("session_id")),
    ("header:session-id", _header("session-id")),
    ("header:conversation_id", _header("conversation_id")),
    # OpenCode's per-conversation header, and the generic one some gateways and agents send
    ("header:x-opencode-session", _header("x-opencode-session")),
    ("header:x-session-id", _header("x-session-id")),
    # Claude Code before the header: the session inside metadata.user_id
    ("body:metadata.user_id", claude_code_metadata),
    # Codex sets prompt_cache_key to its session id (Responses; Chat Completions has the field too)
    ("body:prompt_cache_key", body_field("prompt_cache_key")),
    # Responses API conversation state (the OpenAI Agents SDK's `conversation_id` lands here)
    ("body:conversation", responses_conversation),
)


# the top-level body field each body extractor reads first: without it, it finds nothing
_BODY_FIELD: dict[Callable[[Mapping[str, str], dict[str, Any]], str | None], str] = {
    claude_code_metadata: "metadata",
    responses_conversation: "conversation",
}


def _where(
    extract: Callable[[Mapping[str, str], dict[str, Any]], str | None],
) -> tuple[str | None, str | None]:
    """(the header, the top-level body field) an extractor finds nothing without (None: unknown)."""
    if isinstance(extract, _header):
        return extract.name, None
    if isinstance(extract, body_field):
        return None, extract.name
    return None, _BODY_FIELD.get(extract)


# EXTRACTORS as `announced` reads them, with where each one looks worked out once
_PLAN = tuple((source, *_where(extract), extract) for source, extract in EXTRACTORS)


def announced(headers: Mapping[str, str], body: dict[str, Any] | None) -> tuple[str, str] | None:
    """(source, id) of the first extractor that finds an episode id in the request, else None.

    Most requests announce nothing: an extractor whose header or body field is absent is skipped
    without being called."""
    body = body if isinstance(body, dict) else {}
    get = headers.get
    for source, header, field_name, extract in _PLAN:
        if header is not None:
            if get(header) is None:
                continue
        elif field_name is not None and field_name not in body:
            continue
        try:
            value = extract(headers, body)
        except Exception:  # a malformed field names no episode; never fail the call over it
            value = None
        if value is not None:
            return source, value
    return None


def _normalised(message: Any) -> Any:
    """A message as lineage and the prompt delta compare it: without Anthropic `cache_control`
    markers, which clients move to the newest blocks on every request (the earlier messages are
    otherwise unchanged), and a content of one text block as its text, which is what such a block
    becomes when its marker moves on (Claude Code 2.1.332 sends a mid-conversation system message as
    `[{"type": "text", "text": T, "cache_control": ...}]`, then as `T`; both APIs read them alike)."""
    if not isinstance(message, dict):
        return message
    content = message.get("content")
    if isinstance(content, list):
        if len(content) == 1 and _plain_text_block(content[0]):
            out = {k: v for k, v in message.items() if k != "cache_control"}
            out["content"] = content[0]["text"]
            return out
        marked = any(isinstance(b, dict) and "cache_control" in b for b in content)
    else:
        marked = False
    if "cache_control" not in message and not marked:
        return message
    out = {k: v for k, v in message.items() if k != "cache_control"}
    if isinstance(content, list):
        out["content"] = [
            {k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) else b
            for b in content
        ]
    return out


_TEXT_BLOCK_KEYS = frozenset({"type", "text", "cache_control"})


def _plain_text_block(block: Any) -> bool:
    """A text block that says nothing but its text (no citations or other fields)."""
    return (
        isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
        and _TEXT_BLOCK_KEYS.issuperset(block)
    )


RECENT = RecentConversations()  # process-wide and bounded (proxy/history.py)


def message_tokens(message: Any) -> int:
    """A message's share of the prompt estimate (`dialects.base.estimate_prompt_tokens`)."""
    if type(message) is dict:  # the usual message, all short strings ({"role", "content"}): counted here
        total = len(message) + TOKENS_PER_MESSAGE
        for value in message.values():
            if type(value) is not str or len(value) >= 2048:
                return estimate_value_tokens(message) + TOKENS_PER_MESSAGE
            total += (len(value) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
        return total
    return estimate_value_tokens(message) + TOKENS_PER_MESSAGE


def digest_chains(messages: list[Any]) -> Walked:
    """The digest of every prefix of a conversation, from the empty one to the whole: as sent
    (`.sent`) and as `_normalised` reads them (`.lineage`: lineage and the prompt delta), in one
    pass; the chains are one list until a message reads differently (a marker, one text block)."""
    return Walked(messages, _normalised, message_tokens)


def call_digests(call: Any) -> Walked:
    """A parsed request's conversation walked once per request (kept in its memo) for the session
    lookup, the prompt estimate and the recorded prompt delta alike; a long conversation's walk
    goes on from its previous request's (proxy/history.py)."""
    memo = call.memo
    found = memo.get("digests")
    if found is None:
        # the parse stage may have found the request this one continues already (PRIOR)
        found = memo["digests"] = RECENT.walk(
            call.messages, _normalised, message_tokens, memo.get(PRIOR, FIND)
        )
        parsed = call.parsed
        if parsed is not None and parsed.messages == len(found.messages):
            found.parsed = parsed  # a later request resending these messages reads only its new ones
    return found


PRIOR = "prior"  # memo key: the kept request a call's messages were proven to continue (or None)


# the kept earlier request a request's messages continue, for the parse stage (proxy/history.py)
find_prior = RECENT.find


def history_digests(messages: list[Any]) -> tuple[bytes, ...]:
    """The digest of every non-empty prefix of a conversation, shortest first, in one pass."""
    return tuple(digest_chains(messages).lineage[1:])


# --- answers: what ties a conversation's later requests to the run that answered it ------------

# Responses items of the model's own making that name a call (the ids its result reports): every
# call item type the dialect reads, hosted ones included (a web search's `id` is its call's id)
_CALL_ITEMS = frozenset(CALL_ITEM_TYPES)


def _is_answer(message: Any) -> bool:
    """A message (or Responses item) the model wrote: an assistant message, a call, reasoning."""
    if not isinstance(message, dict):
        return False
    role = message.get("role")
    if role is not None:
        return role == "assistant"
    kind = message.get("type")  # Responses items without a role: calls and reasoning, not their outputs
    return (
        isinstance(kind, str)
        and kind != "message"
        and kind not in CLIENT_ITEM_TYPES
        and not kind.endswith("_output")
    )


def fingerprint(call_ids: Iterable[str], text: str) -> str:
    """What identifies one answer, as its result reports it and as the client sends it back: the
    ids of the tool calls it asked for (unique per answer from real providers; arguments a client
    may re-serialise), else its text."""
    ids = [i for i in call_ids if i]
    return "ids:" + ",".join(ids) if ids else "text:" + text.strip()


def _fingerprint_of(messages: list[Any]) -> str:
    """`fingerprint` of an answer as a history carries it (one or more consecutive messages)."""
    ids: list[str] = []
    texts: list[str] = []
    for message in messages:
        for tc in message.get("tool_calls") or ():  # chat
            if isinstance(tc, dict) and isinstance(tc.get("id"), str):
                ids.append(tc["id"])
        if message.get("type") in _CALL_ITEMS:  # Responses
            ids.append(str(message.get("call_id") or message.get("id") or ""))
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for block in content:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "tool_use" and isinstance(block.get("id"), str):  # Anthropic
                    ids.append(block["id"])
                elif block.get("type") in ("text", "output_text") and isinstance(block.get("text"), str):
                    texts.append(block["text"])
    return fingerprint(ids, "".join(texts))


def answer_key(prefix: bytes, answer_fingerprint: str) -> bytes:
    """The key of an answer given to a conversation whose history digest (lineage) was `prefix`."""
    data = prefix + answer_fingerprint.encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=16).digest()


def last_answer(messages: list[Any]) -> tuple[int, str] | None:
    """(how many messages precede the newest answer the history carries, its fingerprint), or None
    when it carries none. Walks back from the end: only the messages after that answer are read."""
    i = len(messages) - 1
    while i >= 0 and not _is_answer(messages[i]):
        i -= 1
    if i < 0:
        return None
    start = i
    while start > 0 and _is_answer(messages[start - 1]):
        start -= 1
    return start, _fingerprint_of(messages[start : i + 1])


def given_answer_key(call: Any, result: Any, block_text: str | None) -> bytes | None:
    """The key of the answer a conversational request was given (`result`, the upstream's, or a
    BLOCK's synthetic answer `block_text`): a later request whose history carries that answer
    (`Episode.answer`) finds the run by it. None: no answer a client goes on from (an error)."""
    dialect = of_call(call)
    if dialect is None or not dialect.CONVERSATIONAL:
        return None
    memo = call.memo
    if "answer_key" not in memo:
        if result is not None and result.error is None:
            # (the calls an exec call's script makes are Tripwire's reading, not items of the answer)
            answered = fingerprint((tc.id for tc in result.tool_calls if tc.inside is None), result.text)
        elif result is None and block_text is not None:
            answered = fingerprint((), block_text)
        else:
            memo["answer_key"] = None
            return None
        memo["answer_key"] = answer_key(call_digests(call).lineage[-1], answered)
    key: bytes | None = memo["answer_key"]
    return key


def for_llm(headers: Mapping[str, str], body: dict[str, Any] | None, call: Any) -> Episode:
    """The episode evidence of an LLM request (`call`: its parsed `LLMRequest`)."""
    found = announced(headers, body)
    if found is not None:
        return Episode(announced=found[1], source=found[0])
    dialect = of_call(call)  # (the others: embeddings, completions)
    if dialect is None or not dialect.CONVERSATIONAL:
        return NO_CONVERSATION
    history = call_digests(call).lineage
    previous = call.previous_response_id
    previous = previous if isinstance(previous, str) and previous else None
    if len(history) < 2 and previous is None:
        # an empty conversation (an unreadable body judged without its history) continues nothing
        return NO_CONVERSATION
    last = last_answer(call.messages)
    if last is None:
        return Episode(None, None, tuple(history[1:]), previous)
    at, answered = last
    return Episode(None, None, tuple(history[1:]), previous, answer_key(history[at], answered), at)


def for_mcp(headers: Mapping[str, str]) -> Episode:
    """An MCP call carries no conversation; a client that announces its episode in a header (the
    same headers as its LLM calls) still lands in that episode's run."""
    found = announced(headers, None)
    if found is None:
        return NO_CONVERSATION
    return Episode(announced=found[1], source=found[0])
