"""Tripwire's benchmark: its overhead against the floor and other proxies, side by side in one run.

    .venv/bin/python -m bench.run                   # the full table, ~3-4 minutes; JSON to bench-result.json
    .venv/bin/python -m bench.run --quick           # a few seconds: the smoke test's run
    .venv/bin/python -m bench.run --session-calls 100000   # the long-session sweep to call 100,000

Columns, all on the same fake upstream (bench/upstream.py) in one run, measured in interleaved
rounds so a neighbour's load hits every column alike:
- direct: the upstream itself;
- floor: the obvious aiohttp pass-through (bench/floor.py);
- tripwire: `tripwire serve`, defaults (trace, guards, metrics);
- tripwire-off: the same with the whole feature set off (bench/lean.py: forwarding only);
- tripwire-redis: the defaults with `--state` on a local redis-server (issue 13; when installed);
- mitmdump, litellm: when installed in .venv-mitm / .venv-litellm (skipped with a note otherwise).

Sweeps on Tripwire alone (each against direct in the same rounds): streams (first chunk, chunk by
chunk), history length (10 to 1,000 function-calling steps), session length, live sessions and RSS,
and the trace writer in this process (bench/writer.py). See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

from bench import bodies, gateway, permissions, procs, runs, writer
from bench.client import Answer, Connection, concurrent, request_bytes, sequential

PATH = "/v1/chat/completions"
PHASES = (
    "latency",
    "throughput",
    "streams",
    "history",
    "gateway",
    "session_length",
    "session_count",
    "writer",
    "permissions",
    "aggregate",
    "runs",
)
# the aggregate phase: three MCP servers whose tools/list takes this long each (ms)
AGGREGATE_DELAYS_MS = (1.0, 3.0, 5.0)
AGGREGATE_TOOLS = 20


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def ms(x: float) -> float:
    return round(x * 1000, 3)


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg": os.getloadavg(),
    }


# --- c=1 latency ------------------------------------------------------------------------------


async def latency(
    targets: list[procs.Target], raw: Callable[[procs.Target], bytes], rounds: int, batch: int
) -> dict[str, list[float]]:
    """`rounds` rounds, each a batch of `batch` sequential calls per target, the order rotating."""
    out: dict[str, list[float]] = {t.name: [] for t in targets}
    for t in targets:  # warm-up: connections, caches, the first session
        await sequential(t.port, raw(t), max(5, batch // 4))
    for r in range(rounds):
        order = targets[r % len(targets) :] + targets[: r % len(targets)]
        for t in order:
            answers = await sequential(t.port, raw(t), batch)
            _check(t, answers)
            out[t.name] += [a.total_s for a in answers]
    return out


def _check(t: procs.Target, answers: list[Answer]) -> None:
    bad = [a.status for a in answers if a.status != 200]
    if bad:
        raise RuntimeError(f"{t.name}: {len(bad)} answers not 200 (e.g. {bad[0]})")


def latency_table(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    d50, d99 = pct(samples["direct"], 0.5), pct(samples["direct"], 0.99)
    return {
        name: {
            "n": len(xs),
            "p50_ms": ms(pct(xs, 0.5)),
            "p99_ms": ms(pct(xs, 0.99)),
            "added_p50_ms": ms(pct(xs, 0.5) - d50),
            "added_p99_ms": ms(pct(xs, 0.99) - d99),
        }
        for name, xs in samples.items()
    }


# --- c=32 throughput --------------------------------------------------------------------------


WRK_SCRIPT = """
wrk.method = "POST"
local f = io.open("{body}", "rb")
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
wrk.headers["X-Tripwire-Session"] = "bench"
"""

# The latency and throughput phases send one prompt again and again: named as one session, the calls
# are one run, as an agent's calls are. Unnamed, each would be a conversation's first request, and
# each starts a run of its own (SPEC §3): that measures run creation, not a call's path.
SESSION = {"X-Tripwire-Session": "bench"}


async def wrk(port: int, script: Path, seconds: float, conns: int) -> dict[str, float]:
    proc = await asyncio.create_subprocess_exec(
        "wrk", "-t1", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--latency", "-s", str(script),
        f"http://127.0.0.1:{port}{PATH}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out = (await proc.communicate())[0].decode()
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if rps is None:
        raise RuntimeError(f"wrk: no Requests/sec in {out!r}")
    requests = re.search(r"(\d+) requests in", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    return {
        "rps": float(rps.group(1)),
        "requests": float(requests.group(1)) if requests else float("nan"),
        "non_2xx": float(non2xx.group(1)) if non2xx else 0.0,
        "p50_ms": float(p50.group(1)) * scale[p50.group(2)] if p50 else float("nan"),
    }


async def py_load(port: int, raw: bytes, seconds: float, conns: int) -> dict[str, float]:
    """wrk's stand-in when it is not installed: the asyncio client (slower: it caps every column)."""
    n = max(2 * conns, int(seconds * 300))
    answers, wall = await concurrent(port, [raw] * n, conns)
    return {
        "rps": n / wall,
        "requests": float(n),
        "non_2xx": float(sum(a.status != 200 for a in answers)),
        "p50_ms": ms(pct([a.total_s for a in answers], 0.5)),
    }


