"""Which call an upstream event on a Responses socket belongs to (proxy/websocket/matching.py), with
no socket: the relay feeds `StreamQueues.observe` the event's text. The whole path through real sockets is
tests/test_websocket.py's."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.websocket.matching import HEAD_PARSE_LIMIT, StreamQueues, classify, event_head


class Call:
    """A call as matching sees it: what it was fed, and how it settled."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = False
        self.response_id: str | None = None
        self.fed: list[str | None] = []
        self.failed: int | None = None
        self.settled: dict[str, Any] | None = None

    def feed(self, text: str, kind: str | None, response_id: str | None) -> None:
        self.started = self.started or bool(kind and kind.startswith("response."))
        self.response_id = self.response_id or response_id
        self.fed.append(kind)

    def fail_with(self, text: str, status: int | None) -> None:
        self.failed = status
        self.settle()

    def settle(self, *, upstream_error: str | None = None, reason: str | None = None) -> None:
        if self.settled is None:
            self.settled = {"upstream_error": upstream_error, "reason": reason}


def event(kind: str, stream_id: str | None = None, rid: str | None = None, **extra: Any) -> str:
    data: dict[str, Any] = {"type": kind, **extra}
    if stream_id is not None:
        data["stream_id"] = stream_id
    if rid is not None:
        data["response"] = {"id": rid}
    return orjson.dumps(data).decode()


def test_a_small_event_is_parsed_whole() -> None:
    assert event_head(event("response.created", "s1", "resp_1")) == ("response.created", "s1", None, "resp_1")
    assert event_head(event("error", status=429)) == ("error", None, 429, None)
    assert event_head('{"type": "error", "status": true}') == ("error", None, None, None)
    assert event_head("not json") == (None, None, None, None)
    assert event_head("[1]") == (None, None, None, None)


def test_a_large_event_is_read_by_its_head_and_tail() -> None:
    big = event("response.completed", rid="resp_1", output="x" * HEAD_PARSE_LIMIT)
    big = big[:-1] + ', "stream_id": "s\\"2"}'  # the lane named at the end, with an escape
    assert event_head(big) == ("response.completed", 's\\"2', None, None)
    error = '{"type": "error", "status": 503, "pad": "' + "y" * HEAD_PARSE_LIMIT + '"}'
    assert event_head(error) == ("error", None, 503, None)


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b'{"type": "response.create", "model": "m"}', "call"),
        (b'{"type": "response.create", "generate": false}', "warmup"),
        (b'{"type": "response.steer"}', "relay"),
        (b'{"type": 3}', "call"),  # not another client event: judged
        (b"[]", "call"),
        (b"\xff", "call"),
    ],
)
def test_a_client_message_is_a_call_a_warmup_or_relayed(raw: bytes, kind: str) -> None:
    assert classify(raw)[0] == kind


def test_events_go_to_their_lanes_call_first_in_first_out() -> None:
    queues: StreamQueues[Call] = StreamQueues()
    a, b, c = Call("a"), Call("b"), Call("c")
    queues.queue("s1").extend([a, b])
    queues.queue("s2").append(c)
    queues.observe(event("response.created", "s2", "resp_c"))
    queues.observe(event("response.created", "s1", "resp_a"))
    assert queues.observe(event("response.completed", "s1", "resp_a")) is a
    assert a.settled == {"upstream_error": None, "reason": None} and b.settled is None
    assert queues.observe(event("response.incomplete", "s2", "resp_c")) is None  # settled, not completed
    assert c.settled is not None and not queues.queue("s2")
    assert queues.observe(event("response.created", "nobody", "resp_x")) is None  # no call: ignored
    assert list(queues.queue("s1")) == [b]


def test_a_request_error_answers_the_oldest_call_not_started() -> None:
    queues: StreamQueues[Call] = StreamQueues()
    running, waiting = Call("running"), Call("waiting")
    queues.queue(None).extend([running, waiting])
    queues.observe(event("response.created", rid="resp_1"))
    queues.observe(event("error", status=429))
    assert waiting.failed == 429 and running.settled is None
    queues.observe(event("error"))  # a stream error: the running response's, its terminal follows
    assert running.fed[-1] == "error" and running.settled is None


def test_a_new_response_breaks_the_running_one() -> None:
    queues: StreamQueues[Call] = StreamQueues()
    first, second = Call("first"), Call("second")
    queues.queue(None).extend([first, second])
    queues.observe(event("response.created", rid="resp_1"))
    queues.observe(event("response.created", rid="resp_2"))
    assert first.settled is not None and "new response" in (first.settled["upstream_error"] or "")
    assert second.response_id == "resp_2"


def test_an_upstream_gone_fails_every_call_waiting() -> None:
    queues: StreamQueues[Call] = StreamQueues()
    calls = [Call("a"), Call("b")]
    queues.queue("s1").append(calls[0])
    queues.queue(None).append(calls[1])
    queues.fail_all("gone")
    assert all(c.settled == {"upstream_error": "gone", "reason": None} for c in calls)
