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

from proxy.alerts import Alerts
from proxy.constants import GUARD_KILL_SWITCH, TAG_LOOP_DETECTED, TAG_SHADOW_FIRED, TAG_TERMINATED, EventType
from proxy.episodes import Episode
from proxy.exchange import Exchange
from proxy.forward import Forwarder
from proxy.guard_events import guard_error, loop_warning
from proxy.guard_store import GuardConfigStore
from proxy.guards.breaker import BreakerRegistry
from proxy.guards.config import GuardConfig
from proxy.guards.decision import Action, Decision
from proxy.mcp.hub import McpHub
from proxy.mcp.stdio import StdioServers
from proxy.metrics import Metrics
from proxy.pricing import Pricing
from proxy.recorder import TraceRecorder
from proxy.redact import redact_argv
from proxy.run_names import default_name
from proxy.sessions import Refused, Session, SessionManager
from proxy.settings import Settings
from proxy.socket_limits import SocketSlots
from proxy.state.service import SharedState
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
        self.inflight = 0
        # the relayed WebSockets (proxy/websocket/relay.py SocketRelay): drain cuts their answers too
        self.sockets: set[Any] = set()
        self.socket_slots = SocketSlots(settings.websocket_max_per_agent)  # open sockets per agent
        self._idle_drained = asyncio.Event()
        self._sweeper: asyncio.Task[None] | None = None
        self._pending_end: dict[str, tuple[str, str]] = {}  # run_id -> (status, reason) of a terminated run
        # where calls go: the configured upstreams, plus stdio MCP children and intercepted hosts
        self.upstreams = UpstreamRegistry(settings)
        self.alerts = Alerts(settings.alert_webhook, self.forwarder)
        self.mcp = McpHub(
            settings, self.forwarder, self.upstreams
        )  # MCP results across streams, legacy SSE sessions (proxy/mcp/)
        self.stdio = StdioServers(settings.mcp_stdio, self.upstreams)  # --mcp-stdio children
        # guard state shared with other replicas (--state, docs/scaling.md); None: this process's
        self.shared = SharedState(settings, self.guard_store, self.metrics) if settings.state.url else None

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        closed = self.recorder.recover_interrupted()
        if closed:
            log.warning("closed %d run(s) left running by a previous process as interrupted", len(closed))
        await self.recorder.start()
        await self.forwarder.start()
        if self.shared is not None:
            await self.shared.start()
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
        for session in self.sessions.live():
            self.end_session(session, status="ok", reason="shutdown")
        if self.shared is not None:
            await self.shared.close()
        await self.recorder.close()
        await self.alerts.close()
        await self.forwarder.close()

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
                if self.shared is not None:  # runs live on another replica stay open here too
                    await self.shared.keep_alive(self.sessions, time.monotonic())
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
        for session in self.sessions.idle_sessions(now):
            self.end_session(session, status="ok", reason="idle_timeout")
        self.metrics.set_live_sessions(len(self.sessions.live()))
        health = self.recorder.health()
        self.metrics.set_store(
            health.get("queue_depth", 0),
            health.get("write_errors", 0),
            healthy=health.get("ok"),
            stalled=bool(health.get("writer_stalled")),
        )

    # --- sessions ----------------------------------------------------------------------------

    def guard_config(self, agent: str) -> GuardConfig:
        return self.guard_store.effective(agent)[0]

    def open_session(
        self,
        agent: str,
        explicit_id: str | None,
        *,
        wall: float | None = None,
        episode: Episode | None = None,
        run_id: str | None = None,
        run_name: Callable[[], str | None] | None = None,
    ) -> Session | Refused:
        """The call's session (SPEC §3): the explicit one, else the automatic one of its episode
        (`episode`: what the request says about it, proxy/episodes.py; None: a call with no
        conversation, which joins the agent's most recent automatic run).
        `wall`: when the call arrived, so RUN_START is not later than the first call's own event.
        `run_id`: the run the shared state says the session is (several replicas).
        `run_name`: asked for a new run's name (proxy/run_names.py; only when a run starts, not per
        call); None or no name: `AGENT SESSION_ID`."""
        now = time.monotonic()
        sessions = self.sessions
        current = sessions.match(agent, explicit_id, episode)
        live = sessions.take_live(current, explicit_id, episode, now) if run_id is None else None
        if live is not None:
            return live  # (most calls: a live session goes on)
        # matched once: `lookup` takes expire's match unless expire forgot the session it found
        expired, matched = sessions.expire_matched(current, now, run_id=run_id)
        if expired is not None:
            self.end_session(expired, status="ok", reason="idle_timeout")
        opened = sessions.lookup(
            agent,
            explicit_id,
            now=now,
            wall=wall or time.time(),
            episode=episode,
            run_id=run_id,
            matched=matched,
        )
        if isinstance(opened, Refused):
            return opened
        session, created = opened
        if created:
            config, is_override = self.guard_store.effective(agent)
            fields: dict[str, Any] = {
                "guard_config": config.model_dump(mode="json"),
                "guard_config_source": "agent" if is_override else "project",
            }
            if session.lineage.announced is not None:
                # the client's own episode id, so a run can be matched to e.g. a Codex session file
                fields["episode"] = {"id": session.lineage.announced, "source": session.lineage.source}
            self.recorder.start_run(
                run_id=session.run_id,
                run_name=(run_name and run_name()) or default_name(agent, session.session_id),
                agent_name=agent,
                session_id=session.session_id,
                argv=self.argv,
                extra=fields,
                ts=session.started_wall,
            )
            self.metrics.set_live_sessions(len(self.sessions.live()))
        return session

    def write_event(
        self,
        session: Session,
        event_type: str,
        name: str,
        payload: dict[str, Any],
        *,
        duration_ms: float | None = None,
        parent_id: str | None = None,
        meta: dict[str, Any] | None = None,
        ts: float | None = None,
        sanitized: bool = False,
    ) -> str:
        """Write one event of a session's run; returns its id. Writing is all it does: the writer
        then hands the event to the session's guards itself (`observe_event`). (The recorder's
        keywords spelled out: no **kw dict packed and unpacked per event.)"""
        return self.recorder.record(
            session.run_id,
            event_type,
            name,
            payload,
            duration_ms=duration_ms,
            parent_id=parent_id,
            meta=meta,
            ts=ts,
            sanitized=sanitized,
        )

    def observe_event(self, session: Session, event_type: str, name: str, event_id: str) -> None:
        """Let the session's guards see an event written to its run.

        Every event counts toward `max_events`, and LLM_CALL / TOOL_CALL feed AgentDbg's cycle
        detector, which can only warn after the fact (or, with stop_on_loop, end the session).
        The guards' own LOOP_WARNING / ERROR of a cycle are not observed (replay relies on it).
        """
        if session.guards is None or session.ended:
            return
        if self.shared is not None:  # through the run's shared guard log, in its order
            self.shared.observe(session, event_type, name, event_id, self.on_cycle)
            return
        decision = session.guards.observe_event(event_type, name, event_id)
        if decision is not None:
            self.on_cycle(session, decision)

    def on_cycle(self, session: Session, decision: Decision) -> None:
        shadow = bool(session.guards is not None and session.guards.shadow)
        self.metrics.observe_decision(decision.guard, decision.action.name, shadow=shadow)
        if shadow:  # recorded as enforce mode would, and nothing more (SPEC §5.7)
            if decision.new_finding and decision.kind is not None:
                name, payload = loop_warning(decision)
                self.recorder.record(
                    session.run_id, EventType.LOOP_WARNING, name, {**payload, "shadow": True}
                )
            if decision.action == Action.TERMINATE:
                payload = guard_error(decision, shadow=True)
                self.recorder.record(session.run_id, EventType.ERROR, decision.guard, payload)
            self.recorder.add_tags(session.run_id, TAG_SHADOW_FIRED)
            return
        if decision.new_finding and decision.kind is not None:
            name, payload = loop_warning(decision)
            self.recorder.record(session.run_id, EventType.LOOP_WARNING, name, payload)
            if decision.action == Action.WARN:
                self.alerts.send(session, decision)  # a TERMINATE alerts below, with its ERROR
            self.recorder.add_tags(session.run_id, TAG_LOOP_DETECTED)
        if decision.action == Action.TERMINATE:
            self.recorder.record(session.run_id, EventType.ERROR, decision.guard, guard_error(decision))
            self.alerts.send(session, decision)
            self.terminate_session(session, reason=f"guard:{decision.guard}")

    def end_session(self, session: Session, *, status: str, reason: str) -> None:
        if session.ended:
            return
        # a terminated session whose end waited for its calls in flight ends as it was terminated
        status, reason = self._pending_end.pop(session.run_id, (status, reason))
        session.ended = True
        self.recorder.end_run(session.run_id, status=status, reason=reason)
        if self.shared is not None:
            self.shared.ended(session)

    def terminate_session(
        self, session: Session, *, reason: str, tag: str | None = TAG_TERMINATED, own_call: bool = True
    ) -> None:
        """End the run with status error; every later call of the session is refused at once.

        Loops and the kill switch tag the run `terminated`; budgets carry their own tag. Calls
        of the session still in flight (other than the caller's own, `own_call`) already reached
        the upstream: RUN_END waits until they are recorded (`end_if_pending`).
        """
        self.sessions.terminate(session, time.monotonic())
        if tag:
            self.recorder.add_tags(session.run_id, tag)
        if session.inflight - (1 if own_call else 0) > 0:
            self._pending_end[session.run_id] = ("error", reason)
        else:
            self.end_session(session, status="error", reason=reason)

    def end_if_pending(self, session: Session) -> None:
        """A call of a terminated session finished: end its run once it is the last one in flight."""
        if session.run_id in self._pending_end and session.inflight <= 1:
            self.end_session(session, status="error", reason="terminated")

    async def terminate_run(self, run_id: str) -> bool:
        """The kill switch (POST /api/runs/{run_id}/terminate)."""
        session = self.sessions.by_run_id(run_id)
        if session is None or session.ended or session.terminated:
            return False
        self.recorder.record(
            run_id,
            EventType.ERROR,
            GUARD_KILL_SWITCH,
            {
                "error_type": GUARD_KILL_SWITCH,
                "message": "session terminated through the admin API",
                "stack": None,
                "guardrail": GUARD_KILL_SWITCH,
                "threshold": None,
                "actual": None,
            },
        )
        self.metrics.observe_decision(GUARD_KILL_SWITCH, "terminate")
        if self.shared is not None:  # every replica refuses the session's calls
            self.shared.terminate(session, "terminated", kill=True)
        self.terminate_session(session, reason="terminated", own_call=False)
        return True

    def guard_stats(self, run_id: str) -> dict[str, Any] | None:
        session = self.sessions.by_run_id(run_id)
        if session is None or session.guards is None or session.ended:
            return None
        return session.guards.stats()

    # --- health and metrics ------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        store = self.recorder.health()
        out = {"status": "ok", "draining": self.draining, "trace_store": store}
        if self.shared is not None:
            out["state"] = self.shared.health()  # never fails readiness (SPEC §6, §8)
        return out

    def observe_request(self, ex: Exchange) -> None:
        latency = overhead = ttfb = None
        started, done = ex.upstream_started, ex.upstream_done
        if started is not None and done is not None:
            latency = done - started
            overhead = (time.monotonic() - ex.started) - latency  # (the metrics count below 0 as 0)
            if ex.first_byte_at is not None:
                ttfb = ex.first_byte_at - started
        status = ex.upstream_status or (ex.answer.status if ex.answer is not None else None)
        route = ex.route
        self.metrics.observe_request(route.kind, route.upstream, status, latency, overhead, ttfb)
