"""The trace recorder: AgentDbg events and run bookkeeping, written off the request path.

`record()` is sync and O(1) for the caller's purposes: it sanitises the payload, builds the envelope,
updates the run's counts in memory and queues one encoded line. One background writer task makes
passes: each pass takes everything pending in every run and appends each run's new lines with one
`write()`. The appends happen on the event loop itself: a page-cache write takes microseconds, where
a worker thread under load waits milliseconds for the GIL on every system call (measured: with 300
busy sessions the thread fell seconds behind). Only the fsyncs go to a worker thread. run.json and
tripwire.json are rewritten atomically at most once per run per `meta_interval_s` while the run is
live (at once when it starts and ends, and on `flush()`), so a burst of events costs one rewrite.

Durability: an event is in the OS page cache (safe from a kill -9 of the proxy) once the writer pass
that took it completes: passes run back to back while there is work, so under load a kill -9 loses
only what was answered during the last pass or two (measured in docs/trace-format.md). The writer's
progress (passes, last sequence number written) is in this process's owner lock file (proxy/runlock.py).

Disk trouble never raises into the request path and never leaves a partial or blank line: a failed
append is cut back to the last good size. Out of space (ENOSPC, EDQUOT) keeps the run's lines in
memory, in order, and retries them every `RETRY_S` (and on flush) until space is back; any other error
drops the failed lines but keeps RUN_START and RUN_END, so a run on disk always starts with RUN_START.
run.json's counts are always those of the events on disk. Failures are logged (rate-limited), counted
and reported by `health()`; traffic goes on.

fsync policy (SPEC §4.1), `fsync=`:
- "never": data reaches the OS page cache within milliseconds; it survives a proxy crash or kill,
  not a power loss or kernel panic. Fastest.
- "run_end" (default): as "never" while a run is live, and fsync of events.jsonl, run.json and
  tripwire.json when the run ends (and for every write made while closing), so finished runs are
  durable. No fsync per event, so the hot path pays nothing.
- "always": fsync every batch (group commit: one fsync per file per writer pass, not per event).
  Durable within milliseconds at the cost of disk latency under load.

Ownership (SPEC §2): a started recorder holds `<data_dir>/owners/<owner_id>.lock` and records its
owner in each run's tripwire.json; recovery closes only runs whose owner is gone (proxy/runlock.py).
"""

from __future__ import annotations

import asyncio
import errno
import heapq
import json
import logging
import os
import platform
import re
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, Literal, NamedTuple

import orjson

from proxy import runlock, storage
from proxy.constants import (
    COUNT_FOR_EVENT,
    DEFAULT_MAX_FIELD_BYTES,
    EVENTS_JSONL,
    REASON_INTERRUPTED,
    REASON_SHUTDOWN,
    RUN_JSON,
    SPEC_VERSION,
    STATUS_ERROR,
    STATUS_OK,
    STATUS_RUNNING,
    TRIPWIRE_JSON,
    EventType,
    default_counts,
)
from proxy.redact import redact_argv, sanitize

logger = logging.getLogger(__name__)

FsyncPolicy = Literal["never", "run_end", "always"]
_FSYNC_POLICIES = ("never", "run_end", "always")
_EVENT_TYPES = frozenset(t.value for t in EventType)

# With record_content=False: these payload fields are dropped (set to null) ...
CONTENT_FIELDS = frozenset({"args", "arguments", "result", "text", "content", "input", "output"})
# ... and these are kept only as structure: inside them, strings survive only under STRUCTURE_KEYS,
# so a prompt keeps its roles and message count, a response its tool names, and no text.
STRIPPED_FIELDS = frozenset({"prompt", "response", "messages"})
STRUCTURE_KEYS = frozenset(
    {"role", "name", "id", "type", "tool_call_id", "call_id", "model", "finish_reason"}
)

_ENDED_MEMORY = 10_000  # summaries of ended runs kept for summary() / idempotent end_run
_LOG_EVERY_S = 10.0  # write-error log rate limit
_EPOCH_2000 = 946684800.0  # event times before this are not wall-clock times

META_INTERVAL_S = 0.5  # a live run's run.json / tripwire.json are rewritten at most this often ...
META_REWRITES_PER_S = 100.0  # ... and, with many live runs, at most this many runs' per second in all
RETRY_S = 1.0  # a run whose writes failed is retried this often (and at every flush)
RECOVER_INTERVAL_S = 5.0  # how often a started recorder looks for owners gone from the data dir
_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})  # space comes back: keep the lines, retry
_YIELD_EVERY = 512  # runs written per slice of a pass before other tasks get the loop
_META_PER_PASS = 32  # run.json / tripwire.json rewrites per pass at most (the rest wait for the next)
_END_SIZE = 600  # bytes reserved in the queue for a RUN_END line encoded when written


def _strip(obj: Any) -> Any:
    """Structure of a prompt/response with its text removed (see STRUCTURE_KEYS)."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if isinstance(v, str):
                out[k] = v if k in STRUCTURE_KEYS else None
            elif k in CONTENT_FIELDS:
                out[k] = None
            else:
                out[k] = _strip(v)
        return out
    if isinstance(obj, list | tuple):
        return [_strip(v) for v in obj]
    return None if isinstance(obj, str) else obj


def strip_content(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The payload with content removed, for record_content=False: metadata only.

    Kept: model, usage, cost, status, errors, tool names, timings, loop patterns, guard fields and
    STATE_UPDATE state (guard state, not conversation). Dropped: prompt and response text, tool args
    and results, and a TOOL_CALL error's message and details (a failed tool's output lands there).
    """
    out: dict[str, Any] = {}
    for k, v in payload.items():
        if k in STRIPPED_FIELDS:
            out[k] = _strip(v)
        elif k in CONTENT_FIELDS:
            out[k] = None
        elif k == "error" and event_type == EventType.TOOL_CALL and isinstance(v, dict):
            out[k] = {ek: (None if ek in ("message", "details") else ev) for ek, ev in v.items()}
        elif event_type in GUARD_EVENTS and k in ("pattern", "message") and isinstance(v, str):
            # loop patterns and guard messages quote tool arguments and errors: keep tool names only
            out[k] = tool_names_only(v)
        elif isinstance(v, dict):
            out[k] = strip_content(event_type, v)  # e.g. a refused call's summary carries its args
        else:
            out[k] = v
    return out


