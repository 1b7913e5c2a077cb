"""Agent keys (SPEC §9, issue 22 acceptance 1) with the real openai, anthropic and mcp SDKs against
fakes on 127.0.0.1: no key, a wrong, revoked or expired key is refused in each protocol's shape with
nothing forwarded or recorded; a valid key's calls are recorded under its agent only; naming
another agent is a 403; the upstream gets its own key; the key and its hash appear nowhere but in
the key store (data dir files, logs, /metrics)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

pytest.importorskip("mcp")  # the MCP test servers; absent from the mitmproxy environment

from proxy.agent_keys import STORE_FILE, FileKeyStore, key_hash  # noqa: E402
from tests.conftest import Running, StartTripwire  # noqa: E402
from tests.fakes import FakeUpstream  # noqa: E402
from tests.mcp_servers import serve  # noqa: E402

UPSTREAM_KEY = "sk-real-upstream-key-0123456789"
ANTHROPIC_KEY = "sk-ant-real-upstream-key-0123"
HELLO = [{"role": "user", "content": "hello"}]


@dataclass
class Gateway:
    tw: Running
    fake: FakeUpstream
    mcp_url: str  # the MCP server's own URL (not through Tripwire)

    async def key(self, agent: str, **kw: Any) -> str:
        _, secret = await self.tw.engine.agent_keys.create(agent, **kw)
        return secret


@pytest.fixture
async def gateway(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Gateway]:
    fake, url = fake_upstream
    monkeypatch.setenv("TW_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
    monkeypatch.setenv("TW_TEST_ANTHROPIC_KEY", ANTHROPIC_KEY)
    with serve() as mcp_url:
        tw = await start_tripwire(
            auth={"require_agent_key": True},
            upstream={"url": url, "api_key_env": "TW_TEST_UPSTREAM_KEY"},
            llm={"claude": {"url": url, "api_key_env": "TW_TEST_ANTHROPIC_KEY", "auth_header": "x-api-key"}},
            mcp={"demo": {"url": mcp_url, "api_key": "none"}},
        )
        yield Gateway(tw, fake, mcp_url)


def oai(base: str, key: str | None, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base, api_key=key or "unset", max_retries=0, **kw)


def claude(base: str, key: str | None, **kw: Any) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base, api_key=key or "unset", max_retries=0, **kw)


async def mcp_tool_call(url: str, key: str | None, statuses: list[tuple[int, str]] | None = None) -> Any:
    """The mcp SDK's client calls the `add` tool; `statuses` gets each HTTP answer's status and
    WWW-Authenticate header."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    sent = {"Authorization": f"Bearer {key}"} if key is not None else {}

    async def seen(response: Any) -> None:
        if statuses is not None:
            statuses.append((response.status_code, response.headers.get("www-authenticate", "")))

    async with create_mcp_http_client(headers=sent) as http:
        http.event_hooks["response"].append(seen)
        async with Client(streamable_http_client(url, http_client=http), mode="legacy", cache=None) as client:
            return await client.call_tool("add", {"a": 2, "b": 40})


async def expired_key(gw: Gateway, agent: str) -> str:
    secret = await gw.key(agent, expires_in_s=3600)
    store = gw.tw.engine.agent_keys
    assert isinstance(store, FileKeyStore)
    with store._locked() as records:  # its expiry moved into the past
        digest = key_hash(secret)
        records[digest] = records[digest].model_copy(update={"expires": time.time() - 1})
    return secret


async def revoked_key(gw: Gateway, agent: str) -> str:
    secret = await gw.key(agent)
    (record,) = [r for r in await gw.tw.engine.agent_keys.list() if r.hash == key_hash(secret)]
    assert await gw.tw.engine.agent_keys.revoke(record.id) is not None
    return secret


async def bad_key(gw: Gateway, kind: str) -> str | None:
    if kind == "none":
        return None
    if kind == "wrong":
        return "tw_" + "A" * 43
    if kind == "provider":  # a provider's key is not an agent key
        return "sk-somebody-elses-openai-key"
    if kind == "revoked":
        return await revoked_key(gw, "alice")
    return await expired_key(gw, "alice")


