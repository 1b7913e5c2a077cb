"""Shared fixtures: a fake upstream and a running Tripwire (proxy + admin apps) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.web_runner import BaseRunner

from proxy.app import RUNNER_ARGS, make_admin_app, make_proxy_app, proxy_runner
from proxy.engine import Engine
from proxy.settings import Settings
from tests.fakes import FakeUpstream, Reply

# the unit-test fixtures (`engine`, `engine_factory`) of tests/factories.py
pytest_plugins = ["tests.factories", "tests.redis_server"]

AGENT_KEY = "sk-test-agent-secret-0123456789abcdef"


# --- SDK clients live until their test ends ------------------------------------------------------
# A test that drops an SDK client (`await llm(tw).chat...`) lets the client be freed mid-test, and its
# connections are closed behind the event loop's back (the transport's __del__ closes the socket
# without unregistering it); a listener started later in the same test can get the same file
# descriptor number and is then never accepted from: the test hangs until its timeout (seen in
# 1 run of 4 under load). Every SDK client made in a test is kept and closed when the test ends.
SDK_CLIENTS: list[Any] = []


def _keep_sdk_clients() -> None:
    for module, names in (
        ("openai", ("AsyncOpenAI", "OpenAI")),
        ("anthropic", ("AsyncAnthropic", "Anthropic")),
    ):
        try:
            sdk = __import__(module)
        except ImportError:
            continue
        for name in names:
            cls = getattr(sdk, name)
            original = cls.__init__

            def init(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> None:
                __original(self, *args, **kwargs)
                SDK_CLIENTS.append(self)

            cls.__init__ = init


_keep_sdk_clients()


async def close_sdk_clients(since: int = 0) -> None:
    """Close the async SDK clients made since `since` (on the loop their connections belong to)."""
    for client in SDK_CLIENTS[since:]:
        close = getattr(client, "close", None)
        if close is not None and asyncio.iscoroutinefunction(close):
            with contextlib.suppress(Exception):
                await close()


@pytest.fixture(autouse=True)
def _sdk_clients_live_until_the_test_ends() -> Iterator[None]:
    start = len(SDK_CLIENTS)
    yield
    del SDK_CLIENTS[start:]  # closed by the async fixtures' teardown, or now freed with the test


# --- the lean lanes on both event loops -----------------------------------------------------------
# `tripwire serve` runs on uvloop (proxy/cli.py), the suite on asyncio's loop. The lean listener and
# upstream client drive asyncio.Protocol/transports directly, where the two loops differ (transport
# classes, write buffering, close/EOF order), so a module marked `pytestmark = pytest.mark.both_loops`
# runs each async test on both: ids end in [asyncio] / [uvloop]. pytest-asyncio asks this hook for
# every async test (None is a usage error) and parametrises on the names returned; a single name
# stays out of the id, so the rest of the suite keeps its ids and asyncio's loop (the loop its runner
# makes by default).
ASYNCIO_ONLY: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}


def _both_loops() -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    try:
        import uvloop
    except ImportError:  # not built on Windows: asyncio's loop only, as `tripwire serve` does there
        return ASYNCIO_ONLY
    return {**ASYNCIO_ONLY, "uvloop": uvloop.new_event_loop}


def pytest_asyncio_loop_factories(item: pytest.Item) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    return _both_loops() if item.get_closest_marker("both_loops") else ASYNCIO_ONLY


def as_serve_runs_it(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A runner's arguments as `serve` gives them (proxy.app.RUNNER_ARGS): aiohttp's TestServer asks
    for handler cancellation, which `serve` does not use."""
    kwargs.pop("handler_cancellation", None)
    return {**RUNNER_ARGS, **kwargs}


class ProxyTestServer(TestServer):
    """The proxy app on the listener `tripwire serve` runs: plain LLM calls on the lean lane
    (proxy/lean_http.py), the rest on aiohttp's, with serve's runner arguments."""

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        return proxy_runner(self.app, **as_serve_runs_it(kwargs))


class AppTestServer(TestServer):
    """An app on aiohttp's own runner, with serve's runner arguments (the admin listener; the proxy
    app alone, for the differential tests of the lean lane)."""

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        return web.AppRunner(self.app, **as_serve_runs_it(kwargs))


@dataclass
class Running:
    engine: Engine
    proxy: ProxyTestServer
    admin: AppTestServer
    data_dir: Path

    @property
    def url(self) -> str:
        return str(self.proxy.make_url("")).rstrip("/")

    @property
    def admin_url(self) -> str:
        return str(self.admin.make_url("")).rstrip("/")

    async def flush(self) -> None:
        """Wait for calls still finishing server-side (the client may have its answer first), then disk."""
        for _ in range(500):
            if self.engine.inflight == 0:
                break
            await asyncio.sleep(0.01)
        await self.engine.recorder.flush()

    def run_ids(self) -> list[str]:
        runs = self.data_dir / "runs"
        return sorted(p.name for p in runs.iterdir()) if runs.exists() else []

    def events(self, run_id: str | None = None) -> list[dict[str, Any]]:
        if run_id is None:
            ids = self.run_ids()
            assert len(ids) == 1, f"expected one run, found {ids}"
            run_id = ids[0]
        path = self.data_dir / "runs" / run_id / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def run_json(self, run_id: str) -> dict[str, Any]:
        return json.loads((self.data_dir / "runs" / run_id / "run.json").read_text())

    def tripwire_json(self, run_id: str) -> dict[str, Any]:
        return json.loads((self.data_dir / "runs" / run_id / "tripwire.json").read_text())


StartTripwire = Callable[..., Awaitable[Running]]


@asynccontextmanager
async def serve_fake(default: Reply) -> AsyncIterator[tuple[FakeUpstream, str]]:
    """A FakeUpstream on 127.0.0.1: (the fake, its base URL)."""
    fake = FakeUpstream(default=default)
    server = TestServer(fake.app, host="127.0.0.1")
    await server.start_server()
    try:
        yield fake, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


# the viewer's browser tests (tests/test_browser*.py, which skip without Playwright or Chromium)
CHROMIUM = os.environ.get("TRIPWIRE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    """Headless Chromium, one per test."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture
async def fake_upstream() -> AsyncIterator[tuple[FakeUpstream, str]]:
    async with serve_fake(Reply(text="Hello from the fake upstream")) as pair:
        yield pair


@pytest.fixture
async def start_tripwire(tmp_path: Path) -> AsyncIterator[StartTripwire]:
    """Start an engine with both apps; settings are keyword overrides of the defaults."""
    running: list[Running] = []

    async def start(**overrides: Any) -> Running:
        data_dir = overrides.pop("data_dir", tmp_path / f"data{len(running) or ''}")
        settings = Settings.model_validate({"data_dir": data_dir, "session_idle_timeout_s": 300, **overrides})
        engine = Engine(settings, argv=["tripwire", "serve", "--admin-token", "hunter2"])
        await engine.start()
        proxy = ProxyTestServer(make_proxy_app(engine), host="127.0.0.1")
        admin = AppTestServer(make_admin_app(engine), host="127.0.0.1")
        await proxy.start_server()
        await admin.start_server()
        r = Running(engine, proxy, admin, Path(data_dir))
        running.append(r)
        return r

    clients = len(SDK_CLIENTS)
    yield start
    await close_sdk_clients(clients)
    for r in reversed(running):
        await r.proxy.close()
        await r.admin.close()
        await r.engine.close()
