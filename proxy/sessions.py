"""Agent sessions: which run a call belongs to, and when a run ends (SPEC §3).

Pure bookkeeping with the clock passed in; the engine does the I/O (RUN_START, RUN_END).
A session is one AgentDbg run. Explicit sessions are named by the agent (header or path);
otherwise each agent has one automatic session that ends after `idle_timeout` without traffic.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

SessionKey = tuple[str, str | None]  # (agent, explicit session id or None for automatic)


@dataclass
class PendingToolCall:
    """A function-calling tool call the model asked for, waiting for its result in a later request."""

    name: str
    arguments: Any
    asked_at: float  # wall clock of the LLM answer that asked for it
    llm_event_id: str


@dataclass
class Conversation:
    """What the proxy remembers of a session's LLM traffic between calls."""

    # the previous LLM call's messages: how many, and a digest of them, so the next call records
    # only what is new when it continues that conversation, and all of it when it does not
    prompt_messages_seen: int = 0
    prompt_digest: str | None = None
    pending_tool_calls: dict[str, PendingToolCall] = field(default_factory=dict)
    # MCP tool calls recorded in this session, by signature, so the same call seen again as a
    # function-calling result in the LLM history is recorded once (SPEC §4.1 TOOL_CALL).
    mcp_signatures: dict[str, int] = field(default_factory=dict)
    # Responses API: tool calls per response id, since `previous_response_id` chains carry no history
    response_tool_calls: dict[str, list[Any]] = field(default_factory=dict)
    # function-calling tool_call_id -> its TOOL_CALL event id (a LOOP_WARNING's evidence)
    tool_event_ids: dict[str, str] = field(default_factory=dict)
    # replay (proxy.guard_trace): the previous request's history as step ids, and the config
    # revisions already written into the trace
    guard_history: list[tuple[str, ...]] = field(default_factory=list)
    configs_recorded: set[int] = field(default_factory=set)


@dataclass
class Session:
    agent: str
    session_id: str
    explicit: bool
    run_id: str
    started_wall: float
    started_mono: float
    last_seen: float
    guards: Any = None  # the session's guard state (proxy.guards.session.SessionGuards)
    conversation: Conversation = field(default_factory=Conversation)
    terminated: bool = False
    ended: bool = False
    inflight: int = 0

    @property
    def key(self) -> SessionKey:
        return (self.agent, self.session_id if self.explicit else None)


@dataclass(frozen=True)
class Refused:
    """The session was terminated; the call must be refused."""

    session: Session | None
    reason: str


class SessionManager:
    def __init__(self, *, idle_timeout_s: float, terminated_ttl_s: float) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.terminated_ttl_s = terminated_ttl_s
        self._live: dict[SessionKey, Session] = {}
        self._terminated_explicit: dict[SessionKey, float] = {}  # key -> refuse until (monotonic)
        self._by_run: dict[str, Session] = {}

    def lookup(
        self, agent: str, explicit_id: str | None, *, now: float, wall: float
    ) -> tuple[Session, bool] | Refused:
        """The live session for this call, starting one if needed: (session, created)."""
        key: SessionKey = (agent, explicit_id)
        until = self._terminated_explicit.get(key)
        if until is not None:
            if now < until:
                return Refused(self._live.get(key), "session terminated")
            del self._terminated_explicit[key]
        current = self._live.get(key)
        if current is not None:
            # a call still in flight (a long stream) keeps its session alive
            idle = current.inflight == 0 and now - current.last_seen >= self.idle_timeout_s
            if current.terminated and not idle:
                # Retrying a terminated automatic session keeps it refused: the idle clock restarts.
                current.last_seen = now
                return Refused(current, "session terminated")
            if not idle and not current.ended:
                current.last_seen = now
                return current, False
            self._forget(current)
        session = Session(
            agent=agent,
            session_id=explicit_id or f"auto-{uuid.uuid4().hex[:12]}",
            explicit=explicit_id is not None,
            run_id=str(uuid.uuid4()),
            started_wall=wall,
            started_mono=now,
            last_seen=now,
        )
        self._live[key] = session
        self._by_run[session.run_id] = session
        return session, True

    def expire(self, agent: str, explicit_id: str | None, now: float) -> Session | None:
        """The session at this key if it has gone idle (and is not terminated): the engine ends its
        run before `lookup` starts the next one, so no run is left `running` between sweeps."""
        current = self._live.get((agent, explicit_id))
        if (
            current is None
            or current.terminated
            or current.inflight
            or now - current.last_seen < self.idle_timeout_s
        ):
            return None
        self._forget(current)
        return None if current.ended else current

    def idle_sessions(self, now: float) -> list[Session]:
        """Sessions past their idle timeout with nothing in flight: the engine ends their runs."""
        out = []
        for s in list(self._live.values()):
            if s.inflight == 0 and now - s.last_seen >= self.idle_timeout_s:
                self._forget(s)
                if not s.ended:
                    out.append(s)
        for key, until in list(self._terminated_explicit.items()):
            if until <= now:
                del self._terminated_explicit[key]
        return out

    def terminate(self, session: Session, now: float) -> None:
        session.terminated = True
        if session.explicit:
            self._terminated_explicit[session.key] = now + self.terminated_ttl_s

    def by_run_id(self, run_id: str) -> Session | None:
        return self._by_run.get(run_id)

    def live(self) -> list[Session]:
        return [s for s in self._live.values() if not s.ended]

    def _forget(self, session: Session) -> None:
        if self._live.get(session.key) is session:
            del self._live[session.key]
        self._by_run.pop(session.run_id, None)
