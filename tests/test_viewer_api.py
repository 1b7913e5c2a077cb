"""The admin listener's routes on a real aiohttp server (127.0.0.1), over runs written to disk."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from proxy.engine import Engine
from proxy.guard_store import FILE_NAME, GuardConfigStore
from proxy.guards.config import GuardConfig
from tests.conftest import AGENT_KEY
from tests.factories import engine_settings
from tests.reference_bodies import LANGSIGHT_BODY
from tests.viewer_fixtures import T0, FakeEngine, event, immutable, iso, llm_payload, many_events, write_run
from viewer.api import setup_admin
from viewer.engine_view import EngineView, RecorderView

Client = TestClient
MakeClient = Callable[..., Awaitable[TestClient]]


@pytest.fixture
async def make_client(tmp_path: Path) -> Any:
    clients: list[TestClient] = []

    async def make(token: str | None = None) -> TestClient:
        engine = FakeEngine(tmp_path, admin_token=token)
        app = web.Application()
        setup_admin(app, engine)
        client = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        await engine.recorder.start()
        client.engine = engine  # type: ignore[attr-defined]
        clients.append(client)
        return client

    yield make
    for c in clients:
        await c.close()
        await c.engine.recorder.close()  # type: ignore[attr-defined]


BAD_IDS = [
    "not-a-uuid",
    "..%2F..",
    "..%2F..%2Fetc%2Fpasswd",
    "..%5C..",
    # uppercase and v1 UUIDs are not canonical v4 run ids
    "3F2504E0-4F89-41D3-9A0C-0305E82C3301",
    "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
]
MISSING = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"


async def test_runs_list_as_agentdbg(make_client: MakeClient, tmp_path: Path) -> None:
    c = await make_client()
    old = write_run(tmp_path, started=T0, cost=0.5, tokens=1200, tags=["loop_detected"])
    new = write_run(tmp_path, started=T0 + timedelta(minutes=1), agent="writer", status="running")
    r = await c.get("/api/runs")
    assert r.status == 200
    body = await r.json()
    assert set(body) == {"spec_version", "runs"}  # no params: AgentDbg's exact shape
    assert body["spec_version"] == "0.1"
    assert [run["run_id"] for run in body["runs"]] == [new, old]
    first = body["runs"][1]
    assert first["counts"] == {"llm_calls": 2, "tool_calls": 1, "errors": 1, "loop_warnings": 1}
    assert first["tripwire"]["agent_name"] == "research-agent"
    assert first["tripwire"]["cost_usd"] == 0.5
    assert first["tripwire"]["total_tokens"] == 1200
    assert first["tripwire"]["health_tags"] == ["loop_detected"]


async def test_runs_filters_and_paging(make_client: MakeClient, tmp_path: Path) -> None:
    c = await make_client()
    ids = [
        write_run(
            tmp_path,
            started=T0 + timedelta(seconds=i),
            agent="a" if i % 2 else "b",
            tags=["x"] if i < 2 else [],
        )
        for i in range(5)
    ]
    write_run(tmp_path, started=T0 + timedelta(seconds=10), agent="a", status="running")
    body = await (await c.get("/api/runs", params={"agent": "a", "status": "ok"})).json()
    assert [r["run_id"] for r in body["runs"]] == [ids[3], ids[1]]
    assert body["total"] == 2
    body = await (await c.get("/api/runs", params={"tag": "x"})).json()
    assert {r["run_id"] for r in body["runs"]} == {ids[0], ids[1]}
    body = await (await c.get("/api/runs", params={"limit": 2, "offset": 1})).json()
    assert [r["run_id"] for r in body["runs"]] == [ids[4], ids[3]]
    assert (body["total"], body["offset"], body["limit"]) == (6, 1, 2)
    r = await c.get("/api/runs", params={"limit": "many"})
    assert r.status == 400
    r = await c.get("/api/runs", params={"offset": "-1"})
    assert r.status == 400


async def test_run_meta_events_paths(make_client: MakeClient, tmp_path: Path) -> None:
    c = await make_client()
    run_id = write_run(tmp_path, cost=0.0032)
    meta = await (await c.get(f"/api/runs/{run_id}")).json()
    assert meta["run_id"] == run_id and meta["status"] == "ok"
    assert meta["tripwire"]["session_id"].startswith("s-")

    r = await c.get(f"/api/runs/{run_id}/events")
    body = await r.json()
    assert set(body) == {"spec_version", "run_id", "events"}
    types = [e["event_type"] for e in body["events"]]
    assert types == ["RUN_START", "LLM_CALL", "TOOL_CALL", "LLM_CALL", "LOOP_WARNING", "ERROR", "RUN_END"]

    body = await (await c.get(f"/api/runs/{run_id}/events", params={"offset": 2, "limit": 2})).json()
    assert [e["event_type"] for e in body["events"]] == ["TOOL_CALL", "LLM_CALL"]
    assert (body["total"], body["offset"], body["limit"]) == (7, 2, 2)
    body = await (await c.get(f"/api/runs/{run_id}/events", params={"offset": 50})).json()
    assert body["events"] == [] and body["total"] == 7

    paths = (await (await c.get(f"/api/runs/{run_id}/paths")).json())["paths"]
    assert Path(paths["run_json"]) == tmp_path / "runs" / run_id / "run.json"
    assert paths["events_jsonl"] == str(tmp_path / "runs" / run_id / "events.jsonl")

    series = (await (await c.get(f"/api/runs/{run_id}/cost-series")).json())["points"]
    assert [round(p["cost_usd"], 6) for p in series] == [0.0012, 0.0032]


async def test_cost_curve_of_concurrent_calls_rises_over_end_times(
    make_client: MakeClient, tmp_path: Path
) -> None:
    """Calls finish out of start order (file order): each point is when a call ended, and the
    curve only rises (it was drawn against start times in file order: a zig-zag)."""

    run_id = "6f1c2a9e-1d2b-4c3d-8e4f-5a6b7c8d9e0f"
    s = timedelta(seconds=1)
    events = [
        event(run_id, "RUN_START", "r", {"run_name": "r"}, T0),
        # started at +2 s, done at +3 s; then the call started at +1 s, done at +9 s; then one at +4..+5 s
        event(run_id, "LLM_CALL", "gpt-4o", llm_payload("gpt-4o", 0.1), T0 + 2 * s, duration_ms=1000),
        event(run_id, "LLM_CALL", "gpt-4o", llm_payload("gpt-4o", 0.2), T0 + s, duration_ms=8000),
        event(run_id, "LLM_CALL", "gpt-4o", llm_payload("gpt-4o", 0.4), T0 + 4 * s, duration_ms=1000),
    ]
    write_run(tmp_path, events=events, run_id=run_id)
    c = await make_client()
    points = (await (await c.get(f"/api/runs/{run_id}/cost-series")).json())["points"]
    assert [round(p["cost_usd"], 6) for p in points] == [0.1, 0.5, 0.7]
    stamps = [p["ts"] for p in points]
    assert stamps == sorted(stamps) and stamps[0] == iso(T0 + 3 * s) and stamps[-1] == iso(T0 + 9 * s)


async def test_events_follow_a_growing_file(make_client: MakeClient, tmp_path: Path) -> None:
    """The line index extends as the recorder appends; a half-written line is not served."""
    c = await make_client()
    run_id = write_run(tmp_path, status="running")
    path = tmp_path / "runs" / run_id / "events.jsonl"
    assert (await (await c.get(f"/api/runs/{run_id}/events", params={"limit": 100})).json())["total"] == 7
    extra = many_events(run_id, 3)
    with path.open("ab") as f:
        f.write(orjson.dumps(extra[0]) + b"\n" + orjson.dumps(extra[1])[:20])
    body = await (await c.get(f"/api/runs/{run_id}/events", params={"offset": 6})).json()
    assert body["total"] == 8 and len(body["events"]) == 2
    with path.open("ab") as f:
        f.write(orjson.dumps(extra[1])[20:] + b"\n")
    body = await (await c.get(f"/api/runs/{run_id}/events", params={"offset": 8})).json()
    assert body["total"] == 9
    assert body["events"][0]["event_id"] == extra[1]["event_id"]


async def test_large_run_page_is_cheap(make_client: MakeClient, tmp_path: Path) -> None:
    c = await make_client()
    run_id = write_run(tmp_path, events=many_events("x", 20_000))
    body = await (await c.get(f"/api/runs/{run_id}/events", params={"offset": 19_900, "limit": 200})).json()
    assert body["total"] == 20_000
    assert len(body["events"]) == 100
    assert body["events"][-1]["payload"]["args"] == {"i": 19_999}
    r = await c.get(f"/api/runs/{run_id}/events", params={"limit": 10**9})
    assert (await r.json())["limit"] == 5000  # capped


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize(
    ("method", "suffix"),
    [
        ("GET", ""),
        ("GET", "/events"),
        ("GET", "/paths"),
        ("GET", "/cost-series"),
        ("POST", "/rename"),
        ("DELETE", ""),
        ("POST", "/terminate"),
        ("GET", "/guard-stats"),
        ("POST", "/replay"),
    ],
)
async def test_malformed_ids_are_400(
    make_client: MakeClient, tmp_path: Path, bad: str, method: str, suffix: str
) -> None:
    c = await make_client()
    write_run(tmp_path)
    r = await c.request(method, f"/api/runs/{bad}{suffix}", json={"run_name": "x"})
    assert r.status == 400, (bad, method, suffix, await r.text())
    assert (await r.json())["detail"] == "invalid run_id"
    r = await c.request(method, f"/api/runs/{MISSING}{suffix}", json={"run_name": "x"})
    assert r.status == 404
    assert (await r.json())["detail"] == "run not found"
    assert (tmp_path / "runs").is_dir()


async def test_rename_and_delete(make_client: MakeClient, tmp_path: Path) -> None:
    c = await make_client()
    run_id = write_run(tmp_path)
    r = await c.post(f"/api/runs/{run_id}/rename", json={"run_name": "  nightly  "})
    assert r.status == 200
    assert (await r.json())["run_name"] == "nightly"
    assert orjson.loads((tmp_path / "runs" / run_id / "run.json").read_bytes())["run_name"] == "nightly"
    assert (await c.post(f"/api/runs/{run_id}/rename", json={"run_name": " "})).status == 400
    assert (await c.post(f"/api/runs/{run_id}/rename", json={"name": "x"})).status == 422
    assert (await c.post(f"/api/runs/{run_id}/rename", data=b"{oops")).status == 422

    r = await c.delete(f"/api/runs/{run_id}")
    assert r.status == 204
    assert not (tmp_path / "runs" / run_id).exists()
    assert (await c.get(f"/api/runs/{run_id}")).status == 404


async def test_open_run_rename_through_recorder_and_no_delete(
    make_client: MakeClient, tmp_path: Path
) -> None:
    c = await make_client()
    recorder = c.engine.recorder  # type: ignore[attr-defined]
    run_id = recorder.start_run(run_name="live one", agent_name="a", session_id="s1")
    await recorder.flush()
    r = await c.post(f"/api/runs/{run_id}/rename", json={"run_name": "renamed live"})
    assert r.status == 200 and (await r.json())["run_name"] == "renamed live"
    # the recorder's next rewrite keeps the new name (it was renamed in its memory)
    recorder.add_tags(run_id, "loop_detected")
    await recorder.flush()
    meta = await (await c.get(f"/api/runs/{run_id}")).json()
    assert meta["run_name"] == "renamed live"
    assert meta["tripwire"]["health_tags"] == ["loop_detected"]
    assert (await c.delete(f"/api/runs/{run_id}")).status == 409
    recorder.end_run(run_id, status="ok", reason="idle_timeout")
    assert (await c.delete(f"/api/runs/{run_id}")).status == 204
    await recorder.flush()
    assert not (tmp_path / "runs" / run_id).exists()


async def test_terminate_and_guard_stats(make_client: MakeClient, tmp_path: Path) -> None:
    c = await make_client()
    run_id = write_run(tmp_path, status="running")
    body = await (await c.get(f"/api/runs/{run_id}/guard-stats")).json()
    assert body == {"run_id": run_id, "live": False, "stats": None}
    assert (await c.post(f"/api/runs/{run_id}/terminate")).status == 409

    c.engine.live[run_id] = {"llm_calls": 3, "cost_usd": 0.01}  # type: ignore[attr-defined]
    body = await (await c.get(f"/api/runs/{run_id}/guard-stats")).json()
    assert body["live"] is True and body["stats"]["llm_calls"] == 3
    r = await c.post(f"/api/runs/{run_id}/terminate")
    assert r.status == 200
    assert await r.json() == {"run_id": run_id, "terminated": True}
    assert c.engine.terminated == [run_id]  # type: ignore[attr-defined]


async def test_agent_prevention_config(make_client: MakeClient, tmp_path: Path) -> None:
    c = await make_client()
    url = "/api/agents/research-agent/prevention-config"
    body = await (await c.get(url)).json()
    assert body["agent_name"] == "research-agent"
    assert body["is_agent_override"] is False
    assert body["loop_detection"]["threshold"] == 5
    assert set(body) >= {"loop_detection", "budget", "limits", "circuit_breaker"}

    r = await c.put(url, json=LANGSIGHT_BODY)
    assert r.status == 200, await r.text()
    body = await r.json()
    assert body["is_agent_override"] is True
    assert body["loop_detection"]["action"] == "terminate"
    assert body["loop_detection"]["max_steps"] == 50
    assert body["budget"]["max_cost_usd"] == 0.5
    assert body["limits"]["max_llm_calls"] is None
    assert (await (await c.get(url)).json()) == body
    # persisted for the next start
    saved = orjson.loads((tmp_path / FILE_NAME).read_bytes())
    assert saved["agents"]["research-agent"]["loop_detection"]["threshold"] == 3
    assert GuardConfigStore(tmp_path / FILE_NAME, GuardConfig(), {}).effective("research-agent")[1]
    # effective for the engine's next call
    cfg, is_override = c.engine.guard_store.effective("research-agent")  # type: ignore[attr-defined]
    assert is_override and cfg.loop_detection.threshold == 3

    # invalid: 422 naming the field, old config kept
    bad = {**LANGSIGHT_BODY, "loop_detection": {"threshold": 1}}
    r = await c.put(url, json=bad)
    assert r.status == 422
    err = await r.json()
    assert "loop_detection.threshold" in err["message"]
    assert err["detail"][0]["loc"] == ["loop_detection", "threshold"]
    assert (await (await c.get(url)).json())["loop_detection"]["threshold"] == 3
    assert (await c.put(url, data=b"not json")).status == 422
    assert (await c.put(url, json=[1, 2])).status == 422

    r = await c.delete(url)
    assert r.status == 200
    body = await r.json()
    assert body["is_agent_override"] is False and body["loop_detection"]["threshold"] == 5


async def test_project_prevention_config(make_client: MakeClient) -> None:
    c = await make_client()
    url = "/api/projects/prevention-config"
    body = await (await c.get(url)).json()
    assert body["agent_name"] is None and body["is_agent_override"] is False
    r = await c.put(url, json={"budget": {"max_cost_usd": 2}})
    assert r.status == 200
    assert (await r.json())["budget"]["max_cost_usd"] == 2
    agent = await (await c.get("/api/agents/any/prevention-config")).json()
    assert agent["budget"]["max_cost_usd"] == 2 and agent["is_agent_override"] is False
    r = await c.put(url, json={"budget": {"max_cost_usd": 1, "soft_alert_threshold_usd": 3}})
    assert r.status == 422
    assert "soft_alert_threshold_usd" in (await r.json())["message"]
    body = await (await c.delete(url)).json()
    assert body["budget"]["max_cost_usd"] is None


async def test_config_not_saved_when_the_disk_refuses_keeps_the_old(
    start_tripwire: Any, fake_upstream: Any
) -> None:
    """A PUT/DELETE whose file write fails answers 503 and changes nothing (no 500 with the new
    config silently in force until the next restart)."""
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    auth = {"Authorization": "Bearer hunter2"}
    project = "/api/projects/prevention-config"
    agent = "/api/agents/research-agent/prevention-config"
    async with ClientSession(base_url=tw.admin_url, headers=auth) as s:
        async with s.put(project, json={"budget": {"max_cost_usd": 2}}) as r:
            assert r.status == 200
        # the config file's place is taken by a directory: every save now fails with an OSError
        (tw.data_dir / FILE_NAME).unlink()
        (tw.data_dir / FILE_NAME).mkdir()
        for method, path, body in [
            ("PUT", agent, LANGSIGHT_BODY),
            ("PUT", project, {}),
            ("DELETE", project, None),
        ]:
            async with s.request(method, path, json=body) as r:
                assert r.status == 503, (method, path)
                assert "not saved" in (await r.json())["detail"]
        async with s.get(agent) as r:
            body = await r.json()
    assert body["is_agent_override"] is False and body["budget"]["max_cost_usd"] == 2
    cfg = tw.engine.guard_config("research-agent")
    assert cfg.budget.max_cost_usd == 2 and cfg.loop_detection.threshold == 5


async def test_agents_list(make_client: MakeClient, tmp_path: Path) -> None:
    c = await make_client()
    write_run(tmp_path, agent="research-agent", cost=0.25)
    write_run(tmp_path, agent="research-agent", cost=0.5, status="running", started=T0 + timedelta(seconds=1))
    write_run(tmp_path, agent="writer")
    await c.put("/api/agents/configured-only/prevention-config", json=LANGSIGHT_BODY)
    agents = {a["name"]: a for a in (await (await c.get("/api/agents")).json())["agents"]}
    assert set(agents) == {"research-agent", "writer", "configured-only"}
    assert agents["research-agent"]["runs"] == 2 and agents["research-agent"]["running"] == 1
    assert agents["research-agent"]["cost_usd"] == pytest.approx(0.75)
    assert agents["configured-only"]["is_agent_override"] is True
    assert agents["writer"]["is_agent_override"] is False


async def test_token_rule(make_client: MakeClient, tmp_path: Path) -> None:
    c = await make_client(token="s3cret")
    run_id = write_run(tmp_path)
    for method, path in [
        ("GET", "/api/runs"),
        ("GET", f"/api/runs/{run_id}"),
        ("GET", f"/api/runs/{run_id}/events"),
        ("DELETE", f"/api/runs/{run_id}"),
        ("GET", "/api/agents"),
        ("PUT", "/api/projects/prevention-config"),
        ("GET", "/api/agents/a/prevention-config"),
        ("POST", f"/api/runs/{run_id}/replay"),
    ]:
        r = await c.request(method, path, json={})
        assert r.status == 401, (method, path)
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        r = await c.request(method, path, json={}, headers={"Authorization": "Bearer wrong"})
        assert r.status == 401
    ok = {"Authorization": "Bearer s3cret"}
    assert (await c.get("/api/runs", headers=ok)).status == 200
    assert (await c.get(f"/api/runs/{run_id}/events", headers=ok)).status == 200
    # open without a token: UI files, metrics, health
    for path in ("/", "/static/app.js", "/static/styles.css", "/metrics", "/healthz", "/readyz"):
        assert (await c.get(path)).status == 200, path
    assert (tmp_path / "runs" / run_id).is_dir()


async def test_cross_site_writes_refused(make_client: MakeClient, tmp_path: Path) -> None:
    c = await make_client()
    run_id = write_run(tmp_path)
    url = "/api/agents/a/prevention-config"
    r = await c.put(url, json=LANGSIGHT_BODY, headers={"Origin": "http://evil.example"})
    assert r.status == 403
    r = await c.delete(f"/api/runs/{run_id}", headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status == 403
    r = await c.put(url, json=LANGSIGHT_BODY, headers={"Sec-Fetch-Site": "same-site"})
    assert r.status == 403
    r = await c.post(f"/api/runs/{run_id}/replay", json={}, headers={"Origin": "http://evil.example"})
    assert r.status == 403  # a POST like the others, though it changes nothing
    assert (tmp_path / "runs" / run_id).is_dir()
    assert not c.engine.guard_store.effective("a")[1]  # type: ignore[attr-defined]
    # reads are not refused, and the UI's own same-origin writes pass
    assert (await c.get("/api/runs", headers={"Sec-Fetch-Site": "cross-site"})).status == 200
    origin = f"http://{c.host}:{c.port}"
    r = await c.put(url, json=LANGSIGHT_BODY, headers={"Origin": origin, "Sec-Fetch-Site": "same-origin"})
    assert r.status == 200


async def test_ui_writes_behind_a_tls_ingress(make_client: MakeClient) -> None:
    """SPEC §7: the admin listener on the pod network, reached through an ingress that ends TLS. The
    browser's own page sends `Origin: https://...` to a listener that sees plain http: its writes
    are same-origin (the browser says so) and must pass; another site's page is still refused."""
    c = await make_client(token="t")
    url = "/api/agents/a/prevention-config"
    host = "tripwire.example.com"
    auth = {"Authorization": "Bearer t", "Host": host}
    same = {**auth, "Origin": f"https://{host}", "Sec-Fetch-Site": "same-origin"}
    assert (await c.put(url, json=LANGSIGHT_BODY, headers=same)).status == 200
    assert (
        await c.delete(url, headers={**auth, "Origin": f"https://{host}"})
    ).status == 200  # no Fetch metadata
    for evil in (
        {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
    ):
        assert (await c.put(url, json=LANGSIGHT_BODY, headers={**auth, **evil})).status == 403, evil


@pytest.mark.parametrize(
    ("host", "token", "status"),
    [
        ("evil.example:8714", None, 403),  # DNS rebinding: another site's name pointing at 127.0.0.1
        ("evil.example", None, 403),
        ("127.0.0.1:8714", None, 200),
        ("localhost:8714", None, 200),
        ("[::1]:8714", None, 200),
        ("10.1.2.3:8714", None, 200),
        ("tripwire.default.svc:8714", "t", 200),  # with a token any name may be used
    ],
)
async def test_host_rule_without_token(
    make_client: MakeClient, host: str, token: str | None, status: int
) -> None:
    c = await make_client(token=token)
    headers = {"Host": host}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    r = await c.get("/api/runs", headers=headers)
    assert r.status == status
    assert (await c.get("/", headers={"Host": host})).status == 200  # UI files hold no data


async def test_metrics_endpoint(make_client: MakeClient) -> None:
    c = await make_client(token="t")
    c.engine.metrics.observe_request("llm", "default", 200, 0.5, 0.001)  # type: ignore[attr-defined]
    r = await c.get("/metrics")
    assert r.status == 200
    assert r.headers["Content-Type"].startswith("text/plain")
    fams = {f.name: f for f in text_string_to_metric_families(await r.text())}
    assert "tripwire_requests" in fams
    assert "tripwire_upstream_latency_seconds" in fams


async def test_health_and_ready(make_client: MakeClient) -> None:
    c = await make_client()
    body = await (await c.get("/healthz")).json()
    assert body["status"] == "ok"
    c.engine.store_health = {"ok": False, "write_errors": 4, "last_error": "No space left on device"}  # type: ignore[attr-defined]
    r = await c.get("/healthz")
    assert r.status == 200  # trace-store trouble never fails the probe
    body = await r.json()
    assert body["status"] == "degraded"
    assert body["trace_store"]["last_error"] == "No space left on device"
    assert (await c.get("/readyz")).status == 200  # nor readiness


async def test_index_and_static(make_client: MakeClient) -> None:
    c = await make_client()
    r = await c.get("/")
    assert r.status == 200
    assert "text/html" in r.headers["Content-Type"]
    assert "/static/app.js" in await r.text()
    for path in (
        "/",
        "/static/app.js",
        "/static/styles.css",
    ):  # revalidated: no stale app.js after an upgrade
        assert (await c.get(path)).headers["Cache-Control"] == "no-cache", path
    assert (await c.get("/static/../api.py")).status in (403, 404)
    assert (await c.get("/static/%2e%2e/api.py")).status in (403, 404)


async def test_the_admin_ui_cannot_be_framed_or_run_injected_scripts(make_client: MakeClient) -> None:
    c = await make_client()
    for path in ("/", "/static/app.js", "/api/runs"):
        headers = (await c.get(path)).headers
        csp = headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp, path
        assert "unsafe-inline" not in csp
        assert headers["X-Frame-Options"] == "DENY" and headers["X-Content-Type-Options"] == "nosniff"


async def test_real_engine_through_the_proxy(start_tripwire: Any, fake_upstream: Any) -> None:
    """A real openai SDK call through Tripwire, then the admin API as the viewer uses it."""
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, admin_token="hunter2")
    llm = openai.AsyncOpenAI(base_url=tw.url + "/agents/research-agent/v1", api_key=AGENT_KEY, max_retries=0)
    await llm.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}])
    await tw.flush()
    auth = {"Authorization": "Bearer hunter2"}
    async with ClientSession(base_url=tw.admin_url) as s:
        async with s.get("/api/runs") as r:
            assert r.status == 401
        async with s.get("/api/runs", headers=auth) as r:
            (run,) = (await r.json())["runs"]
        run_id = run["run_id"]
        assert run["status"] == "running"
        assert run["tripwire"]["agent_name"] == "research-agent"
        assert run["tripwire"]["total_tokens"] == 120
        assert run["tripwire"]["cost_usd"] > 0
        async with s.get(f"/api/runs/{run_id}/events", params={"offset": 0, "limit": 10}, headers=auth) as r:
            body = await r.json()
        assert body["total"] == 2
        assert [e["event_type"] for e in body["events"]] == ["RUN_START", "LLM_CALL"]
        async with s.get(f"/api/runs/{run_id}/guard-stats", headers=auth) as r:
            assert (await r.json())["live"] is True
        async with s.get("/api/agents", headers=auth) as r:
            assert [a["name"] for a in (await r.json())["agents"]] == ["research-agent"]

        # a guard config set through the API is what the engine uses for the next call
        async with s.put(
            "/api/agents/research-agent/prevention-config", json=LANGSIGHT_BODY, headers=auth
        ) as r:
            assert r.status == 200
        assert tw.engine.guard_config("research-agent").loop_detection.threshold == 3

        async with s.get("/metrics") as r:
            text = await r.text()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        reqs = [s_ for s_ in fams["tripwire_requests"].samples if s_.name == "tripwire_requests_total"]
        assert [(x.labels["kind"], x.labels["status_class"], x.value) for x in reqs] == [("llm", "2xx", 1.0)]

        # the kill switch: the session ends and its next call is refused
        async with s.post(f"/api/runs/{run_id}/terminate", headers=auth) as r:
            assert r.status == 200
        async with s.post(f"/api/runs/{run_id}/terminate", headers=auth) as r:
            assert r.status == 409
        async with s.get(f"/api/runs/{run_id}/guard-stats", headers=auth) as r:
            assert await r.json() == {"run_id": run_id, "live": False, "stats": None}
        # the same conversation going on is refused (a new one would be a new episode: SPEC §3)
        with pytest.raises(openai.RateLimitError):
            await llm.chat.completions.create(
                model="gpt-4o-mini",
                messages=[
                    {"role": "user", "content": "hello"},
                    {"role": "assistant", "content": "Hello from the fake upstream"},
                    {"role": "user", "content": "again"},
                ],
            )
        await tw.flush()
        async with s.get(f"/api/runs/{run_id}", headers=auth) as r:
            meta = await r.json()
        assert meta["status"] == "error"
        assert "terminated" in meta["tripwire"]["health_tags"]
        async with s.get("/healthz") as r:
            health = await r.json()
        assert r.status == 200 and health["status"] == "ok" and health["trace_store"]["ok"] is True
        async with s.get("/readyz") as r:
            assert r.status == 200


