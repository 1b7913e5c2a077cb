"""What a run costs (issue 33): one named agent session against unnamed single calls, each its own run.

    .venv/bin/python -m bench.runs                       # c=32 and c=1, three workloads, ~2 minutes
    .venv/bin/python -m bench.runs --base /work/main     # and the same code of another checkout beside it
    .venv/bin/python -m bench.runs --rounds 5 --seconds 3 --only throughput

Three workloads, the same 800-byte prompt (bench/bodies.py) to the same fake upstream:
- `named`: every call names one session (`X-Tripwire-Session`): one run, as an agent's calls are;
- `distinct`: no session named, every call a different first request (the user message carries a
  counter): a stateless service's classification or extraction calls, one run per call (SPEC §3);
- `identical`: no session named, every call the same bytes: still one run per call (an evaluation
  batch), all of them giving the same answer to the same words.

Columns: `floor` (bench/floor.py, the bare aiohttp pass-through), `tripwire` (this checkout) and,
with `--base DIR`, `base` (`tripwire serve` from the checkout at DIR: its own code, its cwd and
PYTHONPATH). Every (column, workload) is its own process with a fresh data dir, so one workload's
runs do not weigh on another's. Rounds interleave every column and workload (the order rotating),
so a neighbour's load on a shared machine hits them alike; req/s is the median of the rounds and
each is given as a share of the floor's median in the same run. c=1: sequential calls on one
connection, the columns alternating in batches; the added p50 is over the upstream called directly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench import bodies, procs
from bench.client import Connection, request_bytes

PATH = "/v1/chat/completions"
WORKLOADS = ("named", "distinct", "identical")
NAMED = {"X-Tripwire-Session": "bench"}
_MARK = "@@N@@"  # where a distinct call's counter goes in the body

# wrk: one thread, so one counter; `tag` keeps rounds (each a new wrk) from sending the same bodies
WRK_HEAD = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
"""
WRK_DISTINCT = """
local f = io.open("{body}", "rb")
local template = f:read("*a")
f:close()
local at = string.find(template, "{mark}", 1, true)
local head, tail = string.sub(template, 1, at - 1), string.sub(template, at + {mark_len})
local n = 0
request = function()
  n = n + 1
  return wrk.format(nil, nil, nil, head .. "{tag}-" .. n .. tail)
end
"""
WRK_FIXED = """
local f = io.open("{body}", "rb")
wrk.body = f:read("*a")
f:close()
"""


def template() -> bytes:
    """The prompt with a place for a counter in its user message (a different first request each)."""
    body = orjson.loads(orjson.dumps(bodies.SMALL))
    body["messages"][1]["content"] = f"Item {_MARK}: " + body["messages"][1]["content"]
    return orjson.dumps(body)


def distinct_body(tag: str, n: int) -> bytes:
    return template().replace(_MARK.encode(), f"{tag}-{n}".encode())


def wrk_script(tmp: Path, workload: str, tag: str) -> Path:
    body = tmp / f"{workload}.json"
    if workload == "distinct":
        body.write_bytes(template())
        lua = WRK_DISTINCT.format(body=body, mark=_MARK, mark_len=len(_MARK), tag=tag)
    else:
        body.write_bytes(bodies.encoded(bodies.SMALL))
        lua = WRK_FIXED.format(body=body)
    if workload == "named":
        lua += "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in NAMED.items())
    script = tmp / f"{workload}-{tag}.lua"
    script.write_text(WRK_HEAD + lua)
    return script


