"""Real MCP servers for tests, written once for both SDK majors (mcp 1.x `FastMCP`, 2.x `MCPServer`).

`serve(...)` runs the SDK's own Starlette app under uvicorn in a thread, on 127.0.0.1 and a free
port, so the test's event loop is free for the client and Tripwire. Run as a script
(`python -m tests.mcp_servers stdio`) it is a stdio server, for `--mcp-stdio`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Annotated, Any

import anyio
from mcp.server.streamable_http import EventMessage, EventStore

from proxy.app import PIPELINES
from proxy.exchange import Exchange
from proxy.guards.decision import Action, Decision
from proxy.mcp.jsonrpc import MCPToolCall
from proxy.pipeline import BaseStage

try:  # mcp 2.x
    from mcp.server.mcpserver import Context, MCPServer, Resolve, Sample
    from mcp.types import CreateMessageResult, SamplingMessage, TextContent

    MCP_MAJOR = 2
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import Context  # type: ignore[no-redef]
    from mcp.server.fastmcp import FastMCP as MCPServer  # type: ignore[no-redef]

    MCP_MAJOR = 1


def build_server(*, sampling: bool = False, polling: bool = False, **settings: Any) -> Any:
    """The demo server: arithmetic, echo, a tool that reports progress and one that raises.

    `sampling` (mcp 2.x) adds `summarize`, which samples the client's LLM: a `sampling/createMessage`
    request on the POST's stream (handshake revisions) or an `input_required` round trip (2026-07-28).
    `polling` (mcp 2.x, with an event store) adds `poll_later`, which closes its POST's stream early.
    """
    server = MCPServer("tripwire-demo", **settings)
    if sampling:
        add_sampling_tool(server)
    if polling:

        @server.tool()
        async def poll_later(ctx: Context) -> str:
            """Close the POST's SSE stream first (2025-11-25 polling): the result comes on the resumed GET."""
            await ctx.close_sse_stream()
            await anyio.sleep(0.1)
            return "ready after polling"

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text back."""
        return f"echo: {text}"

    @server.tool()
    async def slow_count(steps: int, ctx: Context) -> str:
        """Count up, reporting progress at every step."""
        for i in range(steps):
            await ctx.report_progress(i + 1, steps)
        return f"counted to {steps}"

    @server.tool()
    def explode(reason: str) -> str:
        """Always fails."""
        raise ValueError(f"exploded: {reason}")

    return server


def ask_llm(topic: str) -> Any:
    """Resolver for `summarize`: sample the client's LLM (mcp 2.x)."""
    question = TextContent(type="text", text=f"summarize {topic}")
    return Sample([SamplingMessage(role="user", content=question)], max_tokens=50)


def add_sampling_tool(server: Any) -> None:
    @server.tool()
    def summarize(topic: str, summary: Annotated[CreateMessageResult, Resolve(ask_llm)]) -> str:
        """Summarize a topic with the client's LLM."""
        content = summary.content
        return f"summary of {topic}: {getattr(content, 'text', content)}"


class MemoryEventStore(EventStore):
    """Every event kept, so a client resuming with Last-Event-ID gets what it missed (resumability)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []  # (event id, stream id, message or None)

    async def store_event(self, stream_id: str, message: Any) -> str:
        event_id = str(len(self.events) + 1)
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: Any) -> str | None:
        ids = [e[0] for e in self.events]
        if last_event_id not in ids:
            return None
        at = ids.index(last_event_id)
        stream = self.events[at][1]
        for event_id, stream_id, message in self.events[at + 1 :]:
            if stream_id == stream and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream


class ServerThread:
    def __init__(self, app: Any) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("MCP test server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        # without waiting for open connections: a stream a client keeps open (the aggregate's upstream
        # session listens for list changes until its own session ends) would hold the join's 10 s
        self.server.force_exit = True
        self.thread.join(timeout=10)


@contextmanager
def serve(
    transport: str = "streamable-http",
    *,
    json_response: bool = False,
    stateless: bool = False,
    sampling: bool = False,
    resumable: bool = False,
) -> Iterator[str]:
    """Yield the server's endpoint URL (`.../mcp` for Streamable HTTP, `.../sse` for legacy SSE)."""
    if MCP_MAJOR == 1:
        server = build_server(json_response=json_response, stateless_http=stateless)
        app = server.sse_app() if transport == "sse" else server.streamable_http_app()
    else:
        server = build_server(sampling=sampling, polling=resumable)
        app = (
            server.sse_app()
            if transport == "sse"
            else server.streamable_http_app(
                json_response=json_response,
                stateless_http=stateless,
                event_store=MemoryEventStore() if resumable else None,
                retry_interval=50 if resumable else None,
            )
        )
    thread = ServerThread(app)
    base = thread.start()
    try:
        yield base + ("/sse" if transport == "sse" else "/mcp")
    finally:
        thread.stop()


@asynccontextmanager
async def connect(transport: str, url: str) -> AsyncIterator[Any]:
    """An mcp 2.x client: `sse` over legacy HTTP+SSE, `auto` speaking 2026-07-28, else the handshake."""
    from mcp import Client
    from mcp.client.sse import sse_client

    if transport == "sse":
        async with Client(sse_client(url), mode="legacy", cache=None) as client:
            yield client
    else:
        async with Client(url, mode="auto" if transport == "auto" else "legacy", cache=None) as client:
            yield client


@asynccontextmanager
async def served_as_in_production(tw: Any) -> AsyncIterator[str]:
    """Tripwire's proxy app for `tw`'s engine on a runner set up as `tripwire serve` sets it up
    (proxy/app.py: no handler cancellation on a client hang-up; aiohttp's TestServer cancels); a
    short shutdown, as a GET stream whose client left ends only at the next upstream event."""
    from aiohttp import web

    from proxy.app import make_proxy_app, proxy_runner

    runner = proxy_runner(make_proxy_app(tw.engine), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


class PolicyStage(BaseStage):
    """Test-only guard: block `echo`, refuse `explode` (as an open circuit would), warn on `add`."""

    name = "test_policy"

    def __init__(self) -> None:
        self.seen: list[MCPToolCall] = []
        self.continues: list[bool] = []  # ex.protocol.continues(ex) of each call seen

    async def request(self, ex: Exchange) -> None:
        call = ex.call
        if not isinstance(call, MCPToolCall):
            return
        self.seen.append(call)
        self.continues.append(ex.protocol.continues(ex))
        if call.tool_name == "echo":
            decision = Decision(Action.BLOCK, "loop_detection", "same call 5 times", threshold=5, actual=5)
            ex.answer = ex.protocol.render_block(ex, decision, "[tripwire] blocked: same call 5 times")
        elif call.tool_name == "explode":
            decision = Decision(Action.BLOCK, "circuit_breaker", "circuit open", retry_after=12.5)
            ex.answer = ex.protocol.render_refusal(ex, decision, "[tripwire] refused: circuit open")
        elif call.tool_name == "add":
            call.append_text = "[tripwire] warning: add called again"


def install_policy(tw: Any) -> PolicyStage:
    stage = PolicyStage()
    tw.proxy.app[PIPELINES]["mcp"].insert_after("session", stage)
    return stage


if __name__ == "__main__":
    if sys.argv[1:] == ["stdio"]:
        build_server().run(transport="stdio")