@pytest.mark.parametrize("kind", ["none", "wrong", "provider", "revoked", "expired"])
async def test_refused_in_each_protocols_shape_nothing_forwarded_or_recorded(
    gateway: Gateway, kind: str
) -> None:
    gw, tw = gateway, gateway.tw
    key = await bad_key(gw, kind)

    with pytest.raises(openai.AuthenticationError) as oe:
        await oai(tw.url + "/v1", key).chat.completions.create(
            model="gpt-4o-mini",
            messages=HELLO,  # type: ignore[arg-type]
            extra_headers={"Authorization": openai.omit} if key is None else None,  # no key at all
        )
    assert oe.value.status_code == 401 and oe.value.code == "invalid_api_key"

    with pytest.raises(anthropic.AuthenticationError) as ae:
        await claude(tw.url + "/llm/claude", key).messages.create(
            model="claude-sonnet-4-5",
            max_tokens=16,
            messages=HELLO,  # type: ignore[list-item]
            extra_headers={"X-Api-Key": anthropic.omit} if key is None else None,
        )
    assert ae.value.status_code == 401
    assert ae.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http:
        # MCP: HTTP 401 with WWW-Authenticate: Bearer (MCP's authorization spec), for POST, GET and DELETE
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        for path in ("/mcp/demo", "/mcp"):  # a server, and the aggregate of every server (SPEC §3)
            for method in ("POST", "GET", "DELETE"):
                async with http.request(
                    method, tw.url + path, json=init if method == "POST" else None, headers=headers
                ) as r:
                    assert r.status == 401, (path, method)
                    assert r.headers["WWW-Authenticate"].startswith("Bearer ")
        # the Responses WebSocket: 401 before the upgrade
        with pytest.raises(aiohttp.WSServerHandshakeError) as we:
            await http.ws_connect(tw.url.replace("http", "ws") + "/v1/responses", headers=headers)
        assert we.value.status == 401
    # the mcp SDK's own client is refused too
    statuses: list[tuple[int, str]] = []
    with pytest.raises(Exception):  # noqa: B017 (the SDK raises its transport's error)
        await mcp_tool_call(tw.url + "/mcp/demo", key, statuses)
    assert statuses and all(s == 401 and www.startswith("Bearer ") for s, www in statuses), statuses

    await tw.flush()
    assert gw.fake.seen == [] and gw.fake.ws_handshakes == []
    assert tw.run_ids() == []  # nothing recorded under any agent


async def test_a_valid_keys_calls_are_its_agents_and_the_upstream_gets_its_own_key(gateway: Gateway) -> None:
    gw, tw = gateway, gateway.tw
    alice = await gw.key("alice")
    answer = await oai(tw.url + "/v1", alice).chat.completions.create(model="gpt-4o-mini", messages=HELLO)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "Hello from the fake upstream"
    message = await claude(tw.url + "/llm/claude", alice).messages.create(
        model="claude-sonnet-4-5",
        max_tokens=16,
        messages=HELLO,  # type: ignore[list-item]
    )
    assert message.content
    # the same agent may name itself (and pick its sessions)
    await oai(tw.url + "/agents/alice/sessions/s9/v1", alice).chat.completions.create(
        model="gpt-4o-mini",
        messages=HELLO,  # type: ignore[arg-type]
    )
    result = await mcp_tool_call(tw.url + "/mcp/demo", alice)
    assert result.structured_content == {"result": 42}
    await tw.flush()

    chat, messages = gw.fake.calls("/v1/chat/completions"), gw.fake.calls("/v1/messages")
    assert [c.headers["Authorization"] for c in chat] == [f"Bearer {UPSTREAM_KEY}"] * 2
    assert messages[0].headers["x-api-key"] == ANTHROPIC_KEY
    for seen in gw.fake.seen:
        assert alice not in repr(seen.headers) and key_hash(alice) not in repr(seen.headers)
    agents = {tw.tripwire_json(r)["agent_name"] for r in tw.run_ids()}
    assert agents == {"alice"}
    tools = [e for r in tw.run_ids() for e in tw.events(r) if e["event_type"] == "TOOL_CALL"]
    assert [t["name"] for t in tools] == ["add"]


