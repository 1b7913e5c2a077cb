"""The benchmark harness (bench/run.py) runs, so it cannot rot: its quick mode end to end, a few
seconds, on 127.0.0.1 (the fake upstream, the floor, Tripwire full and all-off as real processes;
mitmdump, LiteLLM and the Redis-backed column are left out). Only that every number came out and is well formed is checked:
the numbers themselves are the benchmark's business (docs/benchmarks.md), never a test's."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def test_the_benchmark_runs_and_reports_every_number(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "targets:" in proc.stdout and "c=1 p50" in proc.stdout
    r = json.loads(out.read_text())
    assert r["machine"]["nproc"] >= 1 and r["machine"]["python"]
    assert set(r["skipped"]) == {"mitmdump", "litellm", "tripwire-redis"}

    columns = ("direct", "floor", "tripwire", "tripwire-off")
    for name in columns:
        lat = r["latency_c1"][name]
        assert lat["n"] > 0 and all(
            finite(lat[k]) for k in ("p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms")
        )
        assert 0 < lat["p50_ms"] <= lat["p99_ms"]
        tp = r["throughput"][name]
        assert tp["rps"] > 0 and tp["non_2xx"] == 0 and finite(tp["of_floor"])
        stream = r["streams"][name]
        assert finite(stream["first_chunk_p50_ms"]) and stream["first_chunk_p50_ms"] > 0
        assert isinstance(stream["every_chunk_before_next"], bool)
    assert r["latency_c1"]["direct"]["added_p50_ms"] == 0

    assert [h["steps"] for h in r["history"]] == [10, 40]
    for h in r["history"]:
        assert h["body_kb"] > 0 and all(finite(h[k]) for k in ("orjson_parse_ms", "direct_ms", "tripwire_ms"))
    assert [x["calls"] for x in r["session_length"]] == [10, 60]
    rows = r["session_count"]["rows"]
    assert [x["sessions"] for x in rows] == [1, 20] and all(x["rss_mb"] > 0 for x in rows)
    assert finite(r["session_count"]["rss_per_idle_session_kb"])
    g = r["gateway"]  # agent keys required vs not: every keyed call accepted, the check's cost a number
    assert g["tripwire-keys"]["rps"] > 0 and g["tripwire-keys"]["non_2xx"] == 0
    assert finite(g["tripwire-keys_check_cpu_us"]) and finite(g["tripwire-keys_check_wall_us"])
    w = r["writer"]
    assert w["events_per_s"] > 0 and w["calls"] > 0 and 0 <= w["lag_p50_ms"] <= w["lag_p99_ms"]
    perm = r["permissions"]  # a permission check's cost per call (issue 22, acceptance 5)
    assert perm["patterns"] == 10 and finite(perm["cost_us_per_call"])
    assert perm["permissions"]["rps"] > 0 and perm["permissions"]["non_2xx"] == 0

    assert r["targets"] and all(t["met"] in (True, False, None) and t["value"] != "" for t in r["targets"])
    a = r["aggregate"]  # tools/list through /mcp over 3 servers against the slowest alone
    assert a["servers"] == 3 and a["n"] > 0
    assert all(finite(a[k]) and a[k] > 0 for k in ("slowest_p50_ms", "aggregate_p50_ms", "aggregate_p99_ms"))
    assert finite(a["added_p50_ms"]) and finite(a["added_p99_ms"])
