"""The lean lane's differential corpus: raw bytes the proxy listener's lean lane (proxy/lean_http.py)
must answer exactly as aiohttp alone answers them (tests/test_lean_http.py sends each case to both
and compares what comes back, byte for byte but the Date).

A case is what a client writes (in one packet) and, optionally, what the upstream answers each call
with (raw bytes; None: the fake upstream of tests/fakes.py). Grow it with every difference found
(issue 26 item 5 found the first ones); a case that only one lane can serve is not a case here.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from tests.conftest import AGENT_KEY
from tests.factories import chat_completion

CHAT = "/v1/chat/completions"


def chat_request(
    content: str = "hi", *, path: str = CHAT, extra: str = "", body: bytes | None = None
) -> bytes:
    """A plain Chat Completions call, as an SDK writes it (the lean lane's own case)."""
    if body is None:
        body = orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}]})
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {AGENT_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


def upstream_answer(head: bytes, body: bytes | None = None) -> bytes:
    """An upstream's answer to a chat call: `head` (status line and fields), then a JSON body."""
    if body is None:
        body = orjson.dumps(chat_completion("from upstream"))
    return head + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)


@dataclass(frozen=True)
class Case:
    name: str
    request: bytes  # what the client writes, in one packet
    upstream: bytes | None = None  # what the upstream answers every call with; None: the fake upstream


CASES = [
    Case("one-call", chat_request("one")),
    Case("keep-alive-pipelined", chat_request("one") + chat_request("two")),
    Case("connection-close", chat_request("one", extra="Connection: close\r\n")),
    # aiohttp refuses the packet (400, `Data after Connection: close`) and serves neither call
    Case(
        "data-after-connection-close",
        chat_request("one", extra="Connection: close\r\n") + chat_request("two"),
    ),
    # a head aiohttp will not write: a control byte in the reason is a 500 (in a header field the
    # upstream client refuses the answer: a 502) ...
    Case("upstream-reason-with-a-control-byte", chat_request(), upstream_answer(b"HTTP/1.1 200 O\x01K\r\n")),
    Case(
        "upstream-header-with-a-control-byte",
        chat_request(),
        upstream_answer(b"HTTP/1.1 200 OK\r\nX-Odd: a\x01b\r\n"),
    ),
    # ... and bytes that are not UTF-8, in a header value or the reason, are left out (UTF-8 goes through)
    Case(
        "upstream-header-not-utf8",
        chat_request(),
        upstream_answer(b"HTTP/1.1 200 OK\r\nX-Bad: a\xff\xfeb\r\nX-Good: caf\xc3\xa9\r\n"),
    ),
    Case("upstream-reason-not-utf8", chat_request(), upstream_answer(b"HTTP/1.1 200 O\xffK\r\n")),
    # what aiohttp refuses (400) or, in older releases, serves: either way both lanes answer alike
    # (the lean lane hands these heads to aiohttp)
    Case("no-host", b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"),
    Case("two-hosts", chat_request(extra="Host: twice\r\n")),
    Case("two-content-types", chat_request(extra="Content-Type: text/plain\r\n")),
    Case("130-headers", chat_request(extra="".join(f"X-{i}: v\r\n" for i in range(130)))),
    Case("bare-lf", b"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}"),
]
