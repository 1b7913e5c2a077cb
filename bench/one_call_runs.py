"""Many one-call runs live at once, then their expiry (issue 33): RSS, and the CPU the expiry costs.

    .venv/bin/python -m bench.one_call_runs                     # 100,000 runs, 300 s idle timeout
    .venv/bin/python -m bench.one_call_runs --runs 20000 --idle-timeout 60 --base /work/main

`tripwire serve` (defaults, a fresh data dir under `--data-root`, /dev/shm by default so that the
disk's own cost of creating 300,000 files is not what is measured) takes `--runs` unnamed calls,
each a different conversation's first request: one run each (SPEC §3), all live until the idle
timeout (`--workload identical`: every call the same bytes, so every run gives the same answer
to the same words, as an evaluation batch). Then:
- RSS once every call is answered and the writer has settled (and per run, over the RSS before);
- the expiry: the process's CPU from the first run's idle deadline until every run has ended and
  its RUN_END, run.json and tripwire.json are written, less what the idle process uses over as
  long (measured just before); `sweep_cpu_s` is that part of it spent ending runs in memory, as
  reported by the process (`sweep_cpu_s` in /healthz's sessions when the code has it);
- every run's directory is counted: each must hold events.jsonl, run.json and tripwire.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench import bodies, procs, runs
from bench.client import Connection, request_bytes


async def get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    return data.split(b"\r\n\r\n", 1)[1]


async def live_sessions(admin: int) -> int:
    for line in (await get(admin, "/metrics")).decode().splitlines():
        if line.startswith("tripwire_live_sessions "):
            return int(float(line.split()[1]))
    raise RuntimeError("no tripwire_live_sessions in /metrics")


async def trace_settled(admin: int, *, ended: bool = False) -> bool:
    """Every event queued is written (live runs' run.json rewrites may wait their turn, up to a
    second per 100 runs held); `ended`: and no run is held in memory (every run ended, written)."""
    trace = json.loads(await get(admin, "/healthz")).get("trace_store") or {}
    busy = ("queue_depth", "pending_runs", *(("held_runs",) if ended else ()))
    return not any(trace.get(key) for key in busy)


async def settle(admin: int, *, ended: bool = False, limit_s: float = 3600) -> None:
    for _ in range(int(limit_s * 4)):
        if (not ended or await live_sessions(admin) == 0) and await trace_settled(admin, ended=ended):
            return
        await asyncio.sleep(0.25)
    raise RuntimeError("the trace did not settle")


async def send(port: int, n: int, conns: int, tag: str, identical: bool = False) -> float:
    counter = iter(range(n))
    same = request_bytes(port, runs.PATH, bodies.encoded(bodies.SMALL))

    async def worker() -> None:
        conn = Connection(port)
        try:
            for i in counter:
                a = await conn.send(
                    same if identical else request_bytes(port, runs.PATH, runs.distinct_body(tag, i))
                )
                if a.status != 200:
                    raise RuntimeError(f"call {i} answered {a.status}")
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conns)))
    return time.perf_counter() - t0


def count_runs(data_dir: Path) -> dict[str, int]:
    complete = partial = 0
    for entry in os.scandir(data_dir / "runs"):
        names = set(os.listdir(entry.path))
        if {"events.jsonl", "run.json", "tripwire.json"} <= names:
            complete += 1
        else:
            partial += 1
    return {"complete": complete, "partial": partial}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    up = await procs.upstream()
    extra = ("--session-idle-timeout", str(args.idle_timeout))
    tw = await procs.tripwire("one-call-runs", up.port, extra=extra, root=args.base, data_root=args.data_root)
    assert tw.pid is not None and tw.admin_port is not None and tw.tmp is not None
    out: dict[str, Any] = {
        "runs": args.runs,
        "idle_timeout_s": args.idle_timeout,
        "base": str(args.base or ""),
    }
    try:
        await send(tw.port, 50, 4, "warm")
        await asyncio.sleep(1.0)
        rss0 = procs.rss_kb(tw.pid)
        t_start = time.monotonic()
        wall = await send(tw.port, args.runs, args.conns, "run", identical=args.workload == "identical")
        out["send_s"] = round(wall, 1)
        out["calls_per_s"] = round(args.runs / wall)
        await settle(tw.admin_port)
        rss = procs.rss_kb(tw.pid)
        live = await live_sessions(tw.admin_port)
        out.update(
            rss_before_mb=round(rss0 / 1024, 1),
            rss_mb=round(rss / 1024, 1),
            kb_per_run=round((rss - rss0) / args.runs, 2),
            live_after_send=live,
            all_live=live >= args.runs,
        )
        print(f"  {args.runs} runs in {wall:.1f} s; RSS {rss / 1024:.1f} MB, {live} live", file=sys.stderr)
        # the idle process's own CPU (sweeps, timers), then the expiry's
        first_due = t_start + args.idle_timeout
        quiet = max(0.0, min(args.quiet_s, first_due - time.monotonic() - 1.0))
        cpu0 = procs.cpu_seconds(tw.pid)
        await asyncio.sleep(quiet)
        idle_rate = (procs.cpu_seconds(tw.pid) - cpu0) / quiet if quiet else 0.0
        await asyncio.sleep(max(0.0, first_due - time.monotonic() - 0.5))
        cpu_start, t0 = procs.cpu_seconds(tw.pid), time.monotonic()
        kids_start = procs.children_cpu_seconds(tw.pid)  # the trace writer's disk process
        await settle(tw.admin_port, ended=True)
        took = time.monotonic() - t0
        spent = procs.cpu_seconds(tw.pid) - cpu_start
        out["expiry_child_cpu_s"] = round(procs.children_cpu_seconds(tw.pid) - kids_start, 2)
        out.update(
            idle_cpu_per_s=round(idle_rate, 4),
            expiry_wall_s=round(took, 1),
            expiry_cpu_s=round(spent - idle_rate * took, 2),
            expiry_cpu_raw_s=round(spent, 2),
        )
        health = json.loads(await get(tw.admin_port, "/healthz"))
        sweep = (health.get("sessions") or {}).get("sweep_cpu_s")
        out["sweep_cpu_s"] = sweep
        out["files"] = count_runs(Path(tw.tmp.name))
    finally:
        await tw.stop()
        await up.stop()
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench.one_call_runs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--idle-timeout", type=float, default=300.0)
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument(
        "--workload",
        choices=("distinct", "identical"),
        default="distinct",
        help="every call a different first request, or every call the same bytes (an evaluation batch)",
    )
    ap.add_argument("--quiet-s", type=float, default=5.0, help="seconds of the idle process measured")
    ap.add_argument("--data-root", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument("--base", type=Path, help="run another checkout's code instead")
    ap.add_argument("--out", type=Path, default=Path("bench-one-call-runs.json"))
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    result = asyncio.run(measure(args))
    print(json.dumps(result, indent=2))
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
