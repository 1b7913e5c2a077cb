"""What the stages and the session policy ask of where guard state lives (`GuardBackend`), and what a
backend answers about a call (`CallInputs` in, `Admitted` out)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.admission.breaker import BreakerAdmission
from proxy.constants import GUARD_SESSION_TERMINATED
from proxy.dialects.base import ToolCall, ToolResult
from proxy.episodes import Episode
from proxy.exchange import Exchange
from proxy.guard_backend.windows import WindowBook
from proxy.guards.breaker import Ticket, Transition
from proxy.guards.budget import Reservation
from proxy.guards.budget_window import WindowHold
from proxy.guards.config import GuardConfig
from proxy.guards.decision import Action, Decision
from proxy.guards.loop.history import HistoryResults
from proxy.guards.loop.replies import Echo
from proxy.guards.session import SessionGuards, Verdict
from proxy.responses_chain import ResponsesChains
from proxy.sessions import Session, SessionManager

OnCycle = Callable[[Session, Decision], None]
# what settling concluded (the soft budget alert), written by the guard stage
OnSettled = Callable[[Session, SessionGuards, list[Decision]], None]

CHAIN_FETCH_LIMITS = (8, 256, 2048)  # links fetched per round trip, growing while the gap lasts
ENDED_BY_GUARD = Decision(
    Action.TERMINATE, GUARD_SESSION_TERMINATED, "this session was terminated by a guard"
)


@dataclass(slots=True)
class CallInputs:
    """What the guards judge of a call (the guard stage reads them from the exchange)."""

    estimate: float  # USD reserved
    trace: dict[str, Any]  # what the call's event keeps of them, for replay
    # LLM calls: the history as judged, and the tokens reserved
    steps: list[list[ToolCall]] = field(default_factory=list)
    turn_start: int = 0
    results: list[ToolResult] | HistoryResults = field(default_factory=list)
    tokens: int = 0
    echo: Echo | None = None  # the same reply to the same nudge, k times (proxy.guards.loop.replies)


@dataclass(slots=True)
class Admitted:
    """What the guards made of a call before it is forwarded."""

    guards: SessionGuards
    verdict: Verdict | None = None
    inputs: CallInputs | None = None
    seen: tuple[int, int] = (0, 0)  # (events, settles) the guards had seen when they judged
    # the session ended before the call was judged: refused like every later call; `elsewhere`:
    # ended on another replica (or in the log), so this replica's copy ends too
    ended: Decision | None = None
    elsewhere: bool = False
    # the function-calling results the request brings, matched in the admit's round trip (shared):
    # (call id, what the answer that asked for it said) to write, and the ids that were asked
    taken: list[tuple[str, bytes]] | None = None
    asked: list[str] = field(default_factory=list)
    record_results: bool = False  # the backend was down: the calls this replica asked for are written
    # the agent's budget windows (SPEC §9) when the backend reserved the call in them in the
    # admission's round trip: (refusal, hold); None: the guard stage asks `windows` itself
    windows: tuple[Decision | None, WindowHold | None] | None = None
    # refused by a gate of admission (proxy/admission/: concurrent calls, rate limits; SPEC §9)
    # before any session guard saw it: retryable, no call of the session
    refused: Decision | None = None


class GuardBackend(Protocol):
    # True: the function-calling results a request brings are matched in the guards' round trip
    # (`Admitted.taken`), not by the tool results stage before it
    results_at_admit: bool
    # the agents' budgets over time (SPEC §9): reserved by the guard stage after the session's
    # guards admitted a call, settled after its answer
    windows: WindowBook

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def keep_alive(self, sessions: SessionManager, now: float) -> None: ...
    def health(self) -> dict[str, Any] | None: ...
    def retry_after_s(self) -> float: ...
    def config(self, agent: str) -> GuardConfig: ...

    # sessions
    async def resolve_run(
        self,
        sessions: SessionManager,
        agent: str,
        explicit_id: str | None,
        episode: Episode | None,
        now: float,
    ) -> str | None: ...
    def observe(
        self, session: Session, event_type: str, name: str, event_id: str, on_cycle: OnCycle
    ) -> None: ...
    def ended(self, session: Session) -> None: ...
    def terminated(self, session: Session, reason: str, *, kill: bool = False) -> None: ...

    # Responses chains
    async def fetch_chain(
        self, chains: ResponsesChains, agent: str, previous_response_id: str | None
    ) -> None: ...
    async def share_chain(self, chains: ResponsesChains, agent: str, response_id: str) -> None: ...

    # a call
    async def admit(self, ex: Exchange, inputs: Callable[[], CallInputs], now: float) -> Admitted: ...
    def give_back(self, guards: SessionGuards, reservation: Reservation | None) -> None: ...
    async def settle(self, ex: Exchange, on_settled: OnSettled) -> None: ...
    async def release(self, ex: Exchange) -> None:
        """What the admission's gates hold for the call (`ex.admission_holds`) goes back: the call
        ended, answered, refused, failed or cancelled."""
        ...

    async def circuit_release(self, ex: Exchange, ticket: Ticket) -> None: ...
    async def circuit_report(
        self, ex: Exchange, admission: BreakerAdmission, ticket: Ticket, *, failed: bool
    ) -> Transition | None: ...

    # a person raises the session's budgets or limits (SPEC §5.5a)
    async def raise_limits(self, session: Session, raised: Any, now: float) -> dict[str, float]:
        """Validate `raised` against what the session has spent (`proxy.guards.raises`:
        RaiseError, a 400) and raise its limits for the rest of the session, from its next call
        (shared: a log entry every replica applies in order). Returns the raise as applied."""
        ...

    async def approve_loop(self, session: Session, until: int) -> None:
        """A person approved a held loop call: the session's loop asks go through up to call_seq
        `until`, whichever pattern asks (`SessionGuards.approve_loop`; shared: a log entry every
        replica applies in order)."""
        ...

    async def resumed(self, old: Session, run_id: str) -> None:
        """A session ended by a guard is to go on in the new run `run_id` (SPEC §5.5a resume):
        shared, the new run's log is the old one's then a resume entry, and what names the
        session names the new run on every replica (before any call can reach it)."""
        ...
