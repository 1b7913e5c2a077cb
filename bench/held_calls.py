"""What held calls cost (SPEC §5.5a, issue 23 acceptance 6): N calls held for a person at once.

    .venv/bin/python -m bench.held_calls            # 100 held calls, a 10 s idle window
    .venv/bin/python -m bench.held_calls --calls 1000 --idle-s 30 --stream

Starts the bench's fake upstream and `tripwire serve` (`limits: {max_llm_calls: 1, on_limit: ask}`)
as child processes on 127.0.0.1, makes one call of a session (forwarded) and then N concurrent calls
of it, each held for a person; waits until all N are listed by `GET /api/approvals`, then reports
Tripwire's RSS before and while holding (per held call) and the CPU time it used during an idle
window while they wait (it should idle: one watch task wakes once a second). Then denies them all
through the API and checks every client got its answer. Numbers mean something on an idle machine
only (docs/benchmarks.md); this is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench import procs

CONFIG = """
limits: {max_llm_calls: 1, on_limit: ask}
ask_timeout_s: 3600
"""
TOKEN = "bench-token"


async def serve(up: int) -> tuple[procs.Target, int]:
    port, admin = procs.free_port(), procs.free_port()
    tmp = tempfile.TemporaryDirectory(prefix="tripwire-held-")
    config = Path(tmp.name) / "config.yaml"
    config.write_text(CONFIG)
    target = await procs._spawn(
        "tripwire-held",
        port,
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--admin-listen",
        f"127.0.0.1:{admin}",
        "--admin-token",
        TOKEN,
        "--upstream",
        f"http://127.0.0.1:{up}",
        "--data-dir",
        tmp.name,
        "--config",
        str(config),
        "--log-level",
        "WARNING",
        env={"HOME": tmp.name},
        tmp=tmp,
    )
    return target, admin


async def main(calls: int, idle_s: float, stream: bool) -> dict[str, object]:
    up = await procs.upstream()
    tw, admin = await serve(up.port)
    assert tw.pid is not None
    base, api = f"http://127.0.0.1:{tw.port}", f"http://127.0.0.1:{admin}/api/approvals"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    headers = {"X-Tripwire-Session": "held", "Authorization": "Bearer sk-bench"}
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    connector = aiohttp.TCPConnector(limit=0)
    try:
        async with aiohttp.ClientSession(connector=connector) as http:

            async def call() -> int:
                async with http.post(base + "/v1/chat/completions", json=body, headers=headers) as r:
                    await r.read()
                    return r.status

            assert await call() == 200  # the session's one allowed call (and a warm process)
            await asyncio.sleep(1.0)
            rss_before = procs.rss_kb(tw.pid)
            held = [asyncio.create_task(call()) for _ in range(calls)]
            while True:
                async with http.get(api, headers=auth) as r:
                    pending = (await r.json())["approvals"]
                if len(pending) >= calls:
                    break
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)
            rss_held = procs.rss_kb(tw.pid)
            cpu0, t0 = procs.cpu_seconds(tw.pid), time.monotonic()
            await asyncio.sleep(idle_s)
            cpu = procs.cpu_seconds(tw.pid) - cpu0
            wall = time.monotonic() - t0
            for approval in pending:
                async with http.post(f"{api}/{approval['id']}", json={"decision": "deny"}, headers=auth) as r:
                    assert r.status == 200, await r.text()
            statuses = await asyncio.gather(*held)
    finally:
        await tw.stop()
        await up.stop()
    return {
        "held_calls": calls,
        "stream": stream,
        "rss_before_kb": rss_before,
        "rss_held_kb": rss_held,
        "rss_per_held_call_kb": round((rss_held - rss_before) / calls, 1),
        "idle_window_s": round(wall, 2),
        "cpu_s_in_idle_window": round(cpu, 3),
        "cpu_share_while_held": round(cpu / wall, 4),
        "answered": sorted(set(statuses)),
    }


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--idle-s", type=float, default=10.0)
    p.add_argument(
        "--stream", action="store_true", help="streamed calls (their held SSE answers get keep-alives)"
    )
    args = p.parse_args()
    print(json.dumps(asyncio.run(main(args.calls, args.idle_s, args.stream)), indent=2))


if __name__ == "__main__":
    cli()
