"""The forward stage: the upstream call, its answer relayed to the client as it comes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.exchange import Exchange
from proxy.forward import request_headers
from proxy.pipeline import BaseStage
from proxy.routing import join_upstream

if TYPE_CHECKING:
    from proxy.services import Services


# characters a stream observer keeps beyond max_field_bytes (see ForwardStage.request)
TEXT_MARGIN = 32 * 1024


class ForwardStage(BaseStage):
    """Send the call upstream and relay the answer; then let the protocol read the result."""

    name = "forward"

    def __init__(self, services: Services) -> None:
        self.services = services

    async def request(self, ex: Exchange) -> None:
        route = ex.route
        upstream = self.services.upstreams.get(route.kind, route.upstream)
        # a legacy MCP endpoint is where the server's `endpoint` event said, not under the base URL
        url = ex.upstream_url or join_upstream(upstream.url, route.path, ex.request.rel_url.raw_query_string)
        headers = request_headers(
            ex.request.headers, upstream, identity_encoding=ex.protocol is not None or ex.observer is not None
        )
        body = ex.upstream_body if ex.upstream_body is not None else ex.body
        limit_text = getattr(ex.observer, "limit_text", None)
        if limit_text is not None:
            # the recorder cuts strings at max_field_bytes: a stream observer need keep no more
            # (the margin leaves room for the redaction pass, which can shorten a string)
            limit_text(self.services.settings.max_field_bytes + TEXT_MARGIN)
        try:
            await self.services.forwarder.forward(ex, url, headers, body)
            if ex.protocol is not None:
                await ex.protocol.await_result(ex)  # MCP: the result may come on another stream
        finally:
            # even when the handler is cancelled (shutdown): the upstream did the work, record it
            if ex.forwarded and ex.protocol is not None:
                ex.protocol.after_forward(ex)
