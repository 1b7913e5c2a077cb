"""A handshake-era MCP server for the aggregate phase of the benchmark (bench/run.py `aggregate`):
`tools/list` answers `--tools` tools after `--delay-ms`, as a server with real work behind its list
would; `initialize` gives a session; `server/discover` is unknown (-32601), so Tripwire's upstream
session falls back to the handshake at once.

    python -m bench.mcp_upstream --port 9100 --delay-ms 5 --tools 20
"""

from __future__ import annotations

import argparse
import asyncio

import orjson
from aiohttp import web


def app(delay_s: float, tools: int) -> web.Application:
    listed = [
        {
            "name": f"tool_{i}",
            "description": f"Tool number {i}: does one thing well.",
            "inputSchema": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
        }
        for i in range(tools)
    ]

    async def post(request: web.Request) -> web.Response:
        msg = orjson.loads(await request.read())
        if "id" not in msg:
            return web.Response(status=202)
        method = msg.get("method")
        if method == "initialize":
            params = msg.get("params") or {}
            result: object = {
                "protocolVersion": params.get("protocolVersion", "2025-11-25"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "bench", "version": "1"},
            }
        elif method == "tools/list":
            await asyncio.sleep(delay_s)
            result = {"tools": listed}
        else:
            error = {"code": -32601, "message": f"Method not found: {method}"}
            return _json({"jsonrpc": "2.0", "id": msg["id"], "error": error})
        return _json({"jsonrpc": "2.0", "id": msg["id"], "result": result})

    a = web.Application()
    a.router.add_post("/mcp", post)
    return a


def _json(body: object) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), content_type="application/json", headers={"Mcp-Session-Id": "bench"}
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--tools", type=int, default=20)
    args = ap.parse_args()
    web.run_app(
        app(args.delay_ms / 1000, args.tools), host="127.0.0.1", port=args.port, print=None, access_log=None
    )


if __name__ == "__main__":
    main()
