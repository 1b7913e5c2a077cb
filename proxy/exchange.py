"""The per-request state that rides through the pipeline (as mitmproxy's HTTPFlow)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from proxy.call_request import AnswerMaker, CallRequest, ClientAnswer, aiohttp_answer
from proxy.classify.calls import Call
from proxy.guards.breaker import Ticket
from proxy.guards.budget import Reservation
from proxy.guards.budget_window import WindowHold
from proxy.guards.decision import Decision
from proxy.responses_chain import History
from proxy.routing import Route
from proxy.sessions import Session


@dataclass
class Answer:
    """A response Tripwire gives itself instead of forwarding (a guard fired, a bad request)."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    def to_response(self) -> web.Response:
        resp = web.Response(status=self.status, body=self.body, headers=self.headers)
        resp.content_type = self.content_type.split(";")[0]
        if "charset=" in self.content_type or self.content_type.startswith(("application/json", "text/")):
            resp.charset = "utf-8"
        return resp


class CallProtocol(Protocol):
    """A recorded call's protocol adapter (proxy.llm.LLMProtocol, proxy.mcp.adapter.MCPProtocol):
    what the pipeline's shared stages ask of it, whatever the call's kind."""

    kind: str  # "llm" | "mcp"

    def render_block(self, ex: Exchange, decision: Decision, text: str) -> Answer: ...

    def render_refusal(self, ex: Exchange, decision: Decision, text: str) -> Answer: ...

    def reservation_estimate(self, ex: Exchange) -> float: ...

    def continues(self, ex: Exchange) -> bool: ...  # an MCP resend after `input_required`

    async def await_result(self, ex: Exchange) -> None: ...  # MCP: a result may come on another stream

    def after_forward(self, ex: Exchange) -> None: ...  # read the result the observer saw

    def record(self, ex: Exchange, engine: Any) -> None: ...  # write the call's events


class StreamObserver(Protocol):
    """Fed every chunk of the answer as it is relayed (a dialect's accumulator, proxy.llm's
    BodyCollector, proxy.mcp.observe.MessageObserver); returns what goes on to the client.
    Optional members, read with getattr: `status`, `flush()`, `limit_text(n)`, `rewrites`."""

    def feed(self, chunk: bytes) -> bytes: ...


