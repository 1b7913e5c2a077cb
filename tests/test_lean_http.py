"""The proxy listener's lean lane (proxy/lean_http.py): plain HTTP/1.1 LLM calls are served on it,
and a connection is handed to aiohttp from the first request the lane does not take, with that
request's bytes intact. Raw sockets on 127.0.0.1 drive it byte by byte; the answers are read as a
client reads them (head, then a Content-Length or chunked body)."""

from __future__ import annotations

import asyncio

import httptools
import orjson
import pytest

from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream

CHAT = "/v1/chat/completions"
WAIT_S = 30.0  # generous: a busy machine is slow


def chat_request(
    content: str = "hi", *, path: str = CHAT, extra: str = "", body: bytes | None = None
) -> bytes:
    if body is None:
        body = orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}]})
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {AGENT_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


class Answer:
    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""
        self.done = False


class AnswerReader:
    """Reads answers off a raw connection, one after another (llhttp parses them, as a client's would)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.answers: list[Answer] = []
        self._parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        self.answers.append(Answer())

    def on_header(self, name: bytes, value: bytes) -> None:
        self.answers[-1].headers[name.decode().lower()] = value.decode()

    def on_headers_complete(self) -> None:
        self.answers[-1].status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.answers[-1].body += body

    def on_message_complete(self) -> None:
        self.answers[-1].done = True

    async def read(self, count: int) -> list[Answer]:
        """Until `count` answers are complete (or the server closes)."""
        async with asyncio.timeout(WAIT_S):
            while sum(a.done for a in self.answers) < count:
                data = await self.reader.read(65536)
                if not data:
                    break
                self._parser.feed_data(data)
        return self.answers


async def connect(tw: Running) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(tw.proxy.host, tw.proxy.port)


def text_of(answer: Answer) -> str:
    return str(orjson.loads(answer.body)["choices"][0]["message"]["content"])


async def test_keep_alive_calls_and_pipelined_calls_are_answered_in_order(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    reader, writer = await connect(tw)
    answers = AnswerReader(reader)
    writer.write(chat_request("one"))
    (first,) = await answers.read(1)
    assert first.status == 200 and "hello" in text_of(first).lower()
    assert first.headers["content-length"] == str(len(first.body))
    # two more in one write (pipelined): each waits for the answer before it
    writer.write(chat_request("two") + chat_request("three"))
    got = await answers.read(3)
    writer.close()
    assert [a.status for a in got] == [200, 200, 200]
    assert [s.body["messages"][0]["content"] for s in fake.calls(CHAT)] == ["one", "two", "three"]
    await tw.flush()
    calls = [e for run in tw.run_ids() for e in tw.events(run) if e["event_type"] == "LLM_CALL"]
    assert len(calls) == 3  # each recorded (three conversations: three runs)


async def test_a_body_sent_in_pieces_is_read_whole(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    reader, writer = await connect(tw)
    raw = chat_request("x" * 5000)
    for i in range(0, len(raw), 700):  # the head split too
        writer.write(raw[i : i + 700])
        await writer.drain()
        await asyncio.sleep(0.01)
    (answer,) = await AnswerReader(reader).read(1)
    writer.close()
    assert answer.status == 200
    assert fake.calls(CHAT)[0].body["messages"][0]["content"] == "x" * 5000


async def test_a_head_sent_a_byte_at_a_time_and_a_long_head_in_pieces(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """Trickled heads are buffered in place (linear, not a copy per byte); a head longer than one
    field may be (80 KiB here, in 1 KiB pieces) goes to aiohttp, which serves it."""
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    reader, writer = await connect(tw)
    raw = chat_request("trickled")
    head_end = raw.index(b"\r\n\r\n") + 4
    for i in range(head_end):
        writer.write(raw[i : i + 1])
    writer.write(raw[head_end:])
    await writer.drain()
    long_head = chat_request("long", extra="".join(f"X-Long-{i}: {'v' * 4096}\r\n" for i in range(20)))
    for i in range(0, len(long_head), 1024):
        writer.write(long_head[i : i + 1024])
        await writer.drain()
    answers = await AnswerReader(reader).read(2)
    writer.close()
    assert [a.status for a in answers] == [200, 200]
    assert [s.body["messages"][0]["content"] for s in fake.calls(CHAT)] == ["trickled", "long"]
    assert fake.calls(CHAT)[1].headers["X-Long-19"] == "v" * 4096


@pytest.mark.parametrize(
    ("second", "status"),
    [
        # an MCP route: aiohttp's lane (an unknown server: its 404 in Tripwire's shape)
        (b"POST /mcp/nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 404),
        # a chunked body: aiohttp reads it
        (
            chat_request(body=b"").replace(b"Content-Length: 0", b"Transfer-Encoding: chunked")
            + b"%x\r\n" % len(orjson.dumps({"model": "m", "messages": []}))
            + orjson.dumps({"model": "m", "messages": []})
            + b"\r\n0\r\n\r\n",
            200,
        ),
        # a malformed head: aiohttp answers 400
        (b"POST /v1/chat/completions HTTP/1.1\r\nBad Header Line\r\n\r\n", 400),
        # HTTP/1.0
        (chat_request().replace(b"HTTP/1.1", b"HTTP/1.0"), 200),
        # a header over max_field_size (64 KiB): aiohttp refuses it (400, "Got more than 65536 bytes")
        (chat_request(extra=f"X-Big: {'b' * 70000}\r\n"), 400),
    ],
    ids=["mcp-route", "chunked-body", "malformed-head", "http-1.0", "oversized-header"],
)
async def test_a_connection_is_handed_to_aiohttp_with_the_request_intact(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], second: bytes, status: int
) -> None:
    """First a lean call, then one the lane does not take, in the same write: aiohttp answers the
    second from its first byte, after the first's answer."""
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    reader, writer = await connect(tw)
    writer.write(chat_request("lean") + second)
    answers = await AnswerReader(reader).read(2)
    writer.close()
    assert [a.status for a in answers] == [200, status]
    assert fake.calls(CHAT)[0].body["messages"][0]["content"] == "lean"


async def test_connection_close_is_honoured(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    reader, writer = await connect(tw)
    writer.write(chat_request(extra="Connection: close\r\n"))
    (answer,) = await AnswerReader(reader).read(1)
    assert answer.status == 200 and answer.headers["connection"] == "close"
    async with asyncio.timeout(WAIT_S):
        assert await reader.read() == b""  # the server closed its side
    writer.close()


async def test_an_idle_keep_alive_connection_is_closed(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, header_timeout_s=0.3)
    reader, writer = await connect(tw)
    writer.write(chat_request())
    (answer,) = await AnswerReader(reader).read(1)
    assert answer.status == 200
    async with asyncio.timeout(WAIT_S):
        assert await reader.read() == b""  # no next request within header_timeout_s: closed
    writer.close()


async def test_a_stream_is_relayed_chunked_and_the_connection_is_reused(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    reader, writer = await connect(tw)
    body = orjson.dumps(
        {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "s"}]}
    )
    writer.write(chat_request(body=body) + chat_request("after"))
    stream, after = await AnswerReader(reader).read(2)
    writer.close()
    assert stream.status == 200 and stream.headers["transfer-encoding"] == "chunked"
    assert stream.headers["content-type"].startswith("text/event-stream")
    assert stream.body.rstrip().endswith(b"data: [DONE]")
    assert after.status == 200 and text_of(after)


async def test_guard_answers_go_out_on_the_lean_lane(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """An answer Tripwire makes itself (here: the call limit) is written by the lane too."""
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_llm_calls": 1}})
    reader, writer = await connect(tw)
    session = "X-Tripwire-Session: lean-1\r\n"
    writer.write(chat_request("one", extra=session) + chat_request("two", extra=session))
    first, second = await AnswerReader(reader).read(2)
    writer.close()
    assert first.status == 200
    assert second.status == 429 and b"max_llm_calls" in second.body
    assert len(fake.calls(CHAT)) == 1  # the second never reached the upstream