async def test_a_key_naming_another_agent_is_403(gateway: Gateway) -> None:
    gw, tw = gateway, gateway.tw
    alice = await gw.key("alice")
    await gw.key("bob")
    with pytest.raises(openai.PermissionDeniedError):
        await oai(tw.url + "/v1", alice, default_headers={"X-Tripwire-Agent": "bob"}).chat.completions.create(
            model="gpt-4o-mini",
            messages=HELLO,  # type: ignore[arg-type]
        )
    with pytest.raises(openai.PermissionDeniedError):
        await oai(tw.url + "/agents/bob/v1", alice).chat.completions.create(
            model="gpt-4o-mini", messages=HELLO
        )  # type: ignore[arg-type]
    # a header naming the key's own agent does not make a path naming another one right
    with pytest.raises(openai.PermissionDeniedError):
        await oai(
            tw.url + "/agents/bob/v1", alice, default_headers={"X-Tripwire-Agent": "alice"}
        ).chat.completions.create(model="gpt-4o-mini", messages=HELLO)  # type: ignore[arg-type]
    with pytest.raises(anthropic.PermissionDeniedError) as ae:
        await claude(tw.url + "/agents/bob/llm/claude", alice).messages.create(
            model="claude-sonnet-4-5",
            max_tokens=16,
            messages=HELLO,  # type: ignore[list-item]
        )
    assert ae.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    async with aiohttp.ClientSession() as http:
        async with http.post(
            tw.url + "/agents/bob/mcp/demo",
            json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
            headers={"Authorization": f"Bearer {alice}"},
        ) as r:
            assert r.status == 403 and r.headers["WWW-Authenticate"].startswith("Bearer ")
        with pytest.raises(aiohttp.WSServerHandshakeError) as we:
            await http.ws_connect(
                tw.url.replace("http", "ws") + "/agents/bob/v1/responses",
                headers={"Authorization": f"Bearer {alice}"},
            )
        assert we.value.status == 403
    await tw.flush()
    assert gw.fake.seen == [] and tw.run_ids() == []


async def test_a_key_in_another_header_or_the_query_is_not_accepted(gateway: Gateway) -> None:
    gw, tw = gateway, gateway.tw
    alice = await gw.key("alice")
    async with aiohttp.ClientSession() as http:
        for url, headers in (
            (tw.url + f"/v1/chat/completions?api_key={alice}", {}),
            (tw.url + "/v1/chat/completions", {"X-Agent-Key": alice}),
            (tw.url + "/v1/chat/completions", {"Authorization": f"Basic {alice}"}),
        ):
            async with http.post(url, json={"model": "m", "messages": HELLO}, headers=headers) as r:
                assert r.status == 401, (url, headers)
        # each place a protocol carries its key is accepted
        for headers in ({"Authorization": f"Bearer {alice}"}, {"x-api-key": alice}, {"api-key": alice}):
            async with http.post(
                tw.url + "/v1/chat/completions", json={"model": "m", "messages": HELLO}, headers=headers
            ) as r:
                assert r.status == 200, headers
    assert len(gw.fake.calls("/v1/chat/completions")) == 3


