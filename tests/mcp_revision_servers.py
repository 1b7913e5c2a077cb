"""MCP servers that accept one era only, and a plain-HTTP `Transport` for upstream sessions' tests.

The SDK's own server (mcp 2.x `MCPServer`, tests/mcp_servers.py's demo) speaks both eras; each
server here is it behind a small ASGI gate that answers the other era the way a real one-era server
does:

- `handshake`: a server that predates 2026-07-28. A request whose `MCP-Protocol-Version` names a
  revision it does not know gets HTTP 400 with a JSON-RPC error -32000 "Bad Request: Unsupported
  protocol version" and no modern error body (what the TypeScript SDK 1.x and mcp 1.x servers answer;
  a dual-era client reads it as "fall back to initialize").
- `stateless`: a 2026-07-28-only server. A request without a stateless `MCP-Protocol-Version` (an
  `initialize`, a handshake-era call) gets HTTP 400 with UnsupportedProtocolVersionError -32022,
  `data.supported = ["2026-07-28"]` (the error 2026-07-28 defines; the SDK's auto client stops
  falling back on it); a GET or DELETE, 405 (2026-07-28 has no standalone stream, no session).

`RevisionServer` keeps its port across `stop()` / `start()`, so a test can restart a server and see
the session re-open.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from proxy.mcp.aggregate.upstream import JsonObject, ServerUnavailable, TransportStatus
from proxy.sse import SSEDecoder
from tests.mcp_servers import Context, build_server

HANDSHAKE = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
STATELESS = ("2026-07-28",)


def add_revision_tools(server: Any) -> None:
    """`grow`: adds a tool and announces the change (GET stream or `subscriptions/listen`); `chatty`
    logs; `nap` sleeps."""

    @server.tool()
    async def grow(name: str, ctx: Context) -> str:
        """Add a tool named `name`, then announce that the tool list changed."""

        def added() -> str:
            return f"I am {name}"

        server.add_tool(added, name=name, description=f"grown {name}")
        await ctx.notify_tools_changed()  # 2026-07-28: subscriptions/listen streams
        try:
            await ctx.request_context.session.send_tool_list_changed()  # handshake era
        except Exception:  # no connection-wide channel at 2026-07-28
            pass
        return f"grew {name}"

    @server.resource("memo://note")
    def note() -> str:
        """A note whose updates `touch` announces."""
        return "a note"

    @server.tool()
    async def touch(uri: str, ctx: Context) -> str:
        """Announce that the resource `uri` was updated (2026-07-28: to listen streams naming it)."""
        await ctx.notify_resource_updated(uri)
        return "touched"

    @server.tool()
    async def chatty(text: str, ctx: Context) -> str:
        """Log `text` at info level, then answer."""
        await ctx.info(text)
        return "said it"

    @server.tool()
    async def nap(seconds: float) -> str:
        """Sleep, then answer (for timeouts)."""
        import anyio

        await anyio.sleep(seconds)
        return "rested"


async def _send_json(send: Callable[..., Any], status: int, body: JsonObject | None) -> None:
    payload = orjson.dumps(body) if body is not None else b""
    headers = [(b"content-type", b"application/json")] if body is not None else []
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _header(scope: Mapping[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


class EraGate:
    """ASGI middleware: the SDK's app, but one era only (module docstring)."""

    def __init__(self, app: Any, era: str) -> None:
        self.app = app
        self.era = era
        self.seen: list[tuple[str, str | None]] = []  # (HTTP method, MCP-Protocol-Version) of each request
        self.posted: list[Any] = []  # the JSON-RPC message of each POST that passed the gate
        # 2026-07-28 routing headers: a POST whose Mcp-Method / Mcp-Name differ from its body is
        # refused as the revision says (400, -32001 HeaderMismatch); each POST's headers kept
        self.check_routing = False
        self.headers: list[dict[str, str]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        version = _header(scope, b"mcp-protocol-version")
        self.seen.append((scope["method"], version))
        if self.era == "handshake" and version is not None and version not in HANDSHAKE:
            message = f"Bad Request: Unsupported protocol version: {version} (supported versions: {', '.join(HANDSHAKE)})"
            await _send_json(
                send, 400, {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}}
            )
            return
        if self.era == "stateless" and version not in STATELESS:
            if scope["method"] != "POST":
                await send({"type": "http.response.start", "status": 405, "headers": [(b"allow", b"POST")]})
                await send({"type": "http.response.body", "body": b""})
                return
            error = {
                "code": -32022,
                "message": "Unsupported protocol version",
                "data": {"supported": list(STATELESS), "requested": version},
            }
            await _send_json(send, 400, {"jsonrpc": "2.0", "id": None, "error": error})
            return
        if scope["method"] == "POST":
            receive = await self._keep_body(receive)
            self.headers.append(
                {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            )
            mismatch = self._routing_mismatch(self.headers[-1], self.posted[-1] if self.posted else None)
            if mismatch is not None:
                error = {"code": -32001, "message": f"HeaderMismatch: {mismatch}"}
                await _send_json(send, 400, {"jsonrpc": "2.0", "id": None, "error": error})
                return
        await self.app(scope, receive, send)

    def _routing_mismatch(self, headers: Mapping[str, str], message: Any) -> str | None:
        """What a 2026-07-28 server checks: `Mcp-Method` is the body's method, `Mcp-Name` its
        tool, prompt or resource (both required where the revision requires them)."""
        if not self.check_routing or not isinstance(message, dict) or "method" not in message:
            return None
        if headers.get("mcp-method") != message["method"]:
            return f"Mcp-Method {headers.get('mcp-method')!r} is not the body's {message['method']!r}"
        key = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}.get(message["method"])
        if key is not None:
            wanted = (message.get("params") or {}).get(key)
            if headers.get("mcp-name") != wanted:
                return f"Mcp-Name {headers.get('mcp-name')!r} is not the body's {wanted!r}"
        return None

    async def _keep_body(self, receive: Any) -> Any:
        """Read the POST's body (to keep its JSON-RPC message), then replay it to the app."""
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        with contextlib.suppress(ValueError):
            self.posted.append(orjson.loads(body))
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay


class RevisionServer:
    """The demo server (plus `grow`, `nap`, `summarize`) accepting one era, restartable on its port."""

    def __init__(self, era: str, *, json_response: bool = False) -> None:
        self.era = era
        self.json_response = json_response
        self.port = 0
        self.gate: EraGate | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> str:
        import uvicorn

        server = build_server(sampling=True)
        add_revision_tools(server)
        app = server.streamable_http_app(json_response=self.json_response)
        self.gate = EraGate(app, self.era)
        config = uvicorn.Config(
            self.gate, host="127.0.0.1", port=self.port, log_level="warning", timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("MCP test server did not start")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=20)
        self._server = self._thread = None

    def __enter__(self) -> RevisionServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class HttpTransport:
    """`Transport` over plain HTTP to each server's Streamable HTTP endpoint (tests only: the
    aggregate's own goes through the owning server's pipeline in process)."""

    def __init__(self, urls: Mapping[str, str]) -> None:
        self.urls = dict(urls)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def post(
        self,
        server: str,
        headers: Mapping[str, str],
        body: bytes,
        headers_out: Callable[[Mapping[str, str]], None] | None = None,
    ) -> AsyncIterator[JsonObject]:
        try:
            response = await self._client().post(self.urls[server], data=body, headers=dict(headers))
        except (aiohttp.ClientError, OSError) as exc:
            raise ServerUnavailable(server, repr(exc)) from None
        async with response:
            if headers_out is not None:
                headers_out(response.headers)
            async for message in self._messages(server, response):
                yield message

    async def get_stream(self, server: str, headers: Mapping[str, str]) -> AsyncIterator[JsonObject]:
        get_headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        get_headers["Accept"] = "text/event-stream"
        try:
            response = await self._client().get(self.urls[server], headers=get_headers)
        except (aiohttp.ClientError, OSError) as exc:
            raise ServerUnavailable(server, repr(exc)) from None
        async with response:
            async for message in self._messages(server, response):
                yield message

    async def delete(self, server: str, headers: Mapping[str, str]) -> None:
        try:
            async with self._client().delete(self.urls[server], headers=dict(headers)) as response:
                await response.read()
        except (aiohttp.ClientError, OSError) as exc:
            raise ServerUnavailable(server, repr(exc)) from None

    async def _messages(self, server: str, response: aiohttp.ClientResponse) -> AsyncIterator[JsonObject]:
        if response.status == 202:
            return
        if response.status >= 400:
            raw = await response.read()
            try:
                message = orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                message = None
            raise TransportStatus(response.status, message if isinstance(message, dict) else None)
        try:
            if response.content_type == "application/json":
                yield orjson.loads(await response.read())
                return
            decoder = SSEDecoder()
            async for chunk in response.content.iter_any():
                for event in decoder.feed(chunk):
                    if event.data:
                        yield orjson.loads(event.data)
        except (aiohttp.ClientError, OSError) as exc:
            raise ServerUnavailable(server, repr(exc)) from None


ROOT = Path(__file__).resolve().parent.parent


def sibling_python(env: str) -> Path | None:
    """The python of the repository's other environment (`.venv` or `.venv-mcp1`, side by side as
    scripts/test.sh builds them), for a server of the other SDK major; None when it is not there."""
    python = Path(sys.prefix).parent / env / "bin" / "python"
    return python if python.exists() else None


@contextmanager
def spawned(python: Path, kind: str) -> Iterator[str]:
    """A server in a child process of another environment (`python -m tests.mcp_revision_servers
    KIND`): `handshake` / `stateless` (mcp 2.x, gated) or `v1` (mcp 1.x FastMCP, handshake era by
    nature). Yields its URL; the child ends when its stdin closes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [str(python), "-m", "tests.mcp_revision_servers", kind],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        if not url.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"MCP test server {kind} did not start: {url!r}")
        yield url
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _serve_until_stdin_closes(kind: str) -> None:
    if kind == "v1":
        from tests.mcp_servers import serve

        with serve() as url:
            print(url, flush=True)
            sys.stdin.read()
        return
    with RevisionServer(kind) as server:
        print(server.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    _serve_until_stdin_closes(sys.argv[1])
