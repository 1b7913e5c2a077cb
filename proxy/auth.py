"""The agent-key check of the proxy listener (SPEC §9, docs/gateway.md).

With `auth.require_agent_key`, every call presents an agent key where its protocol carries one:
`Authorization: Bearer`, Anthropic's `x-api-key`, Azure's `api-key` (the MCP bearer token and the
WebSocket handshake's `Authorization` are the first). No other header, and never the query string.
The key names the agent: the call's route gets the key's agent, and a call whose `X-Tripwire-Agent`
header or `/agents/NAME/` path names another agent is refused (403). A missing, unknown, expired or
revoked key is a 401, in the protocol's own shape: the OpenAI error JSON (`invalid_api_key`),
Anthropic's `authentication_error`, or for MCP an HTTP 401 with `WWW-Authenticate: Bearer` as MCP's
authorization spec asks. A refused call is not forwarded and not recorded; the key itself never
reaches a log, a trace or a metric (only its check's outcome is counted).

The check is one SHA-256 of the presented key and one lookup by it (a dict in memory with the data
dir's store, one Redis HGET with shared state).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

import orjson

from proxy.agent_keys import KEY_PREFIX, AgentKey, KeyStore, key_hash
from proxy.dialects import dialect_for
from proxy.dialects.base import openai_error_body
from proxy.exchange import Answer
from proxy.metrics import Metrics
from proxy.routing import AGENT_HEADER, Route

log = logging.getLogger("tripwire.auth")

KEY_HEADERS = ("authorization", "x-api-key", "api-key")
ROUTES_KEPT = 4096


@dataclass(frozen=True)
class AuthRefusal:
    status: int  # 401: no valid key; 403: the key's agent is not the one the call names
    message: str
    code: str  # OpenAI-style error code
    reason: (
        str  # for the metric and the log: missing | unknown | expired | revoked | other_agent | unavailable
    )


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The agent key the call carries in one of the protocols' key headers, if any."""
    for name in KEY_HEADERS:
        value = headers.get(name)
        if not value:
            continue
        value = value.strip()
        if name == "authorization":
            scheme, _, value = value.partition(" ")
            if scheme.lower() != "bearer":
                continue
            value = value.strip()
        if value.startswith(KEY_PREFIX):
            return value
    return None


def _missing_message(headers: Mapping[str, str]) -> str:
    """Why a call without an agent key is refused, saying whether any key arrived: a client that
    reads its key from another variable than the one set sends none (Codex reads `CODEX_API_KEY` or
    its `codex login --with-api-key` key, never `OPENAI_API_KEY`), and then shows only this text."""
    if any(headers.get(name) for name in KEY_HEADERS):
        return f"an agent key is required: the key this call carries is not one ({KEY_PREFIX}...)"
    return (
        "an agent key is required: no key arrived (no Authorization, x-api-key or api-key header); "
        "Codex sends CODEX_API_KEY or the key of `codex login --with-api-key`, not OPENAI_API_KEY"
    )


def names_another(raw_path: str, headers: Mapping[str, str], agent: str) -> bool:
    """Whether the call names an agent other than `agent` (SPEC §3's `X-Tripwire-Agent` header or
    `/agents/NAME/` path prefix; either one naming another is enough, whichever routing would use)."""
    header = headers.get(AGENT_HEADER)
    if header and header != agent:
        return True
    if raw_path.startswith("/agents/"):
        name = unquote(raw_path[len("/agents/") :].split("/", 1)[0].split("?", 1)[0])
        return bool(name) and name != agent
    return False