def agentdbg_answers(data_dir: Path, requests: list[tuple[str, str, Any]]) -> list[tuple[int, Any]]:
    """The same requests against AgentDbg 0.3.0's own viewer app on the same data dir."""
    import warnings

    from starlette.testclient import TestClient

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from agentdbg.server import create_app

    out = []
    with TestClient(create_app()) as client:
        for method, path, body in requests:
            r = client.request(method, path, json=body)
            out.append((r.status_code, r.json() if r.content else None))
    return out


def without_tripwire(body: Any) -> Any:
    if isinstance(body, dict) and "runs" in body:
        return {**body, "runs": [without_tripwire(r) for r in body["runs"]]}
    if isinstance(body, dict):
        return {k: v for k, v in body.items() if k != "tripwire"}
    return body


async def test_same_answers_as_agentdbg(
    make_client: MakeClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTDBG_DATA_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    c = await make_client()
    ids = [write_run(tmp_path, started=T0 + timedelta(seconds=i)) for i in range(3)]
    a, b = ids[0], ids[1]
    requests: list[tuple[str, str, Any]] = [
        ("GET", "/api/runs", None),
        ("GET", f"/api/runs/{a}", None),
        ("GET", f"/api/runs/{a}/events", None),
        ("GET", f"/api/runs/{a}/paths", None),
        ("GET", f"/api/runs/{a}/rename", None),
        ("GET", "/api/runs/not-a-uuid/rename", None),
        ("GET", "/api/runs/not-a-uuid", None),
        ("GET", "/api/runs/not-a-uuid/events", None),
        ("GET", f"/api/runs/{MISSING}", None),
        ("GET", f"/api/runs/{MISSING}/events", None),
        ("GET", f"/api/runs/{MISSING}/paths", None),
        ("POST", f"/api/runs/{MISSING}/rename", {"run_name": "x"}),
        ("POST", "/api/runs/not-a-uuid/rename", {"run_name": "x"}),
        ("DELETE", f"/api/runs/{MISSING}", None),
        ("DELETE", "/api/runs/not-a-uuid", None),
    ]
    theirs = await asyncio.to_thread(agentdbg_answers, tmp_path, requests)
    for (method, path, body), (status, expected) in zip(requests, theirs, strict=True):
        r = await c.request(method, path, json=body)
        got = await r.json() if r.status != 204 else None
        assert r.status == status, (method, path)
        assert without_tripwire(got) == expected, (method, path)

    # changes: rename one run on each side, delete one on each side, then compare the lists again
    r = await c.post(f"/api/runs/{a}/rename", json={"run_name": "ours"})
    (status, theirs_renamed), (dstatus, _) = await asyncio.to_thread(
        agentdbg_answers,
        tmp_path,
        [("POST", f"/api/runs/{b}/rename", {"run_name": "theirs"}), ("DELETE", f"/api/runs/{ids[2]}", None)],
    )
    assert (r.status, status, dstatus) == (200, 200, 204)
    assert set(await r.json()) == set(theirs_renamed)
    mine = without_tripwire(await (await c.get("/api/runs")).json())
    ((_, theirs_list),) = await asyncio.to_thread(agentdbg_answers, tmp_path, [("GET", "/api/runs", None)])
    assert mine == theirs_list
    assert {run["run_name"] for run in mine["runs"]} == {"ours", "theirs"}


async def test_run_dir_escaping_the_runs_base_is_a_400_as_in_agentdbg(
    make_client: MakeClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A well-formed id whose directory is a symlink out of `runs/`: AgentDbg's 400, never a 500,
    and nothing outside is touched."""
    monkeypatch.setenv("AGENTDBG_DATA_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    c = await make_client()
    outside = tmp_path / "elsewhere"
    run_id = write_run(outside)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / run_id).symlink_to(outside / "runs" / run_id)
    requests: list[tuple[str, str, Any]] = [
        ("GET", f"/api/runs/{run_id}", None),
        ("GET", f"/api/runs/{run_id}/events", None),
        ("GET", f"/api/runs/{run_id}/paths", None),
        ("POST", f"/api/runs/{run_id}/rename", {"run_name": "x"}),
        ("DELETE", f"/api/runs/{run_id}", None),
    ]
    theirs = await asyncio.to_thread(agentdbg_answers, tmp_path, requests)
    assert {status for status, _ in theirs} == {400}
    for (method, path, body), (status, expected) in zip(requests, theirs, strict=True):
        r = await c.request(method, path, json=body)
        assert (r.status, await r.json()) == (status, expected), (method, path)
    for path in ("terminate", "guard-stats", "cost-series"):
        r = await c.request("POST" if path == "terminate" else "GET", f"/api/runs/{run_id}/{path}")
        assert r.status == 400, path
    assert (outside / "runs" / run_id / "run.json").is_file()


async def test_rename_and_delete_the_disk_refuses_answer_json(
    make_client: MakeClient, tmp_path: Path
) -> None:
    """A rename or delete the filesystem refuses is a JSON error the UI can show, not a text 500."""
    c = await make_client()
    run_id = write_run(tmp_path)
    run_json = tmp_path / "runs" / run_id / "run.json"
    with immutable(run_json):
        r = await c.post(f"/api/runs/{run_id}/rename", json={"run_name": "new"})
        assert (r.status, r.content_type) == (503, "application/json")
        assert "not renamed" in (await r.json())["detail"]
        r = await c.delete(f"/api/runs/{run_id}")
        assert (r.status, r.content_type) == (503, "application/json")
        assert "not deleted" in (await r.json())["detail"]
    assert orjson.loads(run_json.read_bytes())["run_name"] != "new"
    assert (await c.delete(f"/api/runs/{run_id}")).status == 204  # once the disk lets it


# --- POST /api/runs/{run_id}/replay (SPEC §5.7) ------------------------------------------------


def firings(items: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted((d["call_index"], d["guard"], d["kind"], d["action"]) for d in items)


async def test_replay_a_run_recorded_through_tripwire(start_tripwire: Any) -> None:
    """An MCP agent polls an unchanging status through a running Tripwire; the viewer's replay
    endpoint then decides as the live guards did, and under another config as that one would."""
    pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x
    from mcp import Client

    from tests.test_guards_e2e_mcp import SESSION_URL, shop

    with shop() as upstream:
        tw = await start_tripwire(mcp={"shop": {"url": upstream}}, admin_token="hunter2")
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            for _ in range(6):
                await client.call_tool("job_status", {"job_id": "j1"})
        await tw.flush()
    (run_id,) = tw.run_ids()
    events = tw.events(run_id)
    calls = {e["payload"]["call_seq"]: e["event_id"] for e in events if e["event_type"] == "TOOL_CALL"}
    warned = {e["payload"]["kind"] for e in events if e["event_type"] == "LOOP_WARNING"}
    assert sorted(calls) == [1, 2, 3, 4, 5, 6] and "no_progress" in warned
    on_disk = (tw.data_dir / "runs" / run_id / "events.jsonl").read_bytes()
    url = f"/api/runs/{run_id}/replay"

    async with ClientSession(base_url=tw.admin_url, headers={"Authorization": "Bearer hunter2"}) as s:
        # no body: each call under the config recorded for it, i.e. what happened live
        async with s.post(url) as r:
            assert r.status == 200, await r.text()
            recorded = await r.json()
        assert {k: recorded[k] for k in ("run_id", "calls", "recorded_by", "config")} == {
            "run_id": run_id,
            "calls": 6,
            "recorded_by": "tripwire",
            "config": "recorded",
        }
        assert recorded["live"] and firings(recorded["checks"]) == firings(recorded["live"])
        assert firings(recorded["decisions"]) == firings(recorded["live"])  # nothing fired after an answer
        assert {d["kind"] for d in recorded["live"]} == warned  # the LOOP_WARNINGs written live
        # the poll after 4 identical results (issue 31: not the 4th, judged before its own result)
        assert (5, "loop_detection", "no_progress", "warn") in firings(recorded["live"])
        for d in recorded["decisions"]:
            assert d["event_id"] == calls[d["call_index"]]  # the call's own TOOL_CALL event
            assert d["replayed"] is True and d["message"]
        async with s.post(url, json={}) as r:
            assert (await r.json())["decisions"] == recorded["decisions"]

        # an edited config: loop detection off, nothing fires; what happened live is unchanged
        async with s.post(url, json={"config": {"loop_detection": {"enabled": False}}}) as r:
            assert r.status == 200
            custom = await r.json()
        assert custom["config"] == "custom"
        assert [d for d in custom["decisions"] if d["guard"] == "loop_detection"] == []
        assert custom["checks"] == [] and custom["live"] == recorded["live"]
        # a GET answer's echo fields are ignored, as by the PUT endpoints
        got = dict(LANGSIGHT_BODY, agent_name="bot", is_agent_override=True, source="api")
        async with s.post(url, json={"config": got}) as r:
            assert r.status == 200
            assert (3, "loop_detection", "repetition", "terminate") in firings((await r.json())["decisions"])

        # an invalid config is a 422 naming the field, as the PUT endpoints answer
        async with s.post(url, json={"config": {"loop_detection": {"threshold": 1}}}) as r:
            assert r.status == 422
            err = await r.json()
        assert err["detail"][0]["loc"] == ["config", "loop_detection", "threshold"]
        assert "config.loop_detection.threshold" in err["message"]
        for bad in ({"config": 5}, {"config": "newest"}, {"confg": "current"}, [1]):
            async with s.post(url, json=bad) as r:
                assert r.status == 422, bad
        async with s.post(url, data=b"{oops", headers={"Content-Type": "application/json"}) as r:
            assert r.status == 422

        # "current": the config in force now for the run's agent (here an override set meanwhile)
        async with s.post(url, json={"config": "current"}) as r:
            current = await r.json()
        assert current["config"] == "current" and current["decisions"] == recorded["decisions"]
        off = {"loop_detection": {"enabled": False}}
        async with s.put("/api/agents/bot/prevention-config", json=off) as r:
            assert r.status == 200
        async with s.post(url, json={"config": "current"}) as r:
            assert (await r.json())["decisions"] == []

        # bad and missing run ids as on every run route
        async with s.post("/api/runs/..%2F..%2Fetc/replay") as r:
            assert r.status == 400 and (await r.json())["detail"] == "invalid run_id"
        async with s.post(f"/api/runs/{MISSING}/replay") as r:
            assert r.status == 404 and (await r.json())["detail"] == "run not found"
        async with ClientSession(base_url=tw.admin_url) as anonymous, anonymous.post(url) as r:
            assert r.status == 401

    # a replay changes nothing
    assert (tw.data_dir / "runs" / run_id / "events.jsonl").read_bytes() == on_disk


async def test_replay_a_run_agentdbg_wrote(make_client: MakeClient, tmp_path: Path) -> None:
    """A run without guard inputs (AgentDbg's SDK) replays call by call; nothing was recorded live."""
    c = await make_client()
    run_id = write_run(tmp_path)
    r = await c.post(f"/api/runs/{run_id}/replay")
    assert r.status == 200, await r.text()
    body = await r.json()
    assert body["recorded_by"] == "agentdbg" and body["config"] == "recorded"
    assert body["calls"] == 3 and body["live"] == [] and body["checks"] == []
    r = await c.post(f"/api/runs/{run_id}/replay", json={"config": "current"})
    assert r.status == 200 and (await r.json())["config"] == "current"


async def test_a_symlink_planted_in_a_run_dir_is_not_followed(
    make_client: MakeClient, tmp_path: Path
) -> None:
    secret = tmp_path / "outside-secret.txt"
    secret.write_text('{"event_type": "LLM_CALL", "payload": {"stolen": "hunter2"}}\n')
    run_id = write_run(tmp_path)
    d = tmp_path / "runs" / run_id
    (d / "events.jsonl").unlink()
    (d / "events.jsonl").symlink_to(secret)
    c = await make_client()
    r = await c.get(f"/api/runs/{run_id}/events")
    assert "hunter2" not in await r.text()
    other = write_run(tmp_path)
    (tmp_path / "runs" / other / "run.json").unlink()
    (tmp_path / "runs" / other / "run.json").symlink_to(tmp_path / "runs" / run_id / "run.json")
    listed = (await (await c.get("/api/runs")).json())["runs"]
    assert other not in {x["run_id"] for x in listed}


# --- the engine the viewer reads: viewer.engine_view.EngineView -------------------------------


def _members(protocol: type) -> dict[str, Any]:
    return {k: v for k, v in vars(protocol).items() if not k.startswith("_")}


@pytest.mark.parametrize("make", [Engine, FakeEngine], ids=["Engine", "FakeEngine"])
def test_engines_satisfy_engine_view(tmp_path: Path, make: Any) -> None:
    """The real engine and the tests' stand-in both have every member the viewer reads, a coroutine
    where the Protocol says async (mypy checks the types: proxy/app.py, tests/viewer_fixtures.py)."""
    engine = Engine(engine_settings(tmp_path), argv=["tripwire"]) if make is Engine else FakeEngine(tmp_path)
    assert isinstance(engine, EngineView) and isinstance(engine.recorder, RecorderView)
    for protocol, obj in ((EngineView, engine), (RecorderView, engine.recorder)):
        members = _members(protocol)
        assert members, protocol
        for name, member in members.items():
            assert hasattr(obj, name), f"{type(obj).__name__} lacks {name}"
            if callable(member):
                impl = getattr(obj, name)
                assert callable(impl), name
                assert inspect.iscoroutinefunction(impl) == inspect.iscoroutinefunction(member), name
