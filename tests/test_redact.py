"""Secrets and truncation (SPEC §4.1): names matched as words, values scrubbed in text, bytes capped."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.constants import REDACTED_MARKER, TRUNCATED_MARKER
from proxy.redact import (
    is_secret_key,
    redact_argv,
    redact_headers,
    sanitize,
    scrub_text,
    split_words,
    truncate,
)

OPENAI_KEY = "sk-proj-4fQz9XbT1mK7pL2sV8nR3wY6"
ANTHROPIC_KEY = "sk-ant-api03-Zx81Qp0LmNn2Vb7Tt5Rr9Kk3"


@pytest.mark.parametrize(
    "name",
    [
        "client_secret",
        "access_token",
        "refreshToken",
        "refresh_token",
        "id_token",
        "x-api-key",
        "X-Api-Key",
        "api-key",
        "apiKey",
        "api_key",
        "APIKey",
        "apikey",
        "OPENAI_API_KEY",
        "Authorization",
        "authorization",
        "Proxy-Authorization",
        "Cookie",
        "Set-Cookie",
        "password",
        "db_password",
        "passwd",
        "secret",
        "token",
        "key",
        "credential",
        "credentials",
        "aws_secret_access_key",
        "x-goog-api-key",
        "privateKey",
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_key(name)


@pytest.mark.parametrize(
    "name",
    [
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "cached_tokens",
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "prompt_tokens_details",
        "reasoning_tokens",
        "tokens",
        "token_count",
        "progressToken",
        "nextPageToken",
        "NextToken",
        "eos_token",
        "monkey",
        "keyword",
        "author",
        "model",
        "sort_key",
        "public_key",
        "messages",
        "tool_call_id",
    ],
)
def test_non_secret_names(name: str) -> None:
    assert not is_secret_key(name)


def test_split_words() -> None:
    assert split_words("x-api-key") == ["x", "api", "key"]
    assert split_words("refreshToken") == ["refresh", "token"]
    assert split_words("APIKey") == ["api", "key"]
    assert split_words("client_secret") == ["client", "secret"]


def test_sanitize_redacts_secret_fields_and_keeps_usage_counts() -> None:
    body = {
        "model": "gpt-4o",
        "max_tokens": 100,
        "client_secret": "hunter2",
        "auth": {"access_token": "abc", "refreshToken": "def", "user": "bob"},
        "headers": {"x-api-key": "zzz", "Authorization": "Bearer qqq", "Accept": "application/json"},
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cached_tokens": 2},
    }
    out = sanitize(body, 20000)
    assert out["model"] == "gpt-4o"
    assert out["max_tokens"] == 100
    assert out["client_secret"] == REDACTED_MARKER
    assert out["auth"] == REDACTED_MARKER  # "auth" is a secret word: the whole object goes
    assert out["headers"] == {
        "x-api-key": REDACTED_MARKER,
        "Authorization": REDACTED_MARKER,
        "Accept": "application/json",
    }
    assert out["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "cached_tokens": 2,
    }
    assert body["client_secret"] == "hunter2", "input must not be mutated"


def test_sanitize_nested_lists_and_odd_types() -> None:
    obj = {"a": [{"password": "p"}, ("x", 1), {3: "three"}], "b": b"bytes", "c": None, "d": True}
    out = sanitize(obj, 20000)
    assert out == {
        "a": [{"password": REDACTED_MARKER}, ["x", 1], {"3": "three"}],
        "b": "bytes",
        "c": None,
        "d": True,
    }


def test_secret_name_with_null_value_stays_null() -> None:
    assert sanitize({"api_key": None}, 100) == {"api_key": None}


def test_provider_keys_inside_prompt_text() -> None:
    prompt = [{"role": "user", "content": f"my key is {OPENAI_KEY} and the other is {ANTHROPIC_KEY}, thanks"}]
    out = sanitize(prompt, 20000)
    text = out[0]["content"]
    assert OPENAI_KEY not in text and ANTHROPIC_KEY not in text
    assert text == f"my key is {REDACTED_MARKER} and the other is {REDACTED_MARKER}, thanks"
    assert out[0]["role"] == "user"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer xyz", f"Authorization: Bearer {REDACTED_MARKER}"),
        ("curl -H 'Authorization: Basic dXNlcjpwYXNz'", f"curl -H 'Authorization: Basic {REDACTED_MARKER}'"),
        ("https://user:pass@example.com/v1", f"https://{REDACTED_MARKER}@example.com/v1"),
        ("postgres://admin:s3cr3t@db:5432/x", f"postgres://{REDACTED_MARKER}@db:5432/x"),
        ("GET https://h/x?api_key=abc&model=gpt", f"GET https://h/x?api_key={REDACTED_MARKER}&model=gpt"),
        ("export OPENAI_API_KEY=abc123", f"export OPENAI_API_KEY={REDACTED_MARKER}"),
        ('{"password": "hunter2", "n": 1}', f'{{"password": "{REDACTED_MARKER}", "n": 1}}'),
        ("run --api-key XYZ --port 80", f"run --api-key {REDACTED_MARKER} --port 80"),
    ],
)
def test_scrub_text(text: str, expected: str) -> None:
    assert scrub_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "scikit-learn, sk-learn and task-runner are libraries",
        "a basic understanding of the bearer of news",
        "max_tokens=100 and prompt_tokens=5",
        '{"max_tokens": "100"}',
        "email me at bob@example.com",
        "https://example.com/path?model=gpt-4o&stream=true",
    ],
)
def test_scrub_text_leaves_ordinary_text(text: str) -> None:
    assert scrub_text(text) == text


def test_truncate_under_cap_is_unchanged() -> None:
    assert truncate("hello", 10) == "hello"
    s = "x" * 100
    assert truncate(s, 100) == s


def test_truncate_ascii_exact_byte_cap() -> None:
    out = truncate("a" * 1000, 100)
    assert out.endswith(TRUNCATED_MARKER)
    assert len(out.encode()) == 100


@pytest.mark.parametrize("char", ["é", "€", "😀", "中"])
@pytest.mark.parametrize("cap", range(14, 40))
def test_truncate_never_splits_a_code_point(char: str, cap: int) -> None:
    s = "ab" + char * 50
    out = truncate(s, cap)
    encoded = out.encode("utf-8")  # would raise on a lone surrogate
    assert len(encoded) <= cap
    assert out.endswith(TRUNCATED_MARKER)
    body = out[: -len(TRUNCATED_MARKER)]
    assert s.startswith(body)
    # the kept prefix is as long as the cap allows: one more char would not fit
    room = cap - len(TRUNCATED_MARKER)
    assert len(body.encode()) <= room < len(body.encode()) + len(char.encode())


def test_sanitize_truncates_every_string_and_scrubs_first() -> None:
    long_text = "z" * 50 + " " + OPENAI_KEY + " " + "y" * 100
    out = sanitize({"content": long_text, "list": ["q" * 200]}, 80)
    assert len(out["content"].encode()) <= 80 and out["content"].endswith(TRUNCATED_MARKER)
    assert "sk-proj" not in out["content"]  # the key was scrubbed before the cut could hide it
    assert len(out["list"][0].encode()) <= 80


def test_redact_argv() -> None:
    argv = [
        "tripwire",
        "serve",
        "--admin-token",
        "tok123",
        "--upstream",
        "https://u:p@api.example.com",
        "--api-key=sk-whatever",
        OPENAI_KEY,
        "--listen",
        "127.0.0.1:8713",
        "--mcp-stdio",
        "fs=npx server --token abc",
    ]
    out = redact_argv(argv)
    assert out == [
        "tripwire",
        "serve",
        "--admin-token",
        REDACTED_MARKER,
        "--upstream",
        f"https://{REDACTED_MARKER}@api.example.com",
        f"--api-key={REDACTED_MARKER}",
        REDACTED_MARKER,
        "--listen",
        "127.0.0.1:8713",
        "--mcp-stdio",
        f"fs=npx server --token {REDACTED_MARKER}",
    ]


def test_redact_headers() -> None:
    out = redact_headers(
        [("Authorization", "Bearer sk-x"), ("x-api-key", "k"), ("Referer", "https://a:b@h/")]
    )
    assert out == {
        "Authorization": REDACTED_MARKER,
        "x-api-key": REDACTED_MARKER,
        "Referer": f"https://{REDACTED_MARKER}@h/",
    }


def test_huge_strings_are_scrubbed_only_near_what_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    import proxy.redact as redact

    huge = "data:image/png;base64," + "QUJD" * 2_500_000 + " " + OPENAI_KEY  # 10 MB, key far past the cap
    scanned: list[int] = []
    real_scrub = redact.scrub_text
    monkeypatch.setattr(redact, "scrub_text", lambda text: scanned.append(len(text)) or real_scrub(text))
    out = sanitize({"url": huge}, 20000)["url"]
    # the scrubber read only the head that can be kept (plus its margin), never the 10 MB
    assert scanned and max(scanned) <= 20000 + redact._SCRUB_MARGIN
    assert len(out.encode()) <= 20000 and out.endswith(TRUNCATED_MARKER)
    assert out.startswith("data:image/png;base64,QUJD")


def test_huge_string_that_shrinks_a_lot_is_scrubbed_whole() -> None:
    # scrubbing turns 40 KB of keys into markers: the kept part must come from a fully scrubbed string
    keys = " ".join(f"sk-proj-{i:04d}abcdefghijklmnopqrstuvwxyz0123456789" for i in range(1000))
    out = sanitize(keys + " " + "tail " * 10, 20000)
    assert "sk-proj" not in out
    assert len(out.encode()) <= 20000


def test_keys_remembered_as_plain_are_judged_the_same_every_time() -> None:
    """_dict remembers ASCII keys that are not secret-named; the answers stay those of the full check,
    whatever came first (a null secret, a key of another type, a str subclass, non-ASCII text)."""

    class Name(str):
        pass

    first = {"api_key": None, "city": "Paris", 7: "seven", "clé": "x", "prompt_tokens": 3}
    second = {"api_key": "sk-live", Name("city"): "Lyon", "7": 7, "clé": None, "prompt_tokens": 4}
    for _ in range(3):
        assert sanitize(first, 1000) == {
            "api_key": None,
            "city": "Paris",
            "7": "seven",
            "clé": "x",
            "prompt_tokens": 3,
        }
        assert sanitize(second, 1000) == {
            "api_key": REDACTED_MARKER,
            "city": "Lyon",
            "7": 7,
            "clé": None,
            "prompt_tokens": 4,
        }
        assert sanitize({"token": "abc", "tokens": 5}, 1000) == {"token": REDACTED_MARKER, "tokens": 5}


def test_containers_past_the_depth_limit_become_the_marker_whatever_their_mix() -> None:
    """Dicts in dicts, lists in dicts, dicts in lists: every container DEPTH_LIMIT levels down (the
    root is level 0) is the marker; what is above it is kept."""
    from proxy.constants import DEPTH_LIMIT

    def reference(value: Any, depth: int = 0) -> Any:
        if isinstance(value, dict | list):
            if depth >= DEPTH_LIMIT:
                return TRUNCATED_MARKER
            if isinstance(value, dict):
                return {k: reference(v, depth + 1) for k, v in value.items()}
            return [reference(v, depth + 1) for v in value]
        return value

    for shape in ("dict", "list", "mixed"):
        value: Any = {"leaf": 1, "list": [2]}
        for level in range(DEPTH_LIMIT + 5):
            kind = shape if shape != "mixed" else ("dict", "list")[level % 2]
            value = {"next": value, "n": level} if kind == "dict" else [value, level]
        assert sanitize(value, 10_000) == reference(value), shape