async def throughput(
    targets: list[procs.Target],
    body: bytes,
    rounds: int,
    seconds: float,
    conns: int,
    tmp: Path,
    headers: dict[str, dict[str, str]] | None = None,  # more request headers, by column
) -> dict[str, Any]:
    (tmp / "body.json").write_bytes(body)
    scripts: dict[str, Path] = {}
    for t in targets:
        extra = (headers or {}).get(t.name, {})
        scripts[t.name] = script = tmp / (f"post-{t.name}.lua" if extra else "post.lua")
        lines = "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in extra.items())
        script.write_text(WRK_SCRIPT.format(body=tmp / "body.json") + lines)
    use_wrk = shutil.which("wrk") is not None and seconds >= 1  # wrk runs whole seconds
    runs: dict[str, list[dict[str, float]]] = {t.name: [] for t in targets}
    for r in range(rounds):
        order = targets[r % len(targets) :] + targets[: r % len(targets)]
        for t in order:
            cpu_before = procs.cpu_seconds(t.pid) if t.pid else None
            if use_wrk:
                run = await wrk(t.port, scripts[t.name], seconds, conns)
            else:
                sent = {**SESSION, **(headers or {}).get(t.name, {})}
                run = await py_load(t.port, request_bytes(t.port, PATH, body, sent), seconds, conns)
            if cpu_before is not None and t.pid and run["requests"] > 0:
                # the proxy process's own CPU per call (all its threads): what bounds its throughput
                run["cpu_us"] = (procs.cpu_seconds(t.pid) - cpu_before) / run["requests"] * 1e6
            runs[t.name].append(run)
    out: dict[str, Any] = {
        "tool": "wrk -t1" if use_wrk else "asyncio client (wrk not installed, or under 1 s)"
    }
    floor = statistics.median(x["rps"] for x in runs["floor"]) if "floor" in runs else None
    for name, xs in runs.items():
        rps = statistics.median(x["rps"] for x in xs)
        out[name] = {
            "rps": round(rps),
            "rounds": [round(x["rps"]) for x in xs],
            "non_2xx": int(sum(x["non_2xx"] for x in xs)),
            "p50_ms": round(statistics.median(x["p50_ms"] for x in xs), 3),
            "of_floor": round(rps / floor, 3) if floor else None,
            "cpu_us_per_call": round(statistics.median(x["cpu_us"] for x in xs), 1)
            if all("cpu_us" in x for x in xs)
            else None,
        }
    return out


# --- streams ----------------------------------------------------------------------------------


def event_times(answer: Answer) -> list[tuple[float, bytes]]:
    """(arrival, data) of each SSE event of a streamed answer, in order."""
    out: list[tuple[float, bytes]] = []
    buf = b""
    for t, part in zip(answer.chunk_times, answer.parts, strict=True):
        buf += part
        *done, buf = buf.split(b"\n\n")
        out += [(t, e) for e in done if e.strip()]
    return out


async def streams(
    targets: list[procs.Target], n: int, chunks: int, delay_ms: float, rounds: int
) -> dict[str, Any]:
    body = bodies.encoded({**bodies.SMALL, "stream": True})
    hdr = {"x-bench-chunks": str(chunks), "x-bench-chunk-delay-ms": str(delay_ms)}
    first: dict[str, list[float]] = {t.name: [] for t in targets}
    lags: dict[str, list[float]] = {t.name: [] for t in targets}
    for r in range(rounds):
        order = targets[r % len(targets) :] + targets[: r % len(targets)]
        for t in order:
            conn = Connection(t.port)
            raw = request_bytes(t.port, PATH, body, hdr)
            try:
                for _ in range(n):
                    a = await conn.send(raw, keep_body=True)
                    if a.status != 200:
                        raise RuntimeError(
                            f"{t.name}: stream answered {a.status}: {b''.join(a.parts)[:500]!r}"
                        )
                    events = event_times(a)
                    first[t.name].append(a.first_s)
                    t_role = events[0][0]
                    words = [(at, e) for at, e in events if b"word" in e]
                    # content chunk k left the upstream (k+1) * delay after the role chunk
                    lags[t.name] += [
                        at - t_role - (k + 1) * delay_ms / 1000 for k, (at, _) in enumerate(words)
                    ]
            finally:
                conn.close()
    d = pct(first["direct"], 0.5)
    dl = pct(lags["direct"], 0.99)
    return {
        "chunks": chunks,
        "delay_ms": delay_ms,
        **{
            name: {
                "first_chunk_p50_ms": ms(pct(first[name], 0.5)),
                "added_first_chunk_ms": ms(pct(first[name], 0.5) - d),
                "chunk_lag_p99_ms": ms(pct(lags[name], 0.99)),
                "added_chunk_lag_p99_ms": ms(pct(lags[name], 0.99) - dl),
                # a chunk held until the next one arrived would be `delay` later than direct's
                "every_chunk_before_next": pct(lags[name], 0.99) - dl < delay_ms / 1000,
            }
            for name in first
        },
    }


