"""The lean upstream client (proxy/upstream_http.py) against small servers on 127.0.0.1: keep-alive
reuse, servers closing connections, body framings, https, timeouts, big bodies, flow control, and
the request bytes it writes (what aiohttp wrote for the same call)."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import re
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict
from yarl import URL

from proxy import upstream_http
from proxy.forward import retryable_error
from proxy.upstream_http import UpstreamPool, request_bytes, ssl_context

pytestmark = pytest.mark.both_loops  # asyncio's loop and uvloop, which `tripwire serve` runs on

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    p = UpstreamPool(ssl_context=ssl_context(None), connect_timeout_s=5, read_timeout_s=5)
    yield p
    p.close()


class RawServer:
    """An asyncio stream server whose handlers all end when it stops (their connections closed)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went first, or the server stopped (the task is ours: it ends quietly)
        finally:
            writer.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in self.tasks:
            task.cancel()


async def raw_server(handler: Handler) -> tuple[RawServer, str]:
    raw = RawServer(handler)
    raw.server = server = await asyncio.start_server(raw._serve, "127.0.0.1", 0)
    return raw, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    m = re.search(rb"(?i)\r\ncontent-length: (\d+)", head)
    return head + (await reader.readexactly(int(m.group(1))) if m else b"")


async def get(pool: UpstreamPool, url: str, method: str = "GET", body: bytes = b"") -> tuple[int, bytes]:
    async with await pool.request(method, URL(url, encoded=True), CIMultiDict(), body) as resp:
        return resp.status, await resp.read()


# --- the request -------------------------------------------------------------------------------


def test_request_bytes_are_what_aiohttp_wrote() -> None:
    url = URL("http://h.example:8080/v1/p%20a?x=%23y", encoded=True)
    headers = CIMultiDict([("Content-Type", "application/json"), ("X-Dup", "1"), ("X-Dup", "2")])
    assert request_bytes("POST", url, headers, b"{}") == (
        b"POST /v1/p%20a?x=%23y HTTP/1.1\r\nHost: h.example:8080\r\nContent-Type: application/json\r\n"
        b"X-Dup: 1\r\nX-Dup: 2\r\nAccept: */*\r\nContent-Length: 2\r\n\r\n{}"
    )
    # the default port is left out of Host; a GET without a body has no Content-Length
    plain = URL("https://h.example/v1/models", encoded=True)
    assert request_bytes("GET", plain, CIMultiDict({"Accept": "text/x"}), b"") == (
        b"GET /v1/models HTTP/1.1\r\nHost: h.example\r\nAccept: text/x\r\n\r\n"
    )
    # a bodyless POST says Content-Length: 0
    assert b"\r\nContent-Length: 0\r\n" in request_bytes("POST", plain, CIMultiDict(), b"")
    with pytest.raises(ValueError):
        request_bytes("GET", plain, CIMultiDict({"X-Bad": "a\r\nInjected: 1"}), b"")


# --- keep-alive --------------------------------------------------------------------------------


