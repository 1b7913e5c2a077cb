"""The same reply to every "continue" (issue 31) is refused at the same request by three replicas
sharing one Redis as by one process: the run of replies rides in the shared state's LLM entry
(`proxy/state/entries.py`, `echo`), so whichever replica applies it decides alike."""

from __future__ import annotations

from typing import Any

from tests.conftest import Running, StartTripwire, serve_fake
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.test_state_replicas import client, settle_all, start_replicas

SAME = "I have reviewed the plan. Shall I continue with the next step?"


async def refused_at(replicas: list[Running], fake: FakeUpstream) -> int:
    """A model saying the same thing to every 'continue', the requests spread over the replicas."""
    fake.replies = [Reply(text=SAME) for _ in range(20)]
    clients = [client(r, session=f"echo-{len(replicas)}") for r in replicas]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "migrate the orders table"}]
    for i in range(20):
        raw = await clients[i % len(clients)].chat.completions.with_raw_response.create(
            model="gpt-4o", messages=messages
        )
        if raw.headers.get("X-Tripwire-Guard"):
            raw.parse()  # read the answer: the connection goes back to the pool
            return i + 1
        text = raw.parse().choices[0].message.content or ""
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "continue"}]
        if replicas[0].engine.shared is not None:
            await settle_all(replicas)
    raise AssertionError("the repeated reply was never refused")


async def test_a_repeated_reply_is_refused_at_the_same_request(
    start_tripwire: StartTripwire, redis_url: str
) -> None:
    async with serve_fake(Reply(text="done")) as (fake, url):
        alone = await start_tripwire(upstream={"url": url})
        one = await refused_at([alone], fake)
        replicas = await start_replicas(start_tripwire, url, redis_url)
        shared = await refused_at(replicas, fake)
    assert one == shared == 6  # the request holding the 5th identical reply (threshold 5)
