"""AgentDbg's cycle alone (proxy/guards/loop/cycle.py): event signatures over a window."""

from __future__ import annotations

from typing import Any

from proxy.constants import GUARD_STOP_ON_LOOP
from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action
from proxy.guards.loop.cycle import AgentDbgCycle
from proxy.guards.loop.pattern import Firing


def events(
    cycle: AgentDbgCycle, config: LoopDetectionConfig, names: list[tuple[str, str]]
) -> list[Firing | None]:
    return [cycle.observe(t, n, f"ev{i}", config) for i, (t, n) in enumerate(names)]


def config(**kw: Any) -> LoopDetectionConfig:
    return LoopDetectionConfig(**{"agentdbg_cycle": True, **kw})


def test_a_block_of_events_repeated_repetitions_times_warns_once() -> None:
    c = config(repetitions=3)
    got = events(AgentDbgCycle(c), c, [("TOOL_CALL", "search")] * 5)
    assert got[:2] == [None, None] and got[3:] == [None, None]
    fired = got[2]
    assert fired is not None and (fired.kind, fired.action, fired.pattern) == (
        "cycle",
        Action.WARN,
        "TOOL_CALL:search",
    )
    assert fired.evidence == ("ev0", "ev1", "ev2")


def test_off_unless_asked_for() -> None:
    c = LoopDetectionConfig()
    cycle = AgentDbgCycle(c)
    assert events(cycle, c, [("TOOL_CALL", "search")] * 6) == [None] * 6
    assert events(cycle, config(), [("TOOL_CALL", "search")] * 2)[1] is None  # nothing was kept while off


def test_stop_on_loop_terminates_at_min_repetitions() -> None:
    c = config(stop_on_loop=True, stop_on_loop_min_repetitions=4)
    got = events(AgentDbgCycle(c), c, [("LLM_CALL", "m")] * 4)
    stop = got[3]
    assert stop is not None and (stop.action, stop.guard, stop.actual) == (
        Action.TERMINATE,
        GUARD_STOP_ON_LOOP,
        4,
    )


def test_configure_resizes_the_window() -> None:
    small = config(window=4, repetitions=3)
    cycle = AgentDbgCycle(small)
    assert events(cycle, small, [("LLM_CALL", "m"), ("TOOL_CALL", "t")] * 3) == [None] * 6  # 6 never fit in 4
    big = config(window=12, repetitions=3)
    cycle.configure(big)
    got = events(cycle, big, [("LLM_CALL", "m"), ("TOOL_CALL", "t")])
    assert got[0] is None  # the 4 kept + 1: 5 events, not 3 rounds yet
    fired = got[1]  # the 4 kept + 2: 3 rounds in 6 events, the window wider now
    assert fired is not None and fired.window_size == 6
