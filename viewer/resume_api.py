"""`POST /api/runs/{run_id}/resume` `{"raise": {...}}` (SPEC §5.5a): a session ended by a guard or
the kill switch goes on in a new run, with the given budgets or limits raised.

200 `{"run_id": NEW, "resumed_from": OLD}`; 400 a malformed id, body or raise (or none where the
budget or limit that ended the run would refuse the next call again); 404 no such run; 409 a run
that is running, ended normally, or whose session this proxy no longer holds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import orjson
from aiohttp import web

from proxy import storage
from proxy.guards.raises import RaiseError
from proxy.session_policy import ResumeConflict
from proxy.state.base import StateUnavailable


@runtime_checkable
class Resumable(Protocol):
    @property
    def data_dir(self) -> Path: ...

    async def resume_run(self, run_id: str, raised: Any = None) -> str: ...


RESUMABLE: web.AppKey[Resumable] = web.AppKey("tripwire_resumable", Resumable)


def _detail(status: int, detail: str, **extra: Any) -> web.Response:
    body = orjson.dumps({"detail": detail, **extra})
    return web.Response(body=body, status=status, content_type="application/json")


def _has_run(data_dir: Path, run_id: str) -> bool:
    try:
        return storage.run_exists(data_dir, run_id)
    except (ValueError, OSError):
        return False


async def resume_run(request: web.Request) -> web.Response:
    run_id = request.match_info["run_id"]
    if not storage.is_valid_run_id(run_id):
        return _detail(400, "invalid run_id")
    raw = await request.read()
    try:
        body = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        return _detail(400, 'body must be JSON: {"raise": {key: value}} or empty')
    if not isinstance(body, dict) or not set(body) <= {"raise"}:
        return _detail(400, 'body must be an object with at most a "raise" object')
    raised = body.get("raise")
    engine = request.app[RESUMABLE]
    try:
        new_run_id = await engine.resume_run(run_id, raised)
    except (RaiseError, ResumeConflict) as e:
        if not await asyncio.to_thread(_has_run, engine.data_dir, run_id):
            return _detail(404, "run not found")
        return _detail(400 if isinstance(e, RaiseError) else 409, str(e))
    except StateUnavailable as e:  # shared state down: the replicas could not be told
        return _detail(503, f"not resumed: {e}")
    return web.json_response({"run_id": new_run_id, "resumed_from": run_id})


def setup_resume(app: web.Application, engine: object) -> None:
    """The resume route, when the engine can resume (the viewer tests' stand-in may not)."""
    if isinstance(engine, Resumable):
        app[RESUMABLE] = engine
        app.router.add_post("/api/runs/{run_id}/resume", resume_run)
