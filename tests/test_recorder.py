"""TraceRecorder: runs written as valid AgentDbg traces, off the loop, nothing lost, failures survived."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from schema import assert_run_valid

from proxy import storage
from proxy.constants import EVENTS_JSONL, REDACTED_MARKER, RUN_JSON, TRIPWIRE_JSON, TRUNCATED_MARKER
from proxy.recorder import TraceRecorder, strip_content

T0 = 1771187465.0  # 2026-02-15T20:31:05Z
OPENAI_KEY = "sk-proj-4fQz9XbT1mK7pL2sV8nR3wY6"


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def rec(tmp_path: Path) -> AsyncIterator[TraceRecorder]:
    r = TraceRecorder(tmp_path, clock=Clock())
    await r.start()
    yield r
    await r.close()


def _start(r: TraceRecorder, **kw: Any) -> str:
    args: dict[str, Any] = {
        "run_name": "agent s1",
        "agent_name": "agent",
        "session_id": "s1",
        "argv": ["tripwire", "serve", "--admin-token", "hunter2"],
        "extra": {"loop_detection": {"enabled": True}},
    }
    args.update(kw)
    return r.start_run(**args)


def _llm_payload(text: str = "hello", **kw: Any) -> dict[str, Any]:
    p: dict[str, Any] = {
        "model": "gpt-4o",
        "prompt": [{"role": "user", "content": text}],
        "prompt_messages_total": 1,
        "response": {
            "text": "hi there",
            "tool_calls": [{"id": "c1", "name": "search", "arguments": {"q": "x"}}],
        },
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        "provider": "openai",
        "temperature": None,
        "stop_reason": "stop",
        "status": "ok",
        "error": None,
        "cost_usd": 0.001,
        "upstream": "default",
        "stream": False,
    }
    p.update(kw)
    return p


def _files(data_dir: Path, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    d = data_dir / "runs" / run_id
    return orjson.loads((d / RUN_JSON).read_bytes()), orjson.loads((d / TRIPWIRE_JSON).read_bytes())


async def test_full_run_is_valid_agentdbg(rec: TraceRecorder, tmp_path: Path) -> None:
    clock: Clock = rec.clock  # type: ignore[assignment]
    run_id = _start(rec)
    assert storage.is_valid_run_id(run_id)
    clock.t += 1.5
    llm_id = rec.record(
        run_id, "LLM_CALL", "gpt-4o", _llm_payload(), duration_ms=1234.7, meta={"agent": "agent"}
    )
    rec.add_usage(run_id, 0.001, 15)
    clock.t += 0.25
    rec.record(
        run_id,
        "TOOL_CALL",
        "search",
        {
            "tool_name": "search",
            "args": {"q": "x"},
            "result": "ok",
            "status": "ok",
            "error": None,
            "source": "mcp",
        },
        duration_ms=20,
        parent_id=llm_id,
    )
    rec.record(
        run_id,
        "LOOP_WARNING",
        "TOOL_CALL:search",
        {"pattern": "TOOL_CALL:search", "repetitions": 3, "window_size": 12, "evidence_event_ids": [llm_id]},
    )
    rec.record(run_id, "STATE_UPDATE", "state", {"state": {"circuit": "open"}, "diff": {"circuit": "open"}})
    rec.record(run_id, "ERROR", "budget", {"error_type": "budget", "message": "over", "stack": None})
    rec.add_tags(run_id, "loop_detected", "budget_warning")
    rec.add_tags(run_id, "loop_detected")
    rec.update_tripwire(run_id, guard_config_source="project")
    clock.t += 0.25
    end_id = rec.end_run(run_id, status="error", reason="budget_exceeded")
    assert end_id is not None
    await rec.flush()

    meta, events = assert_run_valid(tmp_path, run_id)
    assert [e["event_type"] for e in events] == [
        "RUN_START",
        "LLM_CALL",
        "TOOL_CALL",
        "LOOP_WARNING",
        "STATE_UPDATE",
        "ERROR",
        "RUN_END",
    ]
    assert meta == {
        "spec_version": "0.1",
        "run_id": run_id,
        "run_name": "agent s1",
        "started_at": "2026-02-15T20:31:05.000Z",
        "ended_at": "2026-02-15T20:31:07.000Z",
        "duration_ms": 2000,
        "status": "error",
        "counts": {"llm_calls": 1, "tool_calls": 1, "errors": 1, "loop_warnings": 1},
        "last_event_ts": "2026-02-15T20:31:07.000Z",
    }
    start = events[0]
    assert start["name"] == "agent s1"
    assert set(start["payload"]) == {
        "run_name",
        "python_version",
        "platform",
        "cwd",
        "argv",
        "agent_name",
        "session_id",
    }
    assert start["payload"]["argv"] == ["tripwire", "serve", "--admin-token", REDACTED_MARKER]
    assert start["payload"]["agent_name"] == "agent" and start["payload"]["session_id"] == "s1"
    llm = events[1]
    assert llm["event_id"] == llm_id and llm["duration_ms"] == 1234 and llm["meta"] == {"agent": "agent"}
    assert llm["ts"] == "2026-02-15T20:31:06.500Z"
    assert events[2]["parent_id"] == llm_id
    end = events[-1]
    assert end["event_id"] == end_id and end["name"] == "run_end"
    assert end["payload"] == {
        "status": "error",
        "summary": {
            "llm_calls": 1,
            "tool_calls": 1,
            "errors": 1,
            "duration_ms": 2000,
            "loop_warnings": 1,
            "cost_usd": 0.001,
            "total_tokens": 15,
        },
        "reason": "budget_exceeded",
    }
    _, tw = _files(tmp_path, run_id)
    assert tw == {
        "agent_name": "agent",
        "session_id": "s1",
        "end_reason": "budget_exceeded",
        "guard_config": {"loop_detection": {"enabled": True}},
        "record_content": True,
        "guard_config_source": "project",
        "cost_usd": 0.001,
        "tokens": {"prompt": 10, "completion": 5, "total": 15},
        "health_tags": ["budget_warning", "loop_detected"],
        # the process that wrote it (SPEC §2): recovery elsewhere leaves the run alone while it lives
        "owner": {"id": rec.owner.id, "pid": os.getpid(), "host": rec.owner.host},
    }
    listed = storage.list_runs(tmp_path)
    assert [r["run_id"] for r in listed] == [run_id]
    assert listed[0]["tripwire"]["health_tags"] == ["budget_warning", "loop_detected"]


async def test_run_json_while_running(rec: TraceRecorder, tmp_path: Path) -> None:
    run_id = _start(rec)
    rec.record(run_id, "LLM_CALL", "m", _llm_payload())
    await rec.flush()
    meta, _ = assert_run_valid(tmp_path, run_id)
    assert meta["status"] == "running" and meta["ended_at"] is None and meta["duration_ms"] is None
    assert meta["counts"]["llm_calls"] == 1
    assert rec.is_open(run_id)
    assert rec.summary(run_id)["llm_calls"] == 1


async def test_end_run_is_idempotent_and_late_events_are_dropped(rec: TraceRecorder, tmp_path: Path) -> None:
    run_id = _start(rec)
    assert rec.end_run(run_id, status="ok", reason="idle_timeout") is not None
    assert rec.end_run(run_id, status="error", reason="again") is None
    assert not rec.is_open(run_id)
    rec.record(run_id, "LLM_CALL", "m", _llm_payload())
    await rec.flush()
    meta, events = assert_run_valid(tmp_path, run_id)
    assert [e["event_type"] for e in events] == ["RUN_START", "RUN_END"]
    assert meta["status"] == "ok"
    assert rec.summary(run_id)["llm_calls"] == 0
    assert rec.end_run(run_id, status="ok", reason="x") is None  # also after it left memory


async def test_record_redacts_and_truncates(tmp_path: Path) -> None:
    rec = TraceRecorder(tmp_path, max_field_bytes=200)
    await rec.start()
    run_id = _start(rec)
    payload = {
        "tool_name": "fetch",
        "args": {"url": "https://bob:pw@example.com/x", "api_key": "k", "max_tokens": 5},
        "result": "x" * 1000 + "é",
        "note": f"use {OPENAI_KEY} please",
    }
    rec.record(run_id, "TOOL_CALL", "fetch", payload, meta={"Authorization": "Bearer abc"})
    await rec.close()
    _, events = assert_run_valid(tmp_path, run_id)
    ev = events[1]
    assert ev["payload"]["args"] == {
        "url": f"https://{REDACTED_MARKER}@example.com/x",
        "api_key": REDACTED_MARKER,
        "max_tokens": 5,
    }
    assert ev["payload"]["result"].endswith(TRUNCATED_MARKER) and len(ev["payload"]["result"].encode()) <= 200
    assert ev["payload"]["note"] == f"use {REDACTED_MARKER} please"
    assert ev["meta"] == {"Authorization": REDACTED_MARKER}
    raw = (tmp_path / "runs" / run_id / EVENTS_JSONL).read_text()
    assert "bob:pw" not in raw and OPENAI_KEY not in raw and "hunter2" not in raw


async def test_record_content_false_keeps_metadata_only(tmp_path: Path) -> None:
    rec = TraceRecorder(tmp_path, record_content=False)
    await rec.start()
    run_id = _start(rec)
    rec.record(run_id, "LLM_CALL", "gpt-4o", _llm_payload("my secret plan"))
    rec.record(
        run_id,
        "TOOL_CALL",
        "search",
        {"tool_name": "search", "args": {"q": "plan"}, "result": "found it", "status": "ok", "source": "llm"},
        duration_ms=7,
    )
    await rec.close()
    _, events = assert_run_valid(tmp_path, run_id)
    llm, tool = events[1]["payload"], events[2]["payload"]
    assert llm["prompt"] == [{"role": "user", "content": None}]
    assert llm["response"] == {
        "text": None,
        "tool_calls": [{"id": "c1", "name": "search", "arguments": None}],
    }
    assert llm["model"] == "gpt-4o" and llm["usage"]["total_tokens"] == 15 and llm["cost_usd"] == 0.001
    assert tool == {"tool_name": "search", "args": None, "result": None, "status": "ok", "source": "llm"}
    assert events[2]["duration_ms"] == 7
    raw = (tmp_path / "runs" / run_id / EVENTS_JSONL).read_text()
    assert "secret plan" not in raw and "found it" not in raw and "hi there" not in raw
    assert orjson.loads((tmp_path / "runs" / run_id / TRIPWIRE_JSON).read_bytes())["record_content"] is False


def test_strip_content_keeps_state_updates() -> None:
    payload = {"state": {"circuit": "open"}, "diff": {"circuit": ["closed", "open"]}}
    assert strip_content("STATE_UPDATE", payload) == payload


def test_strip_content_drops_a_failed_tools_output_from_its_error() -> None:
    payload = {
        "tool_name": "t",
        "status": "error",
        "error": {"error_type": "ToolError", "message": "secret output"},
    }
    assert strip_content("TOOL_CALL", payload)["error"] == {"error_type": "ToolError", "message": None}
    llm_error = {"error": {"error_type": "RateLimit", "message": "429 slow down"}}
    assert strip_content("LLM_CALL", llm_error) == llm_error


async def test_writer_flushes_promptly_without_flush(rec: TraceRecorder, tmp_path: Path) -> None:
    run_id = _start(rec)
    rec.record(run_id, "LLM_CALL", "m", _llm_payload())
    path = tmp_path / "runs" / run_id / EVENTS_JSONL
    for _ in range(30_000):  # generous: a busy machine; promptness itself is measured, not asserted
        if path.exists() and path.read_bytes().count(b"\n") == 2:
            break
        await asyncio.sleep(0.001)
    assert path.read_bytes().count(b"\n") == 2  # written by the writer on its own, no flush()


async def test_calls_a_moment_apart_share_one_writer_pass(tmp_path: Path) -> None:
    """The writer lingers after the first event (LINGER_S) so the next calls' events join its pass;
    a linger made long here shows it without timing anything, and flush() cuts it short."""
    rec = TraceRecorder(tmp_path, clock=Clock())
    await rec.start()
    try:
        writer = rec._writer
        run_id = _start(rec)
        await rec.flush()
        passes = writer.passes
        writer.linger_s = 3600.0  # only flush() can end this linger
        for i in range(5):  # five calls (fewer events than cut a linger short), the loop turning between them
            rec.record(run_id, "LLM_CALL", "m", _llm_payload(f"call {i}"))
            await asyncio.sleep(0)
        path = tmp_path / "runs" / run_id / EVENTS_JSONL
        assert path.read_bytes().count(b"\n") == 1  # RUN_START only: the pass is still lingering
        await asyncio.wait_for(rec.flush(), 30)  # generous bound: flush ends the linger at once
        assert path.read_bytes().count(b"\n") == 6
        assert writer.passes == passes + 1  # all five in one pass
    finally:
        await rec.close()


async def test_live_run_metadata_waits_its_turn_and_never_counts_ahead(tmp_path: Path) -> None:
    """Lines are written at once; run.json of a live run is rewritten at most every meta_interval_s
    (a rename each), never counts more than events.jsonl holds, and is exact after flush() and at end."""
    rec = TraceRecorder(tmp_path, meta_interval_s=3600)
    await rec.start()
    run_id = _start(rec)
    await rec.flush()
    path = tmp_path / "runs" / run_id / EVENTS_JSONL
    for _ in range(3):
        rec.record(run_id, "LLM_CALL", "m", _llm_payload())
    passes = rec.health()["writer_passes"]
    for _ in range(1000):  # the writer runs without being asked (a condition, not a clock)
        if path.read_bytes().count(b"\n") == 4:
            break
        await asyncio.sleep(0.005)
    assert path.read_bytes().count(b"\n") == 4 and rec.health()["writer_passes"] > passes
    meta, _ = _files(tmp_path, run_id)
    assert meta["counts"]["llm_calls"] == 0  # deferred: the rewrite waits its turn
    await rec.flush()
    meta, _ = _files(tmp_path, run_id)
    assert meta["counts"]["llm_calls"] == 3 and meta["status"] == "running"
    rec.end_run(run_id, status="ok", reason="done")
    await rec.close()
    meta, events = assert_run_valid(tmp_path, run_id)
    assert meta["status"] == "ok" and events[-1]["payload"]["summary"]["llm_calls"] == 3


async def test_deferred_metadata_is_written_when_due_with_no_event_to_wake_the_writer(tmp_path: Path) -> None:
    """The writer's timer keeps the earliest deferred rewrite across passes and wakes the writer for
    it: run.json catches up with the events on its own, even when none come after them."""
    rec = TraceRecorder(tmp_path, meta_interval_s=0.05, recover_interval_s=None)
    await rec.start()
    run_id = _start(rec)
    for _ in range(6):  # passes back to back, each leaving the rewrite deferred
        rec.record(run_id, "LLM_CALL", "m", _llm_payload())
        await asyncio.sleep(0.003)
    for _ in range(1000):  # no flush(): a condition, not a clock
        if _files(tmp_path, run_id)[0]["counts"]["llm_calls"] == 6:
            break
        await asyncio.sleep(0.005)
    assert _files(tmp_path, run_id)[0]["counts"]["llm_calls"] == 6
    await rec.close()


async def test_record_does_no_io_on_the_loop(tmp_path: Path) -> None:
    rec = TraceRecorder(tmp_path)  # writer not started
    run_id = _start(rec)
    rec.record(run_id, "LLM_CALL", "m", _llm_payload())
    assert not (tmp_path / "runs").exists()
    assert rec.health()["queue_depth"] == 2
    await rec.flush()  # with no writer task, flush writes inline
    assert rec.health()["queue_depth"] == 0
    assert storage.count_events(tmp_path, run_id) == 2


async def test_close_loses_nothing_after_10000_events(tmp_path: Path) -> None:
    rec = TraceRecorder(tmp_path)
    await rec.start()
    run_id = _start(rec)
    ids = [
        rec.record(run_id, "TOOL_CALL", "t", {"tool_name": "t", "args": {"i": i}, "status": "ok"})
        for i in range(10_000)
    ]
    await rec.close()  # ends the open run (shutdown) and drains
    meta, events = assert_run_valid(tmp_path, run_id)
    assert len(events) == 10_002
    assert [e["event_id"] for e in events[1:-1]] == ids
    assert [e["payload"]["args"]["i"] for e in events[1:-1]] == list(range(10_000))
    assert meta["counts"]["tool_calls"] == 10_000
    assert events[-1]["payload"]["reason"] == "shutdown" and meta["status"] == "ok"
    assert rec.health()["queue_depth"] == 0 and rec.health()["write_errors"] == 0


async def test_many_runs_interleaved(rec: TraceRecorder, tmp_path: Path) -> None:
    runs = [_start(rec, session_id=f"s{i}") for i in range(5)]
    for n in range(50):
        for rid in runs:
            rec.record(rid, "LLM_CALL", "m", _llm_payload(f"n{n}"))
        if n % 10 == 0:
            await asyncio.sleep(0)
    for rid in runs:
        rec.end_run(rid, status="ok", reason="done")
    await rec.flush()
    for rid in runs:
        meta, events = assert_run_valid(tmp_path, rid)
        assert meta["counts"]["llm_calls"] == 50
        assert [e["payload"]["prompt"][0]["content"] for e in events[1:-1]] == [f"n{n}" for n in range(50)]


async def test_start_run_with_given_id_and_bad_ids(rec: TraceRecorder) -> None:
    rid = str(uuid.uuid4())
    assert _start(rec, run_id=rid) == rid
    with pytest.raises(ValueError):
        _start(rec, run_id=rid)  # already open
    rec.end_run(rid, status="ok", reason="done")
    await rec.flush()
    with pytest.raises(ValueError):
        _start(rec, run_id=rid)  # ended: a second RUN_START would break the trace
    with pytest.raises(ValueError):
        _start(rec, run_id="../escape")
    with pytest.raises(ValueError):
        rec.record(rid, "NOT_A_TYPE", "x", {})
    with pytest.raises(ValueError):
        rec.record(rid, "RUN_END", "x", {})
    with pytest.raises(ValueError):
        rec.end_run(rid, status="running", reason="x")


async def test_rename_open_and_closed_runs(rec: TraceRecorder, tmp_path: Path) -> None:
    open_id = _start(rec)
    closed_id = _start(rec, session_id="s2")
    rec.end_run(closed_id, status="ok", reason="done")
    await rec.flush()
    meta = await rec.rename_run(open_id, " renamed ")
    assert meta is not None and meta["run_name"] == "renamed"
    rec.record(open_id, "LLM_CALL", "m", _llm_payload())  # a later rewrite keeps the new name
    await rec.flush()
    assert _files(tmp_path, open_id)[0]["run_name"] == "renamed"
    meta = await rec.rename_run(closed_id, "closed renamed")
    assert meta is not None and _files(tmp_path, closed_id)[0]["run_name"] == "closed renamed"
    assert await rec.rename_run(str(uuid.uuid4()), "x") is None
    with pytest.raises(ValueError):
        await rec.rename_run(open_id, "  ")


async def test_forget_run_drops_pending_writes(tmp_path: Path) -> None:
    rec = TraceRecorder(tmp_path)
    run_id = _start(rec)
    rec.forget_run(run_id)
    await rec.close()
    assert not (tmp_path / "runs" / run_id).exists()
    assert rec.health()["queue_depth"] == 0


# --- failures ----------------------------------------------------------------------------------------


async def test_unwritable_data_dir_never_raises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "runs").write_text("a file where the runs directory should be")
    rec = TraceRecorder(tmp_path)
    await rec.start()
    run_id = _start(rec)
    for _ in range(3):
        rec.record(run_id, "LLM_CALL", "m", _llm_payload())
    await asyncio.wait_for(rec.flush(), 5)
    health = rec.health()
    assert health["write_errors"] >= 1
    assert health["ok"] is False
    assert health["last_error"] and "Not a directory" in health["last_error"]
    # the three LLM_CALLs are dropped; RUN_START is kept (queued) so the run, once written, starts with it
    assert health["dropped_events"] == 3 and health["queue_depth"] == 1
    assert "TRACE STORE WRITE FAILED" in caplog.text
    assert rec.end_run(run_id, status="ok", reason="done") is not None
    await asyncio.wait_for(rec.close(), 5)


@pytest.mark.parametrize(("err", "kept_too"), [(28, True), (5, False)])  # ENOSPC is retried; EIO drops
async def test_failed_append_is_counted_and_the_next_line_starts_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int, kept_too: bool
) -> None:
    real_append = storage.append_lines
    calls = {"n": 0}

    def flaky_append(path: Path, lines: list[bytes], *, fsync: bool = False) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the disk fails half-way through the second batch
            with open(path, "ab") as f:
                f.write(b"".join(lines)[:17])
            raise OSError(err, os.strerror(err))
        real_append(path, lines, fsync=fsync)

    monkeypatch.setattr(storage, "append_lines", flaky_append)
    rec = TraceRecorder(tmp_path)
    run_id = _start(rec)
    await rec.flush()
    lost = rec.record(run_id, "LLM_CALL", "lost", _llm_payload())
    await rec.flush()
    assert rec.health()["write_errors"] == 1
    assert rec.health()["dropped_events"] == (0 if kept_too else 1)
    assert os.strerror(err) in (rec.health()["last_error"] or "")
    path = tmp_path / "runs" / run_id / EVENTS_JSONL
    assert path.read_bytes().count(b"\n") == 1  # the partial line was cut back, no blank line left
    kept = rec.record(run_id, "LLM_CALL", "kept", _llm_payload())
    await rec.flush()
    assert rec.health()["ok"] is True
    meta, events = assert_run_valid(tmp_path, run_id)
    assert [e["event_id"] for e in events[1:]] == ([lost, kept] if kept_too else [kept])
    assert meta["counts"]["llm_calls"] == len(events) - 1  # run.json counts what is on disk


async def test_queue_bound_drops_instead_of_growing(tmp_path: Path) -> None:
    rec = TraceRecorder(tmp_path, max_pending_events=5)
    run_id = _start(rec)
    for _ in range(10):
        rec.record(run_id, "LLM_CALL", "m", _llm_payload())
    assert rec.health()["queue_depth"] == 5 and rec.health()["dropped_events"] == 6
    await rec.close()
    assert storage.count_events(tmp_path, run_id) == 6  # 5 queued + RUN_END after the queue drained


# --- fsync policy ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "during", "at_end"), [("never", 0, 0), ("run_end", 0, 3), ("always", 3, 3)]
)
async def test_fsync_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str, during: int, at_end: int
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    rec = TraceRecorder(tmp_path, fsync=policy)  # type: ignore[arg-type]
    await rec.start()
    run_id = _start(rec)
    await rec.flush()
    synced.clear()
    rec.record(run_id, "LLM_CALL", "m", _llm_payload())
    await rec.flush()
    # events.jsonl, run.json and tripwire.json each (plus their directory for the atomic rewrites)
    assert len(synced) >= during and (during or not synced)
    synced.clear()
    rec.end_run(run_id, status="ok", reason="done")
    await rec.flush()
    assert len(synced) >= at_end and (at_end or not synced)
    await rec.close()


async def test_runs_ending_together_are_written_by_a_few_group_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33: an idle sweep ends many one-call runs at once. Their last writes go to the
    writer's thread with one syncfs per pass for all of them, up to 256 runs a pass (not the 32
    run.json rewrites a pass does on the loop): 200 runs end in one or two passes, not seven."""
    flushes: list[Any] = []
    monkeypatch.setattr(storage, "can_sync_filesystem", lambda: True)
    monkeypatch.setattr(storage, "sync_filesystem", flushes.append)
    rec = TraceRecorder(tmp_path, fsync="run_end")
    await rec.start()
    ids = [_start(rec) for _ in range(200)]
    for run_id in ids:
        rec.record(run_id, "LLM_CALL", "m", _llm_payload())
    await rec.flush()
    for run_id in ids:
        rec.end_run(run_id, status="ok", reason="idle_timeout")
    for _ in range(600):  # the writer's own passes (no flush: it would lift every budget)
        if rec.health()["held_runs"] == 0:
            break
        await asyncio.sleep(0.05)
    assert rec.health()["held_runs"] == 0
    assert 1 <= len(flushes) <= 2
    for run_id in ids:
        assert orjson.loads((tmp_path / "runs" / run_id / RUN_JSON).read_bytes())["status"] == "ok"
    await rec.close()


