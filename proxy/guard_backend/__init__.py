"""Where a session's guard state lives: this process, or a log shared by replicas (`--state`).

One strategy chosen once at start (`guard_backend_for`, in the engine's composition); the stages and
the session policy ask it and never test which one it is. Both decide alike (same decisions, events
and answers, SPEC §8); what differs is where the state is kept:

- `LocalGuardBackend`: the session's `SessionGuards` in this process; a call is judged and settled
  in place, its circuit is this process's.
- `SharedGuardBackend`: the run's shared guard log (proxy/state/). Before forwarding, the call's
  check goes into the log and its circuit is admitted, in ONE round trip; the verdict is read from
  this replica's copy of the run's guards once it has applied everything the log holds before the
  check (the function-calling results the request brings are taken in that round trip too). After
  the answer, the settle (and the tool calls the answer asked for) is appended in a second round
  trip, overlapping the relay: the answer's end (its last bytes, or a stream's clean end) reaches
  the client only once the log has it (`ex.hold_end`), so replicas decide exactly as one process
  however fast the agent's calls come (SPEC §8, docs/scaling.md). Backend unreachable:
  `fail_open` decides from this replica's copy, `fail_closed` raises `StateUnavailable` (the stage
  refuses with guard code `state_unavailable`).

The stages write the events and render the answers; a backend only keeps state and says what the
guards decided (`Admitted`).
"""

from __future__ import annotations

from pathlib import Path

from proxy.guard_backend.contract import Admitted, CallInputs, GuardBackend, OnCycle, OnSettled
from proxy.guard_backend.local import LocalGuardBackend, session_guards
from proxy.guard_backend.shared import SharedGuardBackend, pending_calls
from proxy.guard_backend.shared_windows import SharedWindows
from proxy.guard_backend.windows import WINDOWS_FILE, LocalWindows, WindowBook
from proxy.guard_log.service import TERMINATED, SharedState
from proxy.guard_store import GuardConfigStore
from proxy.metrics import Metrics
from proxy.state.base import StateUnavailable

__all__ = [
    "Admitted",
    "CallInputs",
    "GuardBackend",
    "LocalGuardBackend",
    "OnCycle",
    "OnSettled",
    "SharedGuardBackend",
    "StateUnavailable",
    "TERMINATED",
    "WindowBook",
    "windows_for",
    "guard_backend_for",
    "pending_calls",
    "session_guards",
]


def guard_backend_for(
    state: SharedState | None, guard_store: GuardConfigStore, windows: WindowBook | None = None
) -> GuardBackend:
    """The one strategy of this process: shared when replicas share guard state (`--state`).
    `windows`: where the agents' budgets over time live (in memory only when not given)."""
    return (
        SharedGuardBackend(state, windows) if state is not None else LocalGuardBackend(guard_store, windows)
    )


def windows_for(state: SharedState | None, data_dir: Path, metrics: Metrics) -> WindowBook:
    """The agents' budgets over time: shared through the state backend when replicas share guard
    state, else this process's, kept in the data dir."""
    if state is not None:
        return SharedWindows(state, metrics)
    return LocalWindows(data_dir / WINDOWS_FILE, metrics)
