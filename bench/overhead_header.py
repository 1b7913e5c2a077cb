"""What `x-tripwire-overhead-ms` costs (issue 32 item 7): this tree's `tripwire serve` against another
tree's (default /work/main, without the header) in one run, on the same fake upstream, in
alternating rounds so a neighbour's load hits both alike.

    .venv/bin/python -m bench.overhead_header [--base /work/main] [--rounds 8] [--batch 300]

Per column: c=1 p50 of a small chat call (the raw client, bench/client.py) and, at c=32, the
process's CPU per call; and the header's cost in this process (`Exchange.overhead_ms` plus the
header set, timed over 200,000 calls).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

from multidict import CIMultiDict

from bench import bodies, procs
from bench.client import concurrent, request_bytes, sequential

PATH = "/v1/chat/completions"


async def tripwire_from(tree: Path, name: str, up: int) -> procs.Target:
    """`tripwire serve` with the code of `tree` (its own cwd and PYTHONPATH), fresh data dir."""
    port, admin = procs.free_port(), procs.free_port()
    tmp = tempfile.TemporaryDirectory(prefix="tripwire-bench-")
    argv = [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{port}"]
    argv += ["--admin-listen", f"127.0.0.1:{admin}", "--upstream", f"http://127.0.0.1:{up}"]
    argv += ["--data-dir", tmp.name, "--log-level", "WARNING"]
    env = {**procs.os.environ, "HOME": tmp.name, "PYTHONPATH": str(tree)}
    log = open(Path(tempfile.gettempdir()) / f"tripwire-bench-{name}-{port}.log", "wb")  # noqa: ASYNC230
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=str(tree), stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL, env=env
    )
    log.close()
    target = procs.Target(name, port, proc, tmp=tmp)
    await procs.wait_listening(port, proc)
    return target


def header_cost_us(n: int = 200_000) -> float:
    """The header's work per answer, in this process: the value computed and set on the headers."""
    from proxy.constants import OVERHEAD_HEADER
    from proxy.exchange import Exchange
    from proxy.routing import Route

    ex = Exchange(None, Route("llm", "default", "", "bench", None, ""), b"", time.monotonic(), time.time())  # type: ignore[arg-type]
    ex.upstream_started, ex.first_byte_at = ex.started + 0.001, ex.started + 0.002
    headers: CIMultiDict[str] = CIMultiDict({"Content-Type": "application/json"})

    def once() -> None:
        headers[OVERHEAD_HEADER] = ex.overhead_ms(time.monotonic())

    return min(timeit.repeat(once, number=n, repeat=3)) / n * 1e6


async def run(args: argparse.Namespace) -> dict[str, object]:
    up = await procs.upstream()
    columns = [
        await tripwire_from(args.base, "base", up.port),
        await tripwire_from(procs.ROOT, "this", up.port),
    ]
    try:
        body = bodies.encoded(bodies.SMALL)
        raws = {t.name: request_bytes(t.port, PATH, body) for t in columns}
        for t in columns:  # warm up
            (answer,) = await sequential(t.port, raws[t.name], 1)
            assert answer.status == 200, (t.name, answer.status)
        p50: dict[str, list[float]] = {t.name: [] for t in columns}
        cpu: dict[str, list[float]] = {t.name: [] for t in columns}
        for r in range(args.rounds):
            for t in columns if r % 2 == 0 else list(reversed(columns)):
                answers = await sequential(t.port, raws[t.name], args.batch)
                p50[t.name].append(statistics.median(a.total_s for a in answers) * 1000)
                assert t.pid is not None
                before = procs.cpu_seconds(t.pid)
                got, _ = await concurrent(t.port, [raws[t.name]] * args.batch * 4, 32)
                assert all(a.status == 200 for a in got), (t.name, {a.status for a in got})
                cpu[t.name].append((procs.cpu_seconds(t.pid) - before) / len(got) * 1e6)
        return {
            "c1_p50_ms": {k: round(statistics.median(v), 3) for k, v in p50.items()},
            "c32_cpu_us_per_call": {k: round(statistics.median(v), 1) for k, v in cpu.items()},
            "header_cost_us_in_process": round(header_cost_us(), 3),
            "rounds": args.rounds,
            "batch": args.batch,
        }
    finally:
        for t in [*columns, up]:
            await t.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.overhead_header", description=__doc__)
    ap.add_argument("--base", type=Path, default=Path("/work/main"), help="the tree to compare against")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--batch", type=int, default=300)
    result = asyncio.run(run(ap.parse_args(argv)))
    for key, value in result.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
