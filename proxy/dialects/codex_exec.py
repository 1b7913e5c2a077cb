"""Codex code mode: the calls one JavaScript `exec` ran (issue 32 item 5).

Codex's default model (0.171, gpt-6.2-sol) is offered one freeform tool, `exec` (a `custom` tool in
the `functions` namespace of an `additional_tools` item), whose input is JavaScript that calls every
other tool as `await tools.NAME(ARGS)`: the shell as `tools.exec_command({cmd: "ls"})`, an MCP tool as
`tools.mcp__SERVER__TOOL({...})`. Codex runs the script and answers the call with one
`custom_tool_call_output` holding whatever the script passed to `text()`: the nested calls are not
reported one by one (tests/fixtures/codex_0171_code_mode_*.json). So the source is what names them:
this module reads the `tools.NAME(...)` calls out of it, with their arguments when they are written
as literals (a computed argument is kept as its source text).

A nested call is named as Tripwire names the tool outside code mode: an MCP tool `SERVER__TOOL`
(what permissions match, docs/gateway.md), any other by its own name (the shell `exec_command`,
which a permission pattern for `shell` also matches: proxy/guards/permissions.py). A call the script builds at run time (`tools[name](...)`, a loop
over `ALL_TOOLS`) cannot be read from the source: docs/clients.md says what that leaves out.

Pure: a string in, names and arguments out.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import orjson

from proxy.constants import TRUNCATED_MARKER
from proxy.dialects.base import ToolCall, ToolResult

EXEC_TOOL = "exec"
MCP_PREFIX = "mcp__"
MAX_NESTED = 64  # calls read from one script; a longer list is cut there (a generated script)
MAX_SOURCE_CHARS = 256 * 1024  # a larger script is not read
MAX_LITERAL_CHARS = 16 * 1024  # a longer argument that is not JSON is kept as its source, cut here
KEPT_SOURCE_CHARS = 16 * 1024  # scripts up to this long are kept once read (1024 of them: <= 16 MiB)

_CALL = re.compile(r"""tools\s*(?:\.\s*([A-Za-z_$][\w$]*)|\[\s*(["'])([^"'\\]+)\2\s*\])\s*\(""")
_WORD_BEFORE = re.compile(r"[\w$.]")
_BARE_KEY = re.compile(r"([A-Za-z_$][\w$]*)\s*:")
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


def is_exec(call: ToolCall, item: dict[str, Any]) -> bool:
    """A code-mode `exec` call: the custom tool `exec`, in the `functions` namespace or none."""
    return (
        call.name == EXEC_TOOL
        and item.get("type") == "custom_tool_call"
        and item.get("namespace") in (None, "functions")
        and isinstance(call.arguments, str)
    )


def with_nested(call: ToolCall, item: dict[str, Any]) -> list[ToolCall]:
    """A call item's ToolCall, followed, for an `exec` call, by the calls its script makes."""
    if not is_exec(call, item):
        return [call]
    return [call, *nested_calls(call)]


def nested_results(result: ToolResult, nested: list[ToolCall]) -> list[ToolResult]:
    """An `exec` call's output stands for each call its script made: Codex reports the script's
    output whole, never call by call."""
    return [ToolResult(c.id, result.content, result.is_error) for c in nested]


def nested_name(js_name: str) -> str:
    """The name Tripwire gives a tool the script calls as `tools.<js_name>`: an MCP tool's
    `SERVER__TOOL`, any other its own (Codex's shell is `exec_command`, as outside code mode)."""
    if js_name.startswith(MCP_PREFIX) and "__" in js_name[len(MCP_PREFIX) :]:
        return js_name[len(MCP_PREFIX) :]
    return js_name


def nested_calls(exec_call: ToolCall) -> list[ToolCall]:
    """The calls an `exec` call's script makes, in source order, each `inside` the exec call; ids
    are the exec call's id and the call's rank (`call_1:1`, `call_1:2`, ...)."""
    source = exec_call.arguments
    if not isinstance(source, str) or len(source) > MAX_SOURCE_CHARS:
        return []
    return [
        ToolCall(
            id=f"{exec_call.id}:{n}",
            name=nested_name(js_name),
            arguments=orjson.loads(argument),
            inside=exec_call.id,
        )
        for n, (js_name, argument) in enumerate(
            _kept_scan(source) if len(source) <= KEPT_SOURCE_CHARS else _scan(source), 1
        )
    ]


def _scan(source: str) -> tuple[tuple[str, bytes], ...]:
    """(tool name, its argument as JSON text) of each `tools.NAME(...)` outside strings and
    comments. `_kept_scan` keeps it for short scripts (over HTTP a history resends every earlier
    exec call with each request); the JSON is read afresh for each call, so no two calls share an
    argument object."""
    if "tools" not in source:
        return ()
    code = _code_only(source)
    closing = _closing_parens(code)
    out: list[tuple[str, bytes]] = []
    for m in _CALL.finditer(code):
        if m.start() > 0 and _WORD_BEFORE.match(code[m.start() - 1]):
            continue  # `mytools.x(`, `a.tools.x(`: not the global `tools`
        # (a quoted name is blanked in `code`: read it from the source, at the same offsets)
        name = m.group(1) or source[m.start(3) : m.end(3)]
        end = closing.get(m.end() - 1, len(code))  # (the call's `(` is the match's last character)
        out.append((name, _as_json_bytes(source[m.end() : end].strip())))
        if len(out) >= MAX_NESTED:
            break
    return tuple(out)


_kept_scan = lru_cache(maxsize=1024)(_scan)


# a string, a template literal or a comment (an unterminated one is left as code)
_NOT_CODE = re.compile(
    # (each string as `"[^"\\]*(?:\\.[^"\\]*)*"`, the unrolled form: one step per run, not per character)
    r"""\"[^"\\\n]*(?:\\.[^"\\\n]*)*\"|'[^'\\\n]*(?:\\.[^'\\\n]*)*'|`[^`\\]*(?:\\.[^`\\]*)*`"""
    r"""|//[^\n]*|/\*.*?\*/""",
    re.S,
)


def _blank(m: re.Match[str]) -> str:
    text = m.group(0)
    if text[0] in "\"'`":  # the quotes stay: `tools["x"](` is read from the source at these offsets
        return text[0] + " " * (len(text) - 2) + text[-1]
    return " " * len(text)


def _code_only(source: str) -> str:
    """The source with the insides of strings, template literals and comments blanked (same
    length, so offsets hold): a `tools.x(` in a string or a comment is no call, and a `)` in a
    string does not close one."""
    return _NOT_CODE.sub(_blank, source)


_BRACKETS = re.compile(r"[()\[\]{}]")


def _closing_parens(code: str) -> dict[int, int]:
    """Where each `(` of the code closes, in one pass over its brackets (an unclosed one is absent;
    a stray closer closes the innermost open bracket, whatever its kind)."""
    opened: list[tuple[int, str]] = []
    pairs: dict[int, int] = {}
    for m in _BRACKETS.finditer(code):
        c = m.group()
        if c in "([{":
            opened.append((m.start(), c))
        elif opened:
            at, kind = opened.pop()
            if kind == "(":
                pairs[at] = m.start()
    return pairs


def _as_json_bytes(raw: str) -> bytes:
    """`_argument(raw)` as JSON (what orjson cannot write, an integer beyond 64 bits, is kept as
    its source)."""
    try:
        return orjson.dumps(_argument(raw))
    except TypeError:
        return orjson.dumps({"source": raw})


def _argument(raw: str) -> Any:
    """A nested call's argument as data when it is written as a literal (JSON, or a JavaScript
    object with bare keys, single quotes and trailing commas), else `{"source": raw}`."""
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        pass
    if len(raw) <= MAX_LITERAL_CHARS:  # (read character by character: short ones only)
        try:
            return json.loads(_as_json(raw))
        except (ValueError, RecursionError):
            pass
    if len(raw) > MAX_LITERAL_CHARS:
        raw = raw[:MAX_LITERAL_CHARS] + TRUNCATED_MARKER
    return {"source": raw}


def _as_json(raw: str) -> str:
    """A JavaScript literal made JSON: single-quoted strings double-quoted, bare keys quoted,
    trailing commas dropped (a literal with anything else stays unparseable)."""
    out: list[str] = []
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c in "\"'":
            j = i + 1
            chars: list[str] = []
            while j < n and raw[j] != c:
                if raw[j] == "\\" and j + 1 < n:
                    chars.append("'" if raw[j + 1] == "'" else raw[j : j + 2])
                    j += 2
                    continue
                chars.append('\\"' if raw[j] == '"' else raw[j])
                j += 1
            out.append('"' + "".join(chars) + '"')
            i = j + 1
            continue
        key = _BARE_KEY.match(raw, i) if c.isalpha() or c in "_$" else None
        if key is not None and _after_open(out):
            out.append(f'"{key.group(1)}":')
            i = key.end()
            continue
        out.append(c)
        i += 1
    return _TRAILING_COMMA.sub(r"\1", "".join(out))


def _after_open(out: list[str]) -> bool:
    """Whether what was written so far ends (spaces aside) with `{` or `,`: a key may follow."""
    for piece in reversed(out):
        stripped = piece.rstrip()
        if stripped:
            return stripped[-1] in "{,"
    return False
