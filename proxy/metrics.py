"""Prometheus metrics for one Tripwire process (SPEC §6), on a private registry.

No global registry (several apps in one test process must not collide). Every label value comes
from a bounded set: upstream names are configured; agent, model and tool names are user-supplied,
so past a cap each new one folds into `other`. No label carries a session id, a prompt or a key.
The pipeline calls the plain `observe_*` / `set_*` methods; `/metrics` serves `render()`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.redact import valid_unicode

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OTHER = "other"
MAX_LABEL_LEN = 120

# Latency buckets: upstream calls run from ms (cached, small models) to minutes (reasoning models).
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# Proxy overhead: our own time per call, expected well under 10 ms.
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
TTFB_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 600)


class LabelFolder:
    """Keeps at most `cap` distinct values of one label; later newcomers become `other`."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str | None) -> str:
        v = valid_unicode((value or "unknown")[:MAX_LABEL_LEN])  # a lone surrogate breaks the exposition
        if v in self._seen:
            return v
        with self._lock:
            if len(self._seen) < self.cap:
                self._seen.add(v)
                return v
        return OTHER


def status_class(status: int | None) -> str:
    """HTTP status -> "2xx".."5xx"; None or 0 (no answer: connection error) -> "error"."""
    if not status or status < 100 or status > 599:
        return "error"
    return f"{status // 100}xx"


class _StoreCollector(Collector):
    """Event-store numbers the recorder owns (its error count is cumulative, so a counter)."""

    def __init__(self) -> None:
        self.queue_depth = 0
        self.write_errors = 0
        self.healthy = True

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(
            "tripwire_event_store_queue_depth",
            "Trace events queued but not yet written.",
            value=self.queue_depth,
        )
        yield CounterMetricFamily(
            "tripwire_event_store_write_errors",
            "Trace writes that failed (disk full, read-only).",
            value=self.write_errors,
        )
        yield GaugeMetricFamily(
            "tripwire_event_store_healthy",
            "1 while the trace store writes fine, 0 while it fails.",
            value=int(self.healthy),
        )