def test_bad_fsync_policy(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        TraceRecorder(tmp_path, fsync="sometimes")  # type: ignore[arg-type]


# --- interrupted runs --------------------------------------------------------------------------------


async def _crashed_run(tmp_path: Path, tail: bytes) -> str:
    """A run written by a recorder that is then abandoned (no end, no close), plus a raw tail."""
    clock = Clock()
    rec = TraceRecorder(tmp_path, clock=clock)
    run_id = _start(rec)
    clock.t += 2
    rec.record(run_id, "LLM_CALL", "m", _llm_payload())
    rec.add_usage(run_id, 0.25, 15)
    clock.t += 1
    rec.record(run_id, "LOOP_WARNING", "p", {"pattern": "p", "repetitions": 3})
    await rec.flush()
    _append_raw(tmp_path / "runs" / run_id / EVENTS_JSONL, tail)
    return run_id


def _append_raw(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


async def test_recover_interrupted_with_half_written_last_line(tmp_path: Path) -> None:
    run_id = await _crashed_run(tmp_path, b'{"spec_version": "0.1", "event_id": "abc", "payl')
    done = _start(TraceRecorder(tmp_path), session_id="finished")  # a finished run is left alone
    rec = TraceRecorder(tmp_path, clock=Clock(T0 + 3600))
    other = TraceRecorder(tmp_path)
    other.end_run(done, status="ok", reason="x")
    assert rec.recover_interrupted() == [run_id]
    meta, events = assert_run_valid(tmp_path, run_id)
    assert [e["event_type"] for e in events] == ["RUN_START", "LLM_CALL", "LOOP_WARNING", "RUN_END"]
    end = events[-1]
    assert end["payload"]["status"] == "error" and end["payload"]["reason"] == "interrupted"
    assert end["payload"]["summary"] == {
        "llm_calls": 1,
        "tool_calls": 0,
        "errors": 0,
        "duration_ms": 3000,
        "loop_warnings": 1,
        "cost_usd": 0.25,
        "total_tokens": 15,
    }
    assert end["ts"] == "2026-02-15T20:31:08.000Z"  # the last thing the run did, not the restart time
    assert meta["status"] == "error" and meta["duration_ms"] == 3000
    assert meta["ended_at"] == meta["last_event_ts"] == "2026-02-15T20:31:08.000Z"
    assert meta["counts"] == {"llm_calls": 1, "tool_calls": 0, "errors": 0, "loop_warnings": 1}
    tw = orjson.loads((tmp_path / "runs" / run_id / TRIPWIRE_JSON).read_bytes())
    assert tw["end_reason"] == "interrupted" and tw["agent_name"] == "agent"
    assert rec.recover_interrupted() == []  # second start: nothing left to close


async def test_recover_interrupted_with_whole_last_line_missing_newline(tmp_path: Path) -> None:
    line = orjson.dumps(
        {
            "spec_version": "0.1",
            "event_id": str(uuid.uuid4()),
            "run_id": "x",
            "parent_id": None,
            "event_type": "ERROR",
            "ts": "2026-02-15T20:31:09.000Z",
            "duration_ms": None,
            "name": "e",
            "payload": {},
            "meta": {},
        }
    )
    run_id = await _crashed_run(tmp_path, line.replace(b'"x"', b'"' + b"%s" + b'"'))
    path = tmp_path / "runs" / run_id / EVENTS_JSONL
    path.write_bytes(path.read_bytes().replace(b"%s", run_id.encode()))
    assert TraceRecorder(tmp_path).recover_interrupted() == [run_id]
    meta, events = assert_run_valid(tmp_path, run_id)
    assert [e["event_type"] for e in events][-2:] == ["ERROR", "RUN_END"]
    assert meta["counts"]["errors"] == 1 and meta["ended_at"] == "2026-02-15T20:31:09.000Z"


async def test_recover_when_run_end_was_written_but_run_json_was_not(tmp_path: Path) -> None:
    clock = Clock()
    rec = TraceRecorder(tmp_path, clock=clock)
    run_id = _start(rec)
    await rec.flush()
    run_json = (tmp_path / "runs" / run_id / RUN_JSON).read_bytes()
    clock.t += 5
    rec.end_run(run_id, status="ok", reason="idle_timeout")
    await rec.flush()
    (tmp_path / "runs" / run_id / RUN_JSON).write_bytes(run_json)  # as if the rewrite never happened
    assert TraceRecorder(tmp_path).recover_interrupted() == [run_id]
    meta, events = assert_run_valid(tmp_path, run_id)
    assert [e["event_type"] for e in events] == ["RUN_START", "RUN_END"]
    assert meta["status"] == "ok" and meta["duration_ms"] == 5000


async def test_recover_skips_runs_open_in_this_recorder(rec: TraceRecorder, tmp_path: Path) -> None:
    run_id = _start(rec)
    await rec.flush()
    assert rec.recover_interrupted() == []
    assert rec.is_open(run_id)


async def test_bad_parent_id_and_monotonic_ts_are_corrected(rec: TraceRecorder, tmp_path: Path) -> None:
    run_id = _start(rec)
    rec.record(
        run_id, "TOOL_CALL", "t", {"tool_name": "t"}, parent_id="call_abc123", ts=time.monotonic() % 1e6
    )
    await rec.flush()
    _, events = assert_run_valid(tmp_path, run_id)
    assert events[1]["parent_id"] is None
    assert events[1]["ts"] == "2026-02-15T20:31:05.000Z"  # the recorder's clock, not 1970


async def test_discard_run_then_delete_never_races_the_writer(
    rec: TraceRecorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = _start(rec)
    await rec.flush()
    entered = threading.Event()
    real_write = storage.write_json_atomic

    def slow_write(path: Path, data: dict[str, Any], *, fsync: bool = False) -> None:
        entered.set()
        time.sleep(0.05)  # a slow disk: the pass is still in flight when the viewer deletes the run
        real_write(path, data, fsync=fsync)

    monkeypatch.setattr(storage, "write_json_atomic", slow_write)
    rec.end_run(run_id, status="ok", reason="done")
    assert await asyncio.to_thread(entered.wait, 2)
    await rec.discard_run(run_id)  # returns only once the in-flight pass is done
    assert await asyncio.to_thread(storage.delete_run, tmp_path, run_id)
    await rec.flush()
    assert not (tmp_path / "runs" / run_id).exists()
    assert rec.health()["write_errors"] == 0


async def test_extra_as_guard_config_or_as_tripwire_fields(rec: TraceRecorder, tmp_path: Path) -> None:
    plain = _start(rec, extra={"budget": {"max_cost_usd": 1.0}})
    fields = _start(
        rec, session_id="s2", extra={"guard_config": {"budget": {}}, "guard_config_source": "agent"}
    )
    await rec.flush()
    assert _files(tmp_path, plain)[1]["guard_config"] == {"budget": {"max_cost_usd": 1.0}}
    tw = _files(tmp_path, fields)[1]
    assert tw["guard_config"] == {"budget": {}} and tw["guard_config_source"] == "agent"
