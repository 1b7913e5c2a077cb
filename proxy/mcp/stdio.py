"""`--mcp-stdio NAME="CMD ARGS"`: a stdio MCP server as a child process, served over Streamable HTTP.

Each child gets a small internal aiohttp app on 127.0.0.1 (an ephemeral port) registered as an extra
MCP upstream, so the normal `/mcp/NAME` pipeline (recording, guards) forwards to it exactly as to
an HTTP server. The bridge speaks newline-delimited JSON-RPC on the child's stdin/stdout:
a POST's requests are written to stdin and the POST is answered with the child's response (as JSON
when nothing else came first, else as an SSE stream carrying the child's notifications and
requests, e.g. progress and sampling, then the response). A child that dies is restarted (its last
`initialize` is replayed so the client's session goes on); in-flight calls get a JSON-RPC error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from proxy.mcp import jsonrpc
from proxy.settings import StdioServerConfig, UpstreamConfig
from proxy.upstreams import UpstreamRegistry

if TYPE_CHECKING:
    pass

log = logging.getLogger("tripwire.mcp.stdio")

RESTART_DELAYS = (0.2, 1.0, 5.0)  # back-off between restarts of a crashing child
READY_WAIT_S = 10.0  # a POST waits this long for a (re)starting child
STDOUT_LIMIT = 64 * 1024 * 1024  # longest line (one JSON-RPC message) read from the child


@dataclass
class _Exchange:
    """One POST waiting for the child's responses to its requests."""

    waiting: set[str]
    progress_tokens: set[str]
    queue: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)


