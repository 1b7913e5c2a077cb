"""The pooled upstream client (proxy/upstream_http.py) against aiohttp's ClientSession on the same
answers: raw bytes from a raw asyncio server on 127.0.0.1 go to both, and what each makes of them
(status, reason, headers in order, body bytes, or the family of the exception raised) is the same."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from multidict import CIMultiDict
from yarl import URL

from proxy.upstream_http import UpstreamPool, ssl_context

pytestmark = pytest.mark.both_loops

WAIT_S = 30.0

# what a caller tells apart (forward's except clauses, retryable_error, the breaker)
FAMILIES = (
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientPayloadError,
    aiohttp.ClientResponseError,
    aiohttp.ClientOSError,
    aiohttp.ClientConnectionError,
    TimeoutError,
)

ANSWERS = {
    "content-length": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    "close-delimited": b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end",
    "204": b"HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n",
    "304-with-length": b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
    "1xx-then-200": b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
    "header-casing-and-duplicates": (
        b"HTTP/1.1 200 Fine\r\nset-cookie: a=1\r\nSet-Cookie: b=2\r\nx-own: \xc3\xa9\r\nContent-Length: 0\r\n\r\n"
    ),
    "short-content-length": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
    "chunked-cut": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
    "closed-before-answer": b"",
    "head-cut": b"HTTP/1.1 200 OK\r\nContent-Le",
    "malformed-status": b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
    "malformed-chunk-size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
    "two-content-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    "content-length-leading-zeros": b"HTTP/1.1 200 OK\r\nContent-Length: 002\r\n\r\nok",
    "content-length-plus": b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok",
    "content-length-not-a-number": b"HTTP/1.1 200 OK\r\nContent-Length: two\r\n\r\nok",
    "two-equal-content-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
    "chunk-extension-and-trailer": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\nok\r\n0\r\nX-Trailer: t\r\n\r\n"
    ),
    "chunked-and-content-length": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    ),
    "transfer-encoding-gzip-then-chunked": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    ),
    "obs-fold": b"HTTP/1.1 200 OK\r\nX-A: one\r\n two\r\nContent-Length: 0\r\n\r\n",
    "bare-lf-head": b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
    "http-1.0-close-delimited": b"HTTP/1.0 200 OK\r\n\r\nuntil the end",
    "no-reason": b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",
    "space-before-colon": b"HTTP/1.1 200 OK\r\nX-A : 1\r\nContent-Length: 0\r\n\r\n",
    "status-999": b"HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n",
    "empty-header-value": b"HTTP/1.1 200 OK\r\nX-Empty:\r\nContent-Length: 0\r\n\r\n",
    "trailing-whitespace-in-a-value": b"HTTP/1.1 200 OK\r\nX-A: 1 \t \r\nContent-Length: 0\r\n\r\n",
    "nul-in-a-value": b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n",
    "control-byte-in-a-value": b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 0\r\n\r\n",
    "spaces-after-chunk-size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2  \r\nok\r\n0\r\n\r\n",
    # refused in the read that brought the head: aiohttp fails the answer at its start
    "malformed-chunk-in-the-head-packet": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\nab\r\n0\r\n\r\n"
    ),
}


@contextlib.asynccontextmanager
async def answering(answer: bytes) -> AsyncIterator[URL]:
    """A server on 127.0.0.1 that reads a request head and writes `answer`, then closes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield URL(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/x")
    finally:
        server.close()


def family(e: BaseException) -> str:
    return next((f.__name__ for f in FAMILIES if isinstance(e, f)), type(e).__name__)


async def through_pool(url: URL) -> tuple[object, ...]:
    pool = UpstreamPool(ssl_context=ssl_context(None), connect_timeout_s=WAIT_S, read_timeout_s=WAIT_S)
    try:
        async with await pool.request("GET", url, CIMultiDict(), b"") as resp:
            head = (resp.status, resp.reason, list(resp.headers.items()))
            try:
                return (*head, await resp.read())
            except Exception as e:
                return (*head, family(e))
    except Exception as e:
        return (family(e),)
    finally:
        pool.close()


async def through_aiohttp(url: URL) -> tuple[object, ...]:
    async with aiohttp.ClientSession(
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, connect=WAIT_S, sock_read=WAIT_S),
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
    ) as session:
        try:
            async with session.get(url) as resp:
                head = (resp.status, resp.reason, list(resp.headers.items()))
                try:
                    return (*head, await resp.read())
                except Exception as e:
                    return (*head, family(e))
        except Exception as e:
            return (family(e),)


# edges where aiohttp itself changed: the pool answers as the aiohttp that follows RFC 9110 §5.5, and
# is compared only with that one (the lowest-versions job runs an older aiohttp)
AIOHTTP_FROM = {
    "nul-in-a-value": (3, 13, 4),  # refused since (before: kept in the value)
    "trailing-whitespace-in-a-value": (3, 14, 4),  # stripped since (before: kept)
}
AIOHTTP = tuple(int(part) for part in aiohttp.__version__.split(".")[:3] if part.isdigit())

# known differences (issue 20), failing-as-expected until the client is changed
KNOWN: dict[str, str] = {}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN[n])) if n in KNOWN else n
        for n in ANSWERS
    ],
)
async def test_the_pool_makes_of_an_answer_what_aiohttp_makes_of_it(name: str) -> None:
    if AIOHTTP < AIOHTTP_FROM.get(name, ()):
        pytest.skip(f"aiohttp {aiohttp.__version__} predates its answer to this edge")
    async with answering(ANSWERS[name]) as url:
        async with asyncio.timeout(WAIT_S):
            ours = await through_pool(url)
            theirs = await through_aiohttp(url)
    assert ours == theirs
