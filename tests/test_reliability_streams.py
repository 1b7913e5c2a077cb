"""Reliability of relayed answers (issue 11, items 5, 8, 9, 10), through the real SDKs.

- 5: an answer compressed although Tripwire asked for `identity` is relayed as sent and recorded
  with its real usage (the observer decodes it);
- 8: the stream observer's memory does not follow the answer's size (many large chunks, one very
  long SSE line), measured with tracemalloc in this process, not with a clock;
- 9: a stream the upstream breaks (or drain cuts) ends abnormally for the client, which raises
  what it raises without Tripwire, and is recorded as an error the breaker counts;
- 10: LiteLLM's usage chunk shape (`"choices": [{"index": 0, "delta": {}}]`) is removed like
  OpenAI's when Tripwire asked for it, and a chunk with content or a finish_reason never is;
- issue 26 item 2: a compressed answer is decoded within bounds (a piece per decoder call, a slice
  per event-loop turn, `max_decoded_bytes` in all): a decompression bomb is relayed byte for byte,
  recorded truncated, and other agents' calls go on meanwhile.
"""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
import zlib
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from proxy import llm
from proxy.constants import TRUNCATED_MARKER
from proxy.dialects import anthropic as anthropic_dialect
from proxy.dialects import openai_chat, openai_responses
from proxy.dialects.base import LLMRequest, Usage
from proxy.forward import ObserverFeed, content_codings
from proxy.pricing import Pricing
from proxy.sse import BoundedText, SSEDecoder, SSEEvent
from proxy.stages import llm_parse
from tests.conftest import AGENT_KEY, StartTripwire
from tests.fakes import Reply

MESSAGES = [{"role": "user", "content": "hi"}]
ONE_FAILURE_OPENS = {"circuit_breaker": {"open_after_failures": 1, "cooldown_seconds": 30}}
MiB = 1024 * 1024


# one run for a test's calls: each sends the same first request, which alone would start a run of
# its own (SPEC §3)
SESSION = {"X-Tripwire-Session": "reliability"}


def oai(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=base + "/v1", api_key=AGENT_KEY, max_retries=0, default_headers=SESSION
    )


def claude(base: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base, api_key=AGENT_KEY, max_retries=0, default_headers=SESSION)


def llm_calls(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["payload"] for e in events if e["event_type"] == "LLM_CALL"]


async def raw_post(url: str, body: dict[str, Any]) -> tuple[dict[str, str], bytes]:
    """The answer's bytes and headers exactly as they came over the wire (nothing decoded)."""
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        async with http.post(
            url, json=body, headers={"Authorization": f"Bearer {AGENT_KEY}", **SESSION}
        ) as r:
            return dict(r.headers), await r.read()


# ---- 5: answers compressed without being asked -------------------------------------------------


@pytest.mark.parametrize("coding", ["gzip", "deflate", "deflate-raw", "br"])
async def test_compressed_answer_is_relayed_as_sent_and_recorded_with_its_usage(
    start_tripwire: StartTripwire, fake_upstream, coding: str
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="squeezed", prompt_tokens=41, completion_tokens=9, content_encoding=coding)
    tw = await start_tripwire(upstream={"url": url})
    resp = await oai(tw.url).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert resp.choices[0].message.content == "squeezed"
    # byte for byte, headers included, as the upstream sent them
    body = {"model": "gpt-4o-mini", "messages": MESSAGES}
    direct_headers, direct = await raw_post(url + "/v1/chat/completions", body)
    via_headers, via = await raw_post(tw.url + "/v1/chat/completions", body)
    assert via == direct and via_headers["Content-Encoding"] == direct_headers["Content-Encoding"]
    assert via_headers["Content-Length"] == direct_headers["Content-Length"] == str(len(direct))
    await tw.flush()
    calls = llm_calls(tw.events())
    assert len(calls) == 2
    expected = Pricing().cost(Usage(41, 9, 50), ["gpt-4o-mini"]).cost_usd
    for p in calls:
        assert p["status"] == "ok" and p["error"] is None
        assert p["usage"] == {"prompt_tokens": 41, "completion_tokens": 9, "total_tokens": 50}
        assert p["response"]["text"] == "squeezed"
        assert p["cost_usd"] == pytest.approx(expected) and expected > 0
    # and Tripwire asked for no coding (without the header, any coding would do: RFC 9110 §12.5.3)
    assert fake.calls("/v1/chat/completions")[0].headers["Accept-Encoding"] == "identity"


def _decompress(coding: str, data: bytes) -> bytes:
    if coding == "br":
        import brotli  # a dev dependency

        return bytes(brotli.decompress(data))
    return gzip.decompress(data)


