"""WebSocket pass-through (SPEC §4.2, §5.5): the Responses API over WebSocket, and any other socket.

An upgrade request on a proxied route (`GET` with `Upgrade: websocket`) is relayed with aiohttp's
own client and server WebSockets: Tripwire opens the upstream socket first, with the request's
headers as `forward.request_headers` makes them for HTTP (no hop-by-hop or `X-Tripwire-*` header,
the agent's key or the upstream's own, subprotocols and `openai-beta` kept); an upstream that
refuses the upgrade has its status (and headers) answered to the client. Then frames go both ways
as they arrive, never held back: text, binary, ping and pong, and close frames with their codes
(a side that drops its connection without a close frame is cut on the other side too).

On a Responses socket (`/v1/responses`, `/llm/NAME/responses`) the JSON messages are read on the
way through. Each `response.create` the client sends is one LLM call, run through the same
pipeline stages as an HTTP call (parse, session, guards, record; `socket_pipeline`), so guards,
trace events, `call_seq` / `guard_input`, chains and metrics are those of HTTP calls. Only the
forwarding differs: the message is sent upstream only once the guards admitted it, and the
upstream's events are fed, as SSE, to the Responses dialect's stream accumulator until the
call's `response.completed` / `.incomplete` / `.failed` (or an `error` event) settles it. A
refusal is the protocol's `error` event (a BLOCK: the synthetic completed response's events);
when it ends the session the socket is closed with 1008. Other client messages (`response.steer`,
`response.processed`, ...) are relayed as they are, and so is a warm-up (`generate: false`), which
generates nothing: it is not a call, but its tool outputs and chain link are kept.

Events are matched to calls by lane: the `stream_id` a `response.create` named (events echo it),
each lane first in, first out, one response at a time, as the server runs them. Sockets on any
other path (`/v1/realtime`, `/mcp/NAME`, ...) are relayed, not recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import aiohttp
import orjson
from aiohttp import WSMsgType, web
from multidict import CIMultiDict
from yarl import URL

from proxy import llm
from proxy.aiohttp_compat import upgrade_headers
from proxy.appkeys import ENGINE
from proxy.constants import GUARD_SESSION_TERMINATED
from proxy.dialects import dialect_name, openai_responses
from proxy.dialects.contract import Accumulator
from proxy.exchange import Answer, Exchange
from proxy.forward import DRAIN_CUT_REASON, json_error, request_headers, response_headers
from proxy.pipeline import BaseStage, Pipeline
from proxy.recovery import MaxTokensRecoveryStage
from proxy.responses_stage import ResponsesChainStage
from proxy.routing import Route, join_upstream
from proxy.socket_limits import close_when_idle
from proxy.sse import SSEDecoder
from proxy.stages import TEXT_MARGIN, ForwardStage

if TYPE_CHECKING:
    from proxy.engine import Engine

log = logging.getLogger("tripwire.websocket")

RESPONSES = "openai_responses"
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
# the handshake headers each hop negotiates itself (aiohttp, on each side)
HANDSHAKE_HEADERS = frozenset(
    {
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-accept",
        "sec-websocket-protocol",
    }
)
CLOSE_TIMEOUT_S = 10.0  # how long a close handshake may take on either side
# upstream messages (a final event repeats the whole output) may be larger than what a client sends
UPSTREAM_MAX_MSG = 512 * 1024 * 1024
# messages up to this size are parsed whole to find their type; larger ones by their head and tail
HEAD_PARSE_LIMIT = 256 * 1024
_TYPE = re.compile(r'"type"\s*:\s*"([A-Za-z0-9_.]+)"')
_STREAM_ID = re.compile(r'"stream_id"\s*:\s*"((?:[^"\\]|\\.)*)"')
_STATUS = re.compile(r'"status"\s*:\s*(\d{3})\b')


def is_websocket_upgrade(request: web.Request) -> bool:
    """A WebSocket opening handshake (RFC 6455 §4.1): GET, `Upgrade: websocket`, `Connection: upgrade`."""
    if request.method != "GET":
        return False
    upgrade = {t.strip().lower() for v in request.headers.getall("Upgrade", []) for t in v.split(",")}
    connection = {t.strip().lower() for v in request.headers.getall("Connection", []) for t in v.split(",")}
    return "websocket" in upgrade and "upgrade" in connection


def is_responses_socket(route: Route) -> bool:
    return route.kind == "llm" and dialect_name(route.path, "POST") == RESPONSES


# --- the per-call pipeline ------------------------------------------------------------------------


class SocketParseStage(BaseStage):
    """The LLM parse stage, for a `response.create` message: a streamed Responses call."""

    name = "parse_llm"

    def __init__(self, inner: BaseStage) -> None:
        self.inner = inner

    async def request(self, ex: Exchange) -> None:
        await self.inner.request(ex)
        if isinstance(ex.protocol, llm.LLMProtocol) and ex.call is not None:
            # the events come as the SSE stream's: read them with the stream accumulator
            ex.call = replace(ex.call, stream=True)
            ex.observer = ex.protocol.dialect.StreamAccumulator(ex.call)

    async def finish(self, ex: Exchange) -> None:
        await self.inner.finish(ex)


class SocketForwardStage(BaseStage):
    """Send the admitted message on the upstream socket and wait until its response settles."""

    name = "forward"

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def request(self, ex: Exchange) -> None:
        call: SocketCall = ex.ws_call
        limit_text = getattr(ex.observer, "limit_text", None)
        if limit_text is not None:
            limit_text(self.engine.settings.max_field_bytes + TEXT_MARGIN)  # as ForwardStage
        try:
            await call.relay.forward(call)
        finally:
            if ex.forwarded and ex.protocol is not None:
                ex.protocol.after_forward(ex)


def socket_pipeline(http: Pipeline, engine: Engine) -> Pipeline:
    """The LLM pipeline's own stages (the same Responses chain stage: its chains are shared with
    HTTP calls), with the socket's parse and forward stages. Max-tokens recovery forwards over
    HTTP (and only chat completions): not on a socket."""
    stages: list[Any] = []
    for stage in http.stages:
        if isinstance(stage, llm.LLMParseStage):
            stages.append(SocketParseStage(stage))
        elif isinstance(stage, ForwardStage):
            stages.append(SocketForwardStage(engine))
        elif not isinstance(stage, MaxTokensRecoveryStage):
            stages.append(stage)
    return Pipeline(stages)


# --- messages -------------------------------------------------------------------------------------


def accumulator(ex: Exchange) -> Accumulator:
    """The dialect's stream accumulator the socket's parse stage set on a call's exchange."""
    assert ex.observer is not None
    return cast("Accumulator", ex.observer)


