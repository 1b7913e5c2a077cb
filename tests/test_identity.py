"""Agent and session from proxy credentials (addons/identity.py): pure, runs in the main environment."""

from __future__ import annotations

import base64

import pytest

from addons.identity import from_basic, identity_headers


def basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (basic("research-agent:run-42"), ("research-agent", "run-42")),
        (basic("research-agent:"), ("research-agent", None)),
        (basic("research-agent"), ("research-agent", None)),
        ("basic " + base64.b64encode(b"a:b").decode(), ("a", "b")),
        (None, None),
        ("", None),
        ("Bearer abc", None),
        ("Basic", None),
        ("Basic not*base64", None),
        (basic(":only-a-password"), None),
        (basic("x" * 201), None),
        ("Basic " + base64.b64encode(b"\xff\xfe:x").decode(), None),
    ],
)
def test_from_basic(header: str | None, expected: tuple[str, str | None] | None) -> None:
    assert from_basic(header) == expected


def test_the_agents_own_headers_win() -> None:
    assert identity_headers(("a", "s"), set()) == {"X-Tripwire-Agent": "a", "X-Tripwire-Session": "s"}
    assert identity_headers(("a", None), set()) == {"X-Tripwire-Agent": "a"}
    assert identity_headers(("a", "s"), {"x-tripwire-agent"}) == {"X-Tripwire-Session": "s"}
    assert identity_headers(("a", "s"), {"x-tripwire-agent", "x-tripwire-session"}) == {}
    assert identity_headers(None, set()) == {}


def test_an_agent_key_in_the_proxy_credentials_becomes_the_calls_key() -> None:
    key = "tw_" + "k" * 43
    # agent:key -> the agent named, the key as the bearer key (in place of whatever the agent sent)
    assert identity_headers(("research", key), set()) == {
        "Authorization": f"Bearer {key}",
        "X-Tripwire-Agent": "research",
    }
    assert identity_headers(("research", key), {"authorization"})["Authorization"] == f"Bearer {key}"
    # the key alone as the user name: no agent named (the key names it)
    assert identity_headers((key, None), set()) == {"Authorization": f"Bearer {key}"}
    # the session slot stays a session when it is not a key
    assert "Authorization" not in identity_headers(("research", "run-1"), set())
    assert from_basic(basic(f"research:{key}")) == ("research", key)
