"""The guard-state backend interface (SPEC §8): what replicas of Tripwire share, as storage primitives.

Two implementations: `MemoryBackend` (one process, no service) and `RedisBackend` (several
replicas). Every operation that must be atomic across replicas is ONE call here, and one round trip
in Redis (a Lua script):

- `append`: add entries to a run's ordered guard log and read back every entry after `since` (the
  session guards are pure and deterministic, so each replica feeding the log, in order, into its
  own `SessionGuards` takes the same decisions: proxy/state/replica.py); it also takes the
  function-calling tool calls whose results the request brings, and keeps the run alive;
- `resolve`: the run of a call (explicit session, announced episode, lineage), created if none;
- `breaker_*`: the circuit of agent x upstream, decided where it is stored;
- rate limits (SPEC §9): an `append`'s checks are admitted through their agent's windows first, in
  the same step; a check a full window refuses is not appended;
- `publish_config` / `config_snapshot`: the API-set prevention configs, by revision.

Clocks: the backend stamps log entries and breaker times with its own clock (Redis `TIME`), so
replicas on different hosts agree on elapsed times.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Literal, Protocol

from proxy.guards.breaker import State, Ticket, Transition
from proxy.guards.config import CircuitBreakerConfig
from proxy.guards.decision import Decision
from proxy.guards.rate_limit import RateRefusal, RateRule
from proxy.state.windows import Reserved, WindowRequest, WindowStore

# how a call names its run (SPEC §3): explicit session id, announced episode, conversation lineage,
# a conversation's first request (continues no run: a new one, unless the agent's latest has seen
# no conversation yet), or nothing at all (MCP calls, embeddings: the agent's latest automatic run)
ResolveMode = Literal["explicit", "episode", "lineage", "first", "none"]


class StateUnavailable(Exception):
    """The backend cannot be reached (or answered too late); the failure policy decides."""


@dataclass(frozen=True)
class LogEntry:
    """One entry of a run's guard log, as stored."""

    seq: int  # position in the run's log, from 1
    t: float  # the backend's clock when it was appended (seconds)
    config_rev: int  # revision of the shared prevention config in force when it was appended
    body: bytes  # proxy/state/entries.py


@dataclass(frozen=True)
class Appended:
    """What `append` returns: every entry after `since`, the appended ones last."""

    entries: list[LogEntry]
    first_own: int  # seq of the first entry this append added (taken tool calls included); 0: see `lost`
    taken: list[tuple[str, bytes]] = field(default_factory=list)  # (tool_call_id, detail) of the calls taken
    terminated: str | None = None  # the run's terminated mark, if any (kill switch, guard)
    was_live: bool = True  # False: the run had expired before this append (it is live again now)
    epoch: str = ""  # which log this is (the run's start stamp): pass it back with the next append
    breakers: list[BreakerAdmission | None] = field(default_factory=list)  # one per `breakers` asked
    # one per `rates` asked: None admitted (a slot taken), else the refusal (that check not appended)
    rates: list[RateRefusal | None] = field(default_factory=list)
    windows: list[Reserved] = field(default_factory=list)  # one per `windows` asked

    @property
    def lost(self) -> bool:
        """Not the log the caller followed (Redis lost its data, or the run expired and started
        again): nothing was appended; seed it again or rebuild from it."""
        return self.first_own == 0


@dataclass(frozen=True)
class Resolved:
    """The run of a call: an existing one, a new one, or a terminated one (refuse the call)."""

    run_id: str
    outcome: Literal["existing", "created", "terminated"]
    started: float  # the backend's clock when the run started


@dataclass(frozen=True)
class PendingCall:
    """A function-calling tool call an answer asked for, waiting for its result in a later request.

    `event` is the guard-log entry of its TOOL_CALL (written by the replica that gets the result);
    `signatures` the MCP signatures that mean it was already recorded as an MCP call;
    `detail` what that replica needs to write the event (name, arguments, times).
    """

    event: bytes
    signatures: tuple[str, ...]
    detail: bytes