def sse_of(text: str) -> bytes:
    """A message as one SSE event, so the dialect's stream accumulator reads it as over HTTP.

    Raw line breaks can only be whitespace between JSON tokens: each line becomes a `data:` line,
    which the decoder joins back with `\\n`.
    """
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "".join(f"data: {line}\n" for line in lines).encode("utf-8", "surrogatepass") + b"\n"


def event_head(text: str) -> tuple[str | None, str | None, int | None, str | None]:
    """(type, stream_id, status, response id) of an upstream message; cheap for large ones."""
    if len(text) <= HEAD_PARSE_LIMIT:
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None, None, None, None
        if not isinstance(data, dict):
            return None, None, None, None
        kind, lane, status = data.get("type"), data.get("stream_id"), data.get("status")
        response = data.get("response")
        rid = response.get("id") if isinstance(response, dict) else None
        return (
            kind if isinstance(kind, str) else None,
            lane if isinstance(lane, str) else None,
            status if isinstance(status, int) and not isinstance(status, bool) else None,
            rid if isinstance(rid, str) else None,
        )
    head, tail = text[:4096], text[-4096:]
    kind_m = _TYPE.search(head)
    lane_m = _STREAM_ID.search(head) or _STREAM_ID.search(tail)
    status_m = _STATUS.search(head) if kind_m and kind_m.group(1) == "error" else None
    return (
        kind_m.group(1) if kind_m else None,
        lane_m.group(1) if lane_m else None,
        int(status_m.group(1)) if status_m else None,
        None,
    )


