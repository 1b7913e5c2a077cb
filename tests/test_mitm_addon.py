"""The mitmproxy addon (addons/tripwire_addon.py) and `tripwire intercept`, as real processes.

Each test starts `mitmdump -s addons/tripwire_addon.py` (or `tripwire intercept`) on a free 127.0.0.1
port in front of a fake upstream, drives the real `openai` SDK through it, stops it with SIGTERM (the
addon's `done` closes the runs) and reads the trace files Tripwire wrote. Runs only in the mitmproxy
environment (`scripts/test.sh` builds `.venv-mitm`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import ssl
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mitmproxy")

import openai  # noqa: E402
from aiohttp import web  # noqa: E402
from aiohttp.test_utils import TestServer  # noqa: E402
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from mitmproxy import certs  # noqa: E402

from addons.intercept import mitm_options  # noqa: E402
from addons.tripwire_addon import forward_hint, intercepts_for, proxy_loop  # noqa: E402
from proxy.cli import build_parser  # noqa: E402
from tests.conftest import AGENT_KEY  # noqa: E402
from tests.fakes import FakeUpstream, Reply  # noqa: E402
from tests.schema import assert_run_valid  # noqa: E402

pytestmark = pytest.mark.mitm

REPO = Path(__file__).resolve().parent.parent
ADDON = REPO / "addons" / "tripwire_addon.py"
BIN = Path(sys.executable).parent
CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]
TEXT = "Hello from the fake upstream"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Mitm:
    proc: asyncio.subprocess.Process
    port: int
    data_dir: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    async def stop(self) -> int:
        """SIGTERM, as a user's Ctrl-C or a pod stop: the addon drains and writes RUN_END."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), 20)

    def runs(self) -> list[str]:
        runs = self.data_dir / "runs"
        return sorted(p.name for p in runs.iterdir()) if runs.exists() else []

    def trace(self) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
        (run_id,) = self.runs()
        meta, events = assert_run_valid(self.data_dir, run_id)
        return run_id, meta, events


