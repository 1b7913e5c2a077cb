"""The admin listener's routes: AgentDbg's run API, the guard API, metrics, health, the static UI.

The run API answers as AgentDbg 0.3.0's viewer does (`{spec_version, runs}`, `{spec_version,
run_id, events}`, 400 for a malformed id, 404 for a missing run, `{"detail": ...}` errors) so its
UI and scripts work against Tripwire; what Tripwire adds is additive: a `tripwire` object per run,
and filters and paging that only change the answer when their parameters are given.

`POST /api/runs/{run_id}/replay` runs `tripwire replay` on one run (SPEC §5.7) for the UI's
guard replay: under the recorded config, the config in force now, or a config in the body.

Run files are read (and replayed) in this listener's own bounded thread pool, never the loop's
default executor: whatever a request waits on, the trace writer and the rest of the process don't.
A run file that is not a regular file (a FIFO, a symlink) or an event replay cannot read is a 422
naming the run, the file and the line.

`setup_admin(app, engine)` reads from the engine what `viewer.engine_view.EngineView` lists:
`data_dir`, `recorder`, `guard_store`, `metrics`, `admin_token`, `health()` (`/metrics` takes the
trace-store gauges and live sessions from it), `await terminate_run(run_id) -> bool` and
`guard_stats(run_id) -> dict | None` (None: no live session).
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
from aiohttp import web
from pydantic import ValidationError

from proxy import replay, storage
from proxy.constants import SPEC_VERSION
from proxy.guard_store import GuardConfigStore, config_body, config_from_body, validation_message
from proxy.guards.config import GuardConfig
from proxy.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from viewer.engine_view import EngineView
from viewer.resume_api import setup_resume
from viewer.runs import RunReader, is_valid_run_id
from viewer.spend_api import setup_spend

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
READER: web.AppKey[RunReader] = web.AppKey("tripwire_run_reader", RunReader)
ENGINE_VIEW: web.AppKey[EngineView] = web.AppKey("tripwire_engine_view", EngineView)
IO_POOL: web.AppKey[ThreadPoolExecutor] = web.AppKey("tripwire_admin_io", ThreadPoolExecutor)
IO_THREADS = 4  # the admin listener's file reads and replays at once (more wait their turn)

DEFAULT_RUNS_LIMIT = 50  # AgentDbg's list size
MAX_RUNS_LIMIT = 1000
MAX_EVENTS_LIMIT = 5000
MAX_AGENT_NAME = 200
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _detail(status: int, detail: Any, **extra: Any) -> web.Response:
    return _json({"detail": detail, **extra}, status=status)


def _error(cls: type[web.HTTPException], detail: str) -> web.HTTPException:
    """An HTTP error to raise from helpers, with AgentDbg's `{"detail": ...}` body."""
    return cls(text=orjson.dumps({"detail": detail}).decode(), content_type="application/json")


def _engine(request: web.Request) -> EngineView:
    return request.app[ENGINE_VIEW]


def _reader(request: web.Request) -> RunReader:
    return request.app[READER]


