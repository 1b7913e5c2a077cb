"""The Forwarder's pure parts: header filtering both ways, joining the upstream URL, retry back-off
and which errors are retried, Tripwire's own JSON errors, and the ObserverFeed that feeds observers a
compressed answer decoded while the client gets the upstream's bytes.

`Forwarder.forward` / `send` themselves need an upstream to talk to and a prepared
`web.StreamResponse` (a client connection): they are covered end to end (test_forward_retries.py,
test_forwarding_edges.py, test_reliability_streams.py)."""

from __future__ import annotations

import gzip

import aiohttp
import orjson
import pytest
from multidict import CIMultiDict

from proxy.forward import (
    MAX_BACKOFF_S,
    ObserverFeed,
    backoff_delay,
    content_codings,
    json_error,
    request_headers,
    response_headers,
    retryable_error,
)
from proxy.llm import BodyCollector
from proxy.routing import join_upstream
from proxy.settings import UpstreamConfig

PLAIN = UpstreamConfig(url="https://api.example.com/v1")


def incoming(**extra: str) -> CIMultiDict[str]:
    h: CIMultiDict[str] = CIMultiDict(
        {
            "Host": "127.0.0.1:8713",
            "Authorization": "Bearer sk-agent",
            "Content-Type": "application/json",
            "Content-Length": "12",
            "Accept-Encoding": "gzip, br",
            "Connection": "keep-alive, X-Hop",
            "X-Hop": "1",
            "Keep-Alive": "timeout=5",
            "X-Tripwire-Agent": "bot",
            "X-Tripwire-Session": "s1",
            "OpenAI-Beta": "assistants=v2",
        }
    )
    h.update(extra)
    return h


def test_request_headers_drop_hop_by_hop_host_and_tripwires_own() -> None:
    out = request_headers(incoming(), PLAIN, identity_encoding=False)
    assert dict(out) == {
        "Authorization": "Bearer sk-agent",
        "Content-Type": "application/json",
        "Accept-Encoding": "gzip, br",
        "OpenAI-Beta": "assistants=v2",
    }


def test_request_headers_ask_for_identity_when_the_proxy_reads_the_answer() -> None:
    out = request_headers(incoming(), PLAIN, identity_encoding=True)
    assert out.getall("Accept-Encoding") == ["identity"]


def test_the_upstreams_own_key_replaces_the_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TW_TEST_KEY", "sk-real")
    bearer = UpstreamConfig(url="https://api.example.com", api_key_env="TW_TEST_KEY")
    out = request_headers(incoming(**{"x-api-key": "agent"}), bearer, identity_encoding=False)
    assert out.getall("Authorization") == ["Bearer sk-real"] and "x-api-key" not in out
    anthropic = UpstreamConfig(
        url="https://api.example.com", api_key_env="TW_TEST_KEY", auth_header="x-api-key"
    )
    out = request_headers(incoming(), anthropic, identity_encoding=False)
    assert out["x-api-key"] == "sk-real" and "Authorization" not in out


def test_response_headers_keep_length_unless_the_body_is_rewritten() -> None:
    upstream = CIMultiDict(
        {"Content-Type": "text/event-stream", "Content-Length": "10", "Transfer-Encoding": "chunked"}
    )
    assert dict(response_headers(upstream, drop_length=False)) == {
        "Content-Type": "text/event-stream",
        "Content-Length": "10",
    }
    assert dict(response_headers(upstream, drop_length=True)) == {"Content-Type": "text/event-stream"}


@pytest.mark.parametrize(
    ("base", "path", "query", "url"),
    [
        (
            "https://api.openai.com/v1",
            "/v1/chat/completions",
            "",
            "https://api.openai.com/v1/chat/completions",
        ),
        ("https://api.openai.com/v1/", "/v1", "", "https://api.openai.com/v1"),
        ("https://api.openai.com", "/v1/models", "limit=2", "https://api.openai.com/v1/models?limit=2"),
        ("https://x.example/v1", "/v1beta/models", "", "https://x.example/v1/v1beta/models"),
        ("http://127.0.0.1:3/mcp", "", "", "http://127.0.0.1:3/mcp"),
    ],
)
def test_join_upstream(base: str, path: str, query: str, url: str) -> None:
    assert join_upstream(base, path, query) == url


def test_backoff_doubles_is_capped_and_jittered_down_to_half() -> None:
    assert [backoff_delay(n, 0.5, rand=lambda: 0.0) for n in (1, 2, 3)] == [0.25, 0.5, 1.0]
    assert backoff_delay(1, 0.5, rand=lambda: 1.0) == 0.5
    assert backoff_delay(30, 0.5, rand=lambda: 1.0) == MAX_BACKOFF_S


def test_only_connection_errors_are_retried() -> None:
    key = aiohttp.client_reqrep.ConnectionKey("h", 1, False, True, None, None, None)
    assert retryable_error(aiohttp.ClientConnectorError(key, OSError("refused")))
    assert retryable_error(aiohttp.ConnectionTimeoutError())
    assert not retryable_error(aiohttp.SocketTimeoutError())  # a read timeout: the request was sent
    assert not retryable_error(aiohttp.ClientPayloadError())
    assert not retryable_error(ValueError())


def test_json_error_is_openai_shaped() -> None:
    answer = json_error(502, "no upstream", "upstream_unreachable", "upstream_unreachable", server="x")
    assert answer.status == 502 and answer.content_type == "application/json"
    assert orjson.loads(answer.body) == {
        "error": {
            "message": "no upstream",
            "type": "upstream_unreachable",
            "code": "upstream_unreachable",
            "server": "x",
        }
    }


def test_the_observer_feed_decodes_for_the_observer_and_relays_the_upstreams_bytes() -> None:
    body = orjson.dumps({"hello": "world" * 100})
    compressed = gzip.compress(body)
    collector = BodyCollector(1 << 20)
    tap = ObserverFeed(collector, content_codings(CIMultiDict({"Content-Encoding": "gzip"})))
    relayed = b"".join(tap.feed(compressed[i : i + 17]) for i in range(0, len(compressed), 17)) + tap.flush()
    assert relayed == compressed
    assert collector.body() == body


def test_the_observer_feed_passes_bytes_on_when_it_cannot_decode() -> None:
    collector = BodyCollector(1 << 20)
    tap = ObserverFeed(collector, ["gzip"])
    assert tap.feed(b"not gzip at all") == b"not gzip at all"
    assert tap.decode_error is not None and collector.body() == b""


def test_content_codings_in_the_order_applied() -> None:
    headers = CIMultiDict([("Content-Encoding", "deflate"), ("Content-Encoding", "identity, gzip")])
    assert content_codings(headers) == ["deflate", "gzip"]
