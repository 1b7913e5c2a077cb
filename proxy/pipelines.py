"""The pipelines, in the order their stages run: the one place the order is written.

`Pipeline.run` (proxy/pipeline.py) calls each stage's `request` in this order until one answers
(sets `ex.answer`), then every stage's `finish` in reverse. docs/architecture.md lists the same
stages (a test compares the two). The Responses WebSocket (proxy/websocket/) runs the LLM list
with its own parse and forward stages in their places.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.pipeline import Pipeline, Stage
from proxy.stages.breaker import BreakerStage
from proxy.stages.forward import ForwardStage
from proxy.stages.guards import GuardStage
from proxy.stages.hold import HoldStage
from proxy.stages.llm_parse import LLMParseStage
from proxy.stages.mcp_parse import mcp_parse_stage
from proxy.stages.pins import pin_stage
from proxy.stages.record import RecordStage
from proxy.stages.recovery import MaxTokensRecoveryStage
from proxy.stages.responses_chain import ResponsesChainStage
from proxy.stages.session import SessionStage
from proxy.stages.tool_results import ToolResultsStage

if TYPE_CHECKING:
    from proxy.services import Services


def llm_stages(services: Services) -> list[Stage]:
    return [
        LLMParseStage(services),  # the dialect reads the body; unreadable: a 400 in its shape
        SessionStage(services),  # the call's run (explicit session, episode, lineage)
        # previous_response_id: synthetic parents rewritten, history found (shared: links fetched/shared)
        ResponsesChainStage(services.guards),
        # TOOL_CALLs of the function-calling results the request brings (shared: in the guards' round trip)
        ToolResultsStage(services),
        # loop, limits, budgets (pure guards, state where services.guards keeps it); settles after the answer
        GuardStage(services),
        HoldStage(services),  # a call the guards ask a person about waits here (ask, SPEC §5.5a)
        BreakerStage(services),  # the circuit of agent x upstream
        MaxTokensRecoveryStage(services),  # opt-in: continues a chat answer cut at its token limit
        ForwardStage(services),  # the upstream call, streams relayed chunk by chunk
        RecordStage(services),  # LLM_CALL with call_seq and guard_input
    ]


def mcp_stages(services: Services) -> list[Stage]:
    return [
        mcp_parse_stage(services),  # JSON-RPC; tools/call matched to its result across streams
        SessionStage(services),
        pin_stage(services),  # a changed tool's call held for a person (docs/mcp.md "Changed tools")
        GuardStage(services),
        HoldStage(services),
        BreakerStage(services),
        ForwardStage(services),
        RecordStage(services),  # TOOL_CALL
    ]


def pipelines(services: Services) -> dict[str, Pipeline]:
    """One pipeline per call kind (Route.kind)."""
    return {"llm": Pipeline(llm_stages(services)), "mcp": Pipeline(mcp_stages(services))}