async def wrk(port: int, script: Path, seconds: int, conns: int) -> dict[str, float]:
    proc = await asyncio.create_subprocess_exec(
        "wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "-s", str(script), f"http://127.0.0.1:{port}{PATH}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out = (await proc.communicate())[0].decode()
    found: dict[str, float] = {}
    for line in out.splitlines():
        if line.startswith("Requests/sec:"):
            found["rps"] = float(line.split()[1])
        elif " requests in " in line:
            found["requests"] = float(line.split()[0])
        elif line.strip().startswith("Non-2xx"):
            found["non_2xx"] = float(line.split()[-1])
    if "rps" not in found:
        raise RuntimeError(f"wrk: no Requests/sec in {out!r}")
    return found


DATA_ROOT: str | None = None  # where the data dirs go (--data-root; None: the system's temp dir)


async def start(column: str, up: int, base: Path | None) -> procs.Target:
    if column == "floor":
        return await procs.floor(up)
    if column == "tripwire":
        return await procs.tripwire("tripwire", up, data_root=DATA_ROOT)
    assert base is not None
    return await procs.tripwire("base", up, root=base, data_root=DATA_ROOT)


async def throughput(
    columns: list[str], up: int, base: Path | None, rounds: int, seconds: int, conns: int, tmp: Path
) -> dict[str, Any]:
    """c=32 (`conns`): req/s and CPU per call of every (column, workload), each its own process."""
    cells = [(c, w) for c in columns for w in WORKLOADS]
    started = {cell: await start(cell[0], up, base) for cell in cells}
    runs: dict[tuple[str, str], list[dict[str, float]]] = {cell: [] for cell in cells}
    try:
        for r in range(rounds):
            order = cells[r % len(cells) :] + cells[: r % len(cells)]
            for cell in order:
                t = started[cell]
                assert t.pid is not None
                script = wrk_script(tmp, cell[1], f"r{r}")
                cpu, kids = procs.cpu_seconds(t.pid), procs.children_cpu_seconds(t.pid)
                found = await wrk(t.port, script, seconds, conns)
                calls = max(1.0, found["requests"])
                found["cpu_us"] = (procs.cpu_seconds(t.pid) - cpu) / calls * 1e6
                # the trace writer's disk process (`trace_writer: process`), on the other core
                found["child_cpu_us"] = (procs.children_cpu_seconds(t.pid) - kids) / calls * 1e6
                runs[cell].append(found)
                print(f"  c={conns} {cell[0]:<9}{cell[1]:<10}{found['rps']:>9.0f} req/s", file=sys.stderr)
    finally:
        for t in started.values():
            await t.stop()
    out: dict[str, Any] = {}
    for (column, workload), xs in runs.items():
        out.setdefault(column, {})[workload] = {
            "rps": round(statistics.median(x["rps"] for x in xs)),
            "rounds": [round(x["rps"]) for x in xs],
            "cpu_us_per_call": round(statistics.median(x["cpu_us"] for x in xs), 1),
            "child_cpu_us_per_call": round(statistics.median(x["child_cpu_us"] for x in xs), 1),
            "non_2xx": int(sum(x.get("non_2xx", 0) for x in xs)),
        }
    floor = out.get("floor", {})
    for by_workload in out.values():
        for workload, x in by_workload.items():
            ref = floor.get(workload, {}).get("rps")
            x["of_floor"] = round(x["rps"] / ref, 3) if ref else None
    return out


async def latency(
    columns: list[str], up: procs.Target, base: Path | None, rounds: int, batch: int
) -> dict[str, Any]:
    """c=1: each (column, workload)'s p50 over the upstream called directly, in alternating batches."""
    cells = [(c, w) for c in columns for w in WORKLOADS]
    started = {cell: await start(cell[0], up.port, base) for cell in cells}
    samples: dict[tuple[str, str], list[float]] = {cell: [] for cell in cells}
    direct: list[float] = []
    fixed = bodies.encoded(bodies.SMALL)
    counter = 0
    try:
        conns = {cell: Connection(t.port) for cell, t in started.items()}
        to_direct = Connection(up.port)
        for r in range(rounds + 1):  # the first round warms up (connections, the first run)
            order = cells[r % len(cells) :] + cells[: r % len(cells)]
            for cell in order:
                port = started[cell].port
                for _ in range(batch):
                    counter += 1
                    if cell[1] == "distinct":
                        raw = request_bytes(port, PATH, distinct_body("c1", counter))
                    else:
                        raw = request_bytes(port, PATH, fixed, NAMED if cell[1] == "named" else None)
                    a = await conns[cell].send(raw)
                    if a.status != 200:
                        raise RuntimeError(f"{cell}: answered {a.status}")
                    if r:
                        samples[cell].append(a.total_s)
                raw = request_bytes(up.port, PATH, fixed)
                for _ in range(batch // len(cells) + 1):
                    a = await to_direct.send(raw)
                    if r:
                        direct.append(a.total_s)
        for c in [*conns.values(), to_direct]:
            c.close()
    finally:
        for t in started.values():
            await t.stop()
    d50 = statistics.median(direct)
    out: dict[str, Any] = {"direct_p50_ms": round(d50 * 1000, 3)}
    for (column, workload), xs in samples.items():
        out.setdefault(column, {})[workload] = {
            "n": len(xs),
            "p50_ms": round(statistics.median(xs) * 1000, 3),
            "added_p50_ms": round((statistics.median(xs) - d50) * 1000, 3),
        }
    return out


def machine() -> dict[str, Any]:
    from bench.run import machine as run_machine

    return run_machine()


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    columns = ["floor", "tripwire", *(["base"] if args.base else [])]
    result: dict[str, Any] = {
        "machine": machine(),
        "columns": columns,
        "base": str(args.base or ""),
        "data_root": args.data_root or tempfile.gettempdir(),
    }
    tmp = Path(tempfile.mkdtemp(prefix="tripwire-bench-runs-"))
    up = await procs.upstream()
    t0 = time.perf_counter()
    try:
        if "throughput" in args.only:
            result["throughput"] = await throughput(
                columns, up.port, args.base, args.rounds, args.seconds, args.conns, tmp
            )
        if "latency" in args.only:
            result["latency_c1"] = await latency(columns, up, args.base, args.c1_rounds, args.batch)
    finally:
        await up.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    result["machine"]["loadavg_end"] = os.getloadavg()
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result


def report(r: dict[str, Any]) -> None:
    m = r["machine"]
    print(f"machine: nproc={m['nproc']} cpu={m['cpu']} load={m['loadavg']} -> {m['loadavg_end']}")
    tp = r.get("throughput")
    if tp:
        print(
            f"\nc=32 req/s (share of the floor's; CPU us per call [+ its children's])"
            f"   {'  '.join(f'{w:>28}' for w in WORKLOADS)}"
        )
        for column, x in tp.items():
            cells = [
                f"{x[w]['rps']:>7} ({x[w]['of_floor']:.2f}; {x[w]['cpu_us_per_call']:>5.0f}"
                + (f" +{x[w]['child_cpu_us_per_call']:.0f})" if x[w].get("child_cpu_us_per_call") else ")")
                for w in WORKLOADS
            ]
            print(f"  {column:<50}{'  '.join(f'{c:>28}' for c in cells)}")
    lat = r.get("latency_c1")
    if lat:
        print(f"\nc=1 added p50 over direct ({lat['direct_p50_ms']:.3f} ms), ms: {'  '.join(WORKLOADS)}")
        for column, x in lat.items():
            if isinstance(x, dict):
                print(f"  {column:<10}" + "".join(f"{x[w]['added_p50_ms']:>10.3f}" for w in WORKLOADS))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench.runs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--base", type=Path, help="another checkout's `tripwire serve` beside this one")
    ap.add_argument("--rounds", type=int, default=3, help="c=32 rounds")
    ap.add_argument("--seconds", type=int, default=3, help="seconds of wrk per cell per round")
    ap.add_argument("--conns", type=int, default=32)
    ap.add_argument("--c1-rounds", type=int, default=4)
    ap.add_argument("--batch", type=int, default=150, help="c=1 calls per cell per round")
    ap.add_argument("--only", type=lambda x: x.split(","), default=["throughput", "latency"])
    ap.add_argument(
        "--data-root",
        help="where the data dirs go (default the temp dir; /dev/shm leaves out the disk's own cost)",
    )
    ap.add_argument("--out", type=Path, default=Path("bench-runs.json"))
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    global DATA_ROOT
    DATA_ROOT = args.data_root
    if shutil.which("wrk") is None and "throughput" in args.only:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    result = asyncio.run(measure(args))
    report(result)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"\nJSON: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
