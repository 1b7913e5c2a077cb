"""`MaxTokensRecoveryStage` alone: which calls it takes, the continuation requests it sends, the
stitched answer it sets, and the upstream failures it turns into Tripwire's own answer.

The stage sends through `engine.forwarder.send`; here the engine's forwarder is replaced by a
scripted one (the network boundary: an object answering `send` with canned responses), so nothing
listens on a socket. The pure helpers (truncated_text, sum_usage, stitch) are in test_recovery.py."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDict

from proxy.engine import Engine
from proxy.exchange import Exchange
from proxy.stages.llm_parse import LLMParseStage
from proxy.stages.recovery import CONTINUE_PROMPT, MaxTokensRecoveryStage
from tests.factories import (
    CHAT,
    EngineFactory,
    chat_completion,
    chat_request,
    make_exchange,
)


class CannedResponse:
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.headers = CIMultiDict(
            {"Content-Type": "application/json", "Content-Length": str(len(body)), "X-Up": "1"}
        )
        self._body = body

    async def __aenter__(self) -> CannedResponse:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def read(self) -> bytes:
        return self._body


class ScriptedForwarder:
    """Answers each `send` with the next scripted answer (an exception is raised instead)."""

    def __init__(self, *script: tuple[int, dict[str, Any]] | BaseException) -> None:
        self.script = list(script)
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    async def send(self, ex: Exchange, method: str, url: str, headers: Any, body: bytes) -> CannedResponse:
        self.sent.append((method, url, orjson.loads(body)))
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        status, answer = step
        return CannedResponse(status, orjson.dumps(answer))

    async def close(self) -> None:  # Engine.close closes its forwarder
        return None


async def parsed(engine: Engine, body: dict[str, Any], path: str = CHAT) -> Exchange:
    ex = make_exchange("POST", path, body=body, engine=engine)
    await LLMParseStage(engine.services).request(ex)
    return ex


async def recovering(engine_factory: EngineFactory, forwarder: ScriptedForwarder, n: int = 2) -> Engine:
    engine = await engine_factory(upstream={"url": "http://127.0.0.1:9/v1"}, max_tokens_recovery=n)
    await engine.forwarder.close()  # the real one never sends anything here
    engine.forwarder = forwarder  # type: ignore[assignment]
    return engine


async def test_a_cut_off_answer_is_continued_and_stitched(engine_factory: EngineFactory) -> None:
    forwarder = ScriptedForwarder(
        (200, chat_completion("Once upon ", finish="length", prompt_tokens=50, completion_tokens=10)),
        (200, chat_completion("a time.", prompt_tokens=60, completion_tokens=5)),
    )
    engine = await recovering(engine_factory, forwarder)
    ex = await parsed(engine, chat_request())
    await MaxTokensRecoveryStage(engine.services).request(ex)
    assert [url for _, url, _ in forwarder.sent] == ["http://127.0.0.1:9/v1/chat/completions"] * 2
    continued = forwarder.sent[1][2]["messages"]
    assert continued[-2:] == [
        {"role": "assistant", "content": "Once upon "},
        {"role": "user", "content": CONTINUE_PROMPT},
    ]
    assert ex.answer is not None and ex.answer.status == 200 and ex.forwarded
    assert ex.answer.headers["X-Tripwire-Max-Tokens-Recoveries"] == "1"
    assert "Content-Length" not in ex.answer.headers and ex.answer.headers["X-Up"] == "1"
    stitched = orjson.loads(ex.answer.body)
    assert stitched["choices"][0]["message"]["content"] == "Once upon a time."
    assert stitched["choices"][0]["finish_reason"] == "stop"
    assert stitched["usage"] == {"prompt_tokens": 110, "completion_tokens": 15, "total_tokens": 125}
    assert (
        ex.result.text == "Once upon a time." and ex.result.usage.total_tokens == 125
    )  # read by after_forward


async def test_recovery_stops_after_n_continuations(engine_factory: EngineFactory) -> None:
    cut = (200, chat_completion("more ", finish="length"))
    forwarder = ScriptedForwarder(cut, cut)
    engine = await recovering(engine_factory, forwarder, n=1)
    ex = await parsed(engine, chat_request())
    await MaxTokensRecoveryStage(engine.services).request(ex)
    assert len(forwarder.sent) == 2
    assert orjson.loads(ex.answer.body)["choices"][0]["finish_reason"] == "length"  # type: ignore[union-attr]


async def test_a_whole_answer_is_relayed_as_it_came(engine_factory: EngineFactory) -> None:
    forwarder = ScriptedForwarder((200, chat_completion("Done.")))
    engine = await recovering(engine_factory, forwarder)
    ex = await parsed(engine, chat_request())
    await MaxTokensRecoveryStage(engine.services).request(ex)
    assert len(forwarder.sent) == 1
    assert ex.answer is not None and orjson.loads(ex.answer.body) == chat_completion("Done.")
    assert "X-Tripwire-Max-Tokens-Recoveries" not in ex.answer.headers


async def test_a_failed_first_request_is_a_502(engine_factory: EngineFactory) -> None:
    forwarder = ScriptedForwarder(aiohttp.ClientConnectionError("refused"))
    engine = await recovering(engine_factory, forwarder)
    ex = await parsed(engine, chat_request())
    await MaxTokensRecoveryStage(engine.services).request(ex)
    assert ex.answer is not None and ex.answer.status == 502
    assert ex.upstream_error is not None and ex.upstream_failed()
    assert ex.result is not None and ex.result.error is not None


async def test_calls_it_does_not_take(engine_factory: EngineFactory) -> None:
    forwarder = ScriptedForwarder()
    engine = await recovering(engine_factory, forwarder)
    stage = MaxTokensRecoveryStage(engine.services)
    for ex in (
        await parsed(engine, chat_request(stream=True)),  # streams are relayed as they are
        await parsed(engine, chat_request(n=2)),
        await parsed(engine, {"model": "gpt-4o", "input": "hi"}, "/v1/responses"),
        make_exchange("GET", "/v1/models", engine=engine),  # not parsed
    ):
        await stage.request(ex)
        assert ex.answer is None and not ex.forwarded
    assert forwarder.sent == []

    off = await engine_factory()  # max_tokens_recovery defaults to 0
    ex = await parsed(off, chat_request())
    await MaxTokensRecoveryStage(off.services).request(ex)
    assert ex.answer is None and not ex.forwarded
