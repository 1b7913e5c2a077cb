"""The trace writer: puts the lines the recorder queued, and each run's run.json / tripwire.json, on
disk off the request path. One background task makes passes; each pass takes everything pending in
every run and appends each run's new lines with one `write()`, on the event loop itself (a page-cache
write takes microseconds, where a worker thread under load waits milliseconds for the GIL on every
system call: measured, with 300 busy sessions the thread fell seconds behind). Only writes that fsync
go to a worker thread: the writer's own (never the loop's default executor, which request work may
fill: the trace would stop behind it). With `trace_writer="process"` every write but a live run's
plain append goes to the writer's disk process instead, a child with its own GIL
(proxy/trace/off_loop.py). A writer that has events queued and has not finished a pass for
`stall_after_s` reports itself stalled (`health()`, /healthz, a metric). run.json and tripwire.json
are rewritten atomically at most once per run per
`meta_interval_s` while the run is live (at once when it starts and ends, and on `flush()`), so a
burst of events costs one rewrite. Out of space (ENOSPC, EDQUOT) keeps a run's lines in memory, in
order, and retries them every `RETRY_S` (and on flush); any other error drops the failed lines but
keeps RUN_START and RUN_END. A full queue drops events (never RUN_START / RUN_END). Failures are
counted, logged (rate-limited) and reported by the recorder's `health()`; they never raise.
"""

from __future__ import annotations

import asyncio
import errno
import heapq
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, cast

from proxy import runlock
from proxy.constants import COUNT_FOR_EVENT, EVENTS_JSONL, STATUS_RUNNING, EventType
from proxy.trace.content import encode
from proxy.trace.jobs import Job, JobResult, append_events, write_job, write_jobs
from proxy.trace.off_loop import TRACE_WRITER_MODES, OffLoop, TraceWriterMode
from proxy.trace.runs import BOOKENDS, NO_LINES, Line, Run, RunRegistry, encode_end, run_json, tripwire_json

__all__ = [
    "TRACE_WRITER_MODES",
    "Job",
    "JobResult",
    "TraceWriter",
    "TraceWriterMode",
    "write_job",
    "write_jobs",
]

logger = logging.getLogger(__name__)

FsyncPolicy = Literal["never", "run_end", "always"]
FSYNC_POLICIES = ("never", "run_end", "always")