# --- history length ---------------------------------------------------------------------------


def parse_time(body: bytes, n: int = 15) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        orjson.loads(body)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def history(
    direct: procs.Target, tw: procs.Target, steps_list: list[int], calls: int
) -> list[dict[str, Any]]:
    """An agent loop at each history length: every call resends the whole conversation plus one
    step (the tool call the previous answer asked for, and its result), as agents do."""
    out = []
    for steps in steps_list:
        task = f"Fix the failing test number {steps}."
        times: dict[str, list[float]] = {"direct": [], "tripwire": []}
        conns = {"direct": Connection(direct.port), "tripwire": Connection(tw.port)}
        parse: list[float] = []
        size = 0
        try:
            for k in range(calls):
                body = bodies.encoded(bodies.history(steps + k, task))
                size = len(body)
                hdr = {"x-bench-tool-call": bodies.call_id(steps + k)}
                order = ("direct", "tripwire") if k % 2 else ("tripwire", "direct")
                for name in order:
                    port = direct.port if name == "direct" else tw.port
                    a = await conns[name].send(request_bytes(port, PATH, body, hdr))
                    if a.status != 200:
                        raise RuntimeError(f"history {steps}: {name} answered {a.status}")
                    if k >= 2:  # the first calls open the run; an agent's later ones are the steady state
                        times[name].append(a.total_s)
                parse.append(parse_time(body, 3))
        finally:
            for c in conns.values():
                c.close()
        d, t = statistics.median(times["direct"]), statistics.median(times["tripwire"])
        out.append(
            {
                "steps": steps,
                "body_kb": round(size / 1024, 1),
                "orjson_parse_ms": ms(statistics.median(parse)),
                "direct_ms": ms(d),
                "tripwire_ms": ms(t),
                "added_ms": ms(t - d),
            }
        )
    return out


# --- session length and session count ---------------------------------------------------------


