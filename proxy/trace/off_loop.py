"""Where a trace writer pass's jobs go when they leave the event loop.

`trace_writer: process`: every job a pass builds goes to the writer's disk process
(proxy/trace/disk_process.py) while it is up; the loop keeps only a live run's plain appends
(the writer's `_lines_only`). `loop`, or once the process is gone: the jobs are written on the loop
as before, and only those that fsync go to the writer's own thread (never the loop's default
executor, which request work may fill).

If the process dies (or cannot be written to) with a pass in flight, the pass is written again here,
in the thread: each job's append first cuts events.jsonl back to the size it had before (`torn`),
so a line the child wrote before dying is not doubled, and run.json / tripwire.json are atomic
rewrites. The error is counted (`note_error`) and the writer stays on the loop from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from proxy import storage
from proxy.constants import EVENTS_JSONL
from proxy.trace.disk_process import DiskProcess, DiskProcessGone
from proxy.trace.jobs import Job, JobResult, write_jobs

logger = logging.getLogger(__name__)

TraceWriterMode = Literal["process", "loop"]
TRACE_WRITER_MODES = ("process", "loop")


class OffLoop:
    """A writer's disk process (when asked for and up) and its own thread."""

    def __init__(
        self, mode: TraceWriterMode, note_error: Callable[[str], None], lock_fd: Callable[[], int | None]
    ) -> None:
        self.mode = mode
        self.note_error = note_error
        self.lock_fd = lock_fd
        self.process: DiskProcess | None = None
        self._threads: ThreadPoolExecutor | None = None
        self.process_failures = 0
        self._starting: asyncio.Task[None] | None = None

    @property
    def process_up(self) -> bool:
        """Every job goes off the loop (to the process), not only those that fsync."""
        return self.process is not None and self.process.alive

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process_up and self.process is not None else None

    def begin(self) -> None:
        """Start the disk process in the background (`process` mode): passes are written on the loop
        until it has said it is ready, so a slow start (a fresh interpreter on a loaded machine takes
        seconds) holds no pass up."""
        if self.mode == "process" and self.process is None and self._starting is None:
            self._starting = asyncio.get_running_loop().create_task(
                self.start(), name="tripwire-trace-disk-process-start"
            )

    async def started(self) -> None:
        """Return once a start under way has ended, the process up or not (tests, benchmarks)."""
        if self._starting is not None:
            await asyncio.shield(self._starting)

    async def start(self) -> None:
        """Start the disk process (`process` mode, idempotent); on failure the writer stays on the loop."""
        if self.mode != "process" or self.process is not None:
            return
        process = DiskProcess(self.lock_fd())
        try:
            await process.start()
        except Exception as e:
            self.process_failures += 1
            self.note_error(f"trace writer's disk process did not start ({e!r}): writing on the event loop")
            return
        self.process = process

    async def write(self, jobs: list[Job], *, group_sync: bool) -> list[JobResult]:
        """A pass's jobs written off the loop (`write_jobs`), their results in order. Never raises."""
        process = self.process
        if process is not None and process.alive:
            for job in jobs:
                if job.size is None and job.data:  # known before the child appends: a retry after
                    job.size = storage.file_size(f"{job.dir}/{EVENTS_JSONL}")  # its death cuts back to it
            try:
                return await process.write(jobs, group_sync=group_sync)
            except DiskProcessGone as e:
                self.process_failures += 1
                self.note_error(
                    f"trace writer's disk process (pid {process.pid}) ended with a pass in flight "
                    f"({e}): {len(jobs)} runs' writes done again, writing on the event loop from now on"
                )
                for job in jobs:
                    job.torn = job.torn or bool(job.data)  # cut back to the size before, then append
                await self._drop_process()
            except TypeError as e:  # a run's JSON orjson cannot encode: this pass on the loop's side
                logger.debug("a pass not sent to the disk process: %r", e)
        elif process is not None:
            self.process_failures += 1
            self.note_error(
                f"trace writer's disk process (pid {process.pid}) ended: writing on the event loop"
            )
            await self._drop_process()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._thread(), functools.partial(write_jobs, jobs, group_sync=group_sync)
        )

    async def _drop_process(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.kill()
            try:
                await process.close()
            except Exception:
                logger.exception("reaping the trace writer's disk process failed")

    def _thread(self) -> ThreadPoolExecutor:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tripwire-trace-writer")
        return self._threads

    async def close(self) -> None:
        """The process gets EOF and exits once it has written everything; the thread is let go. A
        start still under way is called off (the child, sent nothing yet, is killed)."""
        starting, self._starting = self._starting, None
        if starting is not None and not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
        process, self.process = self.process, None
        if process is not None:
            try:
                await process.close()
            except Exception:
                logger.exception("closing the trace writer's disk process failed")
        if self._threads is not None:
            self._threads.shutdown(wait=False)
            self._threads = None
