"""Loop detection for one session (SPEC §5.1): progress, not counts.

A call's *identity* is its tool and arguments without per-call noise (`stable_signature`: no request
ids, nonces, timestamps, counters); its result is a fingerprint without such noise. Then:

- a call is *stale* when, by the time it was made, the same identity had already come back in this
  turn and so had its result from that tool; every other call makes progress (a new call, or a
  known call with something new to say: a test run whose failure changed);
- *news* is an answer that made progress and did not fail; a stale call counts as *without
  progress* unless news came back since that identity's last answer (checking again after
  something happened is not a loop: the write-then-check, the poll with a sleep between).

"By the time it was made" means among the answers that had come back when it started, so the
calls of one step (one assistant message, or MCP calls in flight together) never count against each
other: a fan-out is not a repetition. A new user turn (MCP-only: a pause over `turn_gap_s`) starts
from nothing.

The patterns, each judged on the attempt before it is forwarded (so an MCP call can be refused):
- repetition (m = 1) and ping_pong (cycles of m = 2..5 calls): the turn's last calls repeat a block
  of m, and every call after the block's first round was stale; fires once that run spans
  max(threshold, 2m) calls, so a loop of k calls a round is caught within max(threshold + 1, 2k);
- no_progress (Loop Guard's poll): the same call came back with the same result, without
  progress, `no_progress_warn` - 1 times in a row: the next attempt warns (`no_progress_halt` ends);
- retry_no_progress: the same tool failed with the same error `threshold` - 1 times in a row, with
  no news since (whatever the arguments: a failure changes nothing and teaches nothing new);
- per_tool: a tool's calls without progress in the turn reach 5/8/12 (idempotent) or 3/5/7
  (mutating) -> warn/block/terminate; `per_tool_mode: count` counts every call, as Loop Guard;
- identical_step: the same set of calls in consecutive assistant steps, each stale;
- cycle (AgentDbg, opt-in `agentdbg_cycle`): name-only event signatures over a window.
An attempt whose identity has come back before, with no news since, is presumed stale: its own
result is not known yet ("the T-th attempt after T-1 results without progress").

The package, one module per concern:
- `detector.py`: `LoopDetector`, the patterns of one session composed (MCP calls, LLM histories,
  events), their firings turned into decisions;
- `history.py`: `HistoryReader`, an LLM request's history read on from the last one (new calls,
  the turn); `turn.py`: `Turn`, what progress is measured against (calls, answers, streaks);
- `pattern.py`: what a pattern is told and what it answers (`Pattern`, `Firing`);
- one module per pattern: `periodic.py` (repetition, ping_pong), `no_progress.py`, `retry.py`,
  `per_tool.py`, `identical_step.py`, `cycle.py`.

Pure: no I/O, no asyncio, the monotonic clock passed in as `now`.
"""
