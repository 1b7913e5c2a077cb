"""Crash recovery on its own (proxy/trace/recovery.py), on run directories written in tmp_path as a
process that died would leave them: a torn last line cut (a whole one ended), a run left "running"
closed as error / interrupted with a RUN_END counting its events (or as its own RUN_END says), and
only the runs of owners that are gone. The recorder's start-up recovery end to end is in
tests/test_reliability_storage.py."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy import runlock, storage
from proxy.constants import EVENTS_JSONL, REASON_INTERRUPTED, RUN_JSON, STATUS_OK, TRIPWIRE_JSON, EventType
from proxy.trace.content import encode, envelope
from proxy.trace.recovery import PARTIAL_GRACE_S, close_interrupted, recover, repair_tail
from tests.schema import assert_run_valid

T0 = 1_780_000_000.0


def event(run_id: str, event_type: EventType, ts: float, payload: dict[str, Any] | None = None) -> bytes:
    return encode(
        envelope(run_id, event_type.value, event_type.value.lower(), payload, max_field_bytes=10_000, ts=ts)
    )


def left_running(data_dir: Path, owner: str | None = None, *, ended: bool = False) -> tuple[Path, str]:
    """A run as a process that died mid-run leaves it: RUN_START, two LLM calls, a tool call."""
    run_id = str(uuid.uuid4())
    d = storage.runs_base(data_dir) / run_id
    d.mkdir(parents=True)
    lines = [
        event(run_id, EventType.RUN_START, T0),
        event(run_id, EventType.LLM_CALL, T0 + 1),
        event(run_id, EventType.LLM_CALL, T0 + 2),
        event(run_id, EventType.TOOL_CALL, T0 + 3),
    ]
    if ended:
        lines.append(event(run_id, EventType.RUN_END, T0 + 4, {"status": STATUS_OK, "reason": "done"}))
    (d / EVENTS_JSONL).write_bytes(b"".join(lines))
    storage.write_json_atomic(
        d / RUN_JSON, {"run_id": run_id, "status": "running", "started_at": storage.iso_ms(T0), "counts": {}}
    )
    tw: dict[str, Any] = {"cost_usd": 0.5, "tokens": {"total": 42}}
    if owner is not None:
        tw["owner"] = {"id": owner, "pid": 1, "host": "h"}
    storage.write_json_atomic(d / TRIPWIRE_JSON, tw)
    return d, run_id


def events(d: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (d / EVENTS_JSONL).read_bytes().splitlines()]


def meta(d: Path) -> dict[str, Any]:
    result: dict[str, Any] = orjson.loads((d / RUN_JSON).read_bytes())
    return result


def test_repair_tail_cuts_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_JSONL
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": ')
    repair_tail(path)
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'


def test_repair_tail_ends_a_whole_last_line_and_leaves_a_clean_file_alone(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_JSONL
    path.write_bytes(b'{"a": 1}\n{"b": 2}')
    repair_tail(path)
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    repair_tail(path)
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    repair_tail(tmp_path / "missing.jsonl")  # nothing to repair: no error
    assert not (tmp_path / "missing.jsonl").exists()


def test_repair_tail_never_reads_a_fifo(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_JSONL
    os.mkfifo(path)
    with pytest.raises(storage.NotRegularFile):
        repair_tail(path)  # (reading it would hold start-up until a writer came)


def test_an_interrupted_run_is_closed_as_error_with_a_run_end_counting_its_events(tmp_path: Path) -> None:
    d, run_id = left_running(tmp_path)
    with (d / EVENTS_JSONL).open("ab") as f:
        f.write(b'{"torn')  # the line being written when the process died
    tw = storage.read_json(d / TRIPWIRE_JSON) or {}

    close_interrupted(d, run_id, meta(d), tw, fsync=False, clock=lambda: T0, max_field_bytes=10_000)

    written = events(d)
    end = written[-1]
    assert [e["event_type"] for e in written] == ["RUN_START", "LLM_CALL", "LLM_CALL", "TOOL_CALL", "RUN_END"]
    assert end["payload"]["status"] == "error" and end["payload"]["reason"] == REASON_INTERRUPTED
    summary = end["payload"]["summary"]
    assert summary["llm_calls"] == 2 and summary["tool_calls"] == 1 and summary["duration_ms"] == 3000
    assert summary["cost_usd"] == 0.5 and summary["total_tokens"] == 42  # from tripwire.json
    assert (
        meta(d)["status"] == "error"
        and meta(d)["counts"]["llm_calls"] == 2
        and meta(d)["duration_ms"] == 3000
    )
    assert orjson.loads((d / TRIPWIRE_JSON).read_bytes())["end_reason"] == REASON_INTERRUPTED


def test_a_run_whose_run_end_is_on_disk_is_closed_as_it_says(tmp_path: Path) -> None:
    d, run_id = left_running(tmp_path, ended=True)
    tw = storage.read_json(d / TRIPWIRE_JSON) or {}

    close_interrupted(d, run_id, meta(d), tw, fsync=False, clock=lambda: T0, max_field_bytes=10_000)

    assert [e["event_type"] for e in events(d)].count("RUN_END") == 1  # none appended
    assert meta(d)["status"] == STATUS_OK and meta(d)["duration_ms"] == 4000
    assert orjson.loads((d / TRIPWIRE_JSON).read_bytes())["end_reason"] == "done"


def test_recover_closes_only_the_runs_of_owners_that_are_gone(tmp_path: Path) -> None:
    me = runlock.OwnerLock(tmp_path)
    living = runlock.OwnerLock(tmp_path)  # another process's, still holding its lock
    dead = runlock.OwnerLock(tmp_path)
    assert me.acquire() and living.acquire() and dead.acquire()
    dead.release()  # its process is gone (the lock file remains unlocked)
    dead.path.touch()
    try:
        mine, _ = left_running(tmp_path, me.id)
        kept, _ = left_running(tmp_path, living.id)
        orphan, orphan_id = left_running(tmp_path, dead.id)
        ownerless, ownerless_id = left_running(tmp_path)
        open_here, open_here_id = left_running(tmp_path, dead.id)

        closed = recover(
            tmp_path,
            me,
            only=None,
            skip={open_here_id},
            fsync=False,
            clock=lambda: T0,
            max_field_bytes=10_000,
        )

        assert sorted(closed) == sorted([orphan_id, ownerless_id])
        assert meta(orphan)["status"] == meta(ownerless)["status"] == "error"
        assert meta(mine)["status"] == meta(kept)["status"] == meta(open_here)["status"] == "running"
        assert not dead.path.exists() and living.path.exists()  # the gone owner is forgotten
    finally:
        me.release()
        living.release()


def killed_in_first_write(data_dir: Path, owner: str | None, *, lines: bool = True) -> tuple[Path, str]:
    """A run whose process died in the run's first write: events.jsonl (maybe), no run.json yet,
    tripwire.json only when `owner` is given (the writer puts the lines first)."""
    run_id = str(uuid.uuid4())
    d = storage.runs_base(data_dir) / run_id
    d.mkdir(parents=True)
    if lines:
        start = {"run_name": "r", "agent_name": "a1", "session_id": "s1"}
        (d / EVENTS_JSONL).write_bytes(
            event(run_id, EventType.RUN_START, T0, start) + event(run_id, EventType.LLM_CALL, T0 + 1)
        )
    if owner is not None:
        storage.write_json_atomic(d / TRIPWIRE_JSON, {"owner": {"id": owner, "pid": 1, "host": "h"}})
    return d, run_id


def recover_all(data_dir: Path, me: runlock.OwnerLock) -> list[str]:
    return recover(data_dir, me, only=None, skip=(), fsync=False, clock=lambda: T0, max_field_bytes=10_000)


def test_a_run_killed_before_its_first_run_json_is_closed_from_its_run_start(tmp_path: Path) -> None:
    """kill -9 between a new run's first lines and its run.json (tests/test_reliability_storage.py
    caught it under load): the folder was never recovered, so it had no run.json for ever."""
    me, dead = runlock.OwnerLock(tmp_path), runlock.OwnerLock(tmp_path)
    assert me.acquire() and dead.acquire()
    dead.release()
    dead.path.touch()
    try:
        owned, owned_id = killed_in_first_write(tmp_path, dead.id)
        ownerless, ownerless_id = killed_in_first_write(tmp_path, None)
        assert sorted(recover_all(tmp_path, me)) == sorted([owned_id, ownerless_id])
        for d, run_id in ((owned, owned_id), (ownerless, ownerless_id)):
            run, evs = assert_run_valid(tmp_path, run_id)
            assert run["status"] == "error" and run["counts"]["llm_calls"] == 1
            assert run["run_name"] == "r" and run["started_at"] == storage.iso_ms(T0)
            assert [e["event_type"] for e in evs] == ["RUN_START", "LLM_CALL", "RUN_END"]
            tw = orjson.loads((d / TRIPWIRE_JSON).read_bytes())
            assert tw["agent_name"] == "a1" and tw["session_id"] == "s1"
            assert tw["end_reason"] == REASON_INTERRUPTED
    finally:
        me.release()


def test_an_ownerless_first_write_is_left_alone_while_another_owner_lives_and_it_is_fresh(
    tmp_path: Path,
) -> None:
    me, living = runlock.OwnerLock(tmp_path), runlock.OwnerLock(tmp_path)
    assert me.acquire() and living.acquire()
    try:
        fresh, _ = killed_in_first_write(tmp_path, None)
        stale, stale_id = killed_in_first_write(tmp_path, None)
        old = fresh.stat().st_mtime - 2 * PARTIAL_GRACE_S
        os.utime(stale, (old, old))
        now = fresh.stat().st_mtime
        closed = recover(
            tmp_path, me, only=None, skip=(), fsync=False, clock=lambda: now, max_field_bytes=10_000
        )
        assert closed == [stale_id]
        assert not (fresh / RUN_JSON).exists()  # may be the living process's run, mid-write
    finally:
        me.release()
        living.release()


def test_a_dead_owners_run_folder_with_no_event_on_disk_is_removed(tmp_path: Path) -> None:
    me, dead = runlock.OwnerLock(tmp_path), runlock.OwnerLock(tmp_path)
    assert me.acquire() and dead.acquire()
    dead.release()
    dead.path.touch()
    try:
        owned, _ = killed_in_first_write(tmp_path, dead.id, lines=False)
        empty, _ = killed_in_first_write(tmp_path, None, lines=False)
        planted, _ = killed_in_first_write(tmp_path, None, lines=False)
        (planted / "notes.txt").write_text("not a run file")
        assert recover_all(tmp_path, me) == []
        assert not owned.exists() and not empty.exists()
        assert (planted / "notes.txt").exists()  # only a run's own files are removed
    finally:
        me.release()
