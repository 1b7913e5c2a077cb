"""The record stage: the call's request metrics and its events (the protocol adapter knows which)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from proxy.exchange import Exchange
from proxy.pipeline import BaseStage

if TYPE_CHECKING:
    from proxy.metrics import Metrics
    from proxy.services import Services


class RecordStage(BaseStage):
    """Write what the call did to the trace (the protocol adapter knows the events)."""

    name = "record"

    def __init__(self, services: Services) -> None:
        self.services = services

    async def finish(self, ex: Exchange) -> None:
        observe_request(self.services.metrics, ex)
        if ex.protocol is not None and ex.session is not None:
            ex.protocol.record(ex, self.services)


def observe_request(metrics: Metrics, ex: Exchange) -> None:
    """The call's request metrics: status, upstream latency, Tripwire's own overhead, time to first byte."""
    latency = overhead = ttfb = None
    started, done = ex.upstream_started, ex.upstream_done
    if started is not None and done is not None:
        latency = done - started
        overhead = (time.monotonic() - ex.started) - latency  # (the metrics count below 0 as 0)
        if ex.first_byte_at is not None:
            ttfb = ex.first_byte_at - started
    status = ex.upstream_status or (ex.answer.status if ex.answer is not None else None)
    route = ex.route
    metrics.observe_request(route.kind, route.upstream, status, latency, overhead, ttfb)
