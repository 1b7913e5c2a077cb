"""What a session is: the state one AgentDbg run keeps between its calls (SPEC §3), apart from the
bookkeeping that finds and ends sessions (proxy/sessions.py, `SessionManager`, which re-exports
these). Plain data, slotted and lazy where a stateless service's one-call runs would otherwise each
hold empty containers for the idle timeout (issue 33).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from proxy.recent_keys import RecentKeys

SessionKey = tuple[str, str | None]  # (agent, explicit session id or None for automatic)

# lineage memory per automatic run, newest kept (a conversation continues one of its recent states)
MAX_HISTORIES_PER_RUN = 256
MAX_RESPONSES_PER_RUN = 1024


@dataclass(slots=True)
class PendingToolCall:
    """A function-calling tool call the model asked for, waiting for its result in a later request."""

    name: str
    arguments: Any
    asked_at: float  # wall clock of the LLM answer that asked for it
    llm_event_id: str
    # a Codex code-mode `exec` call: the calls its script makes, recorded with its result
    nested: list[Any] = field(default_factory=list)


@dataclass(slots=True)
class Conversation:
    """What the proxy remembers of a session's LLM traffic between calls.

    Its tool-call dicts are made when first asked for (a stateless service's call is a run of its
    own, whose conversation has no tool call: issue 33); `has_pending_tool_calls` and
    `tool_event_ids_so_far` read without making them."""

    # the previous LLM call's messages: how many, and a digest of them, so the next call records
    # only what is new when it continues that conversation, and all of it when it does not
    prompt_messages_seen: int = 0
    prompt_digest: str | None = None
    # replay (proxy.guard_trace): the previous request's history as step ids, and the config
    # revisions already written into the trace
    guard_history: Sequence[tuple[str, ...]] = ()  # (a list once a request has steps)
    # the dialect's reading of that request (dialects.base.ParseState), when it has one: the next
    # request that goes on from it compares and judges only its new steps
    guard_state: Any = None
    configs_recorded: RecentKeys[int] = field(default_factory=RecentKeys)  # (one, as a rule)
    _pending_tool_calls: dict[str, PendingToolCall] | None = field(default=None, init=False, repr=False)
    _mcp_signatures: dict[str, int] | None = field(default=None, init=False, repr=False)
    _response_tool_calls: dict[str, list[Any]] | None = field(default=None, init=False, repr=False)
    _tool_event_ids: dict[str, str] | None = field(default=None, init=False, repr=False)

    @property
    def pending_tool_calls(self) -> dict[str, PendingToolCall]:
        """Function-calling tool calls the model asked for, waiting for their results, by id."""
        if self._pending_tool_calls is None:
            self._pending_tool_calls = {}
        return self._pending_tool_calls

    @property
    def has_pending_tool_calls(self) -> bool:
        return bool(self._pending_tool_calls)

    @property
    def mcp_signatures(self) -> dict[str, int]:
        """MCP tool calls recorded in this session, by signature, so the same call seen again as a
        function-calling result in the LLM history is recorded once (SPEC §4.1 TOOL_CALL)."""
        if self._mcp_signatures is None:
            self._mcp_signatures = {}
        return self._mcp_signatures

    @property
    def response_tool_calls(self) -> dict[str, list[Any]]:
        """Responses API: tool calls per response id (`previous_response_id` chains carry no history)."""
        if self._response_tool_calls is None:
            self._response_tool_calls = {}
        return self._response_tool_calls

    @property
    def tool_event_ids(self) -> dict[str, str]:
        """Function-calling tool_call_id -> its TOOL_CALL event id (a LOOP_WARNING's evidence)."""
        if self._tool_event_ids is None:
            self._tool_event_ids = {}
        return self._tool_event_ids

    @property
    def tool_event_ids_so_far(self) -> Mapping[str, str]:
        """`tool_event_ids` to read (an empty mapping while there is none)."""
        return self._tool_event_ids if self._tool_event_ids is not None else _NO_IDS


_NO_IDS: Mapping[str, str] = MappingProxyType({})


@dataclass(slots=True)
class Lineage:
    """What an automatic run remembers to recognise the requests that continue it (bounded)."""

    announced: str | None = None  # the episode id its client announced, if any
    source: str | None = None
    # kept in order, oldest first, a dict only once there are two (a stateless service holds one
    # Lineage per call for the idle timeout, with one history and one answer: proxy/recent_keys.py)
    histories: RecentKeys[bytes] = field(default_factory=RecentKeys)  # whole-history digests
    answers: RecentKeys[bytes] = field(default_factory=RecentKeys)  # keys of answers it gave
    # its newest answer, until a request carrying it comes: among runs that gave the same answer to
    # the same conversation (an evaluation batch), a continuation goes to one still waiting for it
    waiting: bytes | None = None
    # the Responses ids it produced (`responses`), made when first asked for: a chat call's run
    # produces none (issue 33: 48 bytes a one-call run)
    _responses: RecentKeys[str] | None = field(default=None, repr=False)

    @property
    def responses(self) -> RecentKeys[str]:
        """The Responses ids it produced, oldest first."""
        if self._responses is None:
            self._responses = RecentKeys()
        return self._responses

    @property
    def has_responses(self) -> bool:
        """Whether it produced a Responses id (without making `responses`)."""
        return bool(self._responses)

    def is_empty(self) -> bool:
        """No conversation seen yet (only calls with none, e.g. MCP tool calls)."""
        return self.announced is None and not self.histories and not self.has_responses and not self.answers


@dataclass(slots=True)
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
    lineage: Lineage = field(default_factory=Lineage)

    @property
    def key(self) -> SessionKey:
        return (self.agent, self.session_id if self.explicit else None)


@dataclass(frozen=True)
class Refused:
    """The session was terminated; the call must be refused."""

    session: Session | None
    reason: str


class Unmatched:
    """`SessionManager.lookup`'s default: match the call itself."""


UNMATCHED = Unmatched()
