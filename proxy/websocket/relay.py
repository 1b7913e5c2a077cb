"""The frame relay of one proxied WebSocket (SPEC §4.2): frames go both ways as they arrive, never held
back: text, binary, ping and pong, and close frames with their codes (a side that drops its
connection without a close frame is cut on the other side too). A socket idle past
`websocket_idle_timeout_s` is closed (proxy/socket_limits.py).

`SocketRelay` relays any socket as it is; a socket whose messages are calls (the Responses API's,
proxy/websocket/responses.py) reads them on the way through its hooks: `from_client`, `observe`,
`upstream_ended`, `ended`, `cut_for_drain`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import WSMsgType, web

from proxy.socket_limits import close_when_idle

if TYPE_CHECKING:
    from proxy.engine import Engine

log = logging.getLogger("tripwire.websocket")

CLOSE_TIMEOUT_S = 10.0  # how long a close handshake may take on either side


def valid_close_code(code: Any) -> int:
    """A close code that may be sent in a close frame (1005, 1006 and 1015 never are)."""
    if isinstance(code, int) and (1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999):
        return code
    return 1000


class SocketRelay:
    """Both directions of one proxied WebSocket."""

    def __init__(
        self,
        engine: Engine,
        request: web.Request,
        client: web.WebSocketResponse,
        upstream: aiohttp.ClientWebSocketResponse,
    ) -> None:
        self.engine = engine
        self.request = request
        self.client = client
        self.upstream = upstream
        # the calls on the socket not yet recorded (a Responses socket's): the idle watchdog waits
        # while one waits for its answer (proxy/socket_limits.py)
        self.calls: list[Any] = []
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
            if pending and self.closing:
                # a close handshake under way (the other pump passes a close frame on, then answers
                # it with the same code): let it end before shut() says 1001 to what is left open
                await asyncio.wait(pending, timeout=CLOSE_TIMEOUT_S)
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
            await self.ended()

    def cut_for_drain(self) -> int:
        """The drain's grace is over: returns how many answers it cut (a plain socket carries none)."""
        return 0

    async def ended(self) -> None:
        """Both sockets are closed: a socket carrying calls settles and records them."""

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
                if not await self.from_client(msg):
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
                settled = self.observe(msg.data)  # read on the way (no waiting), then relayed at once
                if settled is not None:
                    await self.settled_before_end(settled)
                if not await self.send(self.client, msg, self.client_lock):
                    return
            elif msg.type in (WSMsgType.PING, WSMsgType.PONG):
                if not await self.control(self.client, msg):
                    return
            elif msg.type == WSMsgType.CLOSE:
                code = msg.data
                self.upstream_ended(
                    f"the upstream closed the WebSocket (code {code}) before the response ended"
                )
                await self.close_from(upstream, self.client, code, msg.extra)
                return
            else:  # CLOSING (Tripwire is closing it), CLOSED / ERROR: the upstream connection broke
                if not self.closing:
                    self.closing = True
                    self.upstream_ended("the upstream WebSocket connection broke before the response ended")
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

    # --- what a socket carrying calls reads on the way ---------------------------------------------

    async def from_client(self, msg: aiohttp.WSMessage) -> bool:
        """A client's text or binary message; False when the socket is over."""
        return await self.send(self.upstream, msg, self.upstream_lock)

    def observe(self, data: str | bytes) -> Any:
        """An upstream message, about to be relayed to the client; the call it ended, if any
        (`settled_before_end` is awaited with it before the message is relayed)."""
        return None

    async def settled_before_end(self, call: Any) -> None:
        """Hook: wait until the call an upstream message ended is settled (ResponsesSocket)."""

    def upstream_ended(self, why: str) -> None:
        """The upstream's socket closed or broke: no answer still awaited will come."""
