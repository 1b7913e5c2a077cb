"""scrub_text's cheaper guards and flag pattern, and sanitize's memory of mid-length strings (issue
33), give byte for byte what the previous code gave: it is kept here as the reference, and both
are run on hostile texts (every secret shape, near misses, non-ASCII, control characters, long
strings, and random mixes of their pieces)."""

from __future__ import annotations

import random
import re
from typing import Any

import orjson
import pytest

from proxy import redact
from proxy.constants import REDACTED_MARKER
from proxy.redact import sanitize, scrub_text

# --- the reference: scrub_text as it was before the guards were reordered -------------------------

_FLAG_PAIR_BEFORE = re.compile(r"(?<![\w\-])(--?)([A-Za-z][A-Za-z0-9_\-]*)(=|\s+)([^\s\"']+)")


def scrub_before(s: str) -> str:
    if len(s) < 8:
        return s
    if (
        "sk-" in s
        or "AIza" in s
        or "xox" in s
        or "AKIA" in s
        or ("_" in s and ("hf_" in s or "gsk_" in s or "gh" in s))
    ):
        s = redact._PROVIDER_KEY.sub(REDACTED_MARKER, s)
    lower = s.lower()
    if "bearer" in lower:
        s = redact._BEARER.sub(lambda m: m.group(1) + REDACTED_MARKER, s)
    if "asic" in s:
        s = redact._BASIC.sub(
            lambda m: m.group(1) + REDACTED_MARKER if redact._ENCODED.search(m.group(2)) else m.group(0), s
        )
    if "://" in s and "@" in s:
        s = redact._URL_USERINFO.sub(lambda m: m.group(1) + REDACTED_MARKER + "@", s)
    if "=" in s:
        if "?" in s or "&" in s:
            s = redact._QUERY_PARAM.sub(redact._QUERY_SUB, s)
        s = redact._ENV_PAIR.sub(redact._ENV_SUB, s)
    if '"' in s and ":" in s:
        s = redact._JSON_PAIR.sub(redact._JSON_SUB, s)
    if "-" in s:
        s = _FLAG_PAIR_BEFORE.sub(redact._FLAG_SUB, s)
    return s


# --- hostile texts -------------------------------------------------------------------------------

OPENAI_KEY = "sk-proj-4fQz9XbT1mK7pL2sV8nR3wY6"
PIECES = [
    OPENAI_KEY,
    "sk-learn is a library",
    "xoxb-1234567890-abcdefghij",
    "xox",
    "AIzaSyA1234567890abcdefghijklmnopqrstu",
    "AIza",
    "AKIAIOSFODNN7EXAMPLE",
    "AKIA",
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "github_pat_11ABCDEFG0123456789abcdefghijklmnop",
    "hf_abcdefghijklmnopqrstuvwxyz0123456789",
    "gsk_abcdefghijklmnopqrstuvwxyz0123456789",
    "Bearer abc.def-ghi",
    "BEARER xyz123",
    "bEaReR\ttoken123",
    "bearer",
    "Basic dXNlcjpwYXNz",
    "basic understanding",
    "https://user:hunter2@example.com/x",
    "postgres://me:pw@db",
    "?api_key=abcdef&x=1",
    "&token=zzz;password=p",
    "OPENAI_API_KEY=sk-abc",
    "$HOME=/root",
    "x-y=z",
    '{"password": "hunter2", "name": "n"}',
    '"api_key":"v\\"q"',
    "--api-key X",
    "--token=abc",
    "-k secret",
    "a--token b",
    "x-token y",
    "---token z",
    "(--password p)",
    "--pass\u00e9 w",
    "long-term state-of-the-art",
    "é-token v",
    "\u00e9--token v",
    "_--token v",
    "K",
    "z",
    "b",
    "B",
    "@",
    "://",
    "=",
    "-",
    "\x00\x1f\x7f",
    "\u212a\u0130\u017f",  # Kelvin sign, dotted capital I, long s: case-folding oddities
    "日本語のテキスト",
    "emoji 😀 here",
    " ",
    "\n",
    "\t",
    "\u00a0",
]


