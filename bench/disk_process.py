"""The trace writer's disk process alone (issue 33, "Third round"): the event loop's CPU per new run
written in the child (`trace_writer: process`) against written on the loop (`loop`), by batch size.

    .venv/bin/python -m bench.disk_process [--dir /tmp] [--runs 2000] [--batches 1,4,16,64] [--kind append]

Each job is a new run's first pass as a stateless service makes it: its folder, three event lines
(~3 KB), tripwire.json with the default guard config and run.json. `loop` is `write_job` of each,
as the writer does on the loop; `process-N` sends N jobs a pass to a `DiskProcess` and awaits the
answer. `--kind append`: each job is a live run's next line only (what the writer keeps on the loop,
`_lines_only`), to see whether sending those too would pay. Printed: this process's CPU per run (process_time: the loop's cost), the child's CPU per run
(/proc), and the wall time per run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
import uuid
from typing import Any

from proxy.settings import Settings
from proxy.trace.disk_process import DiskProcess
from proxy.trace.jobs import Job, write_job


def child_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def append_job(base: str) -> Job:
    """A live run's next line: its folder and file exist, nothing else due."""
    run_id = str(uuid.uuid4())
    os.makedirs(f"{base}/{run_id}")
    line = b'{"event_type":"LLM_CALL","payload":{"prompt":"' + b"p" * 600 + b'"}}\n'
    return Job(
        run_id=run_id,
        dir=f"{base}/{run_id}",
        make_dir=False,
        lines=[],
        data=[line],
        data_size=len(line),
        after=None,  # type: ignore[arg-type]
        size=0,
        torn=False,
        run_json=None,
        tripwire=None,
        tripwire_first=False,
        fsync=False,
    )


def make_job(base: str, guard_config: dict[str, Any]) -> Job:
    run_id = str(uuid.uuid4())
    lines = [b'{"event_type":"RUN_START","payload":{"x":"' + b"s" * 400 + b'"}}\n']
    lines.append(b'{"event_type":"LLM_CALL","payload":{"prompt":"' + b"p" * 2200 + b'"}}\n')
    lines.append(b'{"event_type":"STATE_UPDATE","payload":{"k":"' + b"v" * 200 + b'"}}\n')
    run_json = {
        "spec_version": "0.1",
        "run_id": run_id,
        "run_name": "a name of forty characters or so, scrubbed",
        "started_at": "2026-12-02T10:00:00.000Z",
        "ended_at": None,
        "duration_ms": None,
        "status": "running",
        "counts": {"llm_calls": 1, "tool_calls": 0, "errors": 0, "loop_warnings": 0},
        "last_event_ts": "2026-12-02T10:00:00.001Z",
    }
    tripwire = {"run_id": run_id, "agent": "default", "guard_config": guard_config, "tags": []}
    return Job(
        run_id=run_id,
        dir=f"{base}/{run_id}",
        make_dir=True,
        lines=[],
        data=lines,
        data_size=sum(map(len, lines)),
        after=None,  # type: ignore[arg-type]
        size=None,
        torn=False,
        run_json=run_json,
        tripwire=tripwire,
        tripwire_first=True,
        fsync=False,
    )


async def measure(
    root: str, runs: int, batches: list[int], kind: str = "new"
) -> dict[str, tuple[float, float, float]]:
    guard_config = Settings().guards.model_dump(mode="json")

    def make(d: str) -> Job:
        return append_job(d) if kind == "append" else make_job(d, guard_config)

    out: dict[str, tuple[float, float, float]] = {}
    base = tempfile.mkdtemp(prefix="tripwire-disk-process-", dir=root)
    try:
        os.makedirs(f"{base}/loop")
        jobs = [make(f"{base}/loop") for _ in range(runs)]
        cpu, wall = time.process_time(), time.perf_counter()
        for job in jobs:
            write_job(job)
        out["loop"] = (
            (time.process_time() - cpu) / runs * 1e6,
            0.0,
            (time.perf_counter() - wall) / runs * 1e6,
        )
        for n in batches:
            d = f"{base}/process-{n}"
            os.makedirs(d)
            jobs = [make(d) for _ in range(runs)]
            p = DiskProcess()
            await p.start()
            await p.write([], group_sync=False)  # the child is up and has imported what it needs
            c0, cpu, wall = child_cpu(p.pid), time.process_time(), time.perf_counter()
            for i in range(0, runs, n):
                await p.write(jobs[i : i + n], group_sync=False)
            per = (time.process_time() - cpu) / runs * 1e6
            child = (child_cpu(p.pid) - c0) / runs * 1e6
            out[f"process-{n}"] = (per, child, (time.perf_counter() - wall) / runs * 1e6)
            await p.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.disk_process", description=__doc__)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--kind", choices=["new", "append"], default="new")
    a = ap.parse_args()
    res = asyncio.run(measure(a.dir, a.runs, [int(x) for x in a.batches.split(",")], a.kind))
    print(f"{a.dir}, {a.runs} jobs ({a.kind}): us per job   loop CPU   child CPU   wall")
    for name, (loop_cpu, child, wall) in res.items():
        print(f"  {name:<12}{loop_cpu:>12.1f}{child:>12.1f}{wall:>8.1f}")


if __name__ == "__main__":
    main()
