"""A run written by Tripwire's recorder is read by AgentDbg 0.3.0's own code (storage, baseline, viewer)."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from schema import assert_run_valid

from proxy import storage
from proxy.recorder import TraceRecorder

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)  # "agentdbg has been renamed to maida"
    from agentdbg import storage as agentdbg_storage
    from agentdbg.baseline import create_baseline
    from agentdbg.config import load_config


@pytest.fixture
async def written_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[dict[str, Any]]:
    """Two Tripwire runs (one ended, one still running) in tmp_path, and AgentDbg pointed at it."""
    monkeypatch.setenv("AGENTDBG_DATA_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # load_config also reads ./.agentdbg/config.yaml: keep it empty
    t = [1771187465.0]
    rec = TraceRecorder(tmp_path, clock=lambda: t[0])
    await rec.start()
    ended = rec.start_run(run_name="research s1", agent_name="research", session_id="s1", argv=["tripwire"])
    t[0] += 1
    llm = rec.record(
        ended,
        "LLM_CALL",
        "gpt-4o",
        {
            "model": "gpt-4o",
            "prompt": [{"role": "user", "content": "find it"}],
            "response": {
                "text": "",
                "tool_calls": [{"id": "c1", "name": "search", "arguments": {"q": "it"}}],
            },
            "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
            "status": "ok",
            "error": None,
        },
        duration_ms=900,
    )
    rec.record(
        ended,
        "TOOL_CALL",
        "search",
        {"tool_name": "search", "args": {"q": "it"}, "result": "found", "status": "ok", "error": None},
        parent_id=llm,
        duration_ms=30,
    )
    rec.record(
        ended,
        "ERROR",
        "GuardrailExceeded",
        {
            "error_type": "budget",
            "message": "over",
            "stack": None,
            "guardrail": "max_cost_usd",
            "threshold": 1,
            "actual": 2,
        },
    )
    t[0] += 1
    rec.end_run(ended, status="error", reason="budget_exceeded")
    t[0] += 10
    running = rec.start_run(run_name="coder s2", agent_name="coder", session_id="s2", argv=["tripwire"])
    await rec.flush()
    yield {"ended": ended, "running": running, "data_dir": tmp_path}
    await rec.close()


async def test_agentdbg_storage_lists_and_loads_tripwire_runs(written_runs: dict[str, Any]) -> None:
    ended, running, data_dir = written_runs["ended"], written_runs["running"], written_runs["data_dir"]
    assert_run_valid(data_dir, ended)
    assert_run_valid(data_dir, running)
    config = load_config()
    assert Path(config.data_dir) == data_dir

    runs = agentdbg_storage.list_runs(limit=50, config=config)
    assert [r["run_id"] for r in runs] == [running, ended]  # newest first, as AgentDbg sorts
    assert runs[1]["status"] == "error" and runs[1]["counts"]["tool_calls"] == 1
    assert runs[0]["status"] == "running"

    assert agentdbg_storage.validate_run_id_format(ended) == ended
    assert agentdbg_storage.resolve_run_id(ended[:8], config) == ended
    meta = agentdbg_storage.load_run_meta(ended, config)
    assert meta == {k: v for k, v in storage.load_run(data_dir, ended).items() if k != "tripwire"}  # type: ignore[union-attr]
    events = agentdbg_storage.load_events(ended, config)
    assert [e["event_type"] for e in events] == ["RUN_START", "LLM_CALL", "TOOL_CALL", "ERROR", "RUN_END"]
    assert events == storage.read_events(data_dir, ended)


async def test_agentdbg_baseline_reads_tripwire_metrics(written_runs: dict[str, Any]) -> None:
    baseline = create_baseline(written_runs["ended"], load_config())
    assert baseline["summary"]["llm_calls"] == 1
    assert baseline["summary"]["total_tokens"] == 15
    assert baseline["summary"]["duration_ms"] == 2000
    assert baseline["tool_path"] == ["search"]
    assert baseline["llm_models_used"] == ["gpt-4o"]
    assert len(baseline["guardrail_events"]) == 1
    assert baseline["final_status"] == "error"


async def test_agentdbg_viewer_api_serves_tripwire_runs(written_runs: dict[str, Any]) -> None:
    from starlette.testclient import TestClient

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from agentdbg.server import create_app

    ended, running = written_runs["ended"], written_runs["running"]
    with TestClient(create_app()) as client:
        runs = client.get("/api/runs").json()["runs"]
        assert {r["run_id"] for r in runs} == {ended, running}
        assert client.get(f"/api/runs/{ended}").json()["status"] == "error"
        events = client.get(f"/api/runs/{ended}/events").json()["events"]
        assert len(events) == 5 and events[-1]["payload"]["reason"] == "budget_exceeded"
        assert client.get(f"/api/runs/{running}/events").json()["events"][0]["event_type"] == "RUN_START"
        paths = client.get(f"/api/runs/{ended}/paths").json()
        assert paths["paths"] == storage.run_paths(written_runs["data_dir"], ended)
        assert client.get("/").status_code == 200
