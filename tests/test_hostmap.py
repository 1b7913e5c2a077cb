"""The addon's host map (addons/hostmap.py): pure, so it runs in the main environment too."""

from __future__ import annotations

import pytest

from addons.hostmap import DEFAULT_HOSTS, Intercept, match, parse_entry, parse_host_map, with_reverse_target


def test_defaults_send_openai_and_anthropic_to_their_own_hosts() -> None:
    openai_, anthropic = parse_host_map(DEFAULT_HOSTS)
    assert (openai_.url, openai_.prefix) == ("https://api.openai.com", "/llm/default")
    assert (anthropic.url, anthropic.prefix) == ("https://api.anthropic.com", "/llm/anthropic")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("API.Example.com=default", Intercept("api.example.com", None, "https", "llm", "default")),
        ("http://127.0.0.1:8080=local", Intercept("127.0.0.1", 8080, "http", "llm", "local")),
        (
            "https://mcp.example.com:8443/=mcp:docs",
            Intercept("mcp.example.com", 8443, "https", "mcp", "docs"),
        ),
        ("[::1]:9000=v6", Intercept("::1", 9000, "https", "llm", "v6")),
    ],
)
def test_parse_entry(text: str, expected: Intercept) -> None:
    assert parse_entry(text) == expected


def test_urls_keep_a_non_default_port_only() -> None:
    assert parse_entry("https://h:443=a").url == "https://h"
    assert parse_entry("http://h:80=a").url == "http://h"
    assert parse_entry("http://h:8080=a").url == "http://h:8080"
    assert parse_entry("[::1]:9000=v6").url == "https://[::1]:9000"
    assert parse_entry("h=mcp:docs").prefix == "/mcp/docs"


@pytest.mark.parametrize(
    "text",
    [
        "api.openai.com",
        "=default",
        "api.openai.com=",
        "ftp://h=a",
        "h:99999=a",
        "h:x=a",
        "h=bad/name",
        "h=mcp:",
    ],
)
def test_bad_entries_say_what_is_wrong(text: str) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        parse_entry(text)


def test_one_name_is_one_upstream() -> None:
    with pytest.raises(ValueError, match="already https://a.example"):
        parse_host_map(["a.example=default", "b.example=default"])
    # the same URL twice (e.g. with and without its default port) is fine, and blanks are skipped
    assert len(parse_host_map(["a.example=x", "a.example:443=x", " "])) == 2


def test_match_prefers_the_exact_port_then_a_portless_entry() -> None:
    entries = parse_host_map(["h.example=any", "http://h.example:8080=eighty"])
    assert match(entries, "H.EXAMPLE", 8080).name == "eighty"  # type: ignore[union-attr]
    assert match(entries, "h.example", 443).name == "any"  # type: ignore[union-attr]
    assert match(entries, "other.example", 443) is None
    only_port = parse_host_map(["http://127.0.0.1:8080=p"])
    assert match(only_port, "127.0.0.1", 8081) is None
    assert match(parse_host_map(["[::1]:9000=v6"]), "[::1]", 9000) is not None


def test_reverse_target_becomes_the_default_upstream_unless_mapped() -> None:
    entries = parse_host_map(DEFAULT_HOSTS)
    out = with_reverse_target(entries, "http", "127.0.0.1", 9999)
    target = match(out, "127.0.0.1", 9999)
    assert target is not None and (target.url, target.name) == ("http://127.0.0.1:9999", "default")
    assert [e.name for e in out].count("default") == 1  # api.openai.com gave `default` up
    assert match(out, "api.anthropic.com", 443) is not None
    # a reverse proxy in front of a host the map already names keeps the map's entry
    mapped = with_reverse_target(entries, "https", "api.anthropic.com", 443)
    assert mapped == entries
    with pytest.raises(ValueError):
        with_reverse_target(entries, "tcp", "h", 1)