@dataclass(frozen=True)
class BreakerAdmission:
    """`breaker_admit`'s answer: a ticket (admitted) or a refusal decision with `retry_after`."""

    ticket: Ticket | None
    refusal: Decision | None
    state: State = State.CLOSED  # after admitting (a closed circuit with no failures needs no report
    failures: int = 0  # of a success: there is nothing to reset)


@dataclass(frozen=True)
class BreakerRequest:
    """A circuit to admit a call through, in the same step as the call's check."""

    agent: str
    upstream: str
    config: CircuitBreakerConfig


@dataclass(frozen=True, slots=True)
class RateRequest:
    """The rate limits a check goes through (proxy/guards/rate_limit.py), in the same step as it is
    appended, taking `slots` in each (one each when empty); `member` names its slots in each window
    (the check's id: unique)."""

    agent: str
    member: str
    rules: tuple[RateRule, ...]
    slots: tuple[int, ...] = ()


@dataclass(frozen=True)
class BreakerView:
    agent: str
    upstream: str
    state: State
    failures: int


@dataclass(frozen=True, slots=True)
class Append:
    """One atomic step on a run's guard log (`StateBackend.append`).

    Before the `take_at`-th body (from 1) go the TOOL_CALL entries of the pending calls in `take`
    whose results arrived (each taken once; one already recorded as an MCP call, per `signatures`
    noted so far, is dropped). `put`: pending calls an answer asked for; `signatures`: MCP calls
    recorded; `keep_alive`: slot keys renewed with the run; `links`: slot key -> run id to set
    (lineage); `breakers`: circuits to admit the checks through (`breaker_admit`), in the same step,
    `breaker_at` the position (from 1) of each one's check among the bodies; `rates`: (position,
    request) of the checks to admit through their agent's rate limits first: a refused one is not
    appended (nor are tool calls taken before it, nor is its circuit admitted);
    `windows`: (position, request) of the checks to reserve in their agent's budget windows, in the
    same step (skipped for a check a rate limit refused).
    `since`: the entries the caller has (0: none); `epoch`: the log it followed (a log started
    anew since answers `lost`)."""

    agent: str
    run_id: str
    bodies: Sequence[bytes]
    _: KW_ONLY
    since: int
    idle_s: float
    epoch: str = ""
    take: Sequence[str] = ()
    take_at: int = 0
    put: Mapping[str, PendingCall] | None = None
    signatures: Sequence[str] = ()
    keep_alive: Sequence[str] = ()
    links: Mapping[str, str] | None = None
    breakers: Sequence[BreakerRequest] = ()
    breaker_at: Sequence[int] = ()
    rates: Sequence[tuple[int, RateRequest]] = ()
    windows: Sequence[tuple[int, WindowRequest]] = ()  # budget windows (proxy/state/windows.py)