@pytest.mark.parametrize("coding", ["gzip", "br"])
async def test_compressed_streams_are_read_for_the_trace(
    start_tripwire: StartTripwire, fake_upstream, coding: str
) -> None:
    """Anthropic's stream relayed byte for byte, Chat's rewritten stream (the usage chunk Tripwire
    asked for removed) compressed again with the same coding; both recorded with their usage."""
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, llm={"anthropic": {"url": url}})
    # Anthropic: nothing is rewritten, so the compressed bytes go through exactly as sent
    fake.default = Reply(text="zipped claude", prompt_tokens=30, completion_tokens=5, content_encoding=coding)
    async with claude(tw.url + "/llm/anthropic").messages.stream(
        model="claude-sonnet-4-5", max_tokens=50, messages=MESSAGES
    ) as stream:
        final = await stream.get_final_message()
    assert final.content[0].text == "zipped claude"
    body = {"model": "claude-sonnet-4-5", "max_tokens": 50, "messages": MESSAGES, "stream": True}
    direct_headers, direct = await raw_post(url + "/v1/messages", body)
    via_headers, via = await raw_post(tw.url + "/llm/anthropic/v1/messages", body)
    assert via == direct and via_headers["Content-Encoding"] == coding
    assert b"message_stop" in _decompress(coding, via)
    # Chat with the usage chunk Tripwire asked for: it is still removed (the stream is compressed
    # again); what the SDK parses is what it parses direct
    fake.default = Reply(text="zipped gpt", prompt_tokens=20, completion_tokens=4, content_encoding=coding)
    kw: dict[str, Any] = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}
    direct_chunks = [c.model_dump() async for c in await oai(url).chat.completions.create(**kw)]
    via_chunks = [c.model_dump() async for c in await oai(tw.url).chat.completions.create(**kw)]
    assert via_chunks == direct_chunks
    assert "".join(c["choices"][0]["delta"]["content"] or "" for c in via_chunks) == "zipped gpt"
    await tw.flush()
    calls = llm_calls(tw.events())
    assert [(p["status"], p["usage"]["total_tokens"], p["stream"]) for p in calls] == [
        ("ok", 35, True),
        ("ok", 35, True),
        ("ok", 24, True),
    ]
    assert calls[0]["response"]["text"] == "zipped claude" and calls[2]["response"]["text"] == "zipped gpt"
    assert "usage_estimated" not in calls[2]


def test_the_observer_feed_decodes_for_the_observer_and_relays_the_bytes() -> None:
    """Every split of a gzip stream, with and without a rewriting observer; a corrupt one is relayed."""
    plain = b"".join(f"data: {{'n': {n}}}\n\n".encode() for n in range(200))
    packed = gzip.compress(plain) + gzip.compress(b"data: tail\n\n")  # two members, as allowed

    class Keep:
        rewrites = False

        def __init__(self) -> None:
            self.seen = bytearray()

        def feed(self, chunk: bytes) -> bytes:
            self.seen += chunk
            return chunk

    class DropTail(Keep):
        rewrites = True

        def feed(self, chunk: bytes) -> bytes:  # drops the second member's event
            start = len(self.seen)
            self.seen += chunk
            return chunk[: max(0, len(plain) - start)]

    assert content_codings(
        CIMultiDict([("Content-Encoding", "gzip, identity"), ("content-encoding", "BR")])
    ) == [
        "gzip",
        "br",
    ]
    for cut in range(0, len(packed), 7):
        keep, drop = Keep(), DropTail()
        taps = [ObserverFeed(keep, ["gzip"]), ObserverFeed(drop, ["gzip"])]
        outs = [t.feed(packed[:cut]) + t.feed(packed[cut:]) + t.flush() for t in taps]
        assert outs[0] == packed and bytes(keep.seen) == plain + b"data: tail\n\n"
        assert zlib.decompress(outs[1], zlib.MAX_WBITS | 16) == plain  # re-compressed, tail dropped
    broken = ObserverFeed(Keep(), ["gzip"])
    assert broken.feed(b"not gzip at all") == b"not gzip at all"
    assert broken.decode_error is not None and broken.feed(b"more") == b"more"
    unknown = Keep()
    assert (
        ObserverFeed(unknown, ["zstd-unknown"]).feed(b"\x28\xb5") == b"\x28\xb5"
        and unknown.seen == b"\x28\xb5"
    )


# ---- issue 26 item 2: decompression bombs ----------------------------------------------------------

# what the observer may be handed: one decoder call's output (64 KiB; brotli rounds up to its next
# output block), and what it may read in one event-loop turn (a slice of 256 KiB, twice: a task that
# only yields and the relay may each run once in one loop iteration, in either order)
PIECE_BOUND = 128 * 1024
TURN_BOUND = 1 * MiB


