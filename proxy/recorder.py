"""The trace recorder: AgentDbg events and run bookkeeping, written off the event loop.

`record()` is sync and O(1) for the caller's purposes: it sanitises the payload, builds the envelope,
updates the run's counts in memory and queues one encoded line. One background writer task takes
everything pending per run and writes it in a worker thread (`asyncio.to_thread`): the lines appended
in one write, then run.json and tripwire.json rewritten atomically (at most one pending rewrite per
run, so a burst of events costs one rewrite). A full or read-only disk never raises into the request
path: failures are logged (rate-limited), counted and reported by `health()`, and traffic goes on.

fsync policy (SPEC §4.1), `fsync=`:
- "never": data reaches the OS page cache within milliseconds; it survives a proxy crash or kill,
  not a power loss or kernel panic. Fastest.
- "run_end" (default): as "never" while a run is live, and fsync of events.jsonl, run.json and
  tripwire.json when the run ends (and for every write made while closing), so finished runs are
  durable. No fsync per event, so the hot path pays nothing.
- "always": fsync every batch (group commit: one fsync per file per writer pass, not per event).
  Durable within milliseconds at the cost of disk latency under load.
"""

from __future__ import annotations

import asyncio
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
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import orjson

from proxy import storage
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


@dataclass
class _Run:
    """One open run, in memory. Only the event-loop thread touches it."""

    run_id: str
    dir: Path
    run_name: str | None
    started: float
    counts: dict[str, int] = field(default_factory=default_counts)
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
    lines: list[bytes] = field(default_factory=list)
    run_json_dirty: bool = True
    tripwire_dirty: bool = True
    dir_made: bool = False
    needs_newline: bool = False  # a failed append may have left a torn line: start the next on a new one


@dataclass
class _Job:
    """What the worker thread writes for one run in one pass (built on the loop thread)."""

    run_id: str
    dir: Path
    make_dir: bool
    lines: list[bytes]
    newline_first: bool
    run_json: dict[str, Any] | None
    tripwire: dict[str, Any] | None
    fsync: bool


@dataclass
class _JobResult:
    run_id: str
    dir_made: bool
    lines_ok: bool | None  # None: there were no lines to write
    lost: int  # events whose append failed
    errors: list[str]


