"""The trace writer on its own (proxy/trace/writer.py): what it queues, what one pass puts on disk,
its bounds (a full queue drops events but never RUN_START / RUN_END; a live run's run.json waits its
interval) and what a failed write does (out of space: kept and retried in order; any other error:
dropped but the bookends kept, no partial line left). Driven directly, with real files in tmp_path;
the recorder's end-to-end behaviour is in tests/test_reliability_replay.py and the trace tests."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy import runlock, storage
from proxy.constants import EVENTS_JSONL, RUN_JSON, STATUS_OK, TRIPWIRE_JSON, EventType
from proxy.trace.content import envelope
from proxy.trace.runs import Run, RunRegistry
from proxy.trace.writer import TraceWriter

T0 = 1_780_000_000.0  # a wall-clock timestamp for the events (any fixed moment after 2000)


def make_writer(tmp_path: Path, **overrides: Any) -> tuple[TraceWriter, RunRegistry]:
    registry = RunRegistry()
    options: dict[str, Any] = {
        "fsync": "never",
        "clock": lambda: T0,
        "max_pending_events": 1000,
        "max_pending_bytes": 1 << 20,
        "meta_interval_s": 0.0,
    }
    options.update(overrides)
    # an owner lock not acquired: progress() does nothing (the writer's reports are not under test)
    return TraceWriter(registry, runlock.OwnerLock(tmp_path), **options), registry


def open_run(writer: TraceWriter, registry: RunRegistry, tmp_path: Path, run_id: str = "run-1") -> Run:
    run = Run(run_id=run_id, base=str(tmp_path / "runs"), run_name="r", started=T0)
    registry.add(run)
    record(writer, run, EventType.RUN_START, "run")
    return run


def record(writer: TraceWriter, run: Run, event_type: EventType, name: str, ts: float = T0) -> dict[str, Any]:
    event = envelope(run.run_id, event_type.value, name, {"n": name}, max_field_bytes=10_000, ts=ts)
    run.note_event(event_type.value, event["payload"], ts, event["ts"])
    writer.enqueue(run, event, ts)
    return event


def end_run(writer: TraceWriter, run: Run) -> None:
    run.ended = T0 + 1
    record(writer, run, EventType.RUN_END, "run_end", ts=T0 + 1)
    run.status = STATUS_OK
    writer.touch(run, run_json=True, tripwire=True)


def lines(run: Run) -> list[dict[str, Any]]:
    path = Path(run.dir) / EVENTS_JSONL
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def made(run: Run) -> bool:
    return Path(run.dir).exists()


def names(run: Run) -> list[str]:
    return [event["name"] for event in lines(run)]


def run_json(run: Run) -> dict[str, Any]:
    result: dict[str, Any] = orjson.loads((Path(run.dir) / RUN_JSON).read_bytes())
    return result


async def test_a_pass_writes_the_queued_lines_in_order_with_run_json_and_tripwire_json(
    tmp_path: Path,
) -> None:
    writer, registry = make_writer(tmp_path)
    run = open_run(writer, registry, tmp_path)
    run.fields = {"agent_name": "agent"}
    for i in range(3):
        record(writer, run, EventType.LLM_CALL, f"call-{i}")
    assert writer.pending_events == 4 and writer.pending_bytes > 0
    assert not made(run)  # queued, nothing written before a pass

    await writer.drain()

    assert names(run) == ["run", "call-0", "call-1", "call-2"]
    assert writer.pending_events == 0 and writer.pending_bytes == 0
    assert run_json(run)["counts"]["llm_calls"] == 3 and run_json(run)["status"] == "running"
    assert orjson.loads((Path(run.dir) / TRIPWIRE_JSON).read_bytes())["agent_name"] == "agent"
    assert writer.write_errors == 0 and writer.passes == 1


async def test_an_ended_run_gets_its_summary_on_disk_and_leaves_memory(tmp_path: Path) -> None:
    writer, registry = make_writer(tmp_path)
    run = open_run(writer, registry, tmp_path)
    record(writer, run, EventType.TOOL_CALL, "tool")
    end_run(writer, run)

    await writer.drain()

    events = lines(run)
    assert [e["event_type"] for e in events] == ["RUN_START", "TOOL_CALL", "RUN_END"]
    assert events[-1]["payload"]["summary"]["tool_calls"] == 1  # counted from the lines written
    assert run_json(run)["status"] == STATUS_OK and run_json(run)["ended_at"] is not None
    assert registry.get(run.run_id) is None and registry.known(run.run_id)  # retired, summary kept


async def test_a_live_runs_run_json_waits_its_interval_unless_forced(tmp_path: Path) -> None:
    writer, registry = make_writer(tmp_path, meta_interval_s=3600.0)
    run = open_run(writer, registry, tmp_path)
    await writer.drain()
    assert run_json(run)["counts"]["llm_calls"] == 0  # the first rewrite is at once

    record(writer, run, EventType.LLM_CALL, "call")
    await writer.drain()
    assert names(run) == ["run", "call"]  # the line is appended ...
    assert run_json(run)["counts"]["llm_calls"] == 0  # ... run.json waits its interval

    await writer.drain(force=True)  # (as flush() does)
    assert run_json(run)["counts"]["llm_calls"] == 1


async def test_the_runs_waiting_are_counted_once_each_and_leave_the_count_when_done(tmp_path: Path) -> None:
    """health's waiting_runs is a count kept as runs start and stop waiting (the sweep asks at every
    tick): a run waiting again for an earlier moment is still one run, a forgotten or written one
    leaves it."""
    writer, registry = make_writer(tmp_path, meta_interval_s=3600.0)
    runs = [open_run(writer, registry, tmp_path, f"run-{i}") for i in range(3)]
    await writer.drain()  # the first rewrites at once
    for run in runs:
        record(writer, run, EventType.LLM_CALL, "call")
    await writer.drain()  # lines appended, each run.json deferred: three runs wait
    assert writer.waiting_count() == 3 and all(run.wait_due is not None for run in runs)
    first = runs[0]
    assert first.wait_due is not None
    writer._wait(first, first.wait_due - 1.0)  # due sooner: a second heap entry, the same run
    assert writer.waiting_count() == 3
    registry.pop(first.run_id)
    writer.forget(first)
    assert writer.waiting_count() == 2
    await writer.drain(force=True)  # (as flush() does): the others' rewrites done
    assert writer.waiting_count() == 0 and all(run_json(run)["counts"]["llm_calls"] == 1 for run in runs[1:])


async def test_a_full_queue_drops_events_but_keeps_run_start_and_run_end(tmp_path: Path) -> None:
    writer, registry = make_writer(tmp_path, max_pending_events=2)
    run = open_run(writer, registry, tmp_path)
    record(writer, run, EventType.LLM_CALL, "kept")
    record(writer, run, EventType.LLM_CALL, "dropped-1")
    record(writer, run, EventType.ERROR, "dropped-2")
    end_run(writer, run)  # over the bound too: kept

    assert writer.dropped_events == 2 and writer.write_errors == 2
    assert writer.last_error is not None and "write queue full" in writer.last_error
    await writer.drain()

    assert names(run) == ["run", "kept", "run_end"]
    summary = lines(run)[-1]["payload"]["summary"]
    assert summary["llm_calls"] == 1 and summary["errors"] == 0  # a dropped event is not counted


async def test_out_of_space_keeps_the_lines_in_order_and_retries_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, registry = make_writer(tmp_path)
    run = open_run(writer, registry, tmp_path)
    await writer.drain()
    real_append = storage.append_lines
    full = True

    def append_or_no_space(path: str | Path, data: list[bytes], *, fsync: bool = False) -> None:
        if full:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_append(path, data, fsync=fsync)

    monkeypatch.setattr(storage, "append_lines", append_or_no_space)
    record(writer, run, EventType.LLM_CALL, "a")
    record(writer, run, EventType.LLM_CALL, "b")
    await writer.drain()

    assert names(run) == ["run"] and writer.write_errors == 1 and writer.dropped_events == 0
    assert run.failing and [line.event_type for line in run.pending] == ["LLM_CALL", "LLM_CALL"]
    record(writer, run, EventType.LLM_CALL, "c")  # queued behind the kept lines
    full = False
    await writer.drain(force=True)  # a retry (due after RETRY_S, or at once on flush)

    assert names(run) == ["run", "a", "b", "c"]
    assert not run.failing and writer.pending_events == 0


async def test_a_failed_append_leaves_no_partial_line_and_drops_only_what_is_not_a_bookend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, registry = make_writer(tmp_path)
    run = open_run(writer, registry, tmp_path)
    await writer.drain()
    good = (Path(run.dir) / EVENTS_JSONL).read_bytes()
    real_append = storage.append_lines
    broken = True

    def append_half_then_fail(path: str | Path, data: list[bytes], *, fsync: bool = False) -> None:
        if broken:
            with open(path, "ab") as f:
                f.write(b"".join(data)[:7])  # part of a line, as a short write before EIO
            raise OSError(errno.EIO, "Input/output error")
        real_append(path, data, fsync=fsync)

    monkeypatch.setattr(storage, "append_lines", append_half_then_fail)
    record(writer, run, EventType.LLM_CALL, "lost")
    end_run(writer, run)
    await writer.drain()

    assert (Path(run.dir) / EVENTS_JSONL).read_bytes() == good  # cut back to the last good size
    assert writer.dropped_events == 1 and writer.write_errors == 1
    assert [line.event_type for line in run.pending] == ["RUN_END"]  # the bookend stays queued
    broken = False
    await writer.drain(force=True)

    assert names(run) == ["run", "run_end"]
    assert lines(run)[-1]["payload"]["summary"]["llm_calls"] == 0  # counts what is on disk


async def test_a_run_dir_that_cannot_be_made_is_reported_never_raised(tmp_path: Path) -> None:
    writer, registry = make_writer(tmp_path)
    (tmp_path / "runs").write_bytes(b"a file where the runs directory should be")
    run = open_run(writer, registry, tmp_path)
    record(writer, run, EventType.LLM_CALL, "call")

    await writer.drain()

    assert writer.write_errors == 1 and writer.last_error is not None and "mkdir" in writer.last_error
    assert writer.dropped_events == 1  # the LLM_CALL; RUN_START is kept for when the dir can be made
    assert [line.event_type for line in run.pending] == ["RUN_START"] and run.failing
    (tmp_path / "runs").unlink()
    await writer.drain(force=True)

    assert names(run) == ["run"] and not run.failing


async def test_forget_releases_a_runs_queued_lines(tmp_path: Path) -> None:
    writer, registry = make_writer(tmp_path)
    run = open_run(writer, registry, tmp_path)
    record(writer, run, EventType.LLM_CALL, "call")
    registry.pop(run.run_id)

    writer.forget(run)

    assert writer.pending_events == 0 and writer.pending_bytes == 0 and not run.pending
    await writer.drain()
    assert not made(run)


async def test_the_background_task_writes_on_its_own_and_flush_waits_for_it(tmp_path: Path) -> None:
    writer, registry = make_writer(tmp_path, meta_interval_s=3600.0)
    writer.start()
    try:
        run = open_run(writer, registry, tmp_path)
        record(writer, run, EventType.LLM_CALL, "call")
        await writer.flush()  # returns once everything queued so far is on disk, run.json included

        assert names(run) == ["run", "call"] and run_json(run)["counts"]["llm_calls"] == 1
        end_run(writer, run)
        writer.begin_close()
        await writer.close()  # the last pass writes what was queued since
    finally:
        if writer.running:
            writer.begin_close()
            await writer.close()

    assert names(run) == ["run", "call", "run_end"] and run_json(run)["status"] == STATUS_OK


async def test_a_writer_with_events_waiting_and_no_pass_reports_how_long(tmp_path: Path) -> None:
    writer, registry = make_writer(tmp_path)
    assert writer.stalled_for() == 0.0  # nothing queued: not stalled, however long ago the last pass
    open_run(writer, registry, tmp_path)
    writer.progress_at -= 100.0  # as if no pass had ended for 100 s

    assert writer.stalled_for() >= 100.0
    await writer.drain()
    assert writer.stalled_for() == 0.0