class StateBackend(Protocol):
    """Storage primitives shared by replicas. Methods raise `StateUnavailable` when unreachable."""

    name: str

    @property
    def windows(self) -> WindowStore:
        """The agents' budgets over time (SPEC §9)."""
        ...

    async def ping(self) -> None: ...

    async def close(self) -> None: ...

    # --- a run's guard log ---------------------------------------------------------------------

    async def append(self, step: Append) -> Appended:
        """Append `step.bodies` and return every entry after `step.since`, in one atomic step
        (what else the step does: `Append`)."""
        ...

    async def read(self, agent: str, run_id: str, *, since: int) -> list[LogEntry]: ...

    async def seed(
        self,
        agent: str,
        run_id: str,
        log: Sequence[LogEntry],
        *,
        idle_s: float,
        epoch: str = "",
        terminated: str | None = None,
        lineage: bool = False,
        slots: Sequence[str] = (),
    ) -> bool:
        """Put a replica's copy of a run back after Redis lost its data: the log into an empty log,
        or the tail of a longer copy after a log that holds only a shorter seed of the same `epoch`
        (every copy is a prefix of one log: the longest wins); False when the log is not that.
        The run hash is made again (its start stamp `epoch`, when given), with its `terminated`
        mark and `lineage` flag; `slots` (keys naming the run) are set where missing."""
        ...

    async def resume(
        self,
        agent: str,
        old_run_id: str,
        run_id: str,
        *,
        slots: Sequence[str],
        idle_s: float,
        ttl_s: float,
        session_id: str | None = None,
    ) -> None:
        """A session resumed in a new run (its log seeded already): `slots` now name `run_id`, the
        explicit session's terminated mark goes, and `old_run_id` says where it went (`ttl_s`)."""
        ...

    async def resumed_as(self, agent: str, run_id: str) -> str | None:
        """The run a resumed run's session goes on in, or None."""
        ...

    async def dataset(self, candidate: str) -> str:
        """The id of the backend's data set, `candidate` if it had none: a different id than a
        replica last saw means the data it shared was lost (Redis restarted empty, FLUSHALL)."""
        ...

    async def resolve(
        self,
        agent: str,
        mode: ResolveMode,
        new_run_id: str,
        *,
        idle_s: float,
        name: str | None = None,  # the explicit session id or the announced episode id
        previous_response_id: str | None = None,
        # lineage: the keys a run is found by (the answer the history carries, then whole-history
        # digests, longest first); the first one is attached to the run. `first`: only attached
        history: Sequence[str] = (),
    ) -> Resolved: ...

    async def terminate(
        self, agent: str, run_id: str, reason: str, *, session_id: str | None = None, ttl_s: float = 0.0
    ) -> None:
        """Mark the run terminated (every replica refuses its calls); an explicit `session_id` also
        keeps refusing for `ttl_s` after the run is gone (SPEC §3 `terminated_ttl_s`)."""
        ...

    async def live_runs(
        self, agent_runs: Sequence[tuple[str, str]], *, idle_s: float | None = None
    ) -> list[bool]:
        """Which of these runs are still live somewhere; `idle_s` renews them (calls in flight)."""
        ...

    # --- circuit breakers (agent x upstream) ---------------------------------------------------

    async def breaker_admit(
        self, agent: str, upstream: str, config: CircuitBreakerConfig, *, now: float | None = None
    ) -> BreakerAdmission: ...

    async def breaker_report(
        self,
        agent: str,
        upstream: str,
        ticket: Ticket,
        config: CircuitBreakerConfig,
        *,
        failed: bool,
        now: float | None = None,
    ) -> Transition | None: ...

    async def breaker_release(self, agent: str, upstream: str, ticket: Ticket) -> None: ...

    async def breakers(self) -> list[BreakerView]: ...

    # --- Responses API chains -------------------------------------------------------------------

    async def put_links(
        self, agent: str, links: Mapping[str, tuple[bytes, str | None]], *, idle_s: float
    ) -> None:
        """Share Responses links: response id -> (blob, parent response id), kept while idle_s passes
        without a read."""
        ...

    async def chain(
        self, agent: str, response_id: str, *, limit: int, idle_s: float
    ) -> list[tuple[str, bytes]]:
        """The shared links of the chain ending at `response_id`, newest first, up to `limit` or the
        first one not shared (one round trip); each link read is kept idle_s longer."""
        ...

    # --- prevention configs set through the admin API ------------------------------------------

    async def publish_config(self, snapshot: bytes, *, after: int = 0) -> int:
        """Store a new snapshot of the API-set configs; returns its revision (1, 2, ...), above
        `after` (the newest the caller knows: a revision is never reused)."""
        ...

    async def config_snapshot(self, revision: int | None = None) -> tuple[int, bytes | None]:
        """The snapshot of `revision` (None: the current one), with its revision (0: none yet)."""
        ...
