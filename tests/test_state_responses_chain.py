"""Responses API chains across replicas (issue 13): an agent chaining with previous_response_id whose
calls land on different replicas (round robin) is judged on the chain's whole history, as in one
process (the same scenario as tests/test_guards_e2e_llm.py), and a blocked (synthetic) answer
continued through another replica goes to the real parent."""

from __future__ import annotations

import itertools

import openai
import pytest

from tests.conftest import AGENT_KEY, StartTripwire
from tests.fakes import FakeUpstream
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.responses_chain_scenario import GUARDS, play_block_and_continuation, script

SESSION = {"X-Tripwire-Agent": "researcher", "X-Tripwire-Session": "chain-1"}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_chain_spread_over_replicas_is_judged_whole_and_continues_a_block(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str, stream: bool
) -> None:
    fake, url = fake_upstream
    script(fake)
    replicas = [
        await start_tripwire(upstream={"url": url}, guards=GUARDS, state={"url": redis_url}) for _ in range(3)
    ]
    clients = itertools.cycle(
        [
            openai.AsyncOpenAI(base_url=r.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
            for r in replicas
        ]
    )
    await play_block_and_continuation(fake, lambda: next(clients), stream)
