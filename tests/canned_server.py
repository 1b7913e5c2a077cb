"""A tiny aiohttp upstream on 127.0.0.1 that answers every POST with canned bytes.

The dialect tests use it to hand Tripwire's synthetic answers (and filtered streams) to the real
openai and anthropic SDKs, so we know the SDKs' own parsers accept them.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web


class Canned:
    """What the server answers; tests set it before each SDK call. `requests` keeps the bodies seen."""

    def __init__(self) -> None:
        self.content_type = "application/json"
        self.body = b"{}"
        self.status = 200
        self.chunks: list[bytes] | None = None  # when set, the body is written in these pieces
        self.requests: list[Any] = []


def canned_app(canned: Canned) -> web.Application:
    async def handler(request: web.Request) -> web.StreamResponse:
        canned.requests.append(await request.json())
        if canned.chunks is None:
            return web.Response(
                status=canned.status, body=canned.body, headers={"Content-Type": canned.content_type}
            )
        response = web.StreamResponse(status=canned.status, headers={"Content-Type": canned.content_type})
        await response.prepare(request)
        for piece in canned.chunks:
            await response.write(piece)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", handler)
    return app
