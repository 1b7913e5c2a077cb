"""Shared fixtures: a fake upstream and a running Tripwire (proxy + admin apps) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from proxy.app import make_admin_app, make_proxy_app
from proxy.engine import Engine
from proxy.settings import Settings
from tests.fakes import FakeUpstream, Reply

# the unit-test fixtures (`engine`, `engine_factory`) of tests/factories.py
pytest_plugins = ["tests.factories", "tests.redis_server"]

AGENT_KEY = "sk-test-agent-secret-0123456789abcdef"


@dataclass
class Running:
    engine: Engine
    proxy: TestServer
    admin: TestServer
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
        proxy = TestServer(make_proxy_app(engine), host="127.0.0.1")
        admin = TestServer(make_admin_app(engine), host="127.0.0.1")
        await proxy.start_server()
        await admin.start_server()
        r = Running(engine, proxy, admin, Path(data_dir))
        running.append(r)
        return r

    yield start
    for r in reversed(running):
        await r.proxy.close()
        await r.admin.close()
        await r.engine.close()