async def added_now(direct: procs.Target, tw: procs.Target, raw_d: bytes, raw_t: bytes, n: int) -> float:
    """Tripwire's added p50 right now: alternating batches against direct."""
    d: list[float] = []
    t: list[float] = []
    for _ in range(4):
        t += [a.total_s for a in await sequential(tw.port, raw_t, n // 4)]
        d += [a.total_s for a in await sequential(direct.port, raw_d, n // 4)]
    return pct(t, 0.5) - pct(d, 0.5)


async def session_length(
    direct: procs.Target, tw: procs.Target, checkpoints: list[int], probe: int
) -> list[dict[str, Any]]:
    body = bodies.encoded(bodies.SMALL)
    hdr = {"X-Tripwire-Session": "long-session"}
    raw_t = request_bytes(tw.port, PATH, body, hdr)
    raw_d = request_bytes(direct.port, PATH, body)
    out = []
    done = 0
    for calls in checkpoints:
        if calls > done:
            answers, _ = await concurrent(tw.port, [raw_t] * (calls - done), 16)
            _check(tw, answers)
            done = calls
        added = await added_now(direct, tw, raw_d, raw_t, probe)
        done += probe
        out.append({"calls": calls, "added_p50_ms": ms(added)})
    return out


async def session_count(
    direct: procs.Target, tw: procs.Target, checkpoints: list[int], probe: int
) -> dict[str, Any]:
    assert tw.pid is not None
    body = bodies.encoded(bodies.SMALL)
    raw_t = request_bytes(tw.port, PATH, body, {"X-Tripwire-Session": "probe"})
    raw_d = request_bytes(direct.port, PATH, body)
    await sequential(tw.port, raw_t, 20)
    await asyncio.sleep(0.5)
    base_rss = procs.rss_kb(tw.pid)
    rows = []
    live = 1
    for count in checkpoints:
        if count > live:
            raws = [
                request_bytes(tw.port, PATH, body, {"X-Tripwire-Session": f"idle-{i}"})
                for i in range(live, count)
            ]
            answers, _ = await concurrent(tw.port, raws, 16)
            _check(tw, answers)
            live = count
        await asyncio.sleep(0.5)  # the writer settles
        rss = procs.rss_kb(tw.pid)
        rows.append(
            {
                "sessions": count,
                "rss_mb": round(rss / 1024, 1),
                "added_p50_ms": ms(await added_now(direct, tw, raw_d, raw_t, probe)),
            }
        )
    last = rows[-1]
    per = (procs.rss_kb(tw.pid) - base_rss) / max(1, last["sessions"] - 1)
    return {"rows": rows, "rss_per_idle_session_kb": round(per, 2), "base_rss_mb": round(base_rss / 1024, 1)}


# --- the run ----------------------------------------------------------------------------------


def mcp_request(port: int, path: str, method: str, session: str, msg_id: int = 1) -> bytes:
    body = orjson.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": {}})
    headers = {"Accept": "application/json, text/event-stream", "Mcp-Session-Id": session}
    return request_bytes(port, path, body, headers)


async def mcp_session(port: int, path: str) -> str:
    """An initialized handshake-era session on `path`: its Mcp-Session-Id."""
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"},
        },
    }
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            request_bytes(port, path, orjson.dumps(init), {"Accept": "application/json, text/event-stream"})
        )
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    finally:
        writer.close()
    for line in head.split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip().lower() == "mcp-session-id":
            return value.strip()
    raise RuntimeError(f"no Mcp-Session-Id from {path}: {head!r}")


async def aggregate(up: procs.Target, rounds: int, batch: int, started: list[procs.Target]) -> dict[str, Any]:
    """`tools/list` through `/mcp` over three servers (each listing within AGGREGATE_DELAYS_MS) against
    the slowest server's own `tools/list` alone, in alternating batches (issue 24: <= 2 ms added)."""
    servers = []
    for i, delay in enumerate(AGGREGATE_DELAYS_MS):
        servers.append(await procs.mcp_server(f"mcp{i}", delay, AGGREGATE_TOOLS))
        started.append(servers[-1])
    extra: list[str] = []
    for i, s in enumerate(servers):
        extra += ["--mcp", f"s{i}=http://127.0.0.1:{s.port}/mcp"]
    tw = await procs.tripwire("tripwire-aggregate", up.port, extra=tuple(extra))
    started.append(tw)
    slowest = servers[-1]
    raw_direct = mcp_request(slowest.port, "/mcp", "tools/list", await mcp_session(slowest.port, "/mcp"))
    raw_tw = mcp_request(tw.port, "/mcp", "tools/list", await mcp_session(tw.port, "/mcp"))
    direct_s: list[float] = []
    through_s: list[float] = []
    for raw, port in ((raw_direct, slowest.port), (raw_tw, tw.port)):  # warm-up: upstream sessions opened
        _check(tw, await sequential(port, raw, max(5, batch // 4)))
    for _ in range(rounds):
        through = await sequential(tw.port, raw_tw, batch)
        _check(tw, through)
        through_s += [a.total_s for a in through]
        direct_s += [a.total_s for a in await sequential(slowest.port, raw_direct, batch)]
    await tw.stop()
    return {
        "servers": len(servers),
        "tools_per_server": AGGREGATE_TOOLS,
        "list_delays_ms": list(AGGREGATE_DELAYS_MS),
        "n": len(through_s),
        "slowest_p50_ms": ms(pct(direct_s, 0.5)),
        "slowest_p99_ms": ms(pct(direct_s, 0.99)),
        "aggregate_p50_ms": ms(pct(through_s, 0.5)),
        "aggregate_p99_ms": ms(pct(through_s, 0.99)),
        "added_p50_ms": ms(pct(through_s, 0.5) - pct(direct_s, 0.5)),
        "added_p99_ms": ms(pct(through_s, 0.99) - pct(direct_s, 0.99)),
    }


async def maybe(
    what: str, start: Callable[[], Awaitable[procs.Target]], skipped: dict[str, str]
) -> procs.Target | None:
    try:
        return await start()
    except (
        Exception
    ) as e:  # a comparison proxy that is not installed or fails to start: a note, not a failure
        skipped[what] = str(e)
        return None


async def start_redis_column(up: int, started: list[procs.Target]) -> procs.Target:
    """A redis-server, then Tripwire with its guard state there (the redis process is stopped with the rest)."""
    redis = await procs.redis_server()
    started.append(redis)
    return await procs.tripwire_redis(up, redis)


async def agent_keys(
    by: dict[str, procs.Target],
    started: list[procs.Target],
    up: int,
    body: bytes,
    args: argparse.Namespace,
    tmp: Path,
) -> dict[str, Any]:
    """The gateway phase: Tripwire with agent keys required beside the same without, at c=32
    (`--conns`); the CPU per call between them is the key check's cost (with the shared state's
    store too, when the tripwire-redis column runs)."""
    pairs = [("tripwire", "tripwire-keys", None)]
    redis = next((t for t in started if t.name == "redis"), None)
    if "tripwire-redis" in by and redis is not None:
        pairs.append(("tripwire-redis", "tripwire-redis-keys", f"redis://127.0.0.1:{redis.port}/0"))
    targets: list[procs.Target] = []
    headers: dict[str, dict[str, str]] = {}
    for plain, keyed, state_url in pairs:
        target, key = await gateway.keys_column(keyed, up, tmp / "keys", state_url=state_url)
        started.append(target)
        targets += [by[plain], target]
        headers[keyed] = {"x-api-key": key}
    out = await throughput(targets, body, args.tp_rounds, args.tp_seconds, args.conns, tmp, headers)
    for plain, keyed, _ in pairs:
        a, b = out[plain].get("cpu_us_per_call"), out[keyed].get("cpu_us_per_call")
        out[f"{keyed}_check_cpu_us"] = round(b - a, 1) if a is not None and b is not None else None
        out[f"{keyed}_check_wall_us"] = round((1 / out[keyed]["rps"] - 1 / out[plain]["rps"]) * 1e6, 1)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"machine": machine(), "args": vars(args), "skipped": {}}
    skipped: dict[str, str] = result["skipped"]
    started: list[procs.Target] = []
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="tripwire-bench-"))
    try:
        up = await procs.upstream()
        started.append(up)
        direct = procs.Target("direct", up.port)
        targets = [direct]
        for name, starter in (
            ("floor", lambda: procs.floor(up.port)),
            ("tripwire", lambda: procs.tripwire("tripwire", up.port)),
            ("tripwire-off", lambda: procs.tripwire("tripwire-off", up.port, lean=True)),
            ("tripwire-redis", lambda: start_redis_column(up.port, started)),
            ("mitmdump", lambda: procs.mitmdump(up.port)),
            ("litellm", lambda: procs.litellm(up.port)),
        ):
            if args.columns and name not in args.columns:
                skipped[name] = "not in --columns"
                continue
            if name in ("mitmdump", "litellm", "tripwire-redis"):
                if args.quick:
                    skipped[name] = "not run in --quick"
                    continue
                if args.only and not {"latency", "throughput"} & set(args.only):
                    continue
            t = await maybe(name, starter, skipped)
            if t is not None:
                started.append(t)
                targets.append(t)
        by = {t.name: t for t in targets}
        small = bodies.encoded(bodies.SMALL)
        raws = {t.name: request_bytes(t.port, PATH, small, SESSION) for t in targets}

        def step(what: str) -> None:
            print(f"[{time.perf_counter() - t_start:6.1f}s] {what}", file=sys.stderr, flush=True)

        only = set(args.only or PHASES)
        if "latency" in only:
            step("latency, one call at a time")
            samples = await latency(targets, lambda t: raws[t.name], args.rounds, args.batch)
            result["latency_c1"] = latency_table(samples)
        if "throughput" in only:
            step(f"throughput, {args.conns} connections")
            result["throughput"] = await throughput(
                targets, small, args.tp_rounds, args.tp_seconds, args.conns, tmp
            )
        if "streams" in only:
            step("streams")
            stream_targets = [by[n] for n in ("direct", "floor", "tripwire", "tripwire-off") if n in by]
            chunks, delay = (5, 2.0) if args.quick else (20, 5.0)
            result["streams"] = await streams(stream_targets, args.streams, chunks, delay, 2)
        if "history" in only:
            step("history length")
            result["history"] = await history(direct, by["tripwire"], args.history, args.history_calls)
        if "gateway" in only and "tripwire" in by:
            step(f"gateway: agent-key check, {args.conns} connections")
            result["gateway"] = await agent_keys(by, started, up.port, small, args, tmp)
        for t in started[1:]:
            if t.name != "tripwire":
                await t.stop()
        if "session_length" in only:
            step("session length")
            long_tw = await procs.tripwire("tripwire-long", up.port)
            started.append(long_tw)
            result["session_length"] = await session_length(direct, long_tw, args.session_calls, args.probe)
            await long_tw.stop()
        if "session_count" in only:
            step("live sessions")
            many_tw = await procs.tripwire("tripwire-many", up.port)
            started.append(many_tw)
            result["session_count"] = await session_count(direct, many_tw, args.sessions, args.probe)
            await many_tw.stop()
        if "aggregate" in only:
            step("aggregate: tools/list over 3 MCP servers through /mcp")
            result["aggregate"] = await aggregate(up, args.rounds, max(10, args.batch // 5), started)
        if "writer" in only:
            step("trace writer")
            result["writer"] = {
                **(await writer.throughput(args.writer_seconds)),
                **(await writer.lag(400, args.writer_seconds, sessions=300)),
                "rate_calls_per_s": 400,
                "sessions": 300,
            }
        if "runs" in only and not args.quick and shutil.which("wrk"):
            step(f"runs: a named session vs unnamed single calls (a run each), {args.conns} connections")
            result["runs"] = await runs.throughput(
                ["floor", "tripwire"],
                up.port,
                None,
                args.tp_rounds,
                max(1, round(args.tp_seconds)),
                args.conns,
                tmp,
            )
        if "permissions" in only:
            step(f"tool permissions, {args.conns} connections")
            result["permissions"] = await permissions.measure(
                up.port, throughput, args.tp_rounds, args.tp_seconds, args.conns, tmp
            )
        result["machine"]["loadavg_end"] = os.getloadavg()
        result["seconds"] = round(time.perf_counter() - t_start, 1)
        result["targets"] = verdicts(result)
        return result
    finally:
        for t in reversed(started):
            await t.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def verdicts(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of issue 10 with the value this run measured: met or not (phases not run: left out)."""
    out: list[dict[str, Any]] = []

    def add(target: str, value: Any, met: bool | None) -> None:
        out.append({"target": target, "value": value, "met": met})

    lat, tp = r.get("latency_c1", {}), r.get("throughput", {})
    tw, off = lat.get("tripwire"), lat.get("tripwire-off")
    if tw and "floor" in lat:
        gap = tw["added_p50_ms"] - lat["floor"]["added_p50_ms"]
        add("c=1 added p50 within 0.15 ms of the floor's", f"{gap:+.3f} ms", gap <= 0.15)
    if "tripwire" in tp and "floor" in tp:
        share = tp["tripwire"]["of_floor"]
        add("c=32 throughput >= 75% of the floor's", f"{share:.0%}", share >= 0.75)
    if tw:
        add("c=1 added p50 <= 0.3 ms over direct", f"{tw['added_p50_ms']:.3f} ms", tw["added_p50_ms"] <= 0.3)
        add("c=1 added p99 <= 1.0 ms over direct", f"{tw['added_p99_ms']:.3f} ms", tw["added_p99_ms"] <= 1.0)
    if "tripwire" in tp:
        d_rps = tp["direct"]["rps"]
        add(
            ">= 5,000 req/s at c=32 (where direct does >= 13,000)",
            f"{tp['tripwire']['rps']} req/s (direct {d_rps})",
            tp["tripwire"]["rps"] >= 5000 if d_rps >= 13000 else None,
        )
        for other, factor in (("mitmdump", 6), ("litellm", 50)):
            if other in tp:
                x = tp["tripwire"]["rps"] / max(1, tp[other]["rps"])
                add(f">= {factor}x {other}'s throughput", f"{x:.1f}x", x >= factor)
    red = lat.get("tripwire-redis")
    if tw and red:  # issue 13: one Redis round trip before forwarding, settling off the response path
        extra = red["added_p50_ms"] - tw["added_p50_ms"]
        add("shared state (Redis) <= 0.3 ms over in-memory (c=1 p50)", f"{extra:+.3f} ms", extra <= 0.3)
    if tw and off:
        cost = tw["added_p50_ms"] - off["added_p50_ms"]
        add("feature set <= 0.1 ms over all-off (c=1 p50)", f"{cost:.3f} ms", cost <= 0.1)
    g = r.get("gateway", {})
    for keyed, label in (("tripwire-keys", "data dir"), ("tripwire-redis-keys", "shared state")):
        cost = g.get(f"{keyed}_check_cpu_us")
        if cost is not None:  # issue 22: a dict lookup by hash (data dir); one HGET (shared state)
            add(f"agent-key check ({label}) <= 20 us per call at c=32 (CPU)", f"{cost:+.1f} us", cost <= 20)
    s = r.get("streams", {}).get("tripwire")
    if s:
        first = s["added_first_chunk_ms"]
        add("stream first-chunk overhead <= 0.5 ms", f"{first:.3f} ms", first <= 0.5)
        before = s["every_chunk_before_next"]
        add("every chunk forwarded before the next arrives", before, before)
    sl = r.get("session_length", [])
    if len(sl) >= 2:
        a, b = sl[0]["added_p50_ms"], sl[-1]["added_p50_ms"]
        add(
            f"cost per call flat (20%) from call {sl[0]['calls']} to {sl[-1]['calls']}",
            f"{a:.3f} -> {b:.3f} ms",
            b <= a * 1.2 + 0.02,
        )
    if "session_count" in r:
        sc = r["session_count"]["rows"]
        if len(sc) >= 2:
            a, b = sc[0]["added_p50_ms"], sc[-1]["added_p50_ms"]
            add(
                f"cost per call flat (20%) from {sc[0]['sessions']} to {sc[-1]['sessions']} live sessions",
                f"{a:.3f} -> {b:.3f} ms",
                b <= a * 1.2 + 0.02,
            )
        per = r["session_count"]["rss_per_idle_session_kb"]
        add("<= 10 KB per idle session", f"{per:.1f} KB", per <= 10)
        if sc and sc[-1]["sessions"] >= 10000:
            add("10,000 live sessions under 200 MB RSS", f"{sc[-1]['rss_mb']} MB", sc[-1]["rss_mb"] < 200)
    h = r.get("history")
    if h:
        last = h[-1]
        small = tw["added_p50_ms"] if tw else h[0]["added_ms"]
        bound = 2 * last["orjson_parse_ms"] + small
        add(
            f"history of {last['steps']} steps: added <= 2x parse + small-body overhead",
            f"{last['added_ms']:.2f} ms (bound {bound:.2f})",
            last["added_ms"] <= bound,
        )
    w = r.get("writer")
    if w:
        add(">= 20,000 events/s written", f"{w['events_per_s']:.0f}/s", w["events_per_s"] >= 20000)
        add(
            "writer lag p99 < 100 ms at 400 calls/s over 300 sessions",
            f"{w['lag_p99_ms']:.1f} ms",
            w["lag_p99_ms"] < 100,
        )
    perm = r.get("permissions")
    if perm and perm["cost_us_per_call"] is not None:
        cost = perm["cost_us_per_call"]
        add(
            f"tool permission check ({perm['patterns']} patterns) <= 20 us per call at c=32",
            f"{cost:+.1f} us",
            cost <= 20,
        )
    rr = r.get("runs", {}).get("tripwire")
    if rr:  # issue 33: a run must be cheap
        for workload, share in (("distinct", 0.75), ("identical", 0.5)):
            x = rr[workload]["of_floor"]
            add(f"c=32 {workload} unnamed single calls >= {share:.0%} of the floor's", f"{x:.0%}", x >= share)
    a = r.get("aggregate")
    if a:
        add(
            "tools/list over 3 MCP servers through /mcp adds <= 2 ms to the slowest server alone (p50)",
            f"{a['added_p50_ms']:.2f} ms",
            a["added_p50_ms"] <= 2.0,
        )
    return out


def print_table(r: dict[str, Any]) -> None:
    m = r["machine"]
    print(
        f"machine: nproc={m['nproc']} cpu={m['cpu']} python={m['python']} load={m['loadavg']} -> {m.get('loadavg_end')}"
    )
    print(f"run took {r['seconds']} s; skipped: {r['skipped'] or 'nothing'}")
    tp = r.get("throughput", {})
    if "latency_c1" in r or tp:
        print(
            f"\n{'path':<14}{'c=1 p50':>9}{'p99':>8}{'added p50':>11}{'added p99':>11}{'c=32 req/s':>12}{'of floor':>10}{'CPU us/call':>13}"
        )
        for name in dict.fromkeys([*r.get("latency_c1", {}), *(k for k in tp if isinstance(tp[k], dict))]):
            x = r.get("latency_c1", {}).get(name, {})
            t = tp.get(name, {})
            share = f"{t['of_floor']:.0%}" if t.get("of_floor") else "-"
            cpu = f"{t['cpu_us_per_call']:.0f}" if t.get("cpu_us_per_call") else "-"
            cols = [
                f"{x[k]:.3f}" if k in x else "-" for k in ("p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms")
            ]
            print(
                f"{name:<14}{cols[0]:>9}{cols[1]:>8}{cols[2]:>11}{cols[3]:>11}{t.get('rps', '-'):>12}{share:>10}{cpu:>13}"
            )
    g = r.get("gateway")
    if g:
        print("\ngateway (agent keys required vs not, c=32): req/s, CPU us/call")
        for name, x in g.items():
            if isinstance(x, dict) and "rps" in x:
                print(f"  {name:<22}{x['rps']:>8}{x.get('cpu_us_per_call') or '-':>10}")
        for name, x in g.items():
            if name.endswith(("_check_cpu_us", "_check_wall_us")):
                print(f"  {name}: {x}")
    s = r.get("streams")
    if s:
        print(
            f"\nstreams ({s['chunks']} chunks, {s['delay_ms']} ms apart): first chunk p50 / added / chunk lag p99"
        )
        for name in ("direct", "floor", "tripwire", "tripwire-off"):
            if name in s:
                x = s[name]
                print(
                    f"  {name:<14}{x['first_chunk_p50_ms']:>8.3f}{x['added_first_chunk_ms']:>9.3f}"
                    f"{x['chunk_lag_p99_ms']:>9.3f}  every chunk before the next: {x['every_chunk_before_next']}"
                )
    if r.get("history"):
        print("\nhistory length: steps, body KB, orjson parse ms, direct ms, tripwire ms, added ms")
        for h in r["history"]:
            print(
                f"  {h['steps']:>6}{h['body_kb']:>9}{h['orjson_parse_ms']:>9.3f}{h['direct_ms']:>9.3f}"
                f"{h['tripwire_ms']:>9.3f}{h['added_ms']:>9.3f}"
            )
    if r.get("session_length"):
        rows = ", ".join(f"{x['calls']}: {x['added_p50_ms']:.3f}" for x in r["session_length"])
        print(f"\nsession length: calls -> added p50 ms: {rows}")
    if "session_count" in r:
        sc = r["session_count"]
        rows = ", ".join(f"{x['sessions']}: {x['rss_mb']} MB, {x['added_p50_ms']:.3f}" for x in sc["rows"])
        print(f"live sessions -> RSS MB, added p50 ms: {rows}")
        print(f"RSS per idle session: {sc['rss_per_idle_session_kb']} KB")
    w = r.get("writer")
    if w:
        print(
            f"trace writer: {w['events_per_s']:.0f} events/s (record {w['record_us_per_event']:.1f} us + write "
            f"{w['write_us_per_event']:.1f} us per event); lag at {w['rate_calls_per_s']} calls/s over "
            f"{w['sessions']} sessions: p50 {w['lag_p50_ms']:.1f} ms, p99 {w['lag_p99_ms']:.1f} ms"
        )
    a = r.get("aggregate")
    if a:
        print(
            f"aggregate /mcp tools/list over {a['servers']} servers ({a['tools_per_server']} tools each, "
            f"lists taking {a['list_delays_ms']} ms): p50 {a['aggregate_p50_ms']:.3f} ms vs the slowest alone "
            f"{a['slowest_p50_ms']:.3f} ms: added p50 {a['added_p50_ms']:.3f}, p99 {a['added_p99_ms']:.3f} ms"
        )
    if r.get("runs"):
        print("\nruns (c=32): req/s, share of the floor's, CPU us per call")
        for column, x in r["runs"].items():
            cells = "  ".join(
                f"{w} {x[w]['rps']} ({x[w]['of_floor']:.0%}, {x[w]['cpu_us_per_call']:.0f})" for w in x
            )
            print(f"  {column:<10}{cells}")
    print("\ntargets:")
    for t in r["targets"]:
        mark = {True: "met ", False: "MISS", None: "n/a "}[t["met"]]
        print(f"  [{mark}] {t['target']}: {t['value']}")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    ap.add_argument("--out", type=Path, default=Path("bench-result.json"), help="JSON result file")
    ap.add_argument("--quick", action="store_true", help="a few seconds, tiny counts (the smoke test)")
    ap.add_argument("--rounds", type=int, default=6, help="c=1 rounds (each a batch per column)")
    ap.add_argument("--batch", type=int, default=250, help="c=1 calls per column per round")
    ap.add_argument("--conns", type=int, default=32, help="connections of the throughput test")
    ap.add_argument("--tp-rounds", type=int, default=3)
    ap.add_argument("--tp-seconds", type=float, default=3.0)
    ap.add_argument("--streams", type=int, default=15, help="streams per column per round")
    ap.add_argument("--history", type=ints, default=[10, 100, 400, 1000], help="history lengths (steps)")
    ap.add_argument("--history-calls", type=int, default=12)
    ap.add_argument(
        "--session-calls", type=ints, default=[10, 1000, 10000], help="session length checkpoints"
    )
    ap.add_argument("--sessions", type=ints, default=[1, 100, 1000, 10000], help="live session checkpoints")
    ap.add_argument("--probe", type=int, default=400, help="calls per latency probe in the sweeps")
    ap.add_argument("--writer-seconds", type=float, default=5.0)
    ap.add_argument("--only", type=lambda x: x.split(","), help=f"some of the phases: {','.join(PHASES)}")
    ap.add_argument(
        "--columns",
        type=lambda x: x.split(","),
        help="some of the columns (direct always runs): floor,tripwire,tripwire-off,tripwire-redis,mitmdump,litellm",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        args.rounds, args.batch, args.tp_rounds, args.tp_seconds, args.streams = 1, 20, 1, 0.2, 2
        args.history, args.history_calls = [10, 40], 4
        args.session_calls, args.sessions, args.probe, args.writer_seconds = [10, 60], [1, 20], 20, 0.3
    result = asyncio.run(run(args))
    print_table(result)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print(f"\nJSON: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
