"""The trace writer on its own, in this process: how many events a second it puts on disk, and how
late they get there at a steady request rate over many live sessions.

The recorder is Tripwire's own (`proxy.recorder.TraceRecorder`, default fsync policy), fed events
shaped as the proxy writes them (an LLM_CALL with its prompt delta, response and guard fields, and
the TOOL_CALL its result brings). The request handling that shares the event loop in a real proxy is
stood in for by `busy_ms` of CPU per request on the loop.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bodies import RESULT
from proxy.recorder import TraceRecorder


def llm_payload(i: int) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini-2024-07-18",
        "prompt": [{"role": "tool", "tool_call_id": f"call_{i:06d}", "content": RESULT}],
        "prompt_messages_total": 2 * i + 2,
        "response": {
            "text": None,
            "tool_calls": [
                {"id": f"call_{i + 1:06d}", "name": "read_file", "arguments": '{"path": "src/app.py"}'}
            ],
        },
        "usage": {"prompt_tokens": 1200 + i, "completion_tokens": 42, "total_tokens": 1242 + i},
        "provider": "openai",
        "temperature": None,
        "stop_reason": "tool_calls",
        "status": "ok",
        "error": None,
        "cost_usd": 0.000205,
        "upstream": "default",
        "stream": False,
        "endpoint": "openai_chat",
        "http_status": 200,
        "call_seq": i,
        "guard_input": {
            "t": 1.5,
            "ev": 2 * i,
            "done": i,
            "cfg": 0,
            "kind": "llm",
            "est": 0.0003,
            "tok": 2400,
        },
    }


def tool_payload(i: int) -> dict[str, Any]:
    return {
        "tool_name": "read_file",
        "args": '{"path": "src/app.py"}',
        "result": RESULT,
        "status": "ok",
        "error": None,
        "source": "llm",
        "server": None,
        "tool_call_id": f"call_{i:06d}",
    }


async def _open_runs(recorder: TraceRecorder, sessions: int) -> list[str]:
    ids = [
        recorder.start_run(run_name=f"bench {n}", agent_name="bench", session_id=f"s{n}", argv=["bench"])
        for n in range(sessions)
    ]
    await recorder.flush()
    return ids


async def throughput(seconds: float, sessions: int = 300) -> dict[str, float]:
    """Events recorded and written back to back for `seconds` (the loop yields every 200 events)."""
    with tempfile.TemporaryDirectory(prefix="tripwire-bench-writer-") as tmp:
        recorder = TraceRecorder(Path(tmp), recover_interval_s=None)
        await recorder.start()
        try:
            runs = await _open_runs(recorder, sessions)
            payloads = [llm_payload(i) for i in range(50)]
            n = 0
            record_s = 0.0
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                r0 = time.perf_counter()
                for _ in range(200):
                    recorder.record(runs[n % sessions], "LLM_CALL", "gpt-4o-mini", payloads[n % 50])
                    n += 1
                record_s += time.perf_counter() - r0
                await asyncio.sleep(0)
            await recorder.flush()
            wall = time.perf_counter() - t0
            return {
                "events_per_s": n / wall,
                "events": float(n),
                "record_us_per_event": record_s / n * 1e6,
                "write_us_per_event": max(0.0, wall - record_s) / n * 1e6,
            }
        finally:
            await recorder.close()


async def lag(rate: float, seconds: float, sessions: int = 300, busy_ms: float = 1.0) -> dict[str, float]:
    """`rate` calls a second over `sessions` runs (an LLM_CALL and a TOOL_CALL each, plus `busy_ms`
    of other work on the loop per call): how long from record() until the writer has it on disk."""
    with tempfile.TemporaryDirectory(prefix="tripwire-bench-writer-") as tmp:
        recorder = TraceRecorder(Path(tmp), recover_interval_s=None)
        await recorder.start()
        try:
            runs = await _open_runs(recorder, sessions)
            queued: list[tuple[int, float]] = []  # (writer seq once queued, when)
            lags: list[float] = []
            done = asyncio.Event()

            async def watch() -> None:
                while not done.is_set() or queued:
                    written = recorder.health()["written_seq"]
                    now = time.perf_counter()
                    while queued and queued[0][0] <= written:
                        lags.append(now - queued.pop(0)[1])
                    await asyncio.sleep(0.001)

            watcher = asyncio.create_task(watch())
            interval = 1.0 / rate
            t0 = time.perf_counter()
            i = 0
            while time.perf_counter() - t0 < seconds:
                i += 1
                due = t0 + i * interval
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                spin = time.perf_counter() + busy_ms / 1000
                while time.perf_counter() < spin:  # the rest of a request's work on the loop
                    pass
                run = runs[(i * 7919) % sessions]
                recorder.record(run, "TOOL_CALL", "read_file", tool_payload(i))
                recorder.record(run, "LLM_CALL", "gpt-4o-mini", llm_payload(i))
                queued.append((recorder._writer.seq, time.perf_counter()))
            done.set()
            await asyncio.wait_for(watcher, 60)
            lags.sort()
            return {
                "calls": float(i),
                "lag_p50_ms": lags[len(lags) // 2] * 1000,
                "lag_p99_ms": lags[min(len(lags) - 1, int(len(lags) * 0.99))] * 1000,
                "lag_max_ms": lags[-1] * 1000,
            }
        finally:
            await recorder.close()
