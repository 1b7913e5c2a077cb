"""Alerts: a JSON POST to `alert_webhook` when a guard fires (fire and forget, never blocks a call)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from proxy.guards.decision import Action, Decision
from proxy.sessions import Session

log = logging.getLogger("tripwire.alerts")


class JsonPoster(Protocol):
    async def post_json(self, url: str, body: dict[str, Any]) -> None: ...


class Alerts:
    def __init__(self, webhook: str | None, poster: JsonPoster) -> None:
        self.webhook = webhook
        self.poster = poster
        self.in_flight: set[asyncio.Task[None]] = set()  # references kept until each post is done

    @staticmethod
    def body(session: Session, decision: Decision) -> dict[str, Any]:
        body = {
            "source": "tripwire",
            "agent": session.agent,
            "session_id": session.session_id,
            "run_id": session.run_id,
            "guardrail": decision.guard,
            "action": decision.action.name.lower(),
            "kind": decision.kind,
            "message": decision.message,
            "threshold": decision.threshold,
            "actual": decision.actual,
        }
        if decision.resets_at is not None:  # a budget over time: when its window resets (SPEC §9)
            body["resets_at"] = decision.resets_at
        return body

    def send(self, session: Session, decision: Decision) -> None:
        if not self.webhook or decision.action == Action.ALLOW:
            return
        task = asyncio.create_task(
            self.poster.post_json(self.webhook, self.body(session, decision)), name="tripwire-alert"
        )
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)

    async def close(self) -> None:
        """Posts still in flight at shutdown are cancelled (the forwarder closes next)."""
        for task in list(self.in_flight):
            task.cancel()
        for task in list(self.in_flight):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
