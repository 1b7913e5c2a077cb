"""The pipelines, in the order their stages run: the one place the order is written.

`Pipeline.run` (proxy/pipeline.py) calls each stage's `request` in this order until one answers
(sets `ex.answer`), then every stage's `finish` in reverse. docs/architecture.md lists the same
stages (a test compares the two). The Responses WebSocket (proxy/websocket/) runs the LLM list
with its own parse and forward stages in their places.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.breaker_stage import BreakerStage
from proxy.guard_stage import GuardStage
from proxy.llm import LLMParseStage, ToolResultsStage
from proxy.mcp_stages import mcp_parse_stage
from proxy.pipeline import Pipeline, Stage
from proxy.recovery import MaxTokensRecoveryStage
from proxy.responses_stage import ResponsesChainStage
from proxy.shared_stages import (
    SharedBreakerStage,
    SharedGuardStage,
    SharedResponsesChainStage,
    SharedToolResultsStage,
)
from proxy.stages import ForwardStage, RecordStage, SessionStage

if TYPE_CHECKING:
    from proxy.engine import Engine


def llm_stages(engine: Engine) -> list[Stage]:
    shared = engine.shared is not None  # guard state shared by replicas (--state, docs/scaling.md)
    return [
        LLMParseStage(engine),  # the dialect reads the body; unreadable: a 400 in its shape
        SessionStage(engine),  # the call's run (explicit session, episode, lineage)
        # previous_response_id: synthetic parents rewritten, history found (shared: links fetched/shared)
        SharedResponsesChainStage(engine) if shared else ResponsesChainStage(),
        # TOOL_CALLs of the function-calling results the request brings (shared: in the guards' round trip)
        (SharedToolResultsStage if shared else ToolResultsStage)(engine),
        # loop, limits, budgets (pure guards); settles after the answer
        (SharedGuardStage if shared else GuardStage)(engine),
        (SharedBreakerStage if shared else BreakerStage)(engine),  # the circuit of agent x upstream
        MaxTokensRecoveryStage(engine),  # opt-in: continues a chat answer cut at its token limit
        ForwardStage(engine),  # the upstream call, streams relayed chunk by chunk
        RecordStage(engine),  # LLM_CALL with call_seq and guard_input
    ]


def mcp_stages(engine: Engine) -> list[Stage]:
    shared = engine.shared is not None
    return [
        mcp_parse_stage(engine),  # JSON-RPC; tools/call matched to its result across streams
        SessionStage(engine),
        (SharedGuardStage if shared else GuardStage)(engine),
        (SharedBreakerStage if shared else BreakerStage)(engine),
        ForwardStage(engine),
        RecordStage(engine),  # TOOL_CALL
    ]


def pipelines(engine: Engine) -> dict[str, Pipeline]:
    """One pipeline per call kind (Route.kind)."""
    return {"llm": Pipeline(llm_stages(engine)), "mcp": Pipeline(mcp_stages(engine))}