@dataclass(init=False)  # see __init__
class Exchange:
    """One call. Its ~50 other fields start as their class-level defaults and become the
    instance's own when a stage sets them: a call's exchange is made per request, and the
    dataclass's generated __init__ assigned all of them."""

    request: CallRequest  # aiohttp's web.Request or the lean lane's (proxy/call_request.py)
    route: Route
    body: bytes
    started: float  # monotonic, for durations and proxy overhead
    started_wall: float  # epoch seconds, for event timestamps
    session: Session | None = None
    # the call's lane makes the answer a forwarded call is relayed into (proxy/call_request.py)
    answer_maker: AnswerMaker = aiohttp_answer

    # `protocol` and `observer` are typed by the Protocols above; readers of one kind's own members
    # (`dialect`, `pending`, an accumulator's `finish`) narrow with isinstance. The fields still typed
    # Any hold objects of the layers above (proxy.mcp, proxy.guard_trace, proxy.websocket), which this
    # module must not import.

    # set by the handler before the pipeline runs (proxy/classify/calls.py): what the call is, decided
    # once; every stage reads it instead of deriving its own answer
    classified: Call | None = None

    # parse (LLMParseStage, MCPParseStage): the protocol adapter for this call and
    # what it understood of the request
    protocol: CallProtocol | None = None  # None: forwarded unrecorded
    call: Any = None  # LLMRequest (proxy.dialects.base), or proxy.mcp.jsonrpc.MCPToolCall
    upstream_body: bytes | None = None  # a rewritten body to send instead of `body`
    # set by LLMParseStage; read by the session stage (proxy.stages) for the client's episode id
    request_json: dict[str, Any] | None = None
    # set by MCPParseStage for a legacy SSE server's POST; read by the forward stage instead of the route's URL
    upstream_url: str | None = None
    # set by MCPParseStage: the JSON-RPC messages of the POST; read by its finish (an error for a server down)
    mcp_messages: list[Any] | None = None
    # set by MCPParseStage: the hub's key for the client's MCP session; read by its finish (hub.forget)
    mcp_session_key: str | None = None
    # set by MCPParseStage for a batch: its tools/calls as (MCPToolCall, proxy.mcp.hub.Pending); read by its finish
    mcp_batch: list[tuple[Any, Any]] | None = None
    # set by proxy.websocket.responses.ResponsesSocket: the WebSocket call (SocketCall) it carries; read there
    ws_call: Any = None

    # guards
    decisions: list[Decision] = field(default_factory=list)
    reservation: Reservation | None = None  # the budget's hold, settled or released after the call
    window_hold: WindowHold | None = None  # the agent's budgets over time: its hold, settled after (SPEC §9)
    breaker_ticket: Ticket | None = None  # the circuit breaker's admission, reported after the call
    # what the admission's gates hold for the call until it ends (proxy.admission.Hold: a concurrent
    # call's slot), given back by the guard stage's finish
    admission_holds: tuple[Any, ...] = ()
    guard_event_id: str | None = None  # the LOOP_WARNING / ERROR written for a refusal
    guard_trace: Any = None  # proxy.guard_trace.GuardTrace: what the call's event keeps for replay
    # shared guard state (proxy/guard_backend/): the name of the call's check in the run's guard
    # log (its settle names it), and the circuit's admission made in the same round trip
    # (a proxy.admission.breaker.BreakerAdmission, read by the shared breaker stage)
    shared_check: str | None = None
    breaker_admission: Any = None
    # set by the Responses chain stage (proxy.stages.responses_chain): the request body as sent, read when a
    # block is remembered; and the history its previous_response_id stands for (a
    # proxy.responses_chain.History), read by the guard stage instead of the request's own
    responses_body: dict[str, Any] | None = None
    history: History | None = None
    # set by the guard stage when it blocks (BLOCK): the text of the synthetic answer; read by the chain stage
    block_text: str | None = None
    # set by the guard stage when the guards ask a person (SPEC §5.5a): (the session's guards, the
    # decision, its call_seq), which the hold stage (proxy.stages.hold) holds the call for
    asked: tuple[Any, Decision, int] | None = None
    # set by the guard stage for an MCP resend after `input_required`; its after-stage then does nothing
    guards_skipped: bool = False
    # set by the guard stage when a held streamed call was approved: the answer it started while
    # holding (a proxy.approvals.hold.HeldStream), which the forwarded stream goes on in
    held_stream: Any = None

    # answering
    answer: Answer | None = None  # set to answer without the upstream
    response: ClientAnswer | None = None  # what the client received (forwarded)
    # shared guard state (SPEC §8): the relayed answer's end (its last bytes, its clean end or cut) is
    # held until the pipeline's finish hooks have settled the call; the handler then runs `held_end`
    hold_end: bool = False
    held_end: Callable[[], Awaitable[None]] | None = None

    # forward: what the upstream did
    forwarded: bool = False  # the upstream was called (even if it then failed)
    observer: StreamObserver | None = None  # fed every chunk of the answer
    upstream_status: int | None = None
    upstream_started: float | None = None
    first_byte_at: float | None = None
    upstream_done: float | None = None
    upstream_error: str | None = None  # connection error, timeout, broken stream
    stream_complete: bool = True
    result: Any = None  # LLMResult (proxy.dialects.base), or proxy.mcp.jsonrpc.MCPToolResult
    # set by the forwarder: how many resends it took; read by the LLM record (meta.upstream_retries)
    upstream_retries: int = 0
    # set by the forwarder when the client hung up; it then stops writing to the client
    client_disconnected: bool = False
    # set by the forwarder / the WebSocket relay: why an answer ended short that is not the
    # upstream's failure; read by proxy.llm.llm_result (an "Incomplete" error)
    incomplete_reason: str | None = None
    # set by the forwarder: a compressed answer decoded past `max_decoded_bytes`, the observer read
    # only its start; read by proxy.llm.llm_result (recorded truncated)
    content_truncated: bool = False
    # set by Forwarder.abort_all when drain grace is over; read by the forwarder (end the answer abnormally)
    drain_aborted: bool = False
    # set by MCPParseStage's observer / MCPProtocol when the tool result arrived; read by MCPProtocol.record
    mcp_result_at: float | None = None

    # record: what the call's events said
    # set by LLMProtocol.settle from the pricing quote; read by the LLM event, the guards' settle, replay
    cost_usd: float = 0.0
    tokens: int = 0  # total tokens of the answer; set and read as cost_usd
    priced_model: str | None = None  # the model the price was found for; set by settle, read by the metrics
    llm_event_id: str | None = None  # the LLM_CALL's id (proxy.llm_trace sets it; tests read it)
    # set by MCPProtocol.record: the TOOL_CALL event's id; read by the guards' after-stage
    tool_event_id: str | None = None
    mcp_recorded: bool = False  # set by MCPProtocol.record; MCPParseStage's finish records it otherwise

    def __init__(
        self,
        request: CallRequest,
        route: Route,
        body: bytes,
        started: float,
        started_wall: float,
        session: Session | None = None,
        answer_maker: AnswerMaker = aiohttp_answer,
    ) -> None:
        self.request = request
        self.route = route
        self.body = body
        self.started = started
        self.started_wall = started_wall
        self.session = session
        self.answer_maker = answer_maker
        self.decisions = []  # the only field whose default is not shared: made per call

    def overhead_ms(self, now: float) -> str:
        """The `x-tripwire-overhead-ms` value of an answer whose head goes out at `now`: the time
        since the call arrived, less the upstream's wait for its head (when it was forwarded)."""
        spent = now - self.started
        if self.upstream_started is not None and self.first_byte_at is not None:
            spent -= self.first_byte_at - self.upstream_started
        return f"{max(spent, 0.0) * 1000:.3f}"

    @property
    def refused(self) -> bool:
        """Tripwire answered instead of the upstream (a guard, a bad request): not a recorded call."""
        return self.answer is not None and not self.forwarded

    def upstream_failed(self) -> bool:
        """Breaker failure: connection error, timeout, 5xx, a stream that broke (SPEC §5.3)."""
        if self.upstream_error is not None:
            return True
        return self.upstream_status is not None and self.upstream_status >= 500