async def test_the_key_and_its_hash_appear_nowhere_but_the_key_store(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    gw, tw = gateway, gateway.tw
    alice = await gw.key("alice", note="ci agent")
    revoked = await revoked_key(gw, "alice")
    await oai(tw.url + "/v1", alice).chat.completions.create(model="gpt-4o-mini", messages=HELLO)  # type: ignore[arg-type]
    await claude(tw.url + "/llm/claude", alice).messages.create(
        model="claude-sonnet-4-5",
        max_tokens=16,
        messages=HELLO,  # type: ignore[list-item]
    )
    await mcp_tool_call(tw.url + "/mcp/demo", alice)
    with pytest.raises(openai.AuthenticationError):
        await oai(tw.url + "/v1", revoked).chat.completions.create(model="gpt-4o-mini", messages=HELLO)  # type: ignore[arg-type]
    with pytest.raises(openai.PermissionDeniedError):
        await oai(tw.url + "/agents/bob/v1", alice).chat.completions.create(
            model="gpt-4o-mini", messages=HELLO
        )  # type: ignore[arg-type]
    async with aiohttp.ClientSession() as http:
        async with http.get(tw.admin_url + "/metrics") as r:
            metrics = await r.text()
    await tw.engine.close()  # runs end, every file written
    secrets_ = [alice, revoked, key_hash(alice), key_hash(revoked)]
    files = [p for p in tw.data_dir.rglob("*") if p.is_file() and p.name != STORE_FILE]
    assert any(p.name == "events.jsonl" for p in files)
    for path in files:
        text = path.read_bytes().decode(errors="replace")
        for secret in secrets_:
            assert secret not in text, path
    logs = "\n".join(r.getMessage() for r in caplog.records)
    assert "refused" in logs
    for secret in secrets_:
        assert secret not in logs and secret not in metrics
    assert 'tripwire_auth_refusals_total{reason="revoked"} 1.0' in metrics
    assert 'tripwire_auth_refusals_total{reason="other_agent"} 1.0' in metrics
    # the store keeps only hashes, readable by its owner alone
    store_file = tw.data_dir / STORE_FILE
    assert alice not in store_file.read_text() and key_hash(alice) in store_file.read_text()
    assert store_file.stat().st_mode & 0o777 == 0o600


async def test_without_require_agent_key_a_tripwire_key_is_still_never_forwarded(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    await oai(tw.url + "/v1", "tw_" + "x" * 43).chat.completions.create(model="gpt-4o-mini", messages=HELLO)  # type: ignore[arg-type]
    assert "Authorization" not in fake.calls("/v1/chat/completions")[0].headers


def test_start_up_refuses_an_upstream_without_a_key_source(tmp_path: Path) -> None:
    from proxy.settings import ConfigError, load_settings

    base = {"data_dir": str(tmp_path), "auth": {"require_agent_key": True}}
    with pytest.raises(ConfigError) as e:
        load_settings(
            {
                **base,
                "upstream": {"url": "http://127.0.0.1:1", "api_key_env": "K"},
                "mcp": {"files": "http://127.0.0.1:2/mcp"},
            },
            cwd=tmp_path,
            home=tmp_path,
            environ={},
        )
    assert "auth.require_agent_key" in str(e.value) and "mcp.files" in str(e.value)
    assert "upstream," not in str(e.value)
    with pytest.raises(ConfigError, match="missing for upstream"):
        load_settings(base, cwd=tmp_path, home=tmp_path, environ={})
    ok = load_settings(
        {
            **base,
            "upstream": {"url": "http://127.0.0.1:1", "api_key_file": str(tmp_path / "k")},
            "mcp": {"files": {"url": "http://127.0.0.1:2/mcp", "api_key": "none"}},
        },
        cwd=tmp_path,
        home=tmp_path,
        environ={},
    )
    assert ok.auth.require_agent_key and ok.mcp["files"].api_key == "none"
    with pytest.raises(ConfigError, match="api_key"):
        load_settings(
            {**base, "upstream": {"url": "http://127.0.0.1:1", "api_key": "nothing"}},
            cwd=tmp_path,
            home=tmp_path,
            environ={},
        )


async def test_an_unknown_route_lists_the_upstreams_to_key_holders_only(gateway: Gateway) -> None:
    alice = await gateway.key("alice")
    async with aiohttp.ClientSession() as http:
        async with http.get(gateway.tw.url + "/mcp/nope") as r:
            assert r.status == 401 and "demo" not in await r.text()
        async with http.get(gateway.tw.url + "/mcp/nope", headers={"Authorization": f"Bearer {alice}"}) as r:
            assert r.status == 404 and (await r.json())["error"]["configured"] == ["demo"]


async def test_a_responses_websocket_with_a_valid_key_is_its_agents(gateway: Gateway) -> None:
    from tests.test_websocket import BETA, create, until_done

    gw, tw = gateway, gateway.tw
    alice = await gw.key("alice")
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers={"Authorization": f"Bearer {alice}", **BETA}) as ws,
    ):
        await ws.send_str(create(input="hello"))
        events = await until_done(ws)
    assert events[-1]["type"] == "response.completed"
    (handshake,) = gw.fake.ws_handshakes
    assert handshake.headers["Authorization"] == f"Bearer {UPSTREAM_KEY}" and alice not in repr(
        handshake.headers
    )
    await tw.flush()
    assert {tw.tripwire_json(r)["agent_name"] for r in tw.run_ids()} == {"alice"}


async def test_legacy_sse_mcp_needs_the_key_on_its_stream_and_its_posts(
    start_tripwire: StartTripwire, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcp import Client
    from mcp.client.sse import sse_client

    monkeypatch.setenv("TW_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
    with serve("sse") as sse_url:
        tw = await start_tripwire(
            auth={"require_agent_key": True},
            upstream={"url": "http://127.0.0.1:9", "api_key_env": "TW_TEST_UPSTREAM_KEY"},
            mcp={"old": {"url": sse_url, "api_key": "none"}},
        )
        _, alice = await tw.engine.agent_keys.create("alice")
        headers = {"Authorization": f"Bearer {alice}"}
        async with Client(
            sse_client(tw.url + "/mcp/old", headers=headers), mode="legacy", cache=None
        ) as client:
            result = await client.call_tool("add", {"a": 2, "b": 40})
        assert result.structured_content == {"result": 42}
        async with aiohttp.ClientSession() as http:
            async with http.get(tw.url + "/mcp/old") as r:  # the stream without a key
                assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Bearer ")
            async with http.post(tw.url + "/mcp/old/messages/?session_id=x", json={}) as r:  # a POST without
                assert r.status == 401
        await tw.flush()
    (run_id,) = tw.run_ids()
    assert tw.tripwire_json(run_id)["agent_name"] == "alice"
    assert [e["name"] for e in tw.events(run_id) if e["event_type"] == "TOOL_CALL"] == ["add"]
