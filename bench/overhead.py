"""Proxy overhead benchmark: the same requests direct to a fake upstream and through Tripwire,
side by side in one run, on 127.0.0.1.

    .venv/bin/python bench/overhead.py [--requests 2000] [--concurrency 16]

Measures non-streamed chat completions (parse + record) and streamed ones (time to first chunk and
to the end of the stream). The fake upstream, Tripwire and the load generator share the machine,
so absolute numbers are the machine's; the difference between the columns is the proxy's cost.
Results and the machine they came from: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

BODY = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant. " * 20},
        {"role": "user", "content": "Summarise the plot of a long novel in three sentences."},
    ],
}


async def one(http: aiohttp.ClientSession, url: str, stream: bool) -> tuple[float, float]:
    body = dict(BODY, stream=stream)
    t0 = time.perf_counter()
    first = None
    async with http.post(url, json=body, headers={"Authorization": "Bearer sk-bench"}) as r:
        async for _ in r.content.iter_any():
            if first is None:
                first = time.perf_counter()
        assert r.status == 200, r.status
    end = time.perf_counter()
    return (first or end) - t0, end - t0


async def load(url: str, n: int, concurrency: int, stream: bool) -> dict[str, float]:
    ttfb: list[float] = []
    total: list[float] = []
    queue = iter(range(n))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:

        async def worker() -> None:
            for _ in queue:
                a, b = await one(http, url, stream)
                ttfb.append(a)
                total.append(b)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0

    def pct(xs: list[float], p: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000

    return {
        "rps": n / wall,
        "p50_ms": pct(total, 0.50),
        "p99_ms": pct(total, 0.99),
        "mean_ms": statistics.fmean(total) * 1000,
        "ttfb_p50_ms": pct(ttfb, 0.50),
    }


ROOT = str(Path(__file__).resolve().parents[1])
FAKE_UPSTREAM = """
import sys
from aiohttp import web
sys.path.insert(0, {root!r})
from tests.fakes import FakeUpstream, Reply
fake = FakeUpstream(default=Reply(text="A fine answer of moderate length. " * 8))
web.run_app(fake.app, host="127.0.0.1", port={port}, print=None, access_log=None)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_listening(port: int) -> None:
    for _ in range(300):
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    root = ROOT
    up_port, px_port, admin_port = free_port(), free_port(), free_port()
    # Three processes, as in real use: the fake upstream, Tripwire, and this load generator.
    upstream = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FAKE_UPSTREAM.format(root=root, port=up_port)
    )
    with tempfile.TemporaryDirectory() as tmp:
        proxy = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "proxy",
            "serve",
            "--listen",
            f"127.0.0.1:{px_port}",
            "--admin-listen",
            f"127.0.0.1:{admin_port}",
            "--upstream",
            f"http://127.0.0.1:{up_port}",
            "--data-dir",
            tmp,
            "--log-level",
            "WARNING",
            cwd=root,
            stdout=asyncio.subprocess.DEVNULL,
        )
        try:
            await wait_listening(up_port)
            await wait_listening(px_port)
            results = {}
            for stream in (False, True):
                for name, port in (("direct", up_port), ("tripwire", px_port)):
                    url = f"http://127.0.0.1:{port}/v1/chat/completions"
                    await load(url, 100, args.concurrency, stream)  # warm-up
                    results[(stream, name)] = await load(url, args.requests, args.concurrency, stream)
        finally:
            for p in (proxy, upstream):
                p.terminate()
                await p.wait()

    print(
        f"machine: {platform.machine()} cpus={os.cpu_count()} python={platform.python_version()} {platform.platform()}"
    )
    print(f"requests={args.requests} concurrency={args.concurrency}")
    print(f"{'mode':<10}{'path':<10}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}{'ttfb p50':>10}")
    for (stream, name), r in results.items():
        mode = "stream" if stream else "json"
        print(
            f"{mode:<10}{name:<10}{r['rps']:>9.0f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}{r['mean_ms']:>9.2f}{r['ttfb_p50_ms']:>10.2f}"
        )
    for stream in (False, True):
        d, t = results[(stream, "direct")], results[(stream, "tripwire")]
        mode = "stream" if stream else "json"
        print(
            f"{mode}: added p50 {t['p50_ms'] - d['p50_ms']:.2f} ms, mean {t['mean_ms'] - d['mean_ms']:.2f} ms per request"
        )
    print(json.dumps({f"{'stream' if s else 'json'}_{n}": r for (s, n), r in results.items()}))


if __name__ == "__main__":
    asyncio.run(main())