def bomb(coding: str, decoded: int) -> bytes:
    """`decoded` bytes (whole MiB) of zeros in one gzip member or br stream, made in well under a
    second: deflate blocks after a full flush do not refer back, so one MiB's block is repeated."""
    zeros = bytes(MiB)
    if coding == "br":
        import brotli  # a dev dependency

        enc = brotli.Compressor(quality=1)
        return b"".join(enc.process(zeros) for _ in range(decoded // MiB)) + enc.finish()
    deflate = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    head = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)  # the gzip header, the first MiB
    block = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(decoded // MiB):
        crc = zlib.crc32(zeros, crc)
    end = deflate.flush(zlib.Z_FINISH)[:-8] + crc.to_bytes(4, "little") + decoded.to_bytes(4, "little")
    return head + block * (decoded // MiB - 1) + end


def compress(coding: str, plain: bytes) -> bytes:
    if coding == "br":
        import brotli

        return bytes(brotli.compress(plain))
    return gzip.compress(plain) if coding == "gzip" else zlib.compress(plain)


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br"])
def test_the_codec_decodes_lazily_in_bounded_pieces(coding: str) -> None:
    from proxy.content_coding import Codec

    packed = zlib.compress(bytes(64 * MiB), 9) if coding == "deflate" else bomb(coding, 64 * MiB)
    if coding == "gzip":
        assert gzip.decompress(packed) == bytes(64 * MiB)  # one valid member
    pieces = Codec([coding]).decode(packed)
    first = next(pieces)  # one piece, without decoding the rest
    sizes = [len(first)] + [len(p) for p in pieces]
    assert sum(sizes) == 64 * MiB and max(sizes) <= PIECE_BOUND  # before: br in one piece of 64 MiB
    # byte for byte, whatever the split of the input
    plain = b"".join(f"data: {n}\n\n".encode() for n in range(20000))
    packed = compress(coding, plain)
    codec = Codec([coding])
    cuts = range(0, len(packed), 999)
    assert b"".join(b"".join(codec.decode(packed[i : i + 999])) for i in cuts) == plain


def test_concatenated_gzip_members_larger_than_a_piece() -> None:
    """A member that ends in a call whose input was left over from the previous one (zlib then keeps
    the rest in unconsumed_tail too): before, that rest was decoded twice, growing each member."""

    class Keep:
        rewrites = False

        def __init__(self) -> None:
            self.seen = bytearray()

        def feed(self, chunk: bytes) -> bytes:
            self.seen += chunk
            return chunk

    plain = [bytes(300 * 1024), b"x" * 200_000, b"tail"]
    packed = b"".join(gzip.compress(p) for p in plain)
    keep = Keep()
    tap = ObserverFeed(keep, ["gzip"])
    assert tap.feed(packed) + tap.flush() == packed and bytes(keep.seen) == b"".join(plain)


def test_the_observer_feed_reads_a_bomb_a_slice_at_a_time_up_to_its_limit() -> None:
    from proxy.forward import DECODE_SLICE

    class Keep:
        rewrites = False

        def __init__(self) -> None:
            self.sizes: list[int] = []

        def feed(self, chunk: bytes) -> bytes:
            self.sizes.append(len(chunk))
            return chunk

    packed = bomb("gzip", 64 * MiB)
    keep = Keep()
    tap = ObserverFeed(keep, ["gzip"], limit=3 * MiB)
    assert tap.feed(packed) == packed  # the client's bytes, as they came
    assert tap.backlog and sum(keep.sizes) <= DECODE_SLICE + PIECE_BOUND  # before: all 64 MiB at once
    turns = 1
    while tap.backlog:
        before = sum(keep.sizes)
        assert tap.resume() == b""
        assert sum(keep.sizes) - before <= DECODE_SLICE + PIECE_BOUND
        turns += 1
    assert tap.truncated and sum(keep.sizes) == 3 * MiB and turns <= 3 * MiB // DECODE_SLICE + 1
    assert tap.feed(b"more") == b"more" and tap.flush() == b"" and sum(keep.sizes) == 3 * MiB


@asynccontextmanager
async def bomb_upstream(body: bytes, coding: str, first: int) -> AsyncIterator[tuple[str, asyncio.Event]]:
    """An upstream on 127.0.0.1 answering chat completions with `body` (Content-Encoding `coding`):
    its first `first` bytes, then the rest once the event is set."""
    go_on = asyncio.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        headers = {"Content-Type": "application/json", "Content-Encoding": coding}
        resp = web.StreamResponse(headers=headers)
        resp.content_length = len(body)
        await resp.prepare(request)
        await resp.write(body[:first])
        await go_on.wait()
        await resp.write(body[first:])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/"), go_on
    finally:
        go_on.set()
        await server.close()


@pytest.mark.parametrize("coding", ["gzip", "br"])
async def test_a_decompression_bomb_is_relayed_whole_and_recorded_truncated(
    start_tripwire: StartTripwire, fake_upstream, monkeypatch: pytest.MonkeyPatch, coding: str
) -> None:
    """~0.5 MB that inflates to 512 MiB: the observer reads at most a slice per loop turn and
    `max_decoded_bytes` in all (before: the whole answer, tens of MiB in one turn), the client gets
    the upstream's bytes, the call is recorded `__TRUNCATED__`, another agent's call goes through."""
    fake, url = fake_upstream
    fake.default = Reply(text="the other agent's answer")
    packed = bomb(coding, 512 * MiB)
    turns = 0

    async def tick() -> None:  # counts event-loop turns (a task that only yields)
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    class Recording(llm.BodyCollector):
        made: list[Recording] = []

        def __init__(self, limit: int) -> None:
            super().__init__(limit)
            self.per_turn: Counter[int] = Counter()
            self.largest = 0
            Recording.made.append(self)

        def feed(self, chunk: bytes) -> bytes:
            self.per_turn[turns] += len(chunk)
            self.largest = max(self.largest, len(chunk))
            return super().feed(chunk)

    monkeypatch.setattr(llm_parse, "BodyCollector", Recording)  # where the parse stage makes one
    body = {"model": "gpt-4o-mini", "messages": MESSAGES}
    async with bomb_upstream(packed, coding, first=len(packed) // 2) as (bomb_url, go_on):
        tw = await start_tripwire(upstream={"url": url}, llm={"bomb": {"url": bomb_url}})
        ticker = asyncio.create_task(tick())
        try:
            async with aiohttp.ClientSession(auto_decompress=False) as http:
                bombed = asyncio.create_task(
                    http.post(
                        tw.url + "/llm/bomb/v1/chat/completions",
                        json=body,
                        headers={"Authorization": f"Bearer {AGENT_KEY}", "X-Tripwire-Agent": "bombed"},
                    )
                )
                for _ in range(3000):  # until Tripwire has read the first half (the upstream waits)
                    if Recording.made and Recording.made[0].size > 0 and turns > 0:
                        break
                    await asyncio.sleep(0.01)
                # another agent's call completes while the bomb's answer is being relayed
                other = openai.AsyncOpenAI(
                    base_url=tw.url + "/v1",
                    api_key=AGENT_KEY,
                    max_retries=0,
                    default_headers={"X-Tripwire-Agent": "other"},
                )
                answer = await other.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
                assert answer.choices[0].message.content == "the other agent's answer"
                go_on.set()  # (the bomb's upstream waited for this: its answer was still open)
                async with await bombed as r:
                    assert r.status == 200 and r.headers["Content-Encoding"] == coding
                    relayed = await r.read()
        finally:
            ticker.cancel()
        assert relayed == packed  # byte for byte, as the upstream sent it
        observer = Recording.made[0]
        # the decoder's output held: a piece at a time, a slice or two per turn, the limit in all
        # (16 MiB: the default max_decoded_bytes)
        held = {"piece": observer.largest, "turn": max(observer.per_turn.values()), "all": observer.size}
        assert held["piece"] <= PIECE_BOUND and held["turn"] <= TURN_BOUND and held["all"] <= 16 * MiB, held
        await tw.flush()
        runs = {tw.events(r)[0]["payload"]["agent_name"]: tw.events(r) for r in tw.run_ids()}
        (p,) = llm_calls(runs["bombed"])
        assert p["response"]["text"] == TRUNCATED_MARKER and p["status"] == "ok"
        assert p["usage_estimated"] is True and p["http_status"] == 200
        assert not [e for e in runs["bombed"] if e["event_type"] == "ERROR"]
        (q,) = llm_calls(runs["other"])
        assert q["status"] == "ok" and q["response"]["text"] == "the other agent's answer"


@pytest.mark.parametrize("coding", ["gzip", "br"])
async def test_compressed_streams_read_a_slice_at_a_time_are_recorded_whole(
    start_tripwire: StartTripwire, fake_upstream, coding: str
) -> None:
    """Events that each decode to more than a slice, below the limit: read over several turns, the
    stream is recorded with its exact usage, rewritten (usage chunk removed) or relayed as sent."""
    fake, url = fake_upstream
    fake.default = Reply(
        text="big ",
        prompt_tokens=21,
        completion_tokens=5000,
        content_encoding=coding,
        bulk_chunks=6,
        bulk_chunk_chars=600 * 1024,  # each event more than a slice (256 KiB)
    )
    tw = await start_tripwire(upstream={"url": url})
    kw: dict[str, Any] = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}
    asked = {**kw, "stream_options": {"include_usage": True}}
    for request in (kw, asked):  # Tripwire asks for usage and removes it / the client asked for it
        direct = [c.model_dump() async for c in await oai(url).chat.completions.create(**request)]
        via = [c.model_dump() async for c in await oai(tw.url).chat.completions.create(**request)]
        assert via == direct
    await tw.flush()
    calls = llm_calls(tw.events())
    assert [(p["status"], p["usage"]["total_tokens"]) for p in calls] == [("ok", 5021), ("ok", 5021)]
    assert all("usage_estimated" not in p and p["response"]["text"].startswith("big xxx") for p in calls)


async def test_a_compressed_stream_past_the_limit_is_recorded_truncated(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    """Past `max_decoded_bytes` a stream the client reads as sent is recorded from its start,
    `__TRUNCATED__`, usage estimated, not an error; a rewritten one is read whole (its output is
    what the client gets)."""
    fake, url = fake_upstream
    fake.default = Reply(
        text="long ",
        prompt_tokens=8,
        completion_tokens=900,
        content_encoding="gzip",
        bulk_chunks=8,
        bulk_chunk_chars=MiB // 2,
    )
    tw = await start_tripwire(upstream={"url": url}, max_decoded_bytes=MiB)
    kw: dict[str, Any] = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}
    asked = {**kw, "stream_options": {"include_usage": True}}
    for request in (asked, kw):
        direct = [c.model_dump() async for c in await oai(url).chat.completions.create(**request)]
        via = [c.model_dump() async for c in await oai(tw.url).chat.completions.create(**request)]
        assert via == direct and len(via) > 8
    await tw.flush()
    cut, whole = llm_calls(tw.events())
    assert cut["status"] == "ok" and cut["error"] is None and cut["usage_estimated"] is True
    text = cut["response"]["text"]
    assert text.startswith("long xxx") and text.endswith(TRUNCATED_MARKER)
    assert not [e for e in tw.events() if e["event_type"] == "ERROR"], "not the upstream's failure"
    assert whole["status"] == "ok" and whole["usage"]["total_tokens"] == 908
    assert "usage_estimated" not in whole


# ---- 8: bounded memory ---------------------------------------------------------------------------


async def measure_peak(url: str, body: dict[str, Any]) -> tuple[int, int, bytes]:
    """Stream `body` through `url` with a raw client that keeps nothing: (peak bytes, bytes, tail).

    A first small call warms Tripwire up (the one-off set-up of a first call is slow under tracemalloc
    and is not what is measured); the fake upstream answers it with its scripted `replies` first.
    """
    async with aiohttp.ClientSession(headers=SESSION) as http:
        async with http.post(url, json=body) as r:
            assert r.status == 200 and (await r.read()).endswith(b"data: [DONE]\n\n")
    received = 0
    tail = b""
    tracemalloc.start()
    try:
        async with aiohttp.ClientSession(headers=SESSION) as http:
            async with http.post(url, json=body) as r:
                assert r.status == 200
                async for chunk in r.content.iter_any():
                    received += len(chunk)
                    tail = (tail + chunk)[-4096:]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, received, tail


async def test_a_200_mb_stream_keeps_the_observer_memory_bounded(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    chunks, size = 3200, 64 * 1024  # 200 MiB of content in 64 KiB deltas
    fake.replies = [Reply(text="warm-up")]
    fake.default = Reply(
        text="start ", prompt_tokens=12, completion_tokens=3456, bulk_chunks=chunks, bulk_chunk_chars=size
    )
    tw = await start_tripwire(upstream={"url": url})
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}  # filtered: no include_usage
    peak, received, tail = await measure_peak(tw.url + "/v1/chat/completions", body)
    assert received > chunks * size and tail.endswith(b"data: [DONE]\n\n")
    assert b'"usage": {' not in tail  # the usage chunk Tripwire asked for was removed
    # before: the observer kept all 200 MiB of text (peak > 200 MiB); the relay itself needs a few MiB
    assert peak < 48 * MiB, f"peak {peak / MiB:.0f} MiB"
    await tw.flush()
    _, p = llm_calls(tw.events())  # after the warm-up call
    assert p["status"] == "ok" and p["usage"] == {
        "prompt_tokens": 12,
        "completion_tokens": 3456,
        "total_tokens": 3468,
    }
    text = p["response"]["text"]
    assert text.startswith("start xxx") and text.endswith(TRUNCATED_MARKER)
    assert len(text.encode()) <= tw.engine.settings.max_field_bytes


async def test_one_very_long_sse_line_is_relayed_and_never_buffered_whole(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    line = 96 * MiB
    fake.replies = [Reply(text="warm-up")]
    fake.default = Reply(text="before ", prompt_tokens=7, completion_tokens=11, long_line_chars=line)
    tw = await start_tripwire(upstream={"url": url})
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}
    peak, received, tail = await measure_peak(tw.url + "/v1/chat/completions", body)
    assert received > line and tail.endswith(b"data: [DONE]\n\n")
    # before: the whole line was held, copied and decoded (a peak of several times its size)
    assert peak < 48 * MiB, f"peak {peak / MiB:.0f} MiB"
    await tw.flush()
    _, p = llm_calls(tw.events())  # after the warm-up call
    assert p["status"] == "ok" and p["usage"]["total_tokens"] == 18
    assert p["response"]["text"] == "before " + TRUNCATED_MARKER  # the skipped line is marked


async def test_the_openai_sdk_reads_a_long_line_through_tripwire(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    """An event over the observer's bound still reaches the SDK whole, byte for byte."""
    fake, url = fake_upstream
    fake.default = Reply(text="a", long_line_chars=3 * MiB + 5)
    tw = await start_tripwire(upstream={"url": url})
    kw: dict[str, Any] = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}
    direct = [c.model_dump() async for c in await oai(url).chat.completions.create(**kw)]
    via = [c.model_dump() async for c in await oai(tw.url).chat.completions.create(**kw)]
    assert via == direct and via[2]["choices"][0]["delta"]["content"] == "y" * (3 * MiB + 5)


def decode_pieces(stream: bytes, cuts: list[int], bound: int) -> list[SSEEvent]:
    decoder = SSEDecoder(bound)
    events: list[SSEEvent] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        events += decoder.feed(stream[start:cut])
        start = cut
    return events + decoder.flush()


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_decoder_hands_out_oversized_events_in_pieces(eol: bytes) -> None:
    small = b"event: a" + eol + b"data: 1" + eol + eol
    big = b"event: big" + eol + b"data: " + b"z" * 300 + eol + b"data: more" + eol + eol
    stream = small + big + small.replace(b"1", b"2")
    for size in (1, 7, 40):  # bytes per chunk: the decoder holds at most the bound plus one chunk
        for offset in range(size):
            events = decode_pieces(stream, list(range(offset, len(stream), size)), bound=64)
            assert b"".join(e.raw for e in events) == stream, (size, offset)  # every byte, in order
            whole = [(e.event, e.data) for e in events if not e.oversized and e.data is not None]
            assert whole == [("a", "1"), ("a", "2")], (size, offset)
            pieces = [e for e in events if e.oversized]
            assert pieces and all(e.event == "big" and e.data is None for e in pieces), (size, offset)
            assert [e.complete for e in pieces] == [False] * (len(pieces) - 1) + [True], (size, offset)
            assert max(len(e.raw) for e in pieces) <= 64 + size, (size, offset)


def test_decoder_without_a_bound_and_an_unfinished_oversized_event() -> None:
    data = b"data: " + b"q" * 5000 + b"\n\n"
    (event,) = decode_pieces(data, [10], bound=None)  # type: ignore[arg-type]
    assert event.data == "q" * 5000 and not event.oversized
    events = decode_pieces(data[:-2], [100, 2000], bound=1000)
    assert (
        all(e.oversized and not e.complete for e in events) and b"".join(e.raw for e in events) == data[:-2]
    )


def test_bounded_text() -> None:
    text = BoundedText(10)
    for piece in ["abcd", "efgh", "ijkl", "mnop"]:
        text.append(piece)
    assert "".join(text) == "abcdefghij" and text.dropped == 6
    many = BoundedText(100_000)
    for _ in range(5000):
        many.append("ab")
    assert "".join(many) == "ab" * 5000 and len(list(many)) < 1024


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    return (f"event: {event}\n".encode() if event else b"") + b"data: " + orjson.dumps(data) + b"\n\n"


def test_responses_stream_with_a_final_event_too_big_to_parse() -> None:
    """The final event repeats the whole output: past the bound, usage comes from its tail."""
    req = openai_responses.parse_request({"model": "gpt-4o", "input": "x", "stream": True})
    big_text = "w" * (2 * MiB)
    response = {"id": "resp_1", "model": "gpt-4o", "status": "in_progress", "output": [], "usage": None}
    done = {
        **response,
        "status": "completed",
        "output": [{"type": "message", "content": [{"type": "output_text", "text": big_text}]}],
        "usage": {
            "input_tokens": 5,
            "input_tokens_details": {"cached_tokens": 2},
            "output_tokens": 9,
            "total_tokens": 14,
        },
        "user": None,
    }
    for with_event_lines in (True, False):
        acc = openai_responses.StreamAccumulator(req)
        acc.limit_text(1000)
        stream = sse(
            {"type": "response.created", "response": response},
            "response.created" if with_event_lines else None,
        )
        for _ in range(2048):
            stream += sse({"type": "response.output_text.delta", "output_index": 0, "delta": "w" * 1024})
        stream += sse(
            {"type": "response.completed", "response": done},
            "response.completed" if with_event_lines else None,
        )
        for start in range(0, len(stream), 65536):
            acc.feed(stream[start : start + 65536])
        result = acc.finish(True)
        assert result.complete and result.error is None and result.stop_reason == "completed"
        assert result.usage == Usage(5, 9, 14, cached_tokens=2)
        assert result.text == "w" * 1000 and result.response_id == "resp_1"


def test_anthropic_text_and_tool_input_are_capped() -> None:
    req = anthropic_dialect.parse_request(
        {"model": "c", "max_tokens": 5, "messages": MESSAGES, "stream": True}
    )
    acc = anthropic_dialect.StreamAccumulator(req)
    acc.limit_text(100)
    stream = sse(
        {"type": "message_start", "message": {"id": "m", "model": "c", "usage": {"input_tokens": 3}}}
    )
    stream += sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    for _ in range(50):
        stream += sse(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "t" * 10}}
        )
    stream += sse(
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "tu", "name": "f", "input": {}},
        }
    )
    stream += sse(
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"a": "' + "b" * 500 + '"}'},
        }
    )
    stream += sse(
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "c" * (MiB + 10)}}
    )
    stream += sse(
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 77}}
    )
    stream += sse({"type": "message_stop"})
    acc.feed(stream)
    result = acc.finish(True)
    assert result.complete and result.usage == Usage(3, 77, 80)
    assert result.text == "t" * 100  # the oversized delta's marker fell beyond the cap too
    assert result.tool_calls[0].arguments == '{"a": "' + "b" * 93  # cut: kept as the raw string


