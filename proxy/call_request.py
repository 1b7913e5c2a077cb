"""The seam between the proxy listener's two lanes and the pipeline.

A call arrives on one of two lanes: aiohttp's (`web.Request`, everything) or the lean lane's
(`proxy.lean_http.LeanRequest`, plain HTTP/1.1 LLM calls). Past the lane, the handler and the stages
see a `CallRequest`: what both requests have, so mypy refuses a stage that reads something only one
lane's request has (`Exchange.request` is typed with it). A forwarded answer goes back through the
lane the call came in on: the lane hands the pipeline its `AnswerMaker` (`Exchange.answer_maker`),
which makes the lane's own answer object, a `ClientAnswer` the forwarder writes to; the forwarder
does not know which lane it writes to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.aiohttp_compat import OneWriteResponse


class RawQuery(Protocol):
    """The request target's query as the client encoded it (yarl's URL, or the lean lane's own)."""

    @property
    def raw_query_string(self) -> str: ...


class BodyStream(Protocol):
    """The request body as it arrives (aiohttp's StreamReader, or the lean lane's `LeanContent`)."""

    def is_eof(self) -> bool: ...

    def read_nowait(self) -> bytes: ...

    async def readany(self) -> bytes: ...


class CallRequest(Protocol):
    """What the call's handler and its stages read of a request, on either lane."""

    @property
    def app(self) -> web.Application: ...

    @property
    def method(self) -> str: ...

    @property
    def raw_path(self) -> str: ...

    @property
    def rel_url(self) -> RawQuery: ...

    @property
    def headers(self) -> CIMultiDictProxy[str]: ...

    @property
    def content_length(self) -> int | None: ...

    @property
    def content(self) -> BodyStream: ...

    @property
    def transport(self) -> asyncio.Transport | None: ...  # None once the client is gone

    @property
    def keep_alive(self) -> bool: ...

    async def read(self) -> bytes: ...


class ClientAnswer(Protocol):
    """What a call's answer is written to (aiohttp's StreamResponse, or the lean lane's LeanResponse),
    in this order: prepare (the head), write (body bytes), write_eof; force_close ends the connection
    after the answer. Tripwire's own answers (`web.Response`) are one too."""

    async def prepare(self, request: Any) -> object: ...  # (the request of the answer's own lane)

    @property
    def prepared(self) -> bool: ...  # the head was made (it may still be held for the body)

    async def write(self, data: bytes) -> None: ...

    async def write_eof(self, data: bytes = b"") -> None: ...

    def force_close(self) -> None: ...


# The lane's maker of the answer a forwarded call is relayed into: (status, reason, headers, whether
# it is a stream). A stream's head goes out at once; a whole answer's with its first body bytes.
AnswerMaker = Callable[[int, "str | None", CIMultiDict[str], bool], ClientAnswer]


def aiohttp_answer(status: int, reason: str | None, headers: CIMultiDict[str], stream: bool) -> ClientAnswer:
    """aiohttp's lane: a `web.StreamResponse` (an SSE stream's head goes out as the upstream sent
    it), or one that sends a whole answer's head with its body (`OneWriteResponse`)."""
    return (web.StreamResponse if stream else OneWriteResponse)(status=status, reason=reason, headers=headers)