META_INTERVAL_S = 0.5  # a live run's run.json / tripwire.json are rewritten at most this often ...
META_REWRITES_PER_S = 100.0  # ... and, with many live runs, at most this many runs' per second in all
RETRY_S = 1.0  # a run whose writes failed is retried this often (and at every flush)
_LOG_EVERY_S = 10.0  # write-error log rate limit
_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})  # space comes back: keep the lines, retry
_YIELD_EVERY = 512  # runs written per slice of a pass before other tasks get the loop
_META_PER_PASS = 32  # run.json / tripwire.json rewrites per pass at most (the rest wait for the next)
_ENDING_PER_PASS = 256  # and of runs ending (written in the thread, one group flush): a pass stays short
# A pass waits this long after the first event that woke it, so it runs while the loop waits on an
# upstream rather than in front of the next request, and the events of a few calls share it (as
# Kafka's linger.ms): a pass has a fixed cost (the file's open, append and close, the owner lock's
# progress write) that one call at a time would pay on its agent's next call. flush(), close and
# _LINGER_EVENTS queued events cut it short (under load passes fill anyway), so the events a kill -9
# can lose stay those of the last moment.
LINGER_S = 0.0005
# the event types as plain strs: an enum member's class lookup costs more than the comparison
_RUN_END: str = EventType.RUN_END.value
_new_line = tuple.__new__  # Line(...) without NamedTuple's Python-level __new__ (one per event)
_LINGER_EVENTS = 16  # this many events queued: no more lingering (under load passes fill anyway)
_END_SIZE = 600  # bytes reserved in the queue for a RUN_END line encoded when written
# events queued and no pass finished for this long: the writer is stuck (a hung fsync, a dead disk)
STALL_AFTER_S = 30.0


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class TraceWriter:
    """The write queue of a recorder's runs and the background task that drains it."""

    def __init__(
        self,
        registry: RunRegistry,
        owner: runlock.OwnerLock,
        *,
        fsync: FsyncPolicy,
        clock: Callable[[], float],
        max_pending_events: int,
        max_pending_bytes: int,
        meta_interval_s: float,
        stall_after_s: float = STALL_AFTER_S,
        trace_writer: TraceWriterMode = "loop",
    ) -> None:
        self.registry = registry
        self.owner = owner
        self.fsync = fsync
        self.clock = clock
        self.max_pending_events = max_pending_events
        self.max_pending_bytes = max_pending_bytes
        self.meta_interval_s = meta_interval_s
        self.dirty: dict[str, None] = {}  # run ids with writes to do now, in first-dirtied order
        self._waiting: list[tuple[float, str]] = []  # (when, run id): deferred metadata, retries
        self.failing: set[str] = set()  # run ids whose last write failed
        self.waiting_runs = 0  # runs with a wait_due (a deferred rewrite or a retry), kept as a count
        self.pending_events = 0
        self.pending_bytes = 0
        self.seq = 0  # bumped by every change queued
        self.done_seq = 0  # every event queued up to this one is written (or failed and counted)
        self._synced_seq = 0  # ... and so is every run.json / tripwire.json change (flush waits on this)
        self._force = False  # the next pass writes deferred metadata and retries failing runs now
        self.passes = 0
        self._wake = asyncio.Event()
        self._progress = asyncio.Condition()
        self.lock = asyncio.Lock()  # one writer pass at a time keeps lines in order
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due: float | None = None  # the wait the timer is set for
        self._flushing = 0  # flush() calls waiting for a pass
        self.linger_s = LINGER_S
        self._hurry: asyncio.Future[None] | None = None  # resolved to end a linger early
        self._closing = False
        self._closed = False
        self.write_errors = 0
        self.dropped_events = 0
        self.last_error: str | None = None
        self.last_error_ts: float | None = None
        self._last_logged = float("-inf")
        self._unlogged = 0
        self.stall_after_s = stall_after_s
        self.progress_at = time.monotonic()  # a pass ended, or the queue stopped being empty
        # the disk process (trace_writer "process") and the writer's own thread, for writes that fsync
        self.off_loop = OffLoop(trace_writer, self.note_error, lambda: owner.fd)

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the background writer task (idempotent)."""
        if not self.running:
            self._closing = self._closed = False
            self._task = asyncio.get_running_loop().create_task(self._writer(), name="tripwire-trace-writer")
            self.off_loop.begin()  # the disk process (trace_writer "process"); passes on the loop meanwhile

    def begin_close(self) -> None:
        """Close mode: writes fsync under "run_end", and the task stops after its current pass."""
        self._closing = True
        self._wake.set()
        self._end_linger()

    async def close(self) -> None:
        """Stop the task, then a last pass: anything queued since, and a last try for failures."""
        task = self._task
        if task is not None:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:
                logger.exception("trace %s task failed", "task")
            self._task = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_due = None
        await self.drain(force=True, final=True)
        self._closed = True
        await self.off_loop.close()  # the disk process has written everything when it returns

    def stalled_for(self) -> float:
        """Seconds the queued events have waited with no pass finished (0 when nothing is queued)."""
        if not self.pending_events:
            return 0.0
        return max(0.0, time.monotonic() - self.progress_at)

    async def flush(self) -> None:
        """Return once everything queued so far is on disk, run.json and tripwire.json included
        (or its write has failed and been counted)."""
        target = self.seq
        if self._synced_seq >= target:
            return
        if not self.running:
            while self._synced_seq < target:
                await self.drain(force=True)
            return
        self._force = True
        self._wake.set()
        self._end_linger()
        self._flushing += 1
        try:
            async with self._progress:
                await self._progress.wait_for(lambda: self._synced_seq >= target)
        finally:
            self._flushing -= 1

    # --- the queue ---------------------------------------------------------------------------

    def touch(self, run: Run, *, run_json: bool = False, tripwire: bool = False) -> None:
        run.run_json_dirty |= run_json
        run.tripwire_dirty |= tripwire
        self.dirty[run.run_id] = None
        self.seq += 1
        self._wake.set()

    def enqueue(self, run: Run, event: dict[str, Any], now: float) -> None:
        """Queue an accepted event's line, counted in the run; dropped (and counted) if the queue is full."""
        event_type = event["event_type"]
        bookend = event_type in BOOKENDS
        full = self.pending_events >= self.max_pending_events or self.pending_bytes >= self.max_pending_bytes
        if full and not bookend:
            # The writer cannot keep up (stuck or full disk): drop rather than grow without bound or
            # block. RUN_START / RUN_END are always kept, so run.json and the events agree on how a run
            # ended; a dropped event is not counted, so run.json's counts stay those of the events.
            self.dropped_events += 1
            self.note_error(
                f"write queue full ({self.pending_events} events, {self.pending_bytes} bytes): event dropped"
            )
        else:
            key = COUNT_FOR_EVENT.get(event_type)
            if key:
                setattr(run, key, getattr(run, key) + 1)  # (a COUNT_FOR_EVENT value: a Run field)
            if event_type == _RUN_END:
                run.end_event = event  # encoded when written: its summary counts the events on disk
                line = Line(None, event_type, key, now, event["ts"], _END_SIZE)
            else:
                data = encode(event)
                line = _new_line(Line, (data, event_type, key, now, event["ts"], len(data)))
            if isinstance(run.pending, list):
                run.pending.append(line)
            else:
                run.pending = [line]
            if not self.pending_events:
                self.progress_at = time.monotonic()  # a stall counts from when events wait
            self.pending_events += 1
            self.pending_bytes += line.size
            if self.pending_events >= _LINGER_EVENTS:
                self._end_linger()
        # touch(run, run_json=True), without its call (one per event)
        run.run_json_dirty = True
        self.dirty[run.run_id] = None
        self.seq += 1
        self._wake.set()

    def unqueue(self, lines: Sequence[Line]) -> None:
        self.pending_events -= len(lines)
        self.pending_bytes -= sum(line.size for line in lines)

    def forget(self, run: Run) -> None:
        """Drop a run's pending writes without writing them (the run has left the registry)."""
        self.unqueue(run.pending)
        run.pending = NO_LINES
        self.dirty.pop(run.run_id, None)
        self.failing.discard(run.run_id)
        self._unwait(run)

    # --- a pass ------------------------------------------------------------------------------

    def _job(self, run: Run, now: float, force: bool, meta_ok: bool = True) -> Job | None:
        """Take a run's writes due in this pass; None when nothing is (the run then waits, see _settle).

        `meta_ok` False: this pass's budget of metadata rewrites is spent; the run's waits for the next.
        """
        if run.failing and now < run.retry_at and not force:
            return None
        lines = run.pending if isinstance(run.pending, list) else []
        run.pending = NO_LINES
        disk = run.disk
        after = disk.copy()
        encoded = [line.data for line in lines]
        if None not in encoded:  # no RUN_END: every line is encoded already
            after.add_lines(lines)
            data = cast("list[bytes]", encoded)
        else:  # RUN_END is encoded now, its summary counting the lines before it
            data = []
            for line in lines:
                data.append(line.data if line.data is not None else encode_end(run, after.counts))
                after.add(line)
        data_size = sum(map(len, data))
        ending = run.status != STATUS_RUNNING
        run_json_ = tripwire = None
        if run.run_json_dirty or run.tripwire_dirty or lines:
            due = force or ending or not run.run_json_written or now >= run.meta_due
            if due and meta_ok and after.started:  # no run.json before RUN_START is on disk
                if run.tripwire_dirty or not run.tripwire_written:
                    tripwire = tripwire_json(run)
                run_json_ = run_json(run, after)
                run.run_json_dirty = run.tripwire_dirty = False
                # Renames are not free (ext4: ~0.2 ms when replacing a file): with many live runs each
                # one's metadata waits longer, so the rewrites stay ~META_REWRITES_PER_S in all.
                run.meta_due = now + max(self.meta_interval_s, len(self.registry.runs) / META_REWRITES_PER_S)
            else:
                run.run_json_dirty = True
                if due and after.started:
                    run.meta_due = now  # due, but over this pass's budget: the next pass takes it
        if not lines and run_json_ is None and tripwire is None:
            return None
        return Job(
            run_id=run.run_id,
            dir=run.dir,
            make_dir=not run.dir_made,
            lines=lines,
            data=data,
            data_size=data_size,
            after=after,
            size=disk.size,
            torn=run.torn,
            run_json=run_json_,
            tripwire=tripwire,
            tripwire_first=not run.tripwire_written,
            fsync=self.fsync == "always" or (self.fsync == "run_end" and (ending or self._closing)),
        )

    def _lines_only(self, run: Run, now: float, final: bool) -> bool:
        """A live run's new lines and nothing else due (its metadata waits, no failure, no fsync): the
        common pass under load, appended here without the Job a general write builds. False, having
        done nothing, when the run needs _job's general way."""
        if (
            not run.pending
            or run.status != STATUS_RUNNING  # RUN_END is queued: encoded when written, by _job
            or run.failing
            or run.torn
            or not run.dir_made
            or not run.run_json_written
            or now >= run.meta_due
            or run.disk.size is None
            or self.fsync == "always"
            or self._closing
        ):
            return False
        lines = run.pending  # (not empty: a list)
        run.pending = NO_LINES
        data = cast("list[bytes]", [line.data for line in lines])  # no RUN_END among them: all encoded
        size = sum(map(len, data))
        res = JobResult(run.run_id, dir_made=True, size=run.disk.size, torn=False)
        ok = append_events(res, f"{run.dir}/{EVENTS_JSONL}", data, size, False)
        run.run_json_dirty = True  # counts changed: rewritten when due
        if ok:  # as _apply does for a job of lines only
            run.disk.add_lines(lines)
            run.disk.size = res.size
            self.pending_events -= len(lines)  # unqueue(lines): their sizes are the data's
            self.pending_bytes -= size
            return True
        after = run.disk.copy()
        after.add_lines(lines)
        job = Job(
            run_id=run.run_id,
            dir=run.dir,
            make_dir=False,
            lines=lines,
            data=data,
            data_size=size,
            after=after,
            size=run.disk.size,
            torn=False,
            run_json=None,
            tripwire=None,
            tripwire_first=not run.tripwire_written,
            fsync=False,
        )
        self._apply(job, res, now, final)
        return True

    def _apply(self, job: Job, res: JobResult, now: float, final: bool) -> None:
        """Back on the loop: what the job's writes did to the run's state."""
        run = self.registry.runs.get(job.run_id)
        if run is None:  # forgotten while its writes were in flight
            self.unqueue(job.lines)
            return
        run.dir_made = run.dir_made or res.dir_made
        run.torn = res.torn
        dropped = 0
        if res.lines_ok is not False:
            if job.lines:
                run.disk = job.after
                self.unqueue(job.lines)
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
                self.unqueue([line for line in job.lines if line not in keep])
                self.dropped_events += dropped
            if keep:
                run.pending = [*keep, *run.pending]
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
                self.note_error(f"{'; '.join(res.errors)} ({what})")
            run.failing = True
            run.retry_at = now + RETRY_S
            self.failing.add(run.run_id)
        elif run.failing:
            run.failing = False
            self.failing.discard(run.run_id)

    def _settle(self, run: Run, final: bool) -> None:
        """After a run's turn in a pass: stay for the next pass (new lines), wait (deferred metadata, a
        retry), or leave the writer's sets; an ended, fully written run leaves memory."""
        self.dirty.pop(run.run_id, None)
        if final:
            if run.pending:
                self.unqueue(run.pending)
                self.dropped_events += len(run.pending)
                run.pending = NO_LINES
            if run.status != STATUS_RUNNING:
                self._retire(run)
            return
        meta = run.run_json_dirty or run.tripwire_dirty
        if run.failing and (run.pending or meta):
            self._wait(run, run.retry_at)
        elif run.pending:
            self.dirty[run.run_id] = None  # queued while its writes were in a worker thread
        elif meta:
            self._wait(run, run.meta_due)
        elif run.status != STATUS_RUNNING and run.disk.ended:
            self._retire(run)

    def waiting_count(self) -> int:
        """Runs with a deferred metadata rewrite or a retry due later (health). A count kept as runs
        start and stop waiting: the sweep asks at every tick, and 100,000 one-call runs all wait for
        their deferred run.json (walking the heap for it was a sixth of an expiry's sweep)."""
        return self.waiting_runs

    def _wait(self, run: Run, due: float) -> None:
        if run.wait_due is None or due < run.wait_due:
            if run.wait_due is None:
                self.waiting_runs += 1
            run.wait_due = due
            heapq.heappush(self._waiting, (due, run.run_id))

    def _unwait(self, run: Run) -> None:
        """The run waits no more (its heap entry, if any, is stale from now on)."""
        if run.wait_due is not None:
            run.wait_due = None
            self.waiting_runs -= 1

    async def drain(self, *, force: bool = False, final: bool = False) -> None:
        """One writer pass: every run with writes to do, each run's new lines in one append.

        Appends and rewrites happen here, on the loop, a slice of runs at a time; writes that fsync go
        to a worker thread. A live run's run.json / tripwire.json wait their turn unless `force`;
        `final` (close) gives up on writes that still fail, counting what is lost.
        """
        async with self.lock:
            target = self.seq
            force = force or final or self._force
            self._force = False
            now = time.monotonic()
            while self._waiting and (force or self._waiting[0][0] <= now):
                due, rid = heapq.heappop(self._waiting)
                run = self.registry.get(rid)
                if run is not None and run.wait_due == due:
                    self._unwait(run)
                    self.dirty[rid] = None
            off_loop: list[Job] = []  # to the disk process (when up), else only those that fsync
            process = self.off_loop.process_up
            budget = _META_PER_PASS  # rewrites are slow (a rename each): a pass stays short, lines first
            # ended runs' last writes go to the thread and one group flush (write_jobs): their
            # rewrites do not hold up the loop, so they have a budget of their own, larger
            ending_budget = _ENDING_PER_PASS if self.fsync == "run_end" else 0
            try:
                runs = self.registry.runs
                for i, rid in enumerate(list(self.dirty)):
                    run = runs.get(rid)
                    if run is None:
                        self.dirty.pop(rid, None)
                        continue
                    if not force and self._lines_only(run, now, final):
                        self._settle(run, final)
                    else:
                        ending = ending_budget > 0 and run.status != STATUS_RUNNING
                        job = self._job(run, now, force, meta_ok=force or budget > 0 or ending)
                        if job is not None and job.run_json is not None:
                            if ending and job.fsync:
                                ending_budget -= 1
                            else:
                                budget -= 1
                        if job is None:
                            self._settle(run, final)
                        elif job.fsync or process:
                            self.dirty.pop(rid, None)
                            off_loop.append(job)
                        else:
                            self._apply(job, write_job(job), now, final)
                            self._settle(run, final)
                    if i % _YIELD_EVERY == _YIELD_EVERY - 1:
                        await asyncio.sleep(0)  # a pass over thousands of runs lets requests through
                if off_loop:
                    group = self.fsync == "run_end"  # ("always": one fsync per file per pass, as documented)
                    results = await self.off_loop.write(off_loop, group_sync=group)
                    for job, res in zip(off_loop, results, strict=True):
                        self._apply(job, res, now, final)
                        run = self.registry.get(job.run_id)
                        if run is not None:
                            self._settle(run, final)
            except Exception as e:  # never let a bug here stop the writer: count it and go on
                logger.exception("trace writer pass failed")
                self.note_error(f"writer pass failed: {e!r}")
            finally:
                self.done_seq = max(self.done_seq, target)
                if force or not self._waiting:
                    self._synced_seq = max(self._synced_seq, target)
                self.passes += 1
                self.progress_at = time.monotonic()
                self.owner.progress(self.passes, self.done_seq)
            self._schedule()
        if self._flushing:
            async with self._progress:
                self._progress.notify_all()

    def _schedule(self) -> None:
        """Wake the writer when the first deferred rewrite or retry is due (the timer already set
        for that moment is kept: most passes leave the earliest wait as it was)."""
        due = self._waiting[0][0] if self._waiting and self._task is not None and not self._closing else None
        if due == self._timer_due and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_due = due
        if due is not None:
            delay = max(0.0, due - time.monotonic())
            self._timer = asyncio.get_running_loop().call_later(delay, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None  # the next pass sets one again, even for the same moment (uvloop's
        self._timer_due = None  # clock may fire it a little before time.monotonic() says it is due)
        self._wake.set()

    def _retire(self, run: Run) -> None:
        """An ended run whose last writes are done leaves memory; its summary is kept for a while."""
        self.dirty.pop(run.run_id, None)
        self.failing.discard(run.run_id)
        self._unwait(run)
        self.registry.retire(run)

    def note_error(self, message: str) -> None:
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
            await self._wake.wait()  # set by record(): the pass runs LINGER_S later,
            await self._linger()
            self._wake.clear()  # with every event queued until then
            await self.drain()

    async def _linger(self) -> None:
        if not self.linger_s or self._force or self._closing or self.pending_events >= _LINGER_EVENTS:
            return
        loop = asyncio.get_running_loop()
        self._hurry = hurry = loop.create_future()
        timer = loop.call_later(self.linger_s, _resolve, hurry)
        try:
            await hurry
        finally:
            timer.cancel()
            self._hurry = None

    def _end_linger(self) -> None:
        if self._hurry is not None:
            _resolve(self._hurry)
