"""The per-call pipeline of a Responses socket: the LLM pipeline's own stages (the same Responses chain
stage: its chains are shared with HTTP calls), with a parse stage that reads a `response.create` as a
streamed call and a forward stage that sends the admitted message on the upstream socket and waits
until its response settles. Max-tokens recovery forwards over HTTP: not on a socket.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from proxy import jsonparse, llm
from proxy.exchange import Exchange
from proxy.guards.permissions import permission
from proxy.pipeline import BaseStage, Pipeline
from proxy.stages.forward import TEXT_MARGIN, ForwardStage
from proxy.stages.llm_parse import LLMParseStage
from proxy.stages.recovery import MaxTokensRecoveryStage
from proxy.websocket.calls import SocketCall

if TYPE_CHECKING:
    from proxy.services import Services


class SocketParseStage(BaseStage):
    """The LLM parse stage, for a `response.create` message: a streamed Responses call."""

    name = "parse_llm"

    def __init__(self, inner: LLMParseStage) -> None:
        self.inner = inner

    async def request(self, ex: Exchange) -> None:
        await self.inner.request(ex)
        if isinstance(ex.protocol, llm.LLMProtocol) and ex.call is not None:
            # the events come as the SSE stream's: read them with the stream accumulator
            ex.call = replace(ex.call, stream=True)
            ex.observer = ex.protocol.dialect.StreamAccumulator(ex.call)
            self.filter_nested(ex, ex.protocol.dialect)

    def filter_nested(self, ex: Exchange, dialect: Any) -> None:
        """Tools under `response` (the Realtime API's shape of `response.create`) lose the denied
        ones as top-level tools do (issue 30): an upstream that reads them must not see them."""
        body = ex.request_json
        if body is None or not isinstance(body.get("response"), dict):
            return
        services = self.inner.services
        config = services.guards.config(ex.route.agent)
        if not config.tools.restricts or config.in_shadow:
            return
        tools = config.tools
        sent = jsonparse.loads(ex.upstream_body) if ex.upstream_body is not None else body
        kept = dialect.without_tools(sent["response"], lambda name: permission(tools, name) != "deny")
        if kept is not None:
            ex.upstream_body = jsonparse.dumps({**sent, "response": kept})

    async def finish(self, ex: Exchange) -> None:
        await self.inner.finish(ex)


class SocketForwardStage(BaseStage):
    """Send the admitted message on the upstream socket and wait until its response settles."""

    name = "forward"

    def __init__(self, services: Services) -> None:
        self.services = services

    async def request(self, ex: Exchange) -> None:
        call: SocketCall = ex.ws_call
        limit_text = getattr(ex.observer, "limit_text", None)
        if limit_text is not None:
            limit_text(self.services.settings.max_field_bytes + TEXT_MARGIN)  # as ForwardStage
        try:
            await call.forward()
        finally:
            if ex.forwarded and ex.protocol is not None:
                ex.protocol.after_forward(ex)


def socket_pipeline(http: Pipeline, services: Services) -> Pipeline:
    """The LLM pipeline's own stages (the same Responses chain stage: its chains are shared with
    HTTP calls), with the socket's parse and forward stages. Max-tokens recovery forwards over
    HTTP (and only chat completions): not on a socket."""
    stages: list[Any] = []
    for stage in http.stages:
        if isinstance(stage, LLMParseStage):
            stages.append(SocketParseStage(stage))
        elif isinstance(stage, ForwardStage):
            stages.append(SocketForwardStage(services))
        elif not isinstance(stage, MaxTokensRecoveryStage):
            stages.append(stage)
    return Pipeline(stages)
