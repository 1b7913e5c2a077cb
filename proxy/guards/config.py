"""Guard configuration: the LangSight prevention-config shape (SPEC §5.4), validated by pydantic.

These models are the boundary for the CLI, YAML files and the admin API alike, so a bad value is
refused with a message naming the field wherever it comes from. They are frozen: a session reads
one config object for a whole call and never sees it change half-way.
"""

from __future__ import annotations

import re
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

# `ask` holds the call for a person (SPEC §5.5a)
LoopAction = Literal["warn", "block", "terminate", "ask"]
PerToolMode = Literal["progress", "count"]
# what a budget or limit does to the call that would cross it: refuse it (§5.5), or ask a person
OnLimit = Literal["refuse", "ask"]
# what applies when nobody decides a held call within `ask_timeout_s`
AskFallback = Literal["block", "terminate"]
Period = Literal["day", "week", "month"]
# a changed or added MCP tool definition (proxy/pins/, docs/mcp.md "Changed tools")
PinAction = Literal["ask", "block", "warn", "off"]
MarkerAction = Literal["warn", "block", "off"]
# the two rate-limit scopes that are not tool patterns (SPEC §9)
RATE_SCOPES = ("llm", "tools")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoopDetectionConfig(_Section):
    enabled: bool = True
    threshold: int = Field(5, ge=2)
    action: LoopAction = "warn"
    max_steps: PositiveInt | None = None
    # AgentDbg cycle detection (name-only, over events): opt-in, `stop_on_loop` turns it on
    window: int = Field(12, ge=2)
    repetitions: int = Field(3, ge=2)
    agentdbg_cycle: bool = False
    stop_on_loop: bool = False
    stop_on_loop_min_repetitions: int = Field(3, ge=2)
    # Loop Guard no-progress polls and per-tool escalation
    no_progress_warn: PositiveInt = 4
    no_progress_halt: PositiveInt = 8
    # progress: a tool's calls without progress in the turn; count: every call (Loop Guard exactly)
    per_tool_mode: PerToolMode = "progress"
    idempotent: tuple[PositiveInt, PositiveInt, PositiveInt] = (5, 8, 12)
    mutating: tuple[PositiveInt, PositiveInt, PositiveInt] = (3, 5, 7)
    idempotent_tools: tuple[str, ...] = ()
    mutating_tools: tuple[str, ...] = ()
    # opt-in (SPEC §5.2): Loop Guard's 120 s stops honest agent-CLI turns, which routinely run longer
    max_time_per_turn: PositiveFloat | None = None
    turn_gap_s: PositiveFloat = 30
    # an agent loop that repeats its whole step: identical tool-call sets in consecutive LLM steps
    max_repeated_tool_steps: PositiveInt = 3

    @model_validator(mode="after")
    def _ordered(self) -> LoopDetectionConfig:
        for name in ("idempotent", "mutating"):
            warn, block, halt = getattr(self, name)
            if not warn <= block <= halt:
                raise ValueError(
                    f"{name}: thresholds must be warn <= block <= halt, got {[warn, block, halt]}"
                )
        if self.stop_on_loop and not self.agentdbg_cycle:
            # stop_on_loop ends a run on AgentDbg's cycle, so it implies that detector
            object.__setattr__(self, "agentdbg_cycle", True)
        if self.no_progress_warn > self.no_progress_halt:
            raise ValueError("no_progress_warn must not exceed no_progress_halt")
        return self


class BudgetConfig(_Section):
    max_cost_usd: PositiveFloat | None = None
    soft_alert_threshold_usd: PositiveFloat | None = None
    max_wall_time_seconds: PositiveFloat | None = None
    max_tokens: PositiveInt | None = None
    on_limit: OnLimit = "refuse"

    @model_validator(mode="after")
    def _soft_below_max(self) -> BudgetConfig:
        if (
            self.soft_alert_threshold_usd is not None
            and self.max_cost_usd is not None
            and self.soft_alert_threshold_usd >= self.max_cost_usd
        ):
            raise ValueError("soft_alert_threshold_usd must be less than max_cost_usd")
        return self


class LimitsConfig(_Section):
    max_llm_calls: PositiveInt | None = None
    max_tool_calls: PositiveInt | None = None
    max_events: PositiveInt | None = None
    max_duration_s: PositiveFloat | None = None
    on_limit: OnLimit = "refuse"


class CircuitBreakerConfig(_Section):
    enabled: bool = True
    open_after_failures: PositiveInt = 5
    cooldown_seconds: PositiveFloat = 30
    half_open_max_calls: PositiveInt = 3


def _check_pattern(pattern: str) -> str:
    """A tool glob (fnmatch: `*`, `?`, `[...]`) over `SERVER__TOOL` or a function tool's name."""
    if not pattern or pattern != pattern.strip():
        raise ValueError(f"tool pattern {pattern!r} must be a non-empty glob without surrounding spaces")
    if pattern.count("[") != pattern.count("]"):
        raise ValueError(f"tool pattern {pattern!r} has an unclosed [ ] set")
    return pattern


