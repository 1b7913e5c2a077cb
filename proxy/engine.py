"""The engine: everything one Tripwire process holds, shared by the proxy and admin apps.

Settings, the trace recorder, sessions, guard config, circuit breakers, pricing, metrics and the
upstream client live here, built once at start (no module-level singletons), so the mitmproxy
addon and tests can build the same engine without a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from proxy.agent_keys import KeyStore, key_store_for
from proxy.alerts import Alerts
from proxy.approvals.service import Approvals, approval_book_for, approvals_url
from proxy.auth import AgentKeyGate
from proxy.forward import Forwarder
from proxy.guard_backend import GuardBackend, WindowBook, guard_backend_for, windows_for
from proxy.guard_log.service import SharedState
from proxy.guard_store import GuardConfigStore
from proxy.guards.breaker import BreakerRegistry
from proxy.guards.config import GuardConfig
from proxy.mcp.hub import McpHub
from proxy.mcp.stdio import StdioServers
from proxy.metrics import Metrics
from proxy.pins.service import Pins, pins_for
from proxy.pricing import Pricing
from proxy.recorder import TraceRecorder
from proxy.redact import redact_argv
from proxy.services import Services
from proxy.session_policy import SessionPolicy
from proxy.sessions import SessionManager
from proxy.settings import Settings
from proxy.socket_limits import SocketSlots
from proxy.storage import prune_runs
from proxy.trace import sinks as trace_sinks
from proxy.upstreams import UpstreamRegistry

log = logging.getLogger("tripwire")

RETENTION_INTERVAL_S = 3600.0  # how often retention runs (and once at start)
DRAIN_FINISH_S = 2.0  # after cutting streams at the end of the grace, time for their calls to record


class Engine:
    def __init__(self, settings: Settings, *, argv: list[str] | None = None) -> None:
        self.settings = settings
        self.data_dir = settings.resolved_data_dir()
        self.argv = redact_argv(list(argv if argv is not None else sys.argv))
        self.recorder = TraceRecorder(
            self.data_dir,
            max_field_bytes=settings.max_field_bytes,
            record_content=settings.record_content,
            fsync=settings.fsync,
            trace_writer=settings.trace_writer,
            sinks=trace_sinks.from_settings(settings),  # e.g. OTLP export (SPEC §8)
        )
        self.pricing = Pricing(dict(settings.pricing_table))
        self.sessions = SessionManager(
            idle_timeout_s=settings.session_idle_timeout_s,
            terminated_ttl_s=settings.terminated_ttl_s,
        )
        self.guard_store = GuardConfigStore(
            self.data_dir / "prevention-config.json", settings.guards, dict(settings.agents)
        )
        self.breakers = BreakerRegistry()
        self.metrics = Metrics()
        self.forwarder = Forwarder(
            connect_timeout_s=settings.connect_timeout_s,
            ttfb_timeout_s=settings.ttfb_timeout_s,
            ca_bundle=str(settings.ca_bundle) if settings.ca_bundle else None,
            retries=settings.upstream_retries,
            retry_base_s=settings.upstream_retry_base_s,
            max_decoded_bytes=settings.max_decoded_bytes,
        )
        self.admin_token = settings.admin_token
        self.draining = False
        # parts of /healthz the listeners add (the aggregate endpoint's servers that dropped out)
        self.health_reports: dict[str, Callable[[], Any]] = {}
        self.inflight = 0
        # the relayed WebSockets (proxy/websocket/relay.py SocketRelay): drain cuts their answers too
        self.sockets: set[Any] = set()
        self.socket_slots = SocketSlots(settings.websocket_max_per_agent)  # open sockets per agent
        self._idle_drained = asyncio.Event()
        self._sweeper: asyncio.Task[None] | None = None
        self.sweep_cpu_s = 0.0  # the loop thread's CPU spent ending idle runs (/healthz "sessions")
        # where calls go: the configured upstreams, plus stdio MCP children and intercepted hosts
        self.upstreams = UpstreamRegistry(settings)
        self.alerts = Alerts(settings.alert_webhook, self.forwarder)
        self.mcp = McpHub(
            settings, self.forwarder, self.upstreams
        )  # MCP results across streams, legacy SSE sessions (proxy/mcp/)
        self.stdio = StdioServers(settings.mcp_stdio, self.upstreams)  # --mcp-stdio children
        # the one Redis client of the process (--state): guard state, approvals and agent keys share
        # its pool and timeouts (proxy/state/client.py); closed last, by `close`
        self.redis: Any = None
        if settings.state.url:
            from proxy.state.client import redis_client  # redis-py is loaded only when asked for

            self.redis = redis_client(settings.state.url)
        # guard state shared with other replicas (--state, docs/scaling.md); None: this process's
        self.shared = (
            SharedState(settings, self.guard_store, self.metrics, client=self.redis)
            if settings.state.url
            else None
        )
        # where guard state lives, chosen once: the stages and the session policy only ask it
        # the agents' budgets over time (SPEC §9): this process's, kept in the data dir, or shared
        self.windows: WindowBook = windows_for(self.shared, self.data_dir, self.metrics)
        self.guards: GuardBackend = guard_backend_for(self.shared, self.guard_store, self.windows)
        # agent keys (SPEC §9): the store (data dir, or the shared state) and, when keys are
        # required, the proxy listener's check (None: calls name their agent themselves)
        self.agent_keys: KeyStore = key_store_for(self.data_dir, settings.state.url, self.redis)
        self.auth = AgentKeyGate(self.agent_keys, self.metrics) if settings.auth.require_agent_key else None
        # calls held for a person (SPEC §5.5a): in Redis with shared state, so any replica decides
        self.approvals = Approvals(
            approval_book_for(settings, self.redis), self.metrics, self.alerts, approvals_url(settings)
        )
        # MCP servers' pinned tool definitions: the data dir, or Redis with shared state
        self.pins: Pins = pins_for(settings, self.guards.config, self.metrics.registry)
        # when runs open, end, are terminated; the events of a session and what its guards make of them
        self.policy = SessionPolicy(
            sessions=self.sessions,
            recorder=self.recorder,
            guard_store=self.guard_store,
            guards=self.guards,
            metrics=self.metrics,
            alerts=self.alerts,
            argv=self.argv,
        )

    @property
    def services(self) -> Services:
        """What the pipeline's stages are given: the services without the engine's lifecycle (built
        when asked, at start, so a service a test swapped in is the one the stages get)."""
        return Services(
            settings=self.settings,
            sessions=self.sessions,
            policy=self.policy,
            guards=self.guards,
            recorder=self.recorder,
            metrics=self.metrics,
            alerts=self.alerts,
            breakers=self.breakers,
            upstreams=self.upstreams,
            forwarder=self.forwarder,
            mcp=self.mcp,
            pricing=self.pricing,
            approvals=self.approvals,
            pins=self.pins,
        )

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        closed = self.recorder.recover_interrupted()
        if closed:
            log.warning("closed %d run(s) left running by a previous process as interrupted", len(closed))
        await self.recorder.start()
        await self.forwarder.start()
        await self.guards.start()
        await self.agent_keys.start()
        await self.approvals.start()
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="tripwire-session-sweeper")

    async def drain(self, grace_s: float) -> None:
        """SIGTERM: refuse new calls, give in-flight calls and streams `grace_s`, then close runs."""
        self.draining = True
        if self.inflight:
            log.info("draining: waiting up to %.0fs for %d in-flight call(s)", grace_s, self.inflight)
            self._idle_drained.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle_drained.wait(), grace_s)
        if self.inflight:
            # grace is over: cut the streams (their clients see them end abnormally); each call records itself
            cut = self.forwarder.abort_all() + sum(relay.cut_for_drain() for relay in list(self.sockets))
            log.warning("drain grace over: cutting %d stream(s) still open", cut)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle_drained.wait(), DRAIN_FINISH_S)

    async def close(self) -> None:
        sweeper = self._sweeper
        while sweeper is not None and not sweeper.done():
            # cancelled until it stops: on Python 3.11 a cancellation that lands as one of its state
            # backend calls completes can be swallowed (asyncio.wait_for's race), and it sweeps on
            sweeper.cancel()
            await asyncio.wait({sweeper}, timeout=1.0)
        self.policy.end_all("shutdown")
        await self.approvals.close()
        await self.pins.close()
        await self.guards.close()
        await self.agent_keys.close()
        await self.recorder.close()
        await self.alerts.close()
        await self.forwarder.close()
        if self.redis is not None:
            await self.redis.aclose()

    def stream_handler(self, route: Any, request: Any) -> Any:
        """MCP GET streams (server stream, legacy SSE) are relayed outside the per-call pipeline."""
        return self.mcp.stream_handler(route, request)

    async def start_children(self) -> None:
        await self.stdio.start()

    async def stop_children(self) -> None:
        await self.stdio.stop()

    def call_started(self) -> None:
        self.inflight += 1

    def call_finished(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle_drained.set()

    async def _sweep_forever(self) -> None:
        interval = min(5.0, max(0.05, self.settings.session_idle_timeout_s / 4))
        next_prune = 0.0
        while True:
            try:
                if time.monotonic() >= next_prune:
                    next_prune = time.monotonic() + RETENTION_INTERVAL_S
                    await self.prune()
                await asyncio.sleep(interval)
                await self.guards.keep_alive(self.sessions, time.monotonic())
                self.sweep(time.monotonic())
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("session sweep failed")

    async def prune(self) -> list[str]:
        """Retention (age and total size): delete old finished runs, off the event loop."""
        retention = self.settings.retention
        if retention.max_age_days is None and retention.max_total_mb is None:
            return []
        keep = {s.run_id for s in self.sessions.live()}
        deleted = await asyncio.to_thread(
            prune_runs,
            self.data_dir,
            now=time.time(),
            max_age_s=retention.max_age_days * 86400 if retention.max_age_days else None,
            max_total_bytes=int(retention.max_total_mb * 2**20) if retention.max_total_mb else None,
            keep=keep,
        )
        if deleted:
            log.info("retention: deleted %d old run(s)", len(deleted))
        return deleted

    def sweep(self, now: float) -> None:
        cpu = time.thread_time()
        self.policy.end_idle(now)
        self.sweep_cpu_s += time.thread_time() - cpu
        self.metrics.set_live_sessions(self.sessions.live_count())
        health = self.recorder.health()
        self.metrics.set_store(
            health.get("queue_depth", 0),
            health.get("write_errors", 0),
            healthy=health.get("ok"),
            stalled=bool(health.get("writer_stalled")),
        )

    # --- sessions ----------------------------------------------------------------------------

    def guard_config(self, agent: str) -> GuardConfig:
        return self.guards.config(agent)

    async def terminate_run(self, run_id: str) -> bool:
        """The kill switch (POST /api/runs/{run_id}/terminate)."""
        return self.policy.kill(run_id)

    def guard_stats(self, run_id: str) -> dict[str, Any] | None:
        return self.policy.guard_stats(run_id)

    async def resume_run(self, run_id: str, raised: Any = None) -> str:
        """POST /api/runs/{run_id}/resume: the new run's id (SPEC §5.5a; `SessionPolicy.resume`)."""
        return (await self.policy.resume(run_id, raised)).run_id

    # --- health and metrics ------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        store = self.recorder.health()
        out = {"status": "ok", "draining": self.draining, "trace_store": store}
        out["sessions"] = {"live": self.sessions.live_count(), "sweep_cpu_s": round(self.sweep_cpu_s, 3)}
        state = self.guards.health()
        if state is not None:
            out["state"] = state  # shared guard state: never fails readiness (SPEC §6, §8)
        for name, report in self.health_reports.items():
            out[name] = report()
        return out
