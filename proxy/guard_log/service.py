"""`SharedState`: what one replica shares with the others (`--state`, SPEC §8), for the engine.

The engine holds one when `state.url` is set (`Engine.shared`; None: everything stays in this
process, as without replicas). It bundles the backend and its failure policy (`link`), the API-set
configs by revision (`configs`), every run's channel (`guards`), and the session-to-run mapping:
a call whose session this replica does not know (or knows only as idle) asks the backend which run
it belongs to, so one session is one run id whichever replica serves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from proxy.admission import TWINS
from proxy.episodes import NO_CONVERSATION, Episode
from proxy.guard_log import entries
from proxy.guard_log.channel import SharedGuards
from proxy.guard_log.configs import SharedConfigs
from proxy.guard_log.replica import Applied
from proxy.guard_store import GuardConfigStore
from proxy.guards.breaker import BreakerRegistry
from proxy.guards.config import GuardConfig
from proxy.guards.decision import Decision
from proxy.metrics import Metrics
from proxy.sessions import Session, SessionManager
from proxy.settings import Settings
from proxy.state import keys
from proxy.state.base import ResolveMode, StateBackend, StateUnavailable
from proxy.state.link import StateLink

log = logging.getLogger("tripwire.state")

TERMINATED = "terminated"  # `run_for`: the session was terminated (on any replica): refuse the call
MAX_HISTORY_DIGESTS = 256  # prefixes of a conversation looked up when resolving its run
MAX_CHAIN_LINKS = 2048  # Responses links fetched in one round trip (older ones: judged without)


def backend_for(url: str, client: Any = None) -> StateBackend:
    """Redis at `url`, through `client` when given (the process's one client, proxy/state/client.py)."""
    from proxy.state.redis_backend import RedisBackend  # redis-py is loaded only when asked for

    return RedisBackend(
        url, client=client, twins=TWINS
    )  # the APPEND script assembled from the checks' fragments


class SharedState:
    def __init__(
        self,
        settings: Settings,
        guard_store: GuardConfigStore,
        metrics: Metrics,
        *,
        backend: StateBackend | None = None,
        probe_interval_s: float | None = None,
        client: Any = None,
    ) -> None:
        assert backend is not None or settings.state.url, "shared state needs state.url or a backend"
        backend = backend or backend_for(str(settings.state.url), client)
        self.link = StateLink(backend, settings.state.on_unavailable)
        if probe_interval_s is not None:
            self.link.probe_interval_s = probe_interval_s
        self.backend = backend
        self.metrics = metrics
        self.guard_store = guard_store
        self.idle_s = settings.session_idle_timeout_s
        self.terminated_ttl_s = settings.terminated_ttl_s
        self.configs = SharedConfigs(backend, settings.guards, dict(settings.agents))
        self.guards = SharedGuards(self.link, self.configs, idle_s=self.idle_s)
        # fail_open during an outage: circuits are this replica's own until the backend is back
        self.local_breakers = BreakerRegistry()
        self.tasks: set[asyncio.Task[Any]] = set()
        self._unpublished = False  # an API write made while the backend was down
        self.dataset: str | None = None  # the backend's data set id as last seen (`repair_if_lost`)
        self.repairs = 0  # times this replica put back what Redis lost
        guard_store.publisher = self.publish_configs
        self.configs.listeners.append(self._config_seen)
        self.link.listeners.append(metrics.set_state_backend)
        self.link.listeners.append(self._on_link)

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the shared configs; the first replica shares the API config it has saved."""
        self.metrics.set_state_backend(True)
        try:
            await self.link.call(self.backend.ping)
            self.dataset = await self.link.call(lambda: self.backend.dataset(uuid.uuid4().hex))
            rev = await self.link.call(lambda: self.configs.load())
            project, agents = self.guard_store.api_values()
            if rev == 0 and (project is not None or agents):
                await self.publish_configs(project, agents)
        except StateUnavailable:
            pass  # logged by the link; the failure policy applies until it is back

    async def close(self) -> None:
        await self.guards.close()
        for task in list(self.tasks):
            task.cancel()
        await self.link.close()

    def health(self) -> dict[str, Any]:
        return {**self.link.health(), "repairs": self.repairs}

    def spawn(self, work: Awaitable[Any], name: str) -> None:
        """Background work off the response path (references kept until done)."""

        async def run() -> None:
            try:
                await work
            except StateUnavailable:
                pass  # the link logged it
            except Exception:
                log.exception("state.%s_failed", name)

        task = asyncio.get_running_loop().create_task(run(), name=f"tripwire-state-{name}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _on_link(self, up: bool) -> None:
        if up and self._unpublished:
            self.spawn(self.publish_configs(*self.guard_store.api_values()), "publish")

    # --- prevention configs --------------------------------------------------------------------

    async def publish_configs(self, project: GuardConfig | None, agents: dict[str, GuardConfig]) -> None:
        """After an API write on this replica: the others judge their next calls under it."""
        try:
            await self.link.call(lambda: self.configs.publish(project, agents))
            self._unpublished = False
        except StateUnavailable:
            self._unpublished = True
            log.error("state.config_not_shared: saved on this replica; shared when the backend is back")

    def _config_seen(self, revision: int) -> None:
        """A newer revision published by another replica: the admin API here shows it too."""
        project, agents = self.configs.api(revision)
        self.spawn(asyncio.to_thread(self.guard_store.replace_api, project, agents), "config_store")

    def effective_config(self, agent: str) -> GuardConfig:
        return self.configs.effective(self.configs.current, agent)[0]

    # --- sessions ------------------------------------------------------------------------------

    async def run_for(
        self,
        sessions: SessionManager,
        agent: str,
        explicit_id: str | None,
        episode: Episode | None,
        now: float,
    ) -> str | None:
        """The run id this call joins (created for all replicas if new), `TERMINATED`, or None
        (the backend is down under fail_open: this replica decides alone, as without replicas).
        A session this replica serves and that is live here needs no round trip; one it refuses
        itself (terminated here) answers None too: asking would start a new run for it where the
        backend lost the termination, so the termination is written back instead."""
        episode = episode or NO_CONVERSATION
        current = sessions.match(agent, explicit_id, episode)
        if sessions.refuses(current, agent, explicit_id, now):
            moved = await self.resumed_as(agent, current)
            if moved is None:
                self.spawn(self.restore_terminated(sessions, current, agent, explicit_id, now), "restore")
                return None
            # resumed on another replica (SPEC §5.5a): this replica's copy of the old run is over
            sessions.drop_refusal(current, agent, explicit_id)
            return moved
        if (
            current is not None
            and not current.ended
            and not current.terminated
            and (current.inflight or now - current.last_seen < self.idle_s)
        ):
            return current.run_id
        mode: ResolveMode
        name = None
        if explicit_id is not None:
            mode, name = "explicit", explicit_id
        elif episode.announced is not None:
            mode, name = "episode", episode.announced
        elif episode.first and episode.history:
            mode = "first"
        elif episode.has_lineage:
            mode = "lineage"
        else:
            mode = "none"
        if mode == "first":  # looked up nowhere: attached to the run, as its conversation's start
            history = [episode.history[-1].hex()]
        else:  # the answer the history carries finds its run; else the longest prefix holding it
            prefixes = episode.history[episode.answer_at :][-MAX_HISTORY_DIGESTS:]
            history = [
                *([episode.answer.hex()] if episode.answer else []),
                *(d.hex() for d in reversed(prefixes)),
            ]
        candidate = str(uuid.uuid4())
        try:
            resolved = await self.link.call(
                lambda: self.backend.resolve(
                    agent,
                    mode,
                    candidate,
                    idle_s=self.idle_s,
                    name=name,
                    previous_response_id=episode.previous_response_id,
                    history=history,
                )
            )
        except StateUnavailable:
            if self.link.fail_open:
                return None
            raise
        if resolved.outcome == "terminated":
            return TERMINATED
        return resolved.run_id

    async def resumed_as(self, agent: str, current: Session | None) -> str | None:
        """The run a session this replica refuses was resumed in (by any replica), or None. Asked
        only for refused calls; a backend that is down answers None (refused, as before)."""
        if current is None:
            return None
        try:
            return await self.link.call(lambda: self.backend.resumed_as(agent, current.run_id))
        except StateUnavailable:
            return None

    def slots(self, session: Session) -> tuple[list[str], dict[str, str]]:
        """What names the session's run, kept alive with it; and the lineage links this call adds
        (the agent's latest run, the conversation's newest history digest)."""
        if session.explicit:
            return [keys.slot_explicit(session.agent, session.session_id)], {}
        alive = []
        if session.lineage.announced is not None:
            alive.append(keys.slot_episode(session.agent, session.lineage.announced))
        links = {keys.slot_latest(session.agent): session.run_id}
        if session.lineage.histories:
            newest = next(reversed(session.lineage.histories))
            links[keys.slot_history(session.agent, newest.hex())] = session.run_id
        return alive, links

    # --- Responses API chains -------------------------------------------------------------------

    async def chain(
        self, agent: str, response_id: str, limit: int = MAX_CHAIN_LINKS
    ) -> list[tuple[str, bytes]]:
        """The shared links of a chain this replica is missing, newest first (none while the
        backend is down: the call is then judged on what this replica has, and the guard stage's
        round trip applies the failure policy)."""
        try:
            return await self.link.call(
                lambda: self.backend.chain(
                    agent, response_id, limit=min(limit, MAX_CHAIN_LINKS), idle_s=self.idle_s
                )
            )
        except StateUnavailable:
            return []

    async def share_link(self, agent: str, response_id: str, blob: bytes, parent: str | None) -> None:
        """A Responses answer's link, for the replica that gets the request continuing it."""
        with contextlib.suppress(StateUnavailable):
            await self.link.call(
                lambda: self.backend.put_links(agent, {response_id: (blob, parent)}, idle_s=self.idle_s)
            )

    def response_link(self, session: Session, response_id: str) -> dict[str, str]:
        if session.explicit:
            return {}
        return {keys.slot_response(session.agent, response_id): session.run_id}

    async def keep_alive(self, manager: SessionManager, now: float) -> None:
        """Before each sweep: what Redis lost is put back (`repair_if_lost`); runs idle here but live
        on another replica stay open here too (their idle clock is shared); runs with a call in
        flight here stay live everywhere; the newest shared config revision is read."""
        try:  # a config PUT on another replica shows in this one's admin API too, calls or not
            await self.repair_if_lost(manager, now)
            await self.link.call(lambda: self.configs.load())
        except StateUnavailable:
            return
        sessions = manager.live()
        inflight = [s for s in sessions if s.inflight and not s.ended]
        idle = [s for s in sessions if not s.inflight and not s.ended and now - s.last_seen >= self.idle_s]
        try:
            if inflight:
                await self.link.call(
                    lambda: self.backend.live_runs(
                        [(s.agent, s.run_id) for s in inflight], idle_s=self.idle_s
                    )
                )
            if idle:
                live = await self.link.call(
                    lambda: self.backend.live_runs([(s.agent, s.run_id) for s in idle])
                )
                for session, is_live in zip(idle, live, strict=True):
                    if is_live:
                        session.last_seen = now  # served elsewhere meanwhile
        except StateUnavailable:
            return  # this replica's own idle clocks decide meanwhile

    # --- Redis lost its data ------------------------------------------------------------------------

    async def repair_if_lost(self, manager: SessionManager, now: float) -> bool:
        """The backend's data set is not the one this replica last saw (Redis restarted empty, or
        was flushed): put back what this replica knows, so a replica that never saw a session finds
        it as it was. Each run's copy of the guard log (the spent counts: calls, cost, loops; the
        longest copy of the replicas wins), its terminated mark (guards and kill switch), what
        names it (session id, episode, history digests, Responses ids), and each explicit session's
        terminated mark with the time it has left. True when it repaired."""
        found = await self.link.call(lambda: self.backend.dataset(uuid.uuid4().hex))
        if found == self.dataset:
            return False
        for session in manager.known():
            if not session.ended or session.terminated:
                await self.restore_run(session)
        for agent, session_id, left in manager.terminated_explicit(now):
            await self.restore_mark(manager, agent, session_id, left)
        # only now: a repair the backend cut short is done again at the next sweep (it is idempotent)
        known, self.dataset = self.dataset, found
        self.repairs += 1
        if known is not None:
            log.warning("state.repaired: the backend lost its data; put back %d run(s)", len(manager.known()))
        return True

    async def restore_run(self, session: Session) -> None:
        channel = self.guards.get(session.run_id)
        history, epoch = (list(channel.history), channel.epoch) if channel is not None else ([], "")
        await self.link.call(
            lambda: self.backend.seed(
                session.agent,
                session.run_id,
                history,
                idle_s=self.idle_s,
                epoch=epoch,
                terminated=TERMINATED if session.terminated else None,
                lineage=not session.explicit and not session.lineage.is_empty(),
                slots=self.all_slots(session),
            )
        )

    async def restore_mark(self, manager: SessionManager, agent: str, session_id: str, left: float) -> None:
        named = manager.match(agent, session_id, None)
        await self.link.call(
            lambda: self.backend.terminate(
                agent, named.run_id if named else "", TERMINATED, session_id=session_id, ttl_s=left
            )
        )

    async def restore_terminated(
        self,
        manager: SessionManager,
        current: Session | None,
        agent: str,
        explicit_id: str | None,
        now: float,
    ) -> None:
        """A call this replica refused itself: the termination is in the backend again (and the run's
        idle clock renewed, as a resolve of the refused call would)."""
        if current is not None and current.terminated:
            await self.restore_run(current)
        if explicit_id is not None:
            for agent_, session_id, left in manager.terminated_explicit(now):
                if (agent_, session_id) == (agent, explicit_id):
                    await self.restore_mark(manager, agent, session_id, left)

    def all_slots(self, session: Session) -> list[str]:
        """Every slot key that names the session's run."""
        agent = session.agent
        if session.explicit:
            return [keys.slot_explicit(agent, session.session_id)]
        lineage = session.lineage
        out = [keys.slot_history(agent, d.hex()) for d in lineage.histories]
        out += [keys.slot_response(agent, r) for r in lineage.responses]
        if lineage.announced is not None:
            out.append(keys.slot_episode(agent, lineage.announced))
        return out

    def observe(
        self,
        session: Session,
        event_type: str,
        name: str,
        event_id: str,
        on_cycle: Callable[[Session, Decision], None],
    ) -> None:
        """An event written to the run: into its guard log (max_events, AgentDbg's cycle count it
        in log order on every replica); a cycle it completes is acted on here, when applied."""

        def applied(outcome: Applied) -> None:
            for decision in outcome.decisions:
                on_cycle(session, decision)

        self.guards.channel(session.agent, session.run_id).queue(
            [entries.event(event_type, name, event_id)], on_applied=applied
        )

    def ended(self, session: Session) -> None:
        """The run ended on this replica: its channel goes (what it still has queued is sent)."""
        self.guards.forget(session.run_id)

    def terminate(self, session: Session, reason: str, *, kill: bool = False) -> None:
        """The session was terminated here: every replica refuses its calls. A guard's TERMINATE is
        already in the log (each replica derives it); the kill switch is added to it."""
        if kill:
            self.guards.channel(session.agent, session.run_id).queue([entries.kill(reason)])
        self.spawn(
            self.link.call(
                lambda: self.backend.terminate(
                    session.agent,
                    session.run_id,
                    reason,
                    session_id=session.session_id if session.explicit else None,
                    ttl_s=self.terminated_ttl_s,
                )
            ),
            "terminate",
        )
