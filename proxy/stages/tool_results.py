"""The tool results stage: function-calling results a request brings complete the tool calls an
earlier answer asked for; their TOOL_CALLs are written before the guards judge the request."""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.exchange import Exchange
from proxy.llm import LLMProtocol, record_tool_results
from proxy.pipeline import BaseStage

if TYPE_CHECKING:
    from proxy.services import Services


class ToolResultsStage(BaseStage):
    """Function-calling tools: the results a request brings complete calls an earlier answer asked
    for. They happened before this call, so their TOOL_CALLs are written before the guards judge it
    (a LOOP_WARNING / ERROR they cause follows them, as in AgentDbg), and the guards observe them."""

    name = "tool_results"
    fail_open = True  # a bug here must not drop the agent's call

    def __init__(self, services: Services) -> None:
        self.services = services
        # shared guard state takes the results in the guards' round trip (any replica asked for them)
        self.at_admit = services.guards.results_at_admit

    async def request(self, ex: Exchange) -> None:
        if self.at_admit:
            return
        session = ex.session
        # a result completes a call an earlier answer asked for: with none pending, nothing to do
        if (
            session is not None
            and session.conversation.has_pending_tool_calls
            and isinstance(ex.protocol, LLMProtocol)
        ):
            record_tool_results(ex, self.services)