# ---- 9: broken streams end abnormally ----------------------------------------------------------


async def consume_openai(base: str) -> str:
    stream = await oai(base).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


async def test_a_broken_stream_raises_in_the_openai_sdk_as_it_does_direct(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="this stream will break in the middle", break_after_chunks=3)
    tw = await start_tripwire(upstream={"url": url}, guards=ONE_FAILURE_OPENS)
    with pytest.raises(Exception) as direct:
        await consume_openai(url)
    with pytest.raises(Exception) as via:
        await consume_openai(tw.url)  # before: a truncated answer that looked complete
    assert type(via.value) is type(direct.value)
    await tw.flush()
    (p,) = llm_calls(tw.events())
    assert p["status"] == "error"
    (error,) = [e["payload"] for e in tw.events() if e["event_type"] == "ERROR"]
    assert "broke" in error["message"], "an upstream failure"
    # the breaker counted it: the next call is refused at once
    fake.default = Reply(text="fine")
    with pytest.raises(openai.RateLimitError) as refused:
        await oai(tw.url).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert refused.value.response.headers["X-Tripwire-Guard"] == "circuit_breaker"


async def test_a_broken_stream_raises_in_the_anthropic_sdk_as_it_does_direct(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="a claude stream that breaks", break_after_chunks=3)
    tw = await start_tripwire(llm={"anthropic": {"url": url}})

    async def consume(base: str) -> None:
        async with claude(base).messages.stream(
            model="claude-sonnet-4-5", max_tokens=9, messages=MESSAGES
        ) as s:
            await s.get_final_message()

    with pytest.raises(Exception) as direct:
        await consume(url)
    with pytest.raises(Exception) as via:
        await consume(tw.url + "/llm/anthropic")
    assert type(via.value) is type(direct.value)
    await tw.flush()
    (p,) = llm_calls(tw.events())
    assert p["status"] == "error"


