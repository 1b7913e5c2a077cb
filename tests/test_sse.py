"""The SSE decoder: WHATWG field rules, every line ending, and byte-exact raw events at every split."""

from __future__ import annotations

import pytest

from proxy.sse import SSEDecoder, SSEEvent

OPENAI_STREAM = (
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"H\xc3\xa9llo"}}]}\n\n'
    b": keep-alive\n\n"
    b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":3}}\n\n'
    b"data: [DONE]\n\n"
)

ANTHROPIC_STREAM = (
    b'event: message_start\r\ndata: {"type":"message_start"}\r\n\r\n'
    b'event: ping\r\ndata: {"type": "ping"}\r\n\r\n'
    b'event: message_stop\r\ndata: {"type":"message_stop"}\r\n\r\n'
)


def decode_all(stream: bytes, cuts: list[int]) -> tuple[list[SSEEvent], list[SSEEvent]]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        events += decoder.feed(stream[start:cut])
        start = cut
    return events, decoder.flush()


def summary(events: list[SSEEvent]) -> list[tuple]:
    return [(e.event, e.data, e.id, e.retry, e.comments) for e in events]


@pytest.mark.parametrize("stream", [OPENAI_STREAM, ANTHROPIC_STREAM], ids=["openai", "anthropic"])
def test_every_split_gives_the_same_events_and_raw_bytes(stream: bytes) -> None:
    whole, tail = decode_all(stream, [])
    assert tail == []
    assert b"".join(e.raw for e in whole) == stream
    for cut in range(len(stream) + 1):
        events, tail = decode_all(stream, [cut])
        assert summary(events) == summary(whole), cut
        # a CRLF cut between CR and LF moves the LF into the next event's raw: bytes are never lost
        assert b"".join(e.raw for e in events + tail) == stream, cut
        if stream[cut - 1 : cut + 1] != b"\r\n":
            assert [e.raw for e in events] == [e.raw for e in whole], cut


def test_byte_by_byte() -> None:
    events, _ = decode_all(ANTHROPIC_STREAM, list(range(1, len(ANTHROPIC_STREAM))))
    assert [e.event for e in events] == ["message_start", "ping", "message_stop"]
    assert events[1].data == '{"type": "ping"}'


def test_openai_events() -> None:
    events, _ = decode_all(OPENAI_STREAM, [])
    assert [e.data for e in events][-1] == "[DONE]"
    assert "Héllo" in events[1].data
    assert events[2].data is None and events[2].comments == ("keep-alive",)
    assert events[0].type == "message"


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"], ids=["lf", "cr", "crlf"])
def test_line_endings_all_work(eol: bytes) -> None:
    stream = eol.join([b"event: e1", b"data: a", b"data: b", b"id: 7", b"retry: 1500", b"", b""])
    for cut in range(len(stream) + 1):
        events, tail = decode_all(stream, [cut])
        assert summary(events) == [("e1", "a\nb", "7", 1500, ())], cut
        assert b"".join(e.raw for e in events + tail) == stream


def test_cr_at_chunk_end_then_lf_is_one_line_ending() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: x\r") == []
    # the LF completes the CR; it is not a blank line, so no event yet
    assert decoder.feed(b"\n") == []
    events = decoder.feed(b"\r")
    assert [e.data for e in events] == ["x"]
    # this LF belongs to the previous CR: not a new (empty) event
    assert decoder.feed(b"\n") == []
    assert decoder.flush()[0].raw == b"\n"  # accounted for, in the next block's raw


def test_cr_cr_is_two_line_endings() -> None:
    events, _ = decode_all(b"data: x\r\rdata: y\r\r", [])
    assert [e.data for e in events] == ["x", "y"]


def test_field_rules() -> None:
    stream = (
        b"data\n"  # no colon: field with empty value
        b"data:no-space\n"
        b"data:  two spaces\n"
        b"id: bad\x00id\n"
        b"retry: 12a\n"
        b"unknown: field\n"
        b":comment without space\n"
        b"\n"
    )
    (event,), _ = decode_all(stream, [])
    assert event.data == "\nno-space\n two spaces"
    assert event.id is None
    assert event.retry is None
    assert event.comments == ("comment without space",)


def test_bom_is_skipped_once() -> None:
    stream = b"\xef\xbb\xbfdata: 1\n\n\xef\xbb\xbfdata: 2\n\n"
    events, _ = decode_all(stream, [2])
    assert events[0].data == "1"
    # a BOM later in the stream is part of a field name, so that line is an unknown field
    assert events[1].data is None
    assert b"".join(e.raw for e in events) == stream


def test_flush_returns_unterminated_tail() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a":1}\n\ndata: [DO') != []
    (tail,) = decoder.flush()
    assert tail.complete is False
    assert tail.data == "[DO"
    assert tail.raw == b"data: [DO"
    assert decoder.flush() == []


def test_flush_of_terminated_line_without_blank_line() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: [DONE]\n") == []
    (tail,) = decoder.flush()
    assert (tail.data, tail.complete, tail.raw) == ("[DONE]", False, b"data: [DONE]\n")


def test_large_line_in_many_chunks() -> None:
    payload = b"x" * 200_000
    stream = b"data: " + payload + b"\n\n"
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for i in range(0, len(stream), 100):
        events += decoder.feed(stream[i : i + 100])
    assert len(events) == 1 and events[0].data == payload.decode()
    assert events[0].raw == stream


def test_empty_chunk_is_a_no_op() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: x\r") == []
    assert decoder.feed(b"") == []
    assert [e.data for e in decoder.feed(b"\n\n")] == ["x"]
