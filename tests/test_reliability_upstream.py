"""A hostile upstream (issue 26): answers it should not give never poison what other calls share.
Raw asyncio servers on 127.0.0.1 write the answers byte for byte; the agents are the real SDKs."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import openai
import orjson
import pytest

from tests.conftest import AGENT_KEY, StartTripwire
from tests.factories import chat_completion

pytestmark = pytest.mark.both_loops  # asyncio's loop and uvloop, which `tripwire serve` runs on

WAIT_S = 30.0  # generous: a busy machine is slow
MESSAGES_HI = [{"role": "user", "content": "hi"}]


def agent(base: str, name: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=base + "/v1",
        api_key=AGENT_KEY,
        max_retries=0,
        default_headers={"X-Tripwire-Agent": name, "X-Tripwire-Session": f"{name}-1"},
    )


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
    return head + (await reader.readexactly(int(m.group(1))) if m else b"")


class SwitchingUpstream:
    """Answers a request whose body says `switch` with a 101 (as if it spoke another protocol from
    then on) and keeps that socket open, recording whatever arrives on it after the 101; any other
    request gets a chat completion on a keep-alive connection."""

    def __init__(self) -> None:
        self.connections = 0
        self.after_switch = b""  # bytes that arrived on a switched socket
        self.answered: list[bytes] = []  # the requests answered normally
        self.tasks: set[asyncio.Task[None]] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.connections += 1
        try:
            while True:
                request = await read_request(reader)
                if b"switch" in request:
                    writer.write(
                        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"
                    )
                    await writer.drain()
                    while chunk := await reader.read(65536):
                        self.after_switch += chunk
                    return
                self.answered.append(request)
                body = orjson.dumps(chat_completion("fresh"))
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
                )
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def switching_upstream() -> AsyncIterator[tuple[SwitchingUpstream, str]]:
    fake = SwitchingUpstream()
    server = await asyncio.start_server(fake.serve, "127.0.0.1", 0)
    try:
        yield fake, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for task in fake.tasks:
            task.cancel()


async def test_a_101_to_a_post_never_sends_the_next_call_into_the_switched_socket(
    start_tripwire: StartTripwire,
) -> None:
    """Issue 26 item 1: llhttp ends the 101's message before it raises its upgrade, so the
    connection went back to the pool, and the next call of any agent was written into a socket
    that no longer speaks HTTP (its key and prompt included) and waited ttfb_timeout_s for an
    answer. A connection that saw an upgrade is never reused, as aiohttp never reuses one."""
    async with switching_upstream() as (fake, url):
        tw = await start_tripwire(upstream={"url": url})
        # agent A's call gets the 101, relayed: its SDK raises what it raises direct (httpx: a
        # protocol switch it did not propose), as the client of aiohttp's lane gets it too
        with pytest.raises(openai.APIConnectionError):
            async with asyncio.timeout(WAIT_S):
                await agent(tw.url, "a").chat.completions.create(
                    model="gpt-4o-mini", messages=[{"role": "user", "content": "switch"}]
                )
        # agent B's next call goes out on a fresh connection and gets its real answer
        async with asyncio.timeout(WAIT_S):
            answer = await agent(tw.url, "b").chat.completions.create(
                model="gpt-4o-mini", messages=MESSAGES_HI
            )
        assert answer.choices[0].message.content == "fresh"
        assert fake.after_switch == b""  # nothing of B's call went into the switched socket
        assert fake.connections == 2 and len(fake.answered) == 1
