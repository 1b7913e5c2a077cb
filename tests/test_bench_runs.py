"""The run-cost benchmarks (bench/runs.py, bench/one_call_runs.py, issue 33) run, so they cannot
rot: tiny counts, on 127.0.0.1, real processes. Only that every number came out well formed and
that every call left a complete run is checked: the numbers are docs/benchmarks.md's business."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_bench(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
def test_the_three_workloads_are_measured_against_the_floor(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    argv = ("bench.runs", "--rounds", "1", "--seconds", "1", "--c1-rounds", "1", "--batch", "5")
    proc = run_bench(*argv, "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    for column in ("floor", "tripwire"):
        for workload in ("named", "distinct", "identical"):
            tp = r["throughput"][column][workload]
            assert tp["rps"] > 0 and tp["non_2xx"] == 0 and math.isfinite(tp["of_floor"])
            assert math.isfinite(r["latency_c1"][column][workload]["added_p50_ms"])
    assert r["throughput"]["floor"]["named"]["of_floor"] == 1.0


def test_one_call_runs_reports_memory_and_expiry_and_every_run_complete(tmp_path: Path) -> None:
    out = tmp_path / "one.json"
    argv = ("bench.one_call_runs", "--runs", "60", "--idle-timeout", "4", "--quiet-s", "1")
    proc = run_bench(*argv, "--data-root", str(tmp_path), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    assert r["all_live"] and r["rss_mb"] > 0 and math.isfinite(r["kb_per_run"])
    assert r["expiry_cpu_raw_s"] >= 0 and r["sweep_cpu_s"] is not None
    assert r["files"] == {"complete": 60 + 50, "partial": 0}  # (50 warm-up calls)


def test_the_session_managers_own_cost_is_measured() -> None:
    proc = run_bench("bench.lineage", "--runs", "300")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["distinct", "identical"]
    assert all("'runs': 300" in line and "expiry_us_per_run" in line for line in lines)