def clean_env(home: Path) -> dict[str, str]:
    """No proxy or Tripwire settings leak in from the machine; HOME holds mitmproxy's CA and user config."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TRIPWIRE_") and k.lower() not in ("https_proxy", "http_proxy", "all_proxy")
    }
    env["HOME"] = str(home)
    return env


@pytest.fixture
async def launch(tmp_path: Path) -> AsyncIterator[Any]:
    started: list[Mitm] = []

    async def start(*args: str, cli: bool = False, env: dict[str, str] | None = None) -> Mitm:
        port = free_port()
        data_dir = tmp_path / f"data{len(started) or ''}"
        log = tmp_path / f"mitm{len(started)}.log"
        if cli:
            cmd = [
                str(BIN / "tripwire"),
                "intercept",
                "--listen-port",
                str(port),
                "--data-dir",
                str(data_dir),
            ]
            cmd += ["--no-viewer", *args]
        else:
            cmd = [str(BIN / "mitmdump"), "-s", str(ADDON), "--listen-host", "127.0.0.1", "-p", str(port)]
            cmd += ["--set", f"tripwire_data_dir={data_dir}", "--set", "tripwire_admin_listen=off", *args]
        home = tmp_path / "home"
        home.mkdir(exist_ok=True)
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdout=out, stderr=asyncio.subprocess.STDOUT, cwd=tmp_path, env=env or clean_env(home)
            )
        mitm = Mitm(proc, port, data_dir, log)
        started.append(mitm)
        deadline = time.monotonic() + 30
        while "Tripwire intercepting" not in mitm.output():
            if proc.returncode is not None or time.monotonic() > deadline:
                pytest.fail(f"mitmproxy did not start ({cmd}):\n{mitm.output()}")
            await asyncio.sleep(0.05)
        return mitm

    yield start
    for mitm in started:
        if mitm.proc.returncode is None:
            mitm.proc.kill()
            await mitm.proc.wait()


def lower(headers: Any) -> dict[str, str]:
    """Header names as sent vary in case between HTTP clients."""
    return {k.lower(): v for k, v in headers.items()}


def only(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event_type"] == kind]


def sdk(base_url: str, session: str | None = "mitm-s1", **kw: Any) -> openai.AsyncOpenAI:
    """An SDK client; session None: an agent that cannot set headers (no X-Tripwire-*)."""
    headers = {"X-Tripwire-Session": session, "X-Tripwire-Agent": "mitm-agent"} if session else {}
    return openai.AsyncOpenAI(
        base_url=base_url, api_key=AGENT_KEY, default_headers=headers, max_retries=0, **kw
    )


# --- reverse mode ---------------------------------------------------------------------------------


async def test_reverse_mode_records_plain_and_streamed_chat(
    launch: Any, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    resume = asyncio.Event()
    fake.replies = [Reply(text=TEXT), Reply(text=TEXT, pause_after_chunks=1, resume=resume)]
    mitm = await launch("--mode", f"reverse:{url}")
    llm = sdk(f"{mitm.url}/v1")

    plain = await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert plain.choices[0].message.content == TEXT
    assert plain.usage is not None and plain.usage.prompt_tokens == 100

    stream = await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO, stream=True)
    pieces: list[str] = []
    async for chunk in stream:
        pieces.extend(c.delta.content or "" for c in chunk.choices)
        # relayed as it came, not buffered by mitmproxy until the end: the first event reached the
        # agent while the upstream holds the rest back until now
        resume.set()
    assert "".join(pieces) == TEXT

    assert await mitm.stop() == 0
    # the upstream got the agent's own call: its key, no X-Tripwire-* headers, Tripwire's usage request
    calls = fake.calls(CHAT)
    assert len(calls) == 2
    for seen in calls:
        assert lower(seen.headers)["authorization"] == f"Bearer {AGENT_KEY}"
        assert not [h for h in seen.headers if h.lower().startswith("x-tripwire")]
    assert calls[1].body["stream_options"] == {"include_usage": True}

    run_id, meta, events = mitm.trace()
    assert [e["event_type"] for e in events] == ["RUN_START", "LLM_CALL", "LLM_CALL", "RUN_END"]
    first, second = only(events, "LLM_CALL")
    assert (first["payload"]["stream"], second["payload"]["stream"]) == (False, True)
    for call in (first, second):
        assert call["payload"]["response"]["text"] == TEXT
        assert call["payload"]["usage"]["prompt_tokens"] == 100
        assert call["payload"]["upstream"] == "default" and call["payload"]["status"] == "ok"
        assert call["meta"]["agent"] == "mitm-agent" and call["meta"]["session_id"] == "mitm-s1"
    assert meta["status"] == "ok" and meta["counts"]["llm_calls"] == 2
    assert AGENT_KEY not in (mitm.data_dir / "runs" / run_id / "events.jsonl").read_text()


async def test_limit_through_the_addon_answers_429_and_ends_the_run(
    launch: Any, fake_upstream: tuple[FakeUpstream, str], tmp_path: Path
) -> None:
    fake, url = fake_upstream
    config = tmp_path / "tripwire.yaml"
    config.write_text("limits:\n  max_llm_calls: 1\n")
    mitm = await launch("--mode", f"reverse:{url}", "--set", f"tripwire_config={config}")
    llm = sdk(f"{mitm.url}/v1", session="capped")

    await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    with pytest.raises(openai.RateLimitError) as caught:
        await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    err = caught.value.response
    assert err.status_code == 429
    assert err.headers["x-should-retry"] == "false"
    assert err.headers["X-Tripwire-Guard"] == "max_llm_calls"
    body = err.json()["error"]
    assert body["type"] == "tripwire_guard" and body["guardrail"] == "max_llm_calls"
    assert len(fake.calls(CHAT)) == 1  # the refused call never reached the upstream

    assert await mitm.stop() == 0
    _, meta, events = mitm.trace()
    assert [e["event_type"] for e in events][-2:] == ["ERROR", "RUN_END"]
    assert events[-2]["payload"]["guardrail"] == "max_llm_calls"
    assert events[-1]["payload"]["status"] == "error" and meta["status"] == "error"


async def test_loop_block_is_the_sdks_own_streamed_answer_through_the_addon(
    launch: Any, fake_upstream: tuple[FakeUpstream, str], tmp_path: Path
) -> None:
    """An Anthropic agent loop, streamed: the blocked answer is a synthetic stream ending the turn."""
    import anthropic

    fake, url = fake_upstream
    fake.replies = [Reply(tool_calls=[(f"toolu_{i}", "get_weather", {"city": "Paris"})]) for i in range(20)]
    config = tmp_path / "loop.yaml"
    config.write_text("loop_detection:\n  action: block\n  threshold: 4\n  max_repeated_tool_steps: 10\n")
    mitm = await launch("--mode", f"reverse:{url}", "--set", f"tripwire_config={config}")
    client = anthropic.AsyncAnthropic(
        base_url=mitm.url, api_key=AGENT_KEY, default_headers={"X-Tripwire-Session": "loop"}, max_retries=0
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "weather in Paris?"}]
    for _ in range(10):
        async with client.messages.stream(model="claude-sonnet-4-5", max_tokens=200, messages=messages) as s:
            msg = await s.get_final_message()
        if msg.stop_reason != "tool_use":
            break
        messages.append({"role": "assistant", "content": [b.model_dump() for b in msg.content]})
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": "sunny"}
            for b in msg.content
            if b.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    assert msg.stop_reason == "end_turn"
    assert msg.content[0].type == "text" and msg.content[0].text.startswith("[tripwire] blocked:")
    assert len(fake.calls("/v1/messages")) == 4  # the blocked call never reached the upstream

    assert await mitm.stop() == 0
    _, _, events = mitm.trace()
    warnings = [e for e in only(events, "LOOP_WARNING") if e["payload"]["kind"] == "repetition"]
    assert len(warnings) == 1 and warnings[0]["payload"]["action"] == "block"
    assert only(events, "ERROR")[0]["payload"]["guardrail"] == "loop_detection"
    assert {e["payload"]["provider"] for e in only(events, "LLM_CALL")} == {"anthropic"}


async def test_bad_tripwire_config_stops_mitmdump(launch: Any, tmp_path: Path) -> None:
    """A broken config must not leave an unguarded proxy running."""
    config = tmp_path / "broken.yaml"
    config.write_text("limits:\n  max_llm_calls: -3\n")
    port = free_port()
    home = tmp_path / "home"
    home.mkdir()
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "mitmdump"),
        *("-s", str(ADDON), "--listen-host", "127.0.0.1", "-p", str(port)),
        *("--set", f"tripwire_config={config}", "--set", f"tripwire_data_dir={tmp_path / 'data'}"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=tmp_path,
        env=clean_env(home),
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode != 0
    assert b"limits.max_llm_calls" in out and b"Traceback" not in out


# --- forward proxy (tripwire intercept) -----------------------------------------------------------


async def test_intercept_forward_proxy_records_mapped_hosts_and_passes_others(
    launch: Any, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    other = FakeUpstream(default=Reply(text="not intercepted"))
    other_server = TestServer(other.app, host="127.0.0.1")
    await other_server.start_server()
    try:
        mitm = await launch("--intercept", f"{url}=default", "--agent", "forwarded", cli=True)
        # the agent is named by its proxy URL's credentials (agent:session), as it sets no headers
        named = mitm.url.replace("http://", "http://proxy-agent:sess-7@")
        async with (
            openai.DefaultAsyncHttpxClient(proxy=named) as named_http,
            openai.DefaultAsyncHttpxClient(proxy=mitm.url) as http,
        ):
            intercepted = sdk(f"{url}/v1", session=None, http_client=named_http)
            passed = sdk(str(other_server.make_url("/v1")), http_client=http)
            answer = await intercepted.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
            untouched = await passed.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
        assert answer.choices[0].message.content == TEXT
        assert untouched.choices[0].message.content == "not intercepted"
        assert await mitm.stop() == 0
    finally:
        await other_server.close()
    # the identity headers the addon added were consumed by Tripwire, and no proxy credentials leaked
    sent = lower(fake.calls(CHAT)[0].headers)
    assert not [h for h in sent if h.startswith("x-tripwire") or h == "proxy-authorization"]
    # the other host got the request as sent, X-Tripwire-* header included: Tripwire never saw it
    assert lower(other.calls(CHAT)[0].headers)["x-tripwire-session"] == "mitm-s1"
    _, _, events = mitm.trace()  # exactly one run: the pass-through call recorded nothing
    (call,) = only(events, "LLM_CALL")
    assert call["payload"]["response"]["text"] == TEXT
    assert (call["meta"]["agent"], call["meta"]["session_id"]) == ("proxy-agent", "sess-7")
    assert "Tripwire intercepting" in mitm.output() and "HTTPS_PROXY=" in mitm.output()


def fake_mcp() -> web.Application:
    """A minimal Streamable HTTP MCP server answering in JSON: tools/call `add` sums its arguments."""

    async def handle(request: web.Request) -> web.Response:
        msg = await request.json()
        if msg.get("method") != "tools/call":
            return web.json_response({"jsonrpc": "2.0", "id": msg.get("id"), "result": {}})
        total = sum(msg["params"]["arguments"].values())
        result = {"content": [{"type": "text", "text": str(total)}], "isError": False}
        return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": result})

    app = web.Application()
    app.router.add_post("/mcp", handle)
    return app


async def test_intercept_mcp_tool_call_lands_in_the_agents_run(
    launch: Any, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """An `mcp:NAME` entry: the LLM call and the MCP tools/call of one agent and session, one run."""
    fake, url = fake_upstream
    mcp_server = TestServer(fake_mcp(), host="127.0.0.1")
    await mcp_server.start_server()
    mcp_url = str(mcp_server.make_url("")).rstrip("/")
    try:
        mitm = await launch("--intercept", f"{url}=default", "--intercept", f"{mcp_url}=mcp:calc", cli=True)
        named = mitm.url.replace("http://", "http://calc-agent:task-1@")
        async with openai.DefaultAsyncHttpxClient(proxy=named) as http:
            llm = sdk(f"{url}/v1", session=None, http_client=http)
            await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
            call = {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {"name": "add", "arguments": {"a": 1, "b": 2}},
            }
            accept = {"Accept": "application/json, text/event-stream"}
            answer = await http.post(f"{mcp_url}/mcp", json=call, headers=accept)
        assert answer.status_code == 200
        assert answer.json()["id"] == 7 and answer.json()["result"]["content"][0]["text"] == "3"
        assert await mitm.stop() == 0
    finally:
        await mcp_server.close()
    _, meta, events = mitm.trace()
    assert [e["event_type"] for e in events] == ["RUN_START", "LLM_CALL", "TOOL_CALL", "RUN_END"]
    tool = only(events, "TOOL_CALL")[0]
    assert tool["name"] == "add" and tool["payload"]["status"] == "ok"
    assert tool["meta"]["agent"] == "calc-agent" and tool["meta"]["session_id"] == "task-1"
    assert meta["counts"]["tool_calls"] == 1


ENV_AGENT = """
import openai
answer = openai.OpenAI(max_retries=0).chat.completions.create(
    model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}]
)
print(answer.choices[0].message.content)
"""


def tls_upstream(confdir: Path) -> tuple[ssl.SSLContext, Path]:
    """A leaf for 'localhost' signed by the CA mitmproxy will use, so one CA file trusts every hop."""
    store = certs.CertStore.from_store(confdir, "mitmproxy", 2048)
    entry = store.get_cert("localhost", [x509.DNSName("localhost")])
    cert_file, key_file = confdir / "upstream-cert.pem", confdir / "upstream-key.pem"
    cert_file.write_bytes(entry.cert.to_pem())
    key_file.write_bytes(
        entry.privatekey.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_file, key_file)
    return ctx, confdir / "mitmproxy-ca-cert.pem"


async def test_intercept_https_through_mitmproxy_ca(launch: Any, tmp_path: Path) -> None:
    """HTTPS_PROXY as an agent uses it: TLS to mitmproxy (its CA), Tripwire, then TLS to the upstream."""
    confdir = tmp_path / "confdir"
    server_ctx, ca_file = tls_upstream(confdir)
    fake = FakeUpstream(default=Reply(text=TEXT))
    server = TestServer(fake.app, host="127.0.0.1")
    await server.start_server(ssl=server_ctx)
    port = server.port
    try:
        config = tmp_path / "tls.yaml"
        config.write_text(f"ca_bundle: {ca_file}\n")  # Tripwire's own way out trusts the test CA
        mitm = await launch(
            *("--intercept", f"localhost:{port}=default", "--config", str(config), "--confdir", str(confdir)),
            *("--set", f"ssl_verify_upstream_trusted_ca={ca_file}"),
            cli=True,
        )
        verify = ssl.create_default_context(cafile=str(ca_file))
        named = mitm.url.replace("http://", "http://tls-agent@")  # sent on the CONNECT only
        async with openai.DefaultAsyncHttpxClient(proxy=named, verify=verify) as http:
            llm = sdk(f"https://localhost:{port}/v1", session=None, http_client=http)
            answer = await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
            # the conversation goes on (its history carries the answer): the same run (SPEC §3)
            more = [*HELLO, {"role": "assistant", "content": answer.choices[0].message.content}, *HELLO]
            stream = await llm.chat.completions.create(model="gpt-4o-mini", messages=more, stream=True)
            text = "".join([c.delta.content or "" async for chunk in stream for c in chunk.choices])
        assert answer.choices[0].message.content == TEXT and text == TEXT
        # an agent configured by its environment only (no proxy or CA in its code)
        env = clean_env(tmp_path / "home")
        env = {k: v for k, v in env.items() if k.lower() != "no_proxy"}
        env |= {
            "HTTPS_PROXY": mitm.url.replace("http://", "http://env-agent@"),
            "SSL_CERT_FILE": str(ca_file),
            "OPENAI_API_KEY": AGENT_KEY,
            "OPENAI_BASE_URL": f"https://localhost:{port}/v1",  # stands for api.openai.com here
        }
        agent = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            ENV_AGENT,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(agent.communicate(), 60)
        assert agent.returncode == 0, err.decode()
        assert out.decode().strip() == TEXT
        assert await mitm.stop() == 0
    finally:
        await server.close()
    assert len(fake.calls(CHAT)) == 3
    runs = {}
    for run_id in mitm.runs():
        _, events = assert_run_valid(mitm.data_dir, run_id)
        calls = only(events, "LLM_CALL")
        runs[calls[0]["meta"]["agent"]] = [e["payload"]["stream"] for e in calls]
    # the tunnel's credentials named both calls of the first client, the environment's the other
    assert runs == {"tls-agent": [False, True], "env-agent": [False]}


# --- CLI ------------------------------------------------------------------------------------------


def test_intercept_flags_become_mitmproxy_options() -> None:
    args: argparse.Namespace = build_parser().parse_args(
        [
            *("intercept", "--listen-port", "9090", "--mode", "reverse:https://api.openai.com"),
            *("--intercept", "api.example.com=default", "--no-viewer", "--log-level", "WARNING"),
        ]
    )
    opts = mitm_options(args)
    assert opts["listen_port"] == 9090 and opts["listen_host"] == "127.0.0.1"
    assert opts["mode"] == ["reverse:https://api.openai.com"]
    assert opts["tripwire_hosts"] == ["api.example.com=default"]
    assert opts["tripwire_admin_listen"] == "off"
    assert opts["tripwire_listen"] == "127.0.0.1:0"
    assert opts["termlog_verbosity"] == "warn"
    default = mitm_options(build_parser().parse_args(["intercept", "--listen", "127.0.0.1:8713"]))
    assert "tripwire_hosts" not in default and "tripwire_admin_listen" not in default
    assert default["mode"] == ["regular"] and default["tripwire_listen"] == "127.0.0.1:8713"


# --- small pure helpers of the addon ----------------------------------------------------------------


def test_proxy_loop_warns_only_for_this_proxy() -> None:
    assert proxy_loop({"HTTPS_PROXY": "http://127.0.0.1:8080"}, "127.0.0.1", 8080) is not None
    assert proxy_loop({"https_proxy": "localhost:8080/"}, "", 8080) is not None
    assert proxy_loop({"HTTPS_PROXY": "http://corp-proxy:8080"}, "127.0.0.1", 8080) is None
    assert proxy_loop({"HTTPS_PROXY": "http://127.0.0.1:3128"}, "127.0.0.1", 8080) is None
    assert proxy_loop({"HTTPS_PROXY": "http://[bad"}, "127.0.0.1", 8080) is None
    assert proxy_loop({}, "127.0.0.1", 8080) is None


def test_forward_hint_and_reverse_targets() -> None:
    hint = forward_hint(["regular"], "0.0.0.0", None, "/conf")
    assert hint is not None and "HTTPS_PROXY=http://127.0.0.1:8080" in hint
    assert "SSL_CERT_FILE=/conf/mitmproxy-ca-cert.pem" in hint
    assert forward_hint(["reverse:https://api.openai.com"], "", 8443, "/conf") is None
    reverse = intercepts_for(["api.anthropic.com=anthropic"], ["reverse:https://api.openai.com:8443"])
    assert [(i.url, i.name) for i in reverse] == [
        ("https://api.openai.com:8443", "default"),
        ("https://api.anthropic.com", "anthropic"),
    ]
    assert intercepts_for(["a.example=x"], ["reverse:tcp://10.0.0.1:22"]) == intercepts_for(
        ["a.example=x"], []
    )


def test_intercept_refuses_a_bad_config_before_mitmproxy_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from proxy.cli import main

    config = tmp_path / "bad.yaml"
    config.write_text("budget:\n  max_cost_usd: lots\n")
    assert main(["intercept", "--config", str(config), "--listen-port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert "budget.max_cost_usd" in err and "Traceback" not in err


async def test_intercept_takes_the_agent_key_from_the_proxy_credentials(
    launch: Any, fake_upstream: tuple[FakeUpstream, str], tmp_path: Path
) -> None:
    """Gateway mode through `tripwire intercept` (SPEC §9): the key is the proxy URL's password."""
    from proxy.agent_keys import FileKeyStore

    fake, url = fake_upstream
    _, key = await FileKeyStore(tmp_path / "data").create("mitm-agent")
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"auth: {{require_agent_key: true}}\nupstream: {{url: {url}, api_key_env: TW_UP_KEY}}\n"
    )
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {**clean_env(home), "TW_UP_KEY": "sk-upstream-own"}
    mitm = await launch("--intercept", f"{url}=default", "--config", str(config), cli=True, env=env)
    statuses = {}
    for label, creds in (
        ("key", f"mitm-agent:{key}@"),
        ("none", ""),
        ("other", f"bob:{key}@"),
        ("wrong", "mitm-agent:tw_nope@"),
    ):
        async with openai.DefaultAsyncHttpxClient(
            proxy=mitm.url.replace("http://", "http://" + creds)
        ) as http:
            try:
                await sdk(f"{url}/v1", session=None, http_client=http).chat.completions.create(
                    model="gpt-4o-mini", messages=HELLO
                )
                statuses[label] = 200
            except openai.APIStatusError as e:
                statuses[label] = e.status_code
    assert statuses == {"key": 200, "none": 401, "other": 403, "wrong": 401}
    assert await mitm.stop() == 0
    (call,) = fake.calls(CHAT)  # only the keyed call was forwarded, with the upstream's own key
    sent = lower(call.headers)
    assert sent["authorization"] == "Bearer sk-upstream-own" and key not in repr(sent)
    _, _, events = mitm.trace()
    (llm,) = only(events, "LLM_CALL")
    assert llm["meta"]["agent"] == "mitm-agent"
    assert key not in mitm.output()
