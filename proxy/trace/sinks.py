"""Event sinks: where recorded events go besides the trace files (SPEC §8: OTLP export).

`TraceRecorder.record()` hands every event it accepts to each sink (proxy/recorder.py). The OTLP
exporter (proxy/trace/otlp.py) is the one sink so far; `from_settings` builds the configured ones,
importing the exporter only when it is asked for (it needs the optional `otlp` extra).
"""

from __future__ import annotations

from typing import Any, Protocol

from proxy.settings import Settings


class EventSink(Protocol):
    """Something that sees every recorded event besides the files (an exporter)."""

    name: str

    def accept(self, event: dict[str, Any], ts: float, *, agent: str, session_id: str) -> None:
        """Take one event (its envelope as written; `ts` its epoch time): O(1), never blocking.
        The event is shared with the writer: read it, never change it."""
        ...

    def health(self) -> dict[str, Any]:
        """For /healthz (the trace store's `exporters`)."""
        ...

    async def close(self) -> None:
        """Flush what is queued (bounded in time) and stop."""
        ...


class SinkUnavailable(RuntimeError):
    """A configured sink's optional dependency is not installed."""


def from_settings(settings: Settings) -> list[EventSink]:
    """The sinks the settings ask for (none by default)."""
    sinks: list[EventSink] = []
    if settings.otlp.endpoint:
        try:
            from proxy.trace.otlp import OtlpExporter
        except ImportError as e:
            raise SinkUnavailable(
                f"otlp.endpoint is set but the OpenTelemetry exporter is not installed ({e}): "
                "pip install 'tripwire[otlp]'"
            ) from e
        sinks.append(OtlpExporter(settings.otlp))
    return sinks
