"""Bounds on the relayed WebSockets (proxy/websocket/): how many one agent holds open, and how long
one may sit idle (settings `websocket_max_per_agent`, `websocket_idle_timeout_s`; docs/configuration.md).

Idle means no message (text or binary) either way and no Responses call waiting for its answer. Pings
and pongs are relayed but are not activity: the `websockets` library (the openai SDK's client) pings
every 20 s whatever the socket is used for, and Codex sends none. An idle socket is closed with 1001
(going away): Tripwire ends it on its own initiative while the client may still want it, which is
what 1001 says (1000 would claim the socket's purpose was fulfilled); the upstream's socket is closed
with 1000, as when Tripwire ends a socket for any other reason. Nothing is recorded: no call was open.

A handshake past the agent's cap is answered before the upgrade, in OpenAI's error shape, with 426
Upgrade Required: Codex takes a 426 to its WebSocket handshake as "no WebSocket here" and goes on over
HTTPS at once (its own tests mock a server without WebSockets that way), where Tripwire guards the
same calls; a 429 would have it retry the socket with back-off first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from aiohttp import web

from proxy.forward import json_error

log = logging.getLogger("tripwire.websocket")

IDLE_CLOSE_CODE = 1001  # going away (see above)
IDLE_REASON = "idle timeout"
REFUSED_STATUS = 426


class IdleWatched(Protocol):
    """What the watchdog reads of a relayed socket (proxy.websocket.relay.SocketRelay)."""

    closing: bool
    last_message: float  # time.monotonic() of the last text or binary message, either way
    calls: list[Any]  # its Responses calls; `call.done` settles with the call's answer

    async def close_both(self, code: int, reason: str) -> None: ...


async def close_when_idle(relay: IdleWatched, idle_timeout_s: float) -> None:
    """Close the socket once it has been idle `idle_timeout_s` (runs beside the relay's pumps)."""
    while not relay.closing:
        left = relay.last_message + idle_timeout_s - time.monotonic()
        if left > 0:
            await asyncio.sleep(left)
        elif any(not call.done.done() for call in relay.calls):
            # a call waits for its answer: the upstream's silence is ttfb_timeout_s's to judge
            await asyncio.sleep(idle_timeout_s)
        else:
            log.info("closing a WebSocket idle for %.0fs", idle_timeout_s)
            await relay.close_both(IDLE_CLOSE_CODE, IDLE_REASON)
            return


class SocketSlots:
    """Open WebSockets per agent (handshakes in progress included), under `per_agent` (None: no cap)."""

    def __init__(self, per_agent: int | None) -> None:
        self.per_agent = per_agent
        self.open: dict[str, int] = {}

    def take(self, agent: str) -> bool:
        held = self.open.get(agent, 0)
        if self.per_agent is not None and held >= self.per_agent:
            return False
        self.open[agent] = held + 1
        return True

    def give_back(self, agent: str) -> None:
        held = self.open.get(agent, 0) - 1
        if held > 0:
            self.open[agent] = held
        else:
            self.open.pop(agent, None)

    def refusal(self, agent: str) -> web.Response:
        message = (
            f"Tripwire: agent {agent!r} already has {self.per_agent} WebSockets open "
            "(websocket_max_per_agent); close one, or use HTTP"
        )
        answer = json_error(REFUSED_STATUS, message, "tripwire_limit", "websocket_limit_reached")
        return answer.to_response()
