"""A fake OpenTelemetry collector for tests: an aiohttp server on 127.0.0.1 that takes OTLP/HTTP
trace exports (POST /v1/traces, protobuf) and decodes them with opentelemetry-proto, as a real
collector would. `hold` makes it take requests and never answer (a collector that hangs)."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status


def any_value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return attributes(v.kvlist_value.values)
    return None if which is None else getattr(v, which)


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs if isinstance(kv, KeyValue)}


@dataclass
class ReceivedSpan:
    name: str
    kind: str  # "CLIENT", "INTERNAL", ...
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status: str  # "UNSET", "OK", "ERROR"
    status_message: str
    resource: dict[str, Any]
    scope: str

    @classmethod
    def of(cls, span: Span, resource: dict[str, Any], scope: str) -> ReceivedSpan:
        return cls(
            name=span.name,
            kind=Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
            trace_id=span.trace_id.hex(),
            span_id=span.span_id.hex(),
            parent_span_id=span.parent_span_id.hex(),
            start_ns=span.start_time_unix_nano,
            end_ns=span.end_time_unix_nano,
            attributes=attributes(span.attributes),
            status=Status.StatusCode.Name(span.status.code).removeprefix("STATUS_CODE_"),
            status_message=span.status.message,
            resource=resource,
            scope=scope,
        )


class OtlpReceiver:
    def __init__(self, *, hold: bool = False) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0  # export requests received (held ones included)
        self.held = 0  # requests being held unanswered right now
        self.hold = hold
        self.release = asyncio.Event()  # answers every held request (with an error)
        self.changed = asyncio.Condition()
        self.app = web.Application()
        self.app.router.add_post("/v1/traces", self.traces)

    async def traces(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with self.changed:
            self.requests += 1
            self.changed.notify_all()
        if self.hold:
            self.held += 1
            try:
                await self.release.wait()
            finally:
                self.held -= 1
            return web.Response(status=503)
        encoding = request.headers.get("Content-Encoding", "")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        assert request.content_type == "application/x-protobuf", request.content_type
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        async with self.changed:
            for rs in message.resource_spans:
                resource = attributes(rs.resource.attributes)
                for ss in rs.scope_spans:
                    self.spans.extend(ReceivedSpan.of(s, resource, ss.scope.name) for s in ss.spans)
            self.changed.notify_all()
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    async def wait_for(self, predicate: Callable[[OtlpReceiver], bool], limit_s: float = 60) -> None:
        """Wait until `predicate(self)` holds (a generous bound: export is batched, in another thread)."""
        async with asyncio.timeout(limit_s), self.changed:
            await self.changed.wait_for(lambda: predicate(self))


@asynccontextmanager
async def serve_receiver(*, hold: bool = False) -> AsyncIterator[tuple[OtlpReceiver, str]]:
    """An OtlpReceiver on 127.0.0.1: (the receiver, its base URL, as given to --otlp-endpoint)."""
    receiver = OtlpReceiver(hold=hold)
    server = TestServer(receiver.app, host="127.0.0.1")
    await server.start_server()
    try:
        yield receiver, str(server.make_url("")).rstrip("/")
    finally:
        receiver.release.set()
        await server.close()
