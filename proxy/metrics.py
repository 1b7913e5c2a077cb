"""Prometheus metrics for one Tripwire process (SPEC §6), on a private registry.

No global registry (several apps in one test process must not collide). Every label value comes
from a bounded set: upstream names are configured; agent, model and tool names are user-supplied,
so past a cap each new one folds into `other`. No label carries a session id, a prompt or a key.
The pipeline calls the plain `observe_*` / `set_*` methods; `/metrics` serves `render()`.

The per-call counters and histograms are plain Python numbers (`CounterFamily`, `HistogramFamily`),
updated without locks on the event loop and turned into the families prometheus_client's own
`Counter` / `Histogram` would expose only when scraped (`CallCollector`): the exposition is the
same (tests/test_metrics.py compares it with theirs), a call pays a dict update instead of a lock
per series. Gauges set now and then (live sessions, open circuits) stay prometheus_client's.
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping

import prometheus_client.metrics
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

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


_STATUS_CLASSES: dict[int | None, str] = {status: status_class(status) for status in range(100, 600)}
_RAW_LABELS_KEPT = 4096  # (agent, model) pairs remembered with their folded labels
_REQUEST_KINDS_KEPT = 1024  # (kind, upstream, status class) remembered with their series


def _use_created() -> bool:
    """Whether prometheus_client exposes `_created` series (PROMETHEUS_DISABLE_CREATED_SERIES)."""
    return bool(getattr(prometheus_client.metrics, "_use_created", True))


class _Count:
    """One counter series: its value, and when it began."""

    __slots__ = ("value", "created")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()


class CounterFamily:
    """A labelled counter as plain numbers: label values -> value, and when each series began."""

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.series: dict[tuple[str, ...], _Count] = {}

    def take(self, labels: tuple[str, ...]) -> _Count:
        """The series of these labels, begun now if new (a series appears when first used, as
        with labels()): a caller that counts it on every call may keep it."""
        series = self.series.get(labels)
        if series is None:
            series = self.series[labels] = _Count()
        return series

    def inc(self, labels: tuple[str, ...], amount: float = 1.0) -> None:
        self.take(labels).value += amount

    def family(self, created: bool) -> Metric:
        """What prometheus_client's Counter exposes: `_total` per series, then its `_created`."""
        metric = Metric(self.name, self.documentation, "counter")
        for labels, series in list(self.series.items()):
            named = dict(zip(self.labelnames, labels, strict=True))
            metric.add_sample(self.name + "_total", named, series.value)
            if created:
                metric.add_sample(self.name + "_created", named, series.created)
        return metric


class _Buckets:
    """One histogram series: a count per bucket, the sum, when it began."""

    __slots__ = ("bounds", "counts", "sum", "created")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds  # the family's
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def add(self, value: float) -> None:
        """One observation; NaN lands in no bucket (prometheus_client's `value <= bound` loop)."""
        self.sum += value
        if value == value:
            self.counts[bisect_left(self.bounds, value)] += 1  # the first bound >= value


