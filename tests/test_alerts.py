"""`Alerts` alone, posting through the real Forwarder to a webhook receiver on 127.0.0.1: one JSON
body per firing guard, nothing for ALLOW or without a webhook, and a dead webhook never raises."""

from __future__ import annotations

import asyncio

from proxy.alerts import Alerts
from proxy.forward import Forwarder
from proxy.guards.decision import Action, Decision
from proxy.sessions import Session
from tests.factories import EngineFactory, make_session
from tests.fakes import webhook_receiver


async def settled(alerts: Alerts) -> None:
    """Every post in flight done (each waits for the receiver's answer), bounded generously."""
    async with asyncio.timeout(60):
        await asyncio.gather(*alerts.in_flight)


async def test_a_firing_guard_posts_one_alert(engine_factory: EngineFactory) -> None:
    engine = await engine_factory()
    session: Session = make_session(engine, "bot", "s1")
    forwarder = Forwarder(connect_timeout_s=5, ttfb_timeout_s=5)
    await forwarder.start()
    try:
        async with webhook_receiver() as webhook:
            got = webhook.got
            alerts = Alerts(webhook.url, forwarder)
            alerts.send(session, Decision(Action.ALLOW, "loop_detection", "fine"))
            alerts.send(session, Decision(Action.BLOCK, "loop_detection", "a loop", threshold=3, actual=4))
            await settled(alerts)
            assert len(got) == 1
            assert got[0] == {
                "source": "tripwire",
                "agent": "bot",
                "session_id": "s1",
                "run_id": session.run_id,
                "guardrail": "loop_detection",
                "action": "block",
                "kind": None,
                "message": "a loop",
                "threshold": 3,
                "actual": 4,
            }
            await alerts.close()
    finally:
        await forwarder.close()


async def test_no_webhook_no_post_and_a_dead_one_does_not_raise(engine_factory: EngineFactory) -> None:
    engine = await engine_factory()
    session = make_session(engine, "bot", "s1")
    forwarder = Forwarder(connect_timeout_s=1, ttfb_timeout_s=1)
    await forwarder.start()
    try:
        Alerts(None, forwarder).send(session, Decision(Action.TERMINATE, "max_llm_calls", "limit"))
        dead = Alerts("http://127.0.0.1:9/hook", forwarder)  # discard port: nothing listens
        dead.send(session, Decision(Action.TERMINATE, "max_llm_calls", "limit"))
        assert len(dead.in_flight) == 1
        await settled(dead)  # the failure is logged, not raised
    finally:
        await forwarder.close()
