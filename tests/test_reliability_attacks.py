"""Attacks on the proxy listener (issue 11): slow or broken clients cannot hold it, trick it into
reaching outside an upstream's base path, or fill its log. Each case checks what the attacker gets
and that the proxy still serves an honest call afterwards. Raw sockets on 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import openai
import orjson
import pytest

from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream
from tests.responses_chain_scenario import GUARDS, script

CHAT = "/v1/chat/completions"


def host_port(tw: Running) -> tuple[str, int]:
    url = tw.proxy.make_url("")
    assert url.host is not None and url.port is not None
    return url.host, url.port


async def honest_call(tw: Running) -> str:
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, max_retries=0)
    answer = await client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
    )
    return answer.choices[0].message.content or ""


async def read_until_closed(reader: asyncio.StreamReader, bound: float = 30.0) -> bytes:
    """Everything the server sends until it closes (generous bound: a busy machine is slow)."""
    data = b""
    async with asyncio.timeout(bound):
        try:
            while chunk := await reader.read(65536):
                data += chunk
        except ConnectionError:
            pass  # closed on us (a write of ours hit the closed socket first)
    return data


async def test_a_client_that_never_finishes_its_headers_is_disconnected(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, header_timeout_s=0.5)
    reader, writer = await asyncio.open_connection(*host_port(tw))
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    await writer.drain()
    for _ in range(5):  # keep trickling header bytes, as slowloris does
        await asyncio.sleep(0.2)
        try:
            writer.write(b"a")
            await writer.drain()
        except ConnectionError:
            break  # the server has closed it
    assert await read_until_closed(reader) == b""  # closed without an answer
    writer.close()
    assert await honest_call(tw) == "Hello from the fake upstream"


async def test_a_body_that_stalls_gets_a_408_and_never_reaches_the_upstream(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, body_idle_timeout_s=0.5)
    reader, writer = await asyncio.open_connection(*host_port(tw))
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 1000\r\n\r\n{"model": '
    )
    await writer.drain()
    answer = await read_until_closed(reader)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"body_timeout" in answer
    assert fake.calls(CHAT) == []
    assert await honest_call(tw) == "Hello from the fake upstream"


async def test_a_client_hanging_up_mid_body_logs_no_traceback(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], caplog: pytest.LogCaptureFixture
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    with caplog.at_level(logging.DEBUG):
        for _ in range(20):
            _, writer = await asyncio.open_connection(*host_port(tw))
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + b"x" * 100
            )
            await writer.drain()
            writer.close()
            await writer.wait_closed()
        assert await honest_call(tw) == "Hello from the fake upstream"
        await tw.flush()
    errors = [
        r
        for r in caplog.records
        if r.name.startswith(("aiohttp", "tripwire")) and (r.levelno >= logging.ERROR or r.exc_info)
    ]
    assert errors == [], [r.getMessage() for r in errors]
    assert len(fake.calls(CHAT)) == 1


@pytest.mark.parametrize(
    "path", ["/v1/%2e%2e/admin/keys", "/v1/..%2F..%2Fadmin", "/v1/./models", "/v1/.%2E/x"]
)
async def test_dot_segments_never_reach_the_upstream(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], path: str
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    reader, writer = await asyncio.open_connection(*host_port(tw))
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    answer = await read_until_closed(reader)
    writer.close()
    status = answer.split(b" ", 2)[1]
    assert status in (b"400", b"404"), answer[:200]
    assert [s.path for s in fake.seen] == []  # nothing reached the upstream


ALICE = {"X-Tripwire-Agent": "alice", "X-Tripwire-Session": "a-1"}
BOB = {"X-Tripwire-Agent": "bob", "X-Tripwire-Session": "b-1"}
RESPONSES = "/v1/responses"


@pytest.mark.parametrize("shared", [False, True], ids=["memory", "redis"])
async def test_an_agent_cannot_continue_another_agents_responses_chain(
    start_tripwire: StartTripwire,
    fake_upstream: tuple[FakeUpstream, str],
    request: pytest.FixtureRequest,
    shared: bool,
) -> None:
    """Issue 26 item 7: Responses chains are kept per agent (in memory as in Redis). Agent B naming
    agent A's response ids gets what it gets for ids nobody knows: its request judged on its own
    input, a synthetic parent dropped; never A's history, A's blocked input or A's real parent."""
    fake, url = fake_upstream
    script(fake)
    state = {"state": {"url": request.getfixturevalue("redis_url")}} if shared else {}
    tw = await start_tripwire(upstream={"url": url}, guards=GUARDS, **state)

    def client(headers: dict[str, str]) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=headers)

    alice, bob = client(ALICE), client(BOB)
    # alice asks for the same tool call three times along a chain: her 4th request is blocked
    response = await alice.responses.create(model="gpt-4o", input="weather in Paris?")
    ids = [response.id]
    for _ in range(3):
        (call,) = [item for item in response.output if item.type == "function_call"]
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "alice's secret"}
        response = await alice.responses.create(
            model="gpt-4o", previous_response_id=response.id, input=[output]
        )
        ids.append(response.id)
    *real, synthetic = ids
    assert synthetic.startswith("resp_tripwire_") and len(fake.calls(RESPONSES)) == 3

    async def sent_for(previous: str, input: Any) -> tuple[str, dict[str, Any]]:
        """Bob's call naming `previous`: the id of what he got, and what reached the upstream."""
        calls = len(fake.calls(RESPONSES))
        answer = await bob.responses.create(model="gpt-4o", previous_response_id=previous, input=input)
        sent = fake.calls(RESPONSES)[calls:]
        return answer.id, (sent[0].body if sent else {})

    # alice's blocked answer: for bob a synthetic id nobody knows (dropped), not her real parent
    # with her blocked input (her tool output) in front of his
    got, sent = await sent_for(synthetic, "hi")
    unknown_got, unknown_sent = await sent_for("resp_tripwire_0123456789abcdef", "hi")
    assert "previous_response_id" not in sent and sent == unknown_sent
    assert b"alice's secret" not in orjson.dumps(sent)
    assert not got.startswith("resp_tripwire_") and not unknown_got.startswith("resp_tripwire_")
    # alice's real parent, continued with the same tool output: bob is judged on his own request
    # (forwarded as for an unknown parent), not on alice's three identical calls (blocked)
    again = [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    got, sent = await sent_for(real[-1], again)
    unknown_got, unknown_sent = await sent_for("resp_unknown", again)
    assert not got.startswith("resp_tripwire_") and not unknown_got.startswith("resp_tripwire_")
    assert sent["previous_response_id"] == real[-1] and sent["input"] == unknown_sent["input"] == again
