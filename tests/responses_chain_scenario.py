"""One Responses agent scenario, played through one Tripwire or several replicas: an agent chaining
with previous_response_id that asks for the same tool call again and again, gets blocked (a
`resp_tripwire_` answer) and then continues the blocked answer. The assertions are the contract
(SPEC §5.5): the 4th request is blocked and never sent upstream, and the continuation goes to the
real parent with the blocked input and the block's text."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import openai

from tests.fakes import FakeUpstream, Reply

GUARDS = {"loop_detection": {"action": "block", "threshold": 3, "max_repeated_tool_steps": 10}}
Clients = Callable[[], openai.AsyncOpenAI]  # the client for the next request (one, or round robin)


def script(fake: FakeUpstream) -> None:
    fake.replies = [Reply(tool_calls=[(f"call_{i}", "get_weather", {"city": "Paris"})]) for i in range(3)] + [
        Reply(text="Paris is sunny")
    ]


def creator(next_client: Clients, stream: bool) -> Callable[..., Awaitable[Any]]:
    async def create(**kw: Any) -> Any:
        client = next_client()
        if not stream:
            return await client.responses.create(model="gpt-4o", **kw)
        async with client.responses.stream(model="gpt-4o", **kw) as s:
            return await s.get_final_response()

    return create


async def play_block_and_continuation(fake: FakeUpstream, next_client: Clients, stream: bool) -> None:
    create = creator(next_client, stream)
    response = await create(input="weather in Paris?")
    ids = [response.id]
    for _ in range(3):
        (call,) = [item for item in response.output if item.type == "function_call"]
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        response = await create(previous_response_id=response.id, input=[output])
        ids.append(response.id)
        if response.id.startswith("resp_tripwire_"):
            break
    # the 4th request holds the 3rd identical call in its chain: blocked, never sent upstream
    assert len(fake.calls("/v1/responses")) == 3
    assert response.status == "completed"
    assert response.output_text.startswith("[tripwire] blocked:")

    final = await create(previous_response_id=response.id, input="fine, just summarise")
    assert final.output_text == "Paris is sunny"
    sent = fake.calls("/v1/responses")[-1].body
    assert sent["previous_response_id"] == ids[2]  # the real parent, which the upstream knows
    assert sent["input"][0] == output  # the tool output the parent is waiting for
    assert sent["input"][1]["role"] == "assistant"
    assert sent["input"][1]["content"].startswith("[tripwire] blocked:")
    assert sent["input"][2] == {"role": "user", "content": "fine, just summarise"}
