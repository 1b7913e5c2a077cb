"""Shared dialect helpers: prompt estimates (attachments counted sensibly), tool arguments, sniffing."""

from __future__ import annotations

import base64

from proxy.dialects import anthropic, openai_chat
from proxy.dialects.base import ATTACHMENT_TOKENS, BodySniffer, estimate_prompt_tokens, parse_arguments

IMAGE = base64.b64encode(bytes(range(256)) * 4000).decode()  # ~1.3 MB of base64


def test_text_is_chars_over_four() -> None:
    req = openai_chat.parse_request({"messages": [{"role": "user", "content": "word " * 800}]})
    assert 1000 <= estimate_prompt_tokens(req) < 1020


def test_inline_images_count_as_attachments_not_by_size() -> None:
    chat = openai_chat.parse_request(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{IMAGE}"}},
                    ],
                }
            ]
        }
    )
    assert ATTACHMENT_TOKENS <= estimate_prompt_tokens(chat) < ATTACHMENT_TOKENS + 50
    claude = anthropic.parse_request(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": IMAGE},
                        }
                    ],
                }
            ]
        }
    )
    assert ATTACHMENT_TOKENS <= estimate_prompt_tokens(claude) < ATTACHMENT_TOKENS + 50


def test_long_prose_is_not_an_attachment() -> None:
    prose = "The quick brown fox jumps over the lazy dog. " * 200
    req = openai_chat.parse_request({"messages": [{"role": "user", "content": prose}]})
    assert estimate_prompt_tokens(req) > len(prose) // 4


def test_parse_arguments() -> None:
    assert parse_arguments('{"a": [1, 2.5]}') == {"a": [1, 2.5]}
    assert parse_arguments("{broken") == "{broken"
    assert parse_arguments("") == {}
    assert parse_arguments({"already": "parsed"}) == {"already": "parsed"}


def test_body_sniffer() -> None:
    sse = BodySniffer()
    assert sse.feed(b"\n") is True and sse.mode is None  # blank bytes: undecided, nothing to decode
    assert sse.feed(b"da") is False and sse.mode == "sse"
    body = BodySniffer()
    assert body.feed(b'  {"error"') is True and body.mode == "body"
    assert body.feed(b": 1}") is True
    assert bytes(body.body) == b'  {"error": 1}'


def test_token_counts_are_read_defensively() -> None:
    from proxy.dialects.base import as_int, openai_usage

    assert [as_int(v) for v in (3, 3.0, 3.5, "3", None, True)] == [3, 3, 0, 0, 0, 0]
    usage = openai_usage({"prompt_tokens": 10.0, "completion_tokens": 2, "prompt_tokens_details": None})
    assert usage is not None and (usage.prompt_tokens, usage.total_tokens, usage.cached_tokens) == (10, 12, 0)
    assert openai_usage(None) is None
