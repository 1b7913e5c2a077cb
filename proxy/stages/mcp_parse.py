"""MCP traffic in the pipeline: the parse stage for POSTs to `/mcp/NAME`.

A single `tools/call` gets the MCP protocol adapter (so it is guarded and recorded); every other
message (initialize, tools/list, notifications, the client's answers to server requests, batches)
is forwarded unrecorded, its answer still watched so results on shared streams are matched.
POSTs to a legacy HTTP+SSE endpoint are sent to the URL the server's `endpoint` event named.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import orjson

from proxy import ids
from proxy.classify.calls import MCPCall, classify_mcp
from proxy.classify.duplicates import has_duplicate_keys
from proxy.classify.policy import fail_closed
from proxy.exchange import Answer, Exchange
from proxy.guards import tool_names
from proxy.mcp import jsonrpc
from proxy.mcp.adapter import MCPProtocol, record_tool_call
from proxy.mcp.hub import McpHub
from proxy.mcp.observe import MessageObserver
from proxy.mcp.tool_list import permitted_tools_list
from proxy.pipeline import BaseStage
from proxy.sessions import Refused

if TYPE_CHECKING:
    from proxy.services import Services

log = logging.getLogger("tripwire.mcp")


def hub_of(services: Services) -> McpHub:
    return services.mcp


class MCPParseStage(BaseStage):
    name = "parse_mcp"

    def __init__(self, services: Services) -> None:
        self.services = services
        self.hub = hub_of(services)

    async def request(self, ex: Exchange) -> None:
        request = ex.request
        route = ex.route
        legacy = self.hub.legacy.for_endpoint(route.upstream, route.path, request.rel_url.raw_query_string)
        if legacy is not None and legacy.upstream_post_url:
            ex.upstream_url = legacy.upstream_post_url
        if request.method != "POST":
            return
        classified = ex.classified
        if not isinstance(classified, MCPCall):  # (an exchange made without the handler)
            classified = ex.classified = classify_mcp(ex.body)
        if not isinstance(classified, MCPCall):  # the body is not JSON
            ex.answer = Answer(
                400,
                jsonrpc.render_error(
                    None, jsonrpc.PARSE_ERROR, "Tripwire: the request body is not JSON (JSON-RPC parse error)"
                ),
            )
            return
        messages, batch = list(classified.raw), classified.batch
        ex.mcp_messages = messages
        if self.refuse_unjudged(ex, classified):
            return
        mcp_session = request.headers.get("Mcp-Session-Id")
        if legacy is not None:
            session_key = legacy.session_key
        elif mcp_session:
            session_key = f"s:{mcp_session}"
        else:
            session_key = f"post:{ids.hex32()}"
        msg = messages[0] if len(messages) == 1 and not batch else None
        call = tool_call(
            msg, route.upstream, legacy is not None, mcp_session, request.headers, aggregated=route.aggregated
        )
        if call is None:
            lists = await self.filter_tools_lists(ex, messages, session_key)
            if legacy is not None:
                return  # (a legacy answer comes on the session's SSE stream, relayed by the hub)
            if batch:
                self.watch_batch(ex, messages, session_key, mcp_session, hold=lists)
            elif lists:
                server = route.upstream
                ex.observer = MessageObserver(
                    lambda m: self.hub.deliver(server, session_key, m),
                    limit=self.services.settings.max_body_bytes,
                    hold_json=lambda: True,
                )
            return  # forwarded as it is; a POST's answer only carries the answers to its own requests
        if legacy is not None:
            call.mcp_session_id = legacy.uid
        pending = self.hub.register(session_key, call)
        ex.mcp_session_key = session_key
        ex.protocol = MCPProtocol(self.services, self.hub, pending, session_key, legacy)
        ex.call = call
        if legacy is None:
            server = route.upstream

            def on_message(msg: dict[str, Any]) -> dict[str, Any] | None:
                replacement = self.hub.deliver(server, session_key, msg)
                if ex.result is None and pending.future.done() and pending.future.exception() is None:
                    # read at once: if the client hangs up next, later stages still see the result
                    ex.result = jsonrpc.tool_result(pending.future.result())
                    ex.mcp_result_at = time.monotonic()
                return replacement

            ex.observer = MessageObserver(
                on_message,
                limit=self.services.settings.max_body_bytes,
                hold_json=lambda: call.append_text is not None,
            )

    def fails_closed(self, ex: Exchange) -> bool:
        settings = self.services.settings
        config = self.services.guards.config(ex.route.agent)
        return fail_closed(config, settings.auth.require_agent_key, settings.passthrough_unknown)

    def refuse_unjudged(self, ex: Exchange, classified: MCPCall) -> bool:
        """Fail closed (issue 30): a `tools/call` the pipeline cannot judge - inside a batch (one
        answer cannot be part refused, and MCP 2025-06-18 dropped batches), or without an `id`
        (no answer to refuse it in) - is refused, not forwarded, whenever policy applies to the agent.
        True when it answered."""
        batch, messages = classified.batch, classified.raw
        if not self.fails_closed(ex):
            return False
        tool_calls = classified.tool_calls
        unreadable = classified.unjudgeable
        if unreadable is None and has_duplicate_keys(ex.body, list(messages) if batch else messages[0]):
            unreadable = "a message naming a key twice in one object (a server may read either)"
        if unreadable is None and (not tool_calls or (not batch and tool_calls[0].kind == "request")):
            return False
        agent = ex.route.agent
        if unreadable is not None:
            single = messages[0] if not batch and isinstance(messages[0], dict) else {}
            text = f"Tripwire cannot judge {unreadable}: refused while policy applies to agent {agent!r}"
            ex.answer = Answer(400, jsonrpc.render_error(single.get("id"), jsonrpc.INVALID_REQUEST, text))
            log.warning("refused an MCP POST of agent %s: %s", agent, unreadable)
            return True
        if batch:
            text = (
                f"Tripwire: a JSON-RPC batch holding a tools/call is refused while policy applies to agent "
                f"{agent!r}: send each request alone (MCP 2025-06-18 removed batching)"
            )
            errors = [
                orjson.loads(jsonrpc.render_error(m.get("id"), jsonrpc.INVALID_REQUEST, text))
                for m, c in zip(messages, classified.messages, strict=True)
                if c.kind == "request"
            ]
            if errors:
                ex.answer = Answer(200, orjson.dumps(errors))
                log.warning(
                    "refused a batch of %d messages of agent %s holding a tools/call", len(messages), agent
                )
                return True
        else:
            text = f"Tripwire: a tools/call needs an id (it is a request) while policy applies to agent {agent!r}"
        ex.answer = Answer(400, jsonrpc.render_error(None, jsonrpc.INVALID_REQUEST, text))
        log.warning("refused a tools/call without an id of agent %s", agent)
        return True

    async def filter_tools_lists(self, ex: Exchange, messages: list[Any], session_key: str) -> bool:
        """The `tools/list` requests whose answers are read: judged against the server's pinned
        tool definitions (docs/mcp.md "Changed tools"), then without the tools whose `SERVER__TOOL`
        the agent's permissions deny (SPEC §9), wherever they come. True when there is one (its
        answer must be read). Shadow mode alters nothing (pins are still kept)."""
        lists = [
            m
            for m in messages
            if isinstance(m, dict) and m.get("method") == "tools/list" and jsonrpc.kind(m) == "request"
        ]
        if not lists:
            return False
        route = ex.route
        config = self.services.guards.config(route.agent)
        permitted = config.tools.restricts and not config.in_shadow
        pinned = await self.services.pins.list_filter(
            route.upstream, route.agent, route.session, config.in_shadow
        )
        if not permitted and pinned is None:
            return False
        tools, server = config.tools, route.upstream

        def rewrite(answer: dict[str, Any]) -> dict[str, Any] | None:
            out = answer
            if pinned is not None:
                out = pinned(out) or out
            if permitted:
                out = permitted_tools_list(out, server, tools) or out
            return out if out is not answer else None

        for m in lists:
            self.hub.rewrite_answer(server, session_key, m.get("id"), rewrite)
        return True

    def watch_batch(
        self,
        ex: Exchange,
        messages: list[Any],
        session_key: str,
        mcp_session: str | None,
        *,
        hold: bool = False,
    ) -> None:
        """A batch (2025-03-26) is forwarded unguarded, but its tools/calls are still recorded.
        `hold`: an answer in it is rewritten (a filtered tools/list): a JSON body is held whole."""
        server = ex.route.upstream
        calls = [tool_call(m, server, False, mcp_session, ex.request.headers) for m in messages]
        entries = [(c, self.hub.register(session_key, c)) for c in calls if c is not None]
        if not entries and not hold:
            return
        if entries:
            ex.mcp_batch = entries
            ex.mcp_session_key = session_key
        ex.observer = MessageObserver(
            lambda m: self.hub.deliver(server, session_key, m),
            limit=self.services.settings.max_body_bytes,
            hold_json=lambda: hold,
        )

    def record_batch(self, ex: Exchange) -> None:
        session = None
        for call, pending in ex.mcp_batch or ():
            assert ex.mcp_session_key is not None  # set with mcp_batch
            self.hub.forget(ex.mcp_session_key, call)
            future = pending.future
            if not future.done() or future.cancelled() or future.exception() is not None:
                continue
            if session is None:
                opened = self.services.policy.open(ex.route.agent, ex.route.session, wall=ex.started_wall)
                if isinstance(opened, Refused):
                    return
                session = opened
            end = ex.upstream_done or time.monotonic()
            result = jsonrpc.tool_result(future.result())
            record_tool_call(self.services, self.hub, session, call, result, ex.started, ex.started_wall, end)

    async def finish(self, ex: Exchange) -> None:
        if ex.mcp_batch is not None:
            self.record_batch(ex)
        if isinstance(ex.call, jsonrpc.MCPToolCall):
            self.hub.forget(ex.mcp_session_key or "", ex.call)
            if ex.result is None and isinstance(ex.protocol, MCPProtocol):
                future = ex.protocol.pending.future  # delivered on another stream as the handler ended
                if future.done() and not future.cancelled() and future.exception() is None:
                    ex.result = jsonrpc.tool_result(future.result())
            if ex.result is not None and isinstance(ex.protocol, MCPProtocol) and not ex.mcp_recorded:
                # The pipeline was cut short after the result went by (the client closed the POST's
                # stream once it had its answer and the handler was cancelled): record it anyway.
                ex.protocol.record(ex, self.services)
        if ex.protocol is None and ex.answer is not None and ex.upstream_error and ex.upstream_status is None:
            # the server is down: a JSON-RPC error naming it, for any request the client waits on
            messages = ex.mcp_messages or []
            if len(messages) == 1 and jsonrpc.kind(messages[0]) == "request":
                message = f"MCP server {ex.route.upstream!r} failed: {ex.upstream_error}"
                ex.answer = Answer(
                    200,
                    jsonrpc.render_error(
                        messages[0].get("id"),
                        jsonrpc.TRIPWIRE_UPSTREAM_ERROR,
                        message,
                        {"server": ex.route.upstream},
                    ),
                )


def tool_call(
    msg: object,
    server: str,
    legacy: bool,
    mcp_session: str | None,
    headers: object,
    *,
    aggregated: bool = False,
) -> jsonrpc.MCPToolCall | None:
    """The parsed `tools/call`, or None for any other message. A call the aggregate endpoint sent
    (its route says so; no header can) is named `SERVER__TOOL`, as its client knows it."""
    if not isinstance(msg, dict) or jsonrpc.kind(msg) != "request" or msg.get("method") != "tools/call":
        return None
    params = msg.get("params")
    if not isinstance(params, dict) or not isinstance(params.get("name"), str):
        return None
    get = getattr(headers, "get", None)
    version = get("MCP-Protocol-Version") if get is not None else None
    return jsonrpc.MCPToolCall(
        server=server,
        tool_name=tool_names.qualified(server, params["name"]) if aggregated else params["name"],
        arguments=params.get("arguments") if params.get("arguments") is not None else {},
        jsonrpc_id=msg.get("id"),
        mcp_session_id=mcp_session,
        protocol_version=version,
        transport="legacy" if legacy else "streamable",
        continuation="inputResponses" in params or "requestState" in params,
        aggregated=aggregated,
    )


def mcp_parse_stage(services: Services) -> BaseStage:
    return MCPParseStage(services)