class Metrics:
    """All of Tripwire's metrics; cheap methods, safe to call from the event loop."""

    def __init__(self, *, model_cap: int = 50, tool_cap: int = 50, agent_cap: int = 100) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._model = LabelFolder(model_cap)
        self._tool = LabelFolder(tool_cap)
        self._agent = LabelFolder(agent_cap)
        r = self.registry
        self.requests = Counter(
            "tripwire_requests",
            "Requests the proxy answered, by upstream kind (llm/mcp), upstream name and status class.",
            ["kind", "upstream", "status_class"],
            registry=r,
        )
        self.upstream_latency = Histogram(
            "tripwire_upstream_latency_seconds",
            "Time from forwarding a call to its complete answer from the upstream.",
            ["kind", "upstream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "tripwire_proxy_overhead_seconds",
            "Time the proxy itself adds to a call (parsing, guards, recording), upstream time excluded.",
            ["kind"],
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.ttfb = Histogram(
            "tripwire_stream_time_to_first_byte_seconds",
            "Streamed calls: time from forwarding to the first byte from the upstream.",
            ["upstream"],
            buckets=TTFB_BUCKETS,
            registry=r,
        )
        self.llm_calls = Counter(
            "tripwire_llm_calls", "LLM calls recorded, by agent and model.", ["agent", "model"], registry=r
        )
        self.tokens = Counter(
            "tripwire_llm_tokens",
            "LLM tokens by agent, model and type (prompt/completion).",
            ["agent", "model", "type"],
            registry=r,
        )
        self.cost = Counter(
            "tripwire_llm_cost_usd",
            "Estimated LLM spend in USD, by agent and model.",
            ["agent", "model"],
            registry=r,
        )
        self.tool_calls = Counter(
            "tripwire_tool_calls",
            "Tool calls by server (MCP name, or 'llm' for function calling), tool and outcome.",
            ["server", "tool", "outcome"],
            registry=r,
        )
        self.decisions = Counter(
            "tripwire_guard_decisions",
            "Guard decisions other than allow, by guard, action (warn/block/terminate) and whether they "
            "were taken in shadow mode (recorded, not enforced).",
            ["guard", "action", "shadow"],
            registry=r,
        )
        self.open_circuits = Gauge(
            "tripwire_circuits_open",
            "Open circuits per upstream, counted across agents.",
            ["upstream"],
            registry=r,
        )
        self.live_sessions = Gauge("tripwire_live_sessions", "Sessions (runs) currently open.", registry=r)
        self.state_backend_up: Gauge | None = None  # only with a shared state backend (--state)
        self._store = _StoreCollector()
        r.register(self._store)
        self._circuit_upstreams: set[str] = set()
        # the labelled children the per-call methods update, by label values: `labels()` checks and
        # locks on every call; label values are bounded (LabelFolder, configured upstreams)
        self._children: dict[tuple[Any, ...], Any] = {}

    # --- what the pipeline calls -------------------------------------------------------------

    def observe_request(
        self,
        kind: str,
        upstream: str,
        status: int | None,
        latency_s: float | None,
        overhead_s: float | None,
    ) -> None:
        """One answered request; latency None when the upstream was never called (a guard answered)."""
        self._child(self.requests, kind, upstream, status_class(status)).inc()
        if latency_s is not None:
            self._child(self.upstream_latency, kind, upstream).observe(max(0.0, latency_s))
        if overhead_s is not None:
            self._child(self.overhead, kind).observe(max(0.0, overhead_s))

    def observe_ttfb(self, upstream: str, seconds: float) -> None:
        self._child(self.ttfb, upstream).observe(max(0.0, seconds))

    def observe_llm(
        self,
        agent: str,
        model: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        cost_usd: float | None,
    ) -> None:
        a, m = self._agent(agent), self._model(model)
        self._child(self.llm_calls, a, m).inc()
        if prompt_tokens > 0:
            self._child(self.tokens, a, m, "prompt").inc(prompt_tokens)
        if completion_tokens > 0:
            self._child(self.tokens, a, m, "completion").inc(completion_tokens)
        if cost_usd:
            self._child(self.cost, a, m).inc(max(0.0, cost_usd))

    def _child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, kept: a series appears when first used, as with labels()."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe_tool(self, server: str, outcome: str, tool: str | None = None) -> None:
        """outcome: ok / error / blocked (or any short fixed word the pipeline uses)."""
        self._child(self.tool_calls, server, self._tool(tool), outcome).inc()

    def observe_decision(self, guard: str, action: str, *, shadow: bool = False) -> None:
        """A guard's decision ("WARN" or "warn"); allow decisions are not counted."""
        action = action.lower()
        if action != "allow":
            self._child(self.decisions, guard, action, "true" if shadow else "false").inc()

    def set_open_circuits(self, counts: Mapping[str, int]) -> None:
        """Upstream name -> number of agents whose circuit to it is open; absent names read 0."""
        for name in self._circuit_upstreams - set(counts):
            self.open_circuits.labels(name).set(0)
        for name, n in counts.items():
            self.open_circuits.labels(name).set(n)
            self._circuit_upstreams.add(name)

    def set_state_backend(self, up: bool) -> None:
        if self.state_backend_up is None:
            self.state_backend_up = Gauge(
                "tripwire_state_backend_up",
                "1 when the shared guard-state backend (Redis, --state) is reachable, 0 during an outage.",
                registry=self.registry,
            )
        self.state_backend_up.set(1 if up else 0)

    def set_live_sessions(self, n: int) -> None:
        self.live_sessions.set(n)

    def set_store(self, queue_depth: int, write_errors: int, healthy: bool | None = None) -> None:
        """Recorder numbers; `write_errors` is its running total. Without `healthy`, the store
        counts as unhealthy when errors grew since the previous call."""
        s = self._store
        if healthy is None:
            healthy = write_errors <= s.write_errors
        # a counter never goes down, even when a report comes back without the total
        s.queue_depth, s.write_errors, s.healthy = queue_depth, max(write_errors, s.write_errors), healthy

    def render(self) -> bytes:
        """The Prometheus text exposition of everything above."""
        return generate_latest(self.registry)