class StdioBridge:
    def __init__(self, name: str, config: StdioServerConfig) -> None:
        self.name = name
        self.config = config
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self.stopping = False
        self.by_id: dict[str, _Exchange] = {}
        self.inflight: list[_Exchange] = []
        self.initialize: dict[str, Any] | None = None
        self._initialize_asked: dict[str, dict[str, Any]] = {}  # initialize requests awaiting their answer
        self.replay_timeouts = 0
        self.initialized_sent = False
        self._internal: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._supervisor: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.restarts = 0

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application(client_max_size=STDOUT_LIMIT)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        await self._spawn()
        self._supervisor = asyncio.create_task(self._supervise(), name=f"tripwire-stdio-{self.name}")
        return self.url

    async def stop(self) -> None:
        self.stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        await self._kill()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _spawn(self) -> None:
        argv = shlex.split(self.config.command)
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, **self.config.env},
            limit=STDOUT_LIMIT,
        )
        log.info("stdio MCP server %s started (pid %s): %s", self.name, self.proc.pid, self.config.command)

    async def _kill(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        if proc.stdin is not None:
            proc.stdin.close()  # a stdio server exits when its input ends
        try:
            await asyncio.wait_for(proc.wait(), 2.0)
        except TimeoutError:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 3.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    async def _supervise(self) -> None:
        failures = 0
        while not self.stopping:
            assert self.proc is not None
            reader = asyncio.create_task(self._read(self.proc))
            try:
                if self.initialize is not None:
                    await self._replay_initialize(self.proc)
                self.ready.set()
                code = await self.proc.wait()
            finally:
                self.ready.clear()
            await reader
            if self.stopping:
                return
            self._fail_inflight(f"stdio MCP server {self.name!r} exited with code {code}; restarting it")
            delay = RESTART_DELAYS[min(failures, len(RESTART_DELAYS) - 1)]
            failures += 1
            log.warning("stdio MCP server %s exited (code %s); restarting in %.1fs", self.name, code, delay)
            await asyncio.sleep(delay)
            self.restarts += 1
            await self._spawn()

    async def _replay_initialize(self, proc: asyncio.subprocess.Process) -> None:
        """A restarted child knows no session: replay the client's handshake so its session goes on.

        A child that dies meanwhile ends the wait at once (the supervisor restarts it on its back-off).
        """
        assert self.initialize is not None
        msg_id = f"tripwire-init-{self.restarts}"
        key = jsonrpc.id_key(msg_id)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._internal[key] = future
        exited = asyncio.ensure_future(proc.wait())
        try:
            await self._write({**self.initialize, "id": msg_id})
            waiting: set[asyncio.Future[Any]] = {future, exited}
            await asyncio.wait(waiting, timeout=READY_WAIT_S, return_when=asyncio.FIRST_COMPLETED)
            if not future.done() and not exited.done():
                self.replay_timeouts += 1  # a live child that never answered (not one that died)
            if future.done() and self.initialized_sent:
                await self._write({"jsonrpc": "2.0", "method": "notifications/initialized"})
        except ConnectionError:
            pass  # the child is gone: proc.wait() in the supervisor returns next
        finally:
            self._internal.pop(key, None)
            exited.cancel()
        if not future.done():
            log.warning("stdio MCP server %s did not answer the replayed initialize", self.name)

    # --- the child's output --------------------------------------------------------------------

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while True:
            try:
                line = await proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                log.warning("stdio MCP server %s wrote a line over the limit; dropped", self.name)
                continue
            if not line:
                return
            line = line.strip()
            if not line:
                continue
            try:
                msg = orjson.loads(line)
            except orjson.JSONDecodeError:
                log.warning("stdio MCP server %s wrote a non-JSON line; dropped", self.name)
                continue
            self._route(msg, line)

    def _route(self, msg: Any, line: bytes) -> None:
        if jsonrpc.kind(msg) == "response":
            key = jsonrpc.id_key(msg.get("id"))
            internal = self._internal.pop(key, None)
            if internal is not None:
                if not internal.done():
                    internal.set_result(msg)
                return
            asked = self._initialize_asked.pop(key, None)
            if asked is not None and isinstance(msg.get("result"), dict):
                self.initialize = asked
            ex = self.by_id.pop(key, None)
            if ex is not None:
                ex.waiting.discard(key)
                ex.queue.put_nowait(line)
                if not ex.waiting and ex in self.inflight:
                    self.inflight.remove(ex)
            return
        target = self._target(msg)
        if target is not None:
            target.queue.put_nowait(line)
        else:
            log.debug("stdio MCP server %s: no open request for %s", self.name, msg.get("method"))

    def _target(self, msg: Any) -> _Exchange | None:
        """Where a notification or server request goes: its progress token's POST, else the oldest."""
        params = msg.get("params") if isinstance(msg, dict) else None
        token = params.get("progressToken") if isinstance(params, dict) else None
        if token is not None:
            for ex in self.inflight:
                if jsonrpc.id_key(token) in ex.progress_tokens:
                    return ex
        return self.inflight[0] if self.inflight else None

    def _fail_inflight(self, message: str) -> None:
        for key, ex in list(self.by_id.items()):
            ex.queue.put_nowait(
                jsonrpc.render_error(
                    orjson.loads(key), jsonrpc.TRIPWIRE_UPSTREAM_ERROR, message, {"server": self.name}
                )
            )
            ex.waiting.discard(key)
        self.by_id.clear()
        self.inflight.clear()
        self._initialize_asked.clear()

    async def _write(self, msg: Any) -> None:
        proc = self.proc
        if proc is None or proc.stdin is None or proc.returncode is not None:
            raise ConnectionError(f"stdio MCP server {self.name!r} is not running")
        proc.stdin.write(orjson.dumps(msg) + b"\n")
        await proc.stdin.drain()

    # --- the Streamable HTTP side --------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method != "POST":
            # no server-initiated stream and no session to delete: both optional in the spec
            return web.Response(status=405, headers={"Allow": "POST"})
        parsed = jsonrpc.parse_body(await request.read())
        if parsed is None:
            body = jsonrpc.render_error(None, jsonrpc.PARSE_ERROR, "Parse error: the body is not JSON")
            return web.Response(status=400, body=body, content_type="application/json")
        messages, batch = parsed
        requests = [m for m in messages if jsonrpc.kind(m) == "request"]
        try:
            await asyncio.wait_for(self.ready.wait(), READY_WAIT_S)
        except TimeoutError:
            return self._unavailable(requests, batch)
        ex = _Exchange(
            waiting={jsonrpc.id_key(m.get("id")) for m in requests},
            progress_tokens={jsonrpc.id_key(t) for t in map(_progress_token, requests) if t is not None},
        )
        for m in requests:
            self.by_id[jsonrpc.id_key(m.get("id"))] = ex
            if m.get("method") == "initialize":
                # kept for a restart only once the child accepts it: an mcp 2.x client in auto mode
                # may send `initialize` after a probe it gave up on, which the child (already serving
                # the 2026-07-28 era) refuses; replaying that handshake would put a restarted child in
                # the wrong era and it would refuse every enveloped request of the client
                self._initialize_asked[jsonrpc.id_key(m.get("id"))] = {
                    k: v for k, v in m.items() if k != "id"
                }
        if requests:
            self.inflight.append(ex)
        try:
            for m in messages:
                if isinstance(m, dict) and m.get("method") == "notifications/initialized":
                    self.initialized_sent = True
                await self._write(m)
        except (ConnectionError, BrokenPipeError, ConnectionResetError):
            self._forget(ex)
            return self._unavailable(requests, batch)
        if not requests:
            return web.Response(status=202)
        return await self._answer(request, ex, batch=batch)

    async def _answer(self, request: web.Request, ex: _Exchange, *, batch: bool) -> web.StreamResponse:
        try:
            first = await ex.queue.get()
            if not ex.waiting and ex.queue.empty():  # the response came first: plain JSON
                return web.Response(
                    body=b"[" + first + b"]" if batch else first, content_type="application/json"
                )
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await response.prepare(request)
            await response.write(jsonrpc.sse_message(first))
            while ex.waiting or not ex.queue.empty():
                await response.write(jsonrpc.sse_message(await ex.queue.get()))
            await response.write_eof()
            return response
        finally:
            self._forget(ex)

    def _forget(self, ex: _Exchange) -> None:
        for key in ex.waiting:
            self.by_id.pop(key, None)
        if ex in self.inflight:
            self.inflight.remove(ex)

    def _unavailable(self, requests: list[Any], batch: bool) -> web.Response:
        message = f"stdio MCP server {self.name!r} is not running"
        errors = [
            jsonrpc.render_error(r.get("id"), jsonrpc.TRIPWIRE_UPSTREAM_ERROR, message, {"server": self.name})
            for r in requests
        ]
        if batch and errors:
            return web.Response(body=b"[" + b",".join(errors) + b"]", content_type="application/json")
        if len(errors) != 1:
            return web.Response(status=503, text=message)
        return web.Response(body=errors[0], content_type="application/json")


def _progress_token(msg: dict[str, Any]) -> Any:
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta.get("progressToken") if isinstance(meta, dict) else None


class StdioServers:
    """Every `--mcp-stdio` child of one engine: started with `tripwire serve`, stopped with it."""

    def __init__(self, configs: Mapping[str, StdioServerConfig], upstreams: UpstreamRegistry) -> None:
        self.configs = configs
        self.upstreams = upstreams  # each child is the upstream of its name while it runs
        self.bridges: dict[str, StdioBridge] = {}

    async def start(self) -> None:
        for name, config in self.configs.items():
            bridge = StdioBridge(name, config)
            url = await bridge.start()
            self.bridges[name] = bridge
            self.upstreams.register("mcp", name, UpstreamConfig(url=url))

    async def stop(self) -> None:
        for name, bridge in list(self.bridges.items()):
            await bridge.stop()
            self.upstreams.unregister("mcp", name)
        self.bridges.clear()