async def test_a_connection_is_reused_once_its_answer_was_read(pool: UpstreamPool) -> None:
    peers: list[object] = []

    async def hello(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername"))  # type: ignore[union-attr]
        return web.Response(text="hi")

    app = web.Application()
    app.router.add_get("/", hello)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        url = str(server.make_url("/"))
        for _ in range(3):
            assert await get(pool, url) == (200, b"hi")
        assert len(set(peers)) == 1 and len(pool.open_connections()) == 1
    finally:
        await server.close()


async def test_an_answer_let_go_before_its_end_closes_its_connection(pool: UpstreamPool) -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234")
            await writer.drain()

    server, url = await raw_server(handler)
    try:
        resp = await pool.request("GET", URL(url), CIMultiDict(), b"")
        assert await resp.__anext__() == b"01234"
        resp.release()  # five bytes still to come: the connection cannot carry another answer
        resp2 = await pool.request("GET", URL(url), CIMultiDict(), b"")
        resp2.release()
        assert connections == 2
    finally:
        server.close()


async def test_idle_connections_are_closed_after_the_keepalive_time() -> None:
    """A burst of concurrent calls leaves as many idle connections: each is closed once it has idled
    the pool's keep-alive time (aiohttp's keepalive_timeout), with no further traffic."""
    pool = UpstreamPool(ssl_context=ssl_context(None), connect_timeout_s=5, read_timeout_s=5, keepalive_s=0.2)
    burst = 5
    arrived = 0
    all_arrived = asyncio.Event()
    closed_by_client = 0
    closes_expected = burst
    all_closed = asyncio.Event()

    async def holds_until_all_arrived(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal arrived, closed_by_client
        await read_request(reader)
        arrived += 1
        if arrived == burst:
            all_arrived.set()
        await all_arrived.wait()  # so the burst needs one connection per call
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        assert await reader.read() == b""  # the client closes it, not the server
        closed_by_client += 1
        if closed_by_client >= closes_expected:
            all_closed.set()

    server, url = await raw_server(holds_until_all_arrived)
    try:
        results = await asyncio.gather(*(get(pool, url) for _ in range(burst)))
        assert results == [(200, b"ok")] * burst
        assert pool.idle_count() == burst
        async with asyncio.timeout(10):  # generous: the reaper runs at about 0.2 s
            await all_closed.wait()
        assert pool.idle_count() == 0 and all(c.closed for c in pool.open_connections())
        # a connection put back after the pool went empty is reaped in its turn
        closes_expected = burst + 1
        all_closed.clear()
        assert await get(pool, url) == (200, b"ok")
        async with asyncio.timeout(10):
            await all_closed.wait()
        assert pool.idle_count() == 0 and all(c.closed for c in pool.open_connections())
    finally:
        pool.close()
        server.close()


async def test_a_connection_the_server_closed_idle_is_not_used(pool: UpstreamPool) -> None:
    connections = 0

    async def one_answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # says nothing of closing
        await writer.drain()
        writer.close()

    server, url = await raw_server(one_answer_then_close)
    try:
        assert await get(pool, url) == (200, b"ok")
        await asyncio.sleep(0.1)  # the close reaches the client's loop
        assert await get(pool, url) == (200, b"ok")
        assert connections == 2
    finally:
        server.close()


async def test_a_reused_connection_that_fails_before_any_answer_is_retried_on_a_fresh_one(
    pool: UpstreamPool,
) -> None:
    """The server takes the second request on a kept connection and closes it without a word
    (as one that closes idle connections does when the request crosses its close)."""
    connections = 0

    async def closes_on_the_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await read_request(reader)
        writer.close()

    server, url = await raw_server(closes_on_the_second)
    try:
        assert await get(pool, url) == (200, b"ok")
        assert await get(pool, url, "PUT", b"{}") == (200, b"ok")  # idempotent: sent again
        assert connections == 2
    finally:
        server.close()


async def test_a_post_on_a_reused_connection_that_breaks_before_the_answer_is_not_resent(
    pool: UpstreamPool,
) -> None:
    """The upstream may have received the POST and acted on it before the connection broke: it is
    not sent again (aiohttp resends only idempotent methods); the caller gets the error."""
    posts: list[bytes] = []

    async def resets_on_the_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        posts.append(await read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        posts.append(await read_request(reader))  # received (and, for all the client knows, done)
        await asyncio.sleep(0.5)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # a reset, not a clean close

    server, url = await raw_server(resets_on_the_second)
    try:
        assert await get(pool, url, "POST", b'{"n":1}') == (200, b"ok")
        assert pool.idle_count() == 1
        with pytest.raises((aiohttp.ClientOSError, aiohttp.ServerDisconnectedError)):
            await get(pool, url, "POST", b'{"n":2}')
        await asyncio.sleep(0.1)  # a resend, had there been one, would have reached the server
        assert len(posts) == 2 and posts[1].endswith(b'{"n":2}')
    finally:
        server.close()


async def test_a_fresh_connection_closed_before_the_answer_is_not_retried(pool: UpstreamPool) -> None:
    async def closes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.close()

    server, url = await raw_server(closes)
    try:
        with pytest.raises(aiohttp.ServerDisconnectedError) as e:
            await get(pool, url)
        assert retryable_error(e.value)
    finally:
        server.close()


# --- body framings -----------------------------------------------------------------------------


async def answer_with(raw: bytes, pool: UpstreamPool, method: str = "GET") -> tuple[int, bytes, int]:
    """The upstream writes `raw` in pieces, then waits for the client to go; returns the answer and
    how many connections the pool keeps for the next call."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for i in range(0, len(raw), 7):
            writer.write(raw[i : i + 7])
            await writer.drain()
        if b"Connection: close" in raw or b"HTTP/1.0" in raw:
            writer.close()
            return
        await reader.read()

    server, url = await raw_server(handler)
    try:
        status, body = await get(pool, url, method)
        return status, body, pool.idle_count()
    finally:
        pool.close()
        server.close()


async def test_chunked_content_length_and_close_delimited_bodies(pool: UpstreamPool) -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    assert await answer_with(chunked, pool) == (200, b"hello world", 1)
    sized = b"HTTP/1.1 201 Created\r\nContent-Length: 11\r\n\r\nhello world"
    assert await answer_with(sized, pool) == (201, b"hello world", 1)
    until_close = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello world"
    assert await answer_with(until_close, pool) == (200, b"hello world", 0)
    old = b"HTTP/1.0 200 OK\r\n\r\nhello world"
    assert await answer_with(old, pool) == (200, b"hello world", 0)


async def test_only_a_last_transfer_coding_of_chunked_makes_the_body_chunked(pool: UpstreamPool) -> None:
    """RFC 9112 section 6.3: `chunked, gzip` is not chunked, its body ends with the connection (as
    llhttp reads it), and that clean close is the end of the answer, not a broken one."""
    body = b"5\r\nhello\r\n0\r\n\r\n"  # chunk syntax, relayed as it came
    gzip_last = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\nConnection: close\r\n\r\n" + body
    assert await answer_with(gzip_last, pool) == (200, body, 0)
    # a later field continues the list: the last coding of the last one decides
    two_fields = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n"
        b"Connection: close\r\n\r\n" + body
    )
    assert await answer_with(two_fields, pool) == (200, body, 0)
    chunked_last = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip , Chunked\r\n\r\n" + body
    assert await answer_with(chunked_last, pool) == (200, b"hello", 1)


async def test_answers_without_a_body(pool: UpstreamPool) -> None:
    assert await answer_with(b"HTTP/1.1 204 No Content\r\n\r\n", pool) == (204, b"", 1)
    assert await answer_with(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n", pool) == (304, b"", 1)
    # a HEAD answer announces a length it does not send; its connection is not kept
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"
    assert await answer_with(head, pool, "HEAD") == (200, b"", 0)
    # a 101 nobody asked for ends the answer at its head, and the connection with it: what follows
    # is another protocol (issue 26; aiohttp never reuses a connection after a 101 either)
    switched = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"
    assert await answer_with(switched, pool, "POST") == (101, b"", 0)


async def test_interim_answers_are_skipped_and_headers_kept_as_sent(pool: UpstreamPool) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
            b"HTTP/1.1 200 Fine Thanks\r\nset-cookie: a=1\r\nSet-Cookie: b=2\r\nX-Own: \xc3\xa9\r\n"
            b"Content-Length: 2\r\n\r\nok"
        )
        await writer.drain()
        await reader.read()

    server, url = await raw_server(handler)
    try:
        async with await pool.request("GET", URL(url), CIMultiDict(), b"") as resp:
            assert (resp.status, resp.reason) == (200, "Fine Thanks")
            assert resp.headers.getall("Set-Cookie") == ["a=1", "b=2"]
            # aiohttp's spelling of the names it knows, the upstream's of the others
            assert [name for name, _ in resp.headers.items()] == [
                "Set-Cookie",
                "Set-Cookie",
                "X-Own",
                "Content-Length",
            ]
            assert resp.headers["X-Own"] == "é" and "Link" not in resp.headers
            assert await resp.read() == b"ok"
    finally:
        server.close()


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (b"HTTP/1.1 200 " + b"r" * 8191 + b"\r\nContent-Length: 0\r\n\r\n", "Got more than 8190 bytes"),
        (b"HTTP/1.1 200 OK\r\nX-Big: " + b"v" * 8186 + b"\r\n\r\n", "Got more than 8190 bytes"),
        (b"HTTP/1.1 200 OK\r\n" + b"X-N: 1\r\n" * 129 + b"\r\n", "Too many headers received"),
        # a field that never ends: refused once the head is past what the limits allow in all
        (b"HTTP/1.1 200 OK\r\nX-Endless: " + b"v" * (2 * 1024 * 1024), "Response head longer than"),
        (b"HTTP/1.1 200 OK\r\n" + b"x" * (2 * 1024 * 1024), "Response head longer than"),
    ],
    ids=["reason", "field", "count", "endless-value", "endless-name"],
)
async def test_a_head_past_aiohttps_limits_fails_the_answer(
    pool: UpstreamPool, head: bytes, message: str
) -> None:
    """aiohttp's client refuses a line or field over 8190 bytes and more than 128 fields: the
    same ClientResponseError (a 502 for the Forwarder), and the connection is not kept."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(head)
        await writer.drain()
        await reader.read()  # the head is not ended: the client must not wait for more

    server, url = await raw_server(handler)
    try:
        with pytest.raises(aiohttp.ClientResponseError, match=message) as e:
            await get(pool, url)
        assert e.value.status == 400 and isinstance(e.value, aiohttp.ClientError)
        assert not pool.open_connections() or all(c.closed for c in pool.open_connections())
        assert pool.idle_count() == 0
    finally:
        server.close()


async def test_a_head_at_aiohttps_limits_is_read(pool: UpstreamPool, monkeypatch: pytest.MonkeyPatch) -> None:
    """128 fields, nearly all of 8190 bytes (name and value), and a reason of 8190 bytes pass; an
    odd long name is not kept in the names cache."""
    value = b"v" * (8190 - len(b"X-Field-000"))
    fields = b"".join(b"X-Field-%03d: %s\r\n" % (i, value) for i in range(126))
    long_name = b"X-" + b"n" * 63  # 65 bytes
    monkeypatch.setattr(upstream_http, "_names", {})  # room in the cache, whatever ran before
    head = (
        b"HTTP/1.1 200 " + b"r" * 8190 + b"\r\n" + fields + long_name + b": 1\r\nContent-Length: 2\r\n\r\nok"
    )

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(head)
        await writer.drain()
        await reader.read()

    server, url = await raw_server(handler)
    try:
        async with await pool.request("GET", URL(url), CIMultiDict(), b"") as resp:
            assert resp.status == 200 and len(resp.reason) == 8190
            assert len(resp.headers) == 128 and resp.headers["X-Field-125"] == value.decode()
            assert await resp.read() == b"ok"
        assert long_name not in upstream_http._names and b"X-Field-125" in upstream_http._names
    finally:
        server.close()


async def test_a_body_cut_short_raises_aiohttps_payload_error(pool: UpstreamPool) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()

    server, url = await raw_server(handler)
    try:
        async with await pool.request("GET", URL(url), CIMultiDict(), b"") as resp:
            assert await resp.__anext__() == b"abc"
            with pytest.raises(aiohttp.ClientPayloadError, match=r"received 3 of 100 bytes"):
                await resp.__anext__()
        assert not pool.open_connections()
    finally:
        server.close()


async def test_close_cuts_an_answer_being_read(pool: UpstreamPool) -> None:
    """What drain's abort_all does: the reader gets the error aiohttp's close() left."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await reader.read()

    server, url = await raw_server(handler)
    try:
        resp = await pool.request("GET", URL(url), CIMultiDict(), b"")
        assert await resp.__anext__() == b"abc"
        waiting = asyncio.ensure_future(resp.__anext__())
        await asyncio.sleep(0.05)
        resp.close()
        with pytest.raises(aiohttp.ClientConnectionError, match="Connection closed"):
            await waiting
        await asyncio.sleep(0.05)
        assert not pool.open_connections()
    finally:
        server.close()


# --- big bodies, flow control, timeouts --------------------------------------------------------


async def test_big_bodies_both_ways(pool: UpstreamPool) -> None:
    upload = bytes(range(256)) * (4 * 4096)  # 4 MiB

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=(await request.read())[::-1])

    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_post("/", echo)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        assert await get(pool, str(server.make_url("/")), "POST", upload) == (200, upload[::-1])
    finally:
        await server.close()


async def test_a_slow_reader_pauses_the_socket_and_the_read_timeout_waits_for_it() -> None:
    """sock_read measures the upstream: a consumer that is behind stops reading, not the clock."""
    pool = UpstreamPool(ssl_context=ssl_context(None), connect_timeout_s=5, read_timeout_s=0.3)
    size = 2 * 1024 * 1024

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size)
        await writer.drain()
        await reader.read()

    server, url = await raw_server(handler)
    try:
        async with await pool.request("GET", URL(url), CIMultiDict(), b"") as resp:
            (conn,) = pool.open_connections()
            got = 0
            paused_seen = False
            async for chunk in resp:
                got += len(chunk)
                await asyncio.sleep(0.5 if got < 512 * 1024 else 0)  # longer than the read timeout
                paused_seen = paused_seen or conn.paused
            assert got == size and paused_seen
    finally:
        pool.close()
        server.close()


async def test_silence_raises_the_socket_read_timeout() -> None:
    pool = UpstreamPool(ssl_context=ssl_context(None), connect_timeout_s=5, read_timeout_s=0.2)

    async def silent_midway(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        if b"/body" in request:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            await writer.drain()
        await reader.read()

    server, url = await raw_server(silent_midway)
    try:
        with pytest.raises(aiohttp.SocketTimeoutError) as before_head:
            await get(pool, url + "/head")
        assert isinstance(before_head.value, TimeoutError) and not retryable_error(before_head.value)
        async with await pool.request("GET", URL(url + "/body"), CIMultiDict(), b"") as resp:
            assert await resp.__anext__() == b"abc"
            with pytest.raises(aiohttp.SocketTimeoutError):
                await resp.__anext__()
    finally:
        pool.close()
        server.close()


async def test_a_handshake_that_never_ends_is_a_connect_timeout() -> None:
    pool = UpstreamPool(ssl_context=ssl_context(None), connect_timeout_s=0.2, read_timeout_s=5)

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    server, url = await raw_server(mute)
    try:
        with pytest.raises(aiohttp.ConnectionTimeoutError) as e:
            await get(pool, url.replace("http:", "https:"))
        assert retryable_error(e.value)
    finally:
        pool.close()
        server.close()


async def test_a_refused_connection_is_aiohttps_connector_error(pool: UpstreamPool) -> None:
    with pytest.raises(aiohttp.ClientConnectorError, match=r"Cannot connect to host 127.0.0.1:9 ssl:default"):
        await get(pool, "http://127.0.0.1:9/")


# --- https -------------------------------------------------------------------------------------


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


async def test_https_with_a_ca_bundle_sends_sni_and_keeps_the_connection(tmp_path: Path) -> None:
    cert_file, key_file = self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert_file, key_file)
    names: list[str | None] = []
    server_ctx.sni_callback = lambda _sock, name, _ctx: names.append(name)  # type: ignore[assignment,misc,func-returns-value]

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text=f"over {request.scheme}")

    app = web.Application()
    app.router.add_get("/", hello)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server(ssl=server_ctx)
    url = f"https://localhost:{server.port}/"
    trusting = UpstreamPool(ssl_context=ssl_context(str(cert_file)), connect_timeout_s=5, read_timeout_s=5)
    default = UpstreamPool(ssl_context=ssl_context(None), connect_timeout_s=5, read_timeout_s=5)
    try:
        assert await get(trusting, url) == (200, b"over https")
        assert await get(trusting, url) == (200, b"over https")
        assert names == ["localhost"] and len(trusting.open_connections()) == 1
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await get(default, url)  # the system's trust does not know this certificate
    finally:
        trusting.close()
        default.close()
        await server.close()
