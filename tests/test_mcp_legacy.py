"""`LegacyStreams` alone (legacy MCP HTTP+SSE, proxy/mcp/legacy.py): the `endpoint` event points
the client at Tripwire and remembers where its POSTs really go, a second one replaces the first, a
closed stream's endpoint leads nowhere, and Tripwire's own messages wait for a stream not yet open."""

from __future__ import annotations

from pathlib import Path

from proxy.mcp.legacy import LegacyStream, LegacyStreams
from proxy.settings import Settings
from proxy.upstreams import UpstreamRegistry
from tests.factories import make_route


def streams(tmp_path: Path) -> LegacyStreams:
    settings = Settings.model_validate(
        {"data_dir": tmp_path, "mcp": {"demo": {"url": "http://127.0.0.1:9/base/mcp"}}}
    )
    return LegacyStreams(UpstreamRegistry(settings))


def test_the_endpoint_event_is_rewritten_to_point_at_tripwire(tmp_path: Path) -> None:
    legacy = streams(tmp_path)
    route = make_route("/agents/bot/mcp/demo/sse", mcp_names=("demo",))
    stream = LegacyStream("demo")
    upstream_stream = "http://127.0.0.1:9/base/mcp/sse"
    rewritten = legacy.rewrite_endpoint(stream, route, upstream_stream, "/base/mcp/messages?session_id=42")
    assert rewritten == "/agents/bot/mcp/demo/messages?session_id=42"
    assert stream.upstream_post_url == "http://127.0.0.1:9/base/mcp/messages?session_id=42"
    assert legacy.for_endpoint("demo", "/messages", "session_id=42") is stream
    # a second endpoint event replaces the first
    legacy.rewrite_endpoint(stream, route, upstream_stream, "messages?session_id=43")
    assert legacy.for_endpoint("demo", "/messages", "session_id=42") is None
    assert legacy.for_endpoint("demo", "/messages", "session_id=43") is stream
    legacy.closed(stream)
    assert legacy.for_endpoint("demo", "/messages", "session_id=43") is None


def test_an_endpoint_elsewhere_keeps_its_own_path(tmp_path: Path) -> None:
    legacy = streams(tmp_path)
    route = make_route("/agents/bot/mcp/demo/sse", mcp_names=("demo",))
    stream = LegacyStream("demo")
    rewritten = legacy.rewrite_endpoint(stream, route, "http://127.0.0.1:9/base/mcp/sse", "/other/post?x=1")
    assert rewritten == "/agents/bot/mcp/demo/other/post?x=1"
    assert stream.upstream_post_url == "http://127.0.0.1:9/other/post?x=1"


async def test_injected_messages_wait_for_a_stream_not_yet_open(tmp_path: Path) -> None:
    legacy = streams(tmp_path)
    stream = LegacyStream("demo")
    legacy.inject(stream, b'{"jsonrpc":"2.0","id":1,"result":{}}')
    queued = stream.take_queued()
    assert queued.startswith(b"event: message\n") and b'"id":1' in queued
    assert stream.take_queued() == b""
