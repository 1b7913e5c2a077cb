"""One engine's life, shared by `tripwire serve` (proxy/app.py) and the mitmproxy addon.

Build the engine (the composition root: every service it holds is made in `Engine.__init__`),
register the upstreams the host adds (the addon's intercepted hosts), start the trace writer,
the upstream client and the stdio MCP children; on the way out stop the children and close the
engine (open runs end, the trace queue is flushed). Draining in-flight calls is the host's
first step on the way out, before its listeners close (`Engine.drain`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable

from proxy.engine import Engine
from proxy.settings import Settings, UpstreamConfig
from proxy.upstreams import Kind


@contextlib.asynccontextmanager
async def running_engine(
    settings: Settings,
    *,
    argv: list[str] | None = None,
    upstreams: Iterable[tuple[Kind, str, UpstreamConfig]] = (),
) -> AsyncIterator[Engine]:
    engine = Engine(settings, argv=argv)
    for kind, name, upstream in upstreams:
        engine.upstreams.register(kind, name, upstream)
    await engine.start()
    try:
        await engine.start_children()
        yield engine
    finally:
        try:
            await engine.stop_children()
        finally:
            await engine.close()
