"""Instructions per run of ending one-call runs, under valgrind's cachegrind (issue 33).

    .venv/bin/python -m bench.expiry_instructions                         # this checkout
    .venv/bin/python -m bench.expiry_instructions --base /work/main       # and another's, side by side

On a shared two-core machine CPU time per run moves by a third between neighbouring runs of the
same code (bench.run_end, bench.lineage); an instruction count does not. Each part runs twice in
a child under `valgrind --tool=cachegrind --cache-sim=no`, once without the part measured and
once with it, with the collector off; the difference over `--runs` is the instructions a run:
- `end_run`: the recorder's end of a run on the loop's side (RUN_END made and queued);
- `open` / `expire`: the session manager opening a run for a conversation's first request
  (`lookup`, `note_answer`), and its idle sweeps expiring them all.
It counts work, not cache misses (which an expiry of 100,000 runs scattered in memory adds).
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def child(part: str, upto: str, runs: int) -> None:
    """What the measured child runs: `part` set up, then done up to `upto` (none / open / end)."""
    if part == "end_run":
        from proxy.recorder import TraceRecorder

        with tempfile.TemporaryDirectory(prefix="tripwire-bench-", dir="/dev/shm") as tmp:
            rec = TraceRecorder(Path(tmp), recover_interval_s=None)
            config = {"loop_detection": {"enabled": True}, "budget": {}}
            ids = [
                rec.start_run(run_name="bench", agent_name="bench", session_id="s", extra=config)
                for _ in range(runs)
            ]
            gc.disable()
            if upto == "end":
                for rid in ids:
                    rec.end_run(rid, status="ok", reason="idle_timeout")
        return
    from bench.lineage import request
    from proxy import episodes
    from proxy.dialects.base import LLMResult
    from proxy.sessions import SessionManager

    m = SessionManager(idle_timeout_s=300, terminated_ttl_s=3600)
    answer = LLMResult(model="m", text="the answer", tool_calls=[], usage=None, stop_reason="stop")
    calls = []
    for i in range(runs):
        call = request(f"task {i}")
        calls.append((episodes.for_llm({}, {}, call), episodes.given_answer_key(call, answer, None)))
    gc.disable()
    if upto == "none":
        return
    for i, (episode, key) in enumerate(calls):
        opened = m.lookup("bench", None, now=i * 0.001, wall=0, episode=episode)
        assert isinstance(opened, tuple) and key is not None
        m.note_answer(opened[0], key)
    if upto == "end":
        now, ended = 0.0, 0
        while ended < runs:
            now += 5.0
            ended += len(m.idle_sessions(now))


def instructions(tree: Path, part: str, upto: str, runs: int) -> int:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
    # this file as a script (the other checkout may not have it): its own folder first on sys.path,
    # then PYTHONPATH, so `proxy` (and bench.lineage's helper) come from `tree`
    cmd += [sys.executable, __file__, "--child", part, upto, str(runs)]
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True).stderr
    found = re.search(r"I\s+refs:\s+([\d,]+)", out)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{out[-2000:]}")
    return int(found.group(1).replace(",", ""))


def measure(tree: Path, runs: int) -> dict[str, int]:
    end0, end1 = (instructions(tree, "end_run", upto, runs) for upto in ("none", "end"))
    none, opened, expired = (instructions(tree, "sessions", upto, runs) for upto in ("none", "open", "end"))
    return {
        "end_run": (end1 - end0) // runs,
        "open": (opened - none) // runs,
        "expire": (expired - opened) // runs,
    }


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.expiry_instructions", description=__doc__)
    ap.add_argument("--runs", type=int, default=5000)
    ap.add_argument("--base", type=Path, help="another checkout to measure the same way")
    ap.add_argument("--child", nargs=3, metavar=("PART", "UPTO", "RUNS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    trees = [("this", Path(__file__).resolve().parents[1])] + (
        [("base", args.base.resolve())] if args.base else []
    )
    for name, tree in trees:
        print(f"{name} ({tree}): instructions a run", measure(tree, args.runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
