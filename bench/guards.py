"""The guards' micro-bench: what judging one call costs in the pure guards, no I/O around them.

    PYTHONPATH=. .venv/bin/python bench/guards.py                   # this tree's guards
    PYTHONPATH=. .venv/bin/python bench/guards.py --compare ../main  # side by side, alternating runs

A fixed workload, the same for any version of the guards (it only uses `SessionGuards` and
`signatures.result_fingerprint`, which every version has): MCP sessions whose calls answer with
realistic results (a page of UUIDs with a cursor, an error carrying a request id, a build log with a
temp file and clock times, a kubectl listing), each result fingerprinted and judged; and a
function-calling conversation growing to 120 steps, judged at every request. Prints microseconds
of CPU time per call (the process's own, so other load on a busy machine counts less; median of
the rounds). `--compare DIR` runs the bench alternately with DIR's `proxy` and
this tree's, in fresh processes, so a busy machine slows both alike.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROUNDS = 7
SESSIONS = 40
CALLS = 30
FC_STEPS = 120
FC_CONVERSATIONS = 8


def _uuid(i: int) -> str:
    return str(uuid.UUID(bytes=hashlib.md5(str(i).encode()).digest(), version=4))


def _rid(i: int, n: int = 14) -> str:
    alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    return "".join(alphabet[b % 62] for b in hashlib.sha256(str(i).encode()).digest()[:n])


def results(i: int) -> list[tuple[str, dict[str, Any], Any]]:
    """(tool, arguments, result) of one session's calls: paging, a stuck retry, a build, a poll."""
    page = {
        "data": [{"id": _uuid(i * 1000 + j), "object": "file", "name": f"report-{j}.csv"} for j in range(10)],
        "next_cursor": _rid(i, 24),
    }
    error = (
        f"Server Error: 502 Bad Gateway (X-GitHub-Request-Id: {_rid(i, 4)}:{_rid(i + 1, 4)}:{_rid(i + 2, 7)})"
    )
    build = (
        f"[09:{i % 60:02d}:07] gcc -O2 -o server main.c\n/usr/bin/ld: /tmp/cc{_rid(i, 6)}.o: in function"
        " `main': undefined reference to `parse'\ncollect2: error: ld returned 1 exit status\n"
    )
    pods = "NAME READY STATUS RESTARTS AGE\n" + "".join(
        f"api-7d9f8b6c5-{_rid(j, 5)} 0/1 CrashLoopBackOff 5 {12 + i % 50}m\n" for j in range(3)
    )
    return [
        ("list_files", {"cursor": _rid(i - 1, 24)}, page),
        ("create_release", {"tag": "v2.4.1"}, {"error": error}),
        ("bash", {"command": "make server"}, build),
        ("kubectl", {"args": "get pods"}, pods),
        (
            "search",
            {"q": f"query {i % 7}", "page": i % 5},
            {"hits": [{"path": f"src/m{j}.py"} for j in range(4)]},
        ),
    ]


def _text(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result)


# the workload, built once (not timed): (tool, arguments, result text) per call
MCP_WORK = [
    [
        (tool, args, _text(result))
        for tool, args, result in (results(s * CALLS + c)[c % 5] for c in range(CALLS))
    ]
    for s in range(SESSIONS)
]
FC_WORK = [(tool, args, _text(result)) for tool, args, result in (results(k)[k % 5] for k in range(FC_STEPS))]


def mcp_round() -> float:
    """Microseconds per MCP call: fingerprint the result, judge the call, record its answer."""
    from proxy.guards.config import GuardConfig
    from proxy.guards.session import SessionGuards
    from proxy.guards.signatures import result_fingerprint

    config = GuardConfig.model_validate({})
    start = time.process_time()
    calls = 0
    for work in MCP_WORK:
        guards = SessionGuards(config, started_at=0.0)
        now = 0.0
        for tool, args, text in work:
            now += 0.5
            verdict = guards.before_tool_call(tool, args, now=now)
            guards.after_tool_call(
                verdict.reservation,
                tool,
                args,
                result_fingerprint=result_fingerprint(text),
                error=None,
                now=now,
            )
            calls += 1
    return (time.process_time() - start) / calls * 1e6


def fc_round() -> float:
    """Microseconds per LLM request of function-calling conversations growing to FC_STEPS steps."""
    from proxy.guards.config import GuardConfig
    from proxy.guards.session import SessionGuards
    from proxy.guards.signatures import result_fingerprint

    config = GuardConfig.model_validate({})
    start = time.process_time()
    for _ in range(FC_CONVERSATIONS):
        guards = SessionGuards(config, started_at=0.0)
        steps: list[list[tuple[str, str, Any]]] = []
        marks: dict[str, tuple[str, str | None]] = {}
        for k, (tool, args, text) in enumerate(FC_WORK):
            call_id = f"call_{k}"
            steps.append([(call_id, tool, args)])
            marks[call_id] = (result_fingerprint(text), None)
            guards.before_llm_call(steps, 0, marks, estimate_usd=0.0, now=float(k))
    return (time.process_time() - start) / (FC_STEPS * FC_CONVERSATIONS) * 1e6


def measure() -> dict[str, float]:
    mcp_round()  # warm-up (imports, regex compilation)
    return {"mcp_call_us": mcp_round(), "llm_request_us": fc_round()}


def compare(other: Path, rounds: int) -> None:
    here = Path(__file__).resolve().parent.parent
    runs: dict[str, list[dict[str, float]]] = {"other": [], "this": []}
    for _ in range(rounds):
        for name, root in (("other", other), ("this", here)):
            env = {**os.environ, "PYTHONPATH": str(root)}
            out = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--json"],
                env=env,
                check=True,
                capture_output=True,
                text=True,
                cwd=str(root),
            ).stdout
            runs[name].append(json.loads(out))
    print(f"| measure (us, median of {rounds}) | {other} | {here} | change |")
    print("|---|---|---|---|")
    for key in ("mcp_call_us", "llm_request_us"):
        a = statistics.median(r[key] for r in runs["other"])
        b = statistics.median(r[key] for r in runs["this"])
        print(f"| {key} | {a:.1f} | {b:.1f} | {100 * (b - a) / a:+.1f}% |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", type=Path, help="another tree whose proxy/ to run side by side")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--json", action="store_true", help="one round, as JSON")
    args = parser.parse_args()
    if args.compare is not None:
        compare(args.compare.resolve(), args.rounds)
    elif args.json:
        print(json.dumps(measure()))
    else:
        for key, value in measure().items():
            print(f"{key}: {value:.1f}")


if __name__ == "__main__":
    main()
