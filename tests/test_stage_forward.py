"""`ForwardStage` alone, the upstream client replaced at its boundary (an object answering
`forward` as the Forwarder does, so no socket): the URL is the route's upstream joined with the
rest path and query, Tripwire's own headers never leave, a recorded call asks for an uncompressed
answer, a rewritten body wins over the client's, the stream observer's text is capped, and the
protocol reads the result even when the handler is cancelled mid-call."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from multidict import CIMultiDict

from proxy.engine import Engine
from proxy.exchange import Exchange
from proxy.stages.forward import TEXT_MARGIN, ForwardStage
from proxy.stages.llm_parse import LLMParseStage
from proxy.stages.session import SessionStage
from tests.factories import CHAT, EngineFactory, chat_completion, chat_request, make_exchange, play_upstream


class FakeForwarder:
    """Records what it was asked to send, then plays `answer` into the exchange (or hangs)."""

    def __init__(self, answer: dict[str, Any] | None = None) -> None:
        self.answer = answer
        self.sent: list[tuple[str, CIMultiDict[str], bytes]] = []
        self.called = asyncio.Event()

    async def forward(self, ex: Exchange, url: str, headers: CIMultiDict[str], body: bytes) -> None:
        self.sent.append((url, headers, body))
        self.called.set()
        if self.answer is None:
            ex.forwarded = True
            await asyncio.Event().wait()  # the upstream never answers
        play_upstream(ex, self.answer, after_forward=False)


async def parsed(engine: Engine, path: str, headers: dict[str, str] | None = None) -> Exchange:
    ex = make_exchange("POST", path, headers, body=chat_request(), engine=engine)
    await LLMParseStage(engine.services).request(ex)
    await SessionStage(engine.services).request(ex)
    return ex


async def test_the_call_goes_to_the_routes_upstream_without_tripwires_headers(
    engine_factory: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = await engine_factory(upstream={"url": "http://127.0.0.1:1/base/v1"})
    fake = FakeForwarder(chat_completion("hi"))
    monkeypatch.setattr(engine.forwarder, "forward", fake.forward)
    headers = {"Authorization": "Bearer sk-1", "X-Tripwire-Agent": "bot", "Accept-Encoding": "gzip"}
    ex = await parsed(engine, CHAT + "?api-version=1", headers)
    await ForwardStage(engine.services).request(ex)
    url, sent_headers, body = fake.sent[0]
    assert url == "http://127.0.0.1:1/base/v1/chat/completions?api-version=1"
    assert sent_headers["Authorization"] == "Bearer sk-1"
    assert "X-Tripwire-Agent" not in sent_headers
    assert sent_headers["Accept-Encoding"] == "identity"  # a recorded call is read: not compressed
    assert body == ex.upstream_body if ex.upstream_body is not None else body == ex.body
    assert ex.result is not None and ex.result.text == "hi"  # the protocol read the result


async def test_a_rewritten_body_wins_and_the_observer_text_is_capped(
    engine_factory: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = await engine_factory(max_field_bytes=1000)
    fake = FakeForwarder(chat_completion("hi"))
    monkeypatch.setattr(engine.forwarder, "forward", fake.forward)
    ex = await parsed(engine, CHAT)
    ex.upstream_body = b'{"rewritten": true}'
    capped: list[int] = []
    ex.observer.limit_text = capped.append  # type: ignore[union-attr]
    await ForwardStage(engine.services).request(ex)
    assert fake.sent[0][2] == b'{"rewritten": true}'
    assert capped == [1000 + TEXT_MARGIN]


async def test_a_cancelled_call_still_has_its_result_read(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeForwarder(None)
    monkeypatch.setattr(engine.forwarder, "forward", fake.forward)
    ex = await parsed(engine, CHAT)
    task = asyncio.create_task(ForwardStage(engine.services).request(ex))
    async with asyncio.timeout(30):
        await fake.called.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ex.result is not None and ex.result.error is not None  # recorded as a call with no answer
