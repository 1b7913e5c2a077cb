"""The way out (proxy/egress.py): Tripwire reaches its upstream through `HTTP(S)_PROXY` unless
`NO_PROXY` exempts the host, with the proxy's credentials from its URL or `~/.netrc`, as aiohttp's
trust_env did, but read once at start instead of on every call.

The corporate proxy here is a fake forward proxy on 127.0.0.1 that answers absolute-form requests
itself (and says so in the answer), so a test sees which way a call went."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import AGENT_KEY, StartTripwire

PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "NETRC")


class ForwardProxy:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []  # (request target, Proxy-Authorization)
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.seen.append((str(request.url), request.headers.get("Proxy-Authorization")))
        return web.json_response(
            {
                "id": "chatcmpl-proxy",
                "object": "chat.completion",
                "model": "gpt-4o-mini",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "via the proxy"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
            }
        )


@pytest.fixture
async def forward_proxy(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[ForwardProxy, int]]:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    proxy = ForwardProxy()
    server = TestServer(proxy.app, host="127.0.0.1")
    await server.start_server()
    try:
        assert server.port is not None
        yield proxy, server.port
    finally:
        await server.close()


async def ask(base: str) -> str:
    # the agent itself ignores the proxy variables, which are set for Tripwire's way out
    http = openai.DefaultAsyncHttpxClient(trust_env=False)
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key=AGENT_KEY, max_retries=0, http_client=http)
    resp = await client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}]
    )
    return resp.choices[0].message.content or ""


async def test_calls_go_out_through_the_environments_proxy_with_its_credentials(
    start_tripwire: StartTripwire, fake_upstream: Any, forward_proxy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, port = forward_proxy
    _, upstream_url = fake_upstream
    monkeypatch.setenv("HTTP_PROXY", f"http://corp:s3cret@127.0.0.1:{port}")
    tw = await start_tripwire(upstream={"url": upstream_url})
    assert await ask(tw.url) == "via the proxy"
    assert await ask(tw.url) == "via the proxy"  # and again, from what was read at start
    expected_auth = "Basic " + base64.b64encode(b"corp:s3cret").decode()
    assert proxy.seen == [(f"{upstream_url}/v1/chat/completions", expected_auth)] * 2


async def test_no_proxy_exempts_the_upstream(
    start_tripwire: StartTripwire, fake_upstream: Any, forward_proxy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, port = forward_proxy
    _, upstream_url = fake_upstream
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    tw = await start_tripwire(upstream={"url": upstream_url})
    assert await ask(tw.url) == "Hello from the fake upstream"
    assert proxy.seen == []


async def test_the_proxys_credentials_can_come_from_netrc(
    start_tripwire: StartTripwire,
    fake_upstream: Any,
    forward_proxy: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    proxy, port = forward_proxy
    _, upstream_url = fake_upstream
    netrc = tmp_path / "netrc"
    netrc.write_text("machine localhost login corp password fromnetrc\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("HTTP_PROXY", f"http://localhost:{port}")
    tw = await start_tripwire(upstream={"url": upstream_url})
    assert await ask(tw.url) == "via the proxy"
    assert proxy.seen == [
        (f"{upstream_url}/v1/chat/completions", "Basic " + base64.b64encode(b"corp:fromnetrc").decode())
    ]
