"""The session stage: the call's session (one AgentDbg run), opened or refused."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from proxy import episodes
from proxy.constants import GUARD_SESSION_TERMINATED
from proxy.dialects import of_call
from proxy.exchange import Exchange
from proxy.guard_backend import TERMINATED, StateUnavailable
from proxy.guards.decision import Action, Decision
from proxy.guards.describe import describe_ended
from proxy.pipeline import BaseStage
from proxy.refusals import refuse_unavailable
from proxy.responses_chain import synthetic_id_of
from proxy.run_names import run_name
from proxy.sessions import Refused

if TYPE_CHECKING:
    from proxy.services import Services


class SessionStage(BaseStage):
    """Attach the call to its session (one AgentDbg run), starting the run on its first call.

    Only calls Tripwire records (a protocol adapter parsed them) open a session: listing models
    does not start an empty run. Without an explicit session, the call's episode picks the
    automatic run (SPEC §3, proxy/episodes.py, docs/sessions.md). A terminated session refuses
    every later call of its episode.
    """

    name = "session"

    def __init__(self, services: Services) -> None:
        self.services = services

    async def request(self, ex: Exchange) -> None:
        if ex.protocol is None:
            return
        episode = None
        if ex.route.session is None:  # an explicit session wins over anything the client announces
            if ex.protocol.kind == "llm":
                episode = episodes.for_llm(ex.request.headers, ex.request_json, ex.call)
            else:
                episode = episodes.for_mcp(ex.request.headers)
        guards = self.services.guards
        try:  # several replicas: the run all of them use for the session (alone: None)
            run_id = await guards.resolve_run(
                self.services.sessions, ex.route.agent, ex.route.session, episode, time.monotonic()
            )
        except StateUnavailable:
            return refuse_unavailable(self.services.policy, ex, guards.retry_after_s())
        opened = (
            Refused(None, "session terminated")
            if run_id == TERMINATED
            else self.services.policy.open(
                ex.route.agent,
                ex.route.session,
                wall=ex.started_wall,
                episode=episode,
                run_id=run_id,
                run_name=lambda: run_name(
                    ex.request.headers,
                    getattr(ex.call, "messages", None),
                    record_content=self.services.settings.record_content,
                ),
            )
        )
        if isinstance(opened, Refused):
            settings = self.services.settings
            text = describe_ended(
                ex.route.agent,
                ex.route.session,
                idle_timeout_s=settings.session_idle_timeout_s,
                terminated_ttl_s=settings.terminated_ttl_s,
                run_url=settings.viewer_run_url(opened.session.run_id)
                if opened.session is not None
                else None,
            )
            decision = Decision(Action.TERMINATE, guard=GUARD_SESSION_TERMINATED, message=text)
            ex.answer = ex.protocol.render_refusal(ex, decision, text)
            self.services.metrics.observe_decision(decision.guard, "terminate")
            return
        ex.session = opened
        opened.inflight += 1

    async def finish(self, ex: Exchange) -> None:
        session = ex.session
        if session is None:
            return
        session.inflight -= 1
        session.last_seen = time.monotonic()
        dialect = of_call(ex.call)
        if dialect is not None and dialect.CHAINS_RESPONSES and not session.explicit:
            # a later request naming this answer as previous_response_id continues this run
            result = ex.result
            response_id = getattr(result, "response_id", None)
            if ex.answer is not None and not ex.forwarded:
                response_id = synthetic_id_of(ex.answer.body)  # a blocked answer's own id
            if response_id:
                self.services.sessions.note_response(session, response_id)
        if not session.explicit and session.lineage.announced is None and ex.protocol is not None:
            # a later request whose history carries this answer continues this run (SPEC §3)
            key = episodes.given_answer_key(ex.call, ex.result if ex.forwarded else None, ex.block_text)
            if key is not None:
                self.services.sessions.note_answer(session, key)
