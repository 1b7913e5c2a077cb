"""The Responses chain stage: what a `previous_response_id` stands for, before the guards judge it.

Before forwarding, a request continuing a blocked (synthetic) answer is rewritten to continue the
real parent (SPEC §5.5: the upstream never sees a `resp_tripwire_*` id), and the chain's whole
history is put on the exchange for the guards (proxy/responses_chain.py keeps the chains). After
the answer, the chain goes on from the response: a real one, or the guards' blocked answer.
Runs for Responses calls only; everything else passes untouched.
"""

from __future__ import annotations

import orjson

from proxy.dialects import of_call
from proxy.dialects.base import LLMRequest
from proxy.exchange import Exchange
from proxy.guard_backend import GuardBackend
from proxy.guard_events import is_tool_call
from proxy.pipeline import BaseStage
from proxy.responses_chain import Link, ResponsesChains, synthetic_id_of, turn_link


def is_responses(ex: Exchange) -> bool:
    """A call of a dialect whose answers a later request continues (`previous_response_id`)."""
    dialect = of_call(ex.call)
    return dialect is not None and dialect.CHAINS_RESPONSES and not is_tool_call(ex)


class ResponsesChainStage(BaseStage):
    name = "responses_chain"
    fail_open = True  # a chain we cannot follow leaves the request as the client sent it

    def __init__(self, guards: GuardBackend, chains: ResponsesChains | None = None) -> None:
        # shared guard state: a chain another replica answered is fetched, each answer's link shared
        self.guards = guards
        self.chains = chains if chains is not None else ResponsesChains()

    async def request(self, ex: Exchange) -> None:
        if ex.protocol is None or ex.session is None or not is_responses(ex):
            return
        agent = ex.session.agent
        await self.guards.fetch_chain(self.chains, agent, ex.call.previous_response_id)
        self.rewrite_synthetic_parent(ex, agent)  # first: the upstream must never see a synthetic id
        ex.history = self.chains.history(agent, ex.call)

    def rewrite_synthetic_parent(self, ex: Exchange, agent: str) -> None:
        try:
            body = orjson.loads(ex.upstream_body if ex.upstream_body is not None else ex.body)
        except orjson.JSONDecodeError:
            return
        rewritten = self.chains.rewrite(agent, body)
        if rewritten is not None:
            ex.upstream_body = orjson.dumps(rewritten)
        ex.responses_body = rewritten if rewritten is not None else body

    async def finish(self, ex: Exchange) -> None:
        response_id = self.continue_chain(ex)
        if response_id is not None and ex.session is not None:
            await self.guards.share_chain(self.chains, ex.session.agent, response_id)

    def continue_chain(self, ex: Exchange) -> str | None:
        """Remember the answer's link; returns the response id the chain now goes on from."""
        if ex.protocol is None or ex.session is None or not is_responses(ex):
            return None
        agent = ex.session.agent
        if ex.forwarded:
            result = ex.result
            if result is not None and result.response_id and not result.error:
                self.chains.remember_answer(agent, ex.call, result.response_id, result.tool_calls)
                return str(result.response_id)
            return None
        if ex.answer is not None and ex.block_text is not None:
            synthetic = synthetic_id_of(ex.answer.body)
            if synthetic is not None:  # a request continuing the blocked answer goes to the real parent
                self.chains.remember_block(agent, ex.call, synthetic, ex.responses_body or {}, ex.block_text)
                return synthetic
        return None

    def link_warmup(self, agent: str, call: LLMRequest, response_id: str) -> None:
        """A warm-up (generate: false) answered: the chain goes on from it, with its input and no
        answer step, so a later call naming it is judged on the whole history."""
        parent = self.chains.get(agent, call.previous_response_id)
        self.chains.remember(
            agent,
            response_id,
            Link(
                parent=parent,
                steps=list(call.steps),
                results=list(call.tool_results),
                parent_id=call.previous_response_id,
                **turn_link(call, parent),
            ),
        )
