"""Secrets become "__REDACTED__", long strings end in "__TRUNCATED__" (SPEC §4.1). Pure, no I/O.

Unlike AgentDbg, which redacts any key *containing* "token" (and so hides `prompt_tokens`), a key is
matched word by word: the name is split on `_`, `-`, `.`, spaces and camelCase, and it is secret when
one word is a secret word. Decisions where the spec is silent:

- `token` (singular) alone is secret (`{"token": "..."}` is a credential); `tokens` (plural) is never
  a secret word, it is the usage-count vocabulary of every LLM API (`tokens`, `max_tokens`,
  `prompt_tokens_details`, `cache_read_input_tokens`); nor is `token` followed by a count word
  (`token_count`, `token_limit`, `token_budget`, `token_usage`), nor protocol plumbing and tokenizer
  symbols (MCP `progressToken`, `nextPageToken`, `NextToken`, `eos_token`, `stop_token`).
- `key` alone is secret (fail closed: headers and config name credentials just `key`), and so is
  `keys`; except when qualified by a non-secret kind of key (`public_key`, `sort_key`, `primary_key`,
  `partition_key`, `cache_key`, `idempotency_key`, ...).
- plurals of the other words (`cookies`, `secrets`, `credentials`, `passwords`) and `auth`,
  `passphrase`, `apikey` / `APIKEY` written as one word are secret too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from proxy.constants import DEPTH_LIMIT, REDACTED_MARKER, TRUNCATED_MARKER

_SECRET_WORDS = frozenset(
    {
        "key",
        "keys",
        "apikey",
        "apikeys",
        "authorization",
        "auth",
        "cookie",
        "cookies",
        "password",
        "passwords",
        "passwd",
        "passphrase",
        "secret",
        "secrets",
        "token",
        "credential",
        "credentials",
    }
)
# `<word>_key` that names a kind of key which is not a credential.
_NON_SECRET_KEY_QUALIFIERS = frozenset(
    {"public", "sort", "primary", "foreign", "partition", "cache", "idempotency", "dedup", "dedupe", "lookup"}
)
# `<word>_token` that is protocol plumbing or a tokenizer symbol, not a credential (MCP
# `progressToken`, pagination `nextPageToken` / `NextToken`, `eos_token`, `stop_token`).
_NON_SECRET_TOKEN_QUALIFIERS = frozenset(
    {"progress", "page", "next", "continuation", "pagination", "stop", "eos", "bos", "pad", "unk", "special"}
)
# `token_<word>` that is a count or limit, not a credential.
_TOKEN_COUNT_WORDS = frozenset(
    {"count", "counts", "usage", "limit", "limits", "budget", "budgets", "estimate", "total"}
)

_SEPARATORS = re.compile(r"[_\-.\s:/]+")
_CAMEL_WORDS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def split_words(name: str) -> list[str]:
    """Lowercase words of a field name: `x-api-key` → [x, api, key], `refreshToken` → [refresh, token]."""
    words: list[str] = []
    for part in _SEPARATORS.split(name):
        words.extend(w.lower() for w in _CAMEL_WORDS.findall(part))
    return words


@lru_cache(maxsize=4096)
def is_secret_key(name: str) -> bool:
    """True when a header / JSON field of this name holds a secret (see the module docstring)."""
    words = split_words(name)
    for i, word in enumerate(words):
        if word not in _SECRET_WORDS:
            continue
        if word in ("key", "keys") and i > 0 and words[i - 1] in _NON_SECRET_KEY_QUALIFIERS:
            continue
        if word == "token" and i + 1 < len(words) and words[i + 1] in _TOKEN_COUNT_WORDS:
            continue
        if word == "token" and i > 0 and words[i - 1] in _NON_SECRET_TOKEN_QUALIFIERS:
            continue
        return True
    return False


# --- values that are secrets whatever field holds them ------------------------------------------

# Provider keys: OpenAI/Anthropic `sk-...` (with at least one digit and 20+ chars, so `sk-learn` stays),
# Google `AIza...`, GitHub `ghp_`/`github_pat_`, Hugging Face `hf_`, Groq `gsk_`, Slack `xox?-`, AWS `AKIA`.
_PROVIDER_KEY = re.compile(
    r"(?<![A-Za-z0-9_\-])(?:"
    r"sk-(?=[A-Za-z0-9_\-]*[0-9])[A-Za-z0-9_\-]{20,}"
    r"|AIza[0-9A-Za-z_\-]{30,}"
    r"|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|github_pat_[A-Za-z0-9_]{30,}"
    r"|hf_[A-Za-z0-9]{30,}"
    r"|gsk_[A-Za-z0-9]{30,}"
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}"
    r"|AKIA[0-9A-Z]{16}"
    r")"
)
# `Bearer xyz` credentials in free text (a header dumped into a log or a prompt); `Basic <base64>` only
# when the value looks encoded (digit, `+/=`, or inner capitals), so "basic understanding" stays.
_BEARER = re.compile(r"(?i)\b(bearer\s+)([A-Za-z0-9._~+/=\-]{3,})")
_BASIC = re.compile(r"\b([Bb]asic\s+)([A-Za-z0-9+/]{8,}={0,2})(?![A-Za-z0-9+/=])")
_ENCODED = re.compile(r"[0-9+/=]|.[A-Z]")
# URL userinfo: scheme://user:pass@host → scheme://__REDACTED__@host
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)([^/\s@?#]+)@")
# Query parameters: ?api_key=...&token=...
_QUERY_PARAM = re.compile(r"([?&;])([A-Za-z0-9_.\-]+)=([^&#\s\"'<>]*)")
# Inline `"name": "value"` (JSON serialised inside a string: tool results, function arguments).
_JSON_PAIR = re.compile(r'"([A-Za-z0-9_.\-]{1,64})"(\s*:\s*)"((?:[^"\\]|\\.)*)"')
# Command-line flags inside a string: `--api-key X`, `--token=X` (stdio MCP commands, argv). The
# pattern starts with its dash, the lookbehind after it (not before a dash preceded by a word char
# or a dash, as `(?<![\w\-])--?` says): a leading literal lets the regex engine skip to each dash
# instead of trying the lookbehind at every position (a hyphenated prompt's scrub, ~2x faster).
_FLAG_PAIR = re.compile(r"(-(?<![\w\-]-)-?)([A-Za-z][A-Za-z0-9_\-]*)(=|\s+)([^\s\"']+)")
# Environment assignments: OPENAI_API_KEY=sk-...
_ENV_PAIR = re.compile(r"(?<![\w\-$])([A-Za-z_][A-Za-z0-9_]*)=([^\s&\"']+)")


def _named_value(name_group: int, value_group: int) -> Any:
    """A re.sub callback that redacts the value group when the name group is a secret name."""

    def sub(m: re.Match[str]) -> str:
        if not is_secret_key(m.group(name_group)) or m.group(value_group) == REDACTED_MARKER:
            return m.group(0)
        start, end = m.span(value_group)
        base = m.start(0)
        text = m.group(0)
        return text[: start - base] + REDACTED_MARKER + text[end - base :]

    return sub


_QUERY_SUB = _named_value(2, 3)
_JSON_SUB = _named_value(1, 3)
_FLAG_SUB = _named_value(2, 4)
_ENV_SUB = _named_value(1, 2)


def scrub_text(s: str) -> str:
    """Replace secret-looking values inside free text (prompts, results, argv, URLs) by the marker.

    Cheap substring checks guard each regex: this runs on every string of every event. A
    one-character check (memchr) goes first where it is implied by a longer one: searching a prompt
    for "sk-" costs ~30 times as much as for "-" (a 700-character prompt: ~1 us against 0.03).
    """
    if len(s) < 8:
        return s
    # every key _PROVIDER_KEY matches starts with one of these (`sk-` and `xox?-` hold a dash):
    # ids and names with an underscore (`call_000005`, `tool_calls`) need no regex
    if (
        ("-" in s and ("sk-" in s or "xox" in s))
        or ("z" in s and "AIza" in s)
        or ("K" in s and "AKIA" in s)
        or ("_" in s and ("hf_" in s or "gsk_" in s or "gh" in s))
    ):
        s = _PROVIDER_KEY.sub(REDACTED_MARKER, s)
    # only a `b` or a `B` lowercases to a `b`
    if ("b" in s or "B" in s) and "bearer" in s.lower():
        s = _BEARER.sub(lambda m: m.group(1) + REDACTED_MARKER, s)
    if "asic" in s:
        s = _BASIC.sub(
            lambda m: m.group(1) + REDACTED_MARKER if _ENCODED.search(m.group(2)) else m.group(0), s
        )
    if "@" in s and "://" in s:
        s = _URL_USERINFO.sub(lambda m: m.group(1) + REDACTED_MARKER + "@", s)
    if "=" in s:
        if "?" in s or "&" in s:
            s = _QUERY_PARAM.sub(_QUERY_SUB, s)
        s = _ENV_PAIR.sub(_ENV_SUB, s)
    if '"' in s and ":" in s:
        s = _JSON_PAIR.sub(_JSON_SUB, s)
    if "-" in s:
        s = _FLAG_PAIR.sub(_FLAG_SUB, s)
    return s


def truncate(s: str, max_field_bytes: int) -> str:
    """Cap `s` at max_field_bytes UTF-8 bytes, marker included, without splitting a code point."""
    if max_field_bytes <= 0 or len(s) * 4 <= max_field_bytes:
        return s  # fast path: cannot exceed the cap even if every char took 4 bytes
    b = s.encode("utf-8", errors="surrogatepass")
    if len(b) <= max_field_bytes:
        return s
    keep = max(0, max_field_bytes - len(TRUNCATED_MARKER))
    # A prefix of valid UTF-8 can only end in an incomplete sequence; "ignore" drops just that.
    return b[:keep].decode("utf-8", errors="ignore") + TRUNCATED_MARKER


# Long strings are scrubbed only up to max_field_bytes + _SCRUB_MARGIN chars (a 10 MB base64 image
# would otherwise hold the event loop for ~0.4 s); see _sanitize_str for why that is still safe.
_SCRUB_MARGIN = 16384
_EDGE_ROOM = 8192


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_unicode(s: str) -> str:
    """`s` with each lone surrogate (from a `"\\ud83d"` escape, what JSON.stringify writes for a cut
    emoji) replaced by U+FFFD: the trace is UTF-8, which cannot hold one (orjson refuses it)."""
    if s.isascii():
        return s
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", s)
    return s


def _sanitize_str(s: str, max_field_bytes: int) -> str:
    """Scrub, then truncate: a cut first could leave a key prefix too short for the patterns to see."""
    s = valid_unicode(s)
    if max_field_bytes > 0 and len(s) > max_field_bytes + _SCRUB_MARGIN:
        head = scrub_text(s[: max_field_bytes + _SCRUB_MARGIN])
        # The kept part is at most max_field_bytes chars; a secret cut in two at the pre-cut edge went
        # unscrubbed, but it lies in head's last chars, far past the kept part unless scrubbing shrank
        # head by more than the margin. Then scrub the whole string.
        if len(head) >= max_field_bytes + _EDGE_ROOM:
            return truncate(head, max_field_bytes)  # head is longer than the cap, so this cuts it
    return truncate(scrub_text(s), max_field_bytes)


_PLAIN = frozenset({int, float, bool, type(None)})
PLAIN = _PLAIN  # what sanitize keeps as it is: callers skip the call for these


_SHORT = 512  # strings up to this long are remembered sanitised (at most _SHORT_KEPT of them)
_SHORT_KEPT = 4096
# and longer ones up to _MEDIUM chars, fewer of them (at most ~2 MB of keys even if each were UCS-4;
# a clean string's answer is the same object, a changed one's as much again): the
# instructions a stateless service sends first in every call, each call a run whose first prompt
# is recorded whole (issue 33), so the same system prompt is sanitised call after call
_MEDIUM = 8192
_MEDIUM_KEPT = 64


def _str(s: str, max_field_bytes: int) -> str:
    """`_sanitize_str`, with the answer for a short ASCII string (roles, statuses) given at once:
    nothing to scrub below 8 chars, nothing to replace or cut. Ids, names, models and tool
    arguments repeat from event to event (a tool call's id and arguments are in the answer's
    LLM_CALL, then in its TOOL_CALL): strings up to `_SHORT` chars are remembered sanitised, and
    a few up to `_MEDIUM` (a system prompt resent in every call)."""
    n = len(s)
    if n < 8 and s.isascii() and (max_field_bytes <= 0 or n * 4 <= max_field_bytes):
        return s
    if n <= _SHORT:
        return _sanitize_short(s, max_field_bytes)
    if n <= _MEDIUM:
        return _sanitize_medium(s, max_field_bytes)
    return _sanitize_str(s, max_field_bytes)


@lru_cache(maxsize=_SHORT_KEPT)
def _sanitize_short(s: str, max_field_bytes: int) -> str:
    return _sanitize_str(s, max_field_bytes)


@lru_cache(maxsize=_MEDIUM_KEPT)
def _sanitize_medium(s: str, max_field_bytes: int) -> str:
    return _sanitize_str(s, max_field_bytes)


sanitize_text = _str  # `sanitize(s, max_field_bytes)` of a str (`type(s) is str`), without its dispatch


def sanitize(obj: Any, max_field_bytes: int, _depth: int = 0) -> Any:
    """A JSON-safe copy of obj with secret-named values redacted, secrets in text scrubbed, strings capped.

    Dict keys become str; tuples and sets become lists; other objects their str(). Never mutates obj.
    Every event's payload goes through here: the JSON types take the short ways first.
    """
    t = type(obj)
    if t in _PLAIN:
        return obj
    if t is str:
        return _str(obj, max_field_bytes)
    if _depth < DEPTH_LIMIT:
        if t is dict:
            return _dict(obj, max_field_bytes, _depth)
        if t is list:
            return _list(obj, max_field_bytes, _depth)
    return _other(obj, max_field_bytes, _depth)


def _list(obj: list[Any], max_field_bytes: int, depth: int) -> list[Any]:
    return [
        v
        if type(v) in _PLAIN
        else _str(v, max_field_bytes)
        if type(v) is str
        else sanitize(v, max_field_bytes, depth + 1)
        for v in obj
    ]


# keys seen to be plain ASCII text and not secret-named: the common case of every payload's dict
# keys takes one set lookup (bounded: keys of user JSON beyond it take the full check)
_PLAIN_KEYS: set[str] = set()
_PLAIN_KEYS_KEPT = 4096


def _dict(obj: dict[Any, Any], max_field_bytes: int, depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in obj.items():
        if k in _PLAIN_KEYS:
            key = k
        else:
            key = k if type(k) is str and k.isascii() else valid_unicode(k if isinstance(k, str) else str(k))
            if is_secret_key(key):
                if v is not None:
                    out[key] = REDACTED_MARKER
                    continue
            elif type(k) is str and key is k and len(_PLAIN_KEYS) < _PLAIN_KEYS_KEPT:
                _PLAIN_KEYS.add(k)
        t = type(v)
        if t is str:
            out[key] = _str(v, max_field_bytes)
        elif t in _PLAIN:
            out[key] = v
        elif t is dict and depth + 1 < DEPTH_LIMIT:  # sanitize's own ways, without its call
            out[key] = _dict(v, max_field_bytes, depth + 1)
        elif t is list and depth + 1 < DEPTH_LIMIT:
            out[key] = _list(v, max_field_bytes, depth + 1)
        else:
            out[key] = sanitize(v, max_field_bytes, depth + 1)
    return out


def _other(obj: Any, max_field_bytes: int, _depth: int) -> Any:
    """Subclasses of the JSON types, other containers and objects, and anything past DEPTH_LIMIT."""
    if obj is None or isinstance(obj, bool | int | float):
        return obj
    if isinstance(obj, str):
        return _sanitize_str(obj, max_field_bytes)
    if _depth >= DEPTH_LIMIT:
        return TRUNCATED_MARKER
    if isinstance(obj, dict):
        return _dict(obj, max_field_bytes, _depth)
    if isinstance(obj, list | tuple | set | frozenset):
        return [sanitize(v, max_field_bytes, _depth + 1) for v in obj]
    if isinstance(obj, bytes | bytearray):
        return _sanitize_str(bytes(obj).decode("utf-8", errors="replace"), max_field_bytes)
    return _sanitize_str(str(obj), max_field_bytes)


def redact_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Headers as a dict safe to record: secret-named headers redacted, others scrubbed."""
    return {k: (REDACTED_MARKER if is_secret_key(k) else scrub_text(v)) for k, v in headers}


def redact_argv(argv: Iterable[str]) -> list[str]:
    """The proxy's own argv with secrets redacted: `--admin-token X`, `--x=Y`, URL userinfo, `sk-...`."""
    out: list[str] = []
    redact_next = False
    for item in argv:
        if redact_next:
            out.append(REDACTED_MARKER)
            redact_next = False
            continue
        if item.startswith("-") and item.lstrip("-"):
            name, eq, _value = item.lstrip("-").partition("=")
            if is_secret_key(name):
                if eq:
                    out.append(item[: len(item) - len(_value)] + REDACTED_MARKER)
                else:
                    out.append(item)
                    redact_next = True
                continue
        out.append(scrub_text(item))
    return out
