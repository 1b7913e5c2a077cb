"""Guard configuration: the LangSight prevention-config shape (SPEC §5.4), validated by pydantic.

These models are the boundary for the CLI, YAML files and the admin API alike, so a bad value is
refused with a message naming the field wherever it comes from. They are frozen: a session reads
one config object for a whole call and never sees it change half-way.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

LoopAction = Literal["warn", "block", "terminate"]
PerToolMode = Literal["progress", "count"]


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


class CircuitBreakerConfig(_Section):
    enabled: bool = True
    open_after_failures: PositiveInt = 5
    cooldown_seconds: PositiveFloat = 30
    half_open_max_calls: PositiveInt = 3


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

    def dump(self) -> dict[str, object]:
        """JSON for persistence, keeping an omitted `shadow` omitted (it stays inherited)."""
        return self.model_dump(mode="json", exclude=None if "shadow" in self.model_fields_set else {"shadow"})

    loop_detection: LoopDetectionConfig = LoopDetectionConfig()
    budget: BudgetConfig = BudgetConfig()
    limits: LimitsConfig = LimitsConfig()
    circuit_breaker: CircuitBreakerConfig = CircuitBreakerConfig()
