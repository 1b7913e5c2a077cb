"""A new run's files under load (issue 33, "A new run's files"): c=32 unnamed distinct calls, each a
new run, while /healthz's trace_store is polled: how deep the writer's queue gets, how long the
writer goes without a pass, whether it drops anything, and how long it takes to catch up after.

    .venv/bin/python -m bench.new_runs --base /work/main            # this checkout and main's, on disk
    .venv/bin/python -m bench.new_runs --base /work/main --data-root /dev/shm

Each column is its own `tripwire serve` with a fresh data dir, the columns rotating per round
(`--base` again: more checkouts, columns base1, base2, ...).
CPU per call is split by thread (/proc/PID/task): the loop's (the main thread) and the others'
(the trace writer's own thread, the loop's default executor).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench import procs
from bench.runs import wrk, wrk_script


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each of the process's threads: "loop" (the main thread) and
    "threads" (all the others: the trace writer's, the loop's default executor, ...)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        name = "loop" if int(tid) == pid else "threads"
        fields = rest.split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


async def healthz(http: aiohttp.ClientSession, port: int) -> dict[str, Any]:
    async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
        return dict(orjson.loads(await r.read())["trace_store"])


async def cell(t: procs.Target, tmp: Path, tag: str, seconds: int, conns: int) -> dict[str, Any]:
    assert t.pid is not None and t.admin_port is not None
    port = t.admin_port
    http = aiohttp.ClientSession()
    depths: list[int] = []
    stalled: list[float] = []
    before = thread_cpu(t.pid)
    kids = procs.children_cpu_seconds(t.pid)  # the trace writer's disk process (trace_writer: process)
    passes = int((await healthz(http, port))["writer_passes"])
    done = asyncio.Event()

    async def poll() -> None:
        while not done.is_set():
            h = await healthz(http, port)
            depths.append(int(h["queue_depth"]))
            stalled.append(float(h["writer_stalled_for_s"]))
            await asyncio.sleep(0.05)

    poller = asyncio.create_task(poll())
    found = await wrk(t.port, wrk_script(tmp, "distinct", tag), seconds, conns)
    done.set()
    await poller
    ended = time.monotonic()
    while True:  # the writer catching up: every queued event written
        h = await healthz(http, port)
        if not h["queue_depth"] and not h["pending_runs"]:
            break
        await asyncio.sleep(0.01)
    catch_up = time.monotonic() - ended
    after = thread_cpu(t.pid)
    kids = procs.children_cpu_seconds(t.pid) - kids
    await http.close()
    calls = max(1.0, found["requests"])
    per = {name: (after[name] - before.get(name, 0.0)) / calls * 1e6 for name in after}
    loop_us, threads_us = per.get("loop", 0.0), per.get("threads", 0.0)
    return {
        "rps": found["rps"],
        "loop_cpu_us": loop_us,
        "threads_cpu_us": threads_us,
        "all_cpu_us": sum(per.values()),
        "child_cpu_us": kids / calls * 1e6,
        "calls_per_pass": calls / max(1, int(h["writer_passes"]) - passes),
        "depth_max": max(depths, default=0),
        "depth_p50": statistics.median(depths) if depths else 0,
        "stalled_max_s": max(stalled, default=0.0),
        "catch_up_s": catch_up,
        "dropped": int(h["dropped_events"]),
        "errors": int(h["write_errors"]),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    up = await procs.upstream()
    roots: dict[str, Path | None] = {"tripwire": None}
    for i, base in enumerate(args.base or []):
        roots["base" if i == 0 else f"base{i}"] = base
    columns = list(roots)
    started: dict[str, procs.Target] = {}
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in columns}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        try:
            for c in columns:
                started[c] = await procs.tripwire(c, up.port, root=roots[c], data_root=args.data_root)
            for r in range(args.rounds):
                order = columns[r % len(columns) :] + columns[: r % len(columns)]
                for c in order:
                    res = await cell(started[c], tmp, f"{c}{r}", args.seconds, args.conns)
                    results[c].append(res)
                    print(
                        f"  {c:<9} round {r}: " + " ".join(f"{k}={v:.4g}" for k, v in res.items()),
                        file=sys.stderr,
                    )
        finally:
            for t in started.values():
                await t.stop()
            await up.stop()
    summary = {
        c: {k: round(statistics.median(x[k] for x in xs), 4) for k in xs[0]}
        for c, xs in results.items()
        if xs
    }
    return {"load": os.getloadavg(), "data_root": args.data_root or tempfile.gettempdir(), "median": summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--base",
        type=Path,
        action="append",
        help="another checkout's `tripwire serve` beside this one (repeatable)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--conns", type=int, default=32)
    ap.add_argument("--data-root", default=None, help="where the data dirs go (default: the temp dir)")
    args = ap.parse_args()
    out = asyncio.run(main_async(args))
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
