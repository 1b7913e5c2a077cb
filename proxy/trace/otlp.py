"""Trace export over OTLP/HTTP: the recorder's events as OpenTelemetry spans (SPEC §8, docs/scaling.md).

An event sink of the recorder (proxy/recorder.py): `accept()` turns a call's event into a span
(proxy/trace/spans.py decides what it says) and ends it into the SDK's BatchSpanProcessor, whose
worker thread sends batches with the OTLP/HTTP exporter (protobuf, its own retries and timeout). So a
proxied call only pays for building one span; export trouble (a collector down, slow or refusing) is
the worker thread's, logged by the SDK and counted in `health()`. When more than `max_queue` spans
wait, new ones are dropped and counted rather than queued without bound. `close()` flushes, bounded
by the export timeout (5 s at most), and never holds up the process's exit (the flush runs in a
daemon thread).

The SDK's own tracer provider is private to this exporter (no global provider is set), with span ids
chosen from the trace's event ids (`PresetIds`), so every replica that records a call of a run names
it the same way. Resource: service.name "tripwire" and service.version; OTEL_SERVICE_NAME and
OTEL_RESOURCE_ATTRIBUTES (e.g. k8s.pod.name from the chart) are read by the SDK as usual, as are
OTEL_EXPORTER_OTLP_HEADERS / _TRACES_HEADERS when the config sets no headers.

Needs the `otlp` extra (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http); the engine
imports this module only when otlp.endpoint is set, after `tripwire serve` has checked it is installed.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)

from proxy import __version__
from proxy.settings import OtlpConfig
from proxy.trace.spans import CallSpan, span_for

logger = logging.getLogger(__name__)

BATCH_SIZE = 512  # spans per export request
# close() waits this long at most for the last export (and less with a shorter otlp.timeout_s), so
# a collector that is down cannot eat the pod's termination grace after the drain
CLOSE_LIMIT_S = 5.0


class PresetIds(IdGenerator):
    """The SDK asks its id generator for a new span's ids; this one answers with the ids the caller
    set just before starting the span (the loop thread starts spans one at a time)."""

    def __init__(self) -> None:
        self.trace_id = 0
        self.span_id = 0

    def generate_span_id(self) -> int:
        return self.span_id or random.getrandbits(64)

    def generate_trace_id(self) -> int:
        return self.trace_id or random.getrandbits(128)


class CountingExporter(SpanExporter):
    """The OTLP exporter, counting what it settles (in the processor's worker thread) for health()
    and for the queue bound of `OtlpExporter.accept`."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.exported = 0
        self.failed = 0  # spans in batches the collector never took (after the exporter's retries)
        self.failed_batches = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = SpanExportResult.FAILURE
        try:
            result = self.inner.export(spans)
        finally:
            if result == SpanExportResult.SUCCESS:
                self.exported += len(spans)
            else:
                self.failed += len(spans)
                self.failed_batches += 1
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class OtlpExporter:
    """An event sink (proxy.recorder.EventSink) that exports calls as spans over OTLP/HTTP."""

    name = "otlp"

    def __init__(self, config: OtlpConfig) -> None:
        url = config.traces_url()
        if url is None:
            raise ValueError("otlp.endpoint is not set")
        self.url = url
        self.close_timeout_s = min(config.timeout_s, CLOSE_LIMIT_S)
        self.max_queue = config.max_queue
        self._ids = PresetIds()
        self._provider = TracerProvider(
            resource=Resource.create({SERVICE_NAME: "tripwire", SERVICE_VERSION: __version__}),
            id_generator=self._ids,
            shutdown_on_exit=False,  # close() flushes; an exit hook would hold every provider alive
        )
        self._exporter = CountingExporter(
            OTLPSpanExporter(endpoint=url, headers=dict(config.headers) or None, timeout=config.timeout_s)
        )
        self._provider.add_span_processor(
            BatchSpanProcessor(
                self._exporter,
                # the processor drops past its queue with a log line per span: ours drops first, counted
                max_queue_size=config.max_queue + BATCH_SIZE,
                schedule_delay_millis=config.export_interval_s * 1000,
                max_export_batch_size=BATCH_SIZE,
            )
        )
        self._tracer = self._provider.get_tracer("tripwire", __version__)
        self.emitted = 0
        self.dropped = 0
        self.closed = False

    # --- the sink ----------------------------------------------------------------------------

    def accept(self, event: dict[str, Any], ts: float, *, agent: str, session_id: str) -> None:
        if self.closed:
            return
        span = span_for(event, ts, agent=agent, session_id=session_id)
        if span is None:
            return
        if self.pending >= self.max_queue:
            self.dropped += 1  # the collector is not keeping up: drop, never block or grow
            return
        self.emit(span)

    @property
    def pending(self) -> int:
        """Spans handed to the processor and not yet exported or given up on."""
        return self.emitted - self._exporter.exported - self._exporter.failed

    def emit(self, span: CallSpan) -> None:
        if span.parent_span_id is None:
            context = Context()  # a root: nothing from the caller's context
        else:
            parent = SpanContext(
                span.trace_id,
                span.parent_span_id,
                is_remote=False,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
            context = set_span_in_context(NonRecordingSpan(parent), Context())
        self._ids.trace_id, self._ids.span_id = span.trace_id, span.span_id
        try:
            sdk_span = self._tracer.start_span(
                span.name,
                context=context,
                kind=SpanKind.CLIENT if span.client else SpanKind.INTERNAL,
                attributes=span.attributes,
                start_time=span.start_ns,
            )
        finally:
            self._ids.trace_id = self._ids.span_id = 0
        if span.error is not None:
            sdk_span.set_status(Status(StatusCode.ERROR, span.error))
        sdk_span.end(end_time=span.end_ns)
        self.emitted += 1

    def health(self) -> dict[str, Any]:
        return {
            "endpoint": self.url,
            "exported": self._exporter.exported,
            "pending": self.pending,
            "failed": self._exporter.failed,
            "failed_batches": self._exporter.failed_batches,
            "dropped": self.dropped,
        }

    async def close(self) -> None:
        """Flush what is queued and stop; gives up after the export timeout (the rest is lost, logged)."""
        if self.closed:
            return
        self.closed = True
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def shutdown() -> None:
            try:
                self._provider.shutdown()  # the processor's last export, then the exporter's
            except Exception:
                logger.exception("OTLP exporter shutdown failed")
            finally:
                try:
                    loop.call_soon_threadsafe(done.set)
                except RuntimeError:  # the loop is gone: nobody waits any more
                    pass

        # a daemon thread, not asyncio.to_thread: the default executor's threads are joined at exit
        threading.Thread(target=shutdown, name="tripwire-otlp-close", daemon=True).start()
        try:
            await asyncio.wait_for(done.wait(), self.close_timeout_s)
        except TimeoutError:
            logger.warning(
                "OTLP export to %s did not finish within %.0f s at close: %d span(s) not sent",
                self.url,
                self.close_timeout_s,
                self.pending,
            )
