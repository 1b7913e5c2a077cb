"""What the pipeline's stages are given: the engine's services, without its lifecycle.

`Engine` (proxy/engine.py) builds each service once and bundles them here (`engine.services`);
a stage keeps the ones it uses. Nothing here starts, drains or closes anything: that stays the
engine's (proxy/lifecycle.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.alerts import Alerts
from proxy.approvals.service import Approvals
from proxy.forward import Forwarder
from proxy.guard_backend import GuardBackend
from proxy.guards.breaker import BreakerRegistry
from proxy.mcp.hub import McpHub
from proxy.metrics import Metrics
from proxy.pins.service import Pins
from proxy.pricing import Pricing
from proxy.recorder import TraceRecorder
from proxy.session_policy import SessionPolicy
from proxy.sessions import SessionManager
from proxy.settings import Settings
from proxy.upstreams import UpstreamRegistry


@dataclass(frozen=True, slots=True)
class Services:
    settings: Settings
    sessions: SessionManager  # agent/session -> run (opened and ended through `policy`)
    policy: SessionPolicy  # open, end, terminate; a session's events written and observed
    guards: GuardBackend  # where guard state lives: this process, or shared by replicas
    recorder: TraceRecorder
    metrics: Metrics
    alerts: Alerts
    breakers: BreakerRegistry  # this process's circuits
    upstreams: UpstreamRegistry
    forwarder: Forwarder
    mcp: McpHub
    pricing: Pricing
    approvals: Approvals  # calls held for a person's decision (SPEC §5.5a)
    pins: Pins  # MCP servers' pinned tool definitions (docs/mcp.md "Changed tools")
