"""The end of a run, on the loop's side (issue 33): RUN_END queued, run.json and tripwire.json
rewritten with the end, and the registry's count of open runs kept without a pass over the runs."""

from __future__ import annotations

from pathlib import Path

import orjson

from proxy.constants import EVENTS_JSONL, RUN_JSON, TRIPWIRE_JSON
from proxy.recorder import TraceRecorder

T0 = 1771187465.0


def _start(rec: TraceRecorder, name: str) -> str:
    return rec.start_run(run_name=name, agent_name="agent", session_id=name)


async def test_open_runs_counts_the_runs_not_ended_while_ended_ones_are_held(tmp_path: Path) -> None:
    rec = TraceRecorder(tmp_path, clock=lambda: T0, recover_interval_s=None)
    await rec.start()
    try:
        a, b, c = _start(rec, "a"), _start(rec, "b"), _start(rec, "c")
        assert rec.health()["open_runs"] == 3
        rec.end_run(a, status="ok", reason="idle_timeout")
        assert rec.end_run(a, status="error", reason="again") is None  # idempotent
        health = rec.health()
        assert (health["open_runs"], health["held_runs"]) == (2, 3)
        rec.forget_run(b)  # an open run dropped
        rec.end_run(c, status="error", reason="guard:loop")
        await rec.flush()  # the ended runs' last writes done: they leave memory
        health = rec.health()
        assert (health["open_runs"], health["held_runs"]) == (0, 0)
        d = _start(rec, "d")
        rec.forget_run(c)  # (gone already)
        assert rec.health()["open_runs"] == 1 and rec.is_open(d)
    finally:
        await rec.close(end_open_runs=False)


async def test_an_ended_runs_files_say_how_it_ended(tmp_path: Path) -> None:
    rec = TraceRecorder(tmp_path, clock=lambda: T0 + 2.5, recover_interval_s=None)
    await rec.start()
    try:
        run_id = rec.start_run(run_name="r", agent_name="agent", session_id="s", ts=T0)
        await rec.flush()  # run.json and tripwire.json written as running
        rec.end_run(run_id, status="ok", reason="idle_timeout")
        await rec.flush()
    finally:
        await rec.close(end_open_runs=False)
    folder = tmp_path / "runs" / run_id
    run_json = orjson.loads((folder / RUN_JSON).read_bytes())
    tripwire = orjson.loads((folder / TRIPWIRE_JSON).read_bytes())
    end = orjson.loads((folder / EVENTS_JSONL).read_bytes().splitlines()[-1])
    assert (run_json["status"], run_json["duration_ms"]) == ("ok", 2500)
    assert tripwire["end_reason"] == "idle_timeout"
    assert end["event_type"] == "RUN_END" and end["name"] == "run_end"
    assert end["payload"] == {
        "status": "ok",
        "summary": {
            "llm_calls": 0,
            "tool_calls": 0,
            "errors": 0,
            "duration_ms": 2500,
            "loop_warnings": 0,
            "cost_usd": 0.0,
            "total_tokens": 0,
        },
        "reason": "idle_timeout",
    }
