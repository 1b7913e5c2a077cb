"""proxy/trace/writer.py's one-run write alone (`write_job`, what each pass does per run): the lines,
then tripwire.json, then run.json; a failed append writes neither file and leaves no partial line;
a file torn by an earlier failure is cut back to its last good size before the next append. (The
writer's passes, queue and health: tests/test_trace_writer.py.)"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy import storage
from proxy.constants import EVENTS_JSONL, RUN_JSON, TRIPWIRE_JSON
from proxy.trace.writer import Job, write_job, write_jobs


def job(run_dir: Path, lines: list[bytes], **fields: Any) -> Job:
    values: dict[str, Any] = {
        "run_id": "run-1",
        "dir": run_dir,
        "make_dir": True,
        "lines": list(lines),  # (write_job reads only whether there are any)
        "data": list(lines),
        "data_size": sum(len(line) for line in lines),
        "after": None,
        "size": None,
        "torn": False,
        "run_json": {"run_id": "run-1", "counts": {"events": len(lines)}},
        "tripwire": {"run_id": "run-1"},
        "tripwire_first": True,
        "fsync": False,
    }
    values.update(fields)
    return Job(**values)


def test_the_lines_then_tripwire_json_then_run_json(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "run-1"
    lines = [b'{"n":1}\n', b'{"n":2}\n']
    res = write_job(job(run_dir, lines))
    assert res.dir_made and res.lines_ok and res.tripwire_ok and res.run_json_ok and not res.errors
    assert (run_dir / EVENTS_JSONL).read_bytes() == b"".join(lines)
    assert res.size == sum(len(line) for line in lines)
    assert orjson.loads((run_dir / RUN_JSON).read_bytes())["counts"] == {"events": 2}
    assert orjson.loads((run_dir / TRIPWIRE_JSON).read_bytes()) == {"run_id": "run-1"}


def test_a_failed_append_writes_neither_file(tmp_path: Path) -> None:
    run_dir = tmp_path / "run-1"
    run_dir.mkdir()
    (run_dir / EVENTS_JSONL).mkdir()  # events.jsonl cannot be appended to
    res = write_job(job(run_dir, [b'{"n":1}\n'], make_dir=False))
    assert res.lines_ok is False and res.errors
    assert res.tripwire_ok is None and res.run_json_ok is None
    assert not (run_dir / RUN_JSON).exists() and not (run_dir / TRIPWIRE_JSON).exists()


def test_a_torn_file_is_cut_back_before_the_next_append(tmp_path: Path) -> None:
    run_dir = tmp_path / "run-1"
    run_dir.mkdir()
    good = b'{"n":1}\n'
    (run_dir / EVENTS_JSONL).write_bytes(good + b'{"n":2, "cut sh')  # an append that failed midway
    res = write_job(job(run_dir, [b'{"n":3}\n'], make_dir=False, size=len(good), torn=True, tripwire=None))
    assert res.lines_ok and not res.torn
    assert (run_dir / EVENTS_JSONL).read_bytes() == good + b'{"n":3}\n'


def test_run_json_waits_for_tripwire_json_when_it_owns_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run-1"
    run_dir.mkdir()
    (run_dir / TRIPWIRE_JSON).mkdir()  # tripwire.json cannot be written
    res = write_job(job(run_dir, [], make_dir=False))
    assert res.lines_ok is None and res.tripwire_ok is False and res.run_json_ok is None
    assert not (run_dir / RUN_JSON).exists()


# --- a group commit: the jobs of a pass that fsync, flushed by one syncfs (issue 33) -----------------


def _counting(monkeypatch: pytest.MonkeyPatch, *, fail: bool = False) -> dict[str, int]:
    calls = {"fsync": 0, "syncfs": 0}
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        calls["fsync"] += 1
        real_fsync(fd)

    def sync_filesystem(path: Any) -> None:
        calls["syncfs"] += 1
        if fail:
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(storage, "sync_filesystem", sync_filesystem)
    monkeypatch.setattr(storage, "can_sync_filesystem", lambda: True)
    return calls


def test_several_runs_ending_together_are_flushed_by_one_syncfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle sweep ends many one-call runs at once: five fsyncs a run (events.jsonl, run.json,
    tripwire.json and the directory twice), ~5 ms each on a virtual disk, put their ends minutes
    behind; one syncfs flushes them all."""
    calls = _counting(monkeypatch)
    jobs = [job(tmp_path / "runs" / f"run-{i}", [b'{"n":1}\n'], fsync=True) for i in range(5)]
    results = write_jobs(jobs, group_sync=True)
    assert calls == {"fsync": 0, "syncfs": 1}
    assert all(r.lines_ok and r.tripwire_ok and r.run_json_ok and not r.errors for r in results)
    assert all((j.dir / RUN_JSON).exists() and (j.dir / EVENTS_JSONL).read_bytes() for j in jobs)


def test_one_job_or_no_group_commit_fsyncs_each_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    write_jobs([job(tmp_path / "runs" / "one", [b'{"n":1}\n'], fsync=True)], group_sync=True)
    assert calls["syncfs"] == 0 and calls["fsync"] >= 3
    calls["fsync"] = 0
    jobs = [job(tmp_path / "runs" / f"run-{i}", [b'{"n":1}\n'], fsync=True) for i in range(2)]
    write_jobs(jobs)  # the "always" policy: an fsync per file, as documented
    assert calls["syncfs"] == 0 and calls["fsync"] >= 6


def test_a_failed_group_flush_is_reported_for_every_run_of_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _counting(monkeypatch, fail=True)
    jobs = [job(tmp_path / "runs" / f"run-{i}", [b'{"n":1}\n'], fsync=True) for i in range(3)]
    results = write_jobs(jobs, group_sync=True)
    assert all(r.errors and "syncfs" in r.errors[0] for r in results)
    assert all(r.lines_ok for r in results)  # written (the kernel has them), not known durable


def test_sync_filesystem_flushes_a_real_directory(tmp_path: Path) -> None:
    if not storage.can_sync_filesystem():
        pytest.skip("no syncfs here")
    storage.sync_filesystem(tmp_path)  # returns (raises on failure)
