"""Metrics: values land where the pipeline puts them, names follow Prometheus rules, labels stay bounded."""

from __future__ import annotations

import re
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from proxy.metrics import Metrics, status_class

NAME = re.compile(r"^tripwire_[a-z][a-z0-9_]*$")
FORBIDDEN_LABELS = {"session", "session_id", "run_id", "prompt", "key", "api_key", "authorization"}


def families(m: Metrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(m.render().decode())}


def sample(m: Metrics, name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def exercise(m: Metrics) -> None:
    m.observe_request("llm", "default", 200, 0.8, 0.002)
    m.observe_request("llm", "default", 429, None, 0.0004)
    m.observe_request("mcp", "files", None, 10.0, 0.001)
    m.observe_ttfb("default", 0.3)
    m.observe_llm("research", "gpt-4o", 1000, 200, 0.0045)
    m.observe_tool("files", "ok", "read_file")
    m.observe_tool("files", "blocked", "read_file")
    m.observe_decision("loop_detection", "WARN")
    m.set_open_circuits({"files": 2})
    m.set_live_sessions(3)
    m.set_store(7, 0)


def test_values() -> None:
    m = Metrics()
    exercise(m)
    assert sample(m, "tripwire_requests_total", kind="llm", upstream="default", status_class="2xx") == 1
    assert sample(m, "tripwire_requests_total", kind="llm", status_class="4xx") == 1
    assert sample(m, "tripwire_requests_total", kind="mcp", status_class="error") == 1
    # the guard-answered 429 has no upstream latency: only two latency observations in total
    assert sample(m, "tripwire_upstream_latency_seconds_count", kind="llm") == 1
    assert sample(m, "tripwire_proxy_overhead_seconds_count", kind="llm") == 2
    assert sample(m, "tripwire_stream_time_to_first_byte_seconds_count", upstream="default") == 1
    assert sample(m, "tripwire_llm_tokens_total", agent="research", model="gpt-4o", type="prompt") == 1000
    assert sample(m, "tripwire_llm_tokens_total", agent="research", model="gpt-4o", type="completion") == 200
    assert abs(sample(m, "tripwire_llm_cost_usd_total", agent="research", model="gpt-4o") - 0.0045) < 1e-12
    assert sample(m, "tripwire_tool_calls_total", server="files", tool="read_file", outcome="blocked") == 1
    assert sample(m, "tripwire_guard_decisions_total", guard="loop_detection", action="warn") == 1
    assert sample(m, "tripwire_circuits_open", upstream="files") == 2
    assert sample(m, "tripwire_live_sessions") == 3
    assert sample(m, "tripwire_event_store_queue_depth") == 7
    assert sample(m, "tripwire_event_store_healthy") == 1


def test_allow_decisions_not_counted() -> None:
    m = Metrics()
    m.observe_decision("loop_detection", "ALLOW")
    m.observe_decision("max_cost_usd", "TERMINATE")
    m.observe_decision("loop_detection", "WARN", shadow=True)
    labels = [s.labels for s in families(m)["tripwire_guard_decisions"].samples if s.name.endswith("_total")]
    assert labels == [
        {"guard": "max_cost_usd", "action": "terminate", "shadow": "false"},
        {"guard": "loop_detection", "action": "warn", "shadow": "true"},
    ]


def test_circuits_absent_upstream_reads_zero() -> None:
    m = Metrics()
    m.set_open_circuits({"a": 1, "b": 1})
    m.set_open_circuits({"b": 1})
    assert sample(m, "tripwire_circuits_open", upstream="a") == 0
    assert sample(m, "tripwire_circuits_open", upstream="b") == 1


def test_store_errors_mark_unhealthy_then_recover() -> None:
    m = Metrics()
    m.set_store(0, 3)
    assert sample(m, "tripwire_event_store_write_errors_total") == 3
    assert sample(m, "tripwire_event_store_healthy") == 0
    m.set_store(0, 3)
    assert sample(m, "tripwire_event_store_healthy") == 1
    m.set_store(0, 4, healthy=True)
    assert sample(m, "tripwire_event_store_healthy") == 1


def test_naming_rules() -> None:
    m = Metrics()
    exercise(m)
    fams = families(m)
    assert len(fams) >= 14
    for name, fam in fams.items():
        assert NAME.match(name), name
        assert fam.documentation, name
        for s in fam.samples:
            assert not FORBIDDEN_LABELS & set(s.labels), (name, s.labels)
        if fam.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in fam.samples), name
            assert not name.endswith("_total")  # the parser strips it; a family named *_total_total is wrong
        if fam.type == "histogram":
            assert name.endswith("_seconds"), name
        if fam.type == "gauge":
            assert not name.endswith("_total"), name