def refusal_messages(answer: Answer, stream_id: str | None) -> list[str]:
    """What the client gets for a call Tripwire answered itself (SPEC §5.5).

    A BLOCK is the synthetic completed response, as the SSE stream's events; any other refusal is
    the Responses WebSocket `error` event: `{"type": "error", "status", "error": {...}, "headers"}`,
    the error object being the HTTP refusal's (code = the guard code, message, guardrail, ...).
    """
    messages: list[str] = []
    if answer.status < 400 and answer.content_type.startswith("text/event-stream"):
        decoder = SSEDecoder()
        for event in [*decoder.feed(answer.body), *decoder.flush()]:
            if event.data is None:
                continue
            data = orjson.loads(event.data)
            if stream_id is not None:
                data["stream_id"] = stream_id
            messages.append(orjson.dumps(data).decode())
        return messages
    try:
        body = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        text = answer.body[:2000].decode("utf-8", "replace")
        error = {"type": "tripwire_error", "code": None, "message": text}
    error = {**error, "param": error.get("param")}
    error_event: dict[str, Any] = {
        "type": "error",
        "status": answer.status,
        "error": error,
        "headers": {k.lower(): v for k, v in answer.headers.items()},
    }
    if stream_id is not None:
        error_event["stream_id"] = stream_id
    return [orjson.dumps(error_event).decode()]


def classify(raw: bytes) -> tuple[str, dict[str, Any] | None]:
    """("call" | "warmup" | "relay", the parsed message) for a client message on a Responses socket.

    A call is a `response.create` that generates, and anything the guards cannot read as another
    client event (not JSON, not an object, no type): judged like an HTTP body, never forwarded
    unjudged. Other client events (`response.steer`, `response.processed`, ...) are relayed.
    """
    try:
        body, _ = llm.read_body(raw)
    except ValueError:
        return "call", None
    if not isinstance(body, dict) or not isinstance(body.get("type"), str):
        return "call", None
    if body["type"] != "response.create":
        return "relay", body
    if body.get("generate") is False:
        return "warmup", body
    return "call", body


def valid_close_code(code: Any) -> int:
    """A close code that may be sent in a close frame (1005, 1006 and 1015 never are)."""
    if isinstance(code, int) and (1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999):
        return code
    return 1000


# --- one socket -----------------------------------------------------------------------------------


class SocketCall:
    """One `response.create` on the socket: its exchange (None for a warm-up) and where it stands."""

    def __init__(self, relay: SocketRelay, frame: str | bytes, stream_id: str | None) -> None:
        self.relay = relay
        self.frame = frame
        self.stream_id = stream_id
        self.ex: Exchange | None = None
        self.warmup: dict[str, Any] | None = None  # a warm-up's message
        self.response_id: str | None = None
        loop = asyncio.get_running_loop()
        self.admitted: asyncio.Future[bool] = loop.create_future()  # sent upstream (True) or not
        self.done: asyncio.Future[None] = loop.create_future()  # its response settled
        self.task: asyncio.Task[None] | None = None
        self.started = False  # an event of its response was seen
        self.fed = False

    def admit(self, sent: bool) -> None:
        if not self.admitted.done():
            self.admitted.set_result(sent)

    def feed(self, text: str, kind: str | None, response_id: str | None) -> None:
        if kind is not None and kind.startswith("response."):
            self.started = True  # (not for other events in between, such as rate-limit notices)
        if response_id is not None and self.response_id is None:
            self.response_id = response_id
        ex = self.ex
        if ex is None:
            return
        if ex.first_byte_at is None:
            ex.first_byte_at = time.monotonic()
        accumulator(ex).feed(sse_of(text))
        self.fed = True

    def fail_with(self, text: str, status: int | None) -> None:
        """A request-level `error` event answers the call: read as an HTTP error answer is."""
        ex = self.ex
        if ex is not None:
            ex.upstream_status = status if status is not None else 500
            if ex.first_byte_at is None:
                ex.first_byte_at = time.monotonic()
            observer = accumulator(ex)
            if self.fed:
                observer.feed(sse_of(text))
            else:
                observer.status = ex.upstream_status
                observer.feed(text.encode("utf-8", "surrogatepass"))  # a plain body: an error answer
        self.settle()

    def settle(self, *, upstream_error: str | None = None, reason: str | None = None) -> None:
        """The response is over: cleanly (its terminal event), or cut (`upstream_error` when the
        upstream broke it, `reason` when the client or Tripwire ended the socket)."""
        self.admit(False)
        if self.done.done():
            return
        ex = self.ex
        if ex is not None:
            ex.upstream_done = time.monotonic()
            if upstream_error is not None and ex.upstream_error is None:
                ex.stream_complete = False
                ex.upstream_error = upstream_error
            elif reason is not None:
                ex.stream_complete = False
                if ex.incomplete_reason is None:
                    ex.incomplete_reason = reason
        self.done.set_result(None)


