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
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.app import make_proxy_app  # noqa: E402
from proxy.engine import Engine  # noqa: E402
from proxy.settings import Settings  # noqa: E402
from tests.fakes import FakeUpstream, Reply  # noqa: E402

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


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()

    fake = FakeUpstream(default=Reply(text="A fine answer of moderate length. " * 8))
    upstream = TestServer(fake.app, host="127.0.0.1")
    await upstream.start_server()
    up_url = str(upstream.make_url("")).rstrip("/")
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings.model_validate({"data_dir": tmp, "upstream": {"url": up_url}})
        engine = Engine(settings, argv=["bench"])
        await engine.start()
        proxy = TestServer(make_proxy_app(engine), host="127.0.0.1")
        await proxy.start_server()
        px_url = str(proxy.make_url("")).rstrip("/")
        results = {}
        for stream in (False, True):
            for name, base in (("direct", up_url), ("tripwire", px_url)):
                await load(base + "/v1/chat/completions", 100, args.concurrency, stream)  # warm-up
                results[(stream, name)] = await load(
                    base + "/v1/chat/completions", args.requests, args.concurrency, stream
                )
        await engine.recorder.flush()
        await proxy.close()
        await engine.close()
    await upstream.close()

    print(
        f"machine: {platform.machine()} {platform.processor() or ''} cpus={os.cpu_count()} python={platform.python_version()}"
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
