"""AgentDbg's cycle (opt-in `agentdbg_cycle`, implied by `stop_on_loop`): name-only event
signatures over a sliding window of `window` events; a block repeated `repetitions` times at its end
warns, and `stop_on_loop` ends the run once it repeats `stop_on_loop_min_repetitions` times.
"""

from __future__ import annotations

from collections import deque

from proxy.constants import GUARD_LOOP_DETECTION, GUARD_STOP_ON_LOOP, EventType
from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action
from proxy.guards.loop.pattern import Firing


class AgentDbgCycle:
    """Judged on each event written, not on tool calls: its own window of event signatures."""

    KINDS = {"cycle": "the run keeps repeating the same sequence of calls"}

    __slots__ = ("_window", "_reported")

    def __init__(self, config: LoopDetectionConfig) -> None:
        self._window: deque[tuple[str, str]] = deque(maxlen=max(2, config.window))
        self._reported: set[str] | None = None  # (made at the first finding)

    def configure(self, config: LoopDetectionConfig) -> None:
        if self._window.maxlen != max(2, config.window):
            self._window = deque(self._window, maxlen=max(2, config.window))

    def observe(
        self, event_type: str, name: str, event_id: str, config: LoopDetectionConfig
    ) -> Firing | None:
        if not config.agentdbg_cycle:
            return None
        if event_type in (EventType.LLM_CALL, EventType.TOOL_CALL):
            sig = f"{event_type}:{name or 'UNKNOWN'}"
        else:
            sig = event_type
        self._window.append((sig, event_id))
        return self._judge(config)

    def _judge(self, cfg: LoopDetectionConfig) -> Firing | None:
        items = list(self._window)
        n, k = len(items), cfg.repetitions
        sigs = [s for s, _ in items]
        for m in range(1, n // k + 1):
            tail = sigs[-m * k :]
            block = tail[:m]
            if any(tail[i * m : (i + 1) * m] != block for i in range(k)):
                continue
            reps = k  # how many times the block repeats back to back at the end of the window
            while (reps + 1) * m <= n and sigs[-(reps + 1) * m : -reps * m] == block:
                reps += 1
            pattern = " -> ".join(block)
            evidence = tuple(e for _, e in items[-m * reps :])
            terminate = cfg.stop_on_loop and reps >= cfg.stop_on_loop_min_repetitions
            key = f"{pattern}|{'stop' if terminate else k}"
            reported = self._reported
            if reported is None:
                reported = self._reported = set()
            if key in reported:
                # one LOOP_WARNING per distinct pattern per run; a stop already ended the session
                # (calls still in flight extend the same cycle: not another ERROR each)
                return None
            reported.add(key)
            return Firing(
                "cycle",
                key,
                Action.TERMINATE if terminate else Action.WARN,
                f"the run repeats {pattern!r} {reps} times in its last {n} events",
                pattern=pattern,
                threshold=cfg.stop_on_loop_min_repetitions if terminate else k,
                actual=reps,
                repetitions=reps if terminate else k,
                window_size=n,
                evidence=evidence,
                guard=GUARD_STOP_ON_LOOP if terminate else GUARD_LOOP_DETECTION,
            )
        return None
