"""What a one-call run holds in memory while it waits for its idle timeout (issue 33), by object.

    .venv/bin/python -m bench.run_memory --runs 5000                      # this checkout
    .venv/bin/python -m bench.run_memory --runs 5000 --base /work/main    # and main's, side by side

The real server (`tripwire serve`, defaults, a fresh data dir on tmpfs) runs under tracemalloc
(bench/traced_serve.py). After a warm-up, a snapshot; then `--runs` unnamed calls, each a different
conversation's first request (one run each, all live: the idle timeout is an hour); once the trace
has settled, another snapshot. What the second holds more than the first, per run, is put down to
the innermost frame of Tripwire's own code that allocated it (a dataclass's generated __init__, a
Counter, a deque: the line of proxy/ that made them), and summed by module.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
import tracemalloc
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import procs
from bench.one_call_runs import get, send, settle

SCRIPT = Path(__file__).resolve().parent / "traced_serve.py"


async def snapshot(target: procs.Target, out: str, n: int) -> tracemalloc.Snapshot:
    assert target.pid is not None and target.admin_port is not None
    path = f"{out}.{n}"
    os.kill(target.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 600
    while not os.path.exists(path):  # noqa: ASYNC240 (a bench, polling its own file)
        if time.monotonic() > deadline:
            raise RuntimeError("no snapshot")
        await get(target.admin_port, "/healthz")  # (a signal is handled when Python code runs)
        await asyncio.sleep(0.2)
    snap = tracemalloc.Snapshot.load(path)
    os.unlink(path)
    return snap


def site(traceback: tracemalloc.Traceback, roots: tuple[str, ...]) -> tuple[str, str]:
    """(module, file:line) of the innermost frame in Tripwire's code."""
    frames = list(reversed(traceback))  # (a Traceback lists the oldest frame first)
    for frame in frames:
        for root in roots:
            if frame.filename.startswith(root):
                rel = frame.filename[len(root) :].lstrip("/")
                return rel, f"{rel}:{frame.lineno}"
    f = frames[0]
    return "(other) " + f.filename.rsplit("/", 2)[-1], f"{f.filename}:{f.lineno}"


def split(
    before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, runs: int, roots: tuple[str, ...]
) -> dict[str, Any]:
    by_module: dict[str, float] = defaultdict(float)
    by_site: dict[str, float] = defaultdict(float)
    total = 0.0
    for d in after.compare_to(before, "traceback"):
        module, where = site(d.traceback, roots)
        by_module[module] += d.size_diff
        by_site[where] += d.size_diff
        total += d.size_diff
    return {
        "bytes_per_run": round(total / runs),
        "modules": {
            k: round(v / runs)
            for k, v in sorted(by_module.items(), key=lambda kv: -kv[1])
            if abs(v) / runs >= 8
        },
        "sites": {k: round(v / runs) for k, v in sorted(by_site.items(), key=lambda kv: -kv[1])[:40]},
    }


async def measure(root: Path | None, runs: int, data_root: str | None, conns: int) -> dict[str, Any]:
    checkout = root or procs.ROOT
    roots = (str(checkout.resolve()) + "/proxy",)
    up = await procs.upstream()
    out = tempfile.mktemp(prefix="tripwire-snap-", dir=data_root)
    port, admin = procs.free_port(), procs.free_port()
    tmp = tempfile.TemporaryDirectory(prefix="tripwire-bench-", dir=data_root)
    try:
        tw = await procs._spawn(
            "run-memory",
            port,
            sys.executable,
            str(SCRIPT),
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--admin-listen",
            f"127.0.0.1:{admin}",
            "--upstream",
            f"http://127.0.0.1:{up.port}",
            "--data-dir",
            tmp.name,
            "--log-level",
            "WARNING",
            "--session-idle-timeout",
            "3600",
            env={"HOME": tmp.name, "PYTHONPATH": str(checkout), "TRIPWIRE_TRACE_OUT": out},
            cwd=checkout,
            tmp=tmp,
        )
    except BaseException:
        await up.stop()  # (the server never came up: the upstream goes too)
        raise
    tw.admin_port = admin
    try:
        await send(port, 200, 4, "warm")
        await settle(admin)
        before = await snapshot(tw, out, 0)
        await send(port, runs, conns, "run")
        await settle(admin)
        after = await snapshot(tw, out, 1)
        return split(before, after, runs, roots)
    finally:
        await tw.stop()
        await up.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run_memory", description=__doc__)
    ap.add_argument("--runs", type=int, default=5000)
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--base", type=Path, help="also measure another checkout's code (e.g. /work/main)")
    ap.add_argument("--data-root", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = ap.parse_args(argv)
    columns = [("this", None), *((("base", args.base),) if args.base else ())]
    for name, root in columns:
        result = asyncio.run(measure(root, args.runs, args.data_root, args.conns))
        print(f"== {name} ({root or procs.ROOT}): {result['bytes_per_run']} bytes per run")
        print("   by module:")
        for k, v in result["modules"].items():
            print(f"     {v:7d}  {k}")
        print("   by site (top 40):")
        for k, v in result["sites"].items():
            print(f"     {v:7d}  {k}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
