"""The trace writer's disk work in a child process (`trace_writer: process`).

A new run is a folder and three files; on a virtual disk each file made costs tens to hundreds of
microseconds of kernel CPU, paid on the event loop (its one core) while the machine's other core
idles. A writer *thread* did not help: on two busy cores it starved on the GIL (docs/benchmarks.md,
issue 33). A child process has its own GIL: the writer sends it a pass's jobs over a pipe
(proxy/trace/disk_child.py's frames) and awaits the answer, the loop serving requests meanwhile.
One pass is in flight at a time (the writer's lock), so a run's lines stay in order.

The child is started with `subprocess` (never a fork of the running loop), imports the disk side
only, and inherits the owner lock's fd (`pass_fds`): the data dir's flock stays held until the child
has written everything, even after a kill -9 of the parent. `write` raises `DiskProcessGone` when
the child dies or cannot be reached; the writer then writes on the loop (proxy/trace/writer.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time

from proxy.trace.disk_child import HEADER, READY, pass_frame, result_of, unframe
from proxy.trace.jobs import Job, JobResult

# the child's entry: its package root first on sys.path, so it runs the same code as the parent
# (not another checkout's `proxy` found first in its cwd)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ENTRY = f"import sys; sys.path.insert(0, {_ROOT!r}); from proxy.trace.disk_child import main; main()"
EXIT_WAIT_S = 5.0  # after EOF on its stdout, how long close() waits for the child to be reaped
# how long start() waits for the child's READY (a fresh interpreter's imports: ~50 ms on a quiet
# machine, seconds on a loaded one; the writer writes on the loop meanwhile)
READY_WAIT_S = 60.0


class DiskProcessGone(Exception):
    """The child died, or could not be written to or read from."""


class _Answers(asyncio.Protocol):
    """The child's stdout: frames, handed to the pass awaiting them."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.waiter: asyncio.Future[bytes] | None = None
        self.gone: BaseException | None = None
        loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.ready: asyncio.Future[None] = loop.create_future()  # the child's first frame came

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._deliver()

    def _deliver(self) -> None:
        buf = self.buf
        if not self.ready.done():  # the first frame says the child is up
            body = self._take(buf)
            if body is None:
                return
            try:
                said = unframe(body)
            except Exception:
                said = None
            if said == READY:
                self.ready.set_result(None)
            else:
                self.ready.set_exception(DiskProcessGone(f"not a ready frame: {said!r}"))
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        body = self._take(buf)
        if body is None:
            return
        self.waiter = None
        try:
            waiter.set_result(unframe(body))
        except Exception as e:  # a garbled answer: the child is not to be trusted any more
            waiter.set_exception(DiskProcessGone(f"unreadable answer: {e!r}"))

    @staticmethod
    def _take(buf: bytearray) -> bytes | None:
        """The next whole frame's body, taken from the buffer; None while it is incomplete."""
        if len(buf) < HEADER.size:
            return None
        (size,) = HEADER.unpack_from(buf)
        end = HEADER.size + size
        if len(buf) < end:
            return None
        body = bytes(buf[HEADER.size : end])
        del buf[:end]
        return body

    def eof_received(self) -> bool | None:
        return False  # (the transport closes: connection_lost follows)

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = DiskProcessGone(f"its stdout closed ({exc!r})" if exc else "its stdout closed")
        if not self.ready.done():
            self.ready.set_exception(self.gone)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.gone)
        if not self.closed.done():
            self.closed.set_result(None)


class _Sink(asyncio.Protocol):
    """The child's stdin: only its loss matters (EPIPE when the child died)."""

    def __init__(self, answers: _Answers) -> None:
        self.answers = answers
        self.lost = False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        waiter = self.answers.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(DiskProcessGone(f"its stdin closed ({exc!r})"))


class DiskProcess:
    """One child writing a trace writer's jobs. `start`, then `write` a pass at a time, then `close`."""

    def __init__(self, lock_fd: int | None = None) -> None:
        self.lock_fd = lock_fd
        self.proc: subprocess.Popen[bytes] | None = None
        self._answers: _Answers | None = None
        self._sink: _Sink | None = None
        self._stdin: asyncio.WriteTransport | None = None
        self.sent = 0  # passes handed to the pipe
        self.passes = 0  # ... and answered

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def unsent_bytes(self) -> int:
        """What the pipe has not taken yet of the passes sent (a kill -9 now would lose it)."""
        return 0 if self._stdin is None else self._stdin.get_write_buffer_size()

    @property
    def alive(self) -> bool:
        return (
            self.proc is not None
            and self._answers is not None
            and self._answers.gone is None
            and self._sink is not None
            and not self._sink.lost
        )

    async def start(self) -> None:
        """Start the child, connect its pipes and wait for its READY; OSError when it cannot be
        started, DiskProcessGone when it died or said nothing within READY_WAIT_S."""
        loop = asyncio.get_running_loop()
        self.proc = self._spawn()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            answers = _Answers()
            _, self._answers = await loop.connect_read_pipe(lambda: answers, self.proc.stdout)
            self._sink = _Sink(answers)
            sink = self._sink
            transport, _ = await loop.connect_write_pipe(lambda: sink, self.proc.stdin)
            self._stdin = transport
            try:
                await asyncio.wait_for(answers.ready, READY_WAIT_S)
            except TimeoutError:
                raise DiskProcessGone(f"no ready frame within {READY_WAIT_S:g} s") from None
        except BaseException:
            self.kill()
            await self.close()
            raise

    def _spawn(self) -> subprocess.Popen[bytes]:
        """fork + exec of a fresh interpreter (a few ms, once): not a fork of the running loop."""
        return subprocess.Popen(
            [sys.executable, "-c", _ENTRY],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=() if self.lock_fd is None else (self.lock_fd,),
            close_fds=True,
        )

    async def write(self, jobs: list[Job], *, group_sync: bool) -> list[JobResult]:
        """The pass's jobs written by the child (write_jobs), their results in order.

        DiskProcessGone when the child died before answering: some of the jobs may be written, some
        not (the caller retries them all; each append knows its size before, so none is doubled).
        TypeError, with nothing sent, for a run's JSON that cannot be encoded."""
        answers, stdin = self._answers, self._stdin
        if not self.alive or answers is None or stdin is None:
            raise DiskProcessGone("not running")
        data = pass_frame(group_sync, jobs)
        waiter: asyncio.Future[list[tuple[object, ...]]] = asyncio.get_running_loop().create_future()
        answers.waiter = waiter  # type: ignore[assignment]
        stdin.write(data)
        self.sent += 1
        wires = await waiter
        self.passes += 1
        if len(wires) != len(jobs):
            raise DiskProcessGone(f"{len(wires)} answers to {len(jobs)} jobs")
        return [result_of(job.run_id, w) for job, w in zip(jobs, wires, strict=True)]

    def kill(self) -> None:
        """SIGKILL the child (tests; a child that would not start)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()

    async def close(self) -> None:
        """EOF on the child's stdin; return once it has written everything and exited."""
        proc = self.proc
        if proc is None:
            return
        if self._stdin is not None:
            self._stdin.close()
        elif proc.stdin is not None:
            proc.stdin.close()
        if self._answers is not None:
            await self._answers.closed  # the child closes its stdout by exiting
        elif proc.stdout is not None:
            proc.stdout.close()
        deadline = time.monotonic() + EXIT_WAIT_S
        while proc.poll() is None:  # exited (its stdout closed): reaped within moments
            if time.monotonic() > deadline:
                self.kill()
                deadline = float("inf")
            await asyncio.sleep(0.001)
        self.proc = None