def test_labels_fold_past_cap() -> None:
    m = Metrics(model_cap=3, tool_cap=2)
    for i in range(10):
        m.observe_llm("a", f"model-{i}", 1, 1, 0.0)
        m.observe_tool("srv", "ok", f"tool-{i}")
    models = {
        s.labels["model"] for s in families(m)["tripwire_llm_calls"].samples if s.name.endswith("_total")
    }
    assert models == {"model-0", "model-1", "model-2", "other"}
    assert sample(m, "tripwire_llm_calls_total", model="other") == 7
    tools = {
        s.labels["tool"] for s in families(m)["tripwire_tool_calls"].samples if s.name.endswith("_total")
    }
    assert tools == {"tool-0", "tool-1", "other"}
    # a known value keeps its own label after the cap is reached
    m.observe_llm("a", "model-1", 1, 1, 0.0)
    assert sample(m, "tripwire_llm_calls_total", model="model-1") == 2


def test_private_registries_do_not_collide() -> None:
    a, b = Metrics(), Metrics()
    a.set_live_sessions(5)
    assert sample(b, "tripwire_live_sessions") == 0


def test_status_class() -> None:
    assert [status_class(s) for s in (200, 302, 404, 503, None, 0, 999)] == [
        "2xx",
        "3xx",
        "4xx",
        "5xx",
        "error",
        "error",
        "error",
    ]


def test_exposition_is_prometheus_clients_own() -> None:
    """The per-call families are plain numbers exposed at scrape time: the text is what
    prometheus_client's Counter / Histogram fed the same observations expose, byte for byte."""
    from unittest import mock

    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from proxy.metrics import CounterFamily, HistogramFamily

    with mock.patch("time.time", return_value=1700000000.25):
        m = Metrics()
        ref_registry = CollectorRegistry(auto_describe=True)
        ref: dict[str, Any] = {}
        for fam in (m.requests, m.upstream_latency, m.overhead, m.ttfb, m.llm_calls, m.tokens, m.cost):
            if isinstance(fam, CounterFamily):
                ref[fam.name] = Counter(fam.name, fam.documentation, fam.labelnames, registry=ref_registry)
            else:
                assert isinstance(fam, HistogramFamily)
                ref[fam.name] = Histogram(
                    fam.name, fam.documentation, fam.labelnames, buckets=fam.bounds, registry=ref_registry
                )
        for i in range(60):
            status = [200, 429, None, 503, 0, 302, 999][i % 7]
            latency = (i * 0.37) % 700 if i % 5 else None
            overhead = [0.0, 0.0005, 0.001, 1.0, 2.5, (i * 0.0013)][i % 6]
            kind, up = ("llm" if i % 3 else "mcp"), f"up{i % 2}"
            ttfb = (i * 0.41) % 650
            if i % 2:  # the time to first byte with the request, or on its own
                m.observe_request(kind, up, status, latency, overhead, ttfb)
            else:
                m.observe_request(kind, up, status, latency, overhead)
                m.observe_ttfb(up, ttfb)
            ref["tripwire_requests"].labels(kind, up, status_class(status)).inc()
            if latency is not None:
                ref["tripwire_upstream_latency_seconds"].labels(kind, up).observe(latency)
            ref["tripwire_proxy_overhead_seconds"].labels(kind).observe(overhead)
            ref["tripwire_stream_time_to_first_byte_seconds"].labels(up).observe(ttfb)
            agent, model, prompt, completion, cost = (
                f"a{i % 4}",
                f"m{i % 6}",
                i * 13 % 5,
                i % 3,
                (i % 4) * 1e-4,
            )
            m.observe_llm(agent, model, prompt, completion, cost)
            ref["tripwire_llm_calls"].labels(agent, model).inc()
            if prompt:
                ref["tripwire_llm_tokens"].labels(agent, model, "prompt").inc(prompt)
            if completion:
                ref["tripwire_llm_tokens"].labels(agent, model, "completion").inc(completion)
            if cost:
                ref["tripwire_llm_cost_usd"].labels(agent, model).inc(cost)
        ours = m.render().decode()
        theirs = generate_latest(ref_registry).decode()
    assert theirs and ours.startswith(theirs)


def test_the_series_kept_per_call_kind_count_as_the_families_do(monkeypatch: Any) -> None:
    """observe_request / observe_llm keep each kind of call's series (bounded); past the bound a
    call goes through the families: the exposition is the same either way."""
    import prometheus_client.metrics

    from proxy import metrics

    monkeypatch.setattr(prometheus_client.metrics, "_use_created", False)

    def play(m: Metrics) -> bytes:
        for i in range(80):
            latency = None if i % 5 == 0 else (i * 0.37) % 700
            ttfb = None if i % 3 == 0 else (i * 0.41) % 650
            status = [200, 429, None, 503, 0, 302, 999][i % 7]
            m.observe_request(
                "llm" if i % 3 else "mcp", f"up{i % 2}", status, latency, [0.0, -1.0, 0.002][i % 3], ttfb
            )
            m.observe_llm(
                f"a{i % 7}", f"m{i % 5}" if i % 11 else None, i % 3, i % 2, [0.0, 1e-4, -1.0][i % 3]
            )
        return m.render()

    kept = play(Metrics(agent_cap=4, model_cap=3))
    monkeypatch.setattr(metrics, "_RAW_LABELS_KEPT", 2)
    monkeypatch.setattr(metrics, "_REQUEST_KINDS_KEPT", 2)
    assert play(Metrics(agent_cap=4, model_cap=3)) == kept
