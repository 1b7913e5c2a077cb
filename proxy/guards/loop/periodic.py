"""Repetition (period 1) and ping_pong (cycles of 2..5 calls): the turn's last calls repeat a block.

One algorithm at every period, so one pattern: the shortest period that fires is the loop (a cycle
whose block repeats a shorter one is that one), and an attempt gets one answer. It fires once the
run spans max(threshold, 2m) calls and every call after the block's first round came back stale,
so a loop of k calls a round is caught within max(threshold + 1, 2k).
"""

from __future__ import annotations

from proxy.guards.config import LoopDetectionConfig
from proxy.guards.loop.pattern import ACTIONS, MAX_EVIDENCE, Firing, Pattern
from proxy.guards.loop.turn import Attempt, Turn

MAX_CYCLE_PERIOD = 5


class Periodic(Pattern):
    KINDS = {
        "repetition": "the same tool call was repeated",
        "ping_pong": "the same tool calls keep alternating in a cycle",
    }

    def __init__(self) -> None:
        # period m -> how many of the turn's last calls repeat with that period
        self.tail = dict.fromkeys(range(1, MAX_CYCLE_PERIOD + 1), 0)
        self.tool_run = 0  # the turn's last calls of one tool, whatever their arguments

    def attempted(self, attempt: Attempt, turn: Turn) -> None:
        before = turn.count - 1  # the turn's calls before this one (the last of `turn.attempts`)
        attempts = turn.attempts
        same_tool = before >= 1 and len(attempts) > 1 and attempts[-2].tool == attempt.tool
        self.tool_run = self.tool_run + 1 if same_tool else 1
        tail = self.tail
        for m in tail:
            if before >= m and len(attempts) > m and attempts[-m - 1].ident == attempt.ident:
                tail[m] += 1
            else:
                tail[m] = min(before + 1, m)

    def judge(self, attempt: Attempt, turn: Turn, config: LoopDetectionConfig) -> Firing | None:
        threshold = config.threshold
        stale_run: int | None = None
        for m, periodic_len in self.tail.items():
            need = max(threshold, 2 * m)
            if periodic_len < need:
                continue
            if stale_run is None:
                stale_run = trailing_stale(turn)
            length = min(periodic_len, stale_run + m + 1, len(turn.attempts))
            if length < need:
                continue
            tail = list(turn.attempts)[-length:]
            block = [a.ident for a in tail[:m]]  # in the order the loop began
            if m > 1 and any(
                all(block[i] == block[i % p] for i in range(m)) for p in range(1, m) if m % p == 0
            ):
                continue  # a shorter period repeats: that one is the loop
            start = attempt.index - length + 1
            evidence = tuple(a.evidence for a in tail[-MAX_EVIDENCE:] if a.evidence)
            if m == 1:
                return Firing(
                    "repetition",
                    ("repetition", turn.number, start),
                    ACTIONS[config.action],
                    f"{attempt.tool} was called {length} times in a row with the same arguments"
                    " and nothing new came back",
                    pattern=attempt.sig,
                    threshold=threshold,
                    actual=length,
                    repetitions=length,
                    window_size=length,
                    evidence=evidence,
                )
            tools = " -> ".join(a.tool for a in tail[:m])
            return Firing(
                "ping_pong",
                ("ping_pong", turn.number, m, start),
                ACTIONS[config.action],
                f"the calls {tools} repeat as a cycle ({length} calls, {length // m} rounds)"
                " and nothing new came back",
                pattern=" -> ".join(a.sig for a in tail[:m]),
                threshold=need,
                actual=length,
                repetitions=length // m,
                window_size=length,
                evidence=evidence,
            )
        return self._same_answer_run(attempt, turn, config)

    def _same_answer_run(self, attempt: Attempt, turn: Turn, config: LoopDetectionConfig) -> Firing | None:
        """One tool called again and again with other arguments, every answer after the first one
        it had already given (page 2, 3, 4... each returning page 1; `current/current/...` listing
        `current/`): a repetition, whatever the arguments say (SPEC §5.1)."""
        threshold = config.threshold
        if self.tool_run < threshold or attempt.follows or attempt.writes or not turn.quiet(attempt.tool):
            return None
        length = min(self.tool_run, trailing_stale(turn) + 2, len(turn.attempts))
        if length < threshold:
            return None
        tail = list(turn.attempts)[-length:]
        return Firing(
            "repetition",
            ("repetition", turn.number, attempt.index - length + 1),
            ACTIONS[config.action],
            f"{attempt.tool} was called {length} times in a row and the same answer came back"
            " whatever the arguments",
            pattern=attempt.sig,
            threshold=threshold,
            actual=length,
            repetitions=length,
            window_size=length,
            evidence=tuple(a.evidence for a in tail[-MAX_EVIDENCE:] if a.evidence),
        )


def trailing_stale(turn: Turn) -> int:
    """How many calls before the current one, back from it, came back stale (or were refused)."""
    n = 0
    attempts = turn.attempts
    for i in range(len(attempts) - 2, -1, -1):
        a = attempts[i]
        # in flight (an MCP fan-out): the same call again is presumed stale, as it is judged
        if not (a.stale or (a.stale is None and a.seen)):
            break
        n += 1
    return n