GUARD_EVENTS = frozenset({EventType.LOOP_WARNING, EventType.ERROR})
_CALL_SIG = re.compile(r"([A-Za-z0-9_.\-/]+)\(")


def tool_names_only(text: str) -> str:
    """`search({"q": "secret"}) -> fetch({...})` becomes `search -> fetch`; other text is dropped."""
    names = _CALL_SIG.findall(text)
    if names:
        return " -> ".join(dict.fromkeys(names))
    head = text.split(":", 1)[0].strip()  # "tool: error text" -> "tool"
    return head if head and " " not in head else "(content not recorded)"


class _Line(NamedTuple):
    """One queued event: its encoded line (None for RUN_END, encoded when written) and what it counts."""

    data: bytes | None
    event_type: str
    key: str | None  # run.json counts key, if the event counts
    ts: float
    ts_iso: str
    size: int


@dataclass
class _Disk:
    """What a run's files hold: run.json is written from this, never from what is only queued."""

    counts: dict[str, int] = field(default_factory=default_counts)
    last_ts: float = 0.0
    last_event_ts: str | None = None
    started: bool = False  # RUN_START is in events.jsonl
    ended: bool = False  # RUN_END is in events.jsonl
    size: int | None = None  # events.jsonl's size after the last good append (None: not known yet)

    def add(self, line: _Line) -> None:
        if line.key:
            self.counts[line.key] += 1
        if line.ts >= self.last_ts or self.last_event_ts is None:
            self.last_ts, self.last_event_ts = line.ts, line.ts_iso
        if line.event_type == EventType.RUN_START:
            self.started = True
        elif line.event_type == EventType.RUN_END:
            self.ended = True


@dataclass
class _Run:
    """One open run, in memory. Only the event-loop thread touches it."""

    run_id: str
    dir: Path
    run_name: str | None
    started: float
    counts: dict[str, int] = field(default_factory=default_counts)  # every event accepted
    last_event_ts: str | None = None
    last_ts: float = 0.0
    status: str = STATUS_RUNNING
    ended: float | None = None
    cost_usd: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    tags: set[str] = field(default_factory=set)
    fields: dict[str, Any] = field(default_factory=dict)  # tripwire.json fields set by the caller
    pending: list[_Line] = field(default_factory=list)  # queued, not yet on disk, in order
    end_event: dict[str, Any] | None = None  # RUN_END, encoded when written (summary = what is on disk)
    disk: _Disk = field(default_factory=_Disk)
    run_json_dirty: bool = True
    tripwire_dirty: bool = True
    dir_made: bool = False
    torn: bool = False  # a failed append may have left bytes past disk.size: cut them before the next
    tripwire_written: bool = False
    run_json_written: bool = False
    meta_due: float = 0.0  # monotonic time before which a live run's metadata rewrite waits
    failing: bool = False  # its last write failed: retried at retry_at, or on flush
    retry_at: float = 0.0
    wait_due: float | None = None  # its entry in the writer's waiting heap


@dataclass
class _Job:
    """What one run's writes are in one pass (built on the loop thread, written on it or in a thread)."""

    run_id: str
    dir: Path
    make_dir: bool
    lines: list[_Line]
    data: list[bytes]  # the lines encoded
    after: _Disk  # the run's disk state once the lines are appended
    size: int | None
    torn: bool
    run_json: dict[str, Any] | None
    tripwire: dict[str, Any] | None
    tripwire_first: bool  # run.json only once tripwire.json (its owner) is on disk
    fsync: bool


@dataclass
class _JobResult:
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


def _write_job(job: _Job) -> _JobResult:
    """One run's pending writes. Never raises; failures come back in the result.

    events.jsonl first (cut back to its last good size when an append fails, so no partial or blank
    line is ever left), then tripwire.json, then run.json, whose counts describe the lines just written:
    so when the lines fail, neither is written.
    """
    res = _JobResult(job.run_id, dir_made=not job.make_dir, size=job.size, torn=job.torn)
    if job.make_dir:
        try:
            job.dir.mkdir(parents=True, exist_ok=True)
            res.dir_made = True
        except Exception as e:  # any failure is reported, never raised
            res.fail(f"mkdir {job.dir}", e)
            if job.lines:
                res.lines_ok = False
                res.errno = getattr(e, "errno", None)
            return res
    if job.lines:
        path = job.dir / EVENTS_JSONL
        try:
            if res.size is None:
                res.size = storage.file_size(path)
            if res.torn:
                storage.truncate_file(path, res.size)
                res.torn = False
            storage.append_lines(path, job.data, fsync=job.fsync)
        except Exception as e:
            res.lines_ok = False
            res.errno = getattr(e, "errno", None)
            res.fail(f"append {path} ({len(job.lines)} events)", e)
            if res.size is not None:
                try:
                    storage.truncate_file(path, res.size)  # no partial line stays behind
                    res.torn = False
                except Exception:
                    res.torn = True  # cut before the next append
            return res
        res.lines_ok = True
        res.size += sum(len(d) for d in job.data)
    if job.tripwire is not None:
        try:
            storage.write_json_atomic(job.dir / TRIPWIRE_JSON, job.tripwire, fsync=job.fsync)
            res.tripwire_ok = True
        except Exception as e:
            res.tripwire_ok = False
            res.fail(f"write {job.dir / TRIPWIRE_JSON}", e)
    if job.run_json is not None and not (job.tripwire_first and not res.tripwire_ok):
        try:
            storage.write_json_atomic(job.dir / RUN_JSON, job.run_json, fsync=job.fsync)
            res.run_json_ok = True
        except Exception as e:
            res.run_json_ok = False
            res.fail(f"write {job.dir / RUN_JSON}", e)
    return res