class ToolsConfig(_Section):
    """Tool permissions (SPEC §9): deny beats ask beats allow; with `allow` given, the rest is denied."""

    allow: tuple[str, ...] | None = None
    ask: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    @field_validator("allow", "ask", "deny")
    @classmethod
    def _patterns(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None:
            for pattern in value:
                _check_pattern(pattern)
        return value

    @property
    def restricts(self) -> bool:
        """False for the default (everything allowed): callers skip matching altogether."""
        return self.allow is not None or bool(self.ask) or bool(self.deny)


class RateLimitConfig(_Section):
    """At most `max_calls` calls matching `match` in any `per_s` seconds, per agent (SPEC §9)."""

    match: str  # "llm", "tools" or a tool pattern
    max_calls: PositiveInt
    per_s: PositiveFloat

    @field_validator("match")
    @classmethod
    def _match(cls, value: str) -> str:
        return value if value in RATE_SCOPES else _check_pattern(value)


class BudgetWindowConfig(_Section):
    """A calendar period's budget of one agent across all its sessions (SPEC §9)."""

    period: Period
    max_cost_usd: PositiveFloat | None = None
    max_tokens: PositiveInt | None = None
    soft_alert_pct: float | None = Field(None, gt=0, lt=100)

    @model_validator(mode="after")
    def _has_limit(self) -> BudgetWindowConfig:
        if self.max_cost_usd is None and self.max_tokens is None:
            raise ValueError(f"budget window {self.period!r} needs max_cost_usd or max_tokens")
        return self


class ToolPinsConfig(_Section):
    """What an agent's MCP lists and calls do about tool definitions that changed since they were
    pinned, tools added later, and hidden-instruction markers (docs/mcp.md "Changed tools")."""

    tool_changes: PinAction = "ask"
    tool_added: PinAction = "warn"
    hidden_instructions: MarkerAction = "warn"


class ServerPinsConfig(_Section):
    """One MCP server's own actions (`mcp: {NAME: {url: ..., tool_pins: {...}}}`): a key given
    here wins over the agent's for that server's tools."""

    tool_changes: PinAction | None = None
    tool_added: PinAction | None = None
    hidden_instructions: MarkerAction | None = None


_TZ_NAME = re.compile(r"^[A-Za-z0-9_+\-/]+$")


class GuardConfig(_Section):
    """One prevention config: the project default or one agent's whole override."""

    # evaluate and record every guard, refuse nothing (SPEC §5.7); an agent override that omits it
    # (not in `model_fields_set`) inherits the project default's value (`GuardConfigStore`)
    shadow: bool = False

    @property
    def in_shadow(self) -> bool:
        return self.shadow

    def inheriting_shadow(self, project: GuardConfig) -> GuardConfig:
        """This agent override as in force under `project`: `shadow` from the project when omitted."""
        if "shadow" in self.model_fields_set or self.shadow == project.shadow:
            return self
        return self.model_copy(update={"shadow": project.shadow})

    def recorded(self) -> dict[str, object]:
        """The config as a call's event keeps it for replay: `max_concurrent_calls` unset is left out
        (the default when read back), so traces of configs without it stay byte for byte as before."""
        exclude = {"max_concurrent_calls"} if self.max_concurrent_calls is None else None
        return self.model_dump(mode="json", exclude=exclude)

    def dump(self) -> dict[str, object]:
        """JSON for persistence, keeping an omitted `shadow` omitted (it stays inherited)."""
        return self.model_dump(mode="json", exclude=None if "shadow" in self.model_fields_set else {"shadow"})

    loop_detection: LoopDetectionConfig = LoopDetectionConfig()
    budget: BudgetConfig = BudgetConfig()
    limits: LimitsConfig = LimitsConfig()
    circuit_breaker: CircuitBreakerConfig = CircuitBreakerConfig()
    # gateway policy (SPEC §9) and asking a person (§5.5a)
    tools: ToolsConfig = ToolsConfig()
    rate_limits: tuple[RateLimitConfig, ...] = ()
    # calls of the agent in flight at once, across its sessions (and replicas): over it, retryable
    max_concurrent_calls: PositiveInt | None = None
    budget_windows: tuple[BudgetWindowConfig, ...] = ()
    budget_timezone: str = "UTC"
    ask_timeout_s: PositiveFloat = 120
    ask_fallback: AskFallback = "block"
    tool_pins: ToolPinsConfig = ToolPinsConfig()

    @field_validator("budget_timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        try:
            if not _TZ_NAME.match(value):
                raise ValueError
            ZoneInfo(value)
        except (ValueError, ZoneInfoNotFoundError):
            raise ValueError(
                f"unknown timezone {value!r} (an IANA name such as UTC or Europe/Paris)"
            ) from None
        return value

    @field_validator("budget_windows")
    @classmethod
    def _one_window_per_period(cls, value: tuple[BudgetWindowConfig, ...]) -> tuple[BudgetWindowConfig, ...]:
        periods = [w.period for w in value]
        if len(periods) != len(set(periods)):
            raise ValueError(f"budget_windows: one window per period, got {periods}")
        return value
