"""A Responses socket (`/v1/responses`, `/llm/NAME/responses`; a dialect with `WEBSOCKET_CALLS`): the
relay reads the JSON messages on the way through (SPEC §4.2, §5.5).

Each `response.create` the client sends is one LLM call, run through the same pipeline stages as an
HTTP call (parse, session, guards, record; proxy/websocket/stages.py), so guards, trace events,
`call_seq` / `guard_input`, chains and metrics are those of HTTP calls. Only the forwarding differs:
the message is sent upstream only once the guards admitted it, and the upstream's events are fed, as
SSE, to the dialect's stream accumulator until the call's `response.completed` / `.incomplete` /
`.failed` (or an `error` event) settles it (proxy/websocket/matching.py says which call an event
belongs to). A refusal is the protocol's `error` event (a BLOCK: the synthetic completed response's
events); when it ends the session the socket is closed with 1008. Other client messages
(`response.steer`, `response.processed`, ...) are relayed as they are, and so is a warm-up
(`generate: false`), which generates nothing: it is not a call, but its tool outputs and chain link
are kept.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import WSMsgType, web

from proxy import jsonparse, llm
from proxy.constants import GUARD_SESSION_TERMINATED
from proxy.dialects import dialect_for
from proxy.dialects.base import LLMRequest
from proxy.exchange import Answer, Exchange
from proxy.forward import DRAIN_CUT_REASON, json_error
from proxy.guards.permissions import permission
from proxy.pipeline import Pipeline
from proxy.routing import Route
from proxy.stages.responses_chain import ResponsesChainStage
from proxy.websocket.calls import SocketCall, refusal_messages
from proxy.websocket.matching import StreamQueues, classify
from proxy.websocket.relay import SocketRelay

if TYPE_CHECKING:
    from proxy.engine import Engine

log = logging.getLogger("tripwire.websocket")


class ResponsesSocket(SocketRelay):
    """A relayed socket whose `response.create` messages are LLM calls."""

    def __init__(
        self,
        engine: Engine,
        request: web.Request,
        route: Route,
        client: web.WebSocketResponse,
        upstream: aiohttp.ClientWebSocketResponse,
        pipeline: Pipeline,
        post_view: web.Request,
    ) -> None:
        super().__init__(engine, request, client, upstream)
        self.route = route
        self.pipeline = pipeline
        self.post_view = post_view  # the handshake request as the parse stage knows a call: a POST
        self.chains = next((s for s in pipeline.stages if isinstance(s, ResponsesChainStage)), None)
        self.queues: StreamQueues[SocketCall] = StreamQueues()
        dialect = dialect_for(route.path, "POST")
        assert dialect is not None  # a socket whose calls are read (handler.is_responses_socket)
        self.dialect = dialect  # a warm-up is parsed with it
        self.calls: list[SocketCall] = []

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

    async def ended(self) -> None:
        for call in self.calls:
            call.settle(reason=self.end_reason)
        tasks = [c.task for c in self.calls if c.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- calls (client -> upstream) ------------------------------------------------------------

    def without_denied_tools(self, msg: aiohttp.WSMessage, body: dict[str, Any]) -> aiohttp.WSMessage:
        """A warm-up or another client event (`session.update`, ...) carrying tools, at its top or
        one object down, loses the agent's denied ones as a call does (attack round 2): an upstream
        that keeps them for the calls after must not see them."""
        config = self.engine.guards.config(self.route.agent)
        if not config.tools.restricts or config.in_shadow:
            return msg
        tools = config.tools

        def keep(name: str) -> bool:
            return permission(tools, name) != "deny"

        out = self.dialect.without_tools(body, keep) or body
        for key, value in list(out.items()):
            if isinstance(value, dict) and isinstance(value.get("tools"), list):
                kept = self.dialect.without_tools(value, keep)
                out = out if kept is None else {**out, key: kept}
        if out is body:
            return msg
        return aiohttp.WSMessage(WSMsgType.TEXT, jsonparse.dumps(out).decode(), None)

    async def from_client(self, msg: aiohttp.WSMessage) -> bool:
        """A client message on a Responses socket; False when the socket is over."""
        data = msg.data
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        kind, body = classify(raw)
        if kind != "call" and body is not None:
            msg = self.without_denied_tools(msg, body)
        if kind == "relay":
            return await self.send(self.upstream, msg, self.upstream_lock)
        stream_id = body.get("stream_id") if body is not None else None
        stream_id = stream_id if isinstance(stream_id, str) else None
        call = SocketCall(self.forward, data, stream_id)
        if kind == "warmup":
            assert body is not None
            call.warmup = body
            self.warmup_tool_results(body, raw)
            msg = self.permitted_warmup(msg, body)
            self.queues.queue(stream_id).append(call)
            if not await self.send(self.upstream, msg, self.upstream_lock):
                self.queues.queue(stream_id).remove(call)
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
            request=self.post_view,
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
        queue = self.queues.queue(call.stream_id)
        queue.append(call)
        try:
            async with self.upstream_lock:
                if isinstance(frame, str):
                    await self.upstream.send_str(frame)
                else:
                    await self.upstream.send_bytes(frame)
        except (ConnectionError, RuntimeError, aiohttp.ClientError) as e:
            if call in queue:
                queue.remove(call)
            ex.upstream_status = None
            call.settle(upstream_error=f"the upstream WebSocket is closed: {type(e).__name__}")
            return
        call.admit(True)
        await call.done

    def upstream_ended(self, why: str) -> None:
        self.queues.fail_all(why)

    # --- events (upstream -> client) -----------------------------------------------------------

    def observe(self, data: str | bytes) -> SocketCall | None:
        """Feed an upstream event to the call it belongs to (proxy/websocket/matching.py).

        Synchronous: the event is relayed right after, and a call is settled before the client can
        see its final event (so the client's next `response.create` finds it recorded).
        """
        text = data if isinstance(data, str) else data.decode("utf-8", "replace")
        completed = self.queues.observe(text)
        if completed is not None and completed.warmup is not None:
            self.link_warmup(completed)
        return self.queues.settled

    async def settled_before_end(self, call: SocketCall) -> None:
        """With shared guard state, a response's terminal event reaches the client once its call is
        settled in the shared log (the pipeline's finish hooks ran): the agent's next call, sent over
        any replica, is judged with it (SPEC §8). The same socket's next call waits for that anyway
        (`finish_settled`)."""
        ex = call.ex
        if ex is not None and ex.hold_end and call.task is not None and not call.task.done():
            await asyncio.wait({call.task})

    # --- warm-ups (generate: false) -------------------------------------------------------------

    def link_warmup(self, call: SocketCall) -> None:
        """A warm-up's response id continues the chain: link it (its input, no answer step) so a
        later call naming it is judged on the whole history."""
        body = call.warmup
        if body is None or call.response_id is None or self.chains is None:
            return
        req = self.parse_warmup(body)
        if req is None:
            return
        self.chains.link_warmup(self.route.agent, req, call.response_id)
        call.warmup = None

    def permitted_warmup(self, msg: aiohttp.WSMessage, body: dict[str, Any]) -> aiohttp.WSMessage:
        """The warm-up without the tools the agent may not call: it prepares the model with the
        session's tools, and a denied one must not reach it from there either (SPEC §9)."""
        config = self.engine.services.guards.config(self.route.agent)
        if not config.tools.restricts or config.in_shadow:  # (shadow mode alters nothing)
            return msg
        tools = config.tools
        permitted = self.dialect.without_tools(body, lambda name: permission(tools, name) != "deny")
        if permitted is None:
            return msg
        return aiohttp.WSMessage(aiohttp.WSMsgType.TEXT, jsonparse.dumps(permitted).decode(), None)

    def warmup_tool_results(self, body: dict[str, Any], raw: bytes) -> None:
        """Tool outputs a warm-up brings complete their tool calls (TOOL_CALL), as a call's would."""
        req = self.parse_warmup(body)
        if req is None or not req.tool_results:
            return
        key = (self.route.agent, self.route.session)
        session = next((s for s in self.engine.sessions.live() if s.key == key and not s.terminated), None)
        if session is None:
            return
        ex = Exchange(
            request=self.post_view,
            route=self.route,
            body=raw,
            started=time.monotonic(),
            started_wall=time.time(),
            session=session,
        )
        ex.call = req
        try:
            llm.record_tool_results(ex, self.engine.services)
        except Exception:
            log.exception("could not record a warm-up's tool outputs")

    def parse_warmup(self, body: dict[str, Any]) -> LLMRequest | None:
        try:
            return self.dialect.parse_request(body)
        except Exception:
            log.exception("could not parse a Responses warm-up")
            return None
