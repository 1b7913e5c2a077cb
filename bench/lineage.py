"""The session manager alone (issue 33): N one-call runs opened, then all expired, CPU per run.

    .venv/bin/python -m bench.lineage --runs 20000                       # this checkout
    PYTHONPATH=/work/main .venv/bin/python -m bench.lineage --runs 20000  # another one's code

`SessionManager` is pure (the clock passed in), so this measures its bookkeeping exactly, with no
I/O: each run is opened by a conversation's first request (`lookup`), answered (`note_answer`),
then a sweep per simulated 5 s expires them (`idle_sessions`). `identical`: every run is given the
same answer to the same words (an evaluation batch), the case whose index was a list per answer.
"""

from __future__ import annotations

import argparse
import time

from proxy import episodes
from proxy.dialects.base import LLMRequest, LLMResult
from proxy.sessions import SessionManager


def request(*texts: str) -> LLMRequest:
    messages = [{"role": "assistant" if i % 2 else "user", "content": t} for i, t in enumerate(texts)]
    return LLMRequest("openai_chat", "m", False, messages, None, None, [], [], 0)


def measure(runs: int, identical: bool) -> dict[str, float]:
    m = SessionManager(idle_timeout_s=300, terminated_ttl_s=3600)
    answer = LLMResult(model="m", text="the answer", tool_calls=[], usage=None, stop_reason="stop")
    calls = []
    for i in range(runs):
        call = request("the task" if identical else f"task {i}")
        key = episodes.given_answer_key(call, answer, None)
        calls.append((episodes.for_llm({}, {}, call), key))
    t0 = time.process_time()
    for i, (episode, key) in enumerate(calls):
        opened = m.lookup("bench", None, now=i * 0.001, wall=0, episode=episode)
        assert key is not None and isinstance(opened, tuple) and opened[1]  # a new run each
        m.note_answer(opened[0], key)
    opened_s = time.process_time() - t0
    t0 = time.process_time()
    ended = 0
    now = 0.0
    while ended < runs:
        now += 5.0  # the engine sweeps every min(5 s, timeout / 4)
        ended += len(m.idle_sessions(now))
    return {
        "runs": runs,
        "open_us_per_run": round(opened_s / runs * 1e6, 2),
        "expiry_s": round(time.process_time() - t0, 3),
        "expiry_us_per_run": round((time.process_time() - t0) / runs * 1e6, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.lineage", description=__doc__)
    ap.add_argument("--runs", type=int, default=20_000)
    args = ap.parse_args()
    for identical in (False, True):
        print("identical" if identical else "distinct ", measure(args.runs, identical))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
