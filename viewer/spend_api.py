"""The agents' budgets over time on the admin listener (SPEC §9):

- `GET /api/agents/{name}/spend`: each configured window (period, key, spent_usd, tokens, reserved,
  limits, soft alert, starts_at, resets_at), with the agent's tool permissions and rate limits, so
  the viewer's agent panel has what it shows in one request;
- `POST /api/agents/{name}/spend/reset`: every window back to zero, or one period's
  (`{"period": "day"}`); calls in flight keep their reservations.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

import orjson
from aiohttp import web

from proxy.guard_backend.windows import WindowBook
from proxy.guards.config import GuardConfig
from proxy.state.base import StateUnavailable
from viewer.engine_view import EngineView

log = logging.getLogger("tripwire.viewer")

PERIODS = ("day", "week", "month")
MAX_AGENT_NAME = 200  # as viewer/api.py's


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _detail(status: int, detail: str) -> web.Response:
    return _json({"detail": detail}, status=status)


def _agent_name(request: web.Request) -> str | None:
    name = request.match_info["name"]
    return name if name and len(name) <= MAX_AGENT_NAME else None


@runtime_checkable
class WindowsView(Protocol):
    """What this module reads of the engine beyond `EngineView`: where the windows live."""

    @property
    def windows(self) -> WindowBook: ...


def spend_body(name: str, config: GuardConfig, windows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "agent": name,
        "timezone": config.budget_timezone,
        "windows": windows,
        # the rest of the agent's gateway policy, shown beside its windows (viewer/static/spend.js)
        "tools": config.tools.model_dump(mode="json"),
        "rate_limits": [r.model_dump(mode="json") for r in config.rate_limits],
    }


def setup_spend(app: web.Application, engine: EngineView) -> None:
    """The routes, on the engine `setup_admin` was given (one that keeps no windows gets none)."""
    if not isinstance(engine, WindowsView):
        return
    book = engine.windows

    async def get_spend(request: web.Request) -> web.Response:
        name = _agent_name(request)
        if name is None:
            return _detail(400, "invalid agent name")
        config = engine.guard_store.effective(name)[0]
        try:
            windows = await book.spend(name, config)
        except StateUnavailable as e:
            return _detail(503, f"shared state unavailable: {e}")
        return _json(spend_body(name, config, windows))

    async def reset_spend(request: web.Request) -> web.Response:
        name = _agent_name(request)
        if name is None:
            return _detail(400, "invalid agent name")
        period: Any = None
        raw = await request.read()
        if raw.strip():
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                return _detail(400, "body: invalid JSON")
            if not isinstance(body, dict):
                return _detail(400, 'body: a JSON object, e.g. {"period": "day"}')
            period = body.get("period")
            if period is not None and period not in PERIODS:
                return _detail(400, f"period: one of {', '.join(PERIODS)}, got {period!r}")
        config = engine.guard_store.effective(name)[0]
        try:
            await book.reset(name, config, period)
            windows = await book.spend(name, config)
        except StateUnavailable as e:
            return _detail(503, f"shared state unavailable: {e}")
        log.info("budget_windows.reset agent=%s period=%s", name, period or "all")
        return _json(spend_body(name, config, windows))

    app.router.add_get("/api/agents/{name}/spend", get_spend)
    app.router.add_post("/api/agents/{name}/spend/reset", reset_spend)