class SocketRelay:
    """Both directions of one proxied WebSocket, and the calls on it (Responses sockets)."""

    def __init__(
        self,
        engine: Engine,
        request: web.Request,
        route: Route,
        client: web.WebSocketResponse,
        upstream: aiohttp.ClientWebSocketResponse,
        pipeline: Pipeline | None,
        post_view: web.Request | None,
    ) -> None:
        self.engine = engine
        self.request = request
        self.route = route
        self.client = client
        self.upstream = upstream
        self.pipeline = pipeline
        self.post_view = post_view  # the handshake request as the parse stage knows a call: a POST
        self.chains = (
            next((s for s in pipeline.stages if isinstance(s, ResponsesChainStage)), None)
            if pipeline
            else None
        )
        self.lanes: dict[str | None, deque[SocketCall]] = {}
        self.calls: list[SocketCall] = []
        self.client_lock = asyncio.Lock()
        self.upstream_lock = asyncio.Lock()
        self.closing = False
        self.end_reason = "the WebSocket closed before the answer ended"
        self.cutting: asyncio.Task[None] | None = None  # the drain's close (cut_for_drain)
        self.last_message = time.monotonic()  # a text or binary message either way (idle timeout)

    # --- running -----------------------------------------------------------------------------

    async def run(self) -> None:
        pumps = [
            asyncio.create_task(self.client_pump(), name="tripwire-ws-client"),
            asyncio.create_task(self.upstream_pump(), name="tripwire-ws-upstream"),
        ]
        idle_s = self.engine.settings.websocket_idle_timeout_s
        watchdog = (
            asyncio.create_task(close_when_idle(self, idle_s), name="tripwire-ws-idle") if idle_s else None
        )
        try:
            _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            # the side that ended has closed both sockets (else this does): the other pump ends
            await self.shut()
            if pending:
                await asyncio.wait(pending, timeout=CLOSE_TIMEOUT_S)
        except asyncio.CancelledError:
            self.end_reason = "Tripwire shut down before the answer ended"
            raise
        finally:
            if watchdog is not None:
                watchdog.cancel()
            for task in pumps:
                task.cancel()
            for task in pumps:
                with contextlib.suppress(asyncio.CancelledError):
                    try:
                        await task
                    except Exception:
                        log.exception("WebSocket relay pump failed")
            await self.shut()
            for call in self.calls:
                call.settle(reason=self.end_reason)
            tasks = [c.task for c in self.calls if c.task is not None]
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    def cut_for_drain(self) -> int:
        """The drain's grace is over: the answers still arriving end as HTTP streams are cut (the
        client's socket closes with 1001, going away, before their terminal events) and are recorded
        as incomplete. Returns how many answers were cut."""
        open_calls = [call for call in self.calls if not call.done.done()]
        for call in open_calls:
            call.settle(reason=DRAIN_CUT_REASON)
        if open_calls and not self.closing:
            self.cutting = asyncio.create_task(self.close_both(1001, "Tripwire is shutting down"))
        return len(open_calls)

    async def shut(self) -> None:
        """Both sockets closed, whatever happened."""
        self.closing = True
        for ws in (self.upstream, self.client):
            if not ws.closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(ws.close(code=1001), CLOSE_TIMEOUT_S)

    async def client_pump(self) -> None:
        client = self.client
        while True:
            msg = await client.receive()
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                self.last_message = time.monotonic()
                if self.pipeline is not None:
                    if not await self.from_client(msg):
                        return
                elif not await self.send(self.upstream, msg, self.upstream_lock):
                    return
            elif msg.type in (WSMsgType.PING, WSMsgType.PONG):
                if not await self.control(self.upstream, msg):
                    return
            elif msg.type == WSMsgType.CLOSE:
                self.end_reason = "the client closed the WebSocket before the answer ended"
                await self.close_from(client, self.upstream, msg.data, msg.extra)
                return
            else:  # CLOSING (Tripwire is closing it), CLOSED / ERROR: the client went away
                if not self.closing:
                    self.end_reason = "the client disconnected before the answer ended"
                    self.closing = True
                    with contextlib.suppress(Exception):
                        await self.upstream.close(code=1001)  # going away
                return

    async def upstream_pump(self) -> None:
        upstream = self.upstream
        while True:
            msg = await upstream.receive()
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                self.last_message = time.monotonic()
                if self.pipeline is not None:
                    self.observe(msg.data)  # read on the way (no waiting), then relayed at once
                if not await self.send(self.client, msg, self.client_lock):
                    return
            elif msg.type in (WSMsgType.PING, WSMsgType.PONG):
                if not await self.control(self.client, msg):
                    return
            elif msg.type == WSMsgType.CLOSE:
                code = msg.data
                self.fail_all(f"the upstream closed the WebSocket (code {code}) before the response ended")
                await self.close_from(upstream, self.client, code, msg.extra)
                return
            else:  # CLOSING (Tripwire is closing it), CLOSED / ERROR: the upstream connection broke
                if not self.closing:
                    self.closing = True
                    self.fail_all("the upstream WebSocket connection broke before the response ended")
                    # end the client's socket the way the upstream's ended: without a close frame
                    transport = self.request.transport
                    if transport is not None:
                        transport.close()
                return

    async def close_from(self, source: Any, other: Any, code: Any, reason: str | None) -> None:
        """`source` sent a close frame: pass its code on, then complete `source`'s handshake."""
        if self.closing:
            return
        self.closing = True
        code = valid_close_code(code)
        message = (reason or "").encode("utf-8")[:123]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(other.close(code=code, message=message), CLOSE_TIMEOUT_S)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(source.close(code=code, message=message), CLOSE_TIMEOUT_S)

    async def close_both(self, code: int, reason: str) -> None:
        """Tripwire ends the socket (a guard ended the session, or drain): the client gets `code`."""
        if self.closing:
            return
        self.closing = True
        self.end_reason = reason
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                self.client.close(code=code, message=reason.encode()[:123]), CLOSE_TIMEOUT_S
            )
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.upstream.close(code=1000), CLOSE_TIMEOUT_S)

    @staticmethod
    async def send(ws: Any, msg: aiohttp.WSMessage, lock: asyncio.Lock) -> bool:
        try:
            async with lock:
                if msg.type == WSMsgType.TEXT:
                    await ws.send_str(msg.data)
                else:
                    await ws.send_bytes(msg.data)
        except (ConnectionError, RuntimeError, aiohttp.ClientError):
            return False
        return True

    @staticmethod
    async def control(ws: Any, msg: aiohttp.WSMessage) -> bool:
        try:
            if msg.type == WSMsgType.PING:
                await ws.ping(msg.data)
            else:
                await ws.pong(msg.data)
        except (ConnectionError, RuntimeError, aiohttp.ClientError):
            return False
        return True

    async def send_client_text(self, texts: list[str]) -> bool:
        try:
            async with self.client_lock:
                for text in texts:
                    await self.client.send_str(text)
        except (ConnectionError, RuntimeError):
            return False
        return True

    # --- calls (client -> upstream) ------------------------------------------------------------

    async def from_client(self, msg: aiohttp.WSMessage) -> bool:
        """A client message on a Responses socket; False when the socket is over."""
        data = msg.data
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        kind, body = classify(raw)
        if kind == "relay":
            return await self.send(self.upstream, msg, self.upstream_lock)
        stream_id = body.get("stream_id") if body is not None else None
        stream_id = stream_id if isinstance(stream_id, str) else None
        call = SocketCall(self, data, stream_id)
        if kind == "warmup":
            assert body is not None
            call.warmup = body
            self.warmup_tool_results(body, raw)
            self.lane(stream_id).append(call)
            if not await self.send(self.upstream, msg, self.upstream_lock):
                self.lane(stream_id).remove(call)
                return False
            return True
        # the calls answered so far are recorded before this one is judged (its tool outputs
        # complete their tool calls; its chain continues their responses)
        await self.finish_settled()
        if self.engine.draining:
            answer = json_error(503, "Tripwire is shutting down", "tripwire_unavailable", "draining")
            await self.send_client_text(refusal_messages(answer, stream_id))
            await self.close_both(1001, "Tripwire is shutting down")
            return False
        ex = Exchange(
            request=self.post_view or self.request,
            route=self.route,
            body=raw,
            started=time.monotonic(),
            started_wall=time.time(),
        )
        ex.ws_call = call
        call.ex = ex
        self.calls.append(call)
        call.task = asyncio.create_task(self.run_call(ex), name="tripwire-ws-call")
        waiting: set[asyncio.Future[Any]] = {call.admitted, call.task}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if call.admitted.done() and call.admitted.result():
            return True  # sent upstream: its events come back through the upstream pump
        try:
            await call.task
        except Exception:
            log.exception("a WebSocket call failed in the pipeline")
        if ex.forwarded:
            return True  # the upstream socket was gone: its pump ends the relay
        answer = ex.answer or json_error(500, "Tripwire produced no answer", "tripwire_internal", "internal")
        if not await self.send_client_text(refusal_messages(answer, stream_id)):
            return False
        if self.ends_session(ex, answer):
            guard = answer.headers.get("X-Tripwire-Guard") or "guard"
            await self.close_both(1008, f"tripwire: {guard}")  # SPEC §5.5: policy violation
            return False
        return True

    @staticmethod
    def ends_session(ex: Exchange, answer: Answer) -> bool:
        """The refusal ended the session, or came from one already ended: the socket goes too."""
        if ex.session is not None:
            return bool(ex.session.terminated)
        return answer.headers.get("X-Tripwire-Guard") == GUARD_SESSION_TERMINATED

    async def run_call(self, ex: Exchange) -> None:
        assert self.pipeline is not None
        self.engine.call_started()
        try:
            await self.pipeline.run(ex)
        finally:
            self.engine.call_finished()
            call: SocketCall = ex.ws_call
            call.admit(False)

    async def finish_settled(self) -> None:
        """Wait for the calls whose responses settled to be recorded (their finish hooks)."""
        pending = [c.task for c in self.calls if c.done.done() and c.task is not None and not c.task.done()]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        self.calls = [c for c in self.calls if c.task is None or not c.task.done()]

    async def forward(self, call: SocketCall) -> None:
        """The forward stage: send the admitted message upstream, then wait for its response."""
        ex = call.ex
        assert ex is not None
        frame: str | bytes = call.frame
        if ex.upstream_body is not None:  # rewritten (a synthetic parent): text as the client's was
            frame = ex.upstream_body if isinstance(call.frame, bytes) else ex.upstream_body.decode()
        ex.forwarded = True
        ex.upstream_started = time.monotonic()
        ex.upstream_status = 200  # the upstream accepted the socket; an `error` event may say otherwise
        lane = self.lane(call.stream_id)
        lane.append(call)
        try:
            async with self.upstream_lock:
                if isinstance(frame, str):
                    await self.upstream.send_str(frame)
                else:
                    await self.upstream.send_bytes(frame)
        except (ConnectionError, RuntimeError, aiohttp.ClientError) as e:
            if call in lane:
                lane.remove(call)
            ex.upstream_status = None
            call.settle(upstream_error=f"the upstream WebSocket is closed: {type(e).__name__}")
            return
        call.admit(True)
        await call.done

    def lane(self, stream_id: str | None) -> deque[SocketCall]:
        lane = self.lanes.get(stream_id)
        if lane is None:
            lane = self.lanes[stream_id] = deque()
        return lane

    def fail_all(self, why: str) -> None:
        for lane in self.lanes.values():
            while lane:
                lane.popleft().settle(upstream_error=why)

    # --- events (upstream -> client) -----------------------------------------------------------

    def observe(self, data: str | bytes) -> None:
        """Feed an upstream event to the call it belongs to; settle the call on its last event.

        Synchronous: the event is relayed right after, and a call is settled before the client can
        see its final event (so the client's next `response.create` finds it recorded).
        """
        text = data if isinstance(data, str) else data.decode("utf-8", "replace")
        kind, stream_id, status, response_id = event_head(text)
        lane = self.lanes.get(stream_id)
        if not lane:
            self.lanes.pop(stream_id, None)
            return
        if kind == "error":
            # a request-level error (it has an HTTP status) answers the oldest response.create
            # not yet started; a stream error belongs to the response running (its terminal follows)
            target = lane[0]
            if status is not None:
                target = next((c for c in lane if not c.started), lane[0])
            if target.started:
                target.feed(text, kind, None)
                return
            lane.remove(target)
            target.fail_with(text, status)
            return
        call = lane[0]
        if response_id is not None and call.response_id not in (None, response_id):
            # another response's events: the running one never ended, it broke
            lane.popleft()
            call.settle(upstream_error="the upstream started a new response before this one ended")
            if not lane:
                return
            call = lane[0]
        call.feed(text, kind, response_id)
        if kind in TERMINAL:
            lane.popleft()
            call.settle()
            if kind == "response.completed" and call.warmup is not None:
                self.link_warmup(call)

    # --- warm-ups (generate: false) -------------------------------------------------------------

    def link_warmup(self, call: SocketCall) -> None:
        """A warm-up's response id continues the chain: link it (its input, no answer step) so a
        later call naming it is judged on the whole history."""
        body = call.warmup
        if body is None or call.response_id is None or self.chains is None:
            return
        req = _parse_responses(body)
        if req is None:
            return
        self.chains.link_warmup(self.route.agent, req, call.response_id)
        call.warmup = None

    def warmup_tool_results(self, body: dict[str, Any], raw: bytes) -> None:
        """Tool outputs a warm-up brings complete their tool calls (TOOL_CALL), as a call's would."""
        req = _parse_responses(body)
        if req is None or not req.tool_results:
            return
        key = (self.route.agent, self.route.session)
        session = next((s for s in self.engine.sessions.live() if s.key == key and not s.terminated), None)
        if session is None:
            return
        ex = Exchange(
            request=self.post_view or self.request,
            route=self.route,
            body=raw,
            started=time.monotonic(),
            started_wall=time.time(),
            session=session,
        )
        ex.call = req
        try:
            llm.record_tool_results(ex, self.engine)
        except Exception:
            log.exception("could not record a warm-up's tool outputs")


