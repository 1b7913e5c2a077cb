"""Shared by the viewer API and browser tests: runs on disk in SPEC §4.1's format, a stand-in engine."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.guard_store import FILE_NAME, GuardConfigStore
from proxy.guards.config import GuardConfig
from proxy.metrics import Metrics
from proxy.recorder import TraceRecorder
from viewer.engine_view import EngineView

T0 = datetime(2026, 2, 15, 20, 31, 5, 123000, tzinfo=UTC)


def iso(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def event(run_id: str, event_type: str, name: str, payload: dict[str, Any], ts: datetime, **kw: Any) -> dict:
    return {
        "spec_version": "0.1",
        "event_id": str(uuid.uuid4()),
        "run_id": run_id,
        "parent_id": None,
        "event_type": event_type,
        "ts": iso(ts),
        "duration_ms": kw.get("duration_ms"),
        "name": name,
        "payload": payload,
        "meta": {},
    }


def llm_payload(model: str, cost: float, tokens: tuple[int, int] = (100, 20)) -> dict[str, Any]:
    p, c = tokens
    return {
        "model": model,
        "prompt": [{"role": "user", "content": "hi"}],
        "prompt_messages_total": 1,
        "response": {"text": "hello", "tool_calls": []},
        "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
        "provider": "openai",
        "temperature": None,
        "stop_reason": "stop",
        "status": "ok",
        "error": None,
        "cost_usd": cost,
        "upstream": "default",
        "stream": False,
    }


def write_run(
    data_dir: Path,
    *,
    agent: str = "research-agent",
    status: str = "ok",
    started: datetime = T0,
    events: list[dict] | None = None,
    tags: list[str] | None = None,
    cost: float = 0.0,
    tokens: int = 0,
    run_id: str | None = None,
) -> str:
    """One run dir with run.json, events.jsonl and tripwire.json; returns the run id."""
    run_id = run_id or str(uuid.uuid4())
    d = data_dir / "runs" / run_id
    d.mkdir(parents=True)
    evs = events if events is not None else default_events(run_id, started)
    for e in evs:
        e["run_id"] = run_id
    counts = {"llm_calls": 0, "tool_calls": 0, "errors": 0, "loop_warnings": 0}
    for e in evs:
        key = {
            "LLM_CALL": "llm_calls",
            "TOOL_CALL": "tool_calls",
            "ERROR": "errors",
            "LOOP_WARNING": "loop_warnings",
        }
        if e["event_type"] in key:
            counts[key[e["event_type"]]] += 1
    run = {
        "spec_version": "0.1",
        "run_id": run_id,
        "run_name": f"{agent} session",
        "started_at": iso(started),
        "ended_at": None if status == "running" else iso(started + timedelta(seconds=5)),
        "duration_ms": None if status == "running" else 5000,
        "status": status,
        "counts": counts,
        "last_event_ts": evs[-1]["ts"] if evs else None,
    }
    (d / "run.json").write_bytes(orjson.dumps(run))
    (d / "events.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in evs))
    tw = {
        "agent_name": agent,
        "session_id": "s-" + run_id[:8],
        "cost_usd": cost,
        "tokens": {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens},
        "health_tags": tags or [],
    }
    (d / "tripwire.json").write_bytes(orjson.dumps(tw))
    return run_id


def default_events(run_id: str, t: datetime) -> list[dict]:
    """RUN_START, two LLM calls, a tool call, a LOOP_WARNING, a guard ERROR, RUN_END."""
    s = timedelta(milliseconds=300)
    return [
        event(run_id, "RUN_START", "research-agent session", {"run_name": "research-agent session"}, t),
        event(run_id, "LLM_CALL", "gpt-4o", llm_payload("gpt-4o", 0.0012), t + s, duration_ms=812),
        event(
            run_id,
            "TOOL_CALL",
            "search",
            {
                "tool_name": "search",
                "args": {"q": "tripwire"},
                "result": {"hits": 3},
                "status": "ok",
                "error": None,
                "source": "mcp",
                "server": "files",
            },
            t + 2 * s,
            duration_ms=40,
        ),
        event(run_id, "LLM_CALL", "gpt-4o", llm_payload("gpt-4o", 0.0020), t + 3 * s, duration_ms=640),
        event(
            run_id,
            "LOOP_WARNING",
            "TOOL_CALL:search",
            {
                "pattern": "TOOL_CALL:search",
                "repetitions": 5,
                "window_size": 12,
                "evidence_event_ids": [],
                "kind": "repetition",
            },
            t + 4 * s,
        ),
        event(
            run_id,
            "ERROR",
            "loop_detection",
            {
                "error_type": "loop_detection",
                "message": "blocked: search repeated 5 times",
                "stack": None,
                "guardrail": "loop_detection",
                "threshold": 5,
                "actual": 5,
            },
            t + 5 * s,
        ),
        event(
            run_id, "RUN_END", "run_end", {"status": "ok", "summary": {}, "reason": "idle_timeout"}, t + 6 * s
        ),
    ]


def many_events(run_id: str, n: int, t: datetime = T0) -> list[dict]:
    """A long run: alternating LLM and tool calls."""
    out = []
    for i in range(n):
        ts = t + timedelta(milliseconds=10 * i)
        if i % 2:
            out.append(
                event(
                    run_id,
                    "TOOL_CALL",
                    "read",
                    {
                        "tool_name": "read",
                        "args": {"i": i},
                        "result": "x",
                        "status": "ok",
                        "error": None,
                        "source": "mcp",
                        "server": "files",
                    },
                    ts,
                )
            )
        else:
            out.append(event(run_id, "LLM_CALL", "gpt-4o-mini", llm_payload("gpt-4o-mini", 0.0001), ts))
    return out


class FakeEngine:
    """`viewer.engine_view.EngineView` as `proxy.engine.Engine` provides it, with live sessions the
    test sets (`live`) in place of real ones, and a trace-store report it sets (`store_health`)."""

    def __init__(self, data_dir: Path, admin_token: str | None = None) -> None:
        self.data_dir = data_dir
        self.recorder = TraceRecorder(data_dir)
        self.guard_store = GuardConfigStore(data_dir / FILE_NAME, GuardConfig(), {})
        self.metrics = Metrics()
        self.admin_token = admin_token
        self.draining = False
        self.live: dict[str, dict] = {}
        self.terminated: list[str] = []
        self.store_health: dict[str, Any] = {"ok": True, "queue_depth": 0, "write_errors": 0}

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "draining": False, "trace_store": self.store_health}

    async def terminate_run(self, run_id: str) -> bool:
        if run_id not in self.live:
            return False
        del self.live[run_id]
        self.terminated.append(run_id)
        return True

    def guard_stats(self, run_id: str) -> dict | None:
        return self.live.get(run_id)


def _fake_is_an_engine_view(engine: FakeEngine) -> EngineView:
    """mypy checks the stand-in against the Protocol (this file is in pyproject.toml's mypy `files`)."""
    return engine


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    """chattr +i: even root cannot replace or delete the file, nor add to the directory (a real EPERM)."""
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)]).returncode != 0:
        pytest.skip("chattr +i not available on this filesystem")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