async def test_drain_cutting_a_stream_ends_it_abnormally(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="an answer the upstream never finishes", break_after_chunks=3)
    with pytest.raises(Exception) as direct:  # how the SDK sees a stream that breaks
        await consume_openai(url)
    fake.default = Reply(text="an answer the upstream never finishes", hang_after_chunks=3)
    tw = await start_tripwire(upstream={"url": url})
    stream = await oai(tw.url).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
    first = await stream.__anext__()
    assert first.choices[0].delta.role == "assistant"
    await tw.engine.drain(0)  # grace over at once: the stream still open is cut
    with pytest.raises(Exception) as via:  # before: the stream ended as if complete
        async for _ in stream:
            pass
    assert type(via.value) is type(direct.value)
    await tw.flush()
    (p,) = llm_calls(tw.events())
    assert p["status"] == "error" and "shut down" in p["error"]["message"]
    assert not [e for e in tw.events() if e["event_type"] == "ERROR"], "drain is not the upstream's failure"


# ---- 10: LiteLLM's usage chunk -----------------------------------------------------------------


@pytest.mark.parametrize(
    "choices",
    [
        [{"index": 0, "delta": {}}],  # LiteLLM's proxy
        [{"index": 0, "delta": {"content": None, "role": None, "tool_calls": None}, "finish_reason": None}],
        None,  # OpenAI's own `"choices": []`
    ],
    ids=["litellm", "litellm-nulls", "openai"],
)
async def test_the_usage_chunk_tripwire_asked_for_is_removed_in_every_shape(
    start_tripwire: StartTripwire, fake_upstream, choices: list[dict[str, Any]] | None
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(
        text="counted answer", prompt_tokens=13, completion_tokens=6, usage_chunk_choices=choices
    )
    tw = await start_tripwire(upstream={"url": url})
    kw: dict[str, Any] = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}
    direct = [c.model_dump() async for c in await oai(url).chat.completions.create(**kw)]
    via = [c.model_dump() async for c in await oai(tw.url).chat.completions.create(**kw)]
    assert via == direct  # before (LiteLLM's shape): one extra chunk, carrying the usage
    assert fake.seen[-1].body["stream_options"] == {"include_usage": True}
    # a client that asked for usage gets the chunk as the upstream sent it
    asked = {**kw, "stream_options": {"include_usage": True}}
    direct = [c.model_dump() async for c in await oai(url).chat.completions.create(**asked)]
    via = [c.model_dump() async for c in await oai(tw.url).chat.completions.create(**asked)]
    assert via == direct and via[-1]["usage"]["total_tokens"] == 19
    await tw.flush()
    calls = llm_calls(tw.events())
    assert [p["usage"]["total_tokens"] for p in calls] == [19, 19] and "usage_estimated" not in calls[0]