def _write_jobs(jobs: list[_Job]) -> list[_JobResult]:
    return [_write_job(job) for job in jobs]


def _encode(event: dict[str, Any]) -> bytes:
    try:
        return storage.encode_line(event)
    except (TypeError, orjson.JSONEncodeError):
        # sanitize() leaves only JSON types, but an int beyond 64 bits still defeats orjson
        return json.dumps(event, ensure_ascii=False, default=str).encode() + b"\n"


class TraceRecorder:
    """Writes AgentDbg runs under `<data_dir>/runs/`; see the module docstring for the write path."""

    def __init__(
        self,
        data_dir: Path,
        *,
        max_field_bytes: int = DEFAULT_MAX_FIELD_BYTES,
        record_content: bool = True,
        fsync: FsyncPolicy = "run_end",
        clock: Callable[[], float] = time.time,
        max_pending_events: int = 200_000,
        max_pending_bytes: int = 64 * 2**20,
        meta_interval_s: float = META_INTERVAL_S,
        recover_interval_s: float | None = RECOVER_INTERVAL_S,
    ) -> None:
        if fsync not in _FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {_FSYNC_POLICIES}, not {fsync!r}")
        self.data_dir = Path(data_dir).expanduser()
        self.max_field_bytes = max_field_bytes
        self.record_content = record_content
        self.fsync = fsync
        self.clock = clock
        self.max_pending_events = max_pending_events
        self.max_pending_bytes = max_pending_bytes
        self.meta_interval_s = meta_interval_s
        self.recover_interval_s = recover_interval_s
        self.owner = runlock.OwnerLock(self.data_dir)
        self._runs: dict[str, _Run] = {}
        self._ended: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._dirty: dict[str, None] = {}  # run ids with writes to do now, in first-dirtied order
        self._waiting: list[tuple[float, str]] = []  # (when, run id): deferred metadata, retries
        self._failing: set[str] = set()  # run ids whose last write failed
        self._pending_events = 0
        self._pending_bytes = 0
        self._seq = 0  # bumped by every change queued
        self._done_seq = 0  # every event queued up to this one is written (or failed and counted)
        self._synced_seq = 0  # ... and so is every run.json / tripwire.json change (flush waits on this)
        self._force = False  # the next pass writes deferred metadata and retries failing runs now
        self._passes = 0
        self._wake = asyncio.Event()
        self._progress = asyncio.Condition()
        self._lock = asyncio.Lock()  # one writer pass at a time keeps lines in order
        self._task: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closing = False
        self._closed = False
        self.write_errors = 0
        self.dropped_events = 0
        self.last_error: str | None = None
        self.last_error_ts: float | None = None
        self._last_logged = float("-inf")
        self._unlogged = 0

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Take the owner lock and start the background writer task (idempotent)."""
        self.owner.acquire()
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._closing = self._closed = False
            self._task = loop.create_task(self._writer(), name="tripwire-trace-writer")
        if self.recover_interval_s and (self._watch is None or self._watch.done()):
            self._watch = loop.create_task(self._watch_owners(), name="tripwire-owner-watch")

    async def close(self, *, end_open_runs: bool = True) -> None:
        """Write everything queued and stop the writer. Nothing recorded before close() is lost.

        Runs still open are ended first (status "ok", reason "shutdown") unless `end_open_runs=False`,
        in which case they stay "running" on disk and the next start closes them as interrupted.
        Writes still failing after a last attempt are dropped (counted). The owner lock is released.
        """
        if end_open_runs:
            self.end_open_runs(status=STATUS_OK, reason=REASON_SHUTDOWN)
        self._closing = True
        self._wake.set()
        for attr in ("_watch", "_task"):
            task = getattr(self, attr)
            if task is None:
                continue
            if attr == "_watch":
                task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:
                logger.exception("trace %s task failed", attr.strip("_"))
            setattr(self, attr, None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # anything queued after the writer's last pass, or with no writer at all; a last try for failures
        await self._drain(force=True, final=True)
        self.owner.release()
        self._closed = True

    async def flush(self) -> None:
        """Return once everything queued so far is on disk, run.json and tripwire.json included
        (or its write has failed and been counted)."""
        target = self._seq
        if self._synced_seq >= target:
            return
        if self._task is None or self._task.done():
            while self._synced_seq < target:
                await self._drain(force=True)
            return
        self._force = True
        self._wake.set()
        async with self._progress:
            await self._progress.wait_for(lambda: self._synced_seq >= target)

    def start_run(
        self,
        *,
        run_id: str | None = None,
        run_name: str,
        agent_name: str,
        session_id: str,
        argv: Iterable[str] | None = None,
        extra: dict[str, Any] | None = None,
        ts: float | None = None,
    ) -> str:
        """Open a run: run.json (status running), tripwire.json and RUN_START are queued; returns the id.

        `extra` is the guard configuration in force, kept as tripwire.json's guard_config; or, when it
        has a `guard_config` key, tripwire.json fields to set (e.g. guard_config + guard_config_source).
        ValueError for a malformed run_id or one this recorder has already opened (ended runs are
        remembered for a while): a second RUN_START would make the trace invalid.
        """
        if run_id is None:
            run_id = str(uuid.uuid4())
        if not storage.is_valid_run_id(run_id):
            raise ValueError("invalid run_id")
        path = storage.runs_base(self.data_dir) / run_id  # no resolve(): no disk access on the loop
        if run_id in self._runs or run_id in self._ended:
            raise ValueError(f"run {run_id} already exists")
        now = self._ts(ts)
        run = _Run(run_id=run_id, dir=path, run_name=run_name, started=now)
        run.fields = {
            "agent_name": agent_name,
            "session_id": session_id,
            "end_reason": None,
            "guard_config": {},
            "record_content": self.record_content,
        }
        clean_extra = sanitize(extra or {}, self.max_field_bytes)
        if "guard_config" in clean_extra:
            run.fields.update(clean_extra)  # tripwire.json fields, guard_config among them
        else:
            run.fields["guard_config"] = clean_extra
        if self.owner.held:
            run.fields["owner"] = self.owner.info()  # recovery elsewhere leaves the run alone while we live
        self._runs[run_id] = run
        payload = {
            "run_name": run_name,
            "python_version": platform.python_version(),
            "platform": _platform(),
            "cwd": os.getcwd(),
            "argv": redact_argv(sys.argv if argv is None else argv),
            "agent_name": agent_name,
            "session_id": session_id,
        }
        self._append(run, EventType.RUN_START, run_name or "run", payload, ts=now)
        return run_id

    def record(
        self,
        run_id: str,
        event_type: str,
        name: str,
        payload: dict[str, Any] | None,
        *,
        duration_ms: float | None = None,
        parent_id: str | None = None,
        meta: dict[str, Any] | None = None,
        ts: float | None = None,
    ) -> str:
        """Queue one event; returns its event_id. Payload and meta are redacted and truncated.

        An event for a run that is not open (never started, already ended) is dropped with a warning,
        so a late stream finishing after its session ended cannot write past RUN_END.
        ValueError for an event type outside AgentDbg's set, or RUN_START / RUN_END (use start_run / end_run).
        """
        if event_type not in _EVENT_TYPES or event_type in (EventType.RUN_START, EventType.RUN_END):
            raise ValueError(f"not a recordable event type: {event_type!r}")
        run = self._runs.get(run_id)
        if run is None or run.status != STATUS_RUNNING:
            logger.warning("dropping %s for run %s: run is not open", event_type, run_id)
            return str(uuid.uuid4())
        if payload and not self.record_content:
            payload = strip_content(event_type, payload)
            if event_type == EventType.LOOP_WARNING:
                name = tool_names_only(name)
        return self._append(
            run, event_type, name, payload, duration_ms=duration_ms, parent_id=parent_id, meta=meta, ts=ts
        )

    def add_usage(self, run_id: str, cost_usd: float, tokens: int) -> None:
        """Add a call's cost and total tokens to the run (tripwire.json cost_usd, tokens.total).

        tokens.prompt / tokens.completion are summed from each LLM_CALL's payload usage by record().
        """
        run = self._runs.get(run_id)
        if run is None:
            return
        run.cost_usd += float(cost_usd or 0.0)
        run.total_tokens += int(tokens or 0)
        self._touch(run, tripwire=True)

    def add_tags(self, run_id: str, *tags: str) -> None:
        """Add session health tags (SPEC §5.6); tripwire.json keeps them as a sorted list."""
        run = self._runs.get(run_id)
        if run is None or set(tags) <= run.tags:
            return
        run.tags.update(tags)
        self._touch(run, tripwire=True)

    def update_tripwire(self, run_id: str, **fields: Any) -> None:
        """Set Tripwire's own run fields in tripwire.json (cost, tokens and tags have their own calls)."""
        run = self._runs.get(run_id)
        if run is None:
            return
        run.fields.update(sanitize(fields, self.max_field_bytes))
        self._touch(run, tripwire=True)

    async def rename_run(self, run_id: str, name: str) -> dict[str, Any] | None:
        """Rename a run, open or not; returns the new run.json, None when there is no such run.

        An open run is renamed in memory (its run.json is rewritten from memory, so an on-disk edit
        would be undone). ValueError on a malformed id or an empty name.
        """
        new_name = (name or "").strip()
        if not new_name:
            raise ValueError("run_name must be non-empty")
        storage.run_dir(self.data_dir, run_id)
        run = self._runs.get(run_id)
        if run is None:
            return await asyncio.to_thread(storage.rename_run, self.data_dir, run_id, new_name)
        run.run_name = new_name
        self._touch(run, run_json=True)
        await self.flush()
        return self._run_json(run)

    def forget_run(self, run_id: str) -> None:
        """Drop a run's state and pending writes without writing them (its directory is being deleted).

        A writer pass already in flight may still write to it: await `discard_run` before deleting.
        """
        run = self._runs.pop(run_id, None)
        if run is not None:
            self._unqueue(run.pending)
            run.pending = []
            self._dirty.pop(run_id, None)
            self._failing.discard(run_id)

    async def discard_run(self, run_id: str) -> None:
        """forget_run, then wait out any writer pass in flight: afterwards nothing writes to the run's
        directory, so deleting it cannot race a write (rmtree failing on a file created meanwhile).
        """
        self.forget_run(run_id)
        async with self._lock:
            pass

    def end_run(self, run_id: str, *, status: str, reason: str, ts: float | None = None) -> str | None:
        """Close a run: RUN_END with its summary; run.json gets status, ended_at, duration_ms.

        The summary's counts are those of the run's events on disk when RUN_END is written (the same
        as run.json's), so they differ from the calls seen only when some events could not be written.
        Idempotent: ending a run that is not open does nothing and returns None.
        """
        if status not in (STATUS_OK, STATUS_ERROR):
            raise ValueError(f"status must be 'ok' or 'error', not {status!r}")
        run = self._runs.get(run_id)
        if run is None or run.status != STATUS_RUNNING:
            return None
        now = max(self._ts(ts), run.started)
        run.ended = now
        run.fields["end_reason"] = reason
        payload = {"status": status, "summary": self._summary(run, now), "reason": reason}
        event_id = self._append(run, EventType.RUN_END, "run_end", payload, ts=now)
        run.status = status  # after _append: the event itself is accepted while the run is open
        self._touch(run, run_json=True, tripwire=True)
        return event_id

    def end_open_runs(self, *, status: str, reason: str) -> list[str]:
        """End every open run (shutdown); returns their ids."""
        ids = [rid for rid, run in self._runs.items() if run.status == STATUS_RUNNING]
        for rid in ids:
            self.end_run(rid, status=status, reason=reason)
        return ids

    def is_open(self, run_id: str) -> bool:
        run = self._runs.get(run_id)
        return run is not None and run.status == STATUS_RUNNING

    def summary(self, run_id: str) -> dict[str, Any]:
        """RUN_END's summary shape, live for an open run; {} for a run this recorder does not know."""
        run = self._runs.get(run_id)
        if run is not None:
            return self._summary(run, run.ended if run.ended is not None else self.clock())
        return dict(self._ended.get(run_id, {}))

    def health(self) -> dict[str, Any]:
        """Trace-store health for /healthz and metrics: queue depth, write errors, writer progress."""
        return {
            "ok": not self._failing,
            "queue_depth": self._pending_events,
            "queue_bytes": self._pending_bytes,
            "pending_runs": len(self._dirty),
            "failing_runs": len(self._failing),
            "open_runs": sum(1 for r in self._runs.values() if r.status == STATUS_RUNNING),
            "write_errors": self.write_errors,
            "dropped_events": self.dropped_events,
            "last_error": self.last_error,
            "last_error_at": None if self.last_error_ts is None else storage.iso_ms(self.last_error_ts),
            "writer_running": self._task is not None and not self._task.done(),
            "writer_passes": self._passes,
            "written_seq": self._done_seq,
            "fsync": self.fsync,
            "owner": self.owner.id if self.owner.held else None,
        }

    # --- recovery: runs left "running" by a process that is gone -------------------------------

    def recover_interrupted(self) -> list[str]:
        """At start-up: close runs left "running" by processes that are gone, as error / "interrupted".

        Sync (call before serving). Takes this recorder's owner lock first. A run whose tripwire.json
        names an owner is closed only when that owner's lock is free (its process is gone); a run with
        no owner (written before owners existed, or by a recorder that never started) is closed too.
        Runs of live owners, another serve or intercept on the same data dir, are left alone.
        A torn last line in events.jsonl is cut off first. The run is taken to have ended at its last
        readable event. Returns the ids closed.
        """
        self.owner.acquire()
        return self._recover(None)

    def recover_dead_owners(self) -> list[str]:
        """Close the runs of owners whose lock file is still there but free (they died while running).

        Cheap when no one died (one directory listing and a lock try per owner): a started recorder
        calls it every `recover_interval_s`, in a worker thread, so a neighbour killed with -9 does not
        leave its runs "running" until the next start.
        """
        dead = runlock.dead_owners(self.data_dir, exclude=self.owner.id)
        return self._recover(set(dead)) if dead else []

    def _recover(self, only: set[str] | None) -> list[str]:
        closed: list[str] = []
        base = storage.runs_base(self.data_dir)
        with runlock.recovery_lock(self.data_dir):
            try:
                entries = sorted(base.iterdir())
            except OSError:
                entries = []
            alive: dict[str, bool] = dict.fromkeys(only or (), False)
            for entry in entries:
                rid = entry.name
                if not storage.is_valid_run_id(rid) or rid in self._runs or not entry.is_dir():
                    continue
                try:
                    meta = storage.read_json(entry / RUN_JSON)
                    if meta is None or meta.get("status") != STATUS_RUNNING:
                        continue
                    tw = storage.read_json(entry / TRIPWIRE_JSON) or {}
                    owner = runlock.owner_of(tw)
                    if only is not None and owner not in only:
                        continue
                    if owner is not None:
                        if owner == self.owner.id:
                            continue
                        if owner not in alive:
                            alive[owner] = runlock.owner_alive(self.data_dir, owner)
                        if alive[owner]:
                            continue
                    self._close_interrupted(entry, rid, meta, tw)
                    closed.append(rid)
                except Exception:
                    logger.exception("could not recover interrupted run %s", rid)
            gone = {o for o, live in alive.items() if not live}
            if only is None:
                gone.update(runlock.dead_owners(self.data_dir, exclude=self.owner.id))
            for owner in gone:
                runlock.forget_owner(self.data_dir, owner)
        return closed

    def _close_interrupted(self, d: Path, run_id: str, meta: dict[str, Any], tw: dict[str, Any]) -> None:
        fsync = self.fsync != "never"
        events_path = d / EVENTS_JSONL
        _repair_tail(events_path)
        events = storage.parse_events(events_path, run_id)
        counts = default_counts()
        for ev in events:
            key = COUNT_FOR_EVENT.get(ev.get("event_type", ""))
            if key:
                counts[key] += 1
        started = storage.parse_iso(meta.get("started_at")) or self.clock()
        times = [t for t in (storage.parse_iso(ev.get("ts")) for ev in events) if t is not None]
        last = max([started, *times])
        run_end = next((ev for ev in reversed(events) if ev.get("event_type") == EventType.RUN_END), None)
        if run_end is not None:
            # Died between appending RUN_END and rewriting run.json: the run did end, as RUN_END says.
            status = run_end.get("payload", {}).get("status", STATUS_ERROR)
            status = status if status in (STATUS_OK, STATUS_ERROR) else STATUS_ERROR
            reason = run_end.get("payload", {}).get("reason") or tw.get("end_reason")
        else:
            status, reason = STATUS_ERROR, REASON_INTERRUPTED
            tokens = tw.get("tokens")
            if not isinstance(tokens, dict):
                tokens = {}
            summary = {
                **counts,
                "duration_ms": max(0, int((last - started) * 1000)),
                "cost_usd": tw.get("cost_usd", 0.0),
                "total_tokens": tokens.get("total", 0),
            }
            event = self._envelope(
                run_id,
                EventType.RUN_END,
                "run_end",
                {"status": status, "summary": _summary_order(summary), "reason": reason},
                ts=last,
            )
            storage.append_lines(events_path, [_encode(event)], fsync=fsync)
        meta.update(
            {
                "status": status,
                "ended_at": storage.iso_ms(last),
                "duration_ms": max(0, int((last - started) * 1000)),
                "counts": counts,
                "last_event_ts": storage.iso_ms(last),
            }
        )
        storage.write_json_atomic(d / RUN_JSON, meta, fsync=fsync)
        tw["end_reason"] = reason
        storage.write_json_atomic(d / TRIPWIRE_JSON, tw, fsync=fsync)
        logger.warning(
            "run %s was left running by a process that is gone: closed as %s (%s)", run_id, status, reason
        )

    async def _watch_owners(self) -> None:
        assert self.recover_interval_s
        while True:
            await asyncio.sleep(self.recover_interval_s)
            try:
                closed = await asyncio.to_thread(self.recover_dead_owners)
            except Exception:
                logger.exception("looking for runs of owners that are gone failed")
                continue
            if closed:
                logger.warning("closed %d run(s) of a Tripwire process that died as interrupted", len(closed))

    # --- internals ---------------------------------------------------------------------------

    def _envelope(
        self,
        run_id: str,
        event_type: str,
        name: str,
        payload: dict[str, Any] | None,
        *,
        duration_ms: float | None = None,
        parent_id: str | None = None,
        meta: dict[str, Any] | None = None,
        ts: float,
    ) -> dict[str, Any]:
        clean = sanitize(payload, self.max_field_bytes) if payload else {}
        clean_meta = sanitize(meta, self.max_field_bytes) if meta else {}
        return {
            "spec_version": SPEC_VERSION,
            "event_id": str(uuid.uuid4()),
            "run_id": run_id,
            "parent_id": parent_id,
            "event_type": str(event_type),
            "ts": storage.iso_ms(ts),
            "duration_ms": None if duration_ms is None else max(0, int(duration_ms)),
            "name": sanitize(str(name), self.max_field_bytes),
            "payload": clean if isinstance(clean, dict) else {"value": clean},
            "meta": clean_meta if isinstance(clean_meta, dict) else {"value": clean_meta},
        }

    def _append(
        self,
        run: _Run,
        event_type: str,
        name: str,
        payload: dict[str, Any] | None,
        *,
        duration_ms: float | None = None,
        parent_id: str | None = None,
        meta: dict[str, Any] | None = None,
        ts: float | None = None,
    ) -> str:
        now = self._ts(ts)
        if parent_id is not None and not _is_uuid(parent_id):
            logger.warning("parent_id %r is not a UUID: recorded as null", parent_id)
            parent_id = None
        event = self._envelope(
            run.run_id,
            event_type,
            name,
            payload,
            duration_ms=duration_ms,
            parent_id=parent_id,
            meta=meta,
            ts=now,
        )
        if event_type == EventType.LLM_CALL and isinstance(payload, dict):
            usage = payload.get("usage")
            if isinstance(usage, dict):
                run.prompt_tokens += _int(usage.get("prompt_tokens"))
                run.completion_tokens += _int(usage.get("completion_tokens"))
                run.tripwire_dirty = True
        if now >= run.last_ts or run.last_event_ts is None:
            run.last_ts = now
            run.last_event_ts = event["ts"]
        bookend = event_type in (EventType.RUN_START, EventType.RUN_END)
        full = (
            self._pending_events >= self.max_pending_events or self._pending_bytes >= self.max_pending_bytes
        )
        if full and not bookend:
            # The writer cannot keep up (stuck or full disk): drop rather than grow without bound or
            # block. RUN_START / RUN_END are always kept, so run.json and the events agree on how a run
            # ended; a dropped event is not counted, so run.json's counts stay those of the events.
            self.dropped_events += 1
            self._note_error(
                f"write queue full ({self._pending_events} events, {self._pending_bytes} bytes): event dropped"
            )
        else:
            key = COUNT_FOR_EVENT.get(event_type)
            if key:
                run.counts[key] += 1
            if event_type == EventType.RUN_END:
                run.end_event = event  # encoded when written: its summary counts the events on disk
                line = _Line(None, event_type, key, now, event["ts"], _END_SIZE)
            else:
                data = _encode(event)
                line = _Line(data, event_type, key, now, event["ts"], len(data))
            run.pending.append(line)
            self._pending_events += 1
            self._pending_bytes += line.size
        self._touch(run, run_json=True)
        return event["event_id"]

    def _unqueue(self, lines: list[_Line]) -> None:
        self._pending_events -= len(lines)
        self._pending_bytes -= sum(line.size for line in lines)

    def _ts(self, ts: float | None) -> float:
        """The event time: the caller's wall-clock epoch seconds, else the clock."""
        if ts is None:
            return self.clock()
        if ts < _EPOCH_2000:
            # A monotonic reading passed by mistake would date the event 1970: use the clock instead.
            logger.warning("ts %r is not a wall-clock epoch time: using the clock", ts)
            return self.clock()
        return float(ts)

    def _touch(self, run: _Run, *, run_json: bool = False, tripwire: bool = False) -> None:
        run.run_json_dirty |= run_json
        run.tripwire_dirty |= tripwire
        self._dirty[run.run_id] = None
        self._seq += 1
        self._wake.set()

    def _summary(self, run: _Run, now: float) -> dict[str, Any]:
        return _summary_order(
            {
                **run.counts,
                "duration_ms": max(0, int((now - run.started) * 1000)),
                "cost_usd": round(run.cost_usd, 10),
                "total_tokens": run.total_tokens,
            }
        )

    def _run_json(self, run: _Run, disk: _Disk | None = None) -> dict[str, Any]:
        """run.json as the files are (or will be once the job's lines are appended): counts, last
        event and end from the events on disk, never from events only queued."""
        disk = disk or run.disk
        ended = disk.ended and run.ended is not None and run.status != STATUS_RUNNING
        return {
            "spec_version": SPEC_VERSION,
            "run_id": run.run_id,
            "run_name": run.run_name,
            "started_at": storage.iso_ms(run.started),
            "ended_at": storage.iso_ms(run.ended) if ended and run.ended is not None else None,
            "duration_ms": max(0, int((run.ended - run.started) * 1000))
            if ended and run.ended is not None
            else None,
            "status": run.status if ended else STATUS_RUNNING,
            "counts": dict(disk.counts),
            "last_event_ts": disk.last_event_ts,
        }

    def _tripwire_json(self, run: _Run) -> dict[str, Any]:
        return {
            **run.fields,
            "cost_usd": round(run.cost_usd, 10),
            "tokens": {
                "prompt": run.prompt_tokens,
                "completion": run.completion_tokens,
                "total": run.total_tokens,
            },
            "health_tags": sorted(run.tags),
        }

    def _encode_end(self, run: _Run, counts: dict[str, int]) -> bytes:
        """RUN_END's line, its summary counting the events written before it."""
        event = run.end_event or {}
        payload = dict(event.get("payload") or {})
        payload["summary"] = _summary_order({**(payload.get("summary") or {}), **counts})
        return _encode({**event, "payload": payload})

    # --- the writer --------------------------------------------------------------------------

    def _job(self, run: _Run, now: float, force: bool, meta_ok: bool = True) -> _Job | None:
        """Take a run's writes due in this pass; None when nothing is (the run then waits, see _settle).

        `meta_ok` False: this pass's budget of metadata rewrites is spent; the run's waits for the next.
        """
        if run.failing and now < run.retry_at and not force:
            return None
        lines, run.pending = run.pending, []
        disk = run.disk
        data: list[bytes] = []
        after = replace(disk, counts=dict(disk.counts))
        for line in lines:
            data.append(line.data if line.data is not None else self._encode_end(run, after.counts))
            after.add(line)
        ending = run.status != STATUS_RUNNING
        run_json = tripwire = None
        if run.run_json_dirty or run.tripwire_dirty or lines:
            due = force or ending or not run.run_json_written or now >= run.meta_due
            if due and meta_ok and after.started:  # no run.json before RUN_START is on disk
                if run.tripwire_dirty or not run.tripwire_written:
                    tripwire = self._tripwire_json(run)
                run_json = self._run_json(run, after)
                run.run_json_dirty = run.tripwire_dirty = False
                # Renames are not free (ext4: ~0.2 ms when replacing a file): with many live runs each
                # one's metadata waits longer, so the rewrites stay ~META_REWRITES_PER_S in all.
                run.meta_due = now + max(self.meta_interval_s, len(self._runs) / META_REWRITES_PER_S)
            else:
                run.run_json_dirty = True
                if due and after.started:
                    run.meta_due = now  # due, but over this pass's budget: the next pass takes it
        if not lines and run_json is None and tripwire is None:
            return None
        return _Job(
            run_id=run.run_id,
            dir=run.dir,
            make_dir=not run.dir_made,
            lines=lines,
            data=data,
            after=after,
            size=disk.size,
            torn=run.torn,
            run_json=run_json,
            tripwire=tripwire,
            tripwire_first=not run.tripwire_written,
            fsync=self.fsync == "always" or (self.fsync == "run_end" and (ending or self._closing)),
        )

    def _apply(self, job: _Job, res: _JobResult, now: float, final: bool) -> None:
        """Back on the loop: what the job's writes did to the run's state."""
        run = self._runs.get(job.run_id)
        if run is None:  # forgotten while its writes were in flight
            self._unqueue(job.lines)
            return
        run.dir_made = run.dir_made or res.dir_made
        run.torn = res.torn
        dropped = 0
        if res.lines_ok is not False:
            if job.lines:
                run.disk = job.after
                self._unqueue(job.lines)
                if job.run_json is None:
                    run.run_json_dirty = True  # counts changed: rewrite when due
            run.disk.size = res.size
        else:
            run.disk.size = res.size
            if res.errno in _SPACE_ERRNOS and not final:
                keep = job.lines  # out of space: keep them all, in order, and retry
            elif final:
                keep = []
            else:  # a refusal that waiting will not cure: drop, but a run on disk starts with RUN_START
                keep = [
                    line
                    for line in job.lines
                    if line.event_type == EventType.RUN_END
                    or (line.event_type == EventType.RUN_START and not run.disk.started)
                ]
            dropped = len(job.lines) - len(keep)
            if dropped:
                self._unqueue([line for line in job.lines if line not in keep])
                self.dropped_events += dropped
            run.pending[:0] = keep
            run.run_json_dirty |= job.run_json is not None
            run.tripwire_dirty |= job.tripwire is not None
        if res.tripwire_ok:
            run.tripwire_written = True
        elif job.tripwire is not None:
            run.tripwire_dirty = True
        if res.run_json_ok:
            run.run_json_written = True
        elif job.run_json is not None:
            run.run_json_dirty = True
        if res.errors:
            if not run.failing or dropped:
                what = f"{dropped} events dropped" if dropped else "kept and retried"
                if final and not dropped:
                    what = "given up at close"
                self._note_error(f"{'; '.join(res.errors)} ({what})")
            run.failing = True
            run.retry_at = now + RETRY_S
            self._failing.add(run.run_id)
        elif run.failing:
            run.failing = False
            self._failing.discard(run.run_id)

    def _settle(self, run: _Run, final: bool) -> None:
        """After a run's turn in a pass: stay for the next pass (new lines), wait (deferred metadata, a
        retry), or leave the writer's sets; an ended, fully written run leaves memory."""
        self._dirty.pop(run.run_id, None)
        if final:
            if run.pending:
                self._unqueue(run.pending)
                self.dropped_events += len(run.pending)
                run.pending = []
            if run.status != STATUS_RUNNING:
                self._retire(run)
            return
        meta = run.run_json_dirty or run.tripwire_dirty
        if run.failing and (run.pending or meta):
            self._wait(run, run.retry_at)
        elif run.pending:
            self._dirty[run.run_id] = None  # queued while its writes were in a worker thread
        elif meta:
            self._wait(run, run.meta_due)
        elif run.status != STATUS_RUNNING and run.disk.ended:
            self._retire(run)

    def _wait(self, run: _Run, due: float) -> None:
        if run.wait_due is None or due < run.wait_due:
            run.wait_due = due
            heapq.heappush(self._waiting, (due, run.run_id))

    async def _drain(self, *, force: bool = False, final: bool = False) -> None:
        """One writer pass: every run with writes to do, each run's new lines in one append.

        Appends and rewrites happen here, on the loop, a slice of runs at a time; writes that fsync go
        to a worker thread. A live run's run.json / tripwire.json wait their turn unless `force`;
        `final` (close) gives up on writes that still fail, counting what is lost.
        """
        async with self._lock:
            target = self._seq
            force = force or final or self._force
            self._force = False
            now = time.monotonic()
            while self._waiting and (force or self._waiting[0][0] <= now):
                due, rid = heapq.heappop(self._waiting)
                run = self._runs.get(rid)
                if run is not None and run.wait_due == due:
                    run.wait_due = None
                    self._dirty[rid] = None
            threaded: list[_Job] = []
            budget = _META_PER_PASS  # rewrites are slow (a rename each): a pass stays short, lines first
            try:
                for i, rid in enumerate(list(self._dirty)):
                    run = self._runs.get(rid)
                    if run is None:
                        self._dirty.pop(rid, None)
                        continue
                    job = self._job(run, now, force, meta_ok=force or budget > 0)
                    if job is not None and job.run_json is not None:
                        budget -= 1
                    if job is None:
                        self._settle(run, final)
                    elif job.fsync:
                        self._dirty.pop(rid, None)
                        threaded.append(job)
                    else:
                        self._apply(job, _write_job(job), now, final)
                        self._settle(run, final)
                    if i % _YIELD_EVERY == _YIELD_EVERY - 1:
                        await asyncio.sleep(0)  # a pass over thousands of runs lets requests through
                if threaded:
                    results = await asyncio.to_thread(_write_jobs, threaded)
                    for job, res in zip(threaded, results, strict=True):
                        self._apply(job, res, now, final)
                        run = self._runs.get(job.run_id)
                        if run is not None:
                            self._settle(run, final)
            except Exception as e:  # never let a bug here stop the writer: count it and go on
                logger.exception("trace writer pass failed")
                self._note_error(f"writer pass failed: {e!r}")
            finally:
                self._done_seq = max(self._done_seq, target)
                if force or not self._waiting:
                    self._synced_seq = max(self._synced_seq, target)
                self._passes += 1
                self.owner.progress(self._passes, self._done_seq)
            self._schedule()
        async with self._progress:
            self._progress.notify_all()

    def _schedule(self) -> None:
        """Wake the writer when the first deferred rewrite or retry is due."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._waiting and self._task is not None and not self._closing:
            delay = max(0.0, self._waiting[0][0] - time.monotonic())
            self._timer = asyncio.get_running_loop().call_later(delay, self._wake.set)

    def _retire(self, run: _Run) -> None:
        """An ended run whose last writes are done leaves memory; its summary is kept for a while."""
        self._runs.pop(run.run_id, None)
        self._dirty.pop(run.run_id, None)
        self._failing.discard(run.run_id)
        run.wait_due = None
        self._ended[run.run_id] = self._summary(run, run.ended if run.ended is not None else run.last_ts)
        while len(self._ended) > _ENDED_MEMORY:
            self._ended.popitem(last=False)

    def _note_error(self, message: str) -> None:
        """Count a store failure and log it loudly, at most once per _LOG_EVERY_S (a full disk repeats)."""
        self.write_errors += 1
        self.last_error = message
        self.last_error_ts = self.clock()
        now = time.monotonic()
        if now - self._last_logged >= _LOG_EVERY_S:
            more = f" (+{self._unlogged} more since last report)" if self._unlogged else ""
            logger.error("TRACE STORE WRITE FAILED: %s%s", message, more)
            self._last_logged = now
            self._unlogged = 0
        else:
            self._unlogged += 1

    async def _writer(self) -> None:
        while not self._closing:
            await self._wake.wait()  # set by record(): the pass runs in the next loop iteration,
            self._wake.clear()  # with every event queued in this one
            await self._drain()


def _summary_order(s: dict[str, Any]) -> dict[str, Any]:
    """RUN_END summary with the spec's keys in the spec's order."""
    keys = ("llm_calls", "tool_calls", "errors", "duration_ms", "loop_warnings", "cost_usd", "total_tokens")
    return {k: s.get(k, 0) for k in keys}


def _is_uuid(s: Any) -> bool:
    try:
        uuid.UUID(s)
    except (TypeError, ValueError, AttributeError):
        return False
    return isinstance(s, str) and len(s) == 36


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


@cache
def _platform() -> str:
    """platform.platform(), computed once (it can shell out on some systems)."""
    return platform.platform()


def _repair_tail(path: Path) -> None:
    """Make events.jsonl end on a line boundary after a crash: cut a torn last line, or end a whole one."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    if not data or data.endswith(b"\n"):
        return
    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    try:
        complete = isinstance(orjson.loads(tail), dict)
    except orjson.JSONDecodeError:
        complete = False
    if complete:
        with open(path, "ab") as f:
            f.write(b"\n")
    else:
        logger.warning("cutting a torn last line (%d bytes) from %s", len(tail), path)
        os.truncate(path, cut)