async def _in_pool(request: web.Request, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in the admin listener's own threads (see the module docstring)."""
    return await asyncio.get_running_loop().run_in_executor(
        request.app[IO_POOL], functools.partial(fn, *args)
    )


def _not_regular(run_id: str, e: storage.NotRegularFile) -> web.HTTPException:
    """A 422 naming the run and the file that is not a regular file (never read, never waited on)."""
    file = Path(e.filename).name if e.filename else None
    body = {"detail": f"run {run_id}: {e.strerror}", "run_id": run_id, "file": file, "line": None}
    return web.HTTPUnprocessableEntity(text=orjson.dumps(body).decode(), content_type="application/json")


async def _read_run(request: web.Request, run_id: str, fn: Callable[..., Any], *args: Any) -> Any:
    """A RunReader call on one run, in the pool; a run file that is not a regular file is a 422."""
    try:
        return await _in_pool(request, fn, *args)
    except storage.NotRegularFile as e:
        raise _not_regular(run_id, e) from None


# --- token and cross-site checks ------------------------------------------------------------


def _cross_site(request: web.Request) -> bool:
    """A browser request sent by another site's page (CSRF): the browser's Fetch metadata when it
    sends it, else the Origin's host against ours. Not its scheme: behind an ingress that ends TLS
    the page is https and this listener plain http."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = request.headers.get("Origin")
    if origin is None:
        return False
    return urlsplit(origin).netloc.lower() != request.host.lower()  # "null" has no host: refused


def _host_is_local(host: str | None) -> bool:
    """Host header names an IP literal or localhost: not a DNS name an attacker's page could rebind."""
    if not host:
        return False
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@web.middleware
async def admin_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bearer token on every /api/* call when one is set; no cross-site writes; without a token,
    only IP-literal or localhost Host headers (DNS rebinding would make another site same-origin)."""
    if request.path.startswith("/api/"):
        token = _engine(request).admin_token
        if not token and not _host_is_local(request.headers.get("Host")):
            return _detail(403, "admin API without a token answers only to localhost or an IP address")
        if token:
            auth = request.headers.get("Authorization", "")
            given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(given.encode(), str(token).encode()):
                resp = _detail(401, "admin token required: send Authorization: Bearer <token>")
                resp.headers["WWW-Authenticate"] = 'Bearer realm="tripwire"'
                return resp
        if request.method not in SAFE_METHODS and _cross_site(request):
            return _detail(403, "cross-site request refused")
    return await handler(request)


# the UI loads nothing from elsewhere and runs no inline script or style: say so, so an injected
# script cannot run, and no other site can frame the admin UI (clickjacking its buttons)
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@web.middleware
async def static_no_cache(request: web.Request, handler: Handler) -> web.StreamResponse:
    """UI files are revalidated on every load (as AgentDbg serves its app.js and styles.css): after an
    upgrade the browser must not pair a new index.html with a heuristically cached old app.js.
    Every answer carries the security headers."""
    resp = await handler(request)
    if request.path.startswith("/static/"):
        resp.headers.setdefault("Cache-Control", "no-cache")
    for name, value in SECURITY_HEADERS.items():
        resp.headers.setdefault(name, value)
    return resp


# --- parameters -----------------------------------------------------------------------------


def _int_param(request: web.Request, name: str, default: int | None, maximum: int) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _error(web.HTTPBadRequest, f"{name} must be an integer") from None
    if value < 0:
        raise _error(web.HTTPBadRequest, f"{name} must not be negative")
    return min(value, maximum)


def _run_id(request: web.Request) -> str:
    """The path's run id, or a 400 answer: never used as a path before it is validated."""
    run_id = request.match_info["run_id"]
    if not is_valid_run_id(run_id):
        raise _error(web.HTTPBadRequest, "invalid run_id")
    return run_id


async def _load_run(request: web.Request, run_id: str) -> dict[str, Any]:
    try:
        return await _read_run(request, run_id, _reader(request).load_run, run_id)
    except FileNotFoundError:
        raise _error(web.HTTPNotFound, "run not found") from None
    except ValueError:  # well-formed, but its directory resolves outside the runs base (a symlink)
        raise _error(web.HTTPBadRequest, "invalid run_id") from None


# --- AgentDbg's run API (+ Tripwire fields) -------------------------------------------------


def filter_runs(
    runs: list[dict[str, Any]], agent: str | None, status: str | None, tag: str | None
) -> list[dict[str, Any]]:
    """Runs matching every filter given (agent name, run status, health tag)."""
    out = []
    for run in runs:
        tw = run.get("tripwire") or {}
        if agent and tw.get("agent_name") != agent:
            continue
        if status and run.get("status") != status:
            continue
        if tag and tag not in (tw.get("health_tags") or []):
            continue
        out.append(run)
    return out


async def list_runs(request: web.Request) -> web.Response:
    q = request.query
    paged = any(k in q for k in ("limit", "offset", "agent", "status", "tag"))
    limit = _int_param(request, "limit", DEFAULT_RUNS_LIMIT, MAX_RUNS_LIMIT) or 0
    offset = _int_param(request, "offset", 0, 10**9) or 0
    runs = await _in_pool(request, _reader(request).list_runs)
    runs = filter_runs(runs, q.get("agent"), q.get("status"), q.get("tag"))
    body: dict[str, Any] = {"spec_version": SPEC_VERSION, "runs": runs[offset : offset + limit]}
    if paged:
        body.update(total=len(runs), offset=offset, limit=limit)
    return _json(body)


async def get_run(request: web.Request) -> web.Response:
    run_id = _run_id(request)
    meta = await _load_run(request, run_id)
    meta["tripwire"] = await _read_run(request, run_id, _reader(request).load_tripwire, run_id)
    return _json(meta)


async def get_run_plain(request: web.Request) -> web.Response:
    """run.json alone, as AgentDbg's `GET /api/runs/{run_id}/rename` answers."""
    return _json(await _load_run(request, _run_id(request)))


async def get_events(request: web.Request) -> web.Response:
    run_id = _run_id(request)
    await _load_run(request, run_id)
    paged = "offset" in request.query or "limit" in request.query
    offset = _int_param(request, "offset", 0, 10**9) or 0
    limit = _int_param(request, "limit", None, MAX_EVENTS_LIMIT)
    events, total = await _read_run(request, run_id, _reader(request).read_events, run_id, offset, limit)
    body: dict[str, Any] = {"spec_version": SPEC_VERSION, "run_id": run_id, "events": events}
    if paged:
        body.update(total=total, offset=offset, limit=limit)
    return _json(body)


async def get_cost_series(request: web.Request) -> web.Response:
    """Cumulative LLM cost over time, thinned, for the run list's sparkline."""
    run_id = _run_id(request)
    await _load_run(request, run_id)
    points = await _read_run(request, run_id, _reader(request).cost_series, run_id)
    return _json({"run_id": run_id, "points": [{"ts": ts, "cost_usd": c} for ts, c in points]})


async def get_paths(request: web.Request) -> web.Response:
    run_id = _run_id(request)
    await _load_run(request, run_id)
    paths = storage.run_paths(_reader(request).data_dir, run_id)
    return _json({"spec_version": SPEC_VERSION, "run_id": run_id, "paths": paths})


async def rename_run(request: web.Request) -> web.Response:
    run_id = _run_id(request)
    try:
        body = await request.json(loads=orjson.loads)
    except ValueError:
        return _detail(422, [{"loc": ["body"], "msg": "invalid JSON", "type": "json_invalid"}])
    name = body.get("run_name") if isinstance(body, dict) else None
    if not isinstance(name, str):
        return _detail(422, [{"loc": ["body", "run_name"], "msg": "Field required", "type": "missing"}])
    await _load_run(request, run_id)
    if not name.strip():
        return _detail(400, "run_name must be non-empty")
    # through the recorder: an open run's run.json is rewritten from its memory, not from disk
    try:
        meta = await _engine(request).recorder.rename_run(run_id, name)
    except FileNotFoundError:
        meta = None
    except OSError as e:  # a full or read-only data dir: say so, as JSON the UI can show
        return _detail(503, f"run not renamed: {e.strerror or e}")
    if meta is None:
        return _detail(404, "run not found")
    return _json(meta)


async def delete_run(request: web.Request) -> web.Response:
    run_id = _run_id(request)
    await _load_run(request, run_id)
    recorder = _engine(request).recorder
    if recorder.is_open(run_id):
        return _detail(409, "run is live: terminate it first")
    await recorder.discard_run(run_id)  # drop queued writes and wait out one in flight: no race with rmtree
    try:
        await _in_pool(request, _reader(request).delete, run_id)
    except FileNotFoundError:
        return _detail(404, "run not found")
    except OSError as e:
        return _detail(503, f"run not deleted: {e.strerror or e}")
    return web.Response(status=204)


async def terminate_run(request: web.Request) -> web.Response:
    """The kill switch: end a live session; every later call of it is refused."""
    run_id = _run_id(request)
    if await _engine(request).terminate_run(run_id):
        return _json({"run_id": run_id, "terminated": True})
    await _load_run(request, run_id)  # 404 when there is no such run at all
    return _detail(409, "run is not live")


async def guard_stats(request: web.Request) -> web.Response:
    """The live session's guard counters; an ended run (terminated, over budget, idle) is not live,
    even while the engine still holds its session to refuse later calls."""
    run_id = _run_id(request)
    engine = _engine(request)
    stats = engine.guard_stats(run_id)
    live = engine.recorder.is_open(run_id)
    if not live:
        meta = await _load_run(request, run_id)  # 404 when there is no such run at all
        # a run the recorder ended is over, even before its run.json says so on disk
        ended_here = bool(engine.recorder.summary(run_id))
        live = stats is not None and meta.get("status") == "running" and not ended_here
    return _json({"run_id": run_id, "live": live, "stats": stats if live else None})


# --- replay (SPEC §5.7): the run's recorded calls through fresh guards -----------------------

REPLAY_KEYS = frozenset({"config"})


def _body_error(loc: list[Any], msg: str, kind: str) -> web.Response:
    where = ".".join(str(p) for p in loc[1:]) or "(body)"
    return _detail(422, [{"loc": loc, "msg": msg, "type": kind}], message=f"{where}: {msg}")


async def _optional_json(request: web.Request) -> Any:
    """The body as JSON, {} when there is none; a 422 answer when it is not JSON."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _body_error(["body"], "invalid JSON", "json_invalid")


def _replay_config(
    body: Any, engine: EngineView, agent: str | None
) -> tuple[str, GuardConfig | None] | web.Response:
    """("recorded" | "current" | "custom", the override) from a replay body, or a 422 naming the field."""
    if not isinstance(body, dict):
        return _body_error(["body"], "Input should be an object", "dict_type")
    for key in body:
        if key not in REPLAY_KEYS:
            return _body_error(["body", key], "Extra inputs are not permitted", "extra_forbidden")
    choice = body.get("config")
    store = engine.guard_store
    if choice is None or choice == "recorded":
        return "recorded", None
    if choice == "current":
        return "current", store.effective(agent)[0] if agent else store.project()
    if not isinstance(choice, dict):
        return _body_error(
            ["body", "config"], 'Input should be "recorded", "current" or a prevention config', "config_type"
        )
    try:
        cfg = config_from_body(choice)
    except ValidationError as e:
        errors: list[dict[str, Any]] = [
            {"loc": ["config", *err["loc"]], "msg": err["msg"], "type": err["type"]} for err in e.errors()
        ]
        message = "; ".join(".".join(str(p) for p in err["loc"]) + ": " + err["msg"] for err in errors)
        return _detail(422, errors, message=message)
    # as an agent override would be: an omitted `shadow` is the project default's
    return "custom", cfg.inheriting_shadow(store.project())


def _replay_answer(run_id: str, label: str, result: replay.RunReplay) -> dict[str, Any]:
    def flat(checks: dict[int, list[list[Any]]]) -> list[dict[str, Any]]:
        return [
            {"call_index": seq, "guard": d[0], "kind": d[1], "action": d[2]}
            for seq in sorted(checks)
            for d in checks[seq]
        ]

    return {
        "run_id": run_id,
        "calls": result.calls,
        "recorded_by": result.recorded_by,
        "config": label,
        "decisions": [
            {
                "call_index": d.call_index,
                "event_id": d.event_id,
                "guard": d.guard,
                "kind": d.kind,
                "action": d.action,
                "message": d.message,
                "replayed": d.replayed,
            }
            for d in result.decisions
        ],
        "live": flat(result.live),
        "checks": flat(result.replayed_checks),
    }


async def replay_run(request: web.Request) -> web.Response:
    """Replay the run's calls under the recorded, the current or a given guard config (changes nothing)."""
    run_id = _run_id(request)
    await _load_run(request, run_id)
    body = await _optional_json(request)
    if isinstance(body, web.Response):
        return body
    reader = _reader(request)
    tw = await _read_run(request, run_id, reader.load_tripwire, run_id)
    chosen = _replay_config(body, _engine(request), tw.get("agent_name"))
    if isinstance(chosen, web.Response):
        return chosen
    label, override = chosen
    try:
        result = await _in_pool(request, replay.replay_dir, reader.run_dir(run_id), override)
    except replay.BadRecord as e:  # a file or a line replay cannot read: said, never a traceback
        log.warning("replay.refused %s", e)
        return _detail(422, str(e), run_id=run_id, file=e.file, line=e.line)
    except FileNotFoundError:
        return _detail(404, "run not found")
    except OSError as e:
        return _detail(503, f"run not replayed: {e.strerror or e}")
    except replay.ReplayError as e:
        return _detail(422, f"run {run_id}: cannot be replayed: {e}", run_id=run_id, file=None, line=None)
    return _json(_replay_answer(run_id, label, result))


# --- agents and the guard API (SPEC §5.4, LangSight's bodies) -------------------------------


def _agent_name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not name or len(name) > MAX_AGENT_NAME:
        raise _error(web.HTTPBadRequest, "invalid agent name")
    return name


def _agent_config_body(engine: EngineView, name: str) -> dict[str, Any]:
    store = engine.guard_store
    cfg, is_override = store.effective(name)
    return config_body(name, cfg, is_override, store.agent_source(name))


def _project_config_body(engine: EngineView) -> dict[str, Any]:
    store = engine.guard_store
    return config_body(None, store.project(), False, store.project_source())


async def _config_from_request(request: web.Request) -> Any:
    """GuardConfig from the body, or a 422 answer naming the field (the old config stays)."""
    try:
        body = await request.json(loads=orjson.loads)
    except ValueError:
        return _detail(
            422, [{"loc": ["body"], "msg": "invalid JSON", "type": "json_invalid"}], message="invalid JSON"
        )
    try:
        return config_from_body(body)
    except ValidationError as e:
        errors = [{"loc": list(err["loc"]), "msg": err["msg"], "type": err["type"]} for err in e.errors()]
        return _detail(422, errors, message=validation_message(e))


async def _store_write(
    request: web.Request, store: GuardConfigStore, write: Callable[..., Any], *args: Any
) -> None:
    """Run a guard-store write off the loop; a disk that refuses it is a 503 and the old config stays.
    With shared state the new values are then published to the other replicas (SPEC §8)."""
    try:
        await _in_pool(request, write, *args)
    except OSError as e:
        log.error("guard_config.save_failed error=%r", e)
        raise _error(
            web.HTTPServiceUnavailable, f"prevention config not saved, the old one stays: {e}"
        ) from e
    await store.publish()


async def get_agent_config(request: web.Request) -> web.Response:
    return _json(_agent_config_body(_engine(request), _agent_name(request)))


async def put_agent_config(request: web.Request) -> web.Response:
    name = _agent_name(request)
    cfg = await _config_from_request(request)
    if isinstance(cfg, web.Response):
        return cfg
    engine = _engine(request)
    await _store_write(request, engine.guard_store, engine.guard_store.put_agent, name, cfg)
    log.info("guard_config.agent_saved agent=%s", name)
    return _json(_agent_config_body(engine, name))


async def delete_agent_config(request: web.Request) -> web.Response:
    name = _agent_name(request)
    engine = _engine(request)
    await _store_write(request, engine.guard_store, engine.guard_store.delete_agent, name)
    log.info("guard_config.agent_reset agent=%s", name)
    return _json(_agent_config_body(engine, name))


async def get_project_config(request: web.Request) -> web.Response:
    return _json(_project_config_body(_engine(request)))


async def put_project_config(request: web.Request) -> web.Response:
    cfg = await _config_from_request(request)
    if isinstance(cfg, web.Response):
        return cfg
    engine = _engine(request)
    await _store_write(request, engine.guard_store, engine.guard_store.put_project, cfg)
    log.info("guard_config.project_saved")
    return _json(_project_config_body(engine))


async def delete_project_config(request: web.Request) -> web.Response:
    engine = _engine(request)
    await _store_write(request, engine.guard_store, engine.guard_store.delete_project)
    log.info("guard_config.project_reset")
    return _json(_project_config_body(engine))


def agents_overview(runs: list[dict[str, Any]], store: GuardConfigStore) -> list[dict[str, Any]]:
    """Agents seen in runs plus configured ones, with run counts, spend and config source."""
    seen: dict[str, dict[str, Any]] = {}
    for run in runs:  # newest first
        name = (run.get("tripwire") or {}).get("agent_name")
        if not name:
            continue
        a = seen.setdefault(
            name,
            {"name": name, "runs": 0, "running": 0, "cost_usd": 0.0, "last_run_at": run.get("started_at")},
        )
        a["runs"] += 1
        a["running"] += run.get("status") == "running"
        a["cost_usd"] += float(run["tripwire"].get("cost_usd") or 0.0)
    for name in store.configured_agents():
        seen.setdefault(name, {"name": name, "runs": 0, "running": 0, "cost_usd": 0.0, "last_run_at": None})
    out = []
    for name in sorted(seen):
        _, is_override = store.effective(name)
        out.append({**seen[name], "is_agent_override": is_override, "source": store.agent_source(name)})
    return out


async def list_agents(request: web.Request) -> web.Response:
    runs = await _in_pool(request, _reader(request).list_runs)
    return _json({"agents": agents_overview(runs, _engine(request).guard_store)})


# --- metrics, health, UI --------------------------------------------------------------------


def _store_report(engine: EngineView) -> dict[str, Any]:
    """The trace store's part of `engine.health()`; a failing report counts as trouble."""
    try:
        store = dict(engine.health()).get("trace_store", {})
    except Exception as e:  # a probe or a scrape must not fail because a report did
        log.exception("health.report_failed")
        return {"ok": False, "error": str(e)}
    return store if isinstance(store, dict) else {}


async def metrics(request: web.Request) -> web.Response:
    engine = _engine(request)
    # the store's gauges as /healthz sees them now, not as of the last sweep: a full disk with
    # no new write since must still read unhealthy
    store = _store_report(engine)
    engine.metrics.set_store(
        int(store.get("queue_depth") or 0),
        int(store.get("write_errors") or 0),
        _store_ok(store),
        stalled=bool(store.get("writer_stalled")),
    )
    if isinstance(store.get("open_runs"), int):  # a terminated or deleted run leaves the gauge at once
        engine.metrics.set_live_sessions(store["open_runs"])
    resp = web.Response(body=engine.metrics.render())
    resp.headers["Content-Type"] = METRICS_CONTENT_TYPE
    return resp


def _store_ok(store: Any) -> bool:
    """Whether the trace store's report says it writes fine (an `ok`/`healthy` flag, else no error)."""
    if not isinstance(store, dict):
        return True
    for key in ("ok", "healthy"):
        if key in store:
            return bool(store[key])
    return not store.get("last_error")


async def healthz(request: web.Request) -> web.Response:
    """Always 200 while the process runs; trace-store trouble is reported, never fatal."""
    try:
        report = dict(_engine(request).health())
    except Exception as e:  # a health probe must not fail because a report did
        log.exception("healthz.report_failed")
        report = {"trace_store": {"ok": False, "error": str(e)}}
    store = report.get("trace_store", {})
    return _json({**report, "status": "ok" if _store_ok(store) else "degraded", "trace_store": store})


async def readyz(request: web.Request) -> web.Response:
    """Ready once the listeners are up (the engine started before them), not ready (503) from the moment
    the drain starts, so a load balancer stops sending calls while in-flight ones finish (SPEC §6);
    trace-store trouble never fails it."""
    if _engine(request).draining:
        return _json({"status": "draining"}, status=503)
    return _json({"status": "ready"})


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


async def favicon(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "favicon.svg", headers={"Cache-Control": "max-age=3600"})


def setup_admin(app: web.Application, engine: EngineView) -> None:
    """Add the admin routes and the token/cross-site middleware to `app` (before it starts)."""
    app[ENGINE_VIEW] = engine
    app[READER] = RunReader(Path(engine.data_dir))
    app[IO_POOL] = pool = ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="tripwire-admin-io")

    async def close_pool(_: web.Application) -> None:
        pool.shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(close_pool)
    app.middlewares.append(admin_guard)
    app.middlewares.append(static_no_cache)
    r = app.router
    r.add_get("/api/runs", list_runs)
    r.add_get("/api/runs/{run_id}", get_run)
    r.add_delete("/api/runs/{run_id}", delete_run)
    r.add_get("/api/runs/{run_id}/events", get_events)
    r.add_get("/api/runs/{run_id}/paths", get_paths)
    r.add_get("/api/runs/{run_id}/cost-series", get_cost_series)
    r.add_get("/api/runs/{run_id}/rename", get_run_plain)  # AgentDbg has it: the id validator by GET
    r.add_post("/api/runs/{run_id}/rename", rename_run)
    r.add_post("/api/runs/{run_id}/terminate", terminate_run)
    r.add_get("/api/runs/{run_id}/guard-stats", guard_stats)
    r.add_post("/api/runs/{run_id}/replay", replay_run)
    r.add_get("/api/agents", list_agents)
    r.add_get("/api/agents/{name}/prevention-config", get_agent_config)
    r.add_put("/api/agents/{name}/prevention-config", put_agent_config)
    r.add_delete("/api/agents/{name}/prevention-config", delete_agent_config)
    r.add_get("/api/projects/prevention-config", get_project_config)
    r.add_put("/api/projects/prevention-config", put_project_config)
    r.add_delete("/api/projects/prevention-config", delete_project_config)
    setup_spend(app, engine)  # budgets over time (viewer/spend_api.py)
    r.add_get("/metrics", metrics)
    r.add_get("/healthz", healthz)
    r.add_get("/readyz", readyz)
    r.add_get("/", index)
    r.add_get("/favicon.svg", favicon)
    r.add_static("/static/", STATIC_DIR, append_version=False)
    setup_resume(app, engine)