@pytest.mark.parametrize(
    "choice",
    [
        {"index": 0, "delta": {}, "finish_reason": "stop"},
        {"index": 0, "delta": {"content": "!"}},
        {"index": 0, "delta": {"role": "assistant"}},
        {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}},
        {"index": 0, "delta": {}, "logprobs": {"content": [{"token": "a"}]}},
    ],
)
def test_a_chunk_with_content_or_a_finish_reason_is_never_removed(choice: dict[str, Any]) -> None:
    req: LLMRequest = openai_chat.parse_request({"model": "m", "messages": MESSAGES, "stream": True})
    acc = openai_chat.StreamAccumulator(req)
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    kept = sse({"id": "c", "choices": [choice], "usage": usage})
    dropped = sse({"id": "c", "choices": [{"index": 0, "delta": {}}], "usage": usage})
    assert acc.feed(kept + dropped + b"data: [DONE]\n\n") == kept + b"data: [DONE]\n\n"
    assert acc.finish(True).usage == Usage(1, 2, 3)


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_the_filter_relays_oversized_events_byte_for_byte(
    monkeypatch: pytest.MonkeyPatch, eol: bytes
) -> None:
    """Every split, every line ending: all bytes but the usage chunk's reach the client, in order."""
    monkeypatch.setattr(openai_chat, "MAX_EVENT_BYTES", 160)
    req = openai_chat.parse_request({"model": "m", "messages": MESSAGES, "stream": True})

    def event(data: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(data) + eol + eol

    usage = {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}
    head = event({"id": "c", "choices": [{"index": 0, "delta": {"content": "Hi"}}]})
    big = event({"id": "c", "choices": [{"index": 0, "delta": {"content": "z" * 400}}]})
    usage_chunk = event({"id": "c", "choices": [{"index": 0, "delta": {}}], "usage": usage})
    done = b"data: [DONE]" + eol + eol
    stream = head + big + usage_chunk + done
    for size in (1, 5, 33, 70):
        for offset in range(0, size, 2):
            acc = openai_chat.StreamAccumulator(req)
            cuts = [0, *range(offset, len(stream), size), len(stream)]
            out = b"".join(acc.feed(stream[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)) + acc.flush()
            assert out == head + big + done, (size, offset)
            result = acc.finish(True)
            assert result.complete and result.usage == Usage(4, 5, 9), (size, offset)
            assert result.text == "Hi" + TRUNCATED_MARKER, (size, offset)
