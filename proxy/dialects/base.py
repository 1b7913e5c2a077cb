"""Types shared by every protocol dialect, and the small helpers they all use.

A dialect turns one protocol's wire format into these plain dataclasses so guards, pricing and
the recorder never look at raw JSON. The shapes are the seam described in docs/architecture.md.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy import ids, jsonparse
from proxy.sse import BoundedText

# Characters per token for estimates (OpenAI's rule of thumb for English text; tokenizers are
# not shipped, and an estimate only has to be in the right range for a budget reservation).
CHARS_PER_TOKEN = 4
# Per-message overhead the chat formats add (role markers, separators).
TOKENS_PER_MESSAGE = 4
NO_ITEMS: tuple[()] = ()  # a ParseState's steps or tool results when the request has none


@dataclass
class ToolResult:
    """A tool result the agent sends back in a later request."""

    tool_call_id: str
    content: Any
    is_error: bool = False


@dataclass
class ToolCall:
    """A tool call the model asked for."""

    id: str
    name: str
    arguments: Any  # parsed JSON when it parses, else the raw string
    # a tool the provider ran itself (Responses web search, MCP, image generation): no result comes
    # back from the agent; `result` is what the answer says it gave
    hosted: bool = False
    result: ToolResult | None = None
    # a call a Codex code-mode `exec` call ran (its id): read from the script, not asked for by the
    # model itself; its outcome is the exec call's (proxy/dialects/codex_exec.py)
    inside: str | None = None


@dataclass
class Usage:
    prompt_tokens: int = 0  # includes cached input (read and creation)
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0  # cache reads (OpenAI cached_tokens, Anthropic cache_read_input_tokens)
    cache_creation_tokens: int = 0  # Anthropic cache_creation_input_tokens
    estimated: bool = False


@dataclass(eq=False, slots=True)
class ParseState:
    """What a dialect read from a request's first `messages` messages: kept with the request (in
    proxy/history.py) so a later request that resends them, proven unchanged, goes on from here
    instead of reading the whole history again. Read-only once built: requests share its lists'
    items (`steps` and `tool_results` of a continuing request start with these, the same objects)."""

    messages: int
    # the request's own lists; a shared empty tuple when there is none (NO_ITEMS: a plain first
    # call's reading is kept with its run, issue 33)
    steps: Sequence[list[ToolCall]]
    tool_results: Sequence[ToolResult]
    turn_start: int
    turn_said: str | None = None  # `Turns.said` of the turn in force
    # tool_call_id -> its last result / the position of its first result (readers differ on
    # duplicate ids); built on first use, from the prior request's when it built them
    last_result: dict[str, ToolResult] | None = field(default=None, repr=False)
    first_result: dict[str, int] | None = field(default=None, repr=False)

    def results_by_id(self, prior: ParseState | None) -> dict[str, ToolResult]:
        """tool_call_id -> its last result (`prior`: the state this one went on from, if any)."""
        if self.last_result is None:
            start, index = 0, {}
            if prior is not None and prior.last_result is not None:
                start, index = len(prior.tool_results), dict(prior.last_result)
            for r in self.tool_results[start:]:
                index[str(r.tool_call_id)] = r
            self.last_result = index
        return self.last_result

    def first_results(self, prior: ParseState | None) -> dict[str, int]:
        """tool_call_id -> the position of its first result in `tool_results`."""
        if self.first_result is None:
            start, index = 0, {}
            if prior is not None and prior.first_result is not None:
                start, index = len(prior.tool_results), dict(prior.first_result)
            results = self.tool_results
            for i in range(start, len(results)):
                index.setdefault(results[i].tool_call_id, i)
            self.first_result = index
        return self.first_result


@dataclass(slots=True)
class LLMRequest:
    dialect: str  # openai_chat | openai_responses | anthropic | embeddings | completions
    model: str | None
    stream: bool
    messages: list[Any]  # the request's conversation as sent (for prompt recording)
    temperature: float | None
    max_tokens: int | None
    tool_results: list[ToolResult]  # tool results carried by this request (whole history)
    # one entry per assistant step in the history, oldest first; a step without tool calls is []
    steps: list[list[ToolCall]]
    turn_start: int  # index into steps where the current turn begins (last real user message)
    previous_response_id: str | None = None
    # what the user message that began the current turn said (`said`), and how many of the request's
    # user messages began a turn (`Turns`): a chained request (Responses) whose only one repeats the
    # chain's turn goes on with that turn
    turn_said: str | None = None
    turns_opened: int = 0
    client_asked_usage: bool = False
    # values derived from the request, computed once for all the stages that need them (the prompt
    # estimate, the conversation's digests): a long history is walked once per call, not per use
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # dialects that read a conversation incrementally (openai_chat): what they read, and the prior
    # request's reading this one went on from (its first steps and results are that one's)
    parsed: ParseState | None = field(default=None, repr=False, compare=False)
    continues: ParseState | None = field(default=None, repr=False, compare=False)


def said(content: Any) -> str:
    """What a user message says, as a short hash: its words (its text parts, spaces folded; other
    parts, such as images, by their type alone: re-reading every image of a long history on every
    request would cost more than the words are worth). Two messages that say the same give the same."""
    parts = content if isinstance(content, list) else [content]
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict):
            text, kind = part.get("text"), part.get("type")
            texts.append(text if isinstance(text, str) else f"<{kind if isinstance(kind, str) else 'part'}>")
    words = " ".join(" ".join(texts).split())
    return hashlib.blake2b(words.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


@dataclass(slots=True)
class Turns:
    """Where a conversation's current turn begins (SPEC §5.1), read message by message: at the last
    real user message, except one that repeats word for word the message that began the turn in
    force (a harness answering "Continue." after every step), which goes on with that turn."""

    start: int = 0  # index into the steps read so far
    said: str | None = None  # `said()` of the message that began it
    opened: int = 0  # user messages that began a turn

    def user(self, content: Any, steps: int) -> None:
        words = said(content)
        if words == self.said:
            return
        self.start, self.said = steps, words
        self.opened += 1


@dataclass
class LLMResult:
    model: str | None
    text: str
    tool_calls: list[ToolCall]
    usage: Usage | None
    stop_reason: str | None
    response_id: str | None = None
    error: dict | None = None  # {error_type, message, details}
    complete: bool = True  # False when a stream broke before its clean end


@dataclass
class ToolCallBuilder:
    """Pieces of one streamed tool call, stitched in arrival order."""

    id: str = ""
    name: str = ""
    parts: BoundedText = field(default_factory=BoundedText)

    def build(self) -> ToolCall:
        return ToolCall(id=self.id, name=self.name, arguments=parse_arguments("".join(self.parts)))


def parse_arguments(raw: Any) -> Any:
    """Tool arguments as JSON when they parse; the raw value otherwise (models emit broken JSON).

    Read as `json.loads` reads them (lone surrogates, NaN, any depth: `proxy.jsonparse`), so the
    guards compare the same structure whatever parser would have refused it.
    """
    if not isinstance(raw, str | bytes):
        return raw
    if isinstance(raw, str) and raw == "":
        return {}
    try:
        return jsonparse.loads(raw)
    except ValueError:
        return raw


def tool_name(tool: dict) -> str:
    """A declared tool's name, whatever the dialect: its `name` (Anthropic, Responses), its
    `function.name` (chat), or for a hosted tool without one its type (`web_search`)."""
    function = tool.get("function")
    name = tool.get("name") or (function.get("name") if isinstance(function, dict) else None)
    return str(name or tool.get("type") or "")


def tool_names(tool: dict) -> tuple[str, ...]:
    """Every name a declared tool (or a tool_choice) carries: its `name`, its `function.name` (chat
    functions), its `custom.name` (chat custom tools); its type when it has none (a hosted tool).
    A provider reads one of them, which depends on the shape: a tool some name of which is refused
    is refused (issue 30: `{"name": "harmless", "function": {"name": "shell"}}` is `shell`)."""
    names = [tool.get("name")]
    for key in ("function", "custom"):
        inner = tool.get(key)
        if isinstance(inner, dict):
            names.append(inner.get("name"))
    found = tuple(str(n) for n in names if n)
    return found or (str(tool.get("type") or ""),)


def unreadable_names(tool: dict) -> bool:
    """A name that is not a string (`"name": ["shell"]`), or a `function` / `custom` that is not an
    object (`"function": "shell"`): no rule can judge the tool, which a lax upstream may still read."""
    objects: list[dict] = [tool]
    for key in ("function", "custom"):
        inner = tool.get(key)
        if inner is not None and not isinstance(inner, dict):
            return True
        objects += [inner] if inner is not None else []
    return any("name" in d and not isinstance(d["name"], str) for d in objects)


def hosted_mcp_names(server: str, allowed: Any) -> tuple[str, ...]:
    """The `SERVER__TOOL` names of the tools a remote MCP server the upstream calls itself may run
    (Responses `{"type": "mcp"}`, Anthropic's `mcp_servers`): its explicit `allowed_tools` (a list,
    or `{"tool_names": [...]}`); () when it may run any of them, which no rule can judge."""
    if isinstance(allowed, dict):
        allowed = allowed.get("tool_names")
    if not isinstance(allowed, list) or not all(isinstance(t, str) for t in allowed):
        return ()
    return tuple(tool_names_qualified(server, t) for t in allowed)


def tool_names_qualified(server: str, tool: str) -> str:
    return f"{server}__{tool}"  # (proxy.guards.tool_names.qualified: dialects do not import guards)


def listed_tools(body: dict, *keys: str) -> list[dict]:
    """The tool definitions (objects) of the lists a body holds under `keys`, in order."""
    found: list[dict] = []
    for key in keys:
        tools = body.get(key)
        if isinstance(tools, list):
            found += [tool for tool in tools if isinstance(tool, dict)]
    return found


def no_declared_tools(body: dict) -> list[dict]:
    """A protocol without tools (embeddings, legacy completions)."""
    return []


# keep(name) -> whether a declared tool of that name stays in the request (tool permissions, SPEC §9)
KeepTool = Callable[[str], bool]


def no_tools_to_remove(body: dict, keep: KeepTool) -> dict | None:
    """A protocol without tools: nothing to remove."""
    return None


_END = object()


class ToolFilter:
    """Removes the tool definitions `keep` refuses from a body's lists, remembering their names.

    A list is rebuilt only when something goes; a namespace (Responses) is filtered inside, and
    dropped when nothing of it is left. Iterative: namespaces may nest as deep as a body does."""

    def __init__(self, keep: KeepTool) -> None:
        self.keep = keep
        self.removed: set[str] = set()

    def tools(self, tools: Any) -> list[Any] | None:
        """`tools` without the refused definitions; None when it is not a list or keeps them all."""
        if not isinstance(tools, list):
            return None
        root: list[Any] = []
        changed = False
        # (the list being read, what is kept of it, the namespace it is the tools of)
        stack: list[tuple[Any, list[Any], dict | None]] = [(iter(tools), root, None)]
        while stack:
            source, out, namespace = stack[-1]
            tool = next(source, _END)
            if tool is _END:
                stack.pop()
                if namespace is not None:
                    if out or not namespace["tools"]:
                        stack[-1][1].append({**namespace, "tools": out})
                    else:
                        changed = True  # a namespace emptied by the filter goes too
                continue
            if (
                isinstance(tool, dict)
                and tool.get("type") == "namespace"
                and isinstance(tool.get("tools"), list)
            ):
                stack.append((iter(tool["tools"]), [], tool))
            elif isinstance(tool, dict) and not self.keeps_tool(tool):
                changed = True
            else:
                out.append(tool)
        return root if changed else None

    def keeps(self, names: tuple[str, ...]) -> bool:
        return all(self.keep(name) for name in names)

    def keeps_tool(self, tool: dict) -> bool:
        """Whether a declared tool stays. A remote MCP server the upstream calls itself (Responses
        `type: mcp`) is its tools, `SERVER__TOOL`: kept when each of its `allowed_tools` is, gone
        when it lists none (any tool could run, unjudged: attack round 2). The filter runs only
        while tool permissions restrict the agent."""
        label = tool.get("server_label")
        if tool.get("type") == "mcp" and isinstance(label, str):
            names = hosted_mcp_names(label, tool.get("allowed_tools"))
            if names and self.keeps(names):
                return True
            self.removed.update(names or (label,))
            return False
        names = tool_names(tool)
        if self.keeps(names) and not unreadable_names(tool):
            return True
        self.removed.update(names)
        return False

    def field(self, body: dict, key: str) -> bool:
        """Filter `body[key]` in place (`body` is the caller's copy); True when something went."""
        kept = self.tools(body.get(key))
        if kept is None:
            return False
        body[key] = kept
        return True

    def names_removed(self, choice: Any) -> bool:
        """A `tool_choice` naming a removed tool (chat, Responses, Anthropic shapes)."""
        return isinstance(choice, dict) and not self.removed.isdisjoint(tool_names(choice))

    def choice(self, body: dict, key: str, *, tools_left: bool) -> None:
        """Reset `body[key]` (a tool_choice) when it names a removed tool, or forces a tool call with
        none left: the upstream would reject the request. An `allowed_tools` choice loses the
        removed tools (and goes when none is left)."""
        choice = body.get(key)
        if choice is None:
            return
        if not tools_left:
            del body[key]
            return
        if not isinstance(choice, dict):
            return
        if choice.get("type") == "allowed_tools":
            nested = isinstance(choice.get("allowed_tools"), dict)  # chat nests it, Responses does not
            inner = choice["allowed_tools"] if nested else choice
            listed = inner.get("tools")
            if not isinstance(listed, list):
                return
            rest = [t for t in listed if not self.names_removed(t)]
            if not rest:
                del body[key]
            elif len(rest) != len(listed):
                inner = {**inner, "tools": rest}
                body[key] = {**choice, "allowed_tools": inner} if nested else inner
            return
        if self.names_removed(choice):
            del body[key]


# What most dialects answer to the contract's questions (proxy/dialects/contract.py): the OpenAI API's
PROVIDER_OPENAI = "openai"
OP_CHAT = "chat"  # OpenTelemetry's gen_ai.operation.name of a chat call
CODEX_REASON_HEADER = "x-request-id"  # Codex CLI shows a 429's request id, never its body


def openai_error_body(status: int, error: dict[str, Any]) -> bytes:
    """The OpenAI API's error shape, `{"error": {...}}` (Tripwire's own errors have it already)."""
    return orjson.dumps({"error": error})


def openai_bad_request_error(message: str) -> dict[str, Any]:
    return {"message": message, "type": "invalid_request_error", "param": None, "code": None}


def loads_or_none(body: bytes | str) -> Any:
    """JSON value of a body, or None when it is not JSON (an HTML error page, a broken proxy)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def as_int(value: Any) -> int:
    """A token count from an answer (None, strings and junk count as 0; 12.0 counts as 12)."""
    if type(value) is int:  # the usual count, at once
        return value
    if isinstance(value, bool):
        return 0
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) else 0


def as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def error_dict(error_type: str, message: str, details: Any = None) -> dict:
    return {"error_type": error_type, "message": message, "details": details, "stack": None}


def http_error(status: int, data: Any, body: bytes) -> dict:
    """The error of a non-2xx answer, read from the usual `{"error": {...}}` shapes."""
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        etype = err.get("type") or err.get("code") or f"http_{status}"
        message = err.get("message") or ""
        return error_dict(str(etype), str(message), {"status": status, "error": err})
    if isinstance(err, str):
        return error_dict(f"http_{status}", err, {"status": status})
    text = body[:2000].decode("utf-8", "replace")
    return error_dict(f"http_{status}", text, {"status": status})


def estimate_text_tokens(text: str) -> int:
    """Tokens in a text by the chars/4 rule (never 0 for a non-empty text)."""
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def estimate_prompt_tokens(req: LLMRequest) -> int:
    """A prompt-size estimate for budget reservations: chars/4 of every string in the messages.

    Inline attachments (base64 images, PDFs, audio) count at most `ATTACHMENT_TOKENS` each, not
    by their encoded size: a 1 MB screenshot is about a thousand tokens, not 350 000.
    """
    found = req.memo.get("prompt_tokens")
    if found is None:  # asked for by the USD reservation and by the token reservation
        found = req.memo["prompt_tokens"] = sum(
            estimate_value_tokens(message) + TOKENS_PER_MESSAGE for message in req.messages
        )
    return int(found)


# A high-detail image is 765-1105 tokens for OpenAI and about 1600 at most for Anthropic.
ATTACHMENT_TOKENS = 1500
_BASE64 = re.compile(rb"[A-Za-z0-9+/=_-]+")


def estimate_value_tokens(value: Any) -> int:
    """chars/4 of every string in a JSON-like value, one per other scalar and per dict member.

    Walked with an explicit stack, not recursion: a request body may nest 10,000 levels deep.
    """
    total = 0
    stack = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        v = pop()
        if type(v) is dict:  # the usual JSON object: its string members counted here, the rest pushed
            total += len(v)
            for member in v.values():
                if type(member) is str:
                    # _text_tokens, inline for the usual short string (never an attachment)
                    total += (
                        (len(member) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
                        if len(member) < 2048
                        else _text_tokens(member)
                    )
                else:
                    push(member)
        elif isinstance(v, str):
            total += _text_tokens(v)
        elif isinstance(v, dict):
            total += len(v)
            extend(v.values())
        elif isinstance(v, list | tuple):
            extend(v)
        elif v is not None:
            total += 1
    return total


def _text_tokens(text: str) -> int:
    """A string's share: chars/4, an inline attachment at most ATTACHMENT_TOKENS."""
    tokens = (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
    return min(tokens, ATTACHMENT_TOKENS) if len(text) >= 2048 and _is_attachment(text) else tokens


def _is_attachment(text: str) -> bool:
    if len(text) < 2048:
        return False
    if text.startswith("data:") and ";base64," in text[:200]:
        return True
    head = text[:256].encode("ascii", "replace")
    return _BASE64.fullmatch(head) is not None


def new_id(prefix: str) -> str:
    return prefix + ids.hex32()[:24]


def sse_frame(data: Any, event: str | None = None) -> bytes:
    """One SSE event with a JSON (or literal string) data line."""
    payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + payload + b"\n\n"


def stream_incomplete(terminator: str) -> dict:
    return error_dict("stream_incomplete", f"upstream stream ended before {terminator}")


def estimate_usage(req: LLMRequest | None, text: str, tool_calls: list[ToolCall]) -> Usage:
    """Usage for an answer that reported none: chars/4 of the prompt and of the output."""
    prompt = estimate_prompt_tokens(req) if req is not None else 0
    out = text + "".join(_arguments_text(c.arguments) + c.name for c in tool_calls)
    completion = estimate_text_tokens(out)
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion, estimated=True
    )


def _arguments_text(arguments: Any) -> str:
    """Arguments as JSON text for a size estimate, whatever their depth or content."""
    try:
        return orjson.dumps(arguments, default=str).decode()
    except TypeError:  # deeper than orjson writes, integers beyond 64 bits, lone surrogates
        try:
            return jsonparse.dumps_text(arguments)
        except TypeError:
            return str(arguments)


def openai_usage(raw: Any) -> Usage | None:
    """Usage of an OpenAI-style answer (chat, legacy completions, embeddings)."""
    if not isinstance(raw, dict):
        return None
    prompt = as_int(raw.get("prompt_tokens"))
    completion = as_int(raw.get("completion_tokens"))
    details = raw.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    total = as_int(raw.get("total_tokens")) or prompt + completion
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=total,
        cached_tokens=as_int(details.get("cached_tokens")),
        cache_creation_tokens=as_int(details.get("cache_write_tokens")),
    )


# first byte of an SSE stream: a field name (data, event, id, retry), a comment, or a BOM
_SSE_FIRST_BYTES = b"deir:\xef"
MAX_SNIFFED_BODY = 4 * 1024 * 1024


class BodySniffer:
    """Tells an SSE stream from a plain body answering a streaming request.

    An upstream refuses a streaming request with a JSON error (or a proxy's HTML page) instead
    of a stream. The accumulators must pass such a body through untouched (never hold it back
    as a partial SSE event) and parse it as an error at the end.
    """

    def __init__(self) -> None:
        self.mode: str | None = None  # None until the first non-blank byte: "sse" | "body"
        self.body = bytearray()

    def feed(self, chunk: bytes) -> bool:
        """True when `chunk` is not SSE (pass it through as it is, do not decode it)."""
        if self.mode is None:
            head = chunk.lstrip()
            if not head:
                return True  # blank bytes before anything: nothing to decode either way
            self.mode = "sse" if head[0] in _SSE_FIRST_BYTES else "body"
        if self.mode == "body":
            if len(self.body) < MAX_SNIFFED_BODY:
                self.body += chunk
            return True
        return False
