"""The floor: the obvious aiohttp pass-through, nothing else (read the body, send it on with one
pooled ClientSession, relay the answer: whole, or chunk by chunk for a stream).

Same stack and event loop as Tripwire (aiohttp server and client, uvloop when installed, no access
log), so the difference between it and Tripwire is Tripwire's own work.

    python -m bench.floor --port 8001 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from aiohttp import web

HOP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})
SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("session", aiohttp.ClientSession)


def make_app(upstream: str) -> web.Application:
    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        async with request.app[SESSION].request(
            request.method, upstream + request.path_qs, data=body, headers=headers
        ) as r:
            if not r.headers.get("content-type", "").startswith("text/event-stream"):
                return web.Response(body=await r.read(), status=r.status, content_type=r.content_type)
            out = web.StreamResponse(status=r.status, headers={"Content-Type": r.headers["content-type"]})
            await out.prepare(request)
            async for chunk in r.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        yield
        await app[SESSION].close()

    app = web.Application()
    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", handler)
    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = ap.parse_args()
    app = make_app(args.upstream.rstrip("/"))
    loop_factory = None
    if args.loop == "uvloop":
        try:
            import uvloop

            loop_factory = uvloop.new_event_loop
        except ImportError:
            pass
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_serve(app, args.port))


async def _serve(app: web.Application, port: int) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    main()