def _parse_responses(body: dict[str, Any]) -> Any:
    try:
        return openai_responses.parse_request(body)
    except Exception:
        log.exception("could not parse a Responses warm-up")
        return None


# --- the handshake --------------------------------------------------------------------------------


def upstream_handshake_headers(incoming: Mapping[str, str], upstream: Any) -> CIMultiDict[str]:
    """The client's handshake headers as HTTP's are forwarded (the key handled the same way),
    minus those each hop's WebSocket negotiates itself."""
    headers = request_headers(incoming, upstream, identity_encoding=False)
    for name in list(headers.keys()):
        if name.lower() in HANDSHAKE_HEADERS:
            headers.popall(name, None)
    return headers


def requested_protocols(headers: Mapping[str, str]) -> list[str]:
    values = headers.getall("Sec-WebSocket-Protocol", []) if hasattr(headers, "getall") else []
    return [p.strip() for v in values for p in v.split(",") if p.strip()]


def client_handshake_headers(upstream_headers: Mapping[str, str] | None) -> CIMultiDict[str]:
    """The upstream's 101 headers for the client's 101 (request ids, rate limits, model, ...)."""
    out: CIMultiDict[str] = CIMultiDict()
    if upstream_headers is None:
        return out
    for name, value in response_headers(upstream_headers, drop_length=True).items():
        low = name.lower()
        if low in HANDSHAKE_HEADERS or low in ("date", "server", "content-type"):
            continue
        out.add(name, value)
    return out