class AgentKeyGate:
    """Decides whether a call may go on, and as which agent."""

    def __init__(self, store: KeyStore, metrics: Metrics | None = None) -> None:
        self.store = store
        self.metrics = metrics
        self._as_agent: dict[tuple[Route, str], Route] = {}  # a route given the key's agent, kept

    async def valid_key(self, headers: Mapping[str, str], now: float | None = None) -> AgentKey | AuthRefusal:
        """The usable key the call presents, or why not."""
        secret = presented_key(headers)
        if secret is None:
            return AuthRefusal(401, _missing_message(headers), "invalid_api_key", "missing")
        try:
            record = await self.store.find(key_hash(secret))
        except Exception as e:  # the shared store unreachable: authentication never fails open
            log.warning("agent key store unavailable (%s): call refused", type(e).__name__)
            return AuthRefusal(
                503, "the agent key store is unavailable; retry shortly", "state_unavailable", "unavailable"
            )
        if record is None:
            return AuthRefusal(401, "invalid agent key", "invalid_api_key", "unknown")
        if record.revoked is not None:
            return AuthRefusal(401, "this agent key was revoked", "invalid_api_key", "revoked")
        if not record.usable_at(time.time() if now is None else now):
            return AuthRefusal(401, "this agent key has expired", "invalid_api_key", "expired")
        return record

    async def check_unrouted(self, headers: Mapping[str, str]) -> AuthRefusal | None:
        """A call to no route (a 404 to come): refused first without a valid key, so the 404's list of
        configured upstreams is for key holders only."""
        record = await self.valid_key(headers)
        if not isinstance(record, AuthRefusal):
            return None
        log.info("call to no route refused: %s (%d)", record.reason, record.status)
        if self.metrics is not None:
            self.metrics.observe_auth_refusal(record.reason)
        return record

    async def check(
        self, route: Route, raw_path: str, headers: Mapping[str, str], now: float | None = None
    ) -> Route | AuthRefusal:
        record = await self.valid_key(headers, now)
        if isinstance(record, AuthRefusal):
            return self._refused(route, record)
        if names_another(raw_path, headers, record.agent):
            refusal = AuthRefusal(
                403,
                "this agent key belongs to another agent than the one the call names",
                "agent_mismatch",
                "other_agent",
            )
            return self._refused(route, refusal)
        if route.agent == record.agent:
            return route
        key = (route, record.agent)
        found = self._as_agent.get(key)
        if found is None:
            if len(self._as_agent) >= ROUTES_KEPT:
                self._as_agent.clear()
            found = self._as_agent[key] = dataclasses.replace(route, agent=record.agent)
        return found

    def _refused(self, route: Route, refusal: AuthRefusal) -> AuthRefusal:
        log.info("call to %s %s refused: %s (%d)", route.kind, route.upstream, refusal.reason, refusal.status)
        if self.metrics is not None:
            self.metrics.observe_auth_refusal(refusal.reason)
        return refusal


def refusal_answer(route: Route, method: str, refusal: AuthRefusal) -> Answer:
    """The refusal in the protocol's own shape."""
    headers: dict[str, str] = {}
    if refusal.status == 503:
        headers["Retry-After"] = "5"
    if route.kind in ("mcp", "aggregate"):
        # MCP's authorization spec: 401 with WWW-Authenticate (RFC 6750); 403 is insufficient_scope
        error = {401: "invalid_token", 403: "insufficient_scope"}.get(
            refusal.status, "temporarily_unavailable"
        )
        if refusal.status in (401, 403):
            headers["WWW-Authenticate"] = f'Bearer error="{error}", error_description="{refusal.message}"'
        body = orjson.dumps({"error": error, "error_description": refusal.message})
        return Answer(refusal.status, body, "application/json", headers)
    kind = "invalid_request_error" if refusal.status == 401 else "tripwire_auth"
    body_error = {"message": refusal.message, "type": kind, "param": None, "code": refusal.code}
    headers["x-should-retry"] = "false" if refusal.status != 503 else "true"
    dialect = dialect_for(route.path, method if method != "GET" else "POST")
    if dialect is not None:
        body = dialect.error_body(refusal.status, body_error)
    else:
        body = openai_error_body(refusal.status, body_error)
    return Answer(refusal.status, body, "application/json", headers)
