"""Attacks on the proxy listener (issue 11): slow or broken clients cannot hold it, trick it into
reaching outside an upstream's base path, or fill its log. Each case checks what the attacker gets
and that the proxy still serves an honest call afterwards. Raw sockets on 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import logging

import openai
import pytest

from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream

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
