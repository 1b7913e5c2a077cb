"""The guard-state backend interface (SPEC §8): what replicas of Tripwire share, as storage primitives.

Two implementations: `MemoryBackend` (one process, no service) and `RedisBackend` (several
replicas). Every operation that must be atomic across replicas is ONE call here, and one round trip
in Redis (a Lua script):

- `append`: add entries to a run's ordered guard log and read back every entry after `since` (the
  session guards are pure and deterministic, so each replica feeding the log, in order, into its
  own `SessionGuards` takes the same decisions: proxy/guard_log/replica.py); it also takes the
  function-calling tool calls whose results the request brings, and keeps the run alive;
- `resolve`: the run of a call (explicit session, announced episode, lineage), created if none;
- the checks of admission (proxy/admission/): an `append` carries each check's request to its
  shared-state twin (`Twin`: a Lua fragment of the APPEND script, and the same rule in Python for
  `MemoryBackend`), asked in the same step: a gate (concurrent calls, rate limits) before the
  entries go in (a check it refuses is not appended), the others (budget windows, the circuit) after;
- `run`: one standalone operation of a check (`Op`: a whole Lua script, the same rule in Python),
  such as a circuit's report or a concurrent call's release;
- `publish_config` / `config_snapshot`: the API-set prevention configs, by revision.

Clocks: the backend stamps log entries and breaker times with its own clock (Redis `TIME`), so
replicas on different hosts agree on elapsed times.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Literal, Protocol

from proxy.state.windows import WindowStore

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
    body: bytes  # proxy/guard_log/entries.py


@dataclass(frozen=True)
class Appended:
    """What `append` returns: every entry after `since`, the appended ones last."""

    entries: list[LogEntry]
    first_own: int  # seq of the first entry this append added (taken tool calls included); 0: see `lost`
    taken: list[tuple[str, bytes]] = field(default_factory=list)  # (tool_call_id, detail) of the calls taken
    terminated: str | None = None  # the run's terminated mark, if any (kill switch, guard)
    was_live: bool = True  # False: the run had expired before this append (it is live again now)
    epoch: str = ""  # which log this is (the run's start stamp): pass it back with the next append
    # one per `checks` asked, in order: its twin's answer (`Twin.parse`), None when an earlier gate
    # refused its check (never asked)
    answers: list[Any] = field(default_factory=list)
    refused: frozenset[int] = frozenset()  # the positions (from 1) of the checks a gate refused

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


class Store(Protocol):
    """What a twin keeps in `MemoryBackend` (and the local guard backend): one dict per check."""

    def store(self, name: str) -> dict[Any, Any]: ...


class Twin(Protocol):
    """A check's shared-state twin (proxy/admission/<check>/twin.py), asked inside `append`.

    `lua` defines `CHECKS.<name> = function(args, now)` returning (refused, reply): the APPEND script
    is assembled from the twins' fragments (`proxy.state.lua.append_script`), so a call's checks
    cost no round trip of their own. `memory` is the same rule in Python (`MemoryBackend`, and the
    local guard backend's own store), returning (refused, answer)."""

    name: str
    gate: bool  # asked before the check is appended: refused, the check is not appended
    lua: str

    def args(self, request: Any) -> Any: ...  # JSON for the Lua function
    def parse(self, request: Any, reply: Any) -> Any: ...  # the Lua reply as `memory` answers
    def memory(self, store: Store, request: Any, now: float) -> tuple[bool, Any]: ...


class Op(Protocol):
    """A standalone operation of a check (a circuit's report, a concurrent call's release): a whole
    Lua script for Redis, the same rule in Python for `MemoryBackend` (`StateBackend.run`)."""

    name: str
    lua: str

    def keys(self, request: Any) -> list[str]: ...
    def args(self, request: Any) -> list[Any]: ...
    def parse(self, request: Any, reply: Any) -> Any: ...
    def memory(self, store: Store, request: Any, now: float) -> Any: ...


@dataclass(frozen=True, slots=True)
class CheckAsk:
    """A check's request in an `append`: `twin` decides it for the body at position `at` (from 1)."""

    twin: Twin
    at: int
    request: Any


@dataclass(frozen=True, slots=True)
class Append:
    """One atomic step on a run's guard log (`StateBackend.append`).

    Before the `take_at`-th body (from 1) go the TOOL_CALL entries of the pending calls in `take`
    whose results arrived (each taken once; one already recorded as an MCP call, per `signatures`
    noted so far, is dropped). `put`: pending calls an answer asked for; `signatures`: MCP calls
    recorded; `keep_alive`: slot keys renewed with the run; `links`: slot key -> run id to set
    (lineage); `checks`: what the admission's checks ask of their twins, in admission order for each
    body: the gates first (a check one refuses is not appended, nor are the tool calls taken before
    it, nor is it asked of the later checks), then the others.
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
    checks: Sequence[CheckAsk] = ()


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

    # --- the checks' own operations ------------------------------------------------------------

    async def run(self, op: Op, request: Any) -> Any:
        """One standalone operation of a check, atomic (one Lua script in Redis)."""
        ...

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
