"""Session policy: when a session's run opens, ends, is terminated, and what its events make of it.

`SessionPolicy` (`engine.policy`) is the one place a run starts (RUN_START with the guard config in
force) and ends (RUN_END: idle, shutdown, terminated), where the events of a session are written
and handed to its guards (`write_event` then `observe_event`), and where what AgentDbg's cycle
detector concludes after the fact is carried out (`on_cycle`: a LOOP_WARNING, an ERROR, maybe the
end of the session). A terminated session whose calls are still in flight ends once the last one is
recorded (`end_if_pending`). The guard state itself is the backend's (proxy/guard_backend/).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from proxy import ids, storage
from proxy.alerts import Alerts
from proxy.constants import GUARD_KILL_SWITCH, TAG_LOOP_DETECTED, TAG_SHADOW_FIRED, TAG_TERMINATED, EventType
from proxy.episodes import Episode
from proxy.guard_backend import GuardBackend
from proxy.guard_events import guard_error, loop_warning
from proxy.guard_store import GuardConfigStore
from proxy.guards.decision import Action, Decision
from proxy.guards.raises import RaiseError, limit_of, still_refused
from proxy.metrics import Metrics
from proxy.recorder import TraceRecorder
from proxy.run_names import default_name
from proxy.sessions import Refused, Session, SessionManager


class ResumeConflict(Exception):
    """A run that cannot be resumed (a 409): running, ended normally, or no longer held."""


class SessionPolicy:
    def __init__(
        self,
        *,
        sessions: SessionManager,
        recorder: TraceRecorder,
        guard_store: GuardConfigStore,
        guards: GuardBackend,
        metrics: Metrics,
        alerts: Alerts,
        argv: list[str],
    ) -> None:
        self.sessions = sessions
        self.recorder = recorder
        self.guard_store = guard_store
        self.guards = guards
        self.metrics = metrics
        self.alerts = alerts
        self.argv = argv
        self._pending_end: dict[str, tuple[str, str]] = {}  # run_id -> (status, reason) of a terminated run
        self._resuming: set[str] = set()  # runs a resume is under way for

    # --- open --------------------------------------------------------------------------------

    def open(
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
            self.end(expired, status="ok", reason="idle_timeout")
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
                # (the same dict run after run, till the config changes: a stateless service opens
                # a run per call, and the dump was most of what opening one cost)
                "guard_config": self.recorder.config_dumps.recorded(config),
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
            self.metrics.set_live_sessions(self.sessions.live_count())
        return session

    # --- events ------------------------------------------------------------------------------

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
        self.guards.observe(session, event_type, name, event_id, self.on_cycle)

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
            self.terminate(session, reason=f"guard:{decision.guard}")

    # --- end ---------------------------------------------------------------------------------

    def end(self, session: Session, *, status: str, reason: str) -> None:
        if session.ended:
            return
        # a terminated session whose end waited for its calls in flight ends as it was terminated
        status, reason = self._pending_end.pop(session.run_id, (status, reason))
        session.ended = True
        self.sessions.note_ended(session)
        self.recorder.end_run(session.run_id, status=status, reason=reason)
        self.guards.ended(session)

    def end_idle(self, now: float) -> None:
        """Runs idle for `session_idle_timeout_s` end (RUN_END, reason idle_timeout)."""
        for session in self.sessions.idle_sessions(now):
            self.end(session, status="ok", reason="idle_timeout")

    def end_all(self, reason: str) -> None:
        """Shutdown: every open run ends."""
        for session in self.sessions.live():
            self.end(session, status="ok", reason=reason)

    def terminate(
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
            self.end(session, status="error", reason=reason)

    def end_if_pending(self, session: Session) -> None:
        """A call of a terminated session finished: end its run once it is the last one in flight."""
        if session.run_id in self._pending_end and session.inflight <= 1:
            self.end(session, status="error", reason="terminated")

    def kill(self, run_id: str) -> bool:
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
        self.guards.terminated(session, "terminated", kill=True)  # every replica refuses its calls
        self.terminate(session, reason="terminated", own_call=False)
        return True

    async def raise_limits(self, session: Session, raised: Any, *, by: str = "api") -> dict[str, float]:
        """Raise the session's budgets or limits for the rest of the session (SPEC §5.5a), from its
        next call; RaiseError (a 400) when `raised` names something else or a value not above what
        was spent. Recorded in its run as a STATE_UPDATE `limits_raised`, which replay applies where
        it stands among the run's events."""
        values = await self.guards.raise_limits(session, raised, time.monotonic())
        if not session.ended:
            self.record_raise(session, values, by=by)
        return values

    def record_raise(self, session: Session, values: dict[str, float], *, by: str) -> None:
        config = session.guards.config if session.guards is not None else self.guards.config(session.agent)
        event_id = self.write_event(
            session,
            EventType.STATE_UPDATE,
            "limits_raised",
            {
                "state": {"raised": values},
                "diff": {key: {"from": limit_of(config, key), "to": value} for key, value in values.items()},
                "raised": values,
                "by": by,
            },
        )
        self.observe_event(session, EventType.STATE_UPDATE, "limits_raised", event_id)

    async def resume(self, run_id: str, raised: Any = None, *, by: str = "api") -> Session:
        """Lift a terminated session's refusal (kill switch, loop `terminate`, a budget or limit;
        SPEC §5.5a): with `raised` limits raised, the session goes on in a new run whose RUN_START
        names `resumed_from`; its guards carry the old run's spend, counts and loop state over.
        ResumeConflict (409) for a run that is not a guard-ended session held here; RaiseError (400)
        for a bad raise, or none when the budget or limit that ended it would refuse again."""
        old = self.sessions.by_run_id(run_id)
        if self.recorder.is_open(run_id):
            raise ResumeConflict("run is running: only a run ended by a guard or the kill switch resumes")
        if old is None:
            raise ResumeConflict(
                "run's session is no longer held here (quiet for an idle timeout, or the proxy restarted):"
                " the agent's next call starts a new run"
            )
        if not old.terminated:
            raise ResumeConflict("run ended normally, not by a guard or the kill switch: nothing to resume")
        if not old.ended:
            raise ResumeConflict("run is still ending (calls in flight): try again in a moment")
        if run_id in self._resuming:
            raise ResumeConflict("run is being resumed already")
        self._resuming.add(run_id)
        try:
            return await self._resume(old, raised, by)
        finally:
            self._resuming.discard(run_id)

    async def _resume(self, old: Session, raised: Any, by: str) -> Session:
        now = time.monotonic()
        values = await self.guards.raise_limits(old, raised, now) if raised is not None else {}
        guards = old.guards
        if guards is not None:
            refused = still_refused(guards.terminated_by, guards.budget, now)
            if refused is not None:
                raise RaiseError(f"{refused.message}: resume with raise.{refused.guard} above it")
            guards.resumed()
        old.conversation.configs_recorded.clear()  # the new run records its config again
        old.conversation.guard_history = []  # and its first call's whole history (replay)
        new_run_id = ids.uuid4_text()
        # the episode goes on: the new run keeps the old one's name (what the run is about)
        name = await asyncio.to_thread(storage.run_name_of, self.recorder.data_dir, old.run_id)
        await self.guards.resumed(old, new_run_id)  # shared: every replica finds the new run
        session = self.sessions.resume(old, new_run_id, now=time.monotonic(), wall=time.time())
        config, is_override = self.guard_store.effective(session.agent)
        carried = guards.budget.stats(now) if guards is not None else {}
        carried_over = {
            k: carried[k] for k in ("cost_usd", "tokens", "llm_calls", "tool_calls", "events") if k in carried
        }
        if guards is not None and guards.raised:
            carried_over["raised"] = dict(guards.raised)
        self.recorder.start_run(
            run_id=session.run_id,
            run_name=name or default_name(session.agent, session.session_id),
            agent_name=session.agent,
            session_id=session.session_id,
            argv=self.argv,
            extra={
                "guard_config": self.recorder.config_dumps.recorded(config),
                "guard_config_source": "agent" if is_override else "project",
                "resumed_from": old.run_id,
            },
            start_fields={"resumed_from": old.run_id, "carried_over": carried_over},
        )
        if values:
            self.record_raise(session, values, by=by)
        self.metrics.set_live_sessions(self.sessions.live_count())
        await self.recorder.update_run_fields(old.run_id, resumed_as=session.run_id)
        return session

    def guard_stats(self, run_id: str) -> dict[str, Any] | None:
        session = self.sessions.by_run_id(run_id)
        if session is None or session.guards is None or session.ended:
            return None
        return session.guards.stats()
