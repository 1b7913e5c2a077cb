"""What the filesystem under a data dir charges for the operations a run makes (issue 33).

    .venv/bin/python -m bench.fs_costs [--dir /tmp] [--n 1000]

A run is a directory and three files (events.jsonl, run.json, tripwire.json; the two JSON files
replaced atomically through a temp file), fsynced when it ends under the default policy. On some
disks making a file costs far more than writing one: this prints the CPU (user + system, this
process) and wall time of each operation, so the benchmark's run columns can be read against it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable


def timed(n: int, fn: Callable[[int], None]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6


def measure(root: str, n: int) -> dict[str, tuple[float, float]]:
    base = tempfile.mkdtemp(prefix="tripwire-fs-", dir=root)
    ids = [str(uuid.uuid4()) for _ in range(n)]
    fds: list[int] = []

    def create(i: int) -> None:
        fd = os.open(f"{base}/{ids[i]}/events.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, b"x" * 600)
        os.close(fd)

    def append(i: int) -> None:
        fd = os.open(f"{base}/{ids[i]}/events.jsonl", os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"x" * 600)
        os.close(fd)

    def replace(i: int) -> None:
        tmp = f"{base}/{ids[i]}/run.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"{}" * 150)
        os.close(fd)
        os.replace(tmp, f"{base}/{ids[i]}/run.json")

    def rename(i: int) -> None:
        os.rename(f"{base}/{ids[i]}/run.json", f"{base}/{ids[i]}/r.json")

    def fsync(i: int) -> None:
        fd = os.open(f"{base}/{ids[i]}/events.jsonl", os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"y")
        os.fsync(fd)
        fds.append(fd)

    try:
        out = {
            "mkdir": timed(n, lambda i: os.mkdir(f"{base}/{ids[i]}")),
            "create a file (open O_CREAT, write, close)": timed(n, create),
            "append to a file that exists": timed(n, append),
            "atomic replace (new temp file, write, rename)": timed(n, replace),
            "rename": timed(n, rename),
            "fsync a file": timed(min(n, 200), fsync),
        }
        for fd in fds:
            os.close(fd)
        for i in range(n):
            append(i)
        cpu, wall = time.process_time(), time.perf_counter()
        os.sync()
        out[f"one sync() after {n} appends"] = (
            (time.process_time() - cpu) * 1e6,
            (time.perf_counter() - wall) * 1e6,
        )
        return out
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fs_costs", description=__doc__)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="a directory on the filesystem to measure")
    ap.add_argument("--n", type=int, default=1000)
    args = ap.parse_args()
    print(f"{args.dir}: CPU us / wall us per operation ({args.n} each)")
    for name, (cpu, wall) in measure(args.dir, args.n).items():
        print(f"  {name:<48}{cpu:>10.1f}{wall:>10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