def _write_job(job: _Job) -> _JobResult:
    """Worker thread: one run's pending writes. Never raises; failures come back as strings."""
    errors: list[str] = []
    dir_made = not job.make_dir
    if job.make_dir:
        try:
            job.dir.mkdir(parents=True, exist_ok=True)
            dir_made = True
        except Exception as e:  # any failure is reported, never raised
            lost = f" ({len(job.lines)} events lost)" if job.lines else ""
            return _JobResult(
                job.run_id,
                False,
                False if job.lines else None,
                len(job.lines),
                [f"mkdir {job.dir}{lost}: {e!r}"],
            )
    lines_ok: bool | None = None
    if job.lines:
        data = [b"\n", *job.lines] if job.newline_first else job.lines
        try:
            storage.append_lines(job.dir / EVENTS_JSONL, data, fsync=job.fsync)
            lines_ok = True
        except Exception as e:
            lines_ok = False
            errors.append(f"append {job.dir / EVENTS_JSONL} ({len(job.lines)} events lost): {e!r}")
    for name, doc in ((RUN_JSON, job.run_json), (TRIPWIRE_JSON, job.tripwire)):
        if doc is None:
            continue
        try:
            storage.write_json_atomic(job.dir / name, doc, fsync=job.fsync)
        except Exception as e:
            errors.append(f"write {job.dir / name}: {e!r}")
    lost = len(job.lines) if lines_ok is False else 0
    return _JobResult(job.run_id, dir_made, lines_ok, lost, errors)


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
    ) -> None:
        if fsync not in _FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {_FSYNC_POLICIES}, not {fsync!r}")
        self.data_dir = Path(data_dir).expanduser()
        self.max_field_bytes = max_field_bytes
        self.record_content = record_content
        self.fsync = fsync
        self.clock = clock
        self.max_pending_events = max_pending_events
        self._runs: dict[str, _Run] = {}
        self._ended: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._dirty: dict[str, None] = {}  # run ids with pending writes, in first-dirtied order
        self._pending_events = 0
        self._seq = 0  # bumped by every change queued
        self._done_seq = 0  # every change up to this one is written (or has failed and been counted)
        self._wake = asyncio.Event()
        self._progress = asyncio.Condition()
        self._lock = asyncio.Lock()  # one writer pass at a time keeps lines in order
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False
        self.write_errors = 0
        self.dropped_events = 0
        self.last_error: str | None = None
        self.last_error_ts: float | None = None
        self._last_pass_failed = False
        self._last_logged = float("-inf")
        self._unlogged = 0

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the background writer task (idempotent)."""
        if self._task is None or self._task.done():
            self._closing = self._closed = False
            self._task = asyncio.get_running_loop().create_task(self._writer(), name="tripwire-trace-writer")

    async def close(self, *, end_open_runs: bool = True) -> None:
        """Write everything queued and stop the writer. Nothing recorded before close() is lost.

        Runs still open are ended first (status "ok", reason "shutdown") unless `end_open_runs=False`,
        in which case they stay "running" on disk and the next start closes them as interrupted.
        """
        if end_open_runs:
            self.end_open_runs(status=STATUS_OK, reason=REASON_SHUTDOWN)
        self._closing = True
        self._wake.set()
        if self._task is not None:
            try:
                await self._task
            except Exception:
                logger.exception("trace writer task failed")
            self._task = None
        await self._drain()  # anything queued after the writer's last pass, or with no writer at all
        self._closed = True

    async def flush(self) -> None:
        """Return once everything queued so far is on disk (or its write has failed and been counted)."""
        target = self._seq
        if self._done_seq >= target:
            return
        if self._task is None or self._task.done():
            while self._done_seq < target:
                await self._drain()
            return
        self._wake.set()
        async with self._progress:
            await self._progress.wait_for(lambda: self._done_seq >= target)

    # --- runs --------------------------------------------------------------------------------

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
            self._pending_events -= len(run.lines)
            self._dirty.pop(run_id, None)

    async def discard_run(self, run_id: str) -> None:
        """forget_run, then wait out any writer pass in flight: afterwards nothing writes to the run's
        directory, so deleting it cannot race a write (rmtree failing on a file created meanwhile).
        """
        self.forget_run(run_id)
        async with self._lock:
            pass

    def end_run(self, run_id: str, *, status: str, reason: str, ts: float | None = None) -> str | None:
        """Close a run: RUN_END with its summary; run.json gets status, ended_at, duration_ms.

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
        """Trace-store health for /healthz and metrics: queue depth, write errors, last error."""
        return {
            "ok": not self._last_pass_failed,
            "queue_depth": self._pending_events,
            "pending_runs": len(self._dirty),
            "open_runs": sum(1 for r in self._runs.values() if r.status == STATUS_RUNNING),
            "write_errors": self.write_errors,
            "dropped_events": self.dropped_events,
            "last_error": self.last_error,
            "last_error_at": None if self.last_error_ts is None else storage.iso_ms(self.last_error_ts),
            "writer_running": self._task is not None and not self._task.done(),
            "fsync": self.fsync,
        }

    # --- start-up recovery -------------------------------------------------------------------

    def recover_interrupted(self) -> list[str]:
        """At start-up: close runs a previous process left "running" as error / "interrupted".

        Sync (call before serving). A torn last line in events.jsonl is cut off first. The run is
        taken to have ended at its last readable event. Returns the ids closed.
        """
        closed: list[str] = []
        base = storage.runs_base(self.data_dir)
        try:
            entries = sorted(base.iterdir())
        except OSError:
            return closed
        for entry in entries:
            rid = entry.name
            if not storage.is_valid_run_id(rid) or rid in self._runs or not entry.is_dir():
                continue
            try:
                if self._recover_one(entry, rid):
                    closed.append(rid)
            except Exception:
                logger.exception("could not recover interrupted run %s", rid)
        return closed

    def _recover_one(self, d: Path, run_id: str) -> bool:
        meta = storage.read_json(d / RUN_JSON)
        if meta is None or meta.get("status") != STATUS_RUNNING:
            return False
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
        tw = storage.read_json(d / TRIPWIRE_JSON) or {}
        run_end = next((ev for ev in reversed(events) if ev.get("event_type") == EventType.RUN_END), None)
        if run_end is not None:
            # Died between appending RUN_END and rewriting run.json: the run did end, as RUN_END says.
            status = run_end.get("payload", {}).get("status", STATUS_ERROR)
            status = status if status in (STATUS_OK, STATUS_ERROR) else STATUS_ERROR
            reason = run_end.get("payload", {}).get("reason") or tw.get("end_reason")
        else:
            status, reason = STATUS_ERROR, REASON_INTERRUPTED
            tokens = tw.get("tokens") if isinstance(tw.get("tokens"), dict) else {}
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
            "run %s was left running by a previous process: closed as %s (%s)", run_id, status, reason
        )
        return True

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
        key = COUNT_FOR_EVENT.get(event_type)
        if key:
            run.counts[key] += 1
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
        if self._pending_events >= self.max_pending_events and not bookend:
            # The writer cannot keep up (stuck disk): drop rather than grow without bound or block.
            # RUN_START / RUN_END are always kept, so run.json and the events agree on how a run ended.
            self.dropped_events += 1
            self._note_error(f"write queue full ({self.max_pending_events} events): event dropped")
        else:
            run.lines.append(_encode(event))
            self._pending_events += 1
        self._touch(run, run_json=True)
        return event["event_id"]

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

    def _run_json(self, run: _Run) -> dict[str, Any]:
        ended = run.ended is not None and run.status != STATUS_RUNNING
        return {
            "spec_version": SPEC_VERSION,
            "run_id": run.run_id,
            "run_name": run.run_name,
            "started_at": storage.iso_ms(run.started),
            "ended_at": storage.iso_ms(run.ended) if ended and run.ended is not None else None,
            "duration_ms": max(0, int((run.ended - run.started) * 1000))
            if ended and run.ended is not None
            else None,
            "status": run.status,
            "counts": dict(run.counts),
            "last_event_ts": run.last_event_ts,
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

    def _job(self, run: _Run) -> _Job:
        ending = run.status != STATUS_RUNNING
        job = _Job(
            run_id=run.run_id,
            dir=run.dir,
            make_dir=not run.dir_made,
            lines=run.lines,
            newline_first=run.needs_newline,
            run_json=self._run_json(run) if run.run_json_dirty else None,
            tripwire=self._tripwire_json(run) if run.tripwire_dirty else None,
            fsync=self.fsync == "always" or (self.fsync == "run_end" and (ending or self._closing)),
        )
        self._pending_events -= len(run.lines)
        run.lines = []
        run.run_json_dirty = run.tripwire_dirty = False
        return job

    async def _drain(self) -> None:
        """One writer pass: snapshot every dirty run on the loop, write them all in a worker thread."""
        async with self._lock:
            target = self._seq
            try:
                jobs = [self._job(self._runs[rid]) for rid in self._dirty if rid in self._runs]
                self._dirty.clear()
                if jobs:
                    results = await asyncio.to_thread(_write_jobs, jobs)
                    self._apply(results)
            except Exception as e:  # never let a bug here stop the writer: count it and go on
                logger.exception("trace writer pass failed")
                self._note_error(f"writer pass failed: {e!r}")
            finally:
                self._done_seq = max(self._done_seq, target)
        async with self._progress:
            self._progress.notify_all()

    def _apply(self, results: list[_JobResult]) -> None:
        failed = False
        for res in results:
            run = self._runs.get(res.run_id)
            self.dropped_events += res.lost
            if run is not None:
                run.dir_made = run.dir_made or res.dir_made
                if res.lines_ok is not None:
                    run.needs_newline = not res.lines_ok
            for err in res.errors:
                failed = True
                self._note_error(err)
            if run is not None and run.status != STATUS_RUNNING and res.run_id not in self._dirty:
                self._retire(run)
        self._last_pass_failed = failed

    def _retire(self, run: _Run) -> None:
        """An ended run whose last writes are done leaves memory; its summary is kept for a while."""
        self._runs.pop(run.run_id, None)
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
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(0)  # let events queued in this loop iteration join the pass
            await self._drain()
            if self._closing and not self._dirty:
                return


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
