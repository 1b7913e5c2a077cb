"""The trace writer's disk process: the child side, and the wire both sides speak.

`python -c 'from proxy.trace.disk_child import main; main()'` (proxy/trace/disk_process.py starts it)
reads writer passes from stdin and writes each with `write_jobs`, in order, answering each with its
`JobResult`s on stdout. It imports only this module, `proxy.trace.jobs`, `proxy.storage` and
`proxy.constants`: what a pass's disk side needs.

Frames both ways: a 4-byte little-endian length, then the body in `marshal` (builtins only, the
fastest there is; both ends run the same interpreter). A pass is `(group_sync, [job, ...])`, a job
the tuple of its disk fields (`job_wire`); the answer a list of result tuples (`result_wire`), in
the jobs' order. run.json and tripwire.json go as the dicts the loop would encode: the child
encodes them as `storage.write_json_atomic` does on the loop, so the bytes are the same.

It exits at EOF on stdin, once everything it received is written, and not before: SIGINT and
SIGTERM are ignored (a Ctrl-C or a stop sent to the process group reaches the parent, which closes
stdin after its last pass). A parent killed with -9 closes stdin too: the child still writes every
pass it had received whole (a pass cut short by the kill is dropped, never half written), with its
answers going nowhere. It keeps the owner lock's fd it was given open until it exits, so recovery
in another process does not close the runs it is still writing (proxy/runlock.py).
"""

from __future__ import annotations

import marshal
import os
import signal
import struct
import sys
from typing import Any, cast

import orjson

from proxy.trace.jobs import Job, JobResult, write_jobs

HEADER = struct.Struct("<I")  # the body's length


def job_wire(job: Job) -> tuple[Any, ...]:
    """A job's disk fields: dir, make_dir, data (the lines joined), data_size, size, torn, run_json,
    tripwire, tripwire_first, fsync."""
    data = job.data
    return (
        job.dir,
        job.make_dir,
        data[0] if len(data) == 1 else b"".join(data),
        job.data_size,
        job.size,
        job.torn,
        job.run_json,
        job.tripwire,
        job.tripwire_first,
        job.fsync,
    )


def job_of(w: tuple[Any, ...]) -> Job:
    """A job as the child writes it: its disk fields (no lines, no disk state: write_job reads neither)."""
    d, make_dir, data, data_size, size, torn, run_json, tripwire, tripwire_first, fsync = w
    return Job(
        run_id="",
        dir=d,
        make_dir=make_dir,
        lines=[],
        data=[data] if data else [],
        data_size=data_size,
        after=cast(Any, None),
        size=size,
        torn=torn,
        run_json=run_json,
        tripwire=tripwire,
        tripwire_first=tripwire_first,
        fsync=fsync,
    )


def result_wire(r: JobResult) -> tuple[Any, ...]:
    return (r.dir_made, r.size, r.torn, r.lines_ok, r.tripwire_ok, r.run_json_ok, r.errno, r.errors)


def result_of(run_id: str, w: tuple[Any, ...]) -> JobResult:
    dir_made, size, torn, lines_ok, tripwire_ok, run_json_ok, errno_, errors = w
    return JobResult(run_id, dir_made, size, torn, lines_ok, tripwire_ok, run_json_ok, errno_, list(errors))


def frame(value: Any) -> bytes:
    """A value as one frame."""
    body = marshal.dumps(value)
    return HEADER.pack(len(body)) + body


def pass_frame(group_sync: bool, jobs: list[Job]) -> bytes:
    """A writer pass as one frame. A run's JSON holding what marshal refuses (a str subclass, an
    enum, a datetime: orjson encodes them) goes as orjson's reading of orjson's encoding of it, which
    orjson encodes to the same bytes; what orjson cannot encode raises TypeError here (the caller
    writes that pass on the loop, where the write fails and is reported as it always was)."""
    wires = [job_wire(job) for job in jobs]
    try:
        return frame((group_sync, wires))
    except ValueError:
        for i, w in enumerate(wires):
            run_json, tripwire = w[6], w[7]
            wires[i] = (*w[:6], _plain(run_json), _plain(tripwire), *w[8:])
        return frame((group_sync, wires))


def _plain(d: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if d is None else orjson.loads(orjson.dumps(d))


def unframe(body: bytes) -> Any:
    return marshal.loads(body)


def _read_exactly(fd: int, n: int) -> bytes | None:
    """n bytes from fd, None at EOF before them (a pass cut short is dropped whole)."""
    parts = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        n -= len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


READY = "ready"  # the child's first frame: imported and reading (the parent writes on the loop until then)


def serve(fd_in: int, fd_out: int) -> int:
    """Say READY, then write passes from fd_in until EOF; answer on fd_out while someone reads.
    Returns the passes."""
    passes = 0
    answering = True
    try:
        _write_all(fd_out, frame(READY))
    except OSError:
        answering = False
    while True:
        head = _read_exactly(fd_in, HEADER.size)
        if head is None:
            return passes
        (size,) = HEADER.unpack(head)
        body = _read_exactly(fd_in, size)
        if body is None:
            return passes
        group_sync, wires = unframe(body)
        results = write_jobs([job_of(w) for w in wires], group_sync=group_sync)
        passes += 1
        if answering:
            try:
                _write_all(fd_out, frame([result_wire(r) for r in results]))
            except OSError:  # the parent is gone (EPIPE): go on writing what it sent
                answering = False


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    serve(sys.stdin.fileno(), sys.stdout.fileno())


if __name__ == "__main__":
    main()
