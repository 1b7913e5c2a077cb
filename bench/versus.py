"""Two trees of Tripwire side by side in ONE run: one fake upstream and one redis-server, four
`tripwire serve` processes (each tree's code, embedded and with `--state`), c=1 calls in rotating
batches so a neighbour's load hits every process alike; per process the p50 / p90 latency and its
CPU per call (/proc utime + stime: 10 ms ticks, so ~10% on a few thousand calls).

    .venv/bin/python -m bench.versus /path/to/main /path/to/branch [--rounds 16 --batch 200]

Each process runs from its tree with PYTHONPATH set to it; the interpreter is this one's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from bench import bodies, procs
from bench.client import Connection, request_bytes

PATH = "/v1/chat/completions"
SESSION = {"X-Tripwire-Session": "bench"}


async def serve(
    name: str, tree: Path, up: int, state: str | None
) -> tuple[str, int, asyncio.subprocess.Process]:
    port, admin = procs.free_port(), procs.free_port()
    tmp = tempfile.mkdtemp(prefix="tripwire-versus-")
    argv = [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{port}"]
    argv += ["--admin-listen", f"127.0.0.1:{admin}", "--upstream", f"http://127.0.0.1:{up}"]
    argv += ["--data-dir", tmp, "--log-level", "WARNING", *(["--state", state] if state else [])]
    log = open(Path(tempfile.gettempdir()) / f"tripwire-versus-{name}.log", "wb")  # noqa: ASYNC230
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=str(tree),
        stdout=log,
        stderr=log,
        stdin=asyncio.subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(tree), "HOME": tmp},
    )
    log.close()
    await procs.wait_listening(port, proc)
    return name, port, proc


async def run(trees: dict[str, Path], rounds: int, batch: int) -> None:
    up = await procs.upstream()
    redis = await procs.redis_server()
    targets = []
    try:
        for label, tree in trees.items():
            targets.append(await serve(label, tree, up.port, None))
            db = len(targets)
            targets.append(
                await serve(f"{label}-redis", tree, up.port, f"redis://127.0.0.1:{redis.port}/{db}")
            )
        body = bodies.encoded(bodies.SMALL)
        latency: dict[str, list[float]] = {t[0]: [] for t in targets}
        cpu: dict[str, float] = dict.fromkeys(latency, 0.0)
        conns: dict[str, Connection] = {}
        for name, port, _ in targets:
            conns[name] = Connection(port)
            await conns[name].open()
            for _ in range(50):  # warm
                await conns[name].send(request_bytes(port, PATH, body, SESSION))
        for r in range(rounds):
            for name, port, proc in targets[r % len(targets) :] + targets[: r % len(targets)]:
                raw = request_bytes(port, PATH, body, SESSION)
                before = procs.cpu_seconds(proc.pid)
                for _ in range(batch):
                    t0 = time.perf_counter()
                    answer = await conns[name].send(raw)
                    latency[name].append(time.perf_counter() - t0)
                    if answer.status != 200:
                        raise RuntimeError(f"{name} answered {answer.status}")
                cpu[name] += procs.cpu_seconds(proc.pid) - before
        for name, *_ in targets:
            xs = sorted(latency[name])
            p50, p90 = xs[len(xs) // 2] * 1000, xs[int(len(xs) * 0.9)] * 1000
            print(
                f"{name:16s} c=1 p50 {p50:7.3f} ms  p90 {p90:7.3f} ms  CPU {cpu[name] / len(xs) * 1e6:6.0f} us/call"
            )
        print("load average", os.getloadavg())
    finally:
        for _, _, proc in targets:
            proc.terminate()
            await proc.wait()
        await up.stop()
        await redis.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--batch", type=int, default=200)
    args = ap.parse_args()
    trees = {args.a.resolve().name or "a": args.a.resolve(), args.b.resolve().name or "b": args.b.resolve()}
    if len(trees) < 2:
        trees = {"a": args.a.resolve(), "b": args.b.resolve()}
    asyncio.run(run(trees, args.rounds, args.batch))


if __name__ == "__main__":
    main()