class HistogramFamily:
    """A labelled histogram as plain numbers: per series, a count per bucket, the sum, its start."""

    def __init__(
        self, name: str, documentation: str, labelnames: tuple[str, ...], buckets: Iterable[float]
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        bounds = [float(b) for b in buckets]
        if bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.bounds = tuple(bounds)
        self._le = [floatToGoString(b) for b in bounds]
        self.series: dict[tuple[str, ...], _Buckets] = {}

    def take(self, labels: tuple[str, ...]) -> _Buckets:
        """The series of these labels, begun now if new (see CounterFamily.take)."""
        series = self.series.get(labels)
        if series is None:
            series = self.series[labels] = _Buckets(self.bounds)
        return series

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        self.take(labels).add(value)

    def family(self, created: bool) -> Metric:
        """What prometheus_client's Histogram exposes: cumulative buckets, count, sum, created."""
        metric = Metric(self.name, self.documentation, "histogram")
        name = self.name
        for labels, series in list(self.series.items()):
            named = dict(zip(self.labelnames, labels, strict=True))
            acc = 0.0
            for le, count in zip(self._le, series.counts, strict=True):
                acc += count
                metric.add_sample(name + "_bucket", {**named, "le": le}, acc)
            metric.add_sample(name + "_count", named, acc)
            if self.bounds[0] >= 0:
                metric.add_sample(name + "_sum", named, series.sum)
            if created:
                metric.add_sample(name + "_created", named, series.created)
        return metric


class _RequestSeries:
    """The series a request of one kind, upstream and status class counts in, kept so a call
    updates them without a family lookup each; a histogram's is taken when it first gets a value
    (a series shows once observed, as with labels())."""

    __slots__ = ("count", "latency", "overhead", "ttfb")

    def __init__(self, count: _Count) -> None:
        self.count = count
        self.latency: _Buckets | None = None
        self.overhead: _Buckets | None = None
        self.ttfb: _Buckets | None = None


class _LLMSeries:
    """The series an LLM call of one (agent, model) counts in (see _RequestSeries)."""

    __slots__ = ("labels", "calls", "prompt", "completion", "cost")

    def __init__(self, labels: tuple[str, str], calls: _Count) -> None:
        self.labels = labels
        self.calls = calls
        self.prompt: _Count | None = None
        self.completion: _Count | None = None
        self.cost: _Count | None = None


class CallCollector(Collector):
    """The per-call families, in the order given, exposed from their plain numbers at scrape time."""

    def __init__(self, families: list[CounterFamily | HistogramFamily]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        created = _use_created()
        for family in self.families:
            yield family.family(created)


class _StoreCollector(Collector):
    """Event-store numbers the recorder owns (its error count is cumulative, so a counter)."""

    def __init__(self) -> None:
        self.queue_depth = 0
        self.write_errors = 0
        self.healthy = True
        self.stalled = False

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
        yield GaugeMetricFamily(
            "tripwire_event_store_stalled",
            "1 while the trace writer has events queued and has finished no pass for too long.",
            value=int(self.stalled),
        )


class Metrics:
    """All of Tripwire's metrics; cheap methods, safe to call from the event loop."""

    def __init__(self, *, model_cap: int = 50, tool_cap: int = 50, agent_cap: int = 100) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._model = LabelFolder(model_cap)
        self._tool = LabelFolder(tool_cap)
        self._agent = LabelFolder(agent_cap)
        r = self.registry
        self.requests = CounterFamily(
            "tripwire_requests",
            "Requests the proxy answered, by upstream kind (llm/mcp), upstream name and status class.",
            ("kind", "upstream", "status_class"),
        )
        self.upstream_latency = HistogramFamily(
            "tripwire_upstream_latency_seconds",
            "Time from forwarding a call to its complete answer from the upstream.",
            ("kind", "upstream"),
            LATENCY_BUCKETS,
        )
        self.overhead = HistogramFamily(
            "tripwire_proxy_overhead_seconds",
            "Time the proxy itself adds to a call (parsing, guards, recording), upstream time excluded.",
            ("kind",),
            OVERHEAD_BUCKETS,
        )
        self.ttfb = HistogramFamily(
            "tripwire_stream_time_to_first_byte_seconds",
            "Streamed calls: time from forwarding to the first byte from the upstream.",
            ("upstream",),
            TTFB_BUCKETS,
        )
        self.llm_calls = CounterFamily(
            "tripwire_llm_calls", "LLM calls recorded, by agent and model.", ("agent", "model")
        )
        self.tokens = CounterFamily(
            "tripwire_llm_tokens",
            "LLM tokens by agent, model and type (prompt/completion).",
            ("agent", "model", "type"),
        )
        self.cost = CounterFamily(
            "tripwire_llm_cost_usd", "Estimated LLM spend in USD, by agent and model.", ("agent", "model")
        )
        self.tool_calls = CounterFamily(
            "tripwire_tool_calls",
            "Tool calls by server (MCP name, or 'llm' for function calling), tool and outcome.",
            ("server", "tool", "outcome"),
        )
        self.decisions = CounterFamily(
            "tripwire_guard_decisions",
            "Guard decisions other than allow, by guard, action (warn/block/terminate) and whether they "
            "were taken in shadow mode (recorded, not enforced).",
            ("guard", "action", "shadow"),
        )
        # first in the registry: the exposition keeps the order these families always had
        r.register(
            CallCollector(
                [
                    self.requests,
                    self.upstream_latency,
                    self.overhead,
                    self.ttfb,
                    self.llm_calls,
                    self.tokens,
                    self.cost,
                    self.tool_calls,
                    self.decisions,
                ]
            )
        )
        self.open_circuits = Gauge(
            "tripwire_circuits_open",
            "Open circuits per upstream, counted across agents.",
            ["upstream"],
            registry=r,
        )
        self.live_sessions = Gauge("tripwire_live_sessions", "Sessions (runs) currently open.", registry=r)
        # asking a person (SPEC §5.5a)
        self.approvals = Counter(
            "tripwire_approvals",
            "Held calls by guard and how they ended (approved, denied, timeout, withdrawn, abandoned).",
            ["guard", "decision"],
            registry=r,
        )
        self.pending_approvals = Gauge(
            "tripwire_pending_approvals", "Calls this process holds for a person's decision.", registry=r
        )
        self.state_backend_up: Gauge | None = None  # only with a shared state backend (--state)
        # budgets over time (SPEC §9), created on first use (`set_budget_window`)
        self._window_spent: Gauge | None = None
        self._window_reserved: Gauge | None = None
        self._window_limit: Gauge | None = None
        self._store = _StoreCollector()
        r.register(self._store)
        # agent keys (SPEC §9): refused calls by why (never the key, its hash or its agent)
        self.auth_refusals = CounterFamily(
            "tripwire_auth_refusals",
            "Calls refused by the agent-key check, by reason (missing, unknown, expired, revoked, "
            "other_agent, unavailable).",
            ("reason",),
        )
        r.register(CallCollector([self.auth_refusals]))
        self._circuit_upstreams: set[str] = set()
        # (agent, model) as the call named them -> their folded labels (LabelFolder's answer for a
        # value never changes once given)
        self._llm_series: dict[tuple[str, str | None], _LLMSeries] = {}
        self._request_series: dict[tuple[str, str, str], _RequestSeries] = {}

    # --- what the pipeline calls -------------------------------------------------------------

    def observe_request(
        self,
        kind: str,
        upstream: str,
        status: int | None,
        latency_s: float | None,
        overhead_s: float | None,
        ttfb_s: float | None = None,
    ) -> None:
        """One answered request; latency None when the upstream was never called (a guard answered);
        `ttfb_s`: its upstream's time to first byte, as observe_ttfb (one call for both).

        The series are updated through the request's kept series (_RequestSeries): no lookups."""
        key = (kind, upstream, _STATUS_CLASSES.get(status, "error"))
        series = self._request_series.get(key)
        if series is None:
            series = _RequestSeries(self.requests.take(key))
            if len(self._request_series) < _REQUEST_KINDS_KEPT:
                self._request_series[key] = series
        series.count.value += 1
        # (x if x > 0 else 0.0: max(0.0, x) without its call, NaN included)
        if latency_s is not None:
            series.latency = series.latency or self.upstream_latency.take((kind, upstream))
            series.latency.add(latency_s if latency_s > 0 else 0.0)
        if overhead_s is not None:
            series.overhead = series.overhead or self.overhead.take((kind,))
            series.overhead.add(overhead_s if overhead_s > 0 else 0.0)
        if ttfb_s is not None:
            series.ttfb = series.ttfb or self.ttfb.take((upstream,))
            series.ttfb.add(ttfb_s if ttfb_s > 0 else 0.0)

    def observe_ttfb(self, upstream: str, seconds: float) -> None:
        self.ttfb.observe((upstream,), max(0.0, seconds))

    def observe_llm(
        self,
        agent: str,
        model: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        cost_usd: float | None,
    ) -> None:
        # (agent, model) as the call named them -> their folded labels' series (LabelFolder's
        # answer for a value never changes once given), each taken when first counted
        raw = (agent, model)
        series = self._llm_series.get(raw)
        if series is None:
            labels = (self._agent(agent), self._model(model))
            series = _LLMSeries(labels, self.llm_calls.take(labels))
            if len(self._llm_series) < _RAW_LABELS_KEPT:
                self._llm_series[raw] = series
        series.calls.value += 1
        if prompt_tokens > 0:
            count = series.prompt or self.tokens.take((*series.labels, "prompt"))
            series.prompt = count
            count.value += prompt_tokens
        if completion_tokens > 0:
            count = series.completion or self.tokens.take((*series.labels, "completion"))
            series.completion = count
            count.value += completion_tokens
        if cost_usd:
            count = series.cost or self.cost.take(series.labels)
            series.cost = count
            count.value += cost_usd if cost_usd > 0 else 0.0

    def observe_tool(self, server: str, outcome: str, tool: str | None = None) -> None:
        """outcome: ok / error / blocked (or any short fixed word the pipeline uses)."""
        self.tool_calls.inc((server, self._tool(tool), outcome))

    def observe_auth_refusal(self, reason: str) -> None:
        self.auth_refusals.inc((reason,))

    def observe_decision(self, guard: str, action: str, *, shadow: bool = False) -> None:
        """A guard's decision ("WARN" or "warn"); allow decisions are not counted."""
        action = action.lower()
        if action != "allow":
            self.decisions.inc((guard, action, "true" if shadow else "false"))

    def observe_approval(self, guard: str, decision: str) -> None:
        self.approvals.labels(guard, decision).inc()

    def set_pending_approvals(self, n: int) -> None:
        self.pending_approvals.set(n)

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

    def set_budget_window(
        self, agent: str, period: str, spent_usd: float, limit_usd: float | None, reserved_usd: float
    ) -> None:
        """An agent's budget over time as this replica last saw it (SPEC §9); created on first use, so
        a gateway without `budget_windows` exposes nothing new. Labels: agent and period only."""
        if self._window_spent is None:
            r = self.registry
            self._window_spent = Gauge(
                "tripwire_budget_window_spent_usd",
                "Settled spend of an agent in its current budget window (day, week, month).",
                ["agent", "period"],
                registry=r,
            )
            self._window_reserved = Gauge(
                "tripwire_budget_window_reserved_usd",
                "What the agent's calls in flight have reserved in its current budget window.",
                ["agent", "period"],
                registry=r,
            )
            self._window_limit = Gauge(
                "tripwire_budget_window_limit_usd",
                "The cost limit of an agent's budget window (absent when it limits tokens only).",
                ["agent", "period"],
                registry=r,
            )
        assert self._window_reserved is not None and self._window_limit is not None
        name = self._agent(agent)
        self._window_spent.labels(name, period).set(spent_usd)
        self._window_reserved.labels(name, period).set(reserved_usd)
        if limit_usd is not None:
            self._window_limit.labels(name, period).set(limit_usd)

    def set_live_sessions(self, n: int) -> None:
        self.live_sessions.set(n)

    def set_store(
        self, queue_depth: int, write_errors: int, healthy: bool | None = None, stalled: bool = False
    ) -> None:
        """Recorder numbers; `write_errors` is its running total. Without `healthy`, the store
        counts as unhealthy when errors grew since the previous call. `stalled`: the writer is stuck."""
        s = self._store
        if healthy is None:
            healthy = write_errors <= s.write_errors
        # a counter never goes down, even when a report comes back without the total
        s.queue_depth, s.write_errors, s.healthy = queue_depth, max(write_errors, s.write_errors), healthy
        s.stalled = stalled

    def render(self) -> bytes:
        """The Prometheus text exposition of everything above."""
        return generate_latest(self.registry)
