"""The recorder's end of a run, alone (issue 33): CPU per run of `end_run` on the event loop's side
(RUN_END built and queued, run.json / tripwire.json marked for rewriting), for N open runs, the
files not written (that is the writer's pass, in its thread).

    .venv/bin/python -m bench.run_end --runs 100000
    PYTHONPATH=/work/main .venv/bin/python -m bench.run_end --runs 100000   # another checkout's
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from proxy.recorder import TraceRecorder


def measure(runs: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="tripwire-bench-", dir="/dev/shm") as tmp:
        rec = TraceRecorder(Path(tmp), recover_interval_s=None)
        config = {"loop_detection": {"enabled": True}, "budget": {}}
        ids = [
            rec.start_run(run_name="bench", agent_name="bench", session_id="s", extra=config)
            for _ in range(runs)
        ]
        t0 = time.process_time()
        for rid in ids:
            rec.end_run(rid, status="ok", reason="idle_timeout")
        spent = time.process_time() - t0
    return {"runs": runs, "end_run_s": round(spent, 3), "end_run_us_per_run": round(spent / runs * 1e6, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run_end", description=__doc__)
    ap.add_argument("--runs", type=int, default=100_000)
    print(measure(ap.parse_args().runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
