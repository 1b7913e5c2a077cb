"""The LLM parse stage: the dialect of the path reads the body into an `LLMRequest`; unknown
endpoints forward unrecorded; an unreadable body is a 400 in the dialect's shape. The tools the
agent's permissions deny are taken out of the body here (every lane and transport parses here)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from proxy import jsonparse
from proxy.classify.calls import LLMCall, Unknown, classify_http
from proxy.classify.duplicates import has_duplicate_keys
from proxy.classify.policy import fail_closed
from proxy.constants import EventType
from proxy.dialects import named
from proxy.dialects.base import LLMRequest
from proxy.dialects.contract import Dialect
from proxy.exchange import Answer, Exchange
from proxy.guards.permissions import permission
from proxy.llm import RESPONSE_RECORD_LIMIT, BodyCollector, LLMProtocol, fallback_request, parse, read_body
from proxy.llm_errors import bad_request
from proxy.pipeline import BaseStage
from proxy.sessions import Refused, Session

if TYPE_CHECKING:
    from proxy.services import Services

log = logging.getLogger("tripwire.llm")


class LLMParseStage(BaseStage):
    """Find the dialect from the path and parse the body; unknown endpoints forward unrecorded.

    A call of a known endpoint is never forwarded unjudged (SPEC §4.2): a body `json.loads` would
    refuse (or that is not a JSON object) is answered 400 here and recorded as an ERROR; one the
    dialect fails to read is judged as a call without history.
    """

    name = "parse_llm"

    def __init__(self, services: Services) -> None:
        self.services = services
        # one adapter per dialect: it holds nothing of a call (the dialect and the services only)
        self._protocols: dict[Dialect, LLMProtocol] = {}

    def protocol(self, dialect: Dialect) -> LLMProtocol:
        found = self._protocols.get(dialect)
        if found is None:
            found = self._protocols[dialect] = LLMProtocol(dialect, self.services)
        return found

    async def request(self, ex: Exchange) -> None:
        classified = ex.classified
        if classified is None:  # (an exchange made without the handler: a WebSocket message, a test)
            classified = ex.classified = classify_http(ex.route, ex.request.method, ex.body)
        if isinstance(classified, Unknown):
            self.refuse_unknown(ex, classified)
            return
        dialect = named(classified.dialect) if isinstance(classified, LLMCall) else None
        if dialect is None:
            return
        try:
            body, exact = read_body(ex.body)
        except ValueError as e:  # invalid UTF-8, an integer beyond the digit limit, not JSON
            self.refuse(ex, dialect, f"the request body is not valid JSON: {str(e)[:300]}")
            return
        if not isinstance(body, dict):
            self.refuse(ex, dialect, "the request body must be a JSON object")
            return
        unreadable = unreadable_tools(body)
        if unreadable is None and self.fails_closed(ex) and has_duplicate_keys(ex.body, body):
            unreadable = "a body naming a key twice in one object (an upstream may read either)"
        try:
            call: LLMRequest = parse(dialect, body)
        except Exception:
            log.exception("could not parse a %s request; judging it without its history", dialect.__name__)
            call = fallback_request(dialect, body)
            unreadable = unreadable or "its history"
        if unreadable is not None and self.fails_closed(ex):
            # a shape the dialect cannot read goes unjudged: refused while policy applies (issue 30)
            self.refuse(ex, dialect, f"Tripwire cannot read {unreadable} (refused while policy applies)")
            return
        ex.protocol = self._protocols.get(dialect) or self.protocol(dialect)
        ex.call = call
        ex.request_json = body  # the session stage reads the client's episode id in it
        rewritten = dialect.upstream_body(call, body)
        config = self.services.guards.config(ex.route.agent)
        if config.tools.restricts and not config.in_shadow:  # (shadow mode alters nothing)
            tools = config.tools
            # the model cannot call what it is not offered (SPEC §9)
            permitted = dialect.without_tools(
                rewritten if rewritten is not None else body, lambda name: permission(tools, name) != "deny"
            )
            rewritten = permitted if permitted is not None else rewritten
        if rewritten is not None:
            # orjson for what orjson read; the rest keeps NaN, big integers, surrogates, any depth
            ex.upstream_body = jsonparse.dumps(rewritten, finite=exact)
        ex.observer = dialect.StreamAccumulator(call) if call.stream else BodyCollector(RESPONSE_RECORD_LIMIT)

    def fails_closed(self, ex: Exchange) -> bool:
        settings = self.services.settings
        config = self.services.guards.config(ex.route.agent)
        return fail_closed(config, settings.auth.require_agent_key, settings.passthrough_unknown)

    def refuse_unknown(self, ex: Exchange, call: Unknown) -> None:
        """Fail closed (issue 30): what no dialect reads is refused when policy applies to the agent,
        404 in the shape of the protocol the client speaks; else relayed unrecorded."""
        if not self.fails_closed(ex):
            return
        text = (
            f"[tripwire] refused {call.what}; policy applies to this agent, so calls Tripwire cannot "
            "read are refused (set passthrough_unknown: true to relay them unjudged)"
        )
        anthropic = "anthropic-version" in ex.request.headers
        dialect = named("anthropic" if anthropic else "openai_chat")
        assert dialect is not None
        error = {**dialect.bad_request_error(text), "code": "unknown_endpoint"}
        ex.answer = Answer(
            404, dialect.error_body(404, error), "application/json", {"x-should-retry": "false"}
        )
        log.warning("refused a call of agent %s: %s", ex.route.agent, call.what)

    def refuse(self, ex: Exchange, dialect: Dialect, message: str) -> None:
        """Answer 400 and record an ERROR in the session's run, when the call names one."""
        text = f"[tripwire] {message}"
        ex.answer = bad_request(dialect, text)
        route = ex.route
        session: Session | None = None
        if route.session is not None:
            opened = self.services.policy.open(route.agent, route.session, wall=ex.started_wall)
            session = None if isinstance(opened, Refused) else opened
        else:  # the agent's automatic session, when there is exactly one to speak of
            live = [
                s
                for s in self.services.sessions.live()
                if s.agent == route.agent and not s.explicit and not s.terminated
            ]
            session = live[0] if len(live) == 1 else None
        if session is None or session.ended:
            log.warning(
                "refused an unreadable %s request of agent %s: %s", dialect.__name__, route.agent, message
            )
            return
        event_id = self.services.policy.write_event(
            session,
            EventType.ERROR,
            "invalid_request_body",
            {
                "error_type": "invalid_request_body",
                "message": text,
                "stack": None,
                "guardrail": None,
                "threshold": None,
                "actual": None,
                "http_status": 400,
                "endpoint": getattr(dialect, "DIALECT", None),
                "upstream": route.upstream,
            },
            ts=ex.started_wall,
        )
        self.services.policy.observe_event(session, EventType.ERROR, "invalid_request_body", event_id)


def unreadable_tools(body: dict) -> str | None:
    """A body's tool lists in a shape no dialect reads (an object, a string): the tool filter would
    pass them unread. None when they are lists (or absent)."""
    for key in ("tools", "functions"):
        value = body.get(key)
        if value is not None and not isinstance(value, list):
            return f"its {key!r} (a list is expected)"
    return None
