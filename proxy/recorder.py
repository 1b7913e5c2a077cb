"""The trace recorder: AgentDbg events and run bookkeeping, written off the request path.

`TraceRecorder` is the one entry point; it composes the parts in `proxy/trace/`:
- `proxy.trace.content`: what a trace keeps of an event (record_content, redaction, truncation);
- `proxy.trace.runs`: the run registry (open runs, counts, usage, tags, run.json / tripwire.json);
- `proxy.trace.writer`: the batched writer on the event loop (fsync in a thread, ENOSPC retries,
  metadata coalescing);
- `proxy.trace.recovery`: closing the runs of owners that are gone (proxy/runlock.py).

`record()` is sync and O(1) for the caller's purposes: it sanitises the payload, builds the envelope,
updates the run's counts in memory and queues one encoded line; the writer's passes put it on disk.

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

Where the files are written, `trace_writer=`: "loop" (the default) on the event loop, fsyncs in
the writer's thread; "process" in the writer's disk process, a child with its own GIL that makes the
folders and files and rewrites the JSON (for many new runs on a real disk; proxy/trace/off_loop.py).

Event sinks: every event accepted is also handed, as written, to the recorder's sinks (e.g. the OTLP
exporter, proxy/trace/otlp.py), in record(); a sink must return at once (queue, never block) and its
failures are caught and counted here, so a sink can never fail or slow a call. Sinks are closed
(flushed) after the writer, at close().

Ownership (SPEC §2): a started recorder holds `<data_dir>/owners/<owner_id>.lock` and records its
owner in each run's tripwire.json; recovery closes only runs whose owner is gone (proxy/runlock.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import Any

from proxy import ids, runlock, storage
from proxy.config_dumps import ConfigDumps
from proxy.constants import (
    DEFAULT_MAX_FIELD_BYTES,
    REASON_SHUTDOWN,
    STATUS_ERROR,
    STATUS_OK,
    STATUS_RUNNING,
    EventType,
)
from proxy.redact import redact_argv, sanitize
from proxy.trace import recovery
from proxy.trace.content import (
    CONTENT_FIELDS,
    GUARD_EVENTS,
    STRIPPED_FIELDS,
    STRUCTURE_KEYS,
    envelope,
    is_uuid,
    strip_content,
    tool_names_only,
)
from proxy.trace.recovery import RECOVER_INTERVAL_S
from proxy.trace.runs import Run, RunRegistry, run_json, summary
from proxy.trace.sinks import EventSink
from proxy.trace.writer import (
    FSYNC_POLICIES,
    META_INTERVAL_S,
    META_REWRITES_PER_S,
    RETRY_S,
    STALL_AFTER_S,
    TRACE_WRITER_MODES,
    FsyncPolicy,
    TraceWriter,
    TraceWriterMode,
)

__all__ = [
    "CONTENT_FIELDS",
    "GUARD_EVENTS",
    "META_INTERVAL_S",
    "META_REWRITES_PER_S",
    "RECOVER_INTERVAL_S",
    "RETRY_S",
    "STRIPPED_FIELDS",
    "STRUCTURE_KEYS",
    "EventSink",
    "FsyncPolicy",
    "TraceRecorder",
    "strip_content",
    "tool_names_only",
]

logger = logging.getLogger(__name__)

_EVENT_TYPES = frozenset(t.value for t in EventType)
_RECORDABLE = _EVENT_TYPES - {
    EventType.RUN_START.value,
    EventType.RUN_END.value,
}  # record()'s; not the bookends
_END_STATUSES = frozenset({STATUS_OK, STATUS_ERROR})
_RUN_END: str = EventType.RUN_END.value  # (a plain str: the event's type, as envelope makes it)
_EPOCH_2000 = 946684800.0  # event times before this are not wall-clock times


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
        sinks: Iterable[EventSink] = (),
        stall_after_s: float = STALL_AFTER_S,
        trace_writer: TraceWriterMode = "loop",
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {FSYNC_POLICIES}, not {fsync!r}")
        if trace_writer not in TRACE_WRITER_MODES:
            raise ValueError(f"trace_writer must be one of {TRACE_WRITER_MODES}, not {trace_writer!r}")
        self.data_dir = Path(data_dir).expanduser()
        self.max_field_bytes = max_field_bytes
        self.record_content = record_content
        self.fsync = fsync
        self.clock = clock
        self.recover_interval_s = recover_interval_s
        self.owner = runlock.OwnerLock(self.data_dir)
        self._registry = RunRegistry()
        self._writer = TraceWriter(
            self._registry,
            self.owner,
            fsync=fsync,
            clock=clock,
            max_pending_events=max_pending_events,
            max_pending_bytes=max_pending_bytes,
            meta_interval_s=meta_interval_s,
            stall_after_s=stall_after_s,
            trace_writer=trace_writer,
        )
        self._watch: asyncio.Task[None] | None = None
        self.sinks: list[EventSink] = list(sinks)
        self.sink_errors = 0
        # the guard configs runs record (tripwire.json, a run's first judged call): dumped and
        # sanitised once per config, shared by the runs
        self.config_dumps = ConfigDumps()
        # RUN_START's fields of this process, by (cwd, argv): as they are, and sanitised
        self._process: tuple[tuple[str, tuple[str, ...]], dict[str, Any], dict[str, Any]] | None = None
        # `<data_dir>/runs`, one str every run's `dir` is made from (no Path per run, issue 33)
        self._runs_base = str(storage.runs_base(self.data_dir))

    def add_sink(self, sink: EventSink) -> None:
        """Hand every event recorded from now on to `sink` too (see the module docstring)."""
        self.sinks.append(sink)

    # the writer's failure counters, as before the split
    @property
    def write_errors(self) -> int:
        return self._writer.write_errors

    @property
    def dropped_events(self) -> int:
        return self._writer.dropped_events

    @property
    def last_error(self) -> str | None:
        return self._writer.last_error

    @property
    def last_error_ts(self) -> float | None:
        return self._writer.last_error_ts

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Take the owner lock and start the background writer task (idempotent)."""
        self.owner.acquire()
        loop = asyncio.get_running_loop()
        self._writer.start()
        if self.recover_interval_s and (self._watch is None or self._watch.done()):
            self._watch = loop.create_task(
                recovery.watch_owners(self.recover_interval_s, self.recover_dead_owners),
                name="tripwire-owner-watch",
            )

    async def close(self, *, end_open_runs: bool = True) -> None:
        """Write everything queued and stop the writer. Nothing recorded before close() is lost.

        Runs still open are ended first (status "ok", reason "shutdown") unless `end_open_runs=False`,
        in which case they stay "running" on disk and the next start closes them as interrupted.
        Writes still failing after a last attempt are dropped (counted). The owner lock is released.
        """
        if end_open_runs:
            self.end_open_runs(status=STATUS_OK, reason=REASON_SHUTDOWN)
        self._writer.begin_close()
        if self._watch is not None:
            self._watch.cancel()
            try:
                await self._watch
            except asyncio.CancelledError:
                pass
            except Exception:
                logger.exception("trace %s task failed", "watch")
            self._watch = None
        # stops the writer task, then anything queued after its last pass; a last try for failures
        await self._writer.close()
        self.owner.release()
        for sink in self.sinks:  # after the writer: RUN_END of the runs just ended is in every sink
            try:
                await sink.close()
            except Exception:
                logger.exception("closing the %s event sink failed", sink.name)

    async def flush(self) -> None:
        """Return once everything queued so far is on disk, run.json and tripwire.json included
        (or its write has failed and been counted)."""
        await self._writer.flush()

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
        start_fields: dict[str, Any] | None = None,
    ) -> str:
        """Open a run: run.json (status running), tripwire.json and RUN_START are queued; returns the id.

        `extra` is the guard configuration in force, kept as tripwire.json's guard_config; or, when it
        has a `guard_config` key, tripwire.json fields to set (e.g. guard_config + guard_config_source).
        ValueError for a malformed run_id or one this recorder has already opened (ended runs are
        remembered for a while): a second RUN_START would make the trace invalid.
        `start_fields`: more RUN_START payload fields (a resumed run's `resumed_from`).
        """
        if run_id is None:
            run_id = ids.uuid4_text()
        if not storage.is_valid_run_id(run_id):
            raise ValueError("invalid run_id")
        if self._registry.known(run_id):
            raise ValueError(f"run {run_id} already exists")
        now = self._ts(ts)
        run = Run(run_id=run_id, base=self._runs_base, run_name=run_name, started=now)  # no resolve()
        run.fields = {
            "agent_name": agent_name,
            "session_id": session_id,
            "end_reason": None,
            "guard_config": {},
            "record_content": self.record_content,
        }
        config = extra.get("guard_config") if extra else None
        if extra and isinstance(config, dict):
            # the config in force is the same dict run after run (`config_dumps.recorded`):
            # cleaned once, not walked again for every run a stateless service's calls open
            rest = {k: v for k, v in extra.items() if k != "guard_config"}
            clean_extra = sanitize(rest, self.max_field_bytes)
            clean_extra["guard_config"] = self.config_dumps.sanitized(config, self.max_field_bytes)
        else:
            clean_extra = sanitize(extra or {}, self.max_field_bytes)
        if "guard_config" in clean_extra:
            run.fields.update(clean_extra)  # tripwire.json fields, guard_config among them
        else:
            run.fields["guard_config"] = clean_extra
        if self.owner.held:
            run.fields["owner"] = self.owner.info()  # recovery elsewhere leaves the run alone while we live
        self._registry.add(run)
        argv = sys.argv if argv is None else argv
        if start_fields:  # (a resumed run) the whole payload walked, as any event's
            payload = {
                "run_name": run_name,
                **self._process_fields(argv),
                "agent_name": agent_name,
                "session_id": session_id,
                **sanitize(start_fields, self.max_field_bytes),
            }
            self._append(run, EventType.RUN_START, run_name or "run", payload, ts=now)
            return run_id
        # what sanitize makes of the payload, field by field (a top-level value is walked at depth
        # 1): the process's fields are the same run after run, cleaned once (`_process_fields`)
        m = self.max_field_bytes
        clean_name = sanitize(run_name, m, 1)
        payload = {
            "run_name": clean_name,
            **self._process_fields(argv, clean=True),
            "agent_name": sanitize(agent_name, m, 1),
            "session_id": sanitize(session_id, m, 1),
        }
        # the event's name, `sanitize(str(run_name or "run"), m)`: the payload's for a name given
        name = clean_name if run_name and type(run_name) is str else sanitize(str(run_name or "run"), m)
        self._append(run, EventType.RUN_START, name, payload, ts=now, sanitized=True)
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
        sanitized: bool = False,
    ) -> str:
        """Queue one event; returns its event_id. Payload and meta are redacted and truncated.

        `sanitized`: the caller made name, payload and meta already as `sanitize` makes them (the
        LLM_CALL does, in one pass), so they are kept as they are. Only with record_content: a
        payload stripped of its content must be stripped before it is sanitised (ValueError otherwise).

        An event for a run that is not open (never started, already ended) is dropped with a warning,
        so a late stream finishing after its session ended cannot write past RUN_END.
        ValueError for an event type outside AgentDbg's set, or RUN_START / RUN_END (use start_run / end_run).
        """
        if event_type not in _RECORDABLE:
            raise ValueError(f"not a recordable event type: {event_type!r}")
        if sanitized and not self.record_content:
            raise ValueError("a sanitised payload cannot be stripped of its content (record_content is off)")
        run = self._registry.runs.get(run_id)
        if run is None or run.status != STATUS_RUNNING:
            logger.warning("dropping %s for run %s: run is not open", event_type, run_id)
            return ids.uuid4_text()
        if payload and not self.record_content:
            payload = strip_content(event_type, payload)
            if event_type == EventType.LOOP_WARNING:
                name = tool_names_only(name)
        return self._append(
            run,
            event_type,
            name,
            payload,
            duration_ms=duration_ms,
            parent_id=parent_id,
            meta=meta,
            ts=ts,
            sanitized=sanitized,
        )

    def add_usage(self, run_id: str, cost_usd: float, tokens: int) -> None:
        """Add a call's cost and total tokens to the run (tripwire.json cost_usd, tokens.total).

        tokens.prompt / tokens.completion are summed from each LLM_CALL's payload usage by record().
        """
        run = self._registry.runs.get(run_id)
        if run is None:
            return
        run.cost_usd += float(cost_usd or 0.0)
        run.total_tokens += int(tokens or 0)
        self._writer.touch(run, tripwire=True)

    def add_tags(self, run_id: str, *tags: str) -> None:
        """Add session health tags (SPEC §5.6); tripwire.json keeps them as a sorted list."""
        run = self._registry.get(run_id)
        if run is None or set(tags) <= run.tags:
            return
        run.add_tags(tags)
        self._writer.touch(run, tripwire=True)

    def remove_tags(self, run_id: str, *tags: str) -> None:
        """Tags that hold only for a while (`awaiting_approval`, SPEC §5.5a)."""
        run = self._registry.get(run_id)
        if run is None or not (set(tags) & run.tags):
            return
        run.remove_tags(tags)
        self._writer.touch(run, tripwire=True)

    def update_tripwire(self, run_id: str, **fields: Any) -> None:
        """Set Tripwire's own run fields in tripwire.json (cost, tokens and tags have their own calls)."""
        run = self._registry.get(run_id)
        if run is None:
            return
        run.fields.update(sanitize(fields, self.max_field_bytes))
        self._writer.touch(run, tripwire=True)

    async def update_run_fields(self, run_id: str, **fields: Any) -> None:
        """`update_tripwire` for a run open or ended (an ended one's tripwire.json is rewritten on
        disk once the writes queued for it are done)."""
        await self.flush()
        if self._registry.get(run_id) is not None:
            self.update_tripwire(run_id, **fields)
            return
        clean = sanitize(fields, self.max_field_bytes)
        await asyncio.to_thread(storage.update_tripwire_json, self.data_dir, run_id, clean)

    async def rename_run(self, run_id: str, name: str) -> dict[str, Any] | None:
        """Rename a run, open or not; returns the new run.json, None when there is no such run.

        An open run is renamed in memory (its run.json is rewritten from memory, so an on-disk edit
        would be undone). ValueError on a malformed id or an empty name.
        """
        new_name = (name or "").strip()
        if not new_name:
            raise ValueError("run_name must be non-empty")
        storage.run_dir(self.data_dir, run_id)
        run = self._registry.get(run_id)
        if run is None:
            return await asyncio.to_thread(storage.rename_run, self.data_dir, run_id, new_name)
        run.run_name = new_name
        self._writer.touch(run, run_json=True)
        await self.flush()
        return run_json(run)

    def forget_run(self, run_id: str) -> None:
        """Drop a run's state and pending writes without writing them (its directory is being deleted).

        A writer pass already in flight may still write to it: await `discard_run` before deleting.
        """
        run = self._registry.pop(run_id)
        if run is not None:
            self._writer.forget(run)

    async def discard_run(self, run_id: str) -> None:
        """forget_run, then wait out any writer pass in flight: afterwards nothing writes to the run's
        directory, so deleting it cannot race a write (rmtree failing on a file created meanwhile).
        """
        self.forget_run(run_id)
        async with self._writer.lock:
            pass

    def end_run(self, run_id: str, *, status: str, reason: str, ts: float | None = None) -> str | None:
        """Close a run: RUN_END with its summary; run.json gets status, ended_at, duration_ms.

        The summary's counts are those of the run's events on disk when RUN_END is written (the same
        as run.json's), so they differ from the calls seen only when some events could not be written.
        Idempotent: ending a run that is not open does nothing and returns None.
        """
        if status not in _END_STATUSES:
            raise ValueError(f"status must be 'ok' or 'error', not {status!r}")
        run = self._registry.runs.get(run_id)
        if run is None or run.status != STATUS_RUNNING:
            return None
        now = max(self._ts(ts), run.started)
        run.ended = now
        run.fields["end_reason"] = reason
        payload = {"status": status, "summary": summary(run, now), "reason": reason}
        # run.json and tripwire.json to rewrite: the writer's enqueue marks the run dirty (and run.json
        # with it), so tripwire.json is marked here instead of a `touch` of its own (an expiry ends
        # many runs in one sweep: ~2 us a run)
        run.tripwire_dirty = True
        # numbers and Tripwire's own words (a status, an end reason): as `sanitize` leaves them, so
        # not walked again (an expiry ends many runs in one sweep)
        event_id = self._append(run, _RUN_END, "run_end", payload, ts=now, sanitized=_plain(reason))
        # closed after RUN_END is queued: the event itself is accepted while the run is open
        self._registry.close(run, status)
        return event_id

    def end_open_runs(self, *, status: str, reason: str) -> list[str]:
        """End every open run (shutdown); returns their ids."""
        ids = self._registry.open_ids()
        for rid in ids:
            self.end_run(rid, status=status, reason=reason)
        return ids

    def is_open(self, run_id: str) -> bool:
        run = self._registry.get(run_id)
        return run is not None and run.status == STATUS_RUNNING

    def summary(self, run_id: str) -> dict[str, Any]:
        """RUN_END's summary shape, live for an open run; {} for a run this recorder does not know."""
        return self._registry.summary(run_id, self.clock())

    def health(self) -> dict[str, Any]:
        """Trace-store health for /healthz and metrics: queue depth, write errors, writer progress."""
        w = self._writer
        stalled_for = w.stalled_for()
        stalled = stalled_for > w.stall_after_s
        return {
            "ok": not w.failing and not stalled,
            "queue_depth": w.pending_events,
            "queue_bytes": w.pending_bytes,
            "pending_runs": len(w.dirty),
            "waiting_runs": w.waiting_count(),  # runs whose metadata rewrite or retry waits its turn
            "held_runs": len(self._registry.runs),  # open, or ended with writes still to do
            "failing_runs": len(w.failing),
            "open_runs": self._registry.open_count(),
            "write_errors": w.write_errors,
            "dropped_events": w.dropped_events,
            "last_error": w.last_error,
            "last_error_at": None if w.last_error_ts is None else storage.iso_ms(w.last_error_ts),
            "writer_running": w.running,
            # events queued and no writer pass finished for longer than stall_after_s: stuck
            "writer_stalled": stalled,
            "writer_stalled_for_s": round(stalled_for, 3),
            "writer_passes": w.passes,
            "written_seq": w.done_seq,
            "fsync": self.fsync,
            "trace_writer": w.off_loop.mode,
            "writer_process": w.off_loop.pid,  # the disk process's pid; None when writing on the loop
            "owner": self.owner.id if self.owner.held else None,
            **({"exporters": {sink.name: sink.health() for sink in self.sinks}} if self.sinks else {}),
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
        return recovery.recover(
            self.data_dir,
            self.owner,
            only=only,
            skip=self._registry.runs,
            fsync=self.fsync != "never",
            clock=self.clock,
            max_field_bytes=self.max_field_bytes,
        )

    # --- internals ---------------------------------------------------------------------------

    def _append(
        self,
        run: Run,
        event_type: str,
        name: str,
        payload: dict[str, Any] | None,
        *,
        duration_ms: float | None = None,
        parent_id: str | None = None,
        meta: dict[str, Any] | None = None,
        ts: float | None = None,
        sanitized: bool = False,
    ) -> str:
        now = ts if type(ts) is float and ts >= _EPOCH_2000 else self._ts(ts)  # (_ts's common case)
        if parent_id is not None and not is_uuid(parent_id):
            logger.warning("parent_id %r is not a UUID: recorded as null", parent_id)
            parent_id = None
        event = envelope(
            run.run_id,
            event_type,
            name,
            payload,
            max_field_bytes=self.max_field_bytes,
            duration_ms=duration_ms,
            parent_id=parent_id,
            meta=meta,
            ts=now,
            sanitized=sanitized,
        )
        run.note_event(event_type, payload, now, event["ts"])
        self._writer.enqueue(run, event, now)
        if self.sinks:
            self._to_sinks(run, event, now)
        return event["event_id"]

    def _to_sinks(self, run: Run, event: dict[str, Any], ts: float) -> None:
        agent = str(run.fields.get("agent_name") or "")
        session_id = str(run.fields.get("session_id") or "")
        for sink in self.sinks:
            try:
                sink.accept(event, ts, agent=agent, session_id=session_id)
            except Exception:  # a sink's bug must not reach the call that recorded the event
                self.sink_errors += 1
                if self.sink_errors == 1 or self.sink_errors % 1000 == 0:
                    logger.exception("event sink %s failed (%d failures so far)", sink.name, self.sink_errors)

    def _process_fields(self, argv: Iterable[str], *, clean: bool = False) -> dict[str, Any]:
        """RUN_START's fields of the process: python_version, platform, cwd and argv (redacted);
        `clean`: as sanitize makes them in the payload. Worked out once per cwd and argv (the
        proxy's own, the same for every run); a copy each time (the event holds its own)."""
        key = (os.getcwd(), tuple(argv))
        kept = self._process
        if kept is None or kept[0] != key:
            raw = {
                "python_version": platform.python_version(),
                "platform": _platform(),
                "cwd": key[0],
                "argv": redact_argv(key[1]),
            }
            kept = self._process = (key, raw, sanitize(raw, self.max_field_bytes))
        fields = kept[2] if clean else kept[1]
        return {**fields, "argv": list(fields["argv"])}

    def _ts(self, ts: float | None) -> float:
        """The event time: the caller's wall-clock epoch seconds, else the clock."""
        if ts is None:
            return self.clock()
        if ts < _EPOCH_2000:
            # A monotonic reading passed by mistake would date the event 1970: use the clock instead.
            logger.warning("ts %r is not a wall-clock epoch time: using the clock", ts)
            return self.clock()
        return float(ts)


def _plain(text: str) -> bool:
    """A short word of Tripwire's own (`idle_timeout`, `guard:loop`): nothing `sanitize` would change."""
    return len(text) <= 64 and text.isascii() and text.replace("_", "").replace(":", "").isalnum()


@cache
def _platform() -> str:
    """platform.platform(), computed once (it can shell out on some systems)."""
    return platform.platform()
