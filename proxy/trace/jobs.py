"""A trace writer pass's disk side: one run's writes as a `Job` (built on the loop thread from the
run's state) and `write_job` / `write_jobs`, which do them and report back in a `JobResult`. Plain
file I/O and no run state: they run on the event loop, in the writer's own thread or in its disk
process (proxy/trace/disk_process.py) alike (proxy/trace/writer.py decides which), and never raise.
They read a job's disk fields only (`data`, not `lines`): the disk process gets no more.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proxy import storage
from proxy.constants import EVENTS_JSONL, RUN_JSON, TRIPWIRE_JSON

if TYPE_CHECKING:  # (the disk process imports this module: storage and constants only)
    from proxy.trace.runs import Disk, Line


@dataclass(slots=True)
class Job:
    """What one run's writes are in one pass (built on the loop thread, written on it or in a thread)."""

    run_id: str
    dir: str  # the run's folder (`Run.dir`)
    make_dir: bool
    lines: list[Line]
    data: list[bytes]  # the lines encoded
    data_size: int  # their bytes
    after: Disk  # the run's disk state once the lines are appended
    size: int | None
    torn: bool
    run_json: dict[str, Any] | None
    tripwire: dict[str, Any] | None
    tripwire_first: bool  # run.json only once tripwire.json (its owner) is on disk
    fsync: bool


@dataclass(slots=True)
class JobResult:
    run_id: str
    dir_made: bool
    size: int | None
    torn: bool
    lines_ok: bool | None = None  # None: there were no lines to write
    tripwire_ok: bool | None = None  # None: not written in this job
    run_json_ok: bool | None = None
    errno: int | None = None  # of the lines' failure
    errors: list[str] = field(default_factory=list)

    def fail(self, what: str, e: BaseException) -> None:
        self.errors.append(f"{what}: {e!r}")


def write_job(job: Job, *, fsync: bool | None = None) -> JobResult:
    """One run's pending writes. Never raises; failures come back in the result.

    events.jsonl first (cut back to its last good size when an append fails, so no partial or blank
    line is ever left), then tripwire.json, then run.json, whose counts describe the lines just written:
    so when the lines fail, neither is written. `fsync`: instead of the job's own (a group commit
    flushes the files after, `write_jobs`).
    """
    sync = job.fsync if fsync is None else fsync
    res = JobResult(job.run_id, dir_made=not job.make_dir, size=job.size, torn=job.torn)
    if job.make_dir:
        try:
            storage.make_run_dir(job.dir)
            res.dir_made = True
        except Exception as e:  # any failure is reported, never raised
            res.fail(f"mkdir {job.dir}", e)
            if job.data:
                res.lines_ok = False
                res.errno = getattr(e, "errno", None)
            return res
    if job.data and not append_events(res, f"{job.dir}/{EVENTS_JSONL}", job.data, job.data_size, sync):
        return res
    if job.tripwire is not None:
        try:
            storage.write_json_atomic(f"{job.dir}/{TRIPWIRE_JSON}", job.tripwire, fsync=sync)
            res.tripwire_ok = True
        except Exception as e:
            res.tripwire_ok = False
            res.fail(f"write {job.dir}/{TRIPWIRE_JSON}", e)
    if job.run_json is not None and not (job.tripwire_first and not res.tripwire_ok):
        try:
            storage.write_json_atomic(f"{job.dir}/{RUN_JSON}", job.run_json, fsync=sync)
            res.run_json_ok = True
        except Exception as e:
            res.run_json_ok = False
            res.fail(f"write {job.dir}/{RUN_JSON}", e)
    return res


def append_events(res: JobResult, path: str, data: list[bytes], data_size: int, fsync: bool) -> bool:
    """A job's lines appended to events.jsonl (a str path: pathlib's join costs more than the append);
    a failed append is cut back to the last good size, so no partial or blank line is ever left.
    False (and the failure in `res`) when the lines are not on disk."""
    try:
        if res.size is None:
            res.size = storage.file_size(path)
        if res.torn:
            storage.truncate_file(path, res.size)
            res.torn = False
        storage.append_lines(path, data, fsync=fsync)
    except Exception as e:
        res.lines_ok = False
        res.errno = getattr(e, "errno", None)
        res.fail(f"append {path} ({len(data)} events)", e)
        if res.size is not None:
            try:
                storage.truncate_file(path, res.size)  # no partial line stays behind
                res.torn = False
            except Exception:
                res.torn = True  # cut before the next append
        return False
    res.lines_ok = True
    res.size += data_size
    return True


def write_jobs(jobs: list[Job], *, group_sync: bool = False) -> list[JobResult]:
    """The jobs of a pass that fsync, in the writer's thread. `group_sync` (the "run_end" policy):
    several jobs are written without an fsync each and then flushed together by one syncfs of
    their filesystem: an idle sweep ends thousands of one-call runs at once, and an fsync of each
    file and directory (five a run, ~5 ms each on a virtual disk) made their ends minutes behind.
    A failed flush is reported for every job of the group (the lines stay written, as after a
    failed fsync of a file the kernel already has)."""
    synced = sum(1 for job in jobs if job.fsync)
    if not (group_sync and synced > 1 and storage.can_sync_filesystem()):
        return [write_job(job) for job in jobs]
    results = [write_job(job, fsync=False) for job in jobs]
    try:
        storage.sync_filesystem(os.path.dirname(jobs[0].dir))
    except OSError as e:
        for job, res in zip(jobs, results, strict=True):
            if job.fsync:
                res.fail(f"syncfs {os.path.dirname(job.dir)}", e)
    return results
