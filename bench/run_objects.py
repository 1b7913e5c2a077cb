"""The objects a one-call run keeps while it waits for its idle timeout, alone (issue 33): bytes per
run of each, with tracemalloc, in this process (pure objects, no server; bench.run_memory measures
the real server).

    .venv/bin/python -m bench.run_objects --runs 20000
    PYTHONPATH=/work/main .venv/bin/python -m bench.run_objects --runs 20000   # another checkout's

Each run as a stateless service's call makes it: the session manager opens a run for a
conversation's first request and notes its answer; the session's guards judge the call (a plain
chat call, no tool history), settle it and observe its events (RUN_START, LLM_CALL); the trace
registry holds its `Run`.
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy import episodes
from proxy.constants import EventType
from proxy.dialects.base import LLMRequest, LLMResult
from proxy.guard_backend.local import session_guards
from proxy.guards.config import GuardConfig
from proxy.sessions import Session, SessionManager
from proxy.trace.runs import Run


def request(text: str) -> LLMRequest:
    return LLMRequest("openai_chat", "m", False, [{"role": "user", "content": text}], None, None, [], [], 0)


def guards_of(config: GuardConfig, session: Session, now: float) -> Any:
    guards = session_guards(config, session)
    verdict = guards.before_llm_call(
        [], 0, [], estimate_usd=0.001, estimate_tokens=300, now=now, event_ids={}
    )
    guards.observe_event(EventType.RUN_START.value, "run", "e0")
    guards.after_llm_call(verdict.reservation, cost_usd=0.001, tokens=300, now=now)
    guards.observe_event(EventType.LLM_CALL.value, "m", "e1")
    return guards


def per_run(n: int, make: Callable[[int], Any]) -> float:
    gc.collect()
    kept = []
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i in range(n):
        kept.append(make(i))
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    total = sum(d.size_diff for d in after.compare_to(before, "filename"))
    return total / n - 8  # less the list's slot


def measure(n: int) -> dict[str, float]:
    answer = LLMResult(model="m", text="the answer", tool_calls=[], usage=None, stop_reason="stop")
    calls = []
    for i in range(n):
        call = request(f"task {i}")
        calls.append((episodes.for_llm({}, {}, call), episodes.given_answer_key(call, answer, None)))
    config = GuardConfig()
    out: dict[str, float] = {}

    m = SessionManager(idle_timeout_s=300, terminated_ttl_s=3600)

    def open_run(i: int) -> None:
        episode, key = calls[i]
        opened = m.lookup("bench", None, now=i * 0.001, wall=0, episode=episode)
        assert isinstance(opened, tuple)
        m.note_answer(opened[0], key)

    out["session + lineage + manager's indexes"] = per_run(n, open_run)
    sessions = list(m.known())
    out["session guards (first call)"] = per_run(n, lambda i: guards_of(config, sessions[i], i * 0.001))
    base = str(Path("/tmp/tripwire-data/runs"))
    new = "base" in Run.__dataclass_fields__  # (an older checkout's Run takes its dir as a Path)
    fields = {"agent_name": "bench", "guard_config": {}}

    def run(i: int) -> Run:
        rid = str(uuid.UUID(int=i))
        if new:
            r = Run(run_id=rid, base=base, run_name=None, started=i * 0.001)
        else:
            r = Run(run_id=rid, dir=Path(base) / rid, run_name=None, started=i * 0.001)  # type: ignore[call-arg]
        r.fields = dict(fields)
        return r

    out["trace registry's Run (+ its id)"] = per_run(n, run)
    out["total"] = sum(out.values())
    return {k: round(v) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run_objects", description=__doc__)
    ap.add_argument("--runs", type=int, default=20_000)
    args = ap.parse_args()
    for k, v in measure(args.runs).items():
        print(f"{v:7d}  {k}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