def refused_upgrade(e: aiohttp.WSServerHandshakeError) -> web.Response:
    """The upstream answered the upgrade with another status: the client gets that status."""
    status = e.status if 200 <= e.status <= 599 and e.status != 101 else 502
    headers: CIMultiDict[str] = CIMultiDict()
    if e.headers is not None:
        for name, value in response_headers(e.headers, drop_length=True).items():
            if name.lower() in HANDSHAKE_HEADERS or name.lower() in ("content-type", "content-encoding"):
                continue
            headers.add(name, value)
    message = (
        f"the upstream refused the WebSocket upgrade: HTTP {e.status}"
        if status == e.status
        else f"the upstream answered the WebSocket upgrade wrongly: {e.message}"
    )
    answer = json_error(status, message, "upstream_websocket_refused", "websocket_upgrade_refused")
    response = answer.to_response()
    for name, value in headers.items():
        response.headers.add(name, value)
    return response


async def handle_websocket(request: web.Request, route: Route, http_pipeline: Pipeline) -> web.StreamResponse:
    """Relay one WebSocket: the upstream's socket first, then the client's, then frames both ways."""
    engine: Engine = request.app[ENGINE]
    upstream = engine.upstreams.get(route.kind, route.upstream)
    url = join_upstream(upstream.url, route.path, request.rel_url.raw_query_string)
    extensions = request.headers.get("Sec-WebSocket-Extensions", "").lower()
    session = engine.forwarder.session
    assert session is not None, "Forwarder.start() not called"
    try:
        up = await session.ws_connect(
            URL(url, encoded=True),
            headers=upstream_handshake_headers(request.headers, upstream),
            protocols=requested_protocols(request.headers),
            autoclose=False,  # close frames are relayed with their codes
            autoping=False,  # pings and pongs too
            compress=15 if "permessage-deflate" in extensions else 0,
            max_msg_size=UPSTREAM_MAX_MSG,
            timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=CLOSE_TIMEOUT_S),
        )
    except aiohttp.WSServerHandshakeError as e:
        log.info("upstream %s refused a WebSocket upgrade: HTTP %s", route.upstream, e.status)
        return refused_upgrade(e)
    except TimeoutError:
        return json_error(
            504, "Tripwire: the upstream did not answer in time", "upstream_timeout", "upstream_timeout"
        ).to_response()
    except aiohttp.ClientError as e:
        return json_error(
            502,
            f"Tripwire could not reach the upstream: {type(e).__name__}",
            "upstream_unreachable",
            "upstream_unreachable",
        ).to_response()
    responses = is_responses_socket(route)
    post_view = request.clone(method="POST") if responses else None
    client = web.WebSocketResponse(
        protocols=(up.protocol,) if up.protocol else (),
        autoclose=False,
        autoping=False,
        timeout=CLOSE_TIMEOUT_S,
        max_msg_size=engine.settings.max_body_bytes,
    )
    client.headers.extend(client_handshake_headers(upgrade_headers(up)))
    try:
        await client.prepare(request)
    except BaseException:
        await up.close(code=1001)
        raise
    pipeline = socket_pipeline(http_pipeline, engine) if responses else None
    relay = SocketRelay(engine, request, route, client, up, pipeline, post_view)
    engine.sockets.add(relay)
    try:
        await relay.run()
    finally:
        engine.sockets.discard(relay)
    return client


async def handle_websocket_within_limits(
    request: web.Request, route: Route, http_pipeline: Pipeline
) -> web.StreamResponse:
    """`handle_websocket`, within the agent's cap on open sockets (proxy/socket_limits.py)."""
    slots = request.app[ENGINE].socket_slots
    if not slots.take(route.agent):
        log.warning("refused a WebSocket of agent %s: %d already open", route.agent, slots.per_agent)
        return slots.refusal(route.agent)
    try:
        return await handle_websocket(request, route, http_pipeline)
    finally:
        slots.give_back(route.agent)