def mixes(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parts = rng.choices(PIECES, k=rng.randint(1, 8))
        seps = rng.choices(["", " ", "-", "\n", "=", ":", "/", "\u3000", '"'], k=len(parts))
        out.append("".join(p + s for p, s in zip(parts, seps, strict=True)))
    return out


TEXTS = [*PIECES, *mixes(33, 3000)]


def test_scrub_text_is_what_it_was_on_hostile_texts() -> None:
    for text in TEXTS:
        assert scrub_text(text) == scrub_before(text), text


def test_the_flag_pattern_finds_what_it_found() -> None:
    for text in TEXTS:
        before = [m.groups() for m in _FLAG_PAIR_BEFORE.finditer(text)]
        assert [m.groups() for m in redact._FLAG_PAIR.finditer(text)] == before, text


def test_each_kind_of_secret_still_gets_past_the_guards() -> None:
    """A text with a secret of each kind is still scrubbed (each cheap check lets its kind through)."""
    secrets = [
        OPENAI_KEY,
        "xoxb-1234567890-abcdefghij",
        "AIzaSyA1234567890abcdefghijklmnopqrstu",
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "hf_abcdefghijklmnopqrstuvwxyz0123456789",
        "Bearer abc.def-ghi",
        "BEARER xyz123",
        "Basic dXNlcjpwYXNz",
        "https://user:hunter2@example.com/x",
        "?api_key=abcdef&x=1",
        "OPENAI_API_KEY=sk-abc",
        '{"password": "hunter2", "name": "n"}',
        "--api-key X",
        "(--password p)",
    ]
    for text in secrets:
        for framed in (text, f"see: {text} here", f"{text}\n" * 3):
            assert REDACTED_MARKER in scrub_text(framed), framed


@pytest.mark.parametrize("cap", [16, 700, 20_000])
def test_mid_length_strings_remembered_are_what_sanitize_makes(cap: int) -> None:
    """Strings past the short cache, up to _MEDIUM chars, are remembered: the same answer as the
    whole work, first time and again, at every cap (a prompt resent call after call)."""
    rng = random.Random(cap)
    texts = [
        "You are a helpful assistant. " * 24,  # the benchmark's system prompt, 696 chars
        "é" * 600,
        f"keys: {OPENAI_KEY} and Bearer {OPENAI_KEY} " * 30,
        "x" * redact._MEDIUM,
        "x" * (redact._MEDIUM + 1),
        "lone \ud800 " * 100,
        *(" ".join(rng.choices(PIECES, k=60)) for _ in range(50)),
    ]
    for text in texts:
        expected = redact._sanitize_str(text, cap)
        for _ in range(2):
            assert sanitize(text, cap) == expected
            assert sanitize({"m": [text]}, cap) == {"m": [expected]}


def test_sanitized_prompt_bytes_equal_the_whole_work() -> None:
    """A first prompt of a run, as the LLM_CALL records it: the same bytes from the memory as from
    the work itself, for a message list with secrets, over-long and non-ASCII strings, nested."""
    prompt: list[Any] = [
        {"role": "system", "content": "Follow the rules. " * 50 + f"api: {OPENAI_KEY}"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "ü" * 3000}, {"type": "text", "text": "--token=abc " * 80}],
        },
        {"role": "user", "content": "Summarise \x07 this, é: " + "word-word " * 100},
    ]
    for cap in (64, 20_000):
        once = orjson.dumps(sanitize(prompt, cap, 1))
        again = orjson.dumps(sanitize(prompt, cap, 1))
        reference = orjson.dumps(
            [
                {
                    k: redact._sanitize_str(v, cap)
                    if isinstance(v, str)
                    else [{kk: redact._sanitize_str(vv, cap) for kk, vv in b.items()} for b in v]
                    for k, v in m.items()
                }
                for m in prompt
            ]
        )
        assert once == again == reference
